"""The agents in the simulator, built as :mod:`trimtab.agent.wiring` builds them, over the simulated broker
and the simulated cluster.

Each incarnation of a broker's agent is a :class:`SimAgent`: the production
:class:`~trimtab.agent.reconciler.Reconciler` (with the :class:`~trimtab.agent.leases.LeaseGuard` it
acquires under and the :class:`~trimtab.agent.leases.LeaseRenewer`) and
:class:`~trimtab.agent.lookup.LookupService`, started, stopped and resumed as
:class:`trimtab.agent.daemon.Agent` does, their tasks those of one
:class:`~trimtab.sim.clock.Process`. Beside them the engine runs the agent's
:class:`~trimtab.agent.reporter.LoadReporter` and :class:`~trimtab.agent.splits.SplitScheduler` with a
:class:`~trimtab.cluster.runner.JobRunner` on their own schedules and the daemon's gates (not while
leaving), and its :class:`~trimtab.agent.drain.Drainer` when it is told to stop.

What an agent is given instead of ZooKeeper, Kafka and a broker: a ZooKeeper session in memory
(:class:`SimSession`, down while the scenario's ZooKeeper is), the registration of the simulated broker (its
draining flag goes to the engine), the channel and load views over the simulated Kafka, the bundle layouts
the engine keeps, and the simulated broker (:class:`~trimtab.sim.broker.SimBroker`: the cluster model's
operations and figures). Clocks are the virtual loop's.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from trimtab.agent.adapters.base import BrokerSample
from trimtab.agent.drain import Closing, Drainer
from trimtab.agent.identity import BrokerIdentity
from trimtab.agent.leases import LeaseGuard, LeaseRenewer
from trimtab.agent.lookup import IndexedAssignment, LayoutCache, LookupResult, LookupService
from trimtab.agent.merges import MergeScheduler
from trimtab.agent.metrics import AgentMetrics
from trimtab.agent.ownjobs import OwnerJobs
from trimtab.agent.reconciler import Reconciler
from trimtab.agent.reporter import LoadReporter
from trimtab.agent.splits import SplitScheduler
from trimtab.balance.assign import DEFAULT_FILTERS, AssignContext, BrokerInfo, PlacementRule
from trimtab.balance.load import BrokerLoadData
from trimtab.channel.bundles import BundleLayout, BundleRange
from trimtab.channel.client import ChannelClient
from trimtab.channel.records import Record, State
from trimtab.channel.transport import Transport
from trimtab.cluster.events import EventPublisher
from trimtab.cluster.kvview import LatestValues
from trimtab.cluster.runner import JobRunner
from trimtab.config.settings import Settings
from trimtab.errors import ZkUnavailable
from trimtab.sim.broker import SimBroker
from trimtab.sim.clock import Process, VirtualLoop
from trimtab.sim.leader import SimRegistry


class SimSession:
    """An agent's ZooKeeper session (:class:`~trimtab.agent.leases.LeaseSession`): connected unless the
    scenario's ZooKeeper is down; a confirmation fails while it is. A session that expired (an agent paused
    past the timeout) is followed by a new one (:meth:`renew`)."""

    def __init__(self, timeout_s: float, zk_up: Callable[[], bool]) -> None:
        self.requested_timeout_s = timeout_s
        self._zk_up = zk_up
        self.id = 1

    @property
    def connected(self) -> bool:
        return self._zk_up()

    def granted_timeout_s(self, wait_s: float = 5.0) -> float:
        return self.requested_timeout_s

    def confirm(self, timeout_s: float, path: str = "/") -> None:
        if not self._zk_up():
            raise ZkUnavailable("ZooKeeper is down (the scenario's outage): the session cannot be confirmed")

    def renew(self) -> None:
        self.id += 1


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


def assign_context(
    s: Settings, loads: LatestValues[BrokerLoadData], clock: Callable[[], float]
) -> Callable[[frozenset[str]], AssignContext]:
    """The agent's assignment context, as its wiring makes it: the load view now, minus ``exclude``."""

    def ctx(exclude: frozenset[str]) -> AssignContext:
        return AssignContext.from_settings(s, loads.snapshot(), int(clock() * 1000), exclude)

    return ctx


def build_drainer(
    s: Settings,
    loop: asyncio.AbstractEventLoop,
    *,
    info: BrokerInfo,
    channel: ChannelClient,
    registration: SimRegistration,
    closing: Closing,
    loads: LatestValues[BrokerLoadData],
    placement: PlacementRule,
    rng: random.Random,
) -> Drainer:
    """The drainer as the agent's wiring builds it (``closing``: the agent's reconciler)."""
    clock = loop.time
    return Drainer(
        identity_of(info),
        channel,
        closing,
        registration,
        assign_context=assign_context(s, loads, clock),
        placement=placement,
        rng=rng,
        metrics=AgentMetrics.create(CollectorRegistry()),
        timeout_s=s.agent.drain_timeout_s,
        diff=s.assignment.average_usage_diff_threshold_pct / 100,
        clock=clock,
        monotonic=clock,
    )


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
    sampler: SimBroker,
    transport: Transport,
    metrics: AgentMetrics,
) -> LoadReporter:
    return LoadReporter(
        me, sampler, transport, s, metrics, host=NoHost(), clock=loop.time, monotonic=loop.time
    )


def _deleted(old: Record | None, new: Record | None) -> bool:
    return (new is not None and new.state is State.DELETED) or (
        new is None and old is not None and old.state is State.DELETED
    )


class SimAgent:
    """One incarnation of an agent process over the simulated ``broker``: its reconciler and lookups, its
    load reporter and split scheduler (and their job runner), its drainer once told to stop."""

    def __init__(
        self,
        s: Settings,
        loop: VirtualLoop,
        *,
        me: str,
        channel: ChannelClient,
        transport: Transport,
        broker: SimBroker,
        registry: SimRegistry,
        zk_up: Callable[[], bool],
        loads: LatestValues[BrokerLoadData],
        placement: PlacementRule,
        rng: random.Random,
        events: EventPublisher,
        metrics: AgentMetrics,
        routes: Routes,
        layouts: Callable[[], Mapping[str, BundleLayout]],
        apply_split: Callable[[str, BundleRange, list[BundleRange]], None],
        apply_merge: Callable[[str, BundleRange, int], None],
        leaving: Callable[[], bool],
        failed: Callable[[str], None],
        indexed: IndexedAssignment | None = None,
    ) -> None:
        """``layouts``: the namespaces' layouts as ZooKeeper holds them; ``apply_split`` and ``apply_merge``
        update one (the reconciler's layout step of a split, of a merge); ``leaving``: the drain has begun;
        ``failed`` hears of a task of the agent that raised."""
        clock = loop.time
        self.loop = loop
        self.me = me
        self.channel = channel
        self.metrics = metrics
        self.routes = routes
        self.failed = failed
        self.process = Process(loop, me)
        self.reporter = reporter = build_reporter(
            s, loop, me=me, sampler=broker, transport=transport, metrics=metrics
        )
        self.session = SimSession(s.zookeeper.session_timeout_s, zk_up)
        self.leases = LeaseGuard(
            self.session,
            lease_s=s.lease_s(),
            margin_s=s.broker.adapter.lease_margin_s,
            metrics=metrics,
            mono=clock,
            wall=clock,
        )

        def url_of(broker: str) -> str | None:
            info = registry.brokers.get(broker)
            return info.service_url if info is not None else None

        self.reconciler = rec = Reconciler(
            me,
            channel,
            broker,
            url_of=url_of,
            apply_split=apply_split,
            apply_merge=apply_merge,
            metrics=metrics,
            on_served_change=lambda bundle, serving: self._served(reporter, bundle, serving),
            leases=self.leases,
            in_flight_timeout_s=s.channel.in_flight_timeout_s,
            clock=clock,
        )
        self.renewer = LeaseRenewer(
            me,
            self.leases,
            broker,
            served=lambda: sorted({*rec.served, *rec.acquiring}),  # sorted: see Reconciler.rescan
            record=channel.table.get,
            is_stale=rec.stale.__contains__,
            lost=rec.lost,
            metrics=metrics,
            in_flight_timeout_s=s.channel.in_flight_timeout_s,
        )
        self.layouts = LayoutCache(lambda ns: layouts()[ns], s.agent.lookup_cache_s, monotonic=clock)
        self.drainer: Drainer | None = None  # once told to stop
        self.lookups = LookupService(
            me,
            channel,
            self.layouts,
            brokers=lambda: registry.brokers,
            brokers_trusted=lambda: self.session.connected,
            filters=DEFAULT_FILTERS,
            placement=placement,
            timeout_s=s.channel.in_flight_timeout_s,
            assign_context=assign_context(s, loads, clock),
            diff=s.assignment.average_usage_diff_threshold_pct / 100,
            rng=rng,
            events=events,
            metrics=metrics,
            draining=lambda: self.drainer is not None and self.drainer.draining,
            clock=clock,
            monotonic=clock,
            indexed=indexed,
        )
        self.requests = 0  # lookups being answered
        own = OwnerJobs(me, channel, reporter, broker, events, metrics, paused=leaving, clock=clock)
        self.splitter = (
            SplitScheduler.from_settings(s, own, layouts=SimLayouts(layouts)) if s.split.enabled else None
        )
        self.merger: MergeScheduler | None = None
        if s.merge.enabled:

            async def merge_layout(namespace: str) -> BundleLayout | None:
                return layouts().get(namespace)

            self.merger = MergeScheduler.from_settings(s, own, layouts=merge_layout)
        self.jobs: JobRunner | None = None  # the load reports and auto-splits, while the agent stays

    def _served(self, reporter: LoadReporter, bundle: str, serving: bool) -> None:
        reporter.load_moved()  # as the wiring's
        self.routes.served(self, bundle, serving)

    # ------------------------------------------------------------------ the daemon's lifecycle
    def start(self) -> None:
        """Start-up once the channel caught up (``Agent._start``): every record naming this broker is
        queued, those it owns or is offered from before this session are stale, the session barrier is set
        as it registers, and the reconciler's workers start. (The daemon first fences what its broker
        still serves: a simulated broker starts empty.)"""
        table = self.channel.table
        self.reconciler.rescan(table)
        self.reconciler.mark_stale(table)
        self.registered()
        self.process.run(self.reconciler.start)

    def registered(self) -> None:
        """Registered in the current session (the registry's ``on_reregistered``): records from the
        channel's end on are this session's (``Agent._set_barrier_blocking``)."""
        ch = self.channel
        parts = ch.table.partitions or ch.transport.partitions(ch.topic)
        ends = {p: ch.transport.watermarks(ch.topic, p)[1] for p in range(parts)}
        self.reconciler.barrier.set(ends, self.session.id)

    def session_lost(self) -> None:
        """The ZooKeeper session expired (``Agent._session_lost``): no lease is vouched for any more, every
        record naming this broker is stale, everything the broker serves is fenced; a new session follows."""
        self.leases.forget()
        self.reconciler.barrier.lost()
        self.reconciler.mark_stale(self.channel.table)
        self._background(self.reconciler.fence_all(set(self.reconciler.served), "session_lost"))
        self.session.renew()

    def halt(self) -> None:
        """The process is killed, stopped (SIGSTOP) or exits: whatever it was doing ends here."""
        self.process.kill()

    def resume(self) -> None:
        """SIGCONT: the workers run again, the channel's changes of the meantime are looked at (the follower
        catches up), and the lease renewer's next round finds what the broker stopped serving."""
        self.process.run(self.reconciler.start)
        self.reconciler.rescan(self.channel.table)
        self.renew()

    def renew(self) -> None:
        """One round of the lease renewer: what the broker no longer serves goes back to the reconciler."""
        self._background(self.renewer.run_once())

    def exit(self) -> None:
        """The process is gone for good: its jobs and tasks end, its split scheduler stops listening to the
        channel."""
        self.run_jobs(False)
        if self.splitter is not None:
            self.channel.table.remove_listener(self.splitter._record_changed)
            self.splitter = None
        self.halt()

    def run_jobs(self, staying: bool) -> None:
        """Start or stop the job runner (load reports; auto-splits, whose own gate adds
        ``splitter.active()``) as the daemon's gate -- the agent stays: up, registered, not leaving --
        opens or closes. The daemon's runner polls the gate every 0.25 s; the engine knows the instants the
        gate changes, so a runner starts when it opens and stops when it closes -- a hundred agents
        polling would be most of a run's time. A gate that closes and opens again restarts the jobs'
        first-run clocks either way."""
        if not staying:
            if self.jobs is not None:
                self.loop.create_task(self.jobs.stop())
                self.jobs = None
            return
        if self.jobs is not None:
            return
        self.jobs = jobs = JobRunner(self.metrics.job_failures, mono=self.loop.time)
        jobs.add("load_report", self.reporter.run_once, self.reporter.schedule())
        if self.splitter is not None:
            jobs.add("auto_split", self.splitter.split_cycle, self.splitter.schedule())
        if self.merger is not None:
            jobs.add("auto_merge", self.merger.merge_cycle, self.merger.schedule())
        jobs.start()

    def _background(self, coro: Coroutine[Any, Any, object]) -> None:
        self.process.spawn(coro).add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[object]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.failed(f"{self.me}: {task.exception()!r}")

    # ------------------------------------------------------------------ the channel, as agent.wiring routes it
    def on_change(self, key: str, old: Record | None, new: Record | None) -> None:
        """A channel change, as the agent's wiring routes it (``_route_events``), at the instant it is
        applied: the lookup cache hears of a deleted split parent, a lookup waiting for the bundle wakes,
        and the reconciler queues the bundle if it may concern this broker (stale if it names this broker
        and predates its registration); the lease guard notes when it saw an in-flight record."""
        self.leases.in_flight.on_change(key, old, new)  # when this agent saw each in-flight record
        self.layouts.on_channel_change(key, old, new)
        self.lookups.on_change(key)
        predates = self.reconciler.barrier.predates(self.channel.table, key)
        self.reconciler.on_change(key, old, new, predates)

    # ------------------------------------------------------------------ lookups
    def ask(self, topic: str) -> asyncio.Task[LookupResult]:
        """A client's lookup of ``topic``, answered by this agent (as its HTTP handler: a task of its
        process, which ends with it)."""
        return self.process.spawn(self._answer(topic))

    async def _answer(self, topic: str) -> LookupResult:
        self.requests += 1
        self.routes.asking.add(self)
        try:
            return await self.lookups.lookup(topic)
        finally:
            self.requests -= 1
            if not self.requests:
                self.routes.asking.discard(self)


class Routes:
    """The channel's and the registry's changes, to the agents whose process runs (agent.wiring routes
    every change to the agent's lookups, lookup cache and reconciler).

    A change goes only to the agents it can concern: those it names (before or after), those whose
    reconciler holds the bundle as served, those answering a lookup, and -- a split parent deleted, which
    the lookup caches hear of -- all of them. Every other agent's listeners would leave everything as it
    was: a reconciler holds a bundle for stale only while its record names the broker (it is set for a
    record naming it, and cleared by the next change, which has that record as its old one); a waiting
    lookup belongs to a lookup being answered. Asking only those is what keeps a hundred agents from each
    hearing every record; the order is the order in which they started, as if each had heard it.
    """

    def __init__(self) -> None:
        self.running: dict[str, SimAgent] = {}
        self.serving: dict[str, set[SimAgent]] = {}  # bundle -> the agents whose reconciler serves it
        self.asking: set[SimAgent] = set()  # agents answering a lookup
        self._order: dict[SimAgent, int] = {}
        self._started = 0

    def start(self, agent: SimAgent) -> None:
        self.running[agent.me] = agent
        self._order[agent] = self._started
        self._started += 1
        for bundle in agent.reconciler.served:
            self.serving.setdefault(bundle, set()).add(agent)

    def stop(self, agent: SimAgent) -> None:
        """The agent's process no longer runs: it hears nothing (and, gone for good, is not kept)."""
        if self._order.pop(agent, None) is None:
            return
        del self.running[agent.me]
        for bundle in agent.reconciler.served:
            self._drop(agent, bundle)

    def served(self, agent: SimAgent, bundle: str, serving: bool) -> None:
        """The agent's reconciler now serves ``bundle``, or no longer does."""
        if agent not in self._order:
            return  # a process that does not run changes nothing; start() reads what it serves
        if serving:
            self.serving.setdefault(bundle, set()).add(agent)
        else:
            self._drop(agent, bundle)

    def _drop(self, agent: SimAgent, bundle: str) -> None:
        holders = self.serving.get(bundle)
        if holders is not None:
            holders.discard(agent)
            if not holders:
                del self.serving[bundle]

    def changed(self, key: str, old: Record | None, new: Record | None) -> None:
        """A table listener: ``key``'s record went from ``old`` to ``new``."""
        order = self._order
        if _deleted(old, new):
            found: set[SimAgent] = set(order)
        else:
            found = {*self.serving.get(key, ()), *self.asking}
            for rec in (old, new):
                if rec is not None:
                    for name in (rec.dst, rec.src):
                        agent = self.running.get(name) if name is not None else None
                        if agent is not None:
                            found.add(agent)
        for agent in sorted((a for a in found if a in order), key=order.__getitem__):
            agent.on_change(key, old, new)

    def membership_changed(self) -> None:
        """The registry changed: every waiting lookup looks again."""
        for agent in self.running.values():
            agent.lookups.wake_all()
