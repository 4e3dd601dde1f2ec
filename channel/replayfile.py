"""Offline replay of a channel export: the operator's tool for "why does this node think X owns Y?".

Input: JSON lines ``{"key": "<bundle>", "value": <record or null>}`` in log order. Output: the resolved
table and the replay stats, exactly as every node would compute them from the same log.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from channel.table import TableView


def replay_lines(lines: Iterable[bytes | str]) -> TableView:
    """Replay JSON lines; a line that is not JSON or not of the expected shape counts as skipped."""
    view = TableView()
    batch: list[tuple[bytes | None, bytes | None, int | None, int | None]] = []
    for line in lines:
        raw = line.encode() if isinstance(line, str) else line
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict) or not isinstance(obj.get("key"), str) or "value" not in obj:
            view.apply_all(batch)
            batch.clear()
            view.stats.skipped["bad_line"] += 1
            continue
        value = obj["value"]
        batch.append((obj["key"].encode(), None if value is None else orjson.dumps(value), None, None))
    view.apply_all(batch)
    return view


def table_report(view: TableView) -> dict[str, Any]:
    return {
        "table": {k: r.to_json() for k, r in sorted(view.items())},
        "stats": view.stats.as_dict(),
    }
