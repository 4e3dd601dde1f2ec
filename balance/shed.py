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
   * ``plan = "half_gap"``: Pulsar's own TransferShedder loop (``findBundlesForUnloading``; see
     :func:`_shed_pairs`): pair the most with the least loaded brokers, read the source's top-k report
     lightest first and move bundles until the next one would overshoot half the pair's gap -- or, with
     transfers on, swap bundles back from the destination so that it fits. A more even result for more
     moves.
4. Every move is projected (loads, throughputs) before the next decision.

A bundle whose namespace has an isolation policy or an anti-affinity group is only moved when
``shed_bundles_with_policies`` (Pulsar's ``loadBalancerSheddingBundlesWithPoliciesEnabled``, off by
default): see :func:`movable`.

Every cycle ends with decisions (``success``) or a ``skip`` reason; the caller turns that into a metric,
a log line and an event.

**ThresholdShedder** (Pulsar's classic): a broker whose usage exceeds ``avg + threshold`` unloads
``usage - avg - threshold + 5%`` of its traffic, largest bundles first; with transfers on, each to the
broker with the least *projected* load (less loaded than the source), so one cycle spreads over several.
With ``lower_boundary`` (Pulsar's ``lowerBoundarySheddingEnabled``) a cycle that shed nothing while some
broker is below ``avg - threshold`` makes the most loaded broker shed ``threshold x 50%`` of its traffic.

**Waiting for the moves** (Pulsar's ``UnloadScheduler`` with ``namespaceBundleUnloadingTimeoutMs``): the
caller records each published move (:func:`track_move`) and, before the next cycle, :func:`settle_moves`
says whether they are done. While some are still in flight within ``unload_timeout_s`` no new cycle
starts; one that is not done by then has failed, and is not remembered as moved (no grace period for the
bundle, no cool-down for its source unless another of its moves completed).
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from trimtab.balance.load import BrokerLoadData, BundleStats, TopBundles, is_fresh
from trimtab.channel.bundles import parse_bundle
from trimtab.channel.records import Record
from trimtab.config.settings import Settings
from trimtab.errors import BundleError

#: ThresholdShedder's LOWER_BOUNDARY_THRESHOLD_MARGIN: lower-boundary shedding offloads half the threshold.
LOWER_BOUNDARY_MARGIN = 0.5
#: Pulsar's swap rule: swapping bundles back must leave the source below 75% of its throughput.
SWAP_MAX_FRACTION = 0.75


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
    lower_boundary: bool = False  # ThresholdShedder's lowerBoundarySheddingEnabled
    shed_bundles_with_policies: bool = False  # loadBalancerSheddingBundlesWithPoliciesEnabled
    unload_timeout_s: float = 60.0  # namespaceBundleUnloadingTimeoutMs
    isolate_hot_bundles: bool = False  # a one-hash bundle (a cut-out hot topic) gets a broker to itself

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
            lower_boundary=sh.lower_boundary_enabled,
            shed_bundles_with_policies=sh.shed_bundles_with_policies,
            unload_timeout_s=sh.unload_timeout_s,
            isolate_hot_bundles=sh.isolate_hot_bundles,
        )


@dataclass(frozen=True)
class Move:
    """A move the leader published and waits for: ``Releasing`` at ``version`` of ``bundle`` off ``src``."""

    bundle: str
    src: str
    version: int
    at_ms: int


@dataclass
class ShedState:
    """What the shedder remembers between cycles (leader memory; a new leader starts empty)."""

    hit_count: int = 0
    recent_bundles: dict[str, int] = field(default_factory=dict)  # bundle -> ms of its last move
    recent_brokers: dict[str, int] = field(default_factory=dict)  # broker -> ms of its last shed
    usage_ema: dict[str, float] = field(default_factory=dict)  # broker -> legacy ThresholdShedder's own EMA
    moves: dict[str, Move] = field(default_factory=dict)  # bundle -> a published move not yet settled


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
#: Why ``bundle`` may not move from ``src`` to ``dst`` (None: it may). See :func:`movable`.
Movable = Callable[[str, str, str | None], str | None]
#: Whether the bundle's namespace has an isolation policy or an anti-affinity group.
HasPolicies = Callable[[str], bool]


class Shedder(Protocol):
    """One cycle of a shedding strategy, as the leader's shedding job calls it: :func:`transfer_shedder`,
    :func:`threshold_shedder` (or, in the simulator, a baseline of Pulsar's)."""

    def __call__(
        self,
        brokers: Mapping[str, bool],
        loads: Mapping[str, BrokerLoadData],
        top: Mapping[str, TopBundles],
        owner: Owner,
        state: ShedState,
        cfg: ShedConfig,
        now_ms: int,
        /,
        *,
        transferable: Transferable,
        has_policies: HasPolicies | None,
    ) -> ShedResult: ...


def movable(cfg: ShedConfig, transferable: Transferable, has_policies: HasPolicies | None = None) -> Movable:
    """The shedders' guard on every bundle they would move, Pulsar's ``isTransferable``.

    A bundle of a namespace with an isolation policy or an anti-affinity group is refused (``has_policies``)
    unless ``cfg.shed_bundles_with_policies`` (``loadBalancerSheddingBundlesWithPoliciesEnabled``, off by
    default): an operator placed those on purpose, and balancing load is not a reason to second-guess it.
    Then the placement rules (``transferable``) must allow the move. ``has_policies`` None: no namespace has
    policies (the simulator, tests)."""
    with_policies = cfg.shed_bundles_with_policies or has_policies is None

    def why_not(bundle: str, src: str, dst: str | None) -> str | None:
        if not with_policies and has_policies is not None and has_policies(bundle):
            return "has_policies"
        if not transferable(bundle, src, dst):
            return "not_transferable"
        return None

    return why_not


def track_move(state: ShedState, bundle: str, src: str, version: int, now_ms: int) -> None:
    """Remember a published move (``Releasing`` at ``version``) so the next cycle waits for it."""
    state.moves[bundle] = Move(bundle, src, version, now_ms)


@dataclass(frozen=True)
class Settled:
    """What :func:`settle_moves` found: moves still in flight (the cycle waits), or the last cycle's moves
    settled as completed or timed out."""

    pending: list[Move]
    completed: list[Move]
    timed_out: list[Move]


def move_done(move: Move, rec: Record | None) -> bool:
    """Pulsar's ``UnloadManager`` completes an unload on the bundle's next ``Owned`` or ``Free``: here, the
    record moved past the ``Releasing`` that started it and is no longer in flight (tombstoned counts)."""
    return rec is None or (rec.version > move.version and not rec.state.in_flight)


def settle_moves(
    state: ShedState, record_of: Callable[[str], Record | None], cfg: ShedConfig, now_ms: int
) -> Settled:
    """Settle the moves the last cycle published, Pulsar's ``UnloadScheduler`` way: it waits for all of
    them, up to ``namespaceBundleUnloadingTimeoutMs`` (``cfg.unload_timeout_s``), before another cycle.

    While a move is neither done nor older than the timeout, nothing changes and the caller skips its cycle
    (``pending``). Otherwise the batch is settled and forgotten. A move that timed out failed: Pulsar
    records a bundle (grace period) and its source (cool-down) only when an unload completes, so its grace
    entry is dropped -- it may be chosen again -- and so is its source's cool-down, unless another move of
    that source completed."""
    if not state.moves:
        return Settled([], [], [])
    timeout_ms = cfg.unload_timeout_s * 1000
    done = {b: move_done(m, record_of(b)) for b, m in state.moves.items()}
    pending = [m for b, m in state.moves.items() if not done[b] and now_ms - m.at_ms < timeout_ms]
    if pending:
        return Settled(sorted(pending, key=lambda m: m.bundle), [], [])
    moves = sorted(state.moves.values(), key=lambda m: m.bundle)
    completed = [m for m in moves if done[m.bundle]]
    timed_out = [m for m in moves if not done[m.bundle]]
    moved_srcs = {m.src for m in completed}
    for m in timed_out:
        state.recent_bundles.pop(m.bundle, None)
        if m.src not in moved_srcs:
            state.recent_brokers.pop(m.src, None)
    state.moves.clear()
    return Settled([], completed, timed_out)


def _stats(values: list[float]) -> tuple[float, float]:
    n = len(values)
    avg = sum(values) / n
    var = max(0.0, sum(map(operator.mul, values, values)) / n - avg * avg)  # = sum(v * v ...), bit for bit
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


def transfer_shedder(
    brokers: Mapping[str, bool],
    loads: Mapping[str, BrokerLoadData],
    top: Mapping[str, TopBundles],
    owner: Owner,
    state: ShedState,
    cfg: ShedConfig,
    now_ms: int,
    transferable: Transferable = lambda bundle, src, dst: True,
    *,
    has_policies: HasPolicies | None = None,
) -> ShedResult:
    """One TransferShedder cycle. ``brokers`` maps live broker -> may receive load (False if draining);
    ``transferable`` and ``has_policies`` guard each move (:func:`movable`).

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

    guard = movable(cfg, transferable, has_policies)
    isolation_skips: list[tuple[str, str]] = []
    if cfg.isolate_hot_bundles:
        isolating = _isolate(load, tput, brokers, cooling, top, owner, state, cfg, guard)
        if isolating.decisions:
            isolating.avg, isolating.std, isolating.loads = avg, std, dict(load)
            return _finish(isolating, state, now_ms, "")
        isolation_skips = isolating.skipped_bundles
        # Nothing to isolate now; a broker that holds a hot bundle still takes nothing from the others.
        hosts = isolating_brokers(load, tput, top, owner)
        brokers = {b: ok and b not in hosts for b, ok in brokers.items()}
        guard = _keeping_hot(guard, hosts)  # nor does it give its hot bundle away to relieve an overload
    triggered = std > cfg.target_std or underloaded(order[0]) or overloaded(order[-1])
    state.hit_count = state.hit_count + 1 if triggered else 0
    result = ShedResult([], "skip", "", avg=avg, std=std, hit_count=state.hit_count, loads=dict(load))
    result.skipped_bundles.extend(isolation_skips)  # why isolation left bundles where they are
    if not triggered:
        result.reason = "balanced"
        return result
    if state.hit_count <= cfg.hit_count_threshold:
        result.reason = "hit_count"
        return result

    if cfg.plan == "half_gap":
        last_skip = _shed_pairs(
            order, load, tput, tput_ema, m, brokers, cooling, top, owner, state, cfg, guard, result
        )
    else:
        plan = _TargetPlan(load, tput, dict(tput_ema), m, brokers, cooling, top, owner, state, cfg, guard)
        last_skip = plan.run(result)
    return _finish(result, state, now_ms, last_skip)


def why_stays(
    bundle: str, src: str, dst: str | None, owner: Owner, state: ShedState, guard: Movable
) -> str | None:
    """Why the transfer shedder leaves ``bundle`` on ``src`` (a skip reason), or None when it may move:
    not owned by ``src`` per the channel, in its grace period, or not movable (:func:`movable`)."""
    if owner(bundle) != src:
        return "not_owner"
    if bundle in state.recent_bundles:
        return "grace_period"
    return guard(bundle, src, dst)


def load_share(throughput: float, load: float, tput: float) -> float:
    """The part of a broker's ``load`` that ``throughput`` bytes/s of its ``tput`` carry: what a move of
    them takes off the broker and adds to its destination (0 when the broker reports no throughput)."""
    return throughput * load / tput if tput else 0.0


def isolated(bundle: str) -> bool:
    """A bundle that is one hash wide: a hot topic cut out on its own (balance/split.py, ``around``)."""
    try:
        _, rng = parse_bundle(bundle)
    except BundleError:
        return False
    return rng.upper - rng.lower == 1


def isolating_brokers(
    load: Mapping[str, float], tput: Mapping[str, float], top: Mapping[str, TopBundles], owner: Owner
) -> set[str]:
    """Brokers of the population that serve a cut-out hot topic (:func:`isolated`) that is still hot: owned
    by the broker per the channel, and alone at least half as loaded as the average broker (its share of
    the broker's throughput, in load). A one-hash bundle whose topic cooled down gives its broker back."""
    if not load:
        return set()
    avg = math.fsum(load.values()) / len(load)
    out = set()
    for b, r in top.items():
        if b not in load or not tput.get(b):
            continue
        for x in r.bundles:
            if (
                isolated(x.bundle)
                and owner(x.bundle) == b
                and load_share(x.throughput, load[b], tput[b]) >= avg / 2
            ):
                out.add(b)
                break
    return out


def _keeping_hot(guard: Movable, hosts: set[str]) -> Movable:
    """``guard``, and a hot cut-out topic (:func:`isolated`) stays on the broker that isolates it
    (``isolated_hot``): moved, it would only take its overload elsewhere and its broker would take others'."""

    def why(bundle: str, src: str, dst: str | None) -> str | None:
        if src in hosts and isolated(bundle):
            return "isolated_hot"
        return guard(bundle, src, dst)

    return why


def _isolate(
    load: Mapping[str, float],
    tput: Mapping[str, float],
    brokers: Mapping[str, bool],
    cooling: set[str],
    top: Mapping[str, TopBundles],
    owner: Owner,
    state: ShedState,
    cfg: ShedConfig,
    guard: Movable,
) -> ShedResult:
    """``shedding.isolate_hot_bundles``: every other bundle of a broker that serves a hot cut-out topic
    (:func:`_hosts`), heaviest broker first, at most ``max_broker_pairs`` brokers a cycle, each bundle to
    the least loaded broker that may receive it (not draining, not cooling, not isolating a hot bundle
    itself; projected loads updated as moves are planned) -- unless that would take it past
    ``overload_threshold`` (``no_headroom``): a broker to itself must not overload another. Bundles in their
    grace period, not owned per the channel, or not movable stay; a broker keeps its hot bundle; a bundle a
    report lists twice moves once."""
    result = ShedResult([], "skip", "")
    hosts = isolating_brokers(load, tput, top, owner)
    projected = dict(load)
    dests = [b for b in load if brokers.get(b, False) and b not in cooling and b not in hosts]
    decided: set[str] = set()
    ready = sorted((h for h in hosts if h not in cooling), key=lambda b: (-load[b], b))
    for src in ready[: cfg.max_broker_pairs]:
        for s in sorted(top[src].bundles, key=lambda x: (-x.throughput, x.bundle)):
            if isolated(s.bundle) or s.throughput <= 0 or not dests or s.bundle in decided:
                continue
            dst = min(dests, key=lambda b: (projected[b], b))
            why = why_stays(s.bundle, src, dst if cfg.transfer else None, owner, state, guard)
            shift = load_share(s.throughput, load[src], tput.get(src, 0.0))
            if why is None and projected[dst] + shift > cfg.overload_threshold:
                why = "no_headroom"
            if why is not None:
                result.skipped_bundles.append((s.bundle, why))
                continue
            result.decisions.append(
                Unload(s.bundle, src, dst if cfg.transfer else None, "isolate_hot_bundle", s.throughput,
                       load[src], projected[dst])
            )  # fmt: skip
            decided.add(s.bundle)
            projected[src] -= shift
            projected[dst] += shift
    return result


def _shed_pairs(
    order: list[str],
    load: Mapping[str, float],
    tput: Mapping[str, float],
    tput_ema: Mapping[str, float],
    m: float,
    brokers: Mapping[str, bool],
    cooling: set[str],
    top: Mapping[str, TopBundles],
    owner: Owner,
    state: ShedState,
    cfg: ShedConfig,
    guard: Movable,
    result: ShedResult,
) -> str:
    """Pulsar's TransferShedder loop (``TransferShedder.findBundlesForUnloading``), pair by pair.

    ``order`` is the population by load, ascending. While fewer than ``max_broker_pairs`` pairs moved
    something and brokers are left between the two ends:

    * The reason: the std -- projected after each pair's moves, as Pulsar's ``LoadStats.offload`` does --
      still above the target; else the least loaded broker left is under-loaded, by load against the
      average or by throughput EMA against the *current* most loaded broker (the next source: the cluster's
      maximum may already have shed); else the most loaded broker left is overloaded. Else stop.
    * The most loaded broker left is paired with the least loaded one left; the budget is half their load
      gap in bytes/s, ``T_max x (L_max - L_min) / 2 / L_max``.
    * The source's top-k bundles are read lightest first (the report's own order in Pulsar). Passed over:
      not owned per the channel, in their grace period, not movable (:func:`movable`); the source always
      keeps one bundle; bundles without throughput are not moved.
    * A bundle that would take the traffic marked (net of what swaps brought back) over the budget ends the
      pair -- unless, with transfers on, bundles of the destination (lightest first, through the pair) can
      be swapped back to the source so that the destination stays at most as loaded as the source and the
      source ends below 75% of its throughput: then those go back and the bundle goes. Swapped bundles are
      counted as gained whether or not debug mode is on (Pulsar's code counts them only in debug mode).
    * A pair that moved something advances to the next least loaded broker; one that moved nothing keeps
      it for the next source.

    trimtab's differences, shared with its other plan: brokers in their cool-down sit the cycle out (a
    cooling destination is passed over, a cooling source skipped) instead of stopping the whole cycle; a
    draining broker is never a destination (of a move or a swap); a swapped bundle must be owned by the
    destination per the channel and out of its grace period, like every moved bundle; ties in load or
    throughput are broken by name.

    Appends to ``result``; returns why nothing moved, when nothing did."""
    n = len(order)
    avg = result.avg
    sq_sum = sum(v * v for v in load.values())
    std = result.std
    min_idx, max_idx = 0, n - 1
    pairs = 0
    empty = few = cooled = 0
    while pairs < cfg.max_broker_pairs and min_idx < max_idx:
        lo, hi = order[min_idx], order[max_idx]
        if load[hi] <= load[lo]:
            break  # no gap left to halve: a move (or a swap) between equals only churns
        if std > cfg.target_std:
            reason = "overloaded"
        elif load[lo] < avg * m or tput_ema[lo] < tput_ema[hi] * m:
            reason = "underloaded"
        elif load[hi] > cfg.overload_threshold and load[hi] > avg + cfg.target_std:
            reason = "overloaded"
        else:
            break
        if not brokers.get(lo, False) or lo in cooling:
            min_idx += 1  # draining brokers take no load; cooling ones sit this cycle out
            cooled += 1
            continue
        max_idx -= 1
        if hi in cooling:
            cooled += 1
            continue
        report = top.get(hi)
        if load[hi] <= 0 or tput[hi] <= 0 or report is None or not report.bundles:
            empty += 1  # no figures to size the budget with, or no bundles to choose from
            continue
        if len(report.bundles) == 1:
            few += 1  # the sole bundle is the overload: it needs a split, not a move
            result.skipped_bundles.append((report.bundles[0].bundle, "sole_bundle"))
            continue
        pair = _Pair(hi, lo, reason, load, tput, top.get(lo), brokers, owner, state, cfg, guard, result)
        net = pair.run(report, budget=tput[hi] * (load[hi] - load[lo]) / 2 / load[hi])
        if net is None:
            few += 1
            continue
        # LoadStats.offload: project the pair's net move onto the statistics.
        shift = load_share(net, load[hi], tput[hi])
        sq_sum -= load[hi] ** 2 + load[lo] ** 2
        sq_sum += max(0.0, load[hi] - shift) ** 2 + (load[lo] + shift) ** 2
        std = math.sqrt(abs(sq_sum / n - avg * avg))
        pairs += 1
        min_idx += 1
    if empty:
        return "no_load_data"
    if few:
        return "no_bundles"
    return "cool_down" if cooled else "no_bundles"


@dataclass
class _Pair:
    """One source (``hi``) and destination (``lo``) of :func:`_shed_pairs`; ``run`` appends their moves."""

    hi: str
    lo: str
    reason: str
    load: Mapping[str, float]
    tput: Mapping[str, float]
    lo_report: TopBundles | None
    brokers: Mapping[str, bool]
    owner: Owner
    state: ShedState
    cfg: ShedConfig
    guard: Movable
    result: ShedResult
    swap_next: int = 0  # Pulsar walks the destination's report once per pair, across swap attempts

    def run(self, report: TopBundles, budget: float) -> float | None:
        """Moves within ``budget`` bytes/s; returns the net throughput moved, or None if nothing moved."""
        hi, lo, result = self.hi, self.lo, self.result
        dst = lo if self.cfg.transfer else None
        marked = gained = 0.0
        remaining = len(report.bundles)
        for s in sorted(report.bundles, key=lambda x: (x.throughput, x.bundle)):
            why = why_stays(s.bundle, hi, dst, self.owner, self.state, self.guard)
            if why is not None:
                result.skipped_bundles.append((s.bundle, why))
                continue
            if remaining <= 1:
                break
            if s.throughput <= 0:
                continue
            if marked - gained + s.throughput > budget:
                back = self._swap(s.throughput, marked, gained) if dst is not None else None
                if back is None:
                    result.skipped_bundles.append((s.bundle, "overshoot"))
                    break
                for b in back:
                    result.decisions.append(
                        Unload(b.bundle, lo, hi, self.reason, b.throughput, self.load[lo], self.load[hi])
                    )
                    gained += b.throughput
            result.decisions.append(
                Unload(s.bundle, hi, dst, self.reason, s.throughput, self.load[hi], self.load[lo])
            )
            marked += s.throughput
            remaining -= 1
        return marked - gained if marked > 0 else None

    def _swap(self, t_bundle: float, marked: float, gained: float) -> list[BundleStats] | None:
        """Bundles of ``lo`` to send back to ``hi`` so that moving a bundle of ``t_bundle`` bytes/s fits, or
        None. Each must keep both brokers below the source's throughput; enough of them must leave the
        destination no more loaded than the source, and the source below 75% of its throughput."""
        hi, lo = self.hi, self.lo
        if self.lo_report is None or not self.brokers.get(hi, False):
            return None
        t_max = self.tput[hi]
        max_new = t_max - marked + gained - t_bundle
        min_new = self.tput[lo] + marked - gained + t_bundle
        pool = sorted(self.lo_report.bundles, key=lambda x: (x.throughput, x.bundle))
        back: list[BundleStats] = []
        while self.swap_next < len(pool):
            b = pool[self.swap_next]
            self.swap_next += 1
            if self.owner(b.bundle) != lo or b.bundle in self.state.recent_bundles:
                continue
            if b.throughput <= 0 or self.guard(b.bundle, lo, hi) is not None:
                continue
            if max_new + b.throughput < t_max and min_new - b.throughput < t_max:
                back.append(b)
                max_new += b.throughput
                min_new -= b.throughput
                if min_new <= max_new < t_max * SWAP_MAX_FRACTION:
                    return back
        return None


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
    guard: Movable
    sources: set[str] = field(default_factory=set)
    received: set[str] = field(default_factory=set)
    exhausted: set[str] = field(default_factory=set)  # nothing of theirs fits any more: gaps only shrink
    picked: set[str] = field(default_factory=set)
    noted: set[str] = field(default_factory=set)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    _by_desc: list[str] = field(default_factory=list)  # the population by descending load, then name
    _cursor: int = 0  # into _by_desc: the brokers before it can no longer start to shed
    _heaviest: dict[str, list[BundleStats]] = field(default_factory=dict)  # a source's report, heaviest first

    def run(self, result: ShedResult) -> str:
        """Appends the moves to ``result``; returns why the last step moved nothing.

        Each step needs the least loaded destination and the sources by load. At 10 000 brokers, scanning
        every broker for them at every step cost most of a decision (128 ms); only the two brokers of a
        move change load, so destinations come from a heap (their loads only grow) and sources from the
        brokers in descending load order, fixed for the cycle (a broker's load changes only once it is a
        source or a destination) merged with the few that shed already. The choices are the scan's exactly.
        """
        last_skip = "no_bundles"
        load, cfg = self.load, self.cfg
        dest_heap = [(load[b], b) for b in load if self.brokers.get(b, False) and b not in self.cooling]
        heapq.heapify(dest_heap)
        self._by_desc = sorted(load, key=lambda b: (-load[b], b))
        self._cursor = 0
        while True:
            avg, std = _stats(list(load.values()))
            lo = self._least_loaded(dest_heap)
            order = self._sources_desc()
            first = next(order, None)
            if lo is None or first is None:
                last_skip = "cool_down" if self.cooling else last_skip
                break
            # The most loaded source is the greatest (load, name): collect the ties at the top load.
            ties, after = [first], None
            for b in order:
                if load[b] != load[first]:
                    after = b
                    break
                ties.append(b)
            hi = max(ties)
            srcs: Iterable[str] = itertools.chain(ties, () if after is None else (after,), order)
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

    def _least_loaded(self, heap: list[tuple[float, str]]) -> str | None:
        """The destination with the least (load, name): neither cooling nor a source; None if none is left.
        An entry whose broker received load since is pushed again with its load now."""
        load = self.load
        while heap:
            was, b = heap[0]
            if b in self.sources:
                heapq.heappop(heap)
            elif load[b] != was:
                heapq.heapreplace(heap, (load[b], b))
            else:
                return b
        return None

    def _blocked(self, b: str) -> bool:
        return b in self.cooling or b in self.exhausted or b in self.received

    def _sources_desc(self) -> Iterator[str]:
        """The brokers that may shed -- neither cooling, exhausted nor a destination, and a source already or
        while fewer than ``max_broker_pairs`` are -- by descending load, then name: those that shed already
        (their loads changed), merged with the others in the cycle's fixed order."""
        load = self.load
        shed = sorted((b for b in self.sources if not self._blocked(b)), key=lambda b: (-load[b], b))
        if len(self.sources) >= self.cfg.max_broker_pairs:
            return iter(shed)
        by_desc = self._by_desc
        while self._cursor < len(by_desc) and (
            self._blocked(by_desc[self._cursor]) or by_desc[self._cursor] in self.sources
        ):
            self._cursor += 1  # never eligible again as a new source: the sets only grow
        rest = (
            b
            for b in itertools.islice(by_desc, self._cursor, None)
            if not (self._blocked(b) or b in self.sources)
        )
        return heapq.merge(shed, rest, key=lambda b: (-load[b], b))

    def _choose(self, srcs: Iterable[str], lo: str) -> tuple[tuple[float, str, BundleStats] | None, str]:
        """The move that lowers the variance most, as (load it moves, source, bundle); else why none.
        ``srcs`` by descending load, then name."""
        choice: tuple[float, str, BundleStats] | None = None
        top_gain = 0.0
        why = ""
        for src in srcs:
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
        heaviest = self._heaviest.get(src)
        if heaviest is None:  # a source is tried at many steps of a cycle; its report does not change
            heaviest = self._heaviest[src] = sorted(report.bundles, key=lambda x: (-x.throughput, x.bundle))
        for b in heaviest:
            if b.bundle in self.picked or b.throughput <= 0:
                continue
            if b.bundle in self.state.recent_bundles:
                self._skip(b.bundle, "grace_period")
            elif self.owner(b.bundle) != src:
                self._skip(b.bundle, "not_owner")
            elif b.throughput * per_byte > half_gap:
                continue  # would overshoot this pair; a lighter one may fit
            elif (why := self.guard(b.bundle, src, lo if self.cfg.transfer else None)) is not None:
                self._skip(b.bundle, why)
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
    *,
    has_policies: HasPolicies | None = None,
) -> ShedResult:
    """One ThresholdShedder cycle: unload ``usage - (avg + threshold) + 5%`` of each hot broker's traffic.

    With ``cfg.lower_boundary`` (Pulsar's ``lowerBoundarySheddingEnabled``, ``tryLowerBoundaryShedding``):
    when nothing was shed and some broker is below ``avg - threshold``, the most loaded broker above that
    line with at least two reported bundles sheds ``threshold x 50%`` of its traffic (the same minimum
    applies), reason ``underloaded`` -- the case the plain rule misses: [50, 50, 50, 50, 50, 0]% never puts
    anyone above ``avg + threshold``, so the new broker would stay idle. Brokers in their cool-down are left
    out, as in the main rule."""
    pop, cooling, why = _population(brokers, loads, state, cfg, now_ms)
    if pop is None:
        return ShedResult([], "skip", why)
    load = {b: d.weighted_max_ema for b, d in pop.items()}
    avg, std = _stats(list(load.values()))
    result = ShedResult([], "skip", "balanced", avg=avg, std=std, loads=dict(load))
    # Destinations by projected load: each transfer adds its share to its destination, so one cycle does not
    # pile every hot broker's bundles onto the single coldest one (the simulator showed a 5 -> 10 scale-out
    # putting one new broker at 149 % that way).
    shed = _ThresholdShed(
        load,
        pop,
        dict(load),
        _Coldest(load, [x for x in load if brokers.get(x, False) and x not in cooling]),
        top,
        owner,
        state,
        cfg,
        movable(cfg, transferable, has_policies),
        result,
    )
    for b in sorted(load, key=lambda x: (-load[x], x)):
        if load[b] < avg + cfg.threshold:
            break
        if b in cooling:
            result.skipped_bundles.append((b, "cool_down"))
            continue
        frac = load[b] - avg - cfg.threshold + 0.05
        shed.broker(b, frac * pop[b].throughput, "overloaded")
    floor = avg - cfg.threshold
    if not result.decisions and cfg.lower_boundary and any(v < floor for v in load.values()):
        hot = [b for b in load if load[b] > floor and b not in cooling and _reported(top, b) > 1]
        if hot:
            b = min(hot, key=lambda x: (-load[x], x))
            shed.broker(b, pop[b].throughput * cfg.threshold * LOWER_BOUNDARY_MARGIN, "underloaded")
    if result.decisions:
        for u in result.decisions:
            state.recent_bundles[u.bundle] = now_ms
            state.recent_brokers[u.src] = now_ms
        result.result, result.reason = "success", result.decisions[0].reason
    return result


def _reported(top: Mapping[str, TopBundles], broker: str) -> int:
    report = top.get(broker)
    return len(report.bundles) if report is not None else 0


@dataclass
class _ThresholdShed:
    """ThresholdShedder's pick for one broker at a time, over one cycle's projected destinations."""

    load: Mapping[str, float]
    pop: Mapping[str, BrokerLoadData]
    projected: dict[str, float]
    coldest: _Coldest
    top: Mapping[str, TopBundles]
    owner: Owner
    state: ShedState
    cfg: ShedConfig
    guard: Movable
    result: ShedResult

    def broker(self, b: str, budget: float, reason: str) -> None:
        """Shed ``budget`` bytes/s off ``b``: its heaviest bundles while less than that is marked, one
        always left, each to the least loaded destination so far (or a plain unload)."""
        result, load, tput = self.result, self.load, self.pop[b].throughput
        if budget < self.cfg.min_unload_throughput:
            result.skipped_bundles.append((b, "below_min_throughput"))
            return
        report = self.top.get(b)
        if report is None or len(report.bundles) < 2:
            result.skipped_bundles.append((b, "no_bundles"))
            return
        marked = 0.0
        remaining = len(report.bundles)
        for s in sorted(report.bundles, key=lambda x: (-x.throughput, x.bundle)):
            if marked >= budget or remaining <= 1:
                break
            if self.owner(s.bundle) != b or s.bundle in self.state.recent_bundles or s.throughput <= 0:
                continue
            dst = self.coldest.pop_for(b) if self.cfg.transfer else None
            why = self.guard(s.bundle, b, dst)
            if why is None and dst is not None and tput > 0:
                shift = load_share(s.throughput, load[b], tput)
                self.projected[dst] += shift
                self.projected[b] -= shift
            if dst is not None:
                self.coldest.push(dst, self.projected[dst])
            if why is not None:
                result.skipped_bundles.append((s.bundle, why))
                continue
            result.decisions.append(
                Unload(s.bundle, b, dst, reason, s.throughput, load[b], load.get(dst or ""))
            )
            marked += s.throughput
            remaining -= 1
