"""The controller process. Several run; one leads (docs/design.md sections 2, 3.4, 5.2, 5.4).

Every controller stays warm: it replays the channel and follows the broker-load and top-bundles topics,
so a follower that wins an election decides from a current view at once. Only the leader decides, and
each kind of decision is its own job (Pulsar's ``UnloadScheduler`` is the model):

* :class:`~trimtab.controller.snapshots.SnapshotJob` -- channel snapshots on an interval;
* :class:`~trimtab.controller.healing.HealingJob` -- failed-broker bookkeeping, then throttled forced
  reassignment in persisted chunks; woken by membership and channel changes;
* :class:`~trimtab.controller.monitor.MonitorJob` -- stuck in-flight states forced onward, Free/Deleted
  entries tombstoned;
* :class:`~trimtab.controller.shedding.SheddingJob` -- TransferShedder or ThresholdShedder, every cycle
  ending in a metric, a log line and an event;
* :class:`~trimtab.controller.operations.OperationsJob` -- the persisted operations (drains,
  maintenance) advanced within their limits, resumed by a new leader where the last one stopped.

This class keeps what is common to them: the start-up order, the leadership change (a new term resets the
jobs' per-term state and reads what the previous leader persisted), the loops that run a job only while
leading, and shutdown. The gates on each decision (safe mode, confirmed leadership) are
:class:`~trimtab.controller.leadership.Leadership`'s; everything is built in
:mod:`trimtab.controller.wiring`. The term is bound to every log line and event.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import time
from collections.abc import Callable

import structlog

from trimtab.cluster.bridge import LoopBridge
from trimtab.cluster.http import HttpServer
from trimtab.cluster.liveness import Liveness
from trimtab.cluster.logs import bind as bind_log
from trimtab.cluster.replica import Replica
from trimtab.cluster.runner import JobRunner, Schedule
from trimtab.config.settings import Settings
from trimtab.controller import schedules
from trimtab.controller.healing import HealingJob
from trimtab.controller.leadership import Leadership
from trimtab.controller.live_settings import LiveSettings
from trimtab.controller.metrics import ControllerMetrics
from trimtab.controller.monitor import MonitorJob
from trimtab.controller.operations import OperationsJob
from trimtab.controller.placement.standbys import StandbyJob
from trimtab.controller.shedding import SheddingJob
from trimtab.controller.snapshots import SnapshotJob
from trimtab.controller.stores import Switches

log = structlog.get_logger("trimtab.controller")


class Controller:
    def __init__(
        self,
        settings: Settings,
        replica: Replica,
        *,
        leadership: Leadership,
        http: HttpServer,
        snapshots: SnapshotJob,
        monitor: MonitorJob,
        healing: HealingJob,
        shedding: SheddingJob,
        standbys: StandbyJob,
        operations: OperationsJob,
        live: LiveSettings,
        switch_store: Switches,
        metrics: ControllerMetrics,
        liveness: Liveness,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self.s = settings
        self.leadership = leadership
        self.election = leadership.election
        self.replica = replica
        self.zk = replica.zk
        self.registry = replica.registry
        self.channel = replica.channel
        self.http = http
        self.snapshots = snapshots
        self.monitor = monitor
        self.healing = healing
        self.shedding = shedding
        self.standbys = standbys
        self.operations = operations
        self.live = live
        self.switch_store = switch_store
        self.events = replica.events
        self.metrics = metrics
        self.liveness = liveness
        self.mono = mono
        self.stop_event = asyncio.Event()
        self.leader_since = 0.0
        # The term whose persisted state (healing plans, operator switches, snapshots) this leader has read:
        # its decision jobs wait for it (a pause the operator persisted must hold from the first cycle).
        self.initialized_term: int | None = None
        self._unready_since: float | None = None  # mono time the leader's replica stopped being ready
        self._heal_wake = asyncio.Event()
        self.jobs = JobRunner(metrics.job_failures, mono=mono)

    # ------------------------------------------------------------------ events (loop thread)
    def _listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """Route ZooKeeper and channel events (their own threads) onto the event loop."""
        self.election.add_listener(
            lambda leading, term: loop.call_soon_threadsafe(self._leadership_changed, leading, term)
        )
        heal_wakeups: LoopBridge[None] = LoopBridge(loop, lambda _: self._heal_wake.set())
        self.channel.table.add_listener(lambda key, old, new: heal_wakeups.push(None))
        self.registry.add_listener(lambda brokers: loop.call_soon_threadsafe(self._membership_changed))
        self.zk.add_listener(lambda st: loop.call_soon_threadsafe(self._session_changed, st))

    def _membership_changed(self) -> None:
        self.healing.membership_changed()
        self._heal_wake.set()

    def _session_changed(self, state: str) -> None:
        self.metrics.safe_mode.set(0 if self.leadership.safe_mode() is None else 1)
        if state == "suspended" and self.election.term is not None:
            log.warning("leader_paused", reason="ZooKeeper session suspended: no decisions until it is back")

    def _leadership_changed(self, leading: bool, term: int | None) -> None:
        self.metrics.leader.set(1 if leading else 0)
        self.metrics.term.set(term or 0)
        bind_log(term=term)
        self.events.context = {"term": term} if term else {}
        if not leading:
            self.operations.loaded = False  # read again from ZooKeeper if this controller leads again
            log.info("leadership_released")
            return
        self.metrics.elections.inc()
        self.leader_since = self.mono()
        self.shedding.reset()
        self.jobs.restart_clocks()  # a new term waits its intervals, even if the last ended a moment ago
        self.healing.membership_changed()  # look for failed brokers straight away
        log.info("leadership_acquired", term=term)
        self.events.publish("leader_elected", key="leader", leader=self.leadership.me, term=term)
        asyncio.get_running_loop().create_task(self._on_lead(term))

    async def _on_lead(self, term: int | None, retry_s: float = 1.0) -> None:
        """Read what the previous leader persisted before this one decides anything: until this is done,
        the leader's jobs are held (:meth:`_leader_ready`); a read that fails is tried again while this term
        lasts (found when a new leader's first shedding cycle ran before it had read the operator's pause)."""
        while self.leadership.is_leader and self.leadership.term() == term:
            try:
                await self.healing.on_lead()
                await self.operations.on_lead()
                self.shedding.switches = await asyncio.to_thread(self.switch_store.read)
                await self.snapshots.on_lead()
            except Exception:
                log.exception("leader_init_failed", retry_in_s=retry_s)
                await asyncio.sleep(retry_s)
                continue
            self.initialized_term = term
            log.info("leader_initialized", term=term)
            break
        self._heal_wake.set()

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stop_event.set)
        self._listen(loop)
        self.http.start()
        log.info("controller_starting", http=self.election.http_url)
        try:
            if await self._warm_up():
                await self._lead_or_follow()
        finally:
            await self._shutdown()
        return 0

    async def _warm_up(self) -> bool:
        """Connect and catch up with the channel and the load views; False if stopped meanwhile."""
        # Standby sets are advice: warm-up does not wait for them (a leader that has not read them yet
        # rewrites them all, harmlessly).
        await self.replica.start()
        await asyncio.to_thread(self.live.start)  # every controller follows the live overrides
        if not await self.replica.caught_up(self.stop_event, mono=self.mono):
            return False
        self.liveness.ready = True
        log.info("controller_warm", bundles=len(self.channel.table))
        # Everything allocated while starting lives as long as the process: keep it out of the cyclic
        # collector's way (resolved records are already untracked; this covers the rest of the heap).
        gc.freeze()
        return True

    async def _lead_or_follow(self) -> None:
        await asyncio.to_thread(self.election.start)
        c = self.s
        jobs = self.jobs
        # The leader's periodic jobs: the first run one interval after taking over.
        for job, every in (
            (self.snapshots, c.channel.snapshot_interval_s),
            (self.monitor, c.channel.monitor_interval_s),
            (self.shedding, c.shedding.interval_s),
            (self.standbys, c.placement.standby_interval_s),
            (self.operations, c.operations.interval_s),
        ):
            jobs.add(job.name, job.run_once, schedules.periodic(every), gate=self._leader_ready)
        # Healing runs when membership or the channel changes (and at least every second).
        jobs.add(
            "healing",
            self.healing.run_once,
            schedules.healing(self._heal_wake),
            gate=lambda: self._leader_ready() and self.healing.ready,
        )
        jobs.add("tick", self._tick_once, Schedule(0.5))
        jobs.start()
        await self.stop_event.wait()
        await jobs.stop()

    async def _shutdown(self) -> None:
        self.liveness.ready = False
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.election.stop)
        await self.replica.stop_following()
        with contextlib.suppress(Exception):
            await self.http.stop()
        await self.replica.close()
        log.info("controller_stopped")

    # ------------------------------------------------------------------ jobs
    async def _tick_once(self) -> None:
        self.liveness.tick()
        self.metrics.safe_mode.set(0 if self.leadership.safe_mode() is None else 1)
        await self._stand_only_while_ready()

    async def _stand_only_while_ready(self) -> None:
        """Stand for election only with a ready replica, and resign after
        ``controller.resign_unready_after_s`` without one: a leader whose channel view cannot recover (a
        history gap no snapshot covers -- and only a leader with a ready view writes snapshots) would keep
        the leadership forever, deciding nothing, while a healthy controller waits (Pulsar #23297's class)."""
        ready = self.channel.ready
        self.election.candidate = ready
        if ready or not self.leadership.is_leader:
            self._unready_since = None
            return
        now = self.mono()
        if self._unready_since is None:
            self._unready_since = now
            return
        if now - self._unready_since >= self.s.controller.resign_unready_after_s:
            log.error(
                "leader_resigning",
                reason="channel replica not ready",
                for_s=round(now - self._unready_since, 1),
                detail=self.channel.health()[1],
            )
            self._unready_since = None
            await asyncio.to_thread(self.election.resign)

    def _leader_ready(self) -> bool:
        """Leading, and this term's persisted state has been read (:meth:`_on_lead`)."""
        return self.leadership.is_leader and self.initialized_term == self.leadership.term()
