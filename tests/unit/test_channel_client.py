"""ChannelClient supervision on the in-memory log: the node is not ready while its view is being rebuilt,
says why, and recovers by itself -- from a follower failure, and from a history gap once a snapshot
covers what is retained. It never jumps over records it has not read."""

from __future__ import annotations

import threading
import zlib
from typing import Any

import pytest

from tests.support.waiting import wait_for
from trimtab.channel.bundles import BundleLayout
from trimtab.channel.client import ChannelClient
from trimtab.channel.memory import MemoryLog, MemoryTransport
from trimtab.channel.records import Record, State, encode, make
from trimtab.channel.snapshot import SnapshotWriter
from trimtab.channel.table import replay
from trimtab.errors import SnapshotTopicError, TransportError

CHANNEL, SNAPSHOTS = "chan", "snap"
BUNDLES = BundleLayout.default("t/ns", 8).bundles


def step(log: MemoryLog, bundle: str, version: int) -> None:
    """The accepted record ``version`` of an assign / own / unload / free cycle on broker b1:1."""
    b = "b1:1"
    rec = {
        1: make(State.ASSIGNING, version=1, ts=1, writer=b, dst=b),
        2: make(State.OWNED, version=2, ts=2, writer=b, dst=b),
        3: make(State.RELEASING, version=3, ts=3, writer=b, src=b),
        4: make(State.FREE, version=4, ts=4, writer=b, src=b),
    }[version]
    log.append(CHANNEL, bundle.encode(), encode(rec))


@pytest.fixture
def log() -> MemoryLog:
    log = MemoryLog(default_partitions=2)
    log.create(SNAPSHOTS, 1)
    return log


def client(clients: list[ChannelClient], log: MemoryLog, **kw: object) -> ChannelClient:
    c = ChannelClient(MemoryTransport(log), CHANNEL, SNAPSHOTS, retry_s=0.05, max_retry_s=0.1, **kw)  # type: ignore[arg-type]
    clients.append(c)
    return c


def test_a_snapshot_topic_with_more_partitions_is_refused(
    log: MemoryLog, clients: list[ChannelClient]
) -> None:
    log.create("snap4", 4)
    c = ChannelClient(MemoryTransport(log), CHANNEL, "snap4")
    clients.append(c)
    with pytest.raises(SnapshotTopicError, match=r"snap4.*exactly 1"):
        c.start()
    log.create("snap1", 1)
    ok = ChannelClient(MemoryTransport(log), CHANNEL, "snap1")
    clients.append(ok)
    ok.start()
    assert ok.wait_ready(10)


def test_a_failed_follower_makes_the_node_unready_and_is_restarted(
    log: MemoryLog, clients: list[ChannelClient]
) -> None:
    for b in BUNDLES:
        step(log, b, 1)
    c = client(clients, log)
    c.start()
    assert c.wait_ready(10) and c.health() == (True, "ready")
    boom = threading.Event()

    def listener(key: str, _old: Record | None, _new: Record | None) -> None:
        if not boom.is_set():
            boom.set()
            raise RuntimeError("a bug in a listener")

    c.table.add_listener(listener)
    step(log, BUNDLES[0], 2)
    wait_for(lambda: boom.is_set() and not c.ready, message="the failure makes the node unready")
    ok, why = c.health()
    assert not ok and "follower stopped" in why and "a bug in a listener" in why
    wait_for(lambda: c.ready, message=lambda: f"the node recovers: {c.health()}")
    assert c.recoveries >= 1
    assert c.table.as_dict() == replay(log.messages(CHANNEL), 2).as_dict()


def test_a_history_gap_waits_for_a_covering_snapshot(log: MemoryLog, clients: list[ChannelClient]) -> None:
    for b in BUNDLES:
        step(log, b, 1)
    healthy = client(clients, log)
    healthy.start()
    assert healthy.wait_ready(10)
    lagging = client(clients, log)
    lagging.start()
    assert lagging.wait_ready(10)

    gate = threading.Event()
    entered = threading.Event()

    def pause(key: str, _old: Record | None, _new: Record | None) -> None:
        entered.set()
        assert gate.wait(10)

    lagging.table.add_listener(pause)
    for b in BUNDLES:
        step(log, b, 2)
    assert entered.wait(10)  # the laggard is stuck inside its first new record
    for b in BUNDLES:
        step(log, b, 3)
    ends = {p: log.watermarks(CHANNEL, p)[1] for p in range(2)}
    wait_for(lambda: healthy.table.snapshot()[1] == ends, message="the healthy node reads everything")
    for p in range(2):
        log.truncate(CHANNEL, p, log.watermarks(CHANNEL, p)[1] - 1)  # keep only each partition's last
    lagging.table.remove_listener(pause)
    gate.set()
    wait_for(lambda: lagging.gaps >= 1 and not lagging.ready, message="the gap is seen")
    assert lagging.history_gap
    ok, why = lagging.health()
    assert not ok and "history gap" in why
    assert not lagging.wait_ready(0.3)  # no snapshot covers the retained channel: it waits

    writer = SnapshotWriter(MemoryTransport(log), SNAPSHOTS, CHANNEL, writer="leader")
    writer.write(*healthy.table.snapshot(), 2, term=1)
    assert lagging.wait_ready(10), lagging.health()
    assert not lagging.history_gap and lagging.recoveries >= 1
    assert lagging.table.as_dict() == healthy.table.as_dict()


class _FlakyReaders(MemoryTransport):
    """reader() refuses ``fail`` more times (a broker refusing a fetch session), counting refusals."""

    def __init__(self, log: MemoryLog, fail: int) -> None:
        super().__init__(log)
        self.fail = fail
        self.refused = 0

    def reader(self, topic: str, start: dict[int, int], *, low_latency: bool = True) -> Any:
        if self.fail > 0:
            self.fail -= 1
            self.refused += 1
            raise TransportError("fetch refused")
        return super().reader(topic, start, low_latency=low_latency)


def test_a_follower_failing_before_its_recovery_returned_is_recovered_too(log: MemoryLog) -> None:
    """The recovery's own follower fails while the recovery thread has not returned yet (descheduled): the
    failure must not be dropped because "a recovery is running" -- the node would stay unready for good."""
    t = _FlakyReaders(log, fail=2)

    handled = threading.Event()

    class Descheduled(ChannelClient):
        def _bootstrap(self, partitions: int) -> None:
            super()._bootstrap(partitions)
            if threading.current_thread().name == "channel-recover" and self.recoveries == 1:
                # Hold the recovery thread until the failure of the follower it just started is handled.
                assert handled.wait(5), "the second follower never failed"

        def _stopped(self, e: BaseException, reason: str) -> None:
            super()._stopped(e, reason)
            if t.refused == 2:
                handled.set()

    c = Descheduled(t, CHANNEL, None, use_snapshot=False, retry_s=0.01, max_retry_s=0.05)
    try:
        c.start()
        assert c.wait_ready(10), c.health()
        assert c.recoveries == 2
    finally:
        c.stop()


def test_stop_during_a_recovery_leaves_no_follower_running(log: MemoryLog) -> None:
    """stop() while a recovery is bootstrapping: the recovery must not start a follower after it."""
    gate, entered = threading.Event(), threading.Event()

    class SlowSnapshots(MemoryTransport):
        def watermarks(self, topic: str, partition: int, *, timeout_s: float = 10.0) -> tuple[int, int]:
            if topic == SNAPSHOTS and not gate.is_set():
                entered.set()
                gate.wait(10)
            return super().watermarks(topic, partition)

    gate.set()
    t = SlowSnapshots(log)
    b = BUNDLES[0]
    for v in (1, 2, 3):
        step(log, b, v)
    c = ChannelClient(t, CHANNEL, SNAPSHOTS, retry_s=0.0, max_retry_s=0.05)
    c.start()
    assert c.wait_ready(5)
    p = zlib.crc32(b.encode()) % 2
    # A snapshot covering one record more than the channel has yet (the next one, written below).
    ends = {q: log.watermarks(CHANNEL, q)[1] + (q == p) for q in range(2)}
    SnapshotWriter(t, SNAPSHOTS, CHANNEL, writer="leader").write(dict(c.table.items()), ends, 2, term=1)
    gate.clear()
    with log._cond:  # a record the follower has not read, deleted by retention: a history gap
        step(log, b, 4)
        log.truncate(CHANNEL, p, ends[p])
    assert entered.wait(5), "the recovery never read the snapshot topic"
    stopper = threading.Thread(target=c.stop)
    stopper.start()
    wait_for(c._stopping.is_set, 5)
    gate.set()  # the recovery goes on with its bootstrap
    stopper.join(10)
    rec = c._recovery
    assert rec is not None
    wait_for(lambda: not rec.is_alive(), 10, message="the recovery thread ends")
    assert c.recoveries == 1  # it got as far as a bootstrap from the snapshot
    assert c.follower is None or not c.follower.running


def test_a_follower_that_stops_receiving_shows_a_growing_lag(
    log: MemoryLog, clients: list[ChannelClient]
) -> None:
    """The lag counted only up to the ends seen when the follower started: one that stopped receiving later
    showed 0 for ever (an agent once missed every record written after a whole-Kafka restart, with no
    metric to say so). With the ends read by a thread of their own, it grows -- TrimtabChannelStuck."""
    step(log, BUNDLES[0], 1)
    c = client(clients, log, ends_every_s=0.02)
    c.start()
    assert c.wait_ready(5)
    assert c.lag() == 0
    follower = c.follower
    assert follower is not None
    follower.stop()  # receives nothing from now on, and says nothing (no error: no recovery either)
    for b in BUNDLES[1:4]:
        step(log, b, 1)
    wait_for(lambda: c.lag() == 3, 5, message=lambda: f"lag {c.lag()}")
    assert c.status()["lag"] == 3 and c.status()["ready"]


def test_without_the_ends_thread_the_lag_is_up_to_the_start(
    log: MemoryLog, clients: list[ChannelClient]
) -> None:
    """The simulator and the tools do not start it: their lag is the catch-up lag only."""
    step(log, BUNDLES[0], 1)
    c = client(clients, log)
    c.start()
    assert c.wait_ready(5)
    assert c._ends_thread is None
