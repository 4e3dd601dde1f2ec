"""The leading controller in the simulator: the controller's own jobs -- :class:`SheddingJob`,
:class:`MonitorJob`, :class:`HealingJob` over a :class:`Healer` -- built as
:mod:`trimtab.controller.wiring` builds them and run by a :class:`JobRunner` on the daemon's schedules
(:mod:`trimtab.controller.schedules`), gated on leadership as the daemon gates them.

What they are given instead of ZooKeeper and Kafka is in memory: the channel and the load views over the
simulated Kafka (:mod:`trimtab.sim.transport`), the registry of the simulated cluster, the healing stores
of :mod:`trimtab.controller.memory_stores` (the plan's chunks are persisted there and carried on from
there), and :class:`SimLeadership`, whose ZooKeeper session is the scenario's: suspended during a
ZooKeeper outage (the jobs' gate closes, as ``LeaderElection.is_leader`` does while the session is not
connected), then in safe mode for ``healing.safe_mode_settle_s`` after it is back. Every clock is the
virtual loop's.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter

from trimtab.balance.assign import BrokerInfo
from trimtab.balance.heal import HealConfig, Override
from trimtab.balance.load import BrokerLoadData, TopBundles
from trimtab.balance.shed import ShedConfig, Shedder
from trimtab.channel.client import ChannelClient
from trimtab.channel.transport import Transport
from trimtab.cluster.events import EventPublisher
from trimtab.cluster.kvview import LatestValues
from trimtab.cluster.placement.standbys import StandbyIndex
from trimtab.cluster.placement.view import LivePlacement
from trimtab.cluster.runner import JobRunner
from trimtab.config.settings import Settings
from trimtab.controller import schedules
from trimtab.controller.healing import Healer, HealingJob
from trimtab.controller.journal import DecisionJournal
from trimtab.controller.memory_stores import MemoryFailedBrokers, MemoryReassignments
from trimtab.controller.metrics import ControllerMetrics
from trimtab.controller.monitor import MonitorJob
from trimtab.controller.operation_store import MemoryOperations
from trimtab.controller.operations import OperationsJob
from trimtab.controller.placement.destinations import Destinations
from trimtab.controller.shedding import SheddingJob
from trimtab.controller.writes import ChannelWrites

EVENTS_TOPIC = "trimtab-sim-events"


def job_failures(counter: Counter) -> int:
    """All runs counted by a ``trimtab_job_failures_total`` counter, whatever the task."""
    return int(sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total")))


class SimLeadership:
    """:class:`~trimtab.controller.leadership.LeaderGates` of the one controller, which leads for the whole
    run (term 1) over a ZooKeeper session the scenario can suspend."""

    def __init__(self, me: str, clock: Callable[[], float], settle_s: float) -> None:
        self.me = me
        self.clock = clock
        self.settle_s = settle_s
        self.down_until = -math.inf

    def outage(self, until: float) -> None:
        """ZooKeeper is unreachable until ``until``: the session is suspended, then reconnects."""
        self.down_until = max(self.down_until, until)

    @property
    def connected(self) -> bool:
        return self.clock() >= self.down_until

    @property
    def is_leader(self) -> bool:
        """The jobs' gate: leading, with a connected session (``LeaderElection.is_leader``)."""
        return self.connected

    def term(self) -> int:
        return 1

    def writer(self) -> str:
        return f"controller:{self.me}:t{self.term()}"

    def safe_mode(self) -> str | None:
        if not self.connected:
            return "zookeeper_suspended"
        stable = self.clock() - self.down_until
        if stable < self.settle_s:
            return f"settling ({stable:.0f}s of {self.settle_s:.0f}s since ZooKeeper reconnected)"
        return None

    async def confirm(self) -> bool:
        return self.confirm_blocking()

    def confirm_blocking(self) -> bool:
        return self.connected


class SimRegistry:
    """:class:`~trimtab.cluster.zk.LiveBrokers` over the simulated cluster: the engine says when a
    registration appears, goes or changes (:meth:`changed`), and the listeners hear of it as the
    controller's registry listeners do."""

    def __init__(self, registered: Callable[[], dict[str, BrokerInfo]]) -> None:
        self._registered = registered
        self._brokers: dict[str, BrokerInfo] = {}
        self.listeners: list[Callable[[], None]] = []

    @property
    def brokers(self) -> Mapping[str, BrokerInfo]:
        return self._brokers

    def changed(self) -> None:
        now = self._registered()
        if now == self._brokers:
            return
        self._brokers = now
        for fn in self.listeners:
            fn()


class SimController:
    def __init__(
        self,
        s: Settings,
        loop: asyncio.AbstractEventLoop,
        *,
        me: str,
        channel: ChannelClient,
        transport: Transport,
        registry: SimRegistry,
        loads: LatestValues[BrokerLoadData],
        top: LatestValues[TopBundles],
        rng: random.Random,
        shedder: Shedder | None,
    ) -> None:
        """``shedder`` None: no shedding job (the ``none`` policy)."""
        clock = loop.time
        self.leadership = SimLeadership(me, clock, s.healing.safe_mode_settle_s)
        self.metrics = ControllerMetrics.create(CollectorRegistry())
        journal = DecisionJournal(
            EventPublisher(transport, EVENTS_TOPIC, source=me, role="controller"), clock=clock
        )
        table = channel.table
        self.placement = LivePlacement(
            lambda: registry.brokers,
            failure_domains_enabled=s.placement.failure_domains_enabled,
            table=table,
        )
        table.add_listener(self.placement.record_changed)
        self.placement.load_table()  # whatever the (live) table holds already
        self.destinations = Destinations(
            s, registry, loads, self.placement, StandbyIndex(), rng=rng, clock=clock
        )
        writes = ChannelWrites(channel, self.leadership, self.metrics)
        heal_cfg = HealConfig.from_settings(s)
        self.failed_store = MemoryFailedBrokers()
        self.plans = MemoryReassignments(clock=clock)
        self.healer = Healer(
            self.failed_store,
            self.plans,
            heal_cfg,
            chunk_size=s.healing.chunk_size,
            writer=self.leadership.writer,
            term=self.leadership.term,
            clock=clock,
        )
        self.monitor = MonitorJob(
            table,
            self.leadership,
            self.destinations,
            writes,
            journal,
            self.metrics,
            heal_cfg,
            clock=clock,
            mono=clock,
        )
        # The leader's operations, as in the daemon (controller/wiring.py): each shedding cycle's moves are
        # one, stored in memory here. Ids from a counter: a run is a function of its seed.
        ids = itertools.count(1)
        self.operations = OperationsJob(
            lambda: s.operations,
            MemoryOperations(),
            table,
            self.leadership,
            writes,
            journal,
            self.metrics,
            clock=clock,
            new_id=lambda kind: f"{kind}-{next(ids)}",
            usable=lambda broker: (i := registry.brokers.get(broker)) is not None and not i.draining,
            heal_plans=self.healer.heal_plans,
            registered=lambda broker: broker in registry.brokers,
        )
        self.healing = HealingJob(
            self.healer,
            table,
            self.leadership,
            self.destinations,
            loads,
            writes,
            journal,
            self.metrics,
            clock=clock,
            mono=clock,
            held=self.operations.held_heals,
        )
        self.shedding = (
            None
            if shedder is None
            else SheddingJob(
                s.shedding,
                table,
                self.leadership,
                self.destinations,
                loads,
                top,
                journal,
                self.metrics,
                ShedConfig.from_settings(s),
                clock=clock,
                perf=clock,
                shedder=shedder,
                operations=self.operations,
            )
        )
        self.s = s
        self.clock = clock
        self.jobs: JobRunner | None = None
        self.heal_wake = asyncio.Event()
        # What the recorder sees of each round: the overrides the monitor and healing published, and the
        # healing rounds paused by the mass-failure guard.
        self.on_overrides: Callable[[list[Override]], None] = lambda overrides: None
        self.on_heal_paused: Callable[[], None] = lambda: None
        # The controller's routing (controller.daemon._listen): channel changes wake healing, membership
        # changes make it look for failures, and the placement rules see the new brokers.
        table.add_listener(lambda key, old, new: self.heal_wake.set())
        registry.listeners.append(self._membership_changed)

    def _membership_changed(self) -> None:
        self.placement.brokers_changed()
        self.healing.membership_changed()
        self.heal_wake.set()

    def start(self) -> None:
        """Take the lead (term 1): read what a previous leader persisted, then start the jobs, as the
        daemon does (on the running loop)."""
        asyncio.get_running_loop().create_task(self._on_lead())

    async def _on_lead(self) -> None:
        self.operations.load()
        await self.healing.on_lead()
        self.heal_wake.set()
        self._gate_changed()

    def suspend(self, until: float) -> None:
        """A ZooKeeper outage until ``until``: the jobs' gate closes now and opens again then."""
        self.leadership.outage(until)
        self._gate_changed()
        asyncio.get_running_loop().call_at(until, self._gate_changed)

    def _gate_changed(self) -> None:
        """Start or stop the jobs as their gate (leading, with healing's state read) opens or closes. The
        daemon's runner polls its gates every 0.25 s; the simulator knows the instants the gate changes, so
        it starts a runner when the gate opens and stops it when it closes (polling would be most of a run's
        time). A gate that closes and opens again restarts the jobs' first-run clocks either way."""
        open_ = self.leadership.is_leader and self.healing.ready
        if not open_:
            if self.jobs is not None:
                asyncio.get_running_loop().create_task(self.jobs.stop())
                self.jobs = None
            return
        if self.jobs is not None:
            return
        s = self.s
        self.jobs = jobs = JobRunner(self.metrics.job_failures, mono=self.clock)
        jobs.add(self.monitor.name, self._monitor, schedules.periodic(s.channel.monitor_interval_s))
        if self.shedding is not None:
            jobs.add(self.shedding.name, self.shedding.run_once, schedules.periodic(s.shedding.interval_s))
        jobs.add(self.operations.name, self.operations.run_once, schedules.periodic(s.operations.interval_s))
        jobs.add(self.healing.name, self._heal, schedules.healing(self.heal_wake))
        jobs.start()

    async def _monitor(self) -> None:
        self.on_overrides(await self.monitor.run_once())

    async def _heal(self) -> None:
        overrides = await self.healing.run_once()
        if self.healer.paused_reason == "mass_failure" and self.healer.failed:
            self.on_heal_paused()
        self.on_overrides(overrides)

    def failures(self) -> int:
        """Runs of a job that raised (``trimtab_job_failures_total``)."""
        return job_failures(self.metrics.job_failures)

    def shed_cycles(self) -> dict[str, int]:
        """``trimtab_shed_cycles_total`` as ``result:reason`` -> cycles."""
        out: dict[str, int] = {}
        for m in self.metrics.shed_cycles.collect():
            for sample in m.samples:
                if sample.name.endswith("_total") and sample.value:
                    out[f"{sample.labels['result']}:{sample.labels['reason']}"] = int(sample.value)
        return out
