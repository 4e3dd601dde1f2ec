"""A lease is sized from the bundle's record as it is *after* the session was confirmed, and from what the
session allows at the moment each lease is sent.

Found by the first long chaos run (docs/reliability.md, "The long run: a first attempt that failed"): an
agent planned to re-acquire a bundle it owned, then waited for a ZooKeeper confirmation while it was cut off
from ZooKeeper. Its session expired; the leader gave the bundle to another broker, which acquired it. The
agent's confirmation came back on its *new* session, and the lease was granted from the limit read before
the wait -- from the old record. Its broker served the bundle for a second beside the new owner, until the
next plan closed it (17 of the run's 20 double-serving windows).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import CollectorRegistry

from tests.unit.test_reconciler_yields import InstantBroker, build_reconciler
from trimtab.agent.adapters.base import Lease
from trimtab.agent.leases import LeaseGuard, LeaseRenewer
from trimtab.agent.metrics import AgentMetrics
from trimtab.channel.records import Record, State, make

ME, OTHER = "me:1", "other:2"
BUNDLE = "t/ns/0x00000000_0xffffffff"


class Broker(InstantBroker):
    """Records what it was asked; every call completes at once."""

    def __init__(self) -> None:
        super().__init__()
        self.renewed: list[tuple[list[str], float]] = []
        self.during_renew: Any = None  # called inside renew: time passes on a slow broker

    async def renew(self, bundles: Sequence[str], lease: Lease) -> list[str]:
        self.renewed.append((list(bundles), lease.seconds))
        if self.during_renew is not None:
            self.during_renew()
        return []


class Channel:
    def __init__(self, records: dict[str, Record]) -> None:
        self.table = dict(records)

    def send(self, bundle: str, record: Record | None, on_done: Any) -> None: ...


class HeldSession:
    """A ZooKeeper session whose confirmation waits until the test lets it through (a partitioned agent's
    round trip, answered once it is connected again)."""

    requested_timeout_s = 30.0
    connected = True

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def granted_timeout_s(self, wait_s: float = 5.0) -> float:
        return 30.0

    def confirm(self, timeout_s: float, path: str = "/") -> None:
        self.entered.set()
        assert self.release.wait(10), "the test never released the confirmation"


def acquired_after_the_record_moved_on(move_on: bool) -> list[str]:
    async def main() -> list[str]:
        session = HeldSession()
        metrics = AgentMetrics.create(CollectorRegistry())
        guard = LeaseGuard(session, lease_s=20.0, margin_s=2.0, metrics=metrics)
        channel = Channel({BUNDLE: make(State.OWNED, dst=ME, version=23, ts=0, writer=ME)})
        broker = Broker()
        rec = build_reconciler(channel, broker, workers=1, guard=guard)
        rec.mark(BUNDLE)  # our broker lost the lease: acquire again, the record is still ours
        rec.start()
        try:
            assert await asyncio.to_thread(session.entered.wait, 10), "the acquire never asked for a lease"
            if move_on:
                # Meanwhile the bundle was given to another broker.
                channel.table[BUNDLE] = make(State.OWNED, dst=OTHER, version=25, ts=0, writer=OTHER)
            session.release.set()  # the confirmation comes back
            await asyncio.wait_for(rec.idle.wait(), 10)
            assert not rec.pending()
        finally:
            await rec.stop()
        return broker.acquired

    return asyncio.run(main())


def test_an_acquire_is_not_sent_for_a_record_that_moved_on_while_the_session_was_confirmed() -> None:
    assert acquired_after_the_record_moved_on(move_on=True) == []


def test_an_acquire_whose_record_is_unchanged_goes_ahead_after_the_wait() -> None:
    """The control: the same wait without the move acquires (so the test above can fail)."""
    assert acquired_after_the_record_moved_on(move_on=False) == [BUNDLE]


def test_a_confirmation_asked_for_before_a_session_loss_does_not_count_when_it_runs_after() -> None:
    """The incident's other half: the round trip was queued behind a busy thread pool, and ran only once
    the agent had a new session. Confirming the new session says nothing about the waiters of the old."""

    async def main() -> float | None:
        loop = asyncio.get_running_loop()
        pool = ThreadPoolExecutor(max_workers=1)
        loop.set_default_executor(pool)
        busy = threading.Event()
        pool.submit(busy.wait, 10)  # the pool's one thread is taken
        session = HeldSession()
        session.release.set()
        guard = LeaseGuard(
            session, lease_s=20.0, margin_s=2.0, metrics=AgentMetrics.create(CollectorRegistry())
        )
        waiter = asyncio.ensure_future(guard.confirm())
        await asyncio.sleep(0)  # asked for: queued behind the busy thread
        assert not session.entered.is_set()
        guard.forget()  # the session is lost (and a new one connected) before the round trip runs
        busy.set()
        await waiter
        assert session.entered.is_set()  # it did run, on the new session
        return guard.confirmed_at

    assert asyncio.run(main()) is None


def test_a_renewal_round_reads_what_the_session_allows_again_before_each_group() -> None:
    """Groups of different lease lengths are renewed one after another; a broker slow to answer the first
    must not let the second get a lease sized from a confirmation that has meanwhile aged past its use."""
    now = [1000.0]
    session = HeldSession()
    session.release.set()
    metrics = AgentMetrics.create(CollectorRegistry())
    guard = LeaseGuard(session, lease_s=20.0, margin_s=2.0, metrics=metrics, mono=lambda: now[0])
    guard.confirmed_at = now[0]  # bound: 30 - 2 = 28 s
    inflight = "t/ns/0x80000000_0xffffffff"
    records = {
        BUNDLE: make(State.OWNED, dst=ME, version=3, ts=0, writer=ME),
        # On its way to us, 20 s old by our wall clock: the monitor may force it on in 30 - 2 - 20 = 8 s.
        inflight: make(State.ASSIGNING, dst=ME, version=4, ts=int((time.time() - 20) * 1000), writer="x"),
    }
    broker = Broker()

    def slow_broker() -> None:
        now[0] += 27.5  # the first group's renewal took 27.5 s: the session allows 0.5 s more

    broker.during_renew = slow_broker
    renewer = LeaseRenewer(
        ME,
        guard,
        broker,  # type: ignore[arg-type]
        served=lambda: [BUNDLE, inflight],
        record=records.get,
        is_stale=lambda b: False,
        lost=lambda gone: None,
        metrics=metrics,
        in_flight_timeout_s=30.0,
    )
    asyncio.run(renewer.run_once())
    assert broker.renewed[0] == ([BUNDLE], 20.0)
    assert len(broker.renewed) == 2
    bundles, seconds = broker.renewed[1]
    assert bundles == [inflight] and seconds <= 0.5  # not the ~8 s computed before the first group


class SendingChannel(Channel):
    """Keeps what the reconciler publishes."""

    def __init__(self, records: dict[str, Record]) -> None:
        super().__init__(records)
        self.sent: list[Record | None] = []

    def send(self, bundle: str, record: Record | None, on_done: Any) -> None:
        self.sent.append(record)


def test_an_assignment_delivered_too_late_for_a_lease_is_confirmed_first_then_acquired() -> None:
    """Found by the Kafka-outage test: lookups during the outage left Assigning records in the producers'
    queues, delivered 30 s later when Kafka came back -- older than the in-flight timeout, so no lease could
    cover them. The agent retried its acquire every 10 s and only the monitor could end it (a CI run saw the
    monitor not do so for 90 s). Now the agent settles such a record through the channel as a stale one:
    Owned first (ordered by version against any override of the monitor), acquired once accepted."""

    async def main() -> tuple[list[str], list[Record | None], list[str]]:
        late = make(State.ASSIGNING, dst=ME, version=1, ts=int((time.time() - 60) * 1000), writer="x")
        channel = SendingChannel({BUNDLE: late})
        broker = Broker()
        rec = build_reconciler(channel, broker, workers=1)
        rec.start()
        try:
            rec.mark(BUNDLE)
            await asyncio.wait_for(rec.idle.wait(), 10)
            before = list(broker.acquired)
            sent = list(channel.sent)
            assert sent and sent[0] is not None
            channel.table[BUNDLE] = sent[0]  # the channel accepted it
            rec.idle.clear()
            rec.mark(BUNDLE)
            await asyncio.wait_for(rec.idle.wait(), 10)
        finally:
            await rec.stop()
        return before, sent, broker.acquired

    before, sent, after = asyncio.run(main())
    assert before == []  # nothing served on the late record itself
    assert len(sent) == 1 and sent[0] is not None
    assert (sent[0].state, sent[0].dst, sent[0].version) == (State.OWNED, ME, 2)
    assert after == [BUNDLE]
