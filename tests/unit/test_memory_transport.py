"""The in-memory log and transport, and the Follower that turns a topic into a caught-up view.

Synchronisation is by events with deadlines only: nothing here sleeps and hopes.
"""

from __future__ import annotations

import threading
import zlib

import pytest

from trimtab.channel.memory import MemoryLog, MemoryTransport
from trimtab.channel.records import State, make
from trimtab.channel.snapshot import SnapshotWriter, choose, read_all
from trimtab.channel.transport import Follower, Message
from trimtab.errors import HistoryGap, TransportError

DEADLINE = 10.0  # generous: only reached when something is broken


# ------------------------------------------------------------------------------------------- MemoryLog


def test_append_partitions_by_crc32_of_the_key() -> None:
    log = MemoryLog(default_partitions=3)
    assert log.create("t") == 3
    assert log.create("t", 7) == 3  # an existing topic keeps its partitions
    for i in range(20):
        key = f"k{i}".encode()
        m = log.append("t", key, b"v")
        assert m.partition == zlib.crc32(key) % 3
    assert log.append("t", b"x", b"v", partition=2).partition == 2
    assert log.append("t", None, b"v").partition in (0, 1, 2)


def test_offsets_watermarks_truncate_and_read() -> None:
    log = MemoryLog(default_partitions=1)
    for i in range(5):
        assert log.append("t", b"k", str(i).encode()).offset == i
    assert log.watermarks("t", 0) == (0, 5)
    assert log.watermarks("missing", 0) == (0, 0)
    log.truncate("t", 0, 3)
    log.truncate("t", 0, 2)  # retention never moves back
    assert log.watermarks("t", 0) == (3, 5)
    assert [m.value for m in log.read("t", 0, 0, 10)] == [b"3", b"4"]
    assert [m.offset for m in log.messages("t")] == [3, 4]
    assert log.read("t", 0, 4, 10) == [Message(b"k", b"4", 0, 4)]
    assert log.read("missing", 0, 0, 10) == []


def test_fault_injection() -> None:
    log = MemoryLog()
    transport = MemoryTransport(log)
    log.available = False
    with pytest.raises(TransportError):
        log.append("t", b"k", b"v")
    with pytest.raises(TransportError):
        transport.partitions("t")
    fut = transport.produce("t", b"k", b"v")
    assert isinstance(fut.exception(timeout=0), TransportError)
    reports: list[TransportError | None] = []
    transport.send("t", b"k", b"v", reports.append)
    assert len(reports) == 1 and isinstance(reports[0], TransportError)
    log.available = True
    assert transport.produce("t", b"k", b"v").result(timeout=0).offset == 0
    transport.send("t", b"k", b"w", reports.append)
    assert reports[1:] == [None] and [m.value for m in log.read("t", zlib.crc32(b"k") % 4, 0, 10)] == [
        b"v",
        b"w",
    ]


def test_reader_reads_every_partition_in_order() -> None:
    log = MemoryLog(default_partitions=2)
    transport = MemoryTransport(log)
    written = [log.append("t", f"k{i}".encode(), str(i).encode()) for i in range(30)]
    reader = transport.reader("t", {0: 0, 1: 0})
    got: list[Message] = []
    while len(got) < len(written):
        batch = reader.poll(7, 0)
        assert batch, "reader stalled"
        assert len(batch) <= 7
        got.extend(batch)
    assert sorted(got) == sorted(written)
    for p in (0, 1):
        offsets = [m.offset for m in got if m.partition == p]
        assert offsets == list(range(len(offsets)))
    assert reader.positions() == {p: log.watermarks("t", p)[1] for p in (0, 1)}
    assert reader.poll(10, 0) == []
    reader.close()


def test_reader_reports_truncated_history_instead_of_skipping_it() -> None:
    log = MemoryLog(default_partitions=1)
    for i in range(6):
        log.append("t", b"k", str(i).encode())
    log.truncate("t", 0, 2)
    reader = MemoryTransport(log).reader("t", {0: 0})
    with pytest.raises(HistoryGap) as gap:
        reader.poll(100, 0)
    assert (gap.value.partition, gap.value.position, gap.value.low) == (0, 0, 2)
    reader = MemoryTransport(log).reader("t", {0: 4})
    assert [m.offset for m in reader.poll(100, 0)] == [4, 5]


# -------------------------------------------------------------------------------------------- Follower


class Recorder:
    """Collects what a follower applies; lets a test wait for a number of messages or block a batch."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.cond = threading.Condition()
        self.at_ready: list[Message] | None = None
        self.ready_was_set_in_on_ready: bool | None = None
        self.follower: Follower | None = None
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def apply(self, batch: list[Message]) -> None:
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(DEADLINE)
        with self.cond:
            self.messages.extend(batch)
            self.cond.notify_all()

    def on_ready(self) -> None:
        assert self.follower is not None
        with self.cond:
            self.at_ready = list(self.messages)
        self.ready_was_set_in_on_ready = self.follower.ready.is_set()

    def wait_for(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.messages) >= n, DEADLINE), (len(self.messages), n)


def start(
    followers: list[Follower], transport: MemoryTransport, topic: str, rec: Recorder, **kw: object
) -> Follower:
    f = Follower(transport, topic, rec.apply, on_ready=rec.on_ready, **kw)  # type: ignore[arg-type]
    rec.follower = f
    followers.append(f)
    f.start()
    return f


def test_follower_catches_up_then_follows_the_tail(followers: list[Follower]) -> None:
    log = MemoryLog(default_partitions=3)
    transport = MemoryTransport(log)
    history = [log.append("t", f"k{i}".encode(), b"old") for i in range(40)]
    rec = Recorder()
    f = start(followers, transport, "t", rec, batch=7)
    assert f.wait_ready(DEADLINE)
    # on_ready ran before ready was set, and saw exactly the history up to the start-time watermarks.
    assert rec.ready_was_set_in_on_ready is False
    assert rec.at_ready is not None and sorted(rec.at_ready) == sorted(history)
    assert f.highwater == {p: log.watermarks("t", p)[1] for p in range(3)}
    assert f.lag() == 0 and not f.history_gap and f.error is None

    tail = [log.append("t", f"k{i}".encode(), b"new") for i in range(10)]
    rec.wait_for(len(history) + len(tail))
    assert sorted(rec.messages[len(history) :]) == sorted(tail)
    assert f.records == len(history) + len(tail)


def test_follower_is_not_ready_before_reaching_the_high_watermarks(followers: list[Follower]) -> None:
    log = MemoryLog(default_partitions=1)
    transport = MemoryTransport(log)
    for i in range(3):
        log.append("t", b"k", str(i).encode())
    rec = Recorder()
    rec.gate = threading.Event()
    f = start(followers, transport, "t", rec, batch=1)
    assert rec.entered.wait(DEADLINE)  # the follower is inside apply with the first message, blocked
    assert not f.ready.is_set()
    assert rec.at_ready is None
    rec.gate.set()
    assert f.wait_ready(DEADLINE)
    assert rec.at_ready is not None and [m.value for m in rec.at_ready] == [b"0", b"1", b"2"]


def test_follower_of_an_empty_topic_is_ready_at_once(followers: list[Follower]) -> None:
    transport = MemoryTransport(MemoryLog(default_partitions=2))
    rec = Recorder()
    f = start(followers, transport, "empty", rec)
    assert f.wait_ready(DEADLINE)
    assert rec.at_ready == [] and rec.ready_was_set_in_on_ready is False
    transport.produce("empty", b"k", b"v").result(DEADLINE)
    rec.wait_for(1)


def test_follower_starts_from_given_positions(followers: list[Follower]) -> None:
    log = MemoryLog(default_partitions=1)
    for i in range(5):
        log.append("t", b"k", str(i).encode())
    rec = Recorder()
    f = start(followers, MemoryTransport(log), "t", rec, start={0: 3})
    assert f.wait_ready(DEADLINE)
    assert rec.at_ready is not None and [m.offset for m in rec.at_ready] == [3, 4]
    assert not f.history_gap


def test_follower_stops_at_a_history_gap_at_start(followers: list[Follower]) -> None:
    log = MemoryLog(default_partitions=1)
    for i in range(6):
        log.append("t", b"k", str(i).encode())
    log.truncate("t", 0, 4)
    gaps: list[HistoryGap] = []
    seen = threading.Event()
    rec = Recorder()
    f = start(
        followers,
        MemoryTransport(log),
        "t",
        rec,
        start={0: 1},
        on_gap=lambda e: (gaps.append(e), seen.set()),
    )
    assert seen.wait(DEADLINE)
    assert f.history_gap and not f.ready.is_set() and rec.messages == []
    assert [(g.partition, g.position, g.low) for g in gaps] == [(0, 1, 4)]


def test_follower_stops_at_a_history_gap_while_running(followers: list[Follower]) -> None:
    """A follower that falls behind retention (here: blocked inside apply) must not jump ahead."""
    log = MemoryLog(default_partitions=1)
    for i in range(3):
        log.append("t", b"k", str(i).encode())
    gaps: list[HistoryGap] = []
    seen = threading.Event()
    rec = Recorder()
    rec.gate = threading.Event()
    f = start(
        followers, MemoryTransport(log), "t", rec, batch=1, on_gap=lambda e: (gaps.append(e), seen.set())
    )
    assert rec.entered.wait(DEADLINE)  # blocked applying offset 0
    for i in range(3, 10):
        log.append("t", b"k", str(i).encode())
    log.truncate("t", 0, 6)  # offsets 1..5 go before the follower read them
    rec.gate.set()
    assert seen.wait(DEADLINE)
    assert [m.offset for m in rec.messages] == [0]
    assert [(g.position, g.low) for g in gaps] == [(1, 6)]
    assert f.history_gap and f.error is None


def test_follower_refuses_a_start_beyond_the_end(followers: list[Follower]) -> None:
    log = MemoryLog(default_partitions=1)
    log.append("t", b"k", b"v")
    errors: list[BaseException] = []
    failed = threading.Event()

    def on_error(e: BaseException) -> None:
        errors.append(e)
        failed.set()

    rec = Recorder()
    f = start(followers, MemoryTransport(log), "t", rec, start={0: 10}, on_error=on_error)
    assert failed.wait(DEADLINE)
    assert isinstance(f.error, TransportError) and errors == [f.error]
    assert "beyond the end" in str(f.error)
    assert not f.ready.is_set() and rec.at_ready is None


def test_follower_reports_a_crash_in_apply(followers: list[Follower]) -> None:
    log = MemoryLog(default_partitions=1)
    log.append("t", b"k", b"v")
    failed = threading.Event()

    def apply(batch: list[Message]) -> None:
        raise ValueError("boom")

    f = Follower(MemoryTransport(log), "t", apply, on_error=lambda e: failed.set())
    followers.append(f)
    f.start()
    assert failed.wait(DEADLINE)
    assert isinstance(f.error, ValueError)


# -------------------------------------------------------------------------------- snapshots over a log


def test_snapshot_writer_round_trip_and_garbage_collection() -> None:
    log = MemoryLog(default_partitions=1)
    transport = MemoryTransport(log)
    writer = SnapshotWriter(transport, "snap", "chan", writer="leader", chunk_bundles=2)
    states = {
        f"t/ns/0x{i:08x}_0x{i + 1:08x}": make(State.OWNED, version=2, ts=0, writer="w", dst="a:1")
        for i in range(5)
    }
    first = writer.write(states, {0: 10, 1: 4}, partitions=2, term=1)
    assert first.chunks == 3 and first.bundles == 5 and first.channel == "chan"
    snap = choose([(m.key, m.value) for m in read_all(transport, "snap")], channel="chan")
    assert snap is not None and snap.states == states and snap.positions == {0: 10, 1: 4}

    fewer = dict(list(states.items())[:1])
    second = writer.write(fewer, {0: 12, 1: 4}, partitions=2, term=1)
    topic = [(m.key, m.value) for m in read_all(transport, "snap")]
    snap = choose(topic, channel="chan")
    assert snap is not None and snap.manifest.id == second.id and snap.states == fewer
    # Every chunk of the first snapshot was tombstoned after the second manifest.
    tombstoned = {k for k, v in topic if v is None}
    assert tombstoned == {
        k for k, _ in topic if k is not None and k.startswith(f"chunk/{first.id}/".encode())
    }
    assert len(tombstoned) == 3
