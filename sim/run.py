"""``trimtab sim``: run a scenario under each of its policies and report them side by side.

The JSON is a pure function of the scenario (same file and seed, byte-identical output): no wall-clock
figure goes into it; the command prints how fast the simulation ran to stderr instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trimtab.sim.engine import Engine, RunResult
from trimtab.sim.report import balance_target, measure_from, series, summarize
from trimtab.sim.scenario import Scenario

#: Instances up to this size get the exact minimum number of moves by default (a MILP).
OPTIMUM_MAX_BUNDLES = 300
OPTIMUM_MAX_BROKERS = 16
#: The std-target minimum is solved by cutting planes (sim/optimum.py), whose count grows quickly with the
#: instance: bundles x brokers up to this (the small-* scenarios are 120 and 160; 80 bundles on 10 brokers
#: take ~20 s).
OPTIMUM_STD_MAX_VARIABLES = 400


def wants_optimum(sc: Scenario, bundles: int, brokers: int) -> bool:
    if sc.report.optimum is not None:
        return sc.report.optimum
    return bundles <= OPTIMUM_MAX_BUNDLES and brokers <= OPTIMUM_MAX_BROKERS


def simulate(
    sc: Scenario,
    policies: Sequence[str] | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> tuple[dict[str, Any], dict[str, RunResult]]:
    """Every policy on the same scenario; returns (the report, the raw runs for plots)."""
    settings = sc.settings()
    start = measure_from(sc)
    runs: dict[str, RunResult] = {}
    report: dict[str, Any] = {
        "scenario": sc.name,
        "seed": sc.seed,
        "duration_s": sc.duration_s,
        "measure_from_s": start,
        "balance_target_std": balance_target(sc),
        "hold_samples": sc.report.hold_samples,
        "policies": {},
    }
    snapshot = None
    for i, policy in enumerate(policies or sc.policies):
        t0 = time.perf_counter()
        eng = Engine(sc, policy, settings, snapshot_at=start if i == 0 else None)
        run = eng.run()
        wall = time.perf_counter() - t0
        progress(
            f"{sc.name}/{policy}: {sc.duration_s:g} virtual s in {wall:.2f} s "
            f"({sc.duration_s / max(wall, 1e-9):.0f}x real time), {run.records} channel records"
        )
        runs[policy] = run
        report["policies"][policy] = summarize(sc, run)
        if i == 0:
            snapshot = eng.snapshot
            report["brokers"] = {"initial": len(sc.broker_specs()), "final": len(run.samples[-1].loads)}
            report["bundles"] = {
                "initial": sum(n.bundles for n in sc.namespaces),
                "final": len(eng.live_bundles),
            }
    report["optimum"] = None
    report["_snapshot"] = snapshot  # for callers (the bench); main_json leaves it out
    if snapshot is not None and wants_optimum(sc, len(snapshot.bundle_load), len(snapshot.capacity)):
        from trimtab.sim.optimum import min_moves, min_moves_std

        target = balance_target(sc)
        opt = min_moves(snapshot.bundle_load, snapshot.owner, snapshot.capacity, target)
        progress(f"{sc.name}: exact minimum {opt.moves} moves ({opt.status}) in {opt.seconds:.2f} s")
        std_target: dict[str, Any] | None = None
        if len(snapshot.bundle_load) * len(snapshot.capacity) <= OPTIMUM_STD_MAX_VARIABLES:
            opt_std = min_moves_std(snapshot.bundle_load, snapshot.owner, snapshot.capacity, target)
            progress(
                f"{sc.name}: exact minimum to std <= {target:g}: {opt_std.moves} moves ({opt_std.status}) "
                f"in {opt_std.seconds:.2f} s"
            )
            std_target = {
                "moves": opt_std.moves,
                "status": opt_std.status,
                "ratio": _ratios(report["policies"], opt_std.moves),
            }
        report["optimum"] = {
            "at_s": snapshot.t,
            "band": target,
            "moves": opt.moves,
            "status": opt.status,
            "ratio": _ratios(report["policies"], opt.moves),
            # The simulator's own "balanced" (std <= target) asks less than the band: its minimum is the
            # yardstick for moves_to_balance, and a policy cannot do better than ratio 1.0 against it.
            "std_target": std_target,  # None on instances too large for it
        }
    return report, runs


def _ratios(policies: dict[str, Any], minimum: int | None) -> dict[str, float | None]:
    """Each policy's moves to balance over ``minimum`` (None where either is missing or the minimum is 0)."""
    return {
        p: (
            round(r["moves_to_balance"] / minimum, 3)
            if minimum and r["moves_to_balance"] is not None
            else None
        )
        for p, r in policies.items()
        if p != "none"
    }


def write_outputs(
    out: Path, report: dict[str, Any], runs: dict[str, RunResult], json_bytes: bytes
) -> list[Path]:
    """report.json, series.json and the PNG plots into ``out``."""
    import orjson

    from trimtab.sim.plots import plot_all

    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_bytes(json_bytes)
    data = {p: series(r) for p, r in runs.items()}
    (out / "series.json").write_bytes(orjson.dumps(data, option=orjson.OPT_SORT_KEYS))
    return [out / "report.json", out / "series.json", *plot_all(out, report, runs)]


def main_json(report: dict[str, Any]) -> bytes:
    import orjson

    public = {k: v for k, v in report.items() if not k.startswith("_")}
    return orjson.dumps(public, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
