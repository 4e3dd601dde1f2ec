"""Load reports (docs/design.md section 4): sample every ``report_interval_s``, publish the broker's load to the
compacted broker-load topic when any figure moved more than the threshold or the max interval passed, and
the top-k bundles to the top-bundles topic. After load moves (a bundle acquired or released) the EMA
restarts from fresh samples, as Pulsar's reporters do, so the next decision sees the new load at once
instead of a slow blend. On graceful stop both keys are tombstoned.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

import msgspec
import psutil
import structlog

from trimtab.agent.adapters.base import BrokerSample, Sampler
from trimtab.agent.metrics import AgentMetrics
from trimtab.balance.load import (
    BrokerLoadData,
    BundleStats,
    TopBundles,
    Usage,
    Weights,
    next_report,
    top_k,
)
from trimtab.channel.transport import Transport
from trimtab.cluster.runner import Schedule
from trimtab.config.settings import Settings
from trimtab.errors import AdapterError

log = structlog.get_logger("trimtab.reporter")
_enc = msgspec.json.Encoder()


class HostFigures(Protocol):
    """Fills in the host figures a broker's sample leaves out (:class:`HostSampler`; nothing to fill for
    the simulator's brokers, which report every figure)."""

    def fill(self, s: BrokerSample) -> BrokerSample: ...


class HostSampler:
    """Host figures for adapters that do not report them (cpu, memory, NIC throughput)."""

    def __init__(self, settings: Settings) -> None:
        cap = settings.broker.capacity
        self.cores = cap.cpu_cores or float(psutil.cpu_count() or 1)
        self.memory = float(cap.memory_bytes or psutil.virtual_memory().total)
        self.bw_in = cap.bandwidth_in_bytes
        self.bw_out = cap.bandwidth_out_bytes
        self._net = psutil.net_io_counters()
        self._net_t = time.monotonic()
        psutil.cpu_percent(interval=None)

    def fill(self, s: BrokerSample) -> BrokerSample:
        now = time.monotonic()
        net = psutil.net_io_counters()
        dt = max(now - self._net_t, 1e-3)
        rin = (net.bytes_recv - self._net.bytes_recv) / dt
        rout = (net.bytes_sent - self._net.bytes_sent) / dt
        self._net, self._net_t = net, now
        return BrokerSample(
            cpu=s.cpu or Usage(psutil.cpu_percent(interval=None) / 100 * self.cores, self.cores),
            memory=s.memory or Usage(float(psutil.virtual_memory().used), self.memory),
            bandwidth_in=s.bandwidth_in or Usage(rin, self.bw_in),
            bandwidth_out=s.bandwidth_out or Usage(rout, self.bw_out),
            bundles=s.bundles,
        )


class LoadReporter:
    def __init__(
        self,
        me: str,
        adapter: Sampler,
        transport: Transport,
        settings: Settings,
        metrics: AgentMetrics,
        *,
        host: HostFigures,
        has_policies: Callable[[str], bool] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``host`` fills in the host figures the adapter's samples leave out. ``has_policies``: whether a
        bundle's namespace has an isolation policy or an anti-affinity group. Unless
        ``shedding.shed_bundles_with_policies``, the top-k report leaves those bundles out: the shedder may
        not move them, and they would crowd out those it may (Pulsar's ``TopKBundles``)."""
        self.me = me
        self.adapter = adapter
        self.transport = transport
        self.s = settings
        self.metrics = metrics
        self.clock = clock
        self.weights = Weights.from_settings(settings)
        self.host = host
        self.leave_out = None if settings.shedding.shed_bundles_with_policies else has_policies
        self._monotonic = monotonic
        self.current: BrokerLoadData | None = None  # latest computed (EMA state)
        self.published: BrokerLoadData | None = None  # last one published
        self.last_top_at = 0.0
        self.last_bundles: list[BundleStats] = []
        self._fresh = False
        self._force = False
        self._wake = asyncio.Event()

    def load_moved(self) -> None:
        """A bundle moved in or out: restart the EMA and publish at the next sample (debounced)."""
        self._fresh = True
        self._force = True

    def poke(self) -> None:
        self._wake.set()

    def schedule(self) -> Schedule:
        """At start, then every ``load.report_interval_s`` or when poked."""
        return Schedule(self.s.load.report_interval_s, wake=self._wake)

    async def run_once(self) -> None:
        """One report; a broker that does not answer is a counted warning, anything else a job failure."""
        try:
            await self.report_once()
        except AdapterError as e:
            self.metrics.reports.labels("failed", "adapter").inc()
            log.warning("load_sample_failed", error=str(e))
        except Exception:
            self.metrics.reports.labels("failed", "error").inc()
            raise

    async def report_once(self) -> BrokerLoadData:
        sample = self.host.fill(await self.adapter.sample())
        now_ms = int(self.clock() * 1000)
        bundles = sample.bundles
        raw = BrokerLoadData(
            broker=self.me,
            cpu=sample.cpu or Usage(0, 1),
            memory=sample.memory or Usage(0, 1),
            bandwidth_in=sample.bandwidth_in or Usage(0, 1),
            bandwidth_out=sample.bandwidth_out or Usage(0, 1),
            msg_rate_in=sum(b.msg_rate_in for b in bundles),
            msg_rate_out=sum(b.msg_rate_out for b in bundles),
            msg_throughput_in=sum(b.msg_throughput_in for b in bundles),
            msg_throughput_out=sum(b.msg_throughput_out for b in bundles),
            bundles=len(bundles),
            topics=sum(b.topics for b in bundles),
            updated_at=now_ms,
        )
        step = next_report(
            raw,
            current=self.current,
            published=self.published,
            fresh=self._fresh,
            force=self._force,
            weights=self.weights,
            settings=self.s,
            now_ms=now_ms,
        )
        self._fresh = self._force = False
        self.current = step.current
        self.last_bundles = bundles
        reason, load = step.reason, step.published
        if reason is None or load is None:
            self.metrics.reports.labels("skipped", "unchanged").inc()
            return step.current
        await self._produce(self.s.kafka.broker_load_topic, _enc.encode(load))
        self.published = load
        self.metrics.reports.labels("published", reason).inc()
        top = TopBundles(
            broker=self.me, bundles=top_k(bundles, self.s.load.top_k, self.leave_out), reported_at=now_ms
        )
        await self._produce(self.s.kafka.top_bundles_topic, _enc.encode(top))
        self.last_top_at = self._monotonic()
        log.debug("load_published", reason=reason, ema=round(load.weighted_max_ema, 4), bundles=load.bundles)
        return load

    async def _produce(self, topic: str, value: bytes | None) -> None:
        fut = self.transport.produce(topic, self.me.encode(), value)
        async with asyncio.timeout(30):
            await asyncio.wrap_future(fut)

    async def tombstone(self) -> None:
        """Graceful stop: readers must not keep assigning to a broker that is leaving."""
        for topic in (self.s.kafka.broker_load_topic, self.s.kafka.top_bundles_topic):
            try:
                await self._produce(topic, None)
            except Exception as e:
                log.warning("load_tombstone_failed", topic=topic, error=str(e))
        log.info("load_report_tombstoned")
