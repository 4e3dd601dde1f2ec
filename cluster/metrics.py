"""Prometheus metrics shared by agents and controllers.

Every process builds its metrics against its own ``CollectorRegistry`` (Faust's pattern), so tests stay
isolated. Names follow Prometheus rules: ``trimtab_`` prefix, ``_total`` for counters, base units
(seconds, bytes) in the name, and label values from small fixed sets.

Channel replay counters are exported by a custom collector that reads :class:`channel.table.ReplayStats`
at scrape time instead of incrementing a labelled counter per record on the replay hot path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trimtab.channel.client import ChannelClient
from trimtab.channel.records import SKIP_REASONS
from trimtab.cluster.kvview import KeyValueView


class ChannelCollector(Collector):
    def __init__(self, client: Callable[[], ChannelClient | None]) -> None:
        self._client = client

    def collect(self) -> Iterable[Metric]:
        c = self._client()
        records = CounterMetricFamily(
            "trimtab_channel_records",
            "Channel records replayed by this node, by outcome and reason.",
            labels=["outcome", "reason"],
        )
        ready = GaugeMetricFamily("trimtab_channel_ready", "1 once the channel replay caught up.")
        lag = GaugeMetricFamily(
            "trimtab_channel_lag_records", "Records between the replay position and the end."
        )
        bundles = GaugeMetricFamily(
            "trimtab_channel_bundles", "Bundles with a channel record, by state.", labels=["state"]
        )
        broker_ids = GaugeMetricFamily(
            "trimtab_channel_packed_broker_ids",
            "Broker ids the table has numbered to pack settled bundles (channel/packed.py): at most 65535; "
            "past it, records naming a broker it never numbered are held whole, ~80 bytes more each, until "
            "the node restarts.",
        )
        gap = GaugeMetricFamily(
            "trimtab_channel_history_gap",
            "1 while this node is recovering from a history gap (retention deleted records it had not read).",
        )
        gaps = CounterMetricFamily(
            "trimtab_channel_history_gaps",
            "History gaps detected: records deleted before this node read them (each forces a re-bootstrap).",
        )
        recoveries = CounterMetricFamily(
            "trimtab_channel_recoveries",
            "Times the channel follower was restarted from a snapshot after it stopped (gap or failure).",
        )
        stalls = CounterMetricFamily(
            "trimtab_channel_follower_stalls",
            "Times the channel follower found its Kafka reader stalled (records there, not fetched for "
            "10 s) and reopened it at the positions it had applied.",
        )
        if c is not None:
            st = c.table.stats
            records.add_metric(["accepted", "ok"], st.accepted)
            for reason, n in st.rejected.items():
                records.add_metric(["rejected", str(reason)], n)
            # Every skip reason from the start, at 0 until it happens: increase() cannot see the first
            # skips of a series that only appears with them (TrimtabChannelRecordsSkipped would miss a
            # single burst of unreadable records).
            for reason in sorted({*SKIP_REASONS, *st.skipped}):
                records.add_metric(["skipped", reason], st.skipped.get(reason, 0))
            ready.add_metric([], 1.0 if c.ready else 0.0)
            lag.add_metric([], c.lag())
            for state, n in sorted((s.value, n) for s, n in c.table.state_counts().items()):
                bundles.add_metric([state], n)
            broker_ids.add_metric([], c.table.packed_broker_ids())
            gap.add_metric([], 1.0 if c.history_gap else 0.0)
            gaps.add_metric([], c.gaps)
            recoveries.add_metric([], c.recoveries)
            stalls.add_metric([], c.stalls)
        yield records
        yield ready
        yield lag
        yield bundles
        yield broker_ids
        yield gap
        yield gaps
        yield recoveries
        yield stalls


class KeyValueCollector(Collector):
    """Skipped values of the latest-value views (load reports, top bundles), read at scrape time."""

    def __init__(self, views: Callable[[], Iterable[KeyValueView[Any]]]) -> None:
        self._views = views

    def collect(self) -> Iterable[Metric]:
        skipped = CounterMetricFamily(
            "trimtab_kv_values_skipped",
            "Values of a load or top-bundles topic that were refused, by topic and reason (the key keeps its "
            "last good value).",
            labels=["topic", "reason"],
        )
        gaps = CounterMetricFamily(
            "trimtab_kv_history_gaps",
            "History gaps of a load or top-bundles view (it re-read the topic from the first retained offset).",
            labels=["topic"],
        )
        stalls = CounterMetricFamily(
            "trimtab_kv_follower_stalls",
            "Times a load or top-bundles view found its Kafka reader stalled and reopened it.",
            labels=["topic"],
        )
        for v in self._views():
            for reason, n in sorted(v.skipped.items()):
                skipped.add_metric([v.topic, reason], n)
            gaps.add_metric([v.topic], v.gaps)
            stalls.add_metric([v.topic], v.stalls)
        yield skipped
        yield gaps
        yield stalls


def new_registry() -> CollectorRegistry:
    return CollectorRegistry(auto_describe=True)
