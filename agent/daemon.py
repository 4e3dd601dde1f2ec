"""The agent process: one per broker (docs/design.md section 7). This module is its lifecycle only; the
parts are built, from settings, in :mod:`agent.wiring`.

Start-up order matters for correctness:

1. bind HTTP (so a port of 0 becomes real: the broker id defaults to host:port) -- the socket is bound in
   :mod:`agent.wiring` before anything that needs the id is built; :meth:`Agent.run` starts serving on it;
2. connect ZooKeeper, start the broker registry cache (not yet registered);
3. bootstrap the channel (snapshot + tail) and the broker-load view; only when both caught up
4. fence whatever the broker still serves (leases of a previous incarnation are not ours to renew), mark
   every record naming us as stale (balance.roles), confirm the session, register the broker (before that,
   nobody should assign to us) and scan the table for work naming us;
5. start the reconciler, the lease renewer, the load reporter and the split scheduler; report ready.

Leases (agent.leases): the broker serves only under leases this agent renews; a lost ZooKeeper session
fences everything at once and makes every record naming us stale again.

Shutdown (first SIGTERM/SIGINT): drain (:mod:`agent.drain`) -- transfer every owned bundle to other
brokers and wait (bounded) until they are owned elsewhere -- then tombstone the load report, deregister
and exit. A second signal, or the drain deadline, exits at once and says how many bundles were left.

An operator's drain (:meth:`Agent.start_drain`, ``POST /v1/admin/drain``) runs the same drain as a
background task and does *not* exit: the agent stays up and registered as draining, so nothing new is
assigned to it, until it is restarted (there is no undrain). A signal during it waits for it, then drains
as above (quickly: nothing is left) and exits.

Threads: kazoo and librdkafka have their own; the channel follower applies records on its thread and
hands events to the asyncio loop through a :class:`cluster.bridge.LoopBridge` (one wakeup per burst, in
order). All decisions run on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from trimtab.agent.adapters.base import BrokerAdapter
from trimtab.agent.drain import Drainer
from trimtab.agent.identity import BrokerIdentity
from trimtab.agent.leases import LeaseGuard, LeaseRenewer
from trimtab.agent.merges import MergeScheduler
from trimtab.agent.metrics import AgentMetrics
from trimtab.agent.prewarm import Prewarmer
from trimtab.agent.reconciler import Reconciler
from trimtab.agent.reporter import LoadReporter
from trimtab.agent.splits import SplitScheduler
from trimtab.channel.records import State
from trimtab.cluster.http import HttpServer
from trimtab.cluster.replica import Replica
from trimtab.cluster.runner import JobRunner, Schedule
from trimtab.errors import RequestError

log = structlog.get_logger("trimtab.agent")


class Agent:
    def __init__(
        self,
        identity: BrokerIdentity,
        replica: Replica,
        *,
        adapter: BrokerAdapter,
        prewarmer: Prewarmer,
        reconciler: Reconciler,
        reporter: LoadReporter,
        splitter: SplitScheduler,
        merger: MergeScheduler | None = None,
        drainer: Drainer,
        leases: LeaseGuard,
        renewer: LeaseRenewer,
        metrics: AgentMetrics,
        register_wait_s: float,
        catch_up_timeout_s: float = 300.0,
        tick_s: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``register_wait_s``: how long to wait for a registration of our id left by a previous
        incarnation's ZooKeeper session to expire."""
        self.identity = identity
        self.me = identity.id
        self.adapter = adapter
        self.replica = replica
        self.zk = replica.zk
        self.registry = replica.registry
        self.channel = replica.channel
        self.loads = replica.loads
        self.prewarmer = prewarmer
        self.reconciler = reconciler
        self.reporter = reporter
        self.splitter = splitter
        self.merger = merger
        self.drainer = drainer
        self.leases = leases
        self.renewer = renewer
        self.metrics = metrics
        self.register_wait_s = register_wait_s
        self.catch_up_timeout_s = catch_up_timeout_s
        self.tick_s = tick_s
        self._monotonic = monotonic
        self.started = monotonic()
        self.last_tick = monotonic()
        self.ready = False
        self.exit_reason = ""
        self.stop_event = asyncio.Event()
        self.force_exit = asyncio.Event()
        self.jobs = JobRunner(metrics.job_failures, mono=monotonic)
        self._drain_task: asyncio.Task[None] | None = None  # an operator's drain
        self._drain: dict[str, Any] | None = None  # how it started and (once over) ended
        self._drain_started = 0.0
        self._background: set[asyncio.Task[list[str]]] = set()

    @property
    def draining(self) -> bool:
        return self.drainer.draining or self._drain_task is not None

    # ------------------------------------------------------------------ an operator's drain
    async def start_drain(self, *, mark_only: bool = False) -> Mapping[str, Any]:
        """Start draining without exiting (``POST /v1/admin/drain``): the drain runs as a background task
        and this returns at once with the drain's status. ``mark_only``: only mark the broker draining in
        its registration -- the leader moves its bundles, as an operation it persists and resumes after a
        failover (docs/operations.md, "Operations"). 409 if draining already (by a signal or an earlier
        request), retryable 503 while starting or stopping."""
        if self.draining:
            raise RequestError(409, f"{self.me} is draining already (restart the agent to undo a drain)")
        if not self.ready or self.stop_event.is_set():
            raise RequestError(503, f"{self.me} is not ready (starting or stopping)", retryable=True)
        owned = len(self.drainer.owned())
        by = "leader_operation" if mark_only else "admin"
        info: dict[str, Any] = {"by": by, "owned_at_start": owned, "result": None}
        self._drain = info
        self._drain_started = self._monotonic()
        if mark_only:
            await self.drainer.mark()
            info["result"] = "marked: the leader moves the bundles"
        else:
            self._drain_task = asyncio.create_task(self._admin_drain(info), name="drain")
        log.info("admin_drain_requested", owned=owned, by=by)
        return {"broker": self.me, **self.drain_status()}

    def _in_maintenance(self) -> bool:
        """Whether the controller's maintenance record names this broker (``admin/maintenance/<me>``)."""
        try:
            return self.registry.zk.exists(f"{self.registry.paths.admin}/maintenance/{self.me}") is not None
        except Exception as e:  # ZooKeeper unreadable: start as configured; the leader marks it again
            log.warning("maintenance_check_failed", error=str(e))
            return False

    async def undrain(self) -> Mapping[str, Any]:
        """End a drain the leader ran (maintenance over): the broker takes bundles again. 409 while the
        agent drains by itself (a signal, or a drain it moves) -- that one ends only with a restart."""
        led = (self._drain or {}).get("by") == "leader_operation"
        if not self.draining:
            raise RequestError(409, f"{self.me} is not draining")
        if self._drain_task is not None or not led or self.stop_event.is_set():
            raise RequestError(
                409, f"{self.me} drains by itself (a signal or its own drain): restart it to undo"
            )
        await self.drainer.unmark()
        self._drain = None
        log.info("admin_undrain")
        return {"broker": self.me, **self.drain_status()}

    async def _admin_drain(self, info: dict[str, Any]) -> None:
        try:
            why = await self.drainer.drain(self.force_exit)
        except Exception as e:  # the drain never raises on input; say so if it ever does
            log.exception("admin_drain_failed")
            why = f"drain failed: {e}"
        info["result"] = why or "complete"
        info["seconds"] = round(self._monotonic() - self._drain_started, 3)

    def drain_plan(self) -> Mapping[str, Any]:
        """A dry run of :meth:`start_drain`: each bundle this broker owns and where the drain would send
        it now (the drain's own choice: live, non-draining brokers other than this one, placement first;
        null -- a plain unload -- when none is allowed). Nothing moves; ties are broken at random, as the
        drain breaks them. 409 if draining already, retryable 503 while starting or stopping."""
        if self.draining:
            raise RequestError(409, f"{self.me} is draining already (restart the agent to undo a drain)")
        if not self.ready or self.stop_event.is_set():
            raise RequestError(503, f"{self.me} is not ready (starting or stopping)", retryable=True)
        plan: dict[str, Any] = {
            bundle: {"dst": sel.broker, "reason": sel.reason, "candidates": sel.candidates}
            for bundle, sel in self.drainer.plan().items()
        }
        unloads = sum(1 for p in plan.values() if p["dst"] is None)
        return {
            "broker": self.me,
            "dry_run": True,
            "bundles": plan,
            "count": len(plan),
            "why": (
                f"{self.me} owns {len(plan)} bundles; draining would transfer {len(plan) - unloads} to the "
                f"brokers shown and unload {unloads} (no other broker allowed), then keep {self.me} "
                f"registered as draining"
            ),
        }

    def drain_status(self) -> dict[str, Any]:
        """Whether the broker drains, who asked, and how far it got."""
        out: dict[str, Any] = {"draining": self.draining}
        if self._drain is not None:
            out.update(self._drain)
            if self._drain["result"] is None:
                out["elapsed_s"] = round(self._monotonic() - self._drain_started, 3)
        elif self.draining:
            out["by"] = "signal"
        if self.draining:
            table = self.channel.table.items()
            out["owned"] = sum(1 for _, r in table if r.state is State.OWNED and r.dst == self.me)
            out["in_flight"] = sum(1 for _, r in table if r.state.in_flight and r.names(self.me))
            out["not_closed"] = len(self.reconciler.served | self.reconciler.fenced)
        return out

    # ------------------------------------------------------------------ lifecycle
    async def run(self, http: HttpServer) -> int:
        """Serve ``http`` (on the socket bound at wiring), start, run until stopped, drain, shut down."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self.stop)
        http.start()
        log.info("agent_starting", http=self.identity.http_url, adapter=self.adapter.kind)
        try:
            await self._start()
            await self._serve()
        finally:
            await self._shutdown(http)
        return 0

    def stop(self) -> None:
        """What SIGTERM does: the first call drains, a second exits without finishing the drain."""
        if not self.stop_event.is_set():
            log.info("signal_received", action="draining; send again to exit at once")
            self.stop_event.set()
        else:
            log.warning("signal_received", action="exiting without finishing the drain")
            self.force_exit.set()

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()

        def on_session() -> None:
            self.leases.check_session_timeout()
            self.zk.add_listener(
                lambda state: loop.call_soon_threadsafe(self._session_lost) if state == "lost" else None
            )
            self.metrics.zk_connected.set(1)

        await self.replica.start(on_session=on_session)
        if not await self.replica.caught_up(self.stop_event, self.catch_up_timeout_s, mono=self._monotonic):
            return
        log.info(
            "channel_caught_up",
            bundles=len(self.channel.table),
            seconds=round(self.channel.ready_at - self.channel.started_at, 3),
            snapshot=self.channel.snapshot.manifest.id if self.channel.snapshot else None,
        )
        # What is the broker still serving (an agent restarted beside a running broker)? Under leases of
        # a previous incarnation, which this one cannot vouch for: fence them now. Records naming us were
        # decided before this session and are settled through the channel first (balance.roles).
        try:
            sample = await self.adapter.sample()
            await self.reconciler.fence_all([b.bundle for b in sample.bundles], "startup")
        except Exception as e:
            log.warning("initial_sample_failed", error=str(e))
        stale = self.reconciler.mark_stale(self.channel.table)
        if stale:
            log.info("stale_records", bundles=stale)
        await self.leases.confirm()
        self.leases.start_heartbeat()
        # In maintenance (an operator's `maintenance start`, not ended yet): it stays out of service across
        # a restart -- the usual step of an upgrade -- so it registers as draining, as the leader left it.
        in_maintenance = await asyncio.to_thread(self._in_maintenance)
        if in_maintenance:
            self.drainer.draining = True
            self.metrics.draining.set(1)
            self._drain = {"by": "leader_operation", "owned_at_start": 0, "result": "in maintenance"}
            log.info("in_maintenance", action="registering as draining until the operator ends it")
        await asyncio.to_thread(
            self.registry.register, self.identity.info(draining=in_maintenance), self.register_wait_s
        )
        await self._set_barrier()
        # Registered again in a new session (the registry's worker): the barrier at once, on that thread,
        # so that only what entered the channel while this broker had no session counts as stale.
        self.registry.on_reregistered.append(self._set_barrier_blocking)
        self.reconciler.start()
        # Until shutdown cancels them, draining included: leases (the broker serves until its bundles
        # moved) and the tick (/healthz reads its age). Reports, splits and pre-warming stop when the
        # agent starts to leave.
        jobs = self.jobs
        jobs.add("leases", self.renewer.run_once, self.renewer.schedule())
        jobs.add("tick", self._tick_once, Schedule(self.tick_s))
        jobs.add("load_report", self.reporter.run_once, self.reporter.schedule(), gate=self._staying)
        jobs.add(
            "auto_split",
            self.splitter.split_cycle,
            self.splitter.schedule(),
            gate=lambda: self._staying() and self.splitter.active(),
        )
        if (merger := self.merger) is not None:
            jobs.add(
                "auto_merge",
                merger.merge_cycle,
                merger.schedule(),
                gate=lambda: self._staying() and merger.active(),
            )
        jobs.add("prewarm", self.prewarmer.sync_once, self.prewarmer.schedule(), gate=self._staying)
        jobs.start()
        self.ready = True
        self.metrics.ready.set(1)
        self.metrics.registered.set(1)
        log.info("agent_ready", broker=self.me, http=self.identity.http_url)
        # Everything allocated while starting lives as long as the process: keep it out of the cyclic
        # collector's way (resolved records are already untracked; this covers the rest of the heap).
        gc.freeze()

    async def _serve(self) -> None:
        await self.stop_event.wait()
        if self.ready:
            if self._drain_task is not None:
                # An operator's drain is under way: let it finish (a second signal ends it), then the
                # lifecycle's own drain finds what is left, if anything.
                await asyncio.wait({self._drain_task})
            self.exit_reason = await self.drainer.drain(self.force_exit)

    def _session_lost(self) -> None:
        """The ZooKeeper session expired (loop thread): the leader may already be giving our bundles to
        other brokers. Stop vouching for any lease, fence everything now, and treat every record naming us
        as stale; the registry re-registers on the next session."""
        self.leases.forget()
        self.reconciler.barrier.lost()
        stale = self.reconciler.mark_stale(self.channel.table)
        log.warning(
            "zk_session_lost", action="fencing everything", serving=len(self.reconciler.served), stale=stale
        )
        task = asyncio.create_task(
            self.reconciler.fence_all(set(self.reconciler.served), "session_lost"), name="fence-all"
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _tick_once(self) -> None:
        self.last_tick = self._monotonic()
        self.metrics.registered.set(1 if self.registry.registered else 0)
        session = self.registry.registered_session
        if (
            session is not None
            and session == self.zk.session_id
            and self.reconciler.barrier.session != session
        ):
            await self._set_barrier()  # registered again in a new session (the registry's worker did it)

    async def _set_barrier(self) -> None:
        await asyncio.to_thread(self._set_barrier_blocking, self.registry.registered_session)

    def _set_barrier_blocking(self, session: int | None) -> None:
        """The channel's end offsets, read after this broker registered in ``session``: records below them
        predate the registration and are settled through the channel first (agent/session_barrier.py).
        Not set when Kafka does not answer: every record stays stale, and the next tick tries again."""
        ch = self.channel
        try:
            parts = ch.table.partitions or ch.transport.partitions(ch.topic)
            ends = {p: ch.transport.watermarks(ch.topic, p)[1] for p in range(parts)}
        except Exception as e:
            log.warning("session_barrier_failed", error=str(e), action="records naming us stay stale")
            return
        self.reconciler.barrier.set(ends, session)
        log.info("session_barrier_set", session=session, records=sum(ends.values()))

    def _staying(self) -> bool:
        """Not leaving: no stop signal yet."""
        return not self.stop_event.is_set()

    async def _shutdown(self, http: HttpServer) -> None:
        self.ready = False
        self.metrics.ready.set(0)
        await self.jobs.stop()
        if self._drain_task is not None:
            self._drain_task.cancel()
        with contextlib.suppress(Exception):
            await self.reconciler.stop()
        await self._fence_before_leaving()
        if self.reporter.published is not None:
            await self.reporter.tombstone()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.registry.deregister)
        self.metrics.registered.set(0)
        await self.replica.stop_following()
        with contextlib.suppress(Exception):
            await self.adapter.aclose()
        await http.stop()
        await asyncio.to_thread(self.leases.stop_heartbeat)
        await self.replica.close()
        log.info("agent_stopped", reason=self.exit_reason or "clean")

    async def _fence_before_leaving(self) -> None:
        """Deregistering lets the leader reassign at once whatever is still ours (a drain that timed out, a
        second signal): fence it first, and if the broker cannot be reached, wait out the leases this agent
        granted -- bounded by one lease -- so no other broker serves a bundle ours still does."""
        left = set(self.reconciler.served)
        if not left:
            return
        try:
            async with asyncio.timeout(self.leases.margin_s):
                failed = await self.reconciler.fence_all(left, "shutdown")
        except TimeoutError:
            failed = sorted(left)
        if failed:
            wait = min(self.leases.lease_s, max(0.0, self.leases.bound())) + self.leases.margin_s / 2
            log.warning("waiting_for_leases", bundles=len(failed), seconds=round(wait, 2))
            await asyncio.sleep(wait)

    # ------------------------------------------------------------------ status
    def status(self) -> Mapping[str, Any]:
        return {
            "broker": self.me,
            "ready": self.ready,
            "draining": self.draining,
            "drain": self.drain_status(),
            "registered": self.registry.registered,
            "zookeeper": self.zk.state,
            "channel": self.channel.status(),
            "serving": len(self.reconciler.served),
            "leases": {
                "lease_s": self.leases.lease_s,
                "margin_s": self.leases.margin_s,
                "session_timeout_s": self.leases.session_timeout_s(),
                "grantable_s": round(max(0.0, min(self.leases.lease_s, self.leases.bound())), 3),
                "stale_records": len(self.reconciler.stale),
            },
            "merges": self.merger.status() if self.merger is not None else None,
            "pending_reactions": self.reconciler.pending(),
            "uptime_s": round(self._monotonic() - self.started, 1),
        }
