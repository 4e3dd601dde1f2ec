"""What a simulation run says about a policy: the figures users of a load balancer care about.

* ``time_to_balance_s``: from ``measure_from_s`` (default: the last scenario event) until the true broker
  load std is at most the target and stays there for ``hold_samples`` consecutive samples; null if never.
* ``moves``: bundles the shedder moved over the whole run; ``moves_to_balance`` those it moved between
  ``measure_from_s`` and reaching the target (null if never) -- the figure policies are compared by; (transfers or unloads), with the throughput they carried, and every
  other kind of move (healing, draining, splits, the monitor's) by reason.
* ``unserved_bundle_s``: bundle-seconds with no broker serving (fenced counts as unserved), excluding the
  initial placement; with the episode percentiles.
* ``unbalanced_s``: seconds of the whole run with the std above the target (what a tuner minimises when a
  scenario has many events);
* ``peak_broker_load``, ``oscillations`` (a bundle the shedder moved twice within the window) and
  ``violations`` (two brokers serving one bundle, overlapping owned ranges, bundles lost -- all must be 0).

Everything here is a pure function of the run's records, so equal runs give byte-equal JSON.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from typing import Any

from trimtab.channel.bundles import parse_bundle
from trimtab.sim.engine import RunResult
from trimtab.sim.scenario import Scenario


def _r(x: float, nd: int = 3) -> float:
    return round(x, nd)


def _pct(sorted_vals: list[float], p: float) -> float:
    if not sorted_vals:
        return 0.0
    i = min(len(sorted_vals) - 1, max(0, math.ceil(p / 100 * len(sorted_vals)) - 1))
    return sorted_vals[i]


def measure_from(sc: Scenario) -> float:
    if sc.report.measure_from_s is not None:
        return sc.report.measure_from_s
    return max((e.at_s for e in sc.events), default=0.0)


def balance_target(sc: Scenario) -> float:
    return sc.report.balance_target_std or sc.settings().shedding.target_std


def time_to_balance(run: RunResult, start: float, target: float, hold: int) -> float | None:
    samples = [s for s in run.samples if s.t >= start]
    streak = 0
    first: float | None = None
    for s in samples:
        if s.std <= target + 1e-12:
            if streak == 0:
                first = s.t
            streak += 1
            if streak >= hold and first is not None:
                return first - start
        else:
            streak = 0
    return None


def overlapping_owners(owners: dict[str, str]) -> int:
    """Owned bundles whose ranges overlap (a split parent and a child both owned): must be 0."""
    by_ns: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for b in owners:
        ns, rng = parse_bundle(b)
        by_ns[ns].append((rng.lower, rng.upper))
    bad = 0
    for ranges in by_ns.values():
        ranges.sort()
        bad += sum(1 for a, b in itertools.pairwise(ranges) if b[0] < a[1])
    return bad


def summarize(sc: Scenario, run: RunResult) -> dict[str, Any]:
    start = measure_from(sc)
    target = balance_target(sc)
    shed = [m for m in run.moves if m.reason.startswith("shed")]
    by_reason = Counter(m.reason.split(":", 1)[0] for m in run.moves)
    shed_reason = Counter(m.reason.split(":", 1)[1] for m in shed)
    window = sc.report.oscillation_window_s
    last: dict[str, float] = {}
    oscillations = 0
    for m in shed:
        t0 = last.get(m.bundle)
        if t0 is not None and m.t - t0 <= window:
            oscillations += 1
        last[m.bundle] = m.t
    episodes = sorted(b - a for a, b in run.unserved if a > 0.0)
    unserved = math.fsum(episodes)
    after = [s for s in run.samples if s.t >= start]
    peak = max((max(s.loads.values(), default=0.0) for s in after), default=0.0)
    final = run.samples[-1] if run.samples else None
    violations = {
        "double_serving": run.violations.get("double_serving", 0),
        "lost_bundles": run.violations.get("lost_bundles", 0),
        "overlapping_owners": overlapping_owners(run.end_owners),
    }
    ttb = time_to_balance(run, start, target, sc.report.hold_samples)
    return {
        "time_to_balance_s": None if ttb is None else _r(ttb, 1),
        "moves": len(shed),
        "moves_after_measure": sum(1 for m in shed if m.t >= start),
        # The shedder's moves from the measure point until the target was first reached (and then held).
        "moves_to_balance": None if ttb is None else sum(1 for m in shed if start <= m.t <= start + ttb),
        "moves_by_reason": dict(sorted(shed_reason.items())),
        "other_moves": {k: v for k, v in sorted(by_reason.items()) if k != "shed"},
        "throughput_moved_bytes_s": _r(math.fsum(m.throughput for m in shed), 1),
        "unserved_bundle_s": _r(unserved),
        "unserved_episodes": len(episodes),
        "unserved_episode_s": {
            "p50": _r(_pct(episodes, 50)),
            "p99": _r(_pct(episodes, 99)),
            "max": _r(episodes[-1] if episodes else 0.0),
        },
        "peak_broker_load": _r(peak),
        # Seconds out of balance over the whole run (every sample above the target counts one sample period).
        "unbalanced_s": _r(sum(sc.report.sample_s for s in run.samples if s.std > target + 1e-12), 1),
        "final_std": _r(final.std) if final else None,
        "oscillations": oscillations,
        "violations": violations,
        "violations_total": sum(violations.values()),
        "lookups": dict(sorted(run.lookups.items())),
        "shed_cycles": dict(sorted(run.shed_cycles.items())),
        "splits": run.splits,
        "merges": run.merges,
        # Live bundles at the first and last sample, and their extremes: a peak splits, a trough merges back.
        "bundles": _bundle_counts(run),
        "healing_overrides": run.healed,
        "channel": {"records": run.records, **run.channel_stats},
    }


def _bundle_counts(run: RunResult) -> dict[str, int] | None:
    counts = [s.bundles for s in run.samples]
    if not counts:
        return None
    return {"first": counts[0], "max": max(counts), "min": min(counts), "last": counts[-1]}


def series(run: RunResult) -> dict[str, Any]:
    """The time series behind the plots (also written as JSON with --out)."""
    brokers = sorted({b for s in run.samples for b in s.loads})
    return {
        "t": [_r(s.t, 2) for s in run.samples],
        "std": [_r(s.std, 4) for s in run.samples],
        "moves": [s.moves for s in run.samples],
        "bundles": [s.bundles for s in run.samples],
        "loads": {b: [(_r(s.loads[b], 4) if b in s.loads else None) for s in run.samples] for b in brokers},
    }
