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
3. Plan the moves, as whole bundles from the sources' top-k lists -- always leaving a source one bundle,
   skipping bundles moved within the grace period, bundles it does not own (per the channel) and bundles
   the destination may not take -- as transfers (or plain unloads), at most ``max_broker_pairs`` sources:

   * ``plan = "to_target"`` (the default, trimtab's): one bundle at a time to the least loaded broker, from
     the source whose move lowers the variance most, until the trigger no longer holds. The fewest moves
     that meet the target: every move leaves a bundle unserved for a moment, and the simulator showed the
     half-gap pairs moving twice the exact minimum after a scale-out (docs/benchmarks.md).
   * ``plan = "half_gap"`` (Pulsar's): pair the most with the least loaded brokers and move about half of
     each pair's gap. A more even result for more moves.
4. Every move is projected (loads, throughputs) before the next decision.

Every cycle ends with decisions (``success``) or a ``skip`` reason; the caller turns that into a metric,
a log line and an event.

**ThresholdShedder** (Pulsar's classic): a broker whose usage exceeds ``avg + threshold`` unloads
``usage - avg - threshold + 5%`` of its traffic, largest bundles first; with transfers on, each to the
broker with the least *projected* load (less loaded than the source), so one cycle spreads over several.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from trimtab.balance.load import BrokerLoadData, BundleStats, TopBundles, is_fresh
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
    plan: str = "to_target"  # to_target | half_gap (Pulsar's pairs)
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
            plan=sh.plan,
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

    if cfg.plan == "half_gap":
        last_skip = _shed_pairs(
            order, load, tput, tput_ema, m, brokers, cooling, top, owner, state, cfg, transferable, result
        )
    else:
        plan = _TargetPlan(
            load, tput, dict(tput_ema), m, brokers, cooling, top, owner, state, cfg, transferable
        )
        last_skip = plan.run(result)
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


@dataclass
class _TargetPlan:
    """Move one bundle at a time until the trigger no longer holds: the fewest moves, not an even spread.

    Each step moves load to the least loaded broker from whichever source reduces the load variance most:
    moving ``d`` across a gap ``g`` lowers it by ``2 d (g - d) / n``, so per source the heaviest bundle that
    fits within half the gap (no move may turn a pair around), and among sources the best of those. When
    the most loaded broker is overloaded, it is the source. The moves are projected (load, throughput and
    its EMA) before the next step. A broker is a source or a destination within a cycle, never both, a
    source always keeps one bundle, and at most ``max_broker_pairs`` brokers shed per cycle."""

    load: dict[str, float]
    tput: dict[str, float]
    ema: dict[str, float]  # projected too: a destination that received load is no longer idle
    m: float
    brokers: Mapping[str, bool]
    cooling: set[str]
    top: Mapping[str, TopBundles]
    owner: Owner
    state: ShedState
    cfg: ShedConfig
    transferable: Transferable
    sources: set[str] = field(default_factory=set)
    received: set[str] = field(default_factory=set)
    exhausted: set[str] = field(default_factory=set)  # nothing of theirs fits any more: gaps only shrink
    picked: set[str] = field(default_factory=set)
    noted: set[str] = field(default_factory=set)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def run(self, result: ShedResult) -> str:
        """Appends the moves to ``result``; returns why the last step moved nothing."""
        last_skip = "no_bundles"
        load, cfg = self.load, self.cfg
        while True:
            avg, std = _stats(list(load.values()))
            taken = self.cooling | self.sources
            dests = [b for b in load if self.brokers.get(b, False) and b not in taken]
            srcs = [b for b in load if self._may_shed(b)]
            if not dests or not srcs:
                last_skip = "cool_down" if self.cooling else last_skip
                break
            lo = min(dests, key=lambda b: (load[b], b))
            hi = max(srcs, key=lambda b: (load[b], b))
            if std > cfg.target_std:
                reason = "overloaded"
            elif load[lo] < avg * self.m or self.ema[lo] < max(self.ema.values()) * self.m:
                reason = "underloaded"
            elif load[hi] > cfg.overload_threshold and load[hi] > avg + cfg.target_std:
                reason = "overloaded"
                srcs = [hi]  # the overloaded broker itself must shed
            else:
                break
            choice, why = self._choose(srcs, lo)
            if choice is None:
                # Every source with a gap was tried against the least loaded broker; gaps only shrink.
                cooler = any(load[b] > load[lo] for b in self.cooling)
                last_skip = why or ("cool_down" if cooler else "no_gap")
                break
            result.decisions.append(self._move(choice, lo, reason))
        result.skipped_bundles.extend(self.skipped)
        return last_skip

    def _may_shed(self, b: str) -> bool:
        return (
            b not in self.cooling
            and b not in self.exhausted
            and b not in self.received
            and (b in self.sources or len(self.sources) < self.cfg.max_broker_pairs)
        )

    def _choose(self, srcs: list[str], lo: str) -> tuple[tuple[float, str, BundleStats] | None, str]:
        """The move that lowers the variance most, as (load it moves, source, bundle); else why none."""
        choice: tuple[float, str, BundleStats] | None = None
        top_gain = 0.0
        why = ""
        for src in sorted(srcs, key=lambda b: (-self.load[b], b)):
            gap = self.load[src] - self.load[lo]
            if gap <= 0 or (choice is not None and gap * gap / 4 <= top_gain):
                break  # by load, descending: no later source can do better (d (g - d) <= g^2 / 4)
            found = self._heaviest_fitting(src, lo)
            if isinstance(found, str):
                why = why or found  # the most loaded source's reason is the cycle's
                self.exhausted.add(src)
                continue
            gain = found[0] * (gap - found[0])
            if choice is None or gain > top_gain:
                choice, top_gain = (found[0], src, found[1]), gain
        return choice, why

    def _heaviest_fitting(self, src: str, lo: str) -> tuple[float, BundleStats] | str:
        """(load it moves, bundle): ``src``'s heaviest bundle that fits half the gap to ``lo``; else why not."""
        load, tput, ema = self.load, self.tput, self.ema
        report = self.top.get(src)
        if report is None or not report.bundles or load[src] <= 0 or tput[src] <= 0:
            return "no_load_data"
        if len(report.bundles) == 1:
            self._skip(report.bundles[0].bundle, "sole_bundle")  # the overload itself: it needs a split
            return "no_bundles"
        if len(report.bundles) - sum(1 for b in report.bundles if b.bundle in self.picked) <= 1:
            return "no_bundles"
        # Load per byte/s from the two EMAs, which lag alike: the bundles' rates are current.
        per_byte = load[src] / (ema[src] if ema[src] > 0 else tput[src])
        half_gap = (load[src] - load[lo]) / 2
        for b in sorted(report.bundles, key=lambda x: (-x.throughput, x.bundle)):
            if b.bundle in self.picked or b.throughput <= 0:
                continue
            if b.bundle in self.state.recent_bundles:
                self._skip(b.bundle, "grace_period")
            elif self.owner(b.bundle) != src:
                self._skip(b.bundle, "not_owner")
            elif b.throughput * per_byte > half_gap:
                continue  # would overshoot this pair; a lighter one may fit
            elif not self.transferable(b.bundle, src, lo if self.cfg.transfer else None):
                self._skip(b.bundle, "not_transferable")
            else:
                return b.throughput * per_byte, b
        return "no_bundles"

    def _move(self, choice: tuple[float, str, BundleStats], lo: str, reason: str) -> Unload:
        shift, src, bundle = choice
        load = self.load
        u = Unload(
            bundle.bundle,
            src,
            lo if self.cfg.transfer else None,
            reason,
            bundle.throughput,
            load[src],
            load[lo],
        )
        load[src] -= shift
        load[lo] += shift
        for proj in (self.tput, self.ema):
            proj[src] -= bundle.throughput
            proj[lo] += bundle.throughput
        self.picked.add(bundle.bundle)
        self.sources.add(src)
        self.received.add(lo)
        return u

    def _skip(self, bundle: str, why: str) -> None:
        if bundle not in self.noted:
            self.noted.add(bundle)
            self.skipped.append((bundle, why))


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


class _Coldest:
    """Destinations by projected load for ThresholdShedder: a heap, so a cycle of many moves over many brokers
    stays fast. Sources come in descending load, so a broker not less loaded than the current source never
    qualifies again; the chosen one is popped and pushed back with its new projection."""

    def __init__(self, load: Mapping[str, float], candidates: list[str]) -> None:
        self.load = load
        self.heap = [(load[x], x) for x in candidates]
        heapq.heapify(self.heap)

    def pop_for(self, src: str) -> str | None:
        aside: list[tuple[float, str]] = []
        found: str | None = None
        while self.heap:
            x = self.heap[0][1]
            if x == src:
                aside.append(heapq.heappop(self.heap))
            elif self.load[x] >= self.load[src]:
                heapq.heappop(self.heap)  # for good: every later source is at most as loaded
            else:
                found = heapq.heappop(self.heap)[1]
                break
        for item in aside:
            heapq.heappush(self.heap, item)
        return found

    def push(self, broker: str, projected: float) -> None:
        heapq.heappush(self.heap, (projected, broker))


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
    coldest = _Coldest(load, [x for x in load if brokers.get(x, False) and x not in cooling])
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
            dst = coldest.pop_for(b) if cfg.transfer else None
            ok = transferable(s.bundle, b, dst)
            if ok and dst is not None and pop[b].throughput > 0:
                shift = s.throughput * load[b] / pop[b].throughput
                projected[dst] += shift
                projected[b] -= shift
            if dst is not None:
                coldest.push(dst, projected[dst])
            if not ok:
                continue
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
