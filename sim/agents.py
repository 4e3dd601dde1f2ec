"""The agents' jobs in the simulator, built as :mod:`trimtab.agent.wiring` builds them, over the simulated
broker and the simulated cluster: each incarnation of a broker's agent runs the
:class:`~trimtab.agent.reporter.LoadReporter` and the :class:`~trimtab.agent.splits.SplitScheduler` with a
:class:`~trimtab.cluster.runner.JobRunner` on their own schedules and the daemon's gates (not while
leaving), and the :class:`~trimtab.agent.drain.Drainer` when it is told to stop.

What an agent is given instead of ZooKeeper, Kafka and a broker: the registration of the simulated broker
(its draining flag goes to the engine), the channel and load views over the simulated Kafka, the bundle
layouts the engine keeps, and the simulated broker's own figures (:class:`SimSampler`: the cluster model's
loads; there is no host to sample). Clocks are the virtual loop's.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping, Set

from prometheus_client import CollectorRegistry

from trimtab.agent.adapters.base import BrokerSample
from trimtab.agent.drain import Drainer
from trimtab.agent.identity import BrokerIdentity
from trimtab.agent.metrics import AgentMetrics
from trimtab.agent.reporter import LoadReporter
from trimtab.agent.splits import SplitScheduler
from trimtab.balance.assign import AssignContext, BrokerInfo, PlacementRule
from trimtab.balance.load import BrokerLoadData
from trimtab.balance.split import SplitLimits
from trimtab.channel.bundles import BundleLayout
from trimtab.channel.client import ChannelClient
from trimtab.channel.transport import Transport
from trimtab.cluster.events import EventPublisher
from trimtab.cluster.kvview import LatestValues
from trimtab.config.settings import Settings
from trimtab.sim.leader import SimRegistry


class SimClosing:
    """:class:`~trimtab.agent.drain.Closing` of a simulated broker."""

    def __init__(self, served: Callable[[], Set[str]], fenced: Callable[[], Set[str]]) -> None:
        self._served = served
        self._fenced = fenced

    @property
    def served(self) -> Set[str]:
        return self._served()

    @property
    def fenced(self) -> Set[str]:
        return self._fenced()


class SimRegistration:
    """:class:`~trimtab.cluster.zk.Registration` of one simulated broker: the cluster's registrations, and
    an update of its own (the draining flag) handed to the engine."""

    def __init__(self, registry: SimRegistry, update: Callable[[BrokerInfo], None]) -> None:
        self.registry = registry
        self._update = update

    @property
    def brokers(self) -> Mapping[str, BrokerInfo]:
        return self.registry.brokers

    def update(self, info: BrokerInfo) -> None:
        self._update(info)


def identity_of(info: BrokerInfo) -> BrokerIdentity:
    return BrokerIdentity(
        id=info.id,
        http_url=info.http_url,
        service_url=info.service_url,
        start_time_ms=info.start_time,
        tags=dict(info.tags),
        failure_domain=info.failure_domain,
        version=info.version,
    )


def build_drainer(
    s: Settings,
    loop: asyncio.AbstractEventLoop,
    *,
    info: BrokerInfo,
    channel: ChannelClient,
    registration: SimRegistration,
    closing: SimClosing,
    loads: LatestValues[BrokerLoadData],
    placement: PlacementRule,
    rng: random.Random,
) -> Drainer:
    """The drainer as the agent's wiring builds it."""
    clock = loop.time

    def assign_context(exclude: frozenset[str]) -> AssignContext:
        return AssignContext.from_settings(s, loads.snapshot(), int(clock() * 1000), exclude)

    return Drainer(
        identity_of(info),
        channel,
        closing,
        registration,
        assign_context=assign_context,
        placement=placement,
        rng=rng,
        metrics=AgentMetrics.create(CollectorRegistry()),
        timeout_s=s.agent.drain_timeout_s,
        diff=s.assignment.average_usage_diff_threshold_pct / 100,
        clock=clock,
        monotonic=clock,
    )


class SimSampler:
    """:class:`~trimtab.agent.adapters.base.Sampler` of a simulated broker: its figures from the model."""

    def __init__(self, figures: Callable[[], BrokerSample]) -> None:
        self._figures = figures

    async def sample(self) -> BrokerSample:
        return self._figures()


class NoHost:
    """:class:`~trimtab.agent.reporter.HostFigures` for a simulated broker, which reports every figure."""

    def fill(self, s: BrokerSample) -> BrokerSample:
        return s


class SimLayouts:
    """:class:`~trimtab.agent.splits.Layouts` over the engine's namespace layouts (every agent has read
    every namespace: the simulator has no lookup cache to miss)."""

    def __init__(self, layouts: Callable[[], Mapping[str, BundleLayout]]) -> None:
        self._layouts = layouts

    def cached(self) -> Mapping[str, BundleLayout]:
        return self._layouts()


def build_reporter(
    s: Settings,
    loop: asyncio.AbstractEventLoop,
    *,
    me: str,
    sampler: SimSampler,
    transport: Transport,
    metrics: AgentMetrics,
) -> LoadReporter:
    return LoadReporter(
        me, sampler, transport, s, metrics, host=NoHost(), clock=loop.time, monotonic=loop.time
    )


def build_splitter(
    s: Settings,
    loop: asyncio.AbstractEventLoop,
    *,
    me: str,
    channel: ChannelClient,
    reporter: LoadReporter,
    sampler: SimSampler,
    layouts: SimLayouts,
    events: EventPublisher,
    metrics: AgentMetrics,
    paused: Callable[[], bool],
) -> SplitScheduler:
    """The split scheduler as the agent's wiring builds it (``paused``: the drain has begun)."""
    return SplitScheduler(
        me,
        channel,
        reporter=reporter,
        adapter=sampler,
        layouts=layouts,
        events=events,
        metrics=metrics,
        limits=SplitLimits.from_settings(s),
        enabled=s.split.enabled,
        interval_s=s.split.interval_s,
        paused=paused,
        clock=loop.time,
        auto_unload=s.split.auto_unload,
    )
