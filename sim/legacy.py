"""Pulsar's modular-load-manager shedders: baselines the simulator compares trimtab's shedders with, never run by a
daemon (issue 11; digest pulsar_elb.md 4.4).

Three pure functions with the signature of :func:`trimtab.balance.shed.transfer_shedder` plus a keyword-only
:class:`LegacyConfig`:

* :func:`overload_shedder` -- ``OverloadShedder``: a broker at or above the overload threshold sheds enough
  of its throughput to get 5% under it.
* :func:`legacy_threshold_shedder` -- ``ThresholdShedder`` as the modular load manager runs it (the default
  strategy since Pulsar 2.10): a broker whose own EMA of its weighted max usage is at least ``avg +
  threshold`` sheds ``usage - avg - threshold + 5%`` of its throughput.
* :func:`uniform_load_shedder` -- ``UniformLoadShedder``: if the busiest and idlest brokers are too far
  apart in message rate (or throughput), the busiest sheds a fifth of the gap in bundles that fit.

What they share, like the modular load manager's ``doLoadShedding``: nothing happens with at most one live
broker; bundles moved within ``loadBalancerSheddingGracePeriodMinutes`` (``cfg.bundle_grace_s``, the
shared ``state.recent_bundles``) are left alone; every decision is a plain unload (``Unload.dst is None``:
the next lookup places the bundle). Every cycle returns decisions or a skip reason, like trimtab's shedders,
and the moves are recorded in ``state`` the way trimtab's shedders record theirs.

Where these differ from Pulsar's code, on purpose (trimtab's rules, so the simulator compares policies and
not bugs):

* A broker always keeps one bundle (Pulsar only refuses a broker with a single bundle; with a big enough
  budget it can empty a broker).
* A bundle is only taken if the channel says the broker owns it and ``transferable(bundle, src, None)`` holds
  (Pulsar checks anti-affinity after selecting, so a refused bundle still used up part of the budget).
* Reports older than ``cfg.load_ttl_s`` are left out (the modular load manager keeps a broker's data until
  its ZooKeeper node goes); a live broker without a report is simply not part of the population.
* Ties are broken by name, so equal inputs give equal decisions (Pulsar iterates hash maps).

Where trimtab's TransferShedder differs from all three: it compares load *dispersion* (std, relative
under-load of the idlest broker) rather than a fixed threshold, so it sees PIP-220's cases ([12, 2, 1, 1]%,
[50, 50, 50, 50, 50, 0]%) these miss; it requires the trigger to hold for several cycles (hit count) and
cools down a broker after a move; it moves bundles straight to a chosen cold broker (a transfer), where
these unload and let the next lookup choose.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from trimtab.balance.load import BrokerLoadData, BundleStats, TopBundles, Weights, is_fresh
from trimtab.balance.shed import (
    Owner,
    ShedConfig,
    ShedResult,
    ShedState,
    Transferable,
    Unload,
    _expire,
    _finish,
    _stats,
)

MB = 1024 * 1024
MARGIN = 0.05  # ADDITIONAL_THRESHOLD_PERCENT_MARGIN of OverloadShedder and ThresholdShedder
LOWER_BOUNDARY_MARGIN = 0.5  # ThresholdShedder's LOWER_BOUNDARY_THRESHOLD_MARGIN
_INT_MAX = 2**31 - 1


@dataclass(frozen=True)
class LegacyConfig:
    """The modular load manager's settings these shedders read, with Pulsar's defaults.

    The shared ones (the grace period, the report TTL) come from :class:`ShedConfig`.
    """

    # OverloadShedder: loadBalancerBrokerOverloadedThresholdPercentage = 85
    overload_threshold: float = 0.85
    # ThresholdShedder: loadBalancerHistoryResourcePercentage = 0.9
    history: float = 0.9
    # ThresholdShedder: loadBalancerBrokerThresholdShedderPercentage = 10
    threshold: float = 0.10
    # ThresholdShedder: loadBalancerBundleUnloadMinThroughputThreshold = 10 (MB)
    min_throughput: float = 10 * MB
    # ThresholdShedder: lowerBoundarySheddingEnabled = false
    lower_boundary_shedding: bool = False
    # ThresholdShedder: loadBalancer{CPU,Memory,BandwithIn,BandwithOut}ResourceWeight, only to recompute a
    # usage above 100% from the signals within their limits (the weighted max itself is the reporter's).
    weights: Weights = field(default_factory=Weights)
    # UniformLoadShedder: loadBalancerMsgRateDifferenceShedderThreshold = 50 (%)
    msg_rate_difference_pct: float = 50.0
    # UniformLoadShedder: loadBalancerMsgThroughputMultiplierDifferenceShedderThreshold = 4
    throughput_multiplier: float = 4.0
    # UniformLoadShedder: maxUnloadPercentage = 0.2
    max_unload_percentage: float = 0.2
    # UniformLoadShedder: minUnloadMessage = 1000 (msg/s)
    min_unload_message: float = 1000.0
    # UniformLoadShedder: minUnloadMessageThroughput = 1 MiB/s
    min_unload_throughput: float = 1 * MB
    # UniformLoadShedder: maxUnloadBundleNumPerShedding = -1 (no limit)
    max_unload_bundles: int = -1


def _population(
    brokers: Mapping[str, bool],
    loads: Mapping[str, BrokerLoadData],
    state: ShedState,
    cfg: ShedConfig,
    now_ms: int,
) -> tuple[dict[str, BrokerLoadData] | None, str]:
    """(fresh reports of live brokers, skip reason if no cycle); forgets moves older than the grace period.

    Not :func:`trimtab.balance.shed._population`: the modular load manager has no broker cool-down and does
    not wait for every broker to report, it sheds over the brokers it has data for.
    """
    _expire(state, cfg, now_ms)
    if len(brokers) <= 1:
        return None, "no_brokers"  # "Only 1 broker available: no load shedding will be performed"
    pop = {b: loads[b] for b in sorted(brokers) if b in loads and is_fresh(loads[b], now_ms, cfg.load_ttl_s)}
    if not pop:
        return None, "no_load_data"
    return pop, ""


def _bundle_count(broker: str, load: BrokerLoadData, report: TopBundles | None, owner: Owner) -> int:
    """How many bundles ``broker`` has, as far as we can tell: those of its top-bundles report the channel
    says it owns, plus those its load report counts beyond the report (idle ones, or beyond the top k)."""
    if report is None:
        return load.bundles
    owned = sum(1 for s in report.bundles if owner(s.bundle) == broker)
    return owned + max(0, load.bundles - len(report.bundles))


def _candidates(
    broker: str,
    report: TopBundles | None,
    value: Callable[[BundleStats], float],
    owner: Owner,
    state: ShedState,
    result: ShedResult,
) -> list[BundleStats]:
    """The broker's bundles it owns and that are out of their grace period, by ``value`` descending."""
    out: list[BundleStats] = []
    for s in report.bundles if report is not None else []:
        if owner(s.bundle) != broker:
            result.skipped_bundles.append((s.bundle, "not_owner"))
        elif s.bundle in state.recent_bundles:
            result.skipped_bundles.append((s.bundle, "grace_period"))
        else:
            out.append(s)
    out.sort(key=lambda s: (-value(s), s.bundle))
    return out


def _take_until(
    broker: str,
    cands: list[BundleStats],
    budget: float,
    keep: int,
    reason: str,
    src_load: float,
    transferable: Transferable,
    result: ShedResult,
) -> None:
    """OverloadShedder's and ThresholdShedder's pick: heaviest first while less than ``budget`` bytes/s is
    marked, and at least one bundle; at most ``keep`` bundles (so the broker keeps one)."""
    marked = 0.0
    taken = 0
    for s in cands:
        if taken >= keep or (taken and marked >= budget):
            break
        if not transferable(s.bundle, broker, None):
            result.skipped_bundles.append((s.bundle, "not_transferable"))
            continue
        result.decisions.append(Unload(s.bundle, broker, None, reason, s.throughput, src_load, None))
        marked += s.throughput
        taken += 1


def _no_bundles(broker: str, report: TopBundles | None, result: ShedResult) -> None:
    """Note a broker with a single bundle ("Sole namespace bundle ... is overloading broker")."""
    sole = report.bundles[0].bundle if report is not None and len(report.bundles) == 1 else broker
    result.skipped_bundles.append((sole, "sole_bundle"))


def overload_shedder(
    brokers: Mapping[str, bool],
    loads: Mapping[str, BrokerLoadData],
    top: Mapping[str, TopBundles],
    owner: Owner,
    state: ShedState,
    cfg: ShedConfig,
    now_ms: int,
    transferable: Transferable = lambda bundle, src, dst: True,
    *,
    legacy: LegacyConfig = LegacyConfig(),
) -> ShedResult:
    """One ``OverloadShedder`` cycle (Pulsar ``impl/OverloadShedder.java``).

    * A broker is overloaded when its unweighted max usage over cpu and bandwidth
      (``BrokerLoadData.max_resource_usage``, Pulsar's ``getMaxResourceUsage``) is at least
      ``loadBalancerBrokerOverloadedThresholdPercentage`` (85%); the others are ignored, under-loaded ones
      included.
    * It sheds ``(usage - threshold + 5%) x its current throughput`` (in + out bytes/s): its bundles by
      throughput descending, while less than that is marked, and at least one. A broker with a single bundle
      sheds nothing ("sole namespace bundle"). There is no minimum.

    trimtab's TransferShedder instead acts on dispersion and pairs brokers (see the module docstring); its
    overload trigger also needs the broker above ``avg + target_std``.
    """
    pop, why = _population(brokers, loads, state, cfg, now_ms)
    if pop is None:
        return ShedResult([], "skip", why)
    usage = {b: d.max_resource_usage for b, d in pop.items()}
    avg, std = _stats(list(usage.values()))
    result = ShedResult([], "skip", "", avg=avg, std=std, loads=dict(usage))
    last_skip = "balanced"
    for b in sorted(usage, key=lambda x: (-usage[x], x)):
        if usage[b] < legacy.overload_threshold:
            break
        budget = (usage[b] - legacy.overload_threshold + MARGIN) * pop[b].throughput
        last_skip = _shed_broker(
            b, pop[b], budget, "overloaded", usage[b], top, owner, state, transferable, result
        )
    return _finish(result, state, now_ms, last_skip)


def _within_limit_usage(load: BrokerLoadData, w: Weights) -> float:
    """Pulsar's ``getMaxResourceUsageWithWeightWithinLimit``: the weighted max over the signals that are at
    most 100%, for a usage above 100% (a limit is misconfigured)."""
    signals = (
        load.cpu.percent * w.cpu,
        load.memory.percent * w.memory,
        load.bandwidth_in.percent * w.bandwidth_in,
        load.bandwidth_out.percent * w.bandwidth_out,
    )
    return max((x for x in signals if x <= 100.0), default=0.0) / 100.0


def legacy_threshold_shedder(
    brokers: Mapping[str, bool],
    loads: Mapping[str, BrokerLoadData],
    top: Mapping[str, TopBundles],
    owner: Owner,
    state: ShedState,
    cfg: ShedConfig,
    now_ms: int,
    transferable: Transferable = lambda bundle, src, dst: True,
    *,
    legacy: LegacyConfig = LegacyConfig(),
) -> ShedResult:
    """One ``ThresholdShedder`` cycle of the modular load manager (Pulsar ``impl/ThresholdShedder.java``).

    * Each cycle, each broker's usage is its own EMA (kept in ``state.usage_ema``, the shedder's memory
      like Pulsar's ``brokerAvgResourceUsage``) of its current weighted max usage
      (``BrokerLoadData.weighted_max``, ``getMaxResourceUsageWithWeight``):
      ``ema = h x ema + (1 - h) x usage`` with ``h = loadBalancerHistoryResourcePercentage`` (0.9); the
      first sample starts it. A usage above 100% is recomputed from the signals within their limits.
      This is not the reporter's EMA (``weighted_max_ema``), which moves per report, not per cycle.
    * ``avg`` is the mean of the EMAs (nothing happens if it is 0). A broker whose EMA is at least
      ``avg + loadBalancerBrokerThresholdShedderPercentage`` (10%) sheds
      ``(ema - avg - threshold + 5%) x its current throughput`` -- unless that is below
      ``loadBalancerBundleUnloadMinThroughputThreshold`` (10 MB/s, Pulsar's MB being MiB) -- heaviest bundles first while less than
      that is marked, and at least one; a broker with a single bundle sheds nothing.
    * ``lowerBoundarySheddingEnabled`` (off by default): if nothing was shed and some broker's EMA is below
      ``avg - threshold``, the broker with the highest EMA above ``avg - threshold`` and more than one
      bundle sheds ``threshold x 50% x its throughput`` (same minimum), reason ``underloaded``.

    Why it misses PIP-220's cases: with [12, 2, 1, 1]% the average is 4%, so 12% < 14% sheds nothing;
    with [50, 50, 50, 50, 50, 0]% the average is 41.7%, so 50% < 51.7% and the new broker stays idle
    (lower-boundary shedding, when on, catches the second). trimtab's TransferShedder flags the idle broker
    as under-loaded relative to the others and fills it.
    """
    pop, why = _population(brokers, loads, state, cfg, now_ms)
    if pop is None:
        return ShedResult([], "skip", why)
    h = legacy.history
    for b, d in pop.items():
        u = d.weighted_max if d.weighted_max <= 1.0 else _within_limit_usage(d, legacy.weights)
        prev = state.usage_ema.get(b)
        state.usage_ema[b] = u if prev is None else h * prev + (1 - h) * u
    ema = {b: state.usage_ema[b] for b in pop}
    avg, std = _stats(list(ema.values()))
    result = ShedResult([], "skip", "", avg=avg, std=std, loads=dict(ema))
    if avg == 0:
        result.reason = "no_load"  # "average max resource usage is 0"
        return result
    last_skip = "balanced"
    for b in sorted(ema, key=lambda x: (-ema[x], x)):
        if ema[b] < avg + legacy.threshold:
            break
        budget = (ema[b] - avg - legacy.threshold + MARGIN) * pop[b].throughput
        if budget < legacy.min_throughput:
            result.skipped_bundles.append((b, "below_min_throughput"))
            last_skip = "below_min_throughput"
            continue
        last_skip = _shed_broker(
            b, pop[b], budget, "overloaded", ema[b], top, owner, state, transferable, result
        )

    if not result.decisions and legacy.lower_boundary_shedding:
        floor = avg - legacy.threshold
        if any(u < floor for u in ema.values()):
            hot = [b for b in ema if ema[b] > floor and _bundle_count(b, pop[b], top.get(b), owner) > 1]
            if hot:
                b = min(hot, key=lambda x: (-ema[x], x))
                budget = pop[b].throughput * legacy.threshold * LOWER_BOUNDARY_MARGIN
                if budget < legacy.min_throughput:
                    result.skipped_bundles.append((b, "below_min_throughput"))
                    last_skip = "below_min_throughput"
                else:
                    last_skip = _shed_broker(
                        b, pop[b], budget, "underloaded", ema[b], top, owner, state, transferable, result
                    )
    return _finish(result, state, now_ms, last_skip)


def _shed_broker(
    b: str,
    load: BrokerLoadData,
    budget: float,
    reason: str,
    src_load: float,
    top: Mapping[str, TopBundles],
    owner: Owner,
    state: ShedState,
    transferable: Transferable,
    result: ShedResult,
) -> str:
    """Shed ``budget`` bytes/s off ``b`` the Overload/ThresholdShedder way (heaviest first while less than
    the budget is marked, at least one bundle, one always left); returns the skip reason if nothing went."""
    report = top.get(b)
    keep = _bundle_count(b, load, report, owner) - 1
    if keep < 1:
        _no_bundles(b, report, result)
        return "no_bundles"
    cands = _candidates(b, report, lambda s: s.throughput, owner, state, result)
    before = len(result.decisions)
    _take_until(b, cands, budget, keep, reason, src_load, transferable, result)
    return "balanced" if len(result.decisions) > before else "no_bundles"


def _java_int(x: float) -> int:
    """Java's ``(int) x``: truncation toward zero, saturating at the int range."""
    return max(-_INT_MAX - 1, min(_INT_MAX, int(x)))


def uniform_load_shedder(
    brokers: Mapping[str, bool],
    loads: Mapping[str, BrokerLoadData],
    top: Mapping[str, TopBundles],
    owner: Owner,
    state: ShedState,
    cfg: ShedConfig,
    now_ms: int,
    transferable: Transferable = lambda bundle, src, dst: True,
    *,
    legacy: LegacyConfig = LegacyConfig(),
) -> ShedResult:
    """One ``UniformLoadShedder`` cycle (Pulsar ``impl/UniformLoadShedder.java``, after PR #21906).

    * Over the brokers' current message rates (in + out msg/s) and throughputs (in + out bytes/s): the max
      and the min of each (a min of about 0 counts as 1).
    * Triggered if ``(max_rate - min_rate) / min_rate x 100 > loadBalancerMsgRateDifferenceShedderThreshold``
      (50) -- then by message rate, from the broker with the highest rate -- or else if
      ``max_tput / min_tput > loadBalancerMsgThroughputMultiplierDifferenceShedderThreshold`` (4) -- then by
      throughput, from the broker with the highest throughput. A threshold of 0 or less disables its test.
    * Amount: ``(int)((max - min) x maxUnloadPercentage)`` (0.2), and nothing unless it is at least
      ``minUnloadMessage`` (1000 msg/s) or ``minUnloadMessageThroughput`` (1 MiB/s); nothing from a broker
      with a single bundle.
    * Bundles by that figure descending; a bundle is taken if it is at most what remains (it "fits"), then
      the remainder shrinks by it; at most ``maxUnloadBundleNumPerShedding`` bundles (-1: no limit).
      Bundles with no traffic are passed over.

    Only one broker sheds per cycle. trimtab's TransferShedder pairs up to ``max_broker_pairs`` brokers and
    moves about half of each gap, measured in resource usage rather than in msg/s or bytes/s.
    """
    pop, why = _population(brokers, loads, state, cfg, now_ms)
    if pop is None:
        return ShedResult([], "skip", why)
    rate = {b: d.msg_rate for b, d in pop.items()}
    tput = {b: d.throughput for b, d in pop.items()}
    names = sorted(pop)
    rate_hi = min(names, key=lambda b: (-rate[b], b))
    tput_hi = min(names, key=lambda b: (-tput[b], b))
    max_rate, max_tput = rate[rate_hi], tput[tput_hi]
    min_rate, min_tput = min(rate.values()), min(tput.values())
    eps = 1e-6
    if abs(min_rate) <= eps:
        min_rate = 1.0
    if abs(min_tput) <= eps:
        min_tput = 1.0
    rate_exceeded = (
        legacy.msg_rate_difference_pct > 0
        and (max_rate - min_rate) * 100 / min_rate > legacy.msg_rate_difference_pct
    )
    tput_exceeded = legacy.throughput_multiplier > 0 and max_tput / min_tput > legacy.throughput_multiplier

    figure = rate if rate_exceeded else tput
    avg, std = _stats(list(figure.values()))
    result = ShedResult([], "skip", "", avg=avg, std=std, loads=dict(figure))
    if not (rate_exceeded or tput_exceeded):
        result.reason = "balanced"
        return result

    if rate_exceeded:
        b, need = rate_hi, _java_int((max_rate - min_rate) * legacy.max_unload_percentage)
        minimum, value = legacy.min_unload_message, _bundle_rate
    else:
        b, need = tput_hi, _java_int((max_tput - min_tput) * legacy.max_unload_percentage)
        minimum, value = legacy.min_unload_throughput, _bundle_tput
    report = top.get(b)
    keep = _bundle_count(b, pop[b], report, owner) - 1
    if keep < 1:
        _no_bundles(b, report, result)
        return _finish(result, state, now_ms, "no_bundles")
    if need < minimum:
        result.skipped_bundles.append((b, "below_min_unload"))
        return _finish(result, state, now_ms, "below_min_unload")
    limit = legacy.max_unload_bundles
    for s in _candidates(b, report, value, owner, state, result):
        if len(result.decisions) >= keep or (limit != -1 and len(result.decisions) >= limit):
            break
        v = value(s)
        if v <= 0 or v > need:
            continue
        if not transferable(s.bundle, b, None):
            result.skipped_bundles.append((s.bundle, "not_transferable"))
            continue
        result.decisions.append(Unload(s.bundle, b, None, "overloaded", s.throughput, figure[b], None))
        need -= _java_int(v)  # MutableInt.add(-v): the double is truncated
    return _finish(result, state, now_ms, "no_bundles")


def _bundle_rate(s: BundleStats) -> float:
    return s.msg_rate


def _bundle_tput(s: BundleStats) -> float:
    return s.throughput
