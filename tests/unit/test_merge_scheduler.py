"""The agent's automatic merges (agent/merges.py): what one check publishes, and that a hostile sample or
a failed layout read skips a namespace, counted, without stopping the job."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any

from tests.support.acked import AckedPublish
from trimtab.agent.merges import MergeScheduler
from trimtab.agent.metrics import AgentMetrics
from trimtab.balance.load import BundleStats
from trimtab.balance.merge import MergeLimits
from trimtab.channel.bundles import BundleLayout
from trimtab.channel.records import Record, State, make
from trimtab.cluster.metrics import new_registry

NS = "t/cold"
ME, OTHER = "me:1", "other:2"


class Table:
    def __init__(self) -> None:
        self.records: dict[str, Record] = {}

    def get(self, bundle: str) -> Record | None:
        return self.records.get(bundle)

    def items(self) -> list[tuple[str, Record]]:
        return list(self.records.items())


class Channel(AckedPublish):
    """What the scheduler touches of its channel: the table, and publish (accepted at once here)."""

    def __init__(self) -> None:
        self.table = Table()
        self.published: list[tuple[str, Record]] = []

    def publish(self, bundle: str, rec: Record) -> Future[None]:
        self.published.append((bundle, rec))
        self.table.records[bundle] = rec
        f: Future[None] = Future()
        f.set_result(None)
        return f


class Reporter:
    def __init__(self, bundles: list[BundleStats]) -> None:
        self.last_bundles = bundles


class Events:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def publish(self, kind: str, **fields: Any) -> None:
        self.sent.append((kind, fields))


def scheduler(
    owners: list[str], *, layouts: Any = None, extra_stats: tuple[BundleStats, ...] = ()
) -> tuple[MergeScheduler, Channel, AgentMetrics, Events]:
    layout = BundleLayout.default(NS, len(owners))
    ch = Channel()
    for b, o in zip(layout.bundles, owners, strict=True):
        ch.table.records[b] = make(State.OWNED, dst=o, version=2, ts=0, writer=o)
    stats = [
        BundleStats(bundle=b, topics=1, msg_rate_in=1.0)
        for b, o in zip(layout.bundles, owners, strict=True)
        if o == ME
    ]

    async def layout_of(ns: str) -> BundleLayout | None:
        return layout if ns == NS else None

    metrics = AgentMetrics.create(new_registry())
    events = Events()
    sched = MergeScheduler(
        ME,
        ch,  # type: ignore[arg-type]
        reporter=Reporter([*stats, *extra_stats]),  # type: ignore[arg-type]
        adapter=None,  # type: ignore[arg-type]
        layouts=layouts or layout_of,
        events=events,  # type: ignore[arg-type]
        metrics=metrics,
        limits=MergeLimits(enabled=True, hit_count_threshold=0, min_bundles_per_namespace=1),
        interval_s=60,
        paused=lambda: False,
        clock=lambda: 1000.0,
    )
    return sched, ch, metrics, events


def count(metrics: AgentMetrics, result: str) -> float:
    return metrics.merges.labels(result)._value.get()  # type: ignore[no-any-return]


def test_one_check_starts_the_merge_of_a_pair_it_owns_both_of() -> None:
    sched, ch, metrics, events = scheduler([ME, ME, OTHER, ME])
    started = asyncio.run(sched.merge_cycle())
    assert [(d.left, d.right) for d in started] == [
        (f"{NS}/0x00000000_0x40000000", f"{NS}/0x40000000_0x80000000")
    ]
    # Both parents Merging into their union, written by this agent; the pair across brokers is left alone.
    assert [(b, r.state, r.src, r.children) for b, r in ch.published] == [
        (f"{NS}/0x00000000_0x40000000", State.MERGING, ME, {"0x00000000_0x80000000": ME}),
        (f"{NS}/0x40000000_0x80000000", State.MERGING, ME, {"0x00000000_0x80000000": ME}),
    ]
    assert count(metrics, "started") == 1 and count(metrics, "owners_differ") == 2
    assert sched.status() == {
        "enabled": True,
        "paused": False,
        "last_check": {
            "at_ms": 1_000_000,
            "namespaces": 1,
            "started": [f"{NS}/0x00000000_0x80000000"],
            "skipped": {"owners_differ": 2},
        },
    }
    assert events.sent == [
        (
            "merge",
            {
                "bundle": f"{NS}/0x00000000_0x80000000",
                "parents": [d for d, _ in ch.published],
                "reason": "cold",
            },
        )
    ]


def test_a_hostile_sample_or_a_failed_layout_read_is_skipped_and_counted() -> None:
    bad = BundleStats(bundle="not a bundle name", topics=1)
    sched, ch, metrics, _ = scheduler([ME, ME], extra_stats=(bad,))
    assert len(asyncio.run(sched.merge_cycle())) == 1
    assert count(metrics, "bad_bundle_name") == 1

    async def broken(ns: str) -> BundleLayout | None:
        raise ConnectionError("ZooKeeper is away")

    sched, ch, metrics, _ = scheduler([ME, ME], layouts=broken)
    assert asyncio.run(sched.merge_cycle()) == [] and ch.published == []
    assert count(metrics, "layout_unavailable") == 1


def test_a_parent_that_moved_meanwhile_refuses_the_merge() -> None:
    sched, ch, metrics, _ = scheduler([ME, ME])
    real_publish = ch.publish

    def moved_first(bundle: str, rec: Record) -> Future[None]:
        # The second parent is transferred away just after the first Merging was written.
        right = f"{NS}/0x80000000_0xffffffff"
        if not ch.published:
            ch.table.records[right] = make(State.RELEASING, src=ME, dst=OTHER, version=3, ts=0, writer=ME)
        return real_publish(bundle, rec)

    ch.publish = moved_first  # type: ignore[method-assign]
    assert asyncio.run(sched.merge_cycle()) == []
    assert len(ch.published) == 1 and count(metrics, "refused") == 1  # the first half aborts by itself


def test_off_by_default_and_paused_while_draining() -> None:
    sched, *_ = scheduler([ME, ME])
    assert sched.active()
    sched.limits = MergeLimits()
    assert not sched.active()
    sched, *_ = scheduler([ME, ME])
    sched._paused = lambda: True
    assert not sched.active()


def test_a_second_half_that_cannot_be_written_takes_the_first_back_at_once() -> None:
    """Review finding: the first parent stayed Merging, waiting for a partner Owned here (the flow waits for
    the second half), until the monitor moved it -- forever where no other broker may take it."""
    from trimtab.errors import TransportError

    sched, ch, metrics, _ = scheduler([ME, ME])
    left, right = f"{NS}/0x00000000_0x80000000", f"{NS}/0x80000000_0xffffffff"
    real_publish = ch.publish

    def kafka_away_for_the_second(bundle: str, rec: Record) -> Future[None]:
        if bundle == right:
            f: Future[None] = Future()
            f.set_exception(TransportError("Kafka is away"))
            return f
        return real_publish(bundle, rec)

    ch.publish = kafka_away_for_the_second  # type: ignore[method-assign]
    assert asyncio.run(sched.merge_cycle()) == []
    assert [(b, r.state) for b, r in ch.published] == [(left, State.MERGING), (left, State.OWNED)]
    assert ch.table.records[left].src == ME == ch.table.records[left].dst  # an aborted merge, in the log
    assert count(metrics, "refused") == 1 and count(metrics, "aborted_half_written") == 1


def test_a_half_written_merge_found_later_is_aborted_by_the_next_check() -> None:
    """A crash between the two writes, or a second half delivered after the first was taken back."""
    sched, ch, metrics, _ = scheduler([ME, ME])
    left = f"{NS}/0x00000000_0x80000000"
    ch.table.records[left] = make(
        State.MERGING, src=ME, version=3, ts=0, writer=ME, children={"0x00000000_0xffffffff": ME}
    )
    sched.limits = MergeLimits(enabled=True, hit_count_threshold=5, min_bundles_per_namespace=1)  # no new one
    asyncio.run(sched.merge_cycle())  # the clock reads 1000 s: far past twice the publish timeout
    assert [(b, r.state) for b, r in ch.published] == [(left, State.OWNED)]
    assert count(metrics, "aborted_half_written") == 1
