"""The controller process. Several run; one leads (DESIGN.md sections 2, 3.4, 5.2, 5.4).

Every controller stays warm: it replays the channel and follows the broker-load and top-bundles topics,
so a follower that wins an election decides from a current view at once. Only the leader decides:

* **snapshots** of the channel on an interval (consistent table + positions, crash-safe format);
* **healing**: failed-broker bookkeeping, then throttled forced reassignment in persisted chunks;
* **monitor**: stuck in-flight states forced onward, Free/Deleted entries tombstoned;
* **shedding**: TransferShedder or ThresholdShedder, with every cycle ending in a metric, a log line and
  an event (a decision or a skip reason).

Gates: a leader whose ZooKeeper session is suspended decides nothing; one that lost it is no longer
leader. Destructive work (healing, monitor overrides and tombstones, shedding) additionally waits for
``healing.safe_mode_settle_s`` after any reconnect ("safe mode"), because broker registrations are not
trustworthy while sessions re-establish. The term is bound to every log line and event.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import random
import signal
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec
import structlog
from prometheus_client import CollectorRegistry

from trimtab.balance.assign import DEFAULT_FILTERS, AssignContext, BrokerInfo, select_broker
from trimtab.balance.heal import HealConfig, Override, monitor
from trimtab.balance.load import BrokerLoadData, TopBundles
from trimtab.balance.shed import ShedConfig, ShedResult, ShedState, threshold_shedder, transfer_shedder
from trimtab.channel.client import ChannelClient
from trimtab.channel.records import Record, State, make
from trimtab.channel.snapshot import SnapshotWriter, read_snapshot_topic
from trimtab.channel.transport import Transport
from trimtab.cluster.bridge import LoopBridge
from trimtab.cluster.events import EventPublisher
from trimtab.cluster.http import HttpServer, bind
from trimtab.cluster.kvview import KeyValueView
from trimtab.cluster.logs import SkipLog
from trimtab.cluster.logs import bind as bind_log
from trimtab.cluster.metrics import ChannelCollector, KeyValueCollector, new_registry
from trimtab.cluster.wiring import kafka_transport, zk_session
from trimtab.cluster.zk import BrokerRegistry, ZkPaths
from trimtab.config.settings import Settings
from trimtab.controller.election import LeaderElection
from trimtab.controller.healing import Healer
from trimtab.controller.metrics import ControllerMetrics
from trimtab.controller.stores import ControllerSwitches, FailedBrokers, Reassignments, Switches
from trimtab.errors import NotLeader, RequestError

log = structlog.get_logger("trimtab.controller")


def observe_shed_cycle(metrics: ControllerMetrics, res: ShedResult, seconds: float) -> None:
    """Metrics for one shedding cycle, whatever its outcome."""
    metrics.shed_seconds.observe(seconds)
    metrics.shed_cycles.labels(res.result, res.reason).inc()
    if res.loads:
        metrics.load_avg.set(res.avg)
        metrics.load_std.set(res.std)
        for b, v in res.loads.items():
            metrics.broker_load.labels(b).set(v)


def shed_event(res: ShedResult) -> dict[str, Any]:
    """The events-topic record of one shedding cycle: the decision or skip and the load behind it."""
    return {
        "key": "shed",
        "result": res.result,
        "reason": res.reason,
        "avg": round(res.avg, 4),
        "std": round(res.std, 4),
        "loads": {b: round(v, 4) for b, v in res.loads.items()},
        "moves": [
            {
                "bundle": u.bundle,
                "src": u.src,
                "dst": u.dst,
                "throughput": round(u.throughput),
                "reason": u.reason,
            }
            for u in res.decisions
        ],
        "skipped": res.skipped_bundles[:20],
    }


class Controller:
    def __init__(
        self,
        settings: Settings,
        *,
        transport: Transport | None = None,
        registry: CollectorRegistry | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.s = settings
        self._transport = transport
        self.prom = registry or new_registry()
        self.metrics = ControllerMetrics.create(self.prom)
        self.rng = rng or random.Random()
        self.clock = clock
        self.me = settings.controller_id()
        self.stop_event = asyncio.Event()
        self.ready = False
        self.last_tick = time.monotonic()
        self.shed_state = ShedState()
        self.switches = ControllerSwitches()
        self.recent: deque[dict[str, Any]] = deque(maxlen=50)
        self.last_shed: ShedResult | None = None
        self.leader_since = 0.0
        self.channel: ChannelClient | None = None
        self._next: dict[str, float] = {}

    # ------------------------------------------------------------------ wiring
    def _build(self, loop: asyncio.AbstractEventLoop) -> None:
        s = self.s
        self.sock = bind(s.http.host, s.http.port)
        port = int(self.sock.getsockname()[1])
        self.http_url = f"http://{s.advertised_host()}:{port}"
        if s.controller.id is None:
            self.me = f"{s.advertised_host()}:{port}"
        bind_log(controller=self.me, role="controller")
        self.paths = ZkPaths(s.zk_path)
        self.zk = zk_session(s)
        self.registry = BrokerRegistry(self.zk, self.paths)
        self.election = LeaderElection(
            self.zk,
            self.paths,
            self.me,
            self.http_url,
            on_change=lambda leading, term: loop.call_soon_threadsafe(
                self._leadership_changed, leading, term
            ),
        )
        self.failed_store = FailedBrokers(self.zk.client, self.paths)
        self.plans = Reassignments(self.zk.client, self.paths)
        self.switch_store = Switches(self.zk.client, self.paths)
        h = s.healing
        self.heal_cfg = HealConfig.from_settings(s)
        self.healer = Healer(
            self.failed_store,
            self.plans,
            self.heal_cfg,
            chunk_size=h.chunk_size,
            writer=self.writer,
            term=self.term,
        )
        self.transport: Transport = self._transport or kafka_transport(s, f"trimtab-controller-{self.me}")
        self.channel = ChannelClient(
            self.transport,
            s.kafka.channel_topic,
            s.kafka.snapshot_topic,
            on_skip=SkipLog(),
            allow_multi_partition_snapshot_topic=s.kafka.allow_multi_partition_snapshot_topic,
        )
        heal_wakeups: LoopBridge[None] = LoopBridge(loop, lambda _: self._wake_healing())
        self.channel.table.add_listener(lambda key, old, new: heal_wakeups.push(None))
        self.loads: KeyValueView[BrokerLoadData] = KeyValueView(
            self.transport, s.kafka.broker_load_topic, BrokerLoadData
        )
        self.top: KeyValueView[TopBundles] = KeyValueView(
            self.transport, s.kafka.top_bundles_topic, TopBundles
        )
        self.events = EventPublisher(self.transport, s.kafka.events_topic, source=self.me, role="controller")
        self.snapshots = SnapshotWriter(
            self.transport,
            s.kafka.snapshot_topic,
            s.kafka.channel_topic,
            writer=self.me,
            chunk_bundles=s.channel.snapshot_chunk_bundles,
        )
        self.registry.add_listener(lambda brokers: loop.call_soon_threadsafe(self._membership_change))
        self.zk.add_listener(lambda st: loop.call_soon_threadsafe(self._session_changed, st))
        self.prom.register(ChannelCollector(lambda: self.channel))
        self.prom.register(KeyValueCollector(lambda: [self.loads, self.top]))
        self._heal_wake = asyncio.Event()
        self._membership_changed = True
        self._last_bookkeeping = 0.0

    # ------------------------------------------------------------------ identity & gates
    def term(self) -> int:
        return self.election.term or 0

    def writer(self) -> str:
        return f"controller:{self.me}:t{self.term()}"

    @property
    def is_leader(self) -> bool:
        return self.election.is_leader

    def safe_mode(self) -> str | None:
        """Why destructive work must wait right now, or None."""
        # A leader whose session is suspended still holds the leadership (it resumes if the session
        # survives): say that it is paused by ZooKeeper, not that it is a follower.
        if self.election.term is None:
            return "not_leader"
        if not self.zk.connected:
            return "zookeeper_" + self.zk.state
        settle = self.s.healing.safe_mode_settle_s
        stable = self.zk.stable_for()
        if stable < settle:
            return f"settling ({stable:.0f}s of {settle:.0f}s since ZooKeeper reconnected)"
        if not self.registry.synced.is_set() or not (self.channel and self.channel.ready):
            return "warming_up"
        return None

    def channel_health(self) -> tuple[bool, str]:
        return (False, "not started") if self.channel is None else self.channel.health()

    def _session_changed(self, state: str) -> None:
        self.metrics.safe_mode.set(0 if self.safe_mode() is None else 1)
        if state == "suspended" and self.election.term is not None:
            log.warning("leader_paused", reason="ZooKeeper session suspended: no decisions until it is back")

    def _leadership_changed(self, leading: bool, term: int | None) -> None:
        self.metrics.leader.set(1 if leading else 0)
        self.metrics.term.set(term or 0)
        bind_log(term=term)
        self.events.context = {"term": term} if term else {}
        if leading:
            self.metrics.elections.inc()
            self.leader_since = time.monotonic()
            self.shed_state = ShedState()
            self._next.clear()
            self._membership_changed = True  # look for failed brokers straight away
            log.info("leadership_acquired", term=term)
            self.events.publish("leader_elected", key="leader", leader=self.me, term=term)
            asyncio.get_running_loop().create_task(self._on_lead())
        else:
            log.info("leadership_released")

    async def _on_lead(self) -> None:
        try:
            await asyncio.to_thread(self.healer.load)
            self.switches = await asyncio.to_thread(self.switch_store.read)
            msgs = await asyncio.to_thread(read_snapshot_topic, self.transport, self.s.kafka.snapshot_topic)
            self.snapshots.observe(msgs)
        except Exception:
            log.exception("leader_init_failed")
        self._wake_healing()

    def _wake_healing(self) -> None:
        self._heal_wake.set()

    def _membership_change(self) -> None:
        self._membership_changed = True
        self._heal_wake.set()

    def _record(self, kind: str, **fields: Any) -> None:
        entry = {"ts": int(self.clock() * 1000), "kind": kind, **fields}
        self.recent.appendleft(entry)
        self.events.publish(kind, **fields)

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self._build(loop)
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stop_event.set)
        from trimtab.controller.api import create_app

        self.http = HttpServer(create_app(self), self.sock)
        self.http.start()
        log.info("controller_starting", http=self.http_url)
        try:
            await asyncio.to_thread(self.zk.start)
            await asyncio.to_thread(self.registry.start)
            assert self.channel is not None
            await asyncio.to_thread(self.channel.start)
            self.loads.start()
            self.top.start()
            while not (self.channel.ready and self.loads.ready and self.top.ready):
                if self.stop_event.is_set():
                    return 0
                await asyncio.sleep(0.02)
            self.ready = True
            log.info("controller_warm", bundles=len(self.channel.table))
            # Everything allocated while starting lives as long as the process: keep it out of the cyclic
            # collector's way (resolved records are already untracked; this covers the rest of the heap).
            gc.freeze()
            await asyncio.to_thread(self.election.start)
            tasks = [
                asyncio.create_task(
                    self._loop("snapshot", self.s.channel.snapshot_interval_s, self.snapshot_once)
                ),
                asyncio.create_task(
                    self._loop("monitor", self.s.channel.monitor_interval_s, self.monitor_once)
                ),
                asyncio.create_task(self._loop("shedding", self.s.shedding.interval_s, self.shed_once)),
                asyncio.create_task(self._heal_loop()),
                asyncio.create_task(self._tick()),
            ]
            await self.stop_event.wait()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await self._shutdown()
        return 0

    async def _shutdown(self) -> None:
        self.ready = False
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.election.stop)
        with contextlib.suppress(Exception):
            self.registry.stop()
        if self.channel is not None:
            self.channel.stop()
        for v in (getattr(self, "loads", None), getattr(self, "top", None)):
            if v is not None:
                v.stop()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.transport.flush, 5.0)
        with contextlib.suppress(Exception):
            await self.http.stop()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.zk.stop)
        with contextlib.suppress(Exception):
            self.transport.close()
        log.info("controller_stopped")

    async def _tick(self) -> None:
        while True:
            self.last_tick = time.monotonic()
            self.metrics.safe_mode.set(0 if self.safe_mode() is None else 1)
            await asyncio.sleep(0.5)

    async def _loop(self, name: str, interval: float, job: Callable[[], Any]) -> None:
        """Run ``job`` every ``interval`` while leading; the first run one interval after taking over."""
        while True:
            await asyncio.sleep(min(0.25, interval))
            if not self.is_leader:
                self._next.pop(name, None)
                continue
            now = time.monotonic()
            due = self._next.setdefault(name, now + interval)
            if now < due:
                continue
            self._next[name] = now + interval
            try:
                await job()
            except Exception:
                log.exception("leader_job_failed", job=name)

    # ------------------------------------------------------------------ shared helpers
    def live_brokers(self) -> dict[str, BrokerInfo]:
        return dict(self.registry.brokers)

    def assign_context(self, exclude: frozenset[str] = frozenset()) -> AssignContext:
        return AssignContext.from_settings(self.s, self.loads.snapshot(), int(self.clock() * 1000), exclude)

    def choose(self, bundle: str, exclude: frozenset[str]) -> str | None:
        sel = select_broker(
            bundle,
            self.live_brokers(),
            self.assign_context(exclude),
            self.rng,
            filters=DEFAULT_FILTERS,
            diff=self.s.assignment.average_usage_diff_threshold_pct / 100,
        )
        return sel.broker

    async def publish(self, bundle: str, record: Record | None) -> None:
        assert self.channel is not None
        await asyncio.wait_for(asyncio.wrap_future(self.channel.publish(bundle, record)), 30)

    async def still_leader(self) -> bool:
        """Confirm leadership with ZooKeeper before destructive writes (see LeaderElection.confirm)."""
        if await asyncio.to_thread(self.election.confirm):
            return True
        log.warning("leadership_not_confirmed", action="skipping this round of writes")
        return False

    async def _publish_overrides(self, overrides: list[Override]) -> int:
        """Publish a round of forced records and wait for their acknowledgements in one worker thread:
        wrapping each producer future for the event loop would cost a loop wakeup per record, and a
        failover round holds thousands."""
        assert self.channel is not None
        if not await self.still_leader():
            return 0
        futs = [self.channel.publish(o.bundle, o.record) for o in overrides]
        if futs:
            await asyncio.to_thread(concurrent.futures.wait, futs, 30)
        ok = 0
        for o, f in zip(overrides, futs, strict=True):
            if f.done() and f.exception() is None:
                ok += 1
                self.metrics.overrides.labels(o.reason, "published").inc()
            else:
                err = str(f.exception()) if f.done() else "no acknowledgement within 30s"
                self.metrics.overrides.labels(o.reason, "failed").inc()
                log.warning("override_failed", bundle=o.bundle, reason=o.reason, error=err)
        return ok

    # ------------------------------------------------------------------ snapshots
    async def snapshot_once(self) -> None:
        assert self.channel is not None
        if not self.is_leader or not self.channel.ready:
            return
        t0 = time.perf_counter()
        states, positions = self.channel.table.snapshot()
        partitions = self.channel.table.partitions or len(positions)
        try:
            manifest = await asyncio.to_thread(
                self.snapshots.write, states, positions, partitions, self.term()
            )
        except Exception as e:
            self.metrics.snapshots.labels("failed").inc()
            log.warning("snapshot_failed", error=str(e))
            return
        self.metrics.snapshots.labels("written").inc()
        self.metrics.snapshot_bundles.set(manifest.bundles)
        self.metrics.snapshot_seconds.observe(time.perf_counter() - t0)

    # ------------------------------------------------------------------ healing
    async def _heal_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._heal_wake.wait(), 1.0)
            self._heal_wake.clear()
            if not self.is_leader or not self.healer.loaded:
                continue
            try:
                await self.heal_once()
            except Exception:
                log.exception("healing_round_failed")
            await asyncio.sleep(0.1)  # coalesce bursts of channel events into one round

    async def heal_once(self) -> None:
        assert self.channel is not None
        why = self.safe_mode()
        if why is not None:
            return
        now = int(self.clock() * 1000)
        live = self.live_brokers()
        items = self.channel.table.items()
        # Failures are found when membership changes (the registry wakes us), re-checked every few seconds
        # as a safety net; not on every channel change, which in a failover arrives thousands at a time.
        if self._membership_changed or time.monotonic() - self._last_bookkeeping > 5.0:
            self._membership_changed = False
            self._last_bookkeeping = time.monotonic()
            events = await asyncio.to_thread(self.healer.bookkeeping, set(live), items, now)
        else:
            events = []
        for event, broker in events:
            self.metrics.broker_failures.labels(event).inc()
            level = log.warning if event == "recorded" else log.info
            level("broker_failure", change=event, broker=broker)
            self._record(f"broker_{event}", key=broker, broker=broker)
        if not self.healer.failed:
            self.metrics.failed_brokers.set(0)
            self.metrics.healing_pending.set(0)
            return
        loads = self.loads.snapshot()
        candidates = {
            b: (loads[b].weighted_max_ema if b in loads else 0.5) for b, i in live.items() if not i.draining
        }
        overrides, info = await asyncio.to_thread(
            self.healer.round, candidates, self.channel.table.get, items, self.choose, now
        )
        self.metrics.failed_brokers.set(len(self.healer.failed))
        self.metrics.healing_pending.set(self.healer.pending)
        for reason in ("mass_failure", "disabled"):
            self.metrics.healing_paused.labels(reason).set(1 if self.healer.paused_reason == reason else 0)
        if self.healer.paused_reason == "mass_failure" and self.healer.failed:
            log.error(
                "healing_paused",
                reason="mass_failure",
                detail=info.get("guard"),
                failed=sorted(self.healer.failed),
            )
        if overrides:
            n = await self._publish_overrides(overrides)
            by_broker: dict[str, int] = {}
            for o in overrides:
                by_broker[o.broker or "?"] = by_broker.get(o.broker or "?", 0) + 1
            log.info(
                "healing_overrides", published=n, by_failed_broker=by_broker, deferred=info.get("deferred", 0)
            )
            self._record(
                "heal", key="heal", moved=n, by_failed_broker=by_broker, deferred=info.get("deferred", 0)
            )

    # ------------------------------------------------------------------ monitor
    async def monitor_once(self) -> None:
        assert self.channel is not None
        why = self.safe_mode()
        if why is not None:
            self.metrics.monitor_runs.labels("safe_mode").inc()
            return
        live = frozenset(self.live_brokers())
        decisions = monitor(
            self.channel.table.items(),
            live,
            self.choose,
            self.heal_cfg,
            int(self.clock() * 1000),
            self.writer(),
        )
        # Bundles of failed brokers are healing's, with its grace; the monitor handles live brokers only.
        if decisions:
            await self._publish_overrides(decisions)
            for o in decisions:
                log.info("monitor_override", bundle=o.bundle, reason=o.reason, broker=o.broker, dst=o.dst)
            self._record(
                "monitor",
                key="monitor",
                stuck=sum(1 for o in decisions if o.reason == "stuck"),
                tombstones=sum(1 for o in decisions if o.reason == "tombstone"),
            )
        self.metrics.monitor_runs.labels("ok").inc()

    # ------------------------------------------------------------------ shedding
    def shed_config(self) -> ShedConfig:
        return ShedConfig.from_settings(self.s)

    async def shed_once(self) -> ShedResult | None:
        assert self.channel is not None
        sh = self.s.shedding
        if not sh.enabled or self.switches.shedding_paused:
            self.metrics.shed_cycles.labels("skip", "paused").inc()
            return None
        if self.safe_mode() is not None:
            self.metrics.shed_cycles.labels("skip", "safe_mode").inc()
            return None
        live = self.live_brokers()
        if len(live) < 2:
            self.metrics.shed_cycles.labels("skip", "no_brokers").inc()
            return None
        brokers = {b: not i.draining for b, i in live.items()}
        table = self.channel.table
        now = int(self.clock() * 1000)

        def owner(bundle: str) -> str | None:
            r = table.get(bundle)
            return r.dst if r is not None and r.state is State.OWNED else None

        t0 = time.perf_counter()
        fn = transfer_shedder if sh.strategy == "transfer" else threshold_shedder
        res = fn(
            brokers,
            self.loads.snapshot(),
            self.top.snapshot(),
            owner,
            self.shed_state,
            self.shed_config(),
            now,
        )
        self.last_shed = res
        observe_shed_cycle(self.metrics, res, time.perf_counter() - t0)
        published = 0
        if res.decisions and not await self.still_leader():
            res.decisions = []
        for u in res.decisions:
            cur = table.get(u.bundle)
            if cur is None or cur.state is not State.OWNED or cur.dst != u.src:
                continue
            rec = make(
                State.RELEASING, src=u.src, dst=u.dst, version=cur.version + 1, ts=now, writer=self.writer()
            )
            try:
                await self.publish(u.bundle, rec)
                published += 1
                self.metrics.unloads.labels("transfer" if u.dst else "unload", u.reason).inc()
            except Exception as e:
                log.warning("unload_publish_failed", bundle=u.bundle, error=str(e))
        log.info(
            "shedding_cycle",
            result=res.result,
            reason=res.reason,
            avg=round(res.avg, 4),
            std=round(res.std, 4),
            hit_count=res.hit_count,
            decisions=len(res.decisions),
            published=published,
        )
        self._record("shed", **shed_event(res))
        return res

    # ------------------------------------------------------------------ admin
    def require_leader(self) -> None:
        if not self.is_leader:
            cur = self.election.leader()
            # A leader paused by a suspended session still names itself as leader: redirecting to that
            # would loop. Nobody can lead right now: a retryable 503.
            raise NotLeader(cur.http_url if cur is not None and cur.id != self.me else None)

    async def admin_move(self, bundle: str, dst: str | None) -> Record:
        """Transfer (dst set) or unload (dst None) a bundle, as an operator asked."""
        self.require_leader()
        assert self.channel is not None
        cur = self.channel.table.get(bundle)
        if cur is None or cur.state is not State.OWNED or cur.dst is None:
            state = cur.state.value if cur else "init"
            raise RequestError(
                409 if cur is not None else 404, f"{bundle} is not owned (state {state}); nothing to move"
            )
        if dst is not None:
            if dst == cur.dst:
                raise RequestError(400, f"{bundle} is already owned by {dst}")
            if dst not in self.registry.brokers:
                raise RequestError(400, f"{dst} is not a live broker")
        rec = make(
            State.RELEASING,
            src=cur.dst,
            dst=dst,
            version=cur.version + 1,
            ts=int(self.clock() * 1000),
            writer=self.writer(),
        )
        await self.publish(bundle, rec)
        self.metrics.unloads.labels("transfer" if dst else "unload", "admin").inc()
        self._record("transfer" if dst else "unload", bundle=bundle, src=cur.dst, dst=dst, reason="admin")
        return rec

    async def set_shedding_paused(self, paused: bool, by: str) -> ControllerSwitches:
        self.require_leader()
        sw = ControllerSwitches(
            shedding_paused=paused,
            paused_by=by if paused else None,
            paused_at=int(self.clock() * 1000) if paused else None,
        )
        await asyncio.to_thread(self.switch_store.write, sw)
        self.switches = sw
        self._record("shedding_paused" if paused else "shedding_resumed", key="shedding", by=by)
        return sw

    def status(self) -> dict[str, Any]:
        assert self.channel is not None
        leader = self.election.leader()
        loads = self.loads.snapshot()
        brokers = {}
        counts: dict[str, int] = {}
        for _, r in self.channel.table.items():
            o = r.owner()
            if o is not None:
                counts[o] = counts.get(o, 0) + 1
        for b, info in sorted(self.registry.brokers.items()):
            ld = loads.get(b)
            brokers[b] = {
                "bundles": counts.get(b, 0),
                "load": round(ld.weighted_max_ema, 4) if ld else None,
                "msg_rate": round(ld.msg_rate, 1) if ld else None,
                "draining": info.draining,
            }
        values = [v["load"] for v in brokers.values() if v["load"] is not None]
        avg = sum(values) / len(values) if values else 0.0
        std = (sum((v - avg) ** 2 for v in values) / len(values)) ** 0.5 if values else 0.0
        return {
            "controller": self.me,
            "leader": msgspec.to_builtins(leader) if leader else None,
            "is_leader": self.is_leader,
            "term": self.election.term,
            "safe_mode": self.safe_mode(),
            "zookeeper": self.zk.state,
            "channel": {
                "ready": self.channel.ready,
                "lag": self.channel.lag(),
                "bundles": len(self.channel.table),
            },
            "brokers": brokers,
            "load": {"avg": round(avg, 4), "std": round(std, 4), "target_std": self.s.shedding.target_std},
            "shedding": {
                "enabled": self.s.shedding.enabled,
                "paused": self.switches.shedding_paused,
                "strategy": self.s.shedding.strategy,
                "hit_count": self.shed_state.hit_count,
                "last": {"result": self.last_shed.result, "reason": self.last_shed.reason}
                if self.last_shed
                else None,
            },
            "healing": self.healer.status(),
            "recent": list(self.recent)[:20],
        }
