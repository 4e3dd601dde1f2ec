"""Rules of the in-memory log and transport that the round-trip tests leave loose (channel/memory.py;
docs/testing.md).

The in-memory log stands in for Kafka in the unit tests and the deterministic simulator, so what it
promises is pinned exactly: its default partition count, the message of an injected fault, retention
that deletes nothing at offset 0, a poll that returns at most what it was asked for (also across
partitions), a poll that waits only when told to and returns what arrived during the wait, a delivery
report whose crash is logged under its topic, and a flush with nothing pending. A wait is made visible
without sleeping by a log whose ``wait`` records its timeout and appends a record, as another producer
would while the reader waits.
"""

from __future__ import annotations

import zlib

import pytest
import structlog

from trimtab.channel.memory import MemoryLog, MemoryTransport
from trimtab.channel.transport import Message
from trimtab.errors import HistoryGap, TransportError

UNAVAILABLE = "in-memory log is unavailable (fault injected)"


class ArrivesDuringWait(MemoryLog):
    """A one-partition log on which a record arrives while a reader waits on it."""

    def __init__(self) -> None:
        super().__init__(default_partitions=1)
        self.waits: list[float] = []

    def wait(self, timeout: float) -> None:
        self.waits.append(timeout)
        self.append("t", b"k", b"late")


def two_partitions(first: int, second: int) -> MemoryLog:
    """Topic "t" with ``first`` records in partition 0 and ``second`` in partition 1."""
    log = MemoryLog(default_partitions=2)
    for i in range(first):
        log.append("t", b"k", f"a{i}".encode(), partition=0)
    for i in range(second):
        log.append("t", b"k", f"b{i}".encode(), partition=1)
    return log


# ------------------------------------------------------------------------------------------- the log


def test_a_topic_has_four_partitions_by_default() -> None:
    """Rule: a log built without a partition count creates a topic with 4 partitions, whether created
    outright, by the transport's partition count or by a first append."""
    log = MemoryLog()
    assert log.create("created") == 4
    assert MemoryTransport(log).partitions("counted") == 4
    m = log.append("appended", b"k", b"v")
    assert m.partition == zlib.crc32(b"k") % 4
    assert log.create("appended") == 4
    assert MemoryTransport().partitions("t") == 4


def test_an_unavailable_log_refuses_with_a_message_that_says_the_fault_was_injected() -> None:
    """Rule: while ``available`` is False, every append, watermark query and partition count (and so
    every produce and send) fails with TransportError("in-memory log is unavailable (fault
    injected)")."""
    log = MemoryLog()
    transport = MemoryTransport(log)
    log.available = False
    with pytest.raises(TransportError) as e:
        log.append("t", b"k", b"v")
    assert str(e.value) == UNAVAILABLE
    with pytest.raises(TransportError) as e:
        log.watermarks("t", 0)
    assert str(e.value) == UNAVAILABLE
    with pytest.raises(TransportError) as e:
        transport.partitions("t")
    assert str(e.value) == UNAVAILABLE
    with pytest.raises(TransportError) as e:
        transport.watermarks("t", 0)
    assert str(e.value) == UNAVAILABLE
    failed = transport.produce("t", b"k", b"v").exception(timeout=0)
    assert isinstance(failed, TransportError) and str(failed) == UNAVAILABLE
    reports: list[TransportError | None] = []
    transport.send("t", b"k", b"v", reports.append)
    assert len(reports) == 1 and isinstance(reports[0], TransportError)
    assert str(reports[0]) == UNAVAILABLE


def test_retention_before_offset_0_deletes_nothing() -> None:
    """Rule: truncating a partition before offset 0 (the first retention of a partition) leaves its
    low watermark at 0 and every record readable."""
    log = MemoryLog(default_partitions=1)
    for i in range(3):
        log.append("t", b"k", str(i).encode())
    log.truncate("t", 0, 0)
    assert log.watermarks("t", 0) == (0, 3)
    assert [m.offset for m in log.read("t", 0, 0, 10)] == [0, 1, 2]
    assert [m.offset for m in log.messages("t")] == [0, 1, 2]
    assert MemoryTransport(log).reader("t", {0: 0}).poll(10, 0) == [
        Message(b"k", b"0", 0, 0),
        Message(b"k", b"1", 0, 1),
        Message(b"k", b"2", 0, 2),
    ]
    log.truncate("t", 0, 1)
    assert log.watermarks("t", 0) == (1, 3)


# ---------------------------------------------------------------------------------------- the reader


def test_a_history_gap_names_the_topic_partition_position_and_low_watermark() -> None:
    """Rule: a reader behind retention raises HistoryGap naming the topic, the partition, the reader's
    position and the first retained offset."""
    log = two_partitions(1, 4)
    log.truncate("orders", 0, 0)  # another topic's retention does not matter
    log.truncate("t", 1, 3)
    reader = MemoryTransport(log).reader("t", {0: 1, 1: 2})
    with pytest.raises(HistoryGap) as gap:
        reader.poll(10, 0)
    assert (gap.value.topic, gap.value.partition, gap.value.position, gap.value.low) == ("t", 1, 2, 3)
    assert str(gap.value).startswith("t[1]: records from offset 2 were deleted")
    assert reader.positions() == {0: 1, 1: 2}


def test_a_poll_returns_at_most_the_messages_asked_for_across_partitions() -> None:
    """Rule: a poll for n messages takes them partition by partition, each partition only up to what is
    left of n: with 2 records in partition 0 and 5 in partition 1, a poll for 3 returns both of
    partition 0 and the first of partition 1, and the positions move past exactly those."""
    log = two_partitions(2, 5)
    reader = MemoryTransport(log).reader("t", {})
    assert reader.poll(3, 0) == [
        Message(b"k", b"a0", 0, 0),
        Message(b"k", b"a1", 0, 1),
        Message(b"k", b"b0", 1, 0),
    ]
    assert reader.positions() == {0: 2, 1: 1}
    assert [m.value for m in reader.poll(3, 0)] == [b"b1", b"b2", b"b3"]
    assert reader.positions() == {0: 2, 1: 4}


def test_a_full_batch_from_one_partition_ends_the_poll() -> None:
    """Rule: a poll for exactly what the first partition holds returns that partition's records and
    reads nothing of the next one."""
    log = two_partitions(2, 5)
    reader = MemoryTransport(log).reader("t", {})
    assert [m.value for m in reader.poll(2, 0)] == [b"a0", b"a1"]
    assert reader.positions() == {0: 2, 1: 0}


@pytest.mark.parametrize("asked", [0, -1])
def test_a_poll_for_no_messages_returns_none_and_moves_no_position(asked: int) -> None:
    """Rule: a poll for at most 0 messages (or fewer) returns none, and the positions stay."""
    log = two_partitions(2, 5)
    reader = MemoryTransport(log).reader("t", {})
    assert reader.poll(asked, 0) == []
    assert reader.positions() == {0: 0, 1: 0}


def test_a_poll_with_timeout_0_does_not_wait() -> None:
    """Rule: a poll with timeout 0 that finds nothing returns [] at once, without waiting on the log
    (a record that would arrive during a wait is not returned)."""
    log = ArrivesDuringWait()
    reader = MemoryTransport(log).reader("t", {})
    assert reader.poll(10, 0) == []
    assert log.waits == []
    assert reader.positions() == {0: 0}


def test_a_poll_that_finds_records_does_not_wait() -> None:
    """Rule: a poll with a timeout that finds records returns them without waiting on the log."""
    log = ArrivesDuringWait()
    log.append("t", b"k", b"early")
    reader = MemoryTransport(log).reader("t", {})
    assert reader.poll(10, 0.125) == [Message(b"k", b"early", 0, 0)]
    assert log.waits == []


def test_a_poll_that_finds_nothing_waits_its_timeout_and_returns_what_arrived() -> None:
    """Rule: a poll with a timeout > 0 (here below 1 second) that finds nothing waits on the log once,
    for that timeout, then returns what arrived meanwhile."""
    log = ArrivesDuringWait()
    reader = MemoryTransport(log).reader("t", {})
    assert reader.poll(10, 0.125) == [Message(b"k", b"late", 0, 0)]
    assert log.waits == [0.125]
    assert reader.positions() == {0: 1}


def test_a_poll_that_waits_in_vain_returns_an_empty_list() -> None:
    """Rule: a poll whose wait ends with nothing new returns [] (a list, not None)."""
    log = MemoryLog(default_partitions=1)
    reader = MemoryTransport(log).reader("t", {})
    assert reader.poll(10, 0.001) == []
    assert reader.positions() == {0: 0}


# ------------------------------------------------------------------------------------- the transport


def test_a_delivery_report_that_raises_is_logged_under_its_topic() -> None:
    """Rule: send's delivery report runs once per send; if it raises, the error is logged as
    ``delivery_report_failed`` naming the topic -- after a write and after a refusal alike -- and send
    returns normally."""
    log = MemoryLog()
    transport = MemoryTransport(log)
    seen: list[TransportError | None] = []

    def on_done(err: TransportError | None) -> None:
        seen.append(err)
        raise ValueError("report crashed")

    with structlog.testing.capture_logs() as logs:
        transport.send("orders", b"k", b"v", on_done)
        log.available = False
        transport.send("orders", b"k", b"v", on_done)
    assert seen[0] is None and isinstance(seen[1], TransportError) and len(seen) == 2
    assert [(e["event"], e["topic"], e["log_level"]) for e in logs] == [
        ("delivery_report_failed", "orders", "error"),
        ("delivery_report_failed", "orders", "error"),
    ]
    log.available = True
    assert [m.value for m in log.messages("orders")] == [b"v"]


def test_flush_has_nothing_pending() -> None:
    """Rule: the in-memory transport writes at once, so a flush finds 0 messages still pending."""
    transport = MemoryTransport()
    assert transport.flush(0) == 0
    transport.send("t", b"k", b"v", lambda err: None)
    transport.produce("t", b"k", b"v")
    assert transport.flush(0) == 0


def test_send_writes_the_key_and_value_to_the_key_s_partition() -> None:
    """Rule: ``send`` appends the record under its key, in the partition the key hashes to (crc32 % the
    partitions, as trimtab's Kafka producers do), and reports the delivery without an error."""
    t = MemoryTransport(MemoryLog())
    reports: list[object] = []
    t.send("ch", b"t/ns/0x00000000_0xffffffff", b"v", reports.append)
    part = zlib.crc32(b"t/ns/0x00000000_0xffffffff") % 4
    got = t.reader("ch", {}).poll(10, 0)
    assert [(m.key, m.value, m.partition, m.offset) for m in got] == [
        (b"t/ns/0x00000000_0xffffffff", b"v", part, 0)
    ]
    assert reports == [None]
