"""The agent process: one per broker (DESIGN.md section 7).

Start-up order matters for correctness:

1. bind HTTP (so a port of 0 becomes real: the broker id defaults to host:port);
2. connect ZooKeeper, start the broker registry cache (not yet registered);
3. bootstrap the channel (snapshot + tail) and the broker-load view; only when both caught up
4. register the broker (before that, nobody should assign to us) and scan the table for work naming us;
5. start the reconciler, the load reporter and the split scheduler; report ready.

Shutdown (first SIGTERM/SIGINT): drain -- transfer every owned bundle to other brokers and wait (bounded)
until they are owned elsewhere -- then tombstone the load report, deregister and exit. A second signal,
or the drain deadline, exits at once and says how many bundles were left.

Threads: kazoo and librdkafka have their own; the channel follower applies records on its thread and
hands events to the asyncio loop through a :class:`cluster.bridge.LoopBridge` (one wakeup per burst, in
order). All decisions run on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import signal
import time
from collections.abc import Mapping
from typing import Any

import structlog
from prometheus_client import CollectorRegistry

from trimtab.agent.adapters import build_adapter
from trimtab.agent.adapters.base import BrokerAdapter, RetryingAdapter
from trimtab.agent.adapters.simulated import SimulatedBroker
from trimtab.agent.lookup import LayoutCache, LookupService
from trimtab.agent.metrics import AgentMetrics
from trimtab.agent.reconciler import Reconciler
from trimtab.agent.reporter import LoadReporter
from trimtab.agent.roles import needs_attention
from trimtab.balance.assign import DEFAULT_FILTERS, AssignContext, BrokerInfo, select_broker
from trimtab.balance.load import BrokerLoadData
from trimtab.balance.split import SplitDecision, SplitLimits, children_for, decide_splits
from trimtab.channel.bundles import parse_bundle
from trimtab.channel.client import ChannelClient
from trimtab.channel.records import Record, State, make
from trimtab.channel.table import TableView
from trimtab.channel.transport import Transport
from trimtab.cluster.bridge import LoopBridge
from trimtab.cluster.events import EventPublisher
from trimtab.cluster.http import HttpServer, bind
from trimtab.cluster.kvview import KeyValueView
from trimtab.cluster.logs import SkipLog
from trimtab.cluster.logs import bind as bind_log
from trimtab.cluster.metrics import ChannelCollector, KeyValueCollector, new_registry
from trimtab.cluster.wiring import kafka_transport, zk_session
from trimtab.cluster.zk import BrokerRegistry, NamespaceStore, ZkPaths
from trimtab.config.settings import Settings
from trimtab.errors import BundleError, RequestError, StartupError

log = structlog.get_logger("trimtab.agent")


class SplitRefused(RequestError):
    """A split this agent will not start (not the owner, bad input, in flight)."""


class Agent:
    def __init__(
        self,
        settings: Settings,
        *,
        transport: Transport | None = None,
        adapter: BrokerAdapter | None = None,
        registry: CollectorRegistry | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.s = settings
        self._transport = transport
        self._adapter_override = adapter
        self.prom = registry or new_registry()
        self.metrics = AgentMetrics.create(self.prom)
        self.rng = rng or random.Random()
        self.sim: SimulatedBroker | None = None
        self.me = ""
        self.started = time.monotonic()
        self.last_tick = time.monotonic()
        self.ready = False
        self.draining = False
        self.stop_event = asyncio.Event()
        self.force_exit = asyncio.Event()
        self.split_hits: dict[str, int] = {}
        self.exit_reason = ""
        self.http: HttpServer | None = None
        self.channel: ChannelClient | None = None

    # ------------------------------------------------------------------ wiring
    def _build(self, loop: asyncio.AbstractEventLoop) -> None:
        s = self.s
        self.sock = bind(s.http.host, s.http.port)
        port = int(self.sock.getsockname()[1])
        self.me = s.broker_id(port)
        self.http_url = f"http://{s.advertised_host()}:{port}"
        self.service_url = s.broker.service_url or self.http_url
        bind_log(broker=self.me, role="agent")

        inner = self._adapter_override
        if inner is None:
            inner, self.sim = build_adapter(s, self.me)
        self.adapter = RetryingAdapter(
            inner,
            timeout_s=s.broker.adapter.timeout_s,
            retries=s.broker.adapter.retries,
            backoff_s=s.broker.adapter.backoff_s,
            observe=self._observe_adapter,
        )

        self.paths = ZkPaths(s.zk_path)
        self.zk = zk_session(s)
        self.registry = BrokerRegistry(self.zk, self.paths)
        self.namespaces = NamespaceStore(self.zk.client, self.paths, s.namespace.default_bundles)

        self.transport: Transport = self._transport or kafka_transport(s, f"trimtab-agent-{self.me}")
        self.channel = ChannelClient(
            self.transport,
            s.kafka.channel_topic,
            s.kafka.snapshot_topic,
            on_skip=SkipLog(),
            on_ready=lambda table: loop.call_soon_threadsafe(self._channel_ready, table),
            allow_multi_partition_snapshot_topic=s.kafka.allow_multi_partition_snapshot_topic,
        )
        changes: LoopBridge[tuple[str, Record | None, Record | None]] = LoopBridge(
            loop, lambda c: self._on_change(*c)
        )
        self.channel.table.add_listener(lambda key, old, new: changes.push((key, old, new)))
        # On the follower thread, before anyone can see the split parent tombstoned: cached layouts of the
        # namespace are stale from here on (the owner updated ZooKeeper before publishing Deleted).
        self.channel.table.add_listener(self._invalidate_split_layout)
        self.loads: KeyValueView[BrokerLoadData] = KeyValueView(
            self.transport, s.kafka.broker_load_topic, BrokerLoadData
        )
        self.events = EventPublisher(self.transport, s.kafka.events_topic, source=self.me, role="agent")
        self.prom.register(ChannelCollector(lambda: self.channel))
        self.prom.register(KeyValueCollector(lambda: [self.loads]))

        self.reconciler = Reconciler(
            self.me,
            self.channel,
            self.adapter,
            url_of=self.url_of,
            apply_split=self.namespaces.apply_split,
            metrics=self.metrics,
        )
        self.reconciler.on_served_change = self._served_changed
        self.layouts = LayoutCache(self.namespaces.ensure, s.agent.lookup_cache_s)
        self.lookups = LookupService(
            self.me,
            self.channel,
            self.layouts,
            brokers=lambda: self.registry.brokers,
            brokers_trusted=lambda: self.zk.connected and self.registry.synced.is_set(),
            loads=self.loads.snapshot,
            filters=DEFAULT_FILTERS,
            timeout_s=s.channel.in_flight_timeout_s,
            assign_ctx=self.assign_context,
            diff=s.assignment.average_usage_diff_threshold_pct / 100,
            rng=self.rng,
            on_assign=self._on_assign,
        )
        self.reporter = LoadReporter(self.me, self.adapter, self.transport, s, self.metrics)
        self.registry.add_listener(lambda brokers: loop.call_soon_threadsafe(self.lookups.wake_all))
        self.zk.add_listener(lambda st: self.metrics.zk_connected.set(1 if st == "connected" else 0))

    def _invalidate_split_layout(self, key: str, old: Record | None, new: Record | None) -> None:
        if (new is not None and new.state is State.DELETED) or (
            new is None and old is not None and old.state is State.DELETED
        ):
            self.layouts.invalidate(key.rsplit("/", 1)[0])

    def _observe_adapter(self, op: str, result: str, secs: float) -> None:
        self.metrics.adapter_call(op, result).inc()
        self.metrics.adapter_time(op).observe(secs)

    def url_of(self, broker: str) -> str | None:
        info = self.registry.brokers.get(broker)
        return info.service_url if info else None

    def assign_context(self, exclude: frozenset[str] = frozenset()) -> AssignContext:
        return AssignContext.from_settings(self.s, self.loads.snapshot(), int(time.time() * 1000), exclude)

    def broker_info(self) -> BrokerInfo:
        b = self.s.broker
        return BrokerInfo(
            id=self.me,
            service_url=self.service_url,
            http_url=self.http_url,
            tags=dict(b.tags),
            failure_domain=b.failure_domain,
            version=b.version,
            start_time=int(self.started_wall * 1000),
            draining=self.draining,
        )

    # ------------------------------------------------------------------ channel events (loop thread)
    def _on_change(self, key: str, old: Record | None, new: Record | None) -> None:
        self.lookups.on_change(key)
        if needs_attention(self.me, new) or needs_attention(self.me, old) or key in self.reconciler.served:
            self.reconciler.mark(key)

    def channel_health(self) -> tuple[bool, str]:
        return (False, "not started") if self.channel is None else self.channel.health()

    def _channel_ready(self, table: TableView) -> None:
        """The table caught up: at start, or again after a re-bootstrap (history gap, follower restart),
        when it may differ from what listeners last heard -- so what the broker serves is checked too."""
        n = 0
        for key, rec in table.items():
            if needs_attention(self.me, rec):
                self.reconciler.mark(key)
                n += 1
        for key in list(self.reconciler.served):
            self.reconciler.mark(key)
        self.lookups.wake_all()  # waiters re-read the table they may have missed changes of
        log.info("channel_scan", bundles=len(table), naming_me=n, serving=len(self.reconciler.served))

    def _served_changed(self, bundle: str, serving: bool) -> None:
        self.reporter.load_moved()

    def _on_assign(self, bundle: str, dst: str, candidates: int) -> None:
        self.metrics.assignments.labels("published").inc()
        load = self.loads.values.get(dst)
        self.events.publish(
            "assign",
            bundle=bundle,
            dst=dst,
            candidates=candidates,
            dst_load=round(load.weighted_max_ema, 4) if load else None,
        )

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self.started_wall = time.time()
        self._build(loop)
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._signal)
        from trimtab.agent.api import create_app

        self.http = HttpServer(create_app(self), self.sock)
        self.http.start()
        log.info("agent_starting", http=self.http_url, adapter=self.adapter.kind)
        try:
            await self._start()
            await self._serve()
        finally:
            await self._shutdown()
        return 0

    def _signal(self) -> None:
        if not self.stop_event.is_set():
            log.info("signal_received", action="draining; send again to exit at once")
            self.stop_event.set()
        else:
            log.warning("signal_received", action="exiting without finishing the drain")
            self.force_exit.set()

    async def _start(self) -> None:
        s = self.s
        await asyncio.to_thread(self.zk.start)
        self.metrics.zk_connected.set(1)
        await asyncio.to_thread(self.registry.start)
        assert self.channel is not None
        await asyncio.to_thread(self.channel.start)
        self.loads.start()
        deadline = time.monotonic() + 300
        while not (self.channel.ready and self.loads.ready):
            if self.stop_event.is_set():
                return
            if time.monotonic() > deadline:
                raise StartupError(
                    f"channel or load view did not catch up within 300s (channel: {self.channel.health()[1]})"
                )
            await asyncio.sleep(0.02)
        log.info(
            "channel_caught_up",
            bundles=len(self.channel.table),
            seconds=round(self.channel.ready_at - self.channel.started_at, 3),
            snapshot=self.channel.snapshot.manifest.id if self.channel.snapshot else None,
        )
        # What is the broker already serving (an agent restarted beside a running broker)? Bundles it
        # serves but does not own get closed by the reconciler; owned ones are simply kept.
        try:
            sample = await self.adapter.sample()
            for b in sample.bundles:
                self.reconciler.served.add(b.bundle)
                self.reconciler.mark(b.bundle)
        except Exception as e:
            log.warning("initial_sample_failed", error=str(e))
        await asyncio.to_thread(
            self.registry.register, self.broker_info(), s.zookeeper.session_timeout_s * 2 + 5
        )
        self.reconciler.start()
        self._tasks = [
            asyncio.create_task(self.reporter.run(self.stop_event), name="reporter"),
            asyncio.create_task(self._split_loop(), name="splitter"),
            asyncio.create_task(self._tick_loop(), name="tick"),
        ]
        self.ready = True
        self.metrics.ready.set(1)
        self.metrics.registered.set(1)
        log.info("agent_ready", broker=self.me, http=self.http_url)
        # Everything allocated while starting lives as long as the process: keep it out of the cyclic
        # collector's way (resolved records are already untracked; this covers the rest of the heap).
        gc.freeze()

    async def _serve(self) -> None:
        await self.stop_event.wait()
        if self.ready:
            await self.drain()

    async def _tick_loop(self) -> None:
        while not self.stop_event.is_set():
            self.last_tick = time.monotonic()
            self.metrics.registered.set(1 if self.registry.registered else 0)
            await asyncio.sleep(1.0)

    # ------------------------------------------------------------------ splits
    def split_limits(self) -> SplitLimits:
        return SplitLimits.from_settings(self.s)

    def owned(self) -> set[str]:
        assert self.channel is not None
        return {k for k, r in self.channel.table.items() if r.state is State.OWNED and r.dst == self.me}

    async def _split_loop(self) -> None:
        while not self.stop_event.is_set():
            try:
                await asyncio.wait_for(self.stop_event.wait(), self.s.split.interval_s)
                return
            except TimeoutError:
                pass
            if not self.s.split.enabled or self.draining:
                continue
            try:
                await self.split_cycle()
            except Exception:
                log.exception("split_cycle_failed")

    async def split_cycle(self) -> list[SplitDecision]:
        stats = self.reporter.last_bundles or (await self.adapter.sample()).bundles
        counts: dict[str, int] = {}
        for ns, layout in self.layouts.cached().items():
            counts[ns] = len(layout)
        cycle = decide_splits(
            stats, self.split_hits, self.split_limits(), namespace_bundles=counts, owned=self.owned()
        )
        self.split_hits = cycle.hits
        for _bundle, reason in cycle.skipped:
            self.metrics.splits.labels("auto", reason).inc()
        for d in cycle.decisions:
            try:
                await self.publish_split(d)
                self.metrics.splits.labels(d.reason, "published").inc()
            except SplitRefused as e:
                self.metrics.splits.labels(d.reason, "refused").inc()
                log.info("split_refused", bundle=d.bundle, reason=str(e))
        return cycle.decisions

    async def publish_split(self, d: SplitDecision) -> Record:
        assert self.channel is not None
        cur = self.channel.table.get(d.bundle)
        if cur is not None and cur.state.in_flight and cur.names(self.me):
            raise SplitRefused(503, f"{d.bundle} is {cur.state.value} here right now; retry in a moment")
        if cur is None or cur.state is not State.OWNED or cur.dst != self.me:
            owner = cur.owner() if cur else None
            raise SplitRefused(409, f"{d.bundle} is not owned by this broker (owner: {owner}); ask its owner")
        rec = make(
            State.SPLITTING,
            src=self.me,
            dst=None,
            version=cur.version + 1,
            ts=int(time.time() * 1000),
            writer=self.me,
            children={c.name: self.me for c in d.children},
        )
        await asyncio.wait_for(asyncio.wrap_future(self.channel.publish(d.bundle, rec)), 30)
        self.events.publish("split", bundle=d.bundle, reason=d.reason, children=[c.name for c in d.children])
        log.info("split_published", bundle=d.bundle, reason=d.reason, children=[c.name for c in d.children])
        return rec

    async def admin_split(self, bundle: str, algorithm: str | None, boundaries: list[int]) -> SplitDecision:
        try:
            parse_bundle(bundle)
        except BundleError as e:
            raise SplitRefused(400, str(e)) from None
        stats = next((b for b in self.reporter.last_bundles if b.bundle == bundle), None)
        if stats is None:
            from trimtab.balance.load import BundleStats

            stats = BundleStats(bundle=bundle)
        algo = algorithm or ("specified_positions_divide" if boundaries else self.s.split.algorithm)
        try:
            children = children_for(stats, self.split_limits(), algo, tuple(boundaries))
        except BundleError as e:
            raise SplitRefused(400, str(e)) from None
        if not children:
            raise SplitRefused(422, f"{algo} found no split boundary for {bundle}")
        decision = SplitDecision(bundle, "admin", children)
        await self.publish_split(decision)
        self.metrics.splits.labels("admin", "published").inc()
        return decision

    # ------------------------------------------------------------------ drain and shutdown
    async def drain(self) -> None:
        """Transfer every owned bundle away and wait until they are owned elsewhere (bounded)."""
        assert self.channel is not None
        self.draining = True
        self.lookups.exclude_self = True
        self.metrics.draining.set(1)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.registry.update, self.broker_info())
        deadline = time.monotonic() + self.s.agent.drain_timeout_s
        requested: dict[str, int] = {}
        log.info("drain_started", owned=len(self.owned()), timeout_s=self.s.agent.drain_timeout_s)
        while True:
            mine = {
                k: r
                for k, r in self.channel.table.items()
                if (r.state is State.OWNED and r.dst == self.me) or (r.state.in_flight and r.names(self.me))
            }
            # Done when the channel names us nowhere and the broker has closed (with redirects) what it
            # fenced: exiting earlier would drop clients without telling them where to go.
            if not mine and not self.reconciler.served and not self.reconciler.fenced:
                log.info("drain_complete", moved=len(requested))
                return
            if self.force_exit.is_set() or time.monotonic() > deadline:
                why = "second signal" if self.force_exit.is_set() else "drain timeout"
                log.warning(
                    "drain_incomplete",
                    reason=why,
                    bundles_left=len(mine),
                    not_closed=len(self.reconciler.served | self.reconciler.fenced),
                )
                self.exit_reason = f"drain incomplete ({why}): {len(mine)} bundles left"
                return
            others = {k: v for k, v in self.registry.brokers.items() if k != self.me and not v.draining}
            for bundle, rec in mine.items():
                if rec.state is not State.OWNED or requested.get(bundle) == rec.version:
                    continue
                sel = select_broker(bundle, others, self.assign_context(frozenset({self.me})), self.rng)
                nxt = make(
                    State.RELEASING,
                    src=self.me,
                    dst=sel.broker,  # None -> a plain unload when no other broker is left
                    version=rec.version + 1,
                    ts=int(time.time() * 1000),
                    writer=self.me,
                )
                self.channel.publish(bundle, nxt)
                requested[bundle] = rec.version
            await asyncio.sleep(0.05)

    async def _shutdown(self) -> None:
        self.ready = False
        self.metrics.ready.set(0)
        for t in getattr(self, "_tasks", []):
            t.cancel()
        with contextlib.suppress(Exception):
            await self.reconciler.stop()
        if getattr(self, "reporter", None) is not None and self.reporter.published is not None:
            await self.reporter.tombstone()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.registry.deregister)
        self.metrics.registered.set(0)
        with contextlib.suppress(Exception):
            self.registry.stop()
        if self.channel is not None:
            self.channel.stop()
        with contextlib.suppress(Exception):
            self.loads.stop()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.transport.flush, 5.0)
        with contextlib.suppress(Exception):
            await self.adapter.aclose()
        if self.http is not None:
            await self.http.stop()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.zk.stop)
        with contextlib.suppress(Exception):
            self.transport.close()
        log.info("agent_stopped", reason=self.exit_reason or "clean")

    # ------------------------------------------------------------------ status
    def status(self) -> Mapping[str, Any]:
        assert self.channel is not None
        return {
            "broker": self.me,
            "ready": self.ready,
            "draining": self.draining,
            "registered": self.registry.registered,
            "zookeeper": self.zk.state,
            "channel": {
                "ready": self.channel.ready,
                "lag": self.channel.lag(),
                "bundles": len(self.channel.table),
                "stats": self.channel.table.stats.detail(),
            },
            "serving": len(self.reconciler.served),
            "pending_reactions": self.reconciler.pending(),
            "uptime_s": round(time.monotonic() - self.started, 1),
        }
