"""The pure half of ``pipeline tune`` (pipeline/tune.py): the grid, one simulation of one grid point (a
Spark task), the ranking and the recommended TOML snippet. No Spark, no click: unit-tested directly."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trimtab.config.merge import deep_merge
from trimtab.errors import ConfigError

#: The default sweep: shedding cadence and aggressiveness, and the split threshold. 2^5 = 32 simulations.
DEFAULT_GRID: dict[str, list[Any]] = {
    "shedding.interval_s": [30.0, 60.0],
    "shedding.hit_count_threshold": [1, 3],
    "shedding.max_broker_pairs": [3, 5],
    "shedding.target_std": [0.15, 0.25],
    "split.max_msg_rate": [15_000.0, 30_000.0],
}
MAX_GRID = 4096


def expand(grid: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination, as nested settings overrides (``{"shedding": {"interval_s": 30}}``)."""
    keys = sorted(grid)
    combos = list(itertools.product(*(grid[k] for k in keys)))
    if len(combos) > MAX_GRID:
        raise ConfigError(f"the grid has {len(combos)} combinations; at most {MAX_GRID}")
    out = []
    for values in combos:
        cfg: dict[str, Any] = {}
        for dotted, v in zip(keys, values, strict=True):
            section, _, field = dotted.partition(".")
            if not field:
                raise ConfigError(f"grid key {dotted!r}: expected section.field")
            cfg.setdefault(section, {})[field] = v
        out.append(cfg)
    return out


def read_grid(path: Path) -> dict[str, list[Any]]:
    """A grid file: a YAML/JSON mapping of ``section.field`` to a list of values."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read the grid: {e}") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{path}: a grid is a mapping of section.field to a list of values")
    grid: dict[str, list[Any]] = {}
    for k, v in data.items():
        if not isinstance(k, str) or not isinstance(v, list) or not v:
            raise ConfigError(f"{path}: {k!r}: expected a non-empty list of values")
        if any(not isinstance(x, (int, float, str, bool)) for x in v):
            raise ConfigError(f"{path}: {k!r}: values must be numbers, strings or booleans")
        grid[k] = v
    return grid


def simulate_point(item: tuple[int, dict[str, Any], dict[str, Any], str]) -> dict[str, Any]:
    """One Spark task: the scenario with one grid point's settings (module-level: pickled to workers)."""
    from trimtab.sim.run import simulate
    from trimtab.sim.scenario import parse_scenario

    index, scenario_doc, overrides, policy = item
    doc = dict(scenario_doc)
    doc["config"] = deep_merge(doc.get("config") or {}, overrides)
    doc["policies"] = [policy]
    try:
        sc = parse_scenario(doc, f"grid point {index}")
    except ConfigError as e:
        return {"index": index, "config": overrides, "error": str(e)}
    report, _ = simulate(sc)
    r = report["policies"][policy]
    return {
        "index": index,
        "config": overrides,
        **{
            k: r[k]
            for k in (
                "time_to_balance_s",
                "moves",
                "unserved_bundle_s",
                "unbalanced_s",
                "peak_broker_load",
                "oscillations",
                "violations_total",
            )
        },
    }


def rank_key(r: Mapping[str, Any]) -> tuple[Any, ...]:
    ttb = r.get("time_to_balance_s")
    return (
        "error" in r,
        r.get("violations_total", 0) > 0,
        ttb is None,
        ttb if ttb is not None else 0.0,
        r.get("moves", 0),
        r.get("unserved_bundle_s", 0.0),
        r.get("unbalanced_s", 0.0),
        r.get("index", 0),
    )


def toml_snippet(overrides: Mapping[str, Any], current: Mapping[str, Any]) -> str:
    """The recommended settings that differ from the current configuration, as TOML."""
    lines: list[str] = []
    for section in sorted(overrides):
        changed = {
            k: v for k, v in sorted(overrides[section].items()) if current.get(section, {}).get(k) != v
        }
        if not changed:
            continue
        lines.append(f"[{section}]")
        for k, v in changed.items():
            lines.append(f"{k} = {str(v).lower() if isinstance(v, bool) else v!r}".replace("'", '"'))
        lines.append("")
    return "\n".join(lines) if lines else "# the current settings are already the best of the grid\n"
