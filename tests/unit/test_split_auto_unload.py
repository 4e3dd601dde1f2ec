"""``split.auto_unload`` (Pulsar's ``loadBalancerAutoUnloadSplitBundlesEnabled``): the children of an
automatic split are unloaded once the split is done, so the next lookup places them; without it they stay
on the parent's owner (agent/splits.py). An in-memory channel stands in for Kafka and the reconciler: it
accepts every record and carries a published split out on the next turn of the event loop."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any

from prometheus_client import CollectorRegistry

from tests.support.acked import AckedPublish
from trimtab.agent.metrics import AgentMetrics
from trimtab.agent.splits import CHILD_WAIT_MAX_S, SplitScheduler
from trimtab.balance.load import BundleStats
from trimtab.balance.split import SplitLimits
from trimtab.channel.records import Record, State, make

ME = "b1:1"
PARENT = "t/ns/0x00000000_0x80000000"
CHILDREN = ["t/ns/0x00000000_0x40000000", "t/ns/0x40000000_0x80000000"]


class Table:
    def __init__(self) -> None:
        self.records: dict[str, Record] = {}
        self.listeners: list[Any] = []
        self.missing: Any = None  # called when a record is looked for and not there

    def add_listener(self, fn: Any) -> None:
        self.listeners.append(fn)

    def get(self, bundle: str) -> Record | None:
        rec = self.records.get(bundle)
        if rec is None and self.missing is not None:
            self.missing()
        return rec

    def items(self) -> list[tuple[str, Record]]:
        return list(self.records.items())

    def put(self, bundle: str, rec: Record) -> None:
        old = self.records.get(bundle)
        self.records[bundle] = rec
        for fn in self.listeners:
            fn(bundle, old, rec)


class Channel(AckedPublish):
    """Accepts every record. A ``Splitting`` is carried out (children Owned here, parent Deleted) only when
    the scheduler has looked for a child and not found it, one turn of the loop later -- so it is waiting
    for them by then. ``split_done=False``: the reconciler does not get to it."""

    def __init__(self, *, split_done: bool = True) -> None:
        self.table = Table()
        self.published: list[tuple[str, Record]] = []
        self.split_done = split_done
        self.splitting: tuple[str, Record] | None = None
        self.table.missing = self.looked_for

    def publish(self, bundle: str, rec: Record) -> Future[None]:
        self.published.append((bundle, rec))
        self.table.put(bundle, rec)
        if rec.state is State.SPLITTING and self.split_done:
            self.splitting = (bundle, rec)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def naming(self, broker: str) -> dict[str, Record]:
        """ChannelClient.naming, by a scan (its index is tested in test_naming_index.py)."""
        return {k: r for k, r in self.table.items() if r.names(broker)}

    def looked_for(self) -> None:
        if self.splitting is not None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # the test itself is looking
            loop.call_soon(self.carry_out, *self.splitting)
            self.splitting = None

    def carry_out(self, bundle: str, rec: Record) -> None:
        ns = bundle.rsplit("/", 1)[0]
        for child in sorted(rec.children or {}):
            self.table.put(f"{ns}/{child}", make(State.OWNED, dst=ME, version=1, ts=0, writer=ME))
        self.table.put(bundle, make(State.DELETED, src=ME, version=rec.version + 1, ts=0, writer=ME))

    def releases(self) -> list[tuple[str, str | None, str | None]]:
        return [(b, r.src, r.dst) for b, r in self.published if r.state is State.RELEASING]


class Reporter:
    def __init__(self) -> None:
        self.last_bundles = [BundleStats(bundle=PARENT, topics=10, msg_throughput_in=1.0)]


class Layouts:
    def cached(self) -> dict[str, Any]:
        return {}


class Events:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def publish(self, kind: str, key: str | None = None, **fields: Any) -> None:
        self.events.append((kind, fields))


def scheduler(channel: Channel, *, auto_unload: bool) -> tuple[SplitScheduler, CollectorRegistry]:
    channel.table.put(PARENT, make(State.OWNED, dst=ME, version=3, ts=0, writer=ME))
    prom = CollectorRegistry()
    s = SplitScheduler(
        ME,
        channel,  # type: ignore[arg-type]
        reporter=Reporter(),  # type: ignore[arg-type]
        adapter=None,  # type: ignore[arg-type]
        layouts=Layouts(),  # type: ignore[arg-type]
        events=Events(),  # type: ignore[arg-type]
        metrics=AgentMetrics.create(prom),
        limits=SplitLimits(max_topics=1, hit_count_threshold=0),
        enabled=True,
        interval_s=60,
        paused=lambda: False,
        auto_unload=auto_unload,
    )
    return s, prom


def test_without_auto_unload_the_children_stay_on_the_parent_s_owner() -> None:
    ch = Channel(split_done=False)
    s, _ = scheduler(ch, auto_unload=False)
    decisions = asyncio.run(s.split_cycle())
    assert [d.bundle for d in decisions] == [PARENT]
    ch.carry_out(PARENT, ch.table.records[PARENT])
    asyncio.run(s.split_cycle())  # the next cycle
    assert all(ch.table.records[c].dst == ME for c in CHILDREN)
    assert ch.releases() == [] and not s.unload_after


def test_with_auto_unload_the_children_are_unloaded_once_the_split_is_done() -> None:
    ch = Channel()
    s, prom = scheduler(ch, auto_unload=True)
    s.children_wait_s = 5.0  # the children arrive while it waits: woken by the channel, not by this
    asyncio.run(s.split_cycle())
    assert ch.releases() == [(c, ME, None) for c in CHILDREN]  # plain unloads: the next lookup places them
    assert all(ch.table.get(c).version == 2 for c in CHILDREN)  # type: ignore[union-attr]
    assert (
        prom.get_sample_value("trimtab_splits_total", {"reason": "topics", "result": "child_unloaded"}) == 2
    )
    assert not s.unload_after


def test_children_not_there_yet_are_unloaded_at_the_next_cycle() -> None:
    ch = Channel(split_done=False)
    s, _ = scheduler(ch, auto_unload=True)
    s.children_wait_s = 0.0  # do not wait in this cycle: the reconciler has not carried the split out
    asyncio.run(s.split_cycle())
    assert ch.releases() == [] and set(s.unload_after) == set(CHILDREN)
    ch.carry_out(PARENT, ch.table.records[PARENT])
    assert asyncio.run(s.split_cycle()) == []  # the next cycle: the parent is gone, nothing to split
    assert ch.releases() == [(c, ME, None) for c in CHILDREN]


def test_a_child_that_moved_meanwhile_is_left_alone() -> None:
    ch = Channel(split_done=False)
    s, _ = scheduler(ch, auto_unload=True)
    s.children_wait_s = 0.0
    asyncio.run(s.split_cycle())
    ch.carry_out(PARENT, ch.table.records[PARENT])
    ch.table.put(CHILDREN[0], make(State.OWNED, dst="b2:1", src=ME, version=3, ts=0, writer="b2:1"))
    asyncio.run(s.unload_children(0.0))
    assert ch.releases() == [(CHILDREN[1], ME, None)]
    assert not s.unload_after


def test_a_child_that_never_appears_is_given_up() -> None:
    ch = Channel(split_done=False)
    s, _ = scheduler(ch, auto_unload=True)
    now = [1000.0]
    s.clock = lambda: now[0]
    s.children_wait_s = 0.0
    asyncio.run(s.split_cycle())
    assert set(s.unload_after) == set(CHILDREN)
    now[0] += CHILD_WAIT_MAX_S + 1
    asyncio.run(s.unload_children(0.0))
    assert not s.unload_after and ch.releases() == []
