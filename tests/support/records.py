"""Records from their JSON form (as ``Record.to_json`` and ``trimtab channel dump --json`` show them),
for tests that describe records as dicts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trimtab.channel.records import Record, State, make


def to_record(d: Mapping[str, Any]) -> Record:
    return make(
        State(d["state"]),
        version=d["version"],
        ts=d["ts"],
        writer=d["writer"],
        dst=d["dst"],
        src=d["src"],
        force=d["force"],
        children=d.get("children"),
    )
