"""``trimtab bench balance``: the shipped scenario suite (sim/scenarios) through the simulator, trimtab's
shedders beside Pulsar's legacy ones and the exact optimum, with the issue's targets checked.

Targets (docs/simulator.md, docs/benchmarks.md):

* on every scenario, TransferShedder reaches the balance target with fewer moves than every legacy shedder
  (a policy that never reaches it loses; a scenario where no legacy shedder reaches it is won by reaching it;
  a scenario that is balanced from the measure point on, for everyone, is a tie and counts as met);
* on the small instances (those with the exact optimum), TransferShedder's moves to balance are at most
  1.2x the exact minimum -- for the band (every broker within the target of the average, the issue's
  definition) and, reported beside it, for the std target itself (what "balanced" means in the report,
  sim/optimum.py ``min_moves_std``); where TransferShedder needs exactly that minimum, a legacy shedder
  that ties it cannot be beaten, and ``transfer_at_exact_minimum_std_target`` says so;
* after scaling 5 -> 10 brokers, balanced within 150 simulated seconds at the default cadence settings --
  and, when the defaults cannot, the same scenario with ``TUNED`` settings, reported beside them;
* 100 brokers x 10 000 bundles simulate at least 100x faster than real time (restart-100-brokers).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trimtab.config.merge import deep_merge
from trimtab.sim.optimum import min_moves
from trimtab.sim.report import summarize
from trimtab.sim.run import simulate
from trimtab.sim.scenario import ReportSpec, Scenario, load_scenario

SUITE = Path(__file__).resolve().parents[2] / "sim" / "scenarios"
LEGACY = ("legacy-overload", "legacy-threshold", "legacy-uniform")
SCALE_OUT = "scale-out-5-to-10"
SCALE_OUT_TARGET_S = 150.0
RATIO_TARGET = 1.2
SPEED_TARGET = 100.0
#: Scenarios this large are run to show they finish (issue 33); their speed is reported, not judged.
LARGE_BROKERS = 1000
#: Cadence settings that balance the 5 -> 10 scale-out within the target when the defaults do not: a shedding
#: cycle every 30 s with a trigger held for 3 cycles (2 > hit count), and up to 5 broker pairs per cycle so
#: every new broker gets load in one cycle. Oscillations are measured on every scenario with them too.
TUNED = {"shedding": {"interval_s": 30.0, "hit_count_threshold": 2, "max_broker_pairs": 5}}
#: A second, tighter definition of "balanced", reported beside the shedder's own target (0.25): brokers
#: within about +-10 points of each other is what an operator looking at a dashboard calls balanced.
TIGHT_STD = 0.1
KEYS = (
    "time_to_balance_s",
    "moves_to_balance",
    "moves",
    "unserved_bundle_s",
    "peak_broker_load",
    "oscillations",
    "violations_total",
)


def transfer_wins(policies: dict[str, Any]) -> bool | None:
    """Fewer moves to balance than every legacy shedder (see the module docstring for the edge cases)."""
    t = policies.get("transfer")
    if t is None:
        return None
    mine = t["moves_to_balance"]
    others = [policies[p]["moves_to_balance"] for p in LEGACY if p in policies]
    if all(o == 0 for o in others if o is not None) and mine == 0:
        return True  # balanced from the start for everyone: nothing to win or lose
    if mine is None:
        return False
    return all(o is None or mine < o for o in others)


def run(
    scenarios: list[Path] | None = None,
    *,
    tuned: bool = True,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    paths = scenarios or sorted(SUITE.glob("*.yaml"))
    out: dict[str, Any] = {
        "bench": "balance",
        "scenarios": {},
        "tuned_settings": TUNED,
        "tight_std": TIGHT_STD,
    }
    wins: dict[str, bool | None] = {}
    wins_tight: dict[str, bool | None] = {}
    ratios: dict[str, float | None] = {}
    ratios_tight: dict[str, float | None] = {}
    ratios_std: dict[str, float | None] = {}
    at_minimum: dict[str, bool] = {}
    speed: dict[str, Any] = {}
    large: dict[str, Any] = {}
    for path in paths:
        sc = load_scenario(path)
        entry, tight = _scenario(sc, tuned, progress)
        out["scenarios"][sc.name] = entry
        wins[sc.name] = transfer_wins(entry["policies"])
        wins_tight[sc.name] = transfer_wins(tight)
        if entry["optimum"] is not None and sc.name.startswith("small-"):
            ratios[sc.name] = entry["optimum"]["ratio"].get("transfer")
            ratios_tight[sc.name] = entry["optimum_tight"]["ratio_transfer"]
            std_min = entry["optimum"].get("std_target")
            if std_min is not None:
                ratios_std[sc.name] = std_min["ratio"].get("transfer")
                # Where TransferShedder needs exactly the proven minimum, no policy can need fewer: a legacy
                # shedder that ties it there makes "fewer than every legacy shedder" impossible, not missed.
                at_minimum[sc.name] = (
                    std_min["moves"] is not None
                    and entry["policies"]["transfer"]["moves_to_balance"] == std_min["moves"]
                )
        if entry["brokers"]["initial"] >= LARGE_BROKERS:
            large[sc.name] = {k: entry[k] for k in ("speedup", "wall_s", "brokers", "bundles")}
        elif entry["brokers"]["initial"] >= 100 and entry["bundles"]["initial"] >= 10_000:
            speed[sc.name] = entry["speedup"]
    scale = out["scenarios"].get(SCALE_OUT)
    default_ttb = scale["policies"]["transfer"]["time_to_balance_s"] if scale else None
    tuned_ttb = scale.get("tuned_transfer", {}).get("time_to_balance_s") if scale else None
    out["targets"] = {
        "transfer_fewer_moves_than_legacy": wins,
        "transfer_fewer_moves_than_legacy_tight_target": wins_tight,
        "transfer_vs_exact_minimum": ratios,
        "transfer_vs_exact_minimum_tight_band": ratios_tight,
        "transfer_vs_exact_minimum_std_target": ratios_std,
        "transfer_at_exact_minimum_std_target": at_minimum,
        "scale_out_balanced_s": {"default": default_ttb, "tuned": tuned_ttb, "target": SCALE_OUT_TARGET_S},
        "speedup_100_brokers_10k_bundles": speed,
        "large_scenarios_finished": large,
    }
    out["meets_targets"] = {
        "transfer_fewer_moves_than_legacy": all(v is not False for v in wins.values()),
        "within_1_2x_of_exact_minimum": all(r is not None and r <= RATIO_TARGET for r in ratios.values()),
        "scale_out_default_le_150s": default_ttb is not None and default_ttb <= SCALE_OUT_TARGET_S,
        "scale_out_tuned_le_150s": tuned_ttb is not None and tuned_ttb <= SCALE_OUT_TARGET_S,
        "speedup_ge_100x": bool(speed) and all(v >= SPEED_TARGET for v in speed.values()),
        "tuned_no_oscillations": all(
            s.get("tuned_transfer", {}).get("oscillations", 0) == 0 for s in out["scenarios"].values()
        ),
        "no_violations": all(
            p["violations_total"] == 0 for s in out["scenarios"].values() for p in s["policies"].values()
        ),
    }
    return out


def _scenario(
    sc: Scenario, tuned: bool, progress: Callable[[str], None]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One scenario: every policy at the shedder's target and at the tight one, the optimum for both bands,
    and TransferShedder again with the tuned cadence."""
    t0 = time.perf_counter()
    report, runs = simulate(sc, progress=progress)
    wall = time.perf_counter() - t0
    tight_sc = sc.model_copy(
        update={"report": ReportSpec(**{**sc.report.model_dump(), "balance_target_std": TIGHT_STD})}
    )
    tight = {p: summarize(tight_sc, r) for p, r in runs.items()}
    entry: dict[str, Any] = {
        "policies": {p: {k: r[k] for k in KEYS} for p, r in report["policies"].items()},
        "tight_target": {
            p: {k: r[k] for k in ("time_to_balance_s", "moves_to_balance")} for p, r in tight.items()
        },
        "optimum": report["optimum"],
        "optimum_tight": None,
        "bundles": report["bundles"],
        "brokers": report["brokers"],
        "wall_s": round(wall, 2),
        "speedup": round(len(runs) * sc.duration_s / wall, 1),
    }
    snap = report.get("_snapshot")
    if report["optimum"] is not None and snap is not None:
        o2 = min_moves(snap.bundle_load, snap.owner, snap.capacity, TIGHT_STD)
        mine = tight["transfer"]["moves_to_balance"] if "transfer" in tight else None
        entry["optimum_tight"] = {
            "band": TIGHT_STD,
            "moves": o2.moves,
            "status": o2.status,
            "ratio_transfer": round(mine / o2.moves, 3) if o2.moves and mine is not None else None,
        }
    if tuned:
        t_sc = sc.model_copy(update={"config": deep_merge(sc.config, TUNED), "policies": ["transfer"]})
        t_report, _ = simulate(t_sc, progress=progress)
        entry["tuned_transfer"] = {k: t_report["policies"]["transfer"][k] for k in KEYS}
    return entry, tight


#: What the simulator runs of production: the daemons' jobs and everything they call in the package.
PRODUCTION_PACKAGES = ("agent", "balance", "channel", "cluster", "config", "controller")
SPEED_SCENARIO = "restart-100-brokers"


def production_share(
    path: Path | None = None, progress: Callable[[str], None] = lambda _m: None
) -> dict[str, Any]:
    """How fast the simulator could ever run the daemons' own jobs: the transfer policy of the 100-broker x
    10 000-bundle scenario once as is (its speedup), once under cProfile, whose own time per function says
    what share of the run is production code. A simulator whose engine cost nothing would still run that
    code: ``sim_speedup_ceiling`` = speedup / share. The interpreter's built-ins and the standard library
    are counted as the engine's (so the ceiling errs high), and cProfile's per-call cost weighs on both."""
    import cProfile
    import pstats

    sc = load_scenario(path or SUITE / f"{SPEED_SCENARIO}.yaml").model_copy(update={"policies": ["transfer"]})
    progress(f"{sc.name}: the transfer policy as is...")
    t0 = time.perf_counter()
    simulate(sc)
    speedup = sc.duration_s / (time.perf_counter() - t0)
    progress(f"{sc.name}: again under cProfile...")
    profile = cProfile.Profile()
    profile.enable()
    report, _runs = simulate(sc)
    profile.disable()
    root = Path(__file__).resolve().parents[2]
    by_package: dict[str, float] = {}
    total = 0.0
    for (filename, _line, _fn), row in pstats.Stats(profile).stats.items():  # type: ignore[attr-defined]
        own = row[2]
        total += own
        path_ = Path(filename)
        top = path_.relative_to(root).parts[0] if path_.is_relative_to(root) else "python"
        by_package[top] = by_package.get(top, 0.0) + own
    production = sum(by_package.get(p, 0.0) for p in PRODUCTION_PACKAGES)
    share = production / total if total else 0.0
    return {
        "bench": "sim-profile",
        "scenario": sc.name,
        "brokers": report["brokers"]["initial"],
        "bundles": report["bundles"]["initial"],
        "sim_speedup": round(speedup, 1),
        "production_code_share": round(share, 3),
        "sim_speedup_ceiling": round(speedup / share, 1) if share else None,
        "sim_speedup_target": 1000.0,
        "own_time_share_by_package": {k: round(v / total, 3) for k, v in sorted(by_package.items()) if total},
        "what": "own time (cProfile tottime) of functions in the production packages over all, running the "
        "transfer policy: with an engine that cost nothing the simulator would still run that code, so "
        "sim_speedup / production_code_share bounds its speed from above (built-ins and the standard "
        "library counted as the engine's: the bound errs high)",
    }
