"""Broker load data (docs/design.md section 4): the figures, the weighted-max EMA, and when to publish.

Pure functions of their inputs; the agent's reporter is the shell that samples and publishes. The wire
format is JSON (msgspec structs) on compacted topics keyed by broker id, readable with any Kafka tool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import msgspec

from trimtab.config.settings import Settings

#: A figure on the wire (a rate, a usage, a load fraction): non-negative and finite. JSON has no NaN, but
#: ``1e400`` decodes to infinity, and one infinite or negative report would turn every average, standard
#: deviation and "least loaded" comparison of the cluster into nonsense. 1e18 is far above any real rate
#: and keeps sums over thousands of brokers finite. Decoders refuse a value outside it (reason
#: ``invalid``); constructing a struct in code does not check.
FIGURE_MAX = 1e18
Figure = Annotated[float, msgspec.Meta(ge=0, le=FIGURE_MAX)]
#: A count (bundles, topics, sessions) or a time in unix ms: a non-negative integer.
Count = Annotated[int, msgspec.Meta(ge=0)]


class Usage(msgspec.Struct, frozen=True):
    usage: Figure
    limit: Figure

    @property
    def percent(self) -> float:
        return 100.0 * self.usage / self.limit if self.limit > 0 else 0.0


ZERO = Usage(0.0, 1.0)


class Rates(msgspec.Struct, frozen=True, kw_only=True):
    """Message rates (msg/s) and throughputs (bytes/s), of a broker or of one bundle."""

    msg_rate_in: Figure = 0.0
    msg_rate_out: Figure = 0.0
    msg_throughput_in: Figure = 0.0
    msg_throughput_out: Figure = 0.0

    @property
    def throughput(self) -> float:
        return self.msg_throughput_in + self.msg_throughput_out

    @property
    def msg_rate(self) -> float:
        return self.msg_rate_in + self.msg_rate_out


class BrokerLoadData(Rates, frozen=True, kw_only=True):
    """One broker's report; ``weighted_max_ema`` (a fraction, 1.0 = 100%) is what decisions compare."""

    schema: int = 1
    broker: str
    cpu: Usage = ZERO
    memory: Usage = ZERO
    bandwidth_in: Usage = ZERO  # bytes/s
    bandwidth_out: Usage = ZERO
    bundles: Count = 0
    topics: Count = 0
    max_resource_usage: Figure = 0.0
    weighted_max: Figure = 0.0
    weighted_max_ema: Figure = 0.0
    msg_throughput_ema: Figure = 0.0
    updated_at: Count = 0  # ms, when the sample was taken
    reported_at: Count = 0  # ms, when it was published


class BundleStats(Rates, frozen=True, kw_only=True):
    """Per-bundle figures as a broker reports them (the adapter's sample, the top-k report, splits)."""

    bundle: str
    topics: Count = 0
    producers: Count = 0
    consumers: Count = 0
    # topic hash -> (msg rate, throughput): feeds topic_count / flow_or_qps split algorithms.
    topic_loads: dict[int, tuple[Figure, Figure]] = msgspec.field(default_factory=dict)

    @property
    def sessions(self) -> int:
        return self.producers + self.consumers


class TopBundles(msgspec.Struct, frozen=True, kw_only=True):
    schema: int = 1
    broker: str
    bundles: list[BundleStats]
    reported_at: Count = 0


@dataclass(frozen=True, slots=True)
class Weights:
    cpu: float = 1.0
    memory: float = 1.0
    bandwidth_in: float = 1.0
    bandwidth_out: float = 1.0

    @classmethod
    def from_settings(cls, s: Settings) -> Weights:
        ld = s.load
        return cls(ld.cpu_weight, ld.memory_weight, ld.bandwidth_in_weight, ld.bandwidth_out_weight)


def weighted_max(load: BrokerLoadData, w: Weights) -> float:
    """``max_i(usage_i% x weight_i)`` as a fraction (Pulsar's getMaxResourceUsageWithWeight)."""
    return (
        max(
            load.cpu.percent * w.cpu,
            load.memory.percent * w.memory,
            load.bandwidth_in.percent * w.bandwidth_in,
            load.bandwidth_out.percent * w.bandwidth_out,
        )
        / 100.0
    )


def max_resource_usage(load: BrokerLoadData) -> float:
    """Unweighted max over cpu and bandwidth (memory deliberately excluded, as in Pulsar)."""
    return max(load.cpu.percent, load.bandwidth_in.percent, load.bandwidth_out.percent) / 100.0


def with_ema(
    sample: BrokerLoadData, previous: BrokerLoadData | None, w: Weights, history: float
) -> BrokerLoadData:
    """The sample with its derived figures; ``previous=None`` starts a fresh EMA (after load moved)."""
    wm = weighted_max(sample, w)
    tp = sample.throughput
    if previous is None:
        ema, tp_ema = wm, tp
    else:
        ema = history * previous.weighted_max_ema + (1 - history) * wm
        tp_ema = history * previous.msg_throughput_ema + (1 - history) * tp
    return msgspec.structs.replace(
        sample,
        max_resource_usage=max_resource_usage(sample),
        weighted_max=wm,
        weighted_max_ema=ema,
        msg_throughput_ema=tp_ema,
    )


def _pct_change(old: float, new: float) -> float:
    if old == new:
        return 0.0
    if old == 0:
        return float("inf")
    return 100.0 * abs(new - old) / abs(old)


def publish_reason(
    last: BrokerLoadData | None,
    current: BrokerLoadData,
    now_ms: int,
    *,
    threshold_pct: float,
    max_interval_s: float,
    force: bool = False,
) -> str | None:
    """Why this report should be published now, or None to skip it (Pulsar's reporter rule)."""
    if force:
        return "forced"
    if last is None:
        return "first"
    if now_ms - last.reported_at >= max_interval_s * 1000:
        return "interval"
    change = max(
        100.0 * abs(current.max_resource_usage - last.max_resource_usage),
        # The EMA is what decisions compare; it keeps moving for several samples after a step in load, and a
        # rule on raw figures alone would leave the published EMA stale until the maximum interval.
        100.0 * abs(current.weighted_max_ema - last.weighted_max_ema),
        _pct_change(last.msg_rate, current.msg_rate),
        _pct_change(last.throughput, current.throughput),
        _pct_change(float(last.bundles), float(current.bundles)),
    )
    return "changed" if change > threshold_pct else None


@dataclass(frozen=True, slots=True)
class NextReport:
    current: BrokerLoadData  # the sample with its EMA: the reporter's state from now on
    reason: str | None  # why to publish, None to skip
    published: BrokerLoadData | None  # what to publish (``current`` stamped with reported_at), if anything


def next_report(
    raw: BrokerLoadData,
    *,
    current: BrokerLoadData | None,
    published: BrokerLoadData | None,
    fresh: bool,
    force: bool,
    weights: Weights,
    settings: Settings,
    now_ms: int,
) -> NextReport:
    """One reporter step (the agent's and the simulator's): the EMA continues from ``current`` unless load
    just moved (``fresh``: it restarts, as Pulsar's reporters do), and the result is published when
    :func:`publish_reason` says so."""
    ld = settings.load
    load = with_ema(raw, None if fresh else current, weights, ld.history_weight)
    reason = publish_reason(
        published,
        load,
        now_ms,
        threshold_pct=ld.report_threshold_pct,
        max_interval_s=ld.report_max_interval_s,
        force=force,
    )
    out = None if reason is None else msgspec.structs.replace(load, reported_at=now_ms)
    return NextReport(load, reason, out)


def is_fresh(load: BrokerLoadData, now_ms: int, ttl_s: float) -> bool:
    return now_ms - load.updated_at <= ttl_s * 1000


def top_k(
    stats: list[BundleStats], k: int, leave_out: Callable[[str], bool] | None = None
) -> list[BundleStats]:
    """The k most loaded bundles with traffic, heaviest first (Pulsar's strict comparator order).

    ``leave_out``: bundles the shedder may not move (Pulsar's ``TopKBundles`` leaves out bundles of
    namespaces with policies unless ``loadBalancerSheddingBundlesWithPoliciesEnabled``), so they do not take
    the k places of bundles it could move."""
    busy = [s for s in stats if s.throughput > 0 and (leave_out is None or not leave_out(s.bundle))]
    busy.sort(
        key=lambda s: (
            s.msg_throughput_in,
            s.msg_throughput_out,
            s.msg_rate,
            s.topics + s.sessions,
            s.bundle,
        ),
        reverse=True,
    )
    return busy[:k]
