"""In-process tests of the agent's parts (docs/design.md sections 3.5, 5.3, 7), as :mod:`trimtab.agent.wiring`
assembles them: a real ZooKeeper server, the in-memory transport instead of Kafka, the simulated broker,
and the agent's HTTP API on a free port. No subprocesses.

Other brokers are played by the test: a registration znode written to ZooKeeper, and channel records
published into the shared in-memory log (for the drain, a minimal peer that follows the channel and
takes over what it is handed). Synchronisation is by waiting on conditions with deadlines only.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, TypeVar

import httpx
import msgspec
import pytest
from kazoo.client import KazooClient

from tests.support.memory_log import memory_log
from tests.support.settings import AUTO_CREATE, NO_AUTH
from trimtab.agent import lookup as lookup_module
from trimtab.agent import wiring
from trimtab.agent.adapters.base import BrokerSample, Lease
from trimtab.agent.adapters.simulated import SimulatedBroker
from trimtab.agent.splits import SplitRefused
from trimtab.agent.wiring import WiredAgent
from trimtab.balance.assign import BrokerInfo
from trimtab.channel.bundles import BundleLayout, TopicName
from trimtab.channel.client import ChannelClient
from trimtab.channel.memory import MemoryLog, MemoryTransport
from trimtab.channel.records import Record, State, decode, encode, make
from trimtab.cluster.zk import ZkPaths
from trimtab.config.merge import deep_merge
from trimtab.config.settings import Settings
from trimtab.errors import LookupTimeout, TransportError

pytestmark = pytest.mark.integration

T = TypeVar("T")

NS = "acme/orders"
BUNDLES = 4
PEER = "peer-b:1"  # the other broker, played by the test
PEER_URL = "pulsar://peer-b:6650"


# ---------------------------------------------------------------------------------------------- helpers


def agent_settings(zk_hosts: str, **sections: Any) -> Settings:
    base: dict[str, Any] = {
        "zookeeper": {"hosts": zk_hosts, "session_timeout_s": 4.0},
        "http": {"host": "127.0.0.1", "port": 0},
        "broker": {"adapter": {"kind": "simulated", "retries": 0}},
        "namespace": {"default_bundles": BUNDLES, **AUTO_CREATE["namespace"]},  # lookups create acme/*
        "load": {"report_interval_s": 0.2},
        "split": {"enabled": False},
        "channel": {"in_flight_timeout_s": 10.0},
        "agent": {"drain_timeout_s": 20.0},
        **NO_AUTH,  # not what these tests are about (tests/integration/test_security.py is)
    }
    return Settings.model_validate(deep_merge(base, sections))


async def until(predicate: Callable[[], T], timeout: float = 10.0, what: str = "") -> T:
    """Await ``predicate()`` turning truthy, re-checking every 20 ms; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            name = what or getattr(predicate, "__name__", repr(predicate))
            raise AssertionError(f"timed out after {timeout}s waiting for: {name} (last: {value!r})")
        await asyncio.sleep(0.02)


async def started(task: asyncio.Task[Any], ready: Callable[[], bool], what: str) -> None:
    """Wait until a daemon's lifecycle ``task`` says it is ``ready``; one that ended while starting up
    raises its failure here rather than leaving the test to time out."""
    await until(lambda: ready() or task.done(), 30, what)
    if task.done():
        task.result()


def awaiting(task: asyncio.Task[Any]) -> list[str]:
    """Where ``task`` waits, outermost first: every coroutine of its await chain (``Task.print_stack``
    shows only the outermost frame of a suspended task)."""
    out: list[str] = []
    coro: Any = task.get_coro()
    while coro is not None and len(out) < 30:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            out.append(f"{frame.f_code.co_qualname} ({frame.f_code.co_filename}:{frame.f_lineno})")
        nxt = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        if nxt is None and frame is None:
            out.append(repr(coro)[:200])
        coro = nxt
    return out


async def stopped(task: asyncio.Task[Any], timeout_s: float = 30.0) -> None:
    """Wait for a daemon's lifecycle ``task`` to end after it was told to stop; if it does not within
    ``timeout_s``, fail naming where every task and thread waits (a shutdown step that hangs -- seen once
    in CI, 30 s after two stops -- then says which it is)."""
    try:
        await asyncio.wait_for(asyncio.shield(task), timeout_s)
    except TimeoutError:
        where = io.StringIO()
        for t in asyncio.all_tasks():
            print(f"--- task {t.get_name()}: {' <- '.join(awaiting(t))}", file=where)
        frames = sys._current_frames()
        for th in threading.enumerate():
            if th.ident in frames:
                print(f"--- thread {th.name}", file=where)
                traceback.print_stack(frames[th.ident], limit=8, file=where)
        task.cancel()
        raise AssertionError(f"did not stop within {timeout_s}s\n{where.getvalue()}") from None


@contextlib.asynccontextmanager
async def running_agent(s: Settings, log: MemoryLog, **overrides: Any) -> AsyncIterator[WiredAgent]:
    """An agent built by the wiring and started (its lifecycle runs as a task); stopped at the end."""
    w = wiring.build(s, transport=MemoryTransport(log), **overrides)
    task = asyncio.create_task(w.run(), name="agent")
    try:
        await started(task, lambda: w.agent.ready, "the agent to be ready")
        yield w
    finally:
        if not task.done():
            w.agent.stop()
            w.agent.stop()  # a second stop: do not wait for a drain
        await stopped(task)


def register_peer(zk: KazooClient, s: Settings, broker: str = PEER, url: str = PEER_URL) -> None:
    info = BrokerInfo(id=broker, service_url=url, http_url=f"http://{broker}")
    zk.create(ZkPaths(s.zk_path).broker(broker), msgspec.json.encode(info), ephemeral=True, makepath=True)


def publish(log: MemoryLog, s: Settings, bundle: str, rec: Record | None) -> None:
    """Append a record to the channel as another node would."""
    log.append(s.kafka.channel_topic, bundle.encode(), encode(rec))


def channel_history(log: MemoryLog, s: Settings, bundle: str) -> list[Record]:
    out = []
    for m in log.messages(s.kafka.channel_topic):
        if m.key == bundle.encode() and m.value is not None:
            rec = decode(m.value)
            assert isinstance(rec, Record)
            out.append(rec)
    return out


def layout() -> BundleLayout:
    return BundleLayout.default(NS, BUNDLES)


def topic_of(bundle: str, stem: str = "t") -> str:
    """A topic whose hash falls in ``bundle``."""
    lay = layout()
    for i in range(10_000):
        topic = f"persistent://{NS}/{stem}{i}"
        if lay.bundle_for_topic(TopicName.parse(topic)) == bundle:
            return topic
    raise AssertionError(f"no topic found in {bundle}")


def owned_by(w: WiredAgent, bundle: str, broker: str) -> bool:
    rec = w.channel.table.get(bundle)
    return rec is not None and rec.state is State.OWNED and rec.dst == broker


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture
def settings(zk_hosts: str) -> Settings:
    return agent_settings(zk_hosts)


@pytest.fixture
def peer_channel(settings: Settings, log: MemoryLog) -> Iterator[ChannelClient]:
    """The peer's view of the channel: it takes over every bundle assigned to it (Assigning{dst=peer}
    -> Owned{dst=peer}), as its agent would once its broker acquired the bundle."""
    chan = ChannelClient(MemoryTransport(log), settings.kafka.channel_topic, settings.kafka.snapshot_topic)

    def take_over(bundle: str, old: Record | None, new: Record | None) -> None:
        if new is not None and new.state is State.ASSIGNING and new.dst == PEER:
            rec = make(State.OWNED, dst=PEER, src=new.src, version=new.version + 1, ts=now_ms(), writer=PEER)
            chan.publish(bundle, rec)

    chan.table.add_listener(take_over)
    chan.start()
    assert chan.wait_ready(10)
    try:
        yield chan
    finally:
        chan.stop()


# ---------------------------------------------------------------------------------------------- lookups


def test_lookup_of_an_unassigned_bundle_assigns_it(settings: Settings, log: MemoryLog) -> None:
    bundle = layout().bundles[1]
    topic = topic_of(bundle)

    async def scenario() -> None:
        async with running_agent(settings, log) as w:
            me = w.identity.id
            assert w.channel.table.get(bundle) is None
            res = await asyncio.wait_for(w.lookups.lookup(topic), 15)
            assert (res.topic, res.bundle, res.owner, res.state, res.how) == (
                topic,
                bundle,
                me,
                "owned",
                "assigned",
            )
            assert res.url == w.identity.service_url
            # The channel holds exactly the assignment and its completion, both by this agent.
            hist = channel_history(log, settings, bundle)
            assert [(r.state, r.dst, r.version) for r in hist] == [
                (State.ASSIGNING, me, 1),
                (State.OWNED, me, 2),
            ]
            sim = w.sim
            assert sim is not None
            await until(lambda: bundle in sim.serving, what="the broker serving the bundle")
            # Asked again (over HTTP this time): answered at once from the table, nothing published.
            async with httpx.AsyncClient(base_url=w.identity.http_url, timeout=10) as http:
                r = await http.get("/v1/lookup", params={"topic": topic})
            assert r.status_code == 200, r.text
            assert (r.json()["owner"], r.json()["how"], r.json()["version"]) == (me, "owned", 2)
            assert len(channel_history(log, settings, bundle)) == 2

    asyncio.run(scenario())


def test_lookup_of_an_in_flight_bundle_waits_until_it_settles(
    settings: Settings, log: MemoryLog, zk: KazooClient
) -> None:
    bundle = layout().bundles[2]
    topic = topic_of(bundle)

    async def scenario() -> None:
        async with running_agent(settings, log) as w:
            register_peer(zk, settings)
            await until(lambda: PEER in w.registry.brokers, what="the peer's registration")
            publish(
                log, settings, bundle, make(State.ASSIGNING, dst=PEER, version=1, ts=now_ms(), writer=PEER)
            )
            await until(lambda: w.channel.table.get(bundle), what="the assignment in the agent's table")

            lookup = asyncio.create_task(w.lookups.lookup(topic))
            await until(lambda: bundle in w.lookups.waiting(), what="the lookup waiting on the bundle")
            assert not lookup.done()

            publish(log, settings, bundle, make(State.OWNED, dst=PEER, version=2, ts=now_ms(), writer=PEER))
            res = await asyncio.wait_for(lookup, 5)
            assert (res.bundle, res.owner, res.url, res.state, res.version, res.how) == (
                bundle,
                PEER,
                PEER_URL,
                "owned",
                2,
                "waited",
            )
            # The agent never published anything for a bundle someone else was assigning.
            assert {r.writer for r in channel_history(log, settings, bundle)} == {PEER}

    asyncio.run(scenario())


class LosesFirstChannelWrite(MemoryTransport):
    """Kafka refusing the agent's first write to the channel (its delivery report is an error)."""

    def __init__(self, log: MemoryLog, channel_topic: str) -> None:
        super().__init__(log)
        self.channel_topic = channel_topic
        self.lost: list[bytes] = []

    def send(self, topic: str, key: bytes, value: bytes | None, on_done: Any) -> None:
        if topic == self.channel_topic and not self.lost:
            self.lost.append(key)
            on_done(TransportError(f"produce to {topic} failed: Broker: Not enough in-sync replicas"))
            return
        super().send(topic, key, value, on_done)


def test_a_lost_assignment_is_counted_and_logged_and_the_next_lookup_assigns_again(
    zk_hosts: str, zk: KazooClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    timeout_s = 3.0  # the lookup waits this long; an acquire needs it above the lease margin (2 s)
    s = agent_settings(zk_hosts, channel={"in_flight_timeout_s": timeout_s})
    log = memory_log(s)
    bundle = layout().bundles[2]
    transport = LosesFirstChannelWrite(log, s.kafka.channel_topic)

    async def scenario() -> None:
        w = wiring.build(s, transport=transport)
        task = asyncio.create_task(w.run(), name="agent")
        try:
            await until(lambda: w.agent.ready or task.done(), 30, "the agent to be ready")
            warnings: list[tuple[str, dict[str, Any]]] = []

            class Log:
                def warning(self, event: str, **kw: Any) -> None:
                    warnings.append((event, kw))

                def __getattr__(self, level: str) -> Any:
                    return lambda *a, **kw: None  # debug, info: not what this test reads

            monkeypatch.setattr(lookup_module, "log", Log())
            with pytest.raises(LookupTimeout):
                await asyncio.wait_for(w.lookups.lookup(topic_of(bundle)), timeout_s + 5)
            assert transport.lost == [bundle.encode()]
            assert w.metrics.assignments.labels("failed")._value.get() == 1
            ((event, kw),) = warnings
            assert event == "assignment_publish_failed" and kw["bundle"] == bundle, warnings
            assert "in-sync replicas" in kw["error"], kw
            # The next lookup assigns again; this agent then takes the bundle (a retry may be needed: the
            # lookup waits only timeout_s for that).
            for _ in range(10):
                with contextlib.suppress(LookupTimeout):
                    res = await asyncio.wait_for(w.lookups.lookup(topic_of(bundle)), 15)
                    break
            assert (res.owner, res.state) == (w.identity.id, "owned")
            assert w.metrics.assignments.labels("failed")._value.get() == 1
            assert w.metrics.assignments.labels("published")._value.get() == 2
        finally:
            w.agent.stop()
            w.agent.stop()
            await stopped(task)

    asyncio.run(scenario())


def test_the_fast_lookup_answers_exactly_as_the_declared_route(settings: Settings, log: MemoryLog) -> None:
    """The daemons serve ``GET /v1/lookup`` from the HTTP guard's fast path (agent/lookup_http.py), not
    through FastAPI; the FastAPI route declares it in the spec. Both must answer byte for byte the same --
    owned, refused, odd query strings -- and count the same."""
    bundle = layout().bundles[2]
    owned = topic_of(bundle)
    queries = [
        {"topic": owned},
        [("topic", "persistent://nope/x/t"), ("topic", owned)],  # the last value wins, as in Starlette
        {},
        {"topic": ""},
        {"topic": "not a topic"},
        {"topic": "persistent://tenant-without-namespace"},
        {"topic": "persistent://public/auto-created-by-this-lookup/t"},
        {"topic": "persistent://public/caf\u00e9/t"},
    ]

    async def scenario() -> None:
        async with running_agent(settings, log) as w:
            assert (await asyncio.wait_for(w.lookups.lookup(owned), 15)).how == "assigned"
            fast = httpx.AsyncClient(base_url=w.identity.http_url, timeout=10)
            declared = httpx.AsyncClient(transport=httpx.ASGITransport(app=w.app), base_url="http://agent")
            async with fast, declared:
                for q in queries:
                    await fast.get("/v1/lookup", params=q)  # a lookup that assigns does so now, not below
                    before = lookups_counted(w)
                    a = await fast.get("/v1/lookup", params=q)
                    mid = lookups_counted(w)
                    b = await declared.get("/v1/lookup", params=q)
                    after = lookups_counted(w)
                    assert (a.status_code, a.content) == (b.status_code, b.content), q
                    assert a.headers["content-type"] == b.headers["content-type"] == "application/json", q
                    assert a.headers["content-length"] == b.headers["content-length"], q
                    assert mid - before == after - mid == 1, (q, before, mid, after)
                assert (await fast.get("/v1/lookup", params={"topic": owned})).json()["how"] == "owned"

    asyncio.run(scenario())


def lookups_counted(w: WiredAgent) -> float:
    """Every lookup the agent counted, whatever its result."""
    return sum(
        s.value
        for fam in w.prom.collect()
        if fam.name == "trimtab_lookups"
        for s in fam.samples
        if s.name == "trimtab_lookups_total"
    )


def test_lookup_that_cannot_settle_times_out_as_retryable(zk_hosts: str, zk: KazooClient) -> None:
    timeout_s = 1.5  # the least start-up accepts with a 0.5-s lease margin
    s = agent_settings(
        zk_hosts, channel={"in_flight_timeout_s": timeout_s}, broker={"adapter": {"lease_margin_s": 0.5}}
    )
    log = memory_log(s)
    bundle = layout().bundles[0]
    topic = topic_of(bundle)

    async def scenario() -> None:
        async with running_agent(s, log) as w:
            # Assigned to a live broker that never takes it: in flight for good.
            register_peer(zk, s)
            await until(lambda: PEER in w.registry.brokers, what="the peer's registration")
            publish(log, s, bundle, make(State.ASSIGNING, dst=PEER, version=1, ts=now_ms(), writer=PEER))
            await until(lambda: w.channel.table.get(bundle), what="the assignment in the agent's table")

            t0 = time.monotonic()
            with pytest.raises(LookupTimeout, match="did not settle") as exc:
                await asyncio.wait_for(w.lookups.lookup(topic), timeout_s + 5)
            took = time.monotonic() - t0
            assert timeout_s * 0.9 <= took < timeout_s + 2, took
            assert exc.value.status == 503 and exc.value.retryable

            async with httpx.AsyncClient(base_url=w.identity.http_url, timeout=timeout_s + 5) as http:
                t0 = time.monotonic()
                r = await http.get("/v1/lookup", params={"topic": topic})
                took = time.monotonic() - t0
            assert r.status_code == 503, r.text
            assert r.json()["retryable"] is True and "did not settle" in r.json()["error"]
            assert timeout_s * 0.9 <= took < timeout_s + 2, took
            rec = w.channel.table.get(bundle)
            assert rec is not None and rec.state is State.ASSIGNING  # nobody answered with a guess

    asyncio.run(scenario())


# ---------------------------------------------------------------------------------------------- splits


def test_split_scheduler_refuses_what_this_broker_does_not_own_or_is_moving(
    settings: Settings, log: MemoryLog, zk: KazooClient
) -> None:
    mine, moving, theirs, _ = layout().bundles

    async def scenario() -> None:
        async with running_agent(settings, log) as w:
            me = w.identity.id
            for b in (mine, moving):
                assert (await asyncio.wait_for(w.lookups.lookup(topic_of(b)), 15)).owner == me
            register_peer(zk, settings)
            await until(lambda: PEER in w.registry.brokers, what="the peer's registration")
            publish(log, settings, theirs, make(State.OWNED, dst=PEER, version=1, ts=now_ms(), writer=PEER))
            # Handed to the peer, which never takes it: the agent fences and passes it on, and there it stays.
            publish(
                log,
                settings,
                moving,
                make(State.RELEASING, src=me, dst=PEER, version=3, ts=now_ms(), writer="operator"),
            )
            await until(lambda: owned_by(w, theirs, PEER), what="the peer's bundle in the table")

            def moving_assigned() -> bool:
                rec = w.channel.table.get(moving)
                return rec is not None and rec.state is State.ASSIGNING and rec.src == me

            await until(moving_assigned, what="the transfer in flight")

            with pytest.raises(SplitRefused) as not_owner:
                await w.splits.admin_split(theirs, None, [])
            assert not_owner.value.status == 409 and PEER in str(not_owner.value)
            with pytest.raises(SplitRefused) as in_flight:
                await w.splits.admin_split(moving, None, [])
            assert in_flight.value.status == 503

            async with httpx.AsyncClient(base_url=w.identity.http_url, timeout=10) as http:
                r409 = await http.post("/v1/admin/split", json={"bundle": theirs})
                r503 = await http.post("/v1/admin/split", json={"bundle": moving})
                ok = await http.post("/v1/admin/split", json={"bundle": mine})
            assert r409.status_code == 409 and r409.json()["retryable"] is False, r409.text
            assert r503.status_code == 503 and r503.json()["retryable"] is True, r503.text
            assert ok.status_code == 202, ok.text
            children = ok.json()["children"]
            assert len(children) == 2

            # Refusals changed nothing; the accepted split is carried out by this broker.
            assert owned_by(w, theirs, PEER)
            assert moving_assigned()
            await until(lambda: all(owned_by(w, c, me) for c in children), what="the children owned")
            await until(
                lambda: (rec := w.channel.table.get(mine)) is not None and rec.state is State.DELETED,
                what="the parent deleted",
            )
            sim = w.sim
            assert sim is not None
            await until(lambda: set(children) <= sim.serving and mine not in sim.serving)

    asyncio.run(scenario())


# ---------------------------------------------------------------------------------------------- drain


def test_drain_moves_every_owned_bundle_to_another_broker(
    settings: Settings, log: MemoryLog, zk: KazooClient, peer_channel: ChannelClient
) -> None:
    owned = layout().bundles[:3]
    unowned = layout().bundles[3]

    async def scenario() -> None:
        async with running_agent(settings, log) as w:
            me = w.identity.id
            sim = w.sim
            assert sim is not None
            for b in owned:
                assert (await asyncio.wait_for(w.lookups.lookup(topic_of(b)), 15)).owner == me
            await until(lambda: set(owned) <= sim.serving, what="the broker serving its bundles")
            register_peer(zk, settings)
            await until(lambda: PEER in w.registry.brokers, what="the peer's registration")

            reason = await asyncio.wait_for(w.drainer.drain(asyncio.Event()), 30)

            assert reason == ""
            assert all(owned_by(w, b, PEER) for b in owned), {b: w.channel.table.get(b) for b in owned}
            assert not sim.serving and not sim.fenced
            for b in owned:
                # Fenced first (clients kept waiting), closed with a redirect once the peer owned it.
                steps = [(e.op, e.detail) for e in sim.timeline if e.bundle == b]
                assert steps[-2:] == [("fence", None), ("close", PEER_URL)], steps
            # The registration says draining (nobody assigns here), and neither does this agent.
            data, _ = zk.get(ZkPaths(settings.zk_path).broker(me))
            assert msgspec.json.decode(data, type=BrokerInfo).draining
            res = await asyncio.wait_for(w.lookups.lookup(topic_of(unowned)), 15)
            assert res.owner == PEER

            # The lifecycle's own drain (what SIGTERM starts) then finds nothing left, and deregisters.
            w.agent.stop()
            await until(lambda: not w.agent.ready, what="the agent stopping")
            await until(lambda: zk.exists(ZkPaths(settings.zk_path).broker(me)) is None, what="deregistered")
            assert w.agent.exit_reason == ""

    asyncio.run(scenario())


def test_drain_gives_up_at_its_deadline_and_says_what_was_left(zk_hosts: str, zk: KazooClient) -> None:
    s = agent_settings(zk_hosts, agent={"drain_timeout_s": 1.0})
    log = memory_log(s)
    bundle = layout().bundles[0]

    async def scenario() -> None:
        async with running_agent(s, log) as w:
            assert (await asyncio.wait_for(w.lookups.lookup(topic_of(bundle)), 15)).owner == w.identity.id
            register_peer(zk, s)  # it never takes anything over
            await until(lambda: PEER in w.registry.brokers, what="the peer's registration")
            t0 = time.monotonic()
            reason = await asyncio.wait_for(w.drainer.drain(asyncio.Event()), 10)
            assert 0.9 <= time.monotonic() - t0 < 5
            assert reason == "drain incomplete (drain timeout): 1 bundles left"

    asyncio.run(scenario())


# ---------------------------------------------------------------------------------------------- simulated broker routes


class PlainAdapter:
    """A broker adapter that is not the simulated broker (it only delegates to one)."""

    kind = "test"

    def __init__(self) -> None:
        self.inner = SimulatedBroker("plain", Settings().sim)

    async def sample(self) -> BrokerSample:
        return await self.inner.sample()

    async def acquire(self, bundle: str, lease: Lease) -> None:
        await self.inner.acquire(bundle, lease)

    async def renew(self, bundles: Sequence[str], lease: Lease) -> list[str]:
        return await self.inner.renew(bundles, lease)

    async def fence(self, bundle: str) -> None:
        await self.inner.fence(bundle)

    async def close(self, bundle: str, redirect_url: str | None) -> None:
        await self.inner.close(bundle, redirect_url)

    async def prewarm(self, bundle: str) -> None:
        await self.inner.prewarm(bundle)

    async def split(self, bundle: str, children: list[str]) -> None:
        await self.inner.split(bundle, children)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _paths(w: WiredAgent) -> set[str]:
    """The paths the agent's app serves, as its OpenAPI spec lists them."""
    return set(w.app.openapi()["paths"])


def test_sim_routes_exist_only_with_the_simulated_adapter(zk_hosts: str) -> None:
    simulated = agent_settings(zk_hosts)
    # An agent beside a real broker: no adapter kind needed when one is given.
    plain = agent_settings(zk_hosts, broker={"adapter": {"kind": None}})

    async def scenario() -> None:
        async with running_agent(simulated, memory_log(simulated)) as w:
            assert w.sim is not None
            assert {"/v1/sim/state", "/v1/sim/load", "/v1/sim/faults"} <= _paths(w)
            async with httpx.AsyncClient(base_url=w.identity.http_url, timeout=10) as http:
                r = await http.get("/v1/sim/state")
            assert r.status_code == 200 and r.json()["broker"] == w.identity.id, r.text
        async with running_agent(plain, memory_log(plain), adapter=PlainAdapter()) as w:
            assert w.sim is None
            assert not {p for p in _paths(w) if p.startswith("/v1/sim")}
            async with httpx.AsyncClient(base_url=w.identity.http_url, timeout=10) as http:
                for method, path in (
                    ("GET", "/v1/sim/state"),
                    ("POST", "/v1/sim/load"),
                    ("POST", "/v1/sim/faults"),
                ):
                    r = await http.request(method, path, json={})
                    assert r.status_code == 404, (path, r.status_code, r.text)
                assert (await http.get("/v1/status")).status_code == 200

    asyncio.run(scenario())


def test_lookups_assign_only_where_the_placement_policies_allow(
    settings: Settings, log: MemoryLog, zk: KazooClient
) -> None:
    """The namespace is isolated to ``peer-*`` hosts: a lookup assigns its bundle to the peer, never to
    this agent; when the policy's only broker leaves, lookups fail as retryable instead of breaking it."""
    from trimtab.cluster.placement.store import IsolationPolicies, IsolationPolicyDoc, PlacementStore

    paths = ZkPaths(settings.zk_path)
    doc = IsolationPolicyDoc(namespaces=[NS.replace("/", "/") + ".*"], primary=["peer-.*"], min_limit=1)
    PlacementStore(zk, paths).update("isolation", lambda _old: IsolationPolicies(policies={"p": doc}))
    register_peer(zk, settings)
    first, second = layout().bundles[0], layout().bundles[2]

    async def scenario() -> None:
        async with running_agent(settings, log) as w:
            await until(lambda: PEER in w.registry.brokers, what="the peer registered")
            pending = asyncio.create_task(w.lookups.lookup(topic_of(first)))
            hist = await until(lambda: channel_history(log, settings, first), what="the assignment")
            assert [(r.state, r.dst) for r in hist] == [(State.ASSIGNING, PEER)]
            # The peer (played here) takes it over; the waiting lookup answers with it.
            owned = make(State.OWNED, dst=PEER, version=2, ts=int(time.time() * 1000), writer=PEER)
            publish(log, settings, first, owned)
            res = await asyncio.wait_for(pending, 15)
            assert (res.bundle, res.owner, res.how) == (first, PEER, "assigned")

            zk.delete(paths.broker(PEER))
            await until(lambda: PEER not in w.registry.brokers, what="the peer gone")
            async with httpx.AsyncClient(base_url=w.identity.http_url, timeout=20) as http:
                r = await http.get("/v1/lookup", params={"topic": topic_of(second)})
            assert r.status_code == 503, r.text
            assert r.json()["retryable"] is True and "placement" in r.json()["error"]
            assert channel_history(log, settings, second) == []

    asyncio.run(scenario())
