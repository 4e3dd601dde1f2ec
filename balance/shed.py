"""Load shedding decisions (docs/design.md section 5.2), leader only. Pure functions of replicated state.

**TransferShedder** (the default), as Pulsar's extensible load manager does it:

1. Brokers with a fresh report (TTL) are the population. Brokers within ``broker_cooldown_s`` of their
   last move sit the cycle out (they are neither paired as source nor as destination); if such a broker
   has not reported since the move, the whole cycle waits (its figures would skew the statistics). Any
   live broker without a report skips the cycle (we would be balancing blind). Unlike Pulsar, the
   cool-down is measured in time, not by report timestamps: a report is only published on change, so
   Pulsar's rule can stretch the cool-down to the maximum report interval.
2. Trigger: ``std > target`` or the least loaded broker is under-loaded or the most loaded is over the
   overload threshold and above ``avg + target``. The trigger must hold for more than ``hit_count_threshold``
   consecutive cycles.
3. Pair the most with the least loaded brokers (at most ``max_broker_pairs`` per cycle); from the most
   loaded one's top-k bundles move about half the load gap as whole bundles -- always leaving it one
   bundle, skipping bundles moved within the grace period, bundles it does not own (per the channel) and
   bundles the destination may not take -- as transfers to the least loaded (or plain unloads).
4. After each pair the statistics are recomputed as if the load had moved.

Every cycle ends with decisions (``success``) or a ``skip`` reason; the caller turns that into a metric,
a log line and an event.

**ThresholdShedder** (Pulsar's classic): a broker whose usage exceeds ``avg + threshold`` unloads
``usage - avg - threshold + 5%`` of its traffic, largest bundles first; with transfers on, each to the
broker with the least *projected* load (less loaded than the source), so one cycle spreads over several.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from trimtab.balance.load import BrokerLoadData, TopBundles, is_fresh
from trimtab.config.settings import Settings


@dataclass(frozen=True)
class ShedConfig:
    target_std: float = 0.25
    hit_count_threshold: int = 3
    overload_threshold: float = 0.85  # fraction
    max_broker_pairs: int = 3
    bundle_grace_s: float = 1800.0
    broker_cooldown_s: float = 180.0
    transfer: bool = True
    load_ttl_s: float = 1800.0
    threshold: float = 0.10  # ThresholdShedder margin, fraction
    min_unload_throughput: float = 10 * 1024 * 1024

    @classmethod
    def from_settings(cls, s: Settings) -> ShedConfig:
        sh = s.shedding
        return cls(
            target_std=sh.target_std,
            hit_count_threshold=sh.hit_count_threshold,
            overload_threshold=sh.overload_threshold_pct / 100,
            max_broker_pairs=sh.max_broker_pairs,
            bundle_grace_s=sh.bundle_grace_s,
            broker_cooldown_s=sh.broker_cooldown_s,
            transfer=sh.transfer_enabled,
            load_ttl_s=s.load.ttl_s,
            threshold=sh.threshold_pct / 100,
            min_unload_throughput=sh.min_unload_throughput_bytes,
        )


@dataclass
class ShedState:
    """What the shedder remembers between cycles (leader memory; a new leader starts empty)."""

    hit_count: int = 0
    recent_bundles: dict[str, int] = field(default_factory=dict)  # bundle -> ms of its last move
    recent_brokers: dict[str, int] = field(default_factory=dict)  # broker -> ms of its last shed
    usage_ema: dict[str, float] = field(default_factory=dict)  # broker -> legacy ThresholdShedder's own EMA


@dataclass(frozen=True)
class Unload:
    bundle: str
    src: str
    dst: str | None  # None: a plain unload; the next lookup places it
    reason: str  # overloaded | underloaded
    throughput: float  # bytes/s moved
    src_load: float
    dst_load: float | None


@dataclass
class ShedResult:
    decisions: list[Unload]
    result: str  # success | skip
    reason: str
    avg: float = 0.0
    std: float = 0.0
    hit_count: int = 0
    skipped_bundles: list[tuple[str, str]] = field(default_factory=list)
    loads: dict[str, float] = field(default_factory=dict)


Owner = Callable[[str], str | None]
Transferable = Callable[[str, str, str | None], bool]


def _stats(values: list[float]) -> tuple[float, float]:
    n = len(values)
    avg = sum(values) / n
    var = max(0.0, sum(v * v for v in values) / n - avg * avg)
    return avg, math.sqrt(var)


def _population(
    brokers: Mapping[str, bool],
    loads: Mapping[str, BrokerLoadData],
    state: ShedState,
    cfg: ShedConfig,
    now_ms: int,
) -> tuple[dict[str, BrokerLoadData] | None, set[str], str]:
    """(fresh loads of live brokers, brokers cooling down after a move, skip reason if no cycle).

    Also forgets bundle moves older than the grace period: both shedders start here.
    """
    _expire(state, cfg, now_ms)
    pop: dict[str, BrokerLoadData] = {}
    cooling: set[str] = set()
    for b in sorted(brokers):
        load = loads.get(b)
        if load is None:
            return None, cooling, "no_load_data"
        if not is_fresh(load, now_ms, cfg.load_ttl_s):
            continue  # outdated: not part of the population
        moved_at = state.recent_brokers.get(b)
        if moved_at is not None:
            if now_ms - moved_at < cfg.broker_cooldown_s * 1000:
                cooling.add(b)
                if load.updated_at <= moved_at:
                    # Its report predates the move: the statistics would be wrong, wait for it.
                    return None, cooling, "stale_load_data"
            else:
                del state.recent_brokers[b]
        pop[b] = load
    if len(pop) < 2:
        return None, cooling, "no_brokers"
    return pop, cooling, ""


def _expire(state: ShedState, cfg: ShedConfig, now_ms: int) -> None:
    grace = cfg.bundle_grace_s * 1000
    for b in [b for b, t in state.recent_bundles.items() if now_ms - t > grace]:
        del state.recent_bundles[b]


def _pick_bundles(
    report: TopBundles,
    hi: str,
    lo: str,
    transfer: bool,
    budget: float,
    reason: str,
    load: Mapping[str, float],
    owner: Owner,
    state: ShedState,
    transferable: Transferable,
    result: ShedResult,
) -> tuple[list[Unload], float]:
    """The bundles to move off ``hi`` (to ``lo`` when ``transfer``), heaviest first, up to ``budget`` bytes/s
    of throughput, always leaving it one bundle; every bundle passed over is noted in
    ``result.skipped_bundles`` with why. Returns the moves and the throughput they take away."""
    dst = lo if transfer else None
    remaining = len(report.bundles)
    marked = 0.0
    moved: list[Unload] = []
    for s in sorted(report.bundles, key=lambda x: (-x.throughput, x.bundle)):
        if remaining <= 1:
            break
        if owner(s.bundle) != hi:
            result.skipped_bundles.append((s.bundle, "not_owner"))
            continue
        if s.bundle in state.recent_bundles:
            result.skipped_bundles.append((s.bundle, "grace_period"))
            continue
        if s.throughput <= 0:
            continue
        if not transferable(s.bundle, hi, dst):
            result.skipped_bundles.append((s.bundle, "not_transferable"))
            continue
        if marked + s.throughput > budget:
            result.skipped_bundles.append((s.bundle, "overshoot"))
            continue
        moved.append(Unload(s.bundle, hi, dst, reason, s.throughput, load[hi], load[lo]))
        marked += s.throughput
        remaining -= 1
    return moved, marked


def transfer_shedder(
    brokers: Mapping[str, bool],
    loads: Mapping[str, BrokerLoadData],
    top: Mapping[str, TopBundles],
    owner: Owner,
    state: ShedState,
    cfg: ShedConfig,
    now_ms: int,
    transferable: Transferable = lambda bundle, src, dst: True,
) -> ShedResult:
    """One TransferShedder cycle. ``brokers`` maps live broker -> may receive load (False if draining).

    Mutates ``state`` (hit count, recent moves): that is the shedder's memory between cycles.
    """
    pop, cooling, why = _population(brokers, loads, state, cfg, now_ms)
    if pop is None:
        return ShedResult([], "skip", why, hit_count=state.hit_count)
    load = {b: d.weighted_max_ema for b, d in pop.items()}
    tput = {b: d.throughput for b, d in pop.items()}
    tput_ema = {b: d.msg_throughput_ema for b, d in pop.items()}
    avg, std = _stats(list(load.values()))
    order = sorted(load, key=lambda b: (load[b], b))
    m = min(0.5, max(0.0, cfg.target_std / 2))
    max_tput_ema = max(tput_ema.values())

    def underloaded(b: str) -> bool:
        return load[b] < avg * m or tput_ema[b] < max_tput_ema * m

    def overloaded(b: str) -> bool:
        return load[b] > cfg.overload_threshold and load[b] > avg + cfg.target_std

    triggered = std > cfg.target_std or underloaded(order[0]) or overloaded(order[-1])
    state.hit_count = state.hit_count + 1 if triggered else 0
    result = ShedResult([], "skip", "", avg=avg, std=std, hit_count=state.hit_count, loads=dict(load))
    if not triggered:
        result.reason = "balanced"
        return result
    if state.hit_count <= cfg.hit_count_threshold:
        result.reason = "hit_count"
        return result

    last_skip = _shed_pairs(
        order, load, tput, tput_ema, m, brokers, cooling, top, owner, state, cfg, transferable, result
    )
    return _finish(result, state, now_ms, last_skip)


def _shed_pairs(
    order: list[str],
    load: dict[str, float],
    tput: dict[str, float],
    tput_ema: Mapping[str, float],
    m: float,
    brokers: Mapping[str, bool],
    cooling: set[str],
    top: Mapping[str, TopBundles],
    owner: Owner,
    state: ShedState,
    cfg: ShedConfig,
    transferable: Transferable,
    result: ShedResult,
) -> str:
    """Pair the most with the least loaded brokers (``order`` is by load, ascending) and move about half of
    each gap, updating ``load`` and ``tput`` as if the moves were done so the next pair sees their effect.
    Appends to ``result``; returns why the last pair moved nothing (the reason when nothing moves)."""
    max_tput_ema = max(tput_ema.values())
    min_idx, max_idx = 0, len(order) - 1
    pairs = 0
    last_skip = "no_bundles"
    while pairs < cfg.max_broker_pairs and min_idx < max_idx:
        cur_avg, cur_std = _stats(list(load.values()))
        lo, hi = order[min_idx], order[max_idx]
        if cur_std > cfg.target_std:
            reason = "overloaded"
        elif load[lo] < cur_avg * m or tput_ema[lo] < max_tput_ema * m:
            reason = "underloaded"
        elif load[hi] > cfg.overload_threshold and load[hi] > cur_avg + cfg.target_std:
            reason = "overloaded"
        else:
            break
        if not brokers.get(lo, False) or lo in cooling:
            min_idx += 1  # draining brokers take no load; cooling ones sit this cycle out
            last_skip = "cool_down"
            continue
        max_idx -= 1
        if hi in cooling:
            last_skip = "cool_down"
            continue
        gap = (load[hi] - load[lo]) / 2
        if load[hi] <= 0 or tput[hi] <= 0 or gap <= 0:
            last_skip = "no_load_data" if tput[hi] <= 0 else "no_gap"
            continue
        budget = tput[hi] * gap / load[hi]
        report = top.get(hi)
        if report is None or not report.bundles:
            last_skip = "no_load_data"
            continue
        if len(report.bundles) == 1:
            last_skip = "no_bundles"  # the sole bundle is the overload: it needs a split, not a move
            result.skipped_bundles.append((report.bundles[0].bundle, "sole_bundle"))
            continue
        moved, marked = _pick_bundles(
            report, hi, lo, cfg.transfer, budget, reason, load, owner, state, transferable, result
        )
        if not moved:
            last_skip = "no_bundles"
            continue
        shift = marked * load[hi] / tput[hi]
        load[hi] -= shift
        load[lo] += shift
        tput[hi] -= marked
        tput[lo] += marked
        result.decisions.extend(moved)
        pairs += 1
        min_idx += 1

    return last_skip


def _finish(result: ShedResult, state: ShedState, now_ms: int, last_skip: str) -> ShedResult:
    """Remember the moves (grace periods, broker cool-downs) and say what the cycle did."""
    if result.decisions:
        state.hit_count = 0
        for u in result.decisions:
            state.recent_bundles[u.bundle] = now_ms
            state.recent_brokers[u.src] = now_ms
        result.result = "success"
        result.reason = result.decisions[0].reason
        result.hit_count = 0
    else:
        result.reason = last_skip
    return result


def threshold_shedder(
    brokers: Mapping[str, bool],
    loads: Mapping[str, BrokerLoadData],
    top: Mapping[str, TopBundles],
    owner: Owner,
    state: ShedState,
    cfg: ShedConfig,
    now_ms: int,
    transferable: Transferable = lambda bundle, src, dst: True,
) -> ShedResult:
    """One ThresholdShedder cycle: unload ``usage - (avg + threshold) + 5%`` of each hot broker's traffic."""
    pop, cooling, why = _population(brokers, loads, state, cfg, now_ms)
    if pop is None:
        return ShedResult([], "skip", why)
    load = {b: d.weighted_max_ema for b, d in pop.items()}
    avg, std = _stats(list(load.values()))
    result = ShedResult([], "skip", "balanced", avg=avg, std=std, loads=dict(load))
    # Destinations by projected load: each transfer adds its share to its destination, so one cycle does not
    # pile every hot broker's bundles onto the single coldest one (the simulator showed a 5 -> 10 scale-out
    # putting one new broker at 149 % that way).
    projected = dict(load)

    def coldest_for(src: str) -> str | None:
        ok = [
            x
            for x in projected
            if x != src and brokers.get(x, False) and x not in cooling and load[x] < load[src]
        ]
        return min(ok, key=lambda x: (projected[x], x)) if ok else None

    for b in sorted(load, key=lambda x: (-load[x], x)):
        if load[b] < avg + cfg.threshold:
            break
        if b in cooling:
            result.skipped_bundles.append((b, "cool_down"))
            continue
        frac = load[b] - avg - cfg.threshold + 0.05
        budget = frac * pop[b].throughput
        if budget < cfg.min_unload_throughput:
            result.skipped_bundles.append((b, "below_min_throughput"))
            continue
        report = top.get(b)
        if report is None or len(report.bundles) < 2:
            result.skipped_bundles.append((b, "no_bundles"))
            continue
        marked = 0.0
        remaining = len(report.bundles)
        for s in sorted(report.bundles, key=lambda x: (-x.throughput, x.bundle)):
            if marked >= budget or remaining <= 1:
                break
            if owner(s.bundle) != b or s.bundle in state.recent_bundles or s.throughput <= 0:
                continue
            dst = coldest_for(b) if cfg.transfer else None
            if not transferable(s.bundle, b, dst):
                continue
            if dst is not None and pop[b].throughput > 0:
                shift = s.throughput * load[b] / pop[b].throughput
                projected[dst] += shift
                projected[b] -= shift
            result.decisions.append(
                Unload(s.bundle, b, dst, "overloaded", s.throughput, load[b], load.get(dst or ""))
            )
            marked += s.throughput
            remaining -= 1
    if result.decisions:
        for u in result.decisions:
            state.recent_bundles[u.bundle] = now_ms
            state.recent_brokers[u.src] = now_ms
        result.result, result.reason = "success", "overloaded"
    return result
