"""Follower and delivery-report rules that the round-trip tests leave loose (channel/transport.py;
docs/testing.md).

A :class:`Follower` replays one topic into a table: where it starts in each partition, when it is ready
(and what it logs then), how it waits on the reader before and after that, what it records and logs when
it fails (a history gap or anything else) and whom it tells, and how its thread starts and stops.
:func:`report` hands a delivery report to its callback and logs what that raises. Everything runs over
the in-memory log; a transport wrapper records what the follower asks of the reader. Threads are waited
on with deadlines, never with sleeps, and every follower started is stopped.
"""

from __future__ import annotations

import threading
import time
import types
from concurrent.futures import Future
from typing import Any

import pytest

import trimtab.channel.transport as transport_module
from tests.support.logs import capture_logs
from tests.support.waiting import wait_for
from trimtab.channel.memory import MemoryLog, MemoryReader, MemoryTransport
from trimtab.channel.transport import Follower, Message, Reader, report
from trimtab.errors import HistoryGap, TransportError

DEADLINE = 10.0  # generous: only reached when something is broken

GAP_HINT = (
    "records were deleted by retention before this node read them; raise retention or snapshot more often"
)


class Applied:
    """Collects what a follower applies, and the thread it was applied on."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.cond = threading.Condition()
        self.threads: list[threading.Thread] = []

    def __call__(self, batch: list[Message]) -> None:
        with self.cond:
            self.threads.append(threading.current_thread())
            self.messages.extend(batch)
            self.cond.notify_all()

    def offsets(self) -> list[tuple[int, int]]:
        with self.cond:
            return sorted((m.partition, m.offset) for m in self.messages)

    def wait_for(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.messages) >= n, DEADLINE), (len(self.messages), n)


class RecordingReader:
    """A reader that records every poll: (ready when polled, max_messages, timeout)."""

    def __init__(self, inner: Reader, owner: RecordingTransport) -> None:
        self._inner = inner
        self._owner = owner

    def poll(self, max_messages: int, timeout: float) -> list[Message]:
        follower = self._owner.follower
        ready = follower is not None and follower.ready.is_set()
        with self._owner.cond:
            self._owner.polls.append((ready, max_messages, timeout))
            self._owner.cond.notify_all()
        return self._inner.poll(max_messages, timeout)

    def positions(self) -> dict[int, int]:
        return self._inner.positions()

    def close(self) -> None:
        self._inner.close()


class RecordingTransport(MemoryTransport):
    """The in-memory transport, recording the readers asked for and every poll of them."""

    def __init__(self, log: MemoryLog) -> None:
        super().__init__(log)
        self.readers: list[tuple[str, dict[int, int], Any]] = []
        self.polls: list[tuple[bool, int, float]] = []
        self.cond = threading.Condition()
        self.follower: Follower | None = None

    def polled_when_ready(self) -> bool:
        return any(ready for ready, _, _ in self.polls)

    def reader(  # type: ignore[override]
        self, topic: str, start: dict[int, int], *, low_latency: Any = "not passed"
    ) -> RecordingReader:
        self.readers.append((topic, dict(start), low_latency))
        return RecordingReader(super().reader(topic, start), self)


class MarkerTransport(MemoryTransport):
    """Every partition ends in a transaction marker: the high watermark is one past the last record, and
    a reader that has read every record is positioned past the marker without returning anything."""

    def watermarks(self, topic: str, partition: int, *, timeout_s: float = 10.0) -> tuple[int, int]:
        low, high = self.log.watermarks(topic, partition)
        return low, high + 1

    def reader(self, topic: str, start: dict[int, int], *, low_latency: bool = True) -> MemoryReader:
        log = self.log

        class PastMarkers(MemoryReader):
            def positions(self) -> dict[int, int]:
                return {
                    p: o + 1 if o >= log.watermarks(topic, p)[1] else o
                    for p, o in super().positions().items()
                }

        return PastMarkers(log, topic, {p: start.get(p, 0) for p in range(self.partitions(topic))})


def run(followers: list[Follower], f: Follower) -> Follower:
    followers.append(f)
    f.start()
    return f


def fill(log: MemoryLog, topic: str, counts: list[int]) -> None:
    """``counts[p]`` records in partition ``p`` of ``topic`` (created with len(counts) partitions)."""
    log.create(topic, len(counts))
    for p, n in enumerate(counts):
        for i in range(n):
            log.append(topic, f"k{p}".encode(), f"{p}/{i}".encode(), partition=p)


class Failures:
    """Collects the on_gap and on_error callbacks of a follower; ``done`` is set by either."""

    def __init__(self) -> None:
        self.gaps: list[HistoryGap] = []
        self.errors: list[BaseException] = []
        self.done = threading.Event()

    def on_gap(self, e: HistoryGap) -> None:
        self.gaps.append(e)
        self.done.set()

    def on_error(self, e: BaseException) -> None:
        self.errors.append(e)
        self.done.set()


# ------------------------------------------------------------------------------------------ report


def test_a_delivery_report_is_given_to_its_callback_and_nothing_is_logged() -> None:
    """Rule: report calls on_done with the error (or None) it is given, and logs nothing when on_done
    returns."""
    got: list[TransportError | None] = []
    err = TransportError("gone")
    with capture_logs() as logs:
        report(got.append, err, "t")
        report(got.append, None, "t")
    assert got == [err, None] and got[0] is err
    assert logs == []


def test_what_a_delivery_report_raises_is_logged_with_its_topic_and_not_raised() -> None:
    """Rule: an exception raised by on_done is not passed on; it is logged as the error
    ``delivery_report_failed`` with the topic and the exception."""

    def on_done(err: TransportError | None) -> None:
        raise ValueError("callback broke")

    with capture_logs() as logs:
        report(on_done, None, "the-topic")
    assert logs == [
        {"event": "delivery_report_failed", "log_level": "error", "topic": "the-topic", "exc_info": True}
    ]


# ------------------------------------------------------------------------------------ construction


def test_a_new_follower_has_no_positions_no_thread_and_its_creation_as_last_activity() -> None:
    """Rule: before start a follower has empty positions and high watermarks, no lag, is not running
    (stopping it is a no-op), and its last activity is the monotonic time it was made."""
    before = time.monotonic()
    f = Follower(MemoryTransport(), "t", Applied())
    after = time.monotonic()
    assert f.positions == {} and f.highwater == {} and f.lag() == 0 and f.records == 0
    assert isinstance(f.last_activity, float) and before <= f.last_activity <= after
    assert f.running is False
    f.stop()
    assert f.running is False
    assert f.error is None and f.gap is None and not f.history_gap and not f.ready.is_set()


def test_a_follower_is_named_after_its_topic_unless_given_a_name(followers: list[Follower]) -> None:
    """Rule: a follower's name is its ``name``, else its topic; its thread is the daemon thread
    ``follow-<name>`` and every batch is applied on it."""
    log = MemoryLog()
    fill(log, "t", [1])
    plain, named = Applied(), Applied()
    a = run(followers, Follower(MemoryTransport(log), "t", plain))
    b = run(followers, Follower(MemoryTransport(log), "t", named, name="n"))
    assert (a.name, b.name) == ("t", "n")
    plain.wait_for(1)
    named.wait_for(1)
    assert [(t.name, t.daemon) for t in plain.threads] == [("follow-t", True)]
    assert [(t.name, t.daemon) for t in named.threads] == [("follow-n", True)]
    assert a.running and b.running


def test_wait_ready_returns_false_once_its_timeout_passes() -> None:
    """Rule: wait_ready(timeout) waits at most ``timeout`` seconds for readiness and then answers False;
    once ready it answers True."""
    f = Follower(MemoryTransport(), "t", Applied())
    answers: list[bool] = []
    waiter = threading.Thread(target=lambda: answers.append(f.wait_ready(0.0)), daemon=True)
    try:
        waiter.start()
        waiter.join(DEADLINE)
        assert answers == [False]
    finally:
        f.ready.set()  # releases the waiter should wait_ready ignore its timeout
        waiter.join(DEADLINE)
    assert f.wait_ready(0.0) is True


# ------------------------------------------------------------------------------------ where it reads


def test_the_reader_is_opened_on_the_topic_at_the_start_positions_with_low_latency_by_default(
    followers: list[Follower],
) -> None:
    """Rule: the follower opens one reader on its topic at its start positions, passing ``low_latency``
    (True unless told otherwise)."""
    log = MemoryLog()
    fill(log, "t", [2, 1])
    default, slow = RecordingTransport(log), RecordingTransport(log)
    a = run(followers, Follower(default, "t", Applied(), start={0: 1}))
    b = run(followers, Follower(slow, "t", Applied(), start={0: 1}, low_latency=False))
    assert a.wait_ready(DEADLINE) and b.wait_ready(DEADLINE)
    assert default.readers == [("t", {0: 1, 1: 0}, True)]
    assert slow.readers == [("t", {0: 1, 1: 0}, False)]


def test_a_partition_missing_from_the_start_positions_is_read_from_offset_0(
    followers: list[Follower],
) -> None:
    """Rule: with explicit start positions, each partition starts at its own position, and one without
    a position starts at offset 0 (not at another partition's position)."""
    log = MemoryLog()
    fill(log, "t", [4, 3])
    applied = Applied()
    f = run(followers, Follower(MemoryTransport(log), "t", applied, start={0: 2}))
    assert f.wait_ready(DEADLINE)
    assert applied.offsets() == [(0, 2), (0, 3), (1, 0), (1, 1), (1, 2)]
    assert f.positions == {0: 4, 1: 3} and f.highwater == {0: 4, 1: 3} and f.records == 5


def test_a_truncated_partition_missing_from_the_start_positions_is_a_history_gap(
    followers: list[Follower],
) -> None:
    """Rule: a partition without a start position starts at 0, so one whose first retained offset is 1
    is a history gap at 0."""
    log = MemoryLog()
    fill(log, "t", [2, 2])
    log.truncate("t", 1, 1)
    failures = Failures()
    run(followers, Follower(MemoryTransport(log), "t", Applied(), start={0: 0}, on_gap=failures.on_gap))
    assert failures.done.wait(DEADLINE)
    assert [(g.topic, g.partition, g.position, g.low) for g in failures.gaps] == [("t", 1, 0, 1)]


def test_every_partition_of_the_followed_topic_is_read(followers: list[Follower]) -> None:
    """Rule: the follower reads as many partitions as its topic has (not the log's default count)."""
    log = MemoryLog(default_partitions=1)
    fill(log, "t", [1, 2, 1])
    applied = Applied()
    f = run(followers, Follower(MemoryTransport(log), "t", applied))
    assert f.wait_ready(DEADLINE)
    assert applied.offsets() == [(0, 0), (1, 0), (1, 1), (2, 0)]
    assert f.highwater == {0: 1, 1: 2, 2: 1}


def test_a_start_beyond_the_end_is_refused_with_the_partition_the_position_and_the_end(
    followers: list[Follower],
) -> None:
    """Rule: a start position past a partition's high watermark is a TransportError naming the topic,
    partition, position and end, suspecting a re-created topic; it goes to on_error and ``error``."""
    log = MemoryLog()
    fill(log, "t", [1, 1])
    failures = Failures()
    f = run(
        followers,
        Follower(MemoryTransport(log), "t", Applied(), start={0: 1, 1: 3}, on_error=failures.on_error),
    )
    assert failures.done.wait(DEADLINE)
    assert failures.errors == [f.error] and isinstance(f.error, TransportError)
    assert str(f.error) == (
        "t[1]: start position 3 is beyond the end (1); was the topic re-created? refusing to guess"
    )


def test_lag_counts_a_partition_without_a_position_from_offset_0(followers: list[Follower]) -> None:
    """Rule: lag is the sum over the high watermarks seen of what lies past the position, a partition
    without a position counting from 0: after a refusal at start (partition 1 here), the partitions
    checked before it count in full."""
    log = MemoryLog()
    fill(log, "t", [3, 1])
    failures = Failures()
    f = run(
        followers,
        Follower(MemoryTransport(log), "t", Applied(), start={0: 0, 1: 5}, on_error=failures.on_error),
    )
    assert failures.done.wait(DEADLINE)
    assert f.highwater == {0: 3} and f.positions == {}
    assert f.lag() == 3


# -------------------------------------------------------------------------------------- readiness


def test_readiness_is_logged_with_the_topic_the_records_applied_and_the_positions(
    followers: list[Follower],
) -> None:
    """Rule: on reaching the high watermarks seen at start the follower logs ``follower_ready`` (info)
    with its topic (not its name), the number of records applied and its positions."""
    log = MemoryLog()
    fill(log, "t", [3, 2])
    with capture_logs() as logs:
        f = run(followers, Follower(MemoryTransport(log), "t", Applied(), start={0: 1}, name="n"))
        assert f.wait_ready(DEADLINE)
    assert logs == [
        {
            "event": "follower_ready",
            "log_level": "info",
            "topic": "t",
            "records": 4,
            "positions": {0: 3, 1: 2},
        }
    ]


def test_a_follower_is_ready_when_its_reader_passes_the_end_without_a_record(
    followers: list[Follower],
) -> None:
    """Rule: before ready, the positions are taken from the reader after every poll, also one that
    returned nothing: a reader past a trailing transaction marker makes the follower ready."""
    transport = MarkerTransport(MemoryLog(default_partitions=1))
    applied = Applied()
    f = run(followers, Follower(transport, "t", applied))
    assert f.wait_ready(DEADLINE)
    assert f.highwater == {0: 1} and f.positions == {0: 1} and f.lag() == 0 and applied.messages == []


def test_after_ready_each_batch_advances_the_positions_records_and_last_activity(
    followers: list[Follower],
) -> None:
    """Rule: once ready, every batch applied moves the positions past it, adds to ``records`` and sets
    ``last_activity`` to the monotonic time."""
    log = MemoryLog()
    fill(log, "t", [1, 0])
    applied = Applied()
    f = run(followers, Follower(MemoryTransport(log), "t", applied))
    assert f.wait_ready(DEADLINE)
    before = time.monotonic()
    log.append("t", b"k", b"x", partition=1)
    log.append("t", b"k", b"y", partition=1)
    wait_for(lambda: f.positions == {0: 1, 1: 2}, DEADLINE, message=lambda: f"positions {f.positions}")
    assert applied.offsets() == [(0, 0), (1, 0), (1, 1)] and f.records == 3
    assert isinstance(f.last_activity, float) and f.last_activity >= before
    assert f.highwater == {0: 1, 1: 0} and f.lag() == 0


def test_polls_ask_for_a_batch_and_wait_10_ms_before_ready_and_50_ms_after(
    followers: list[Follower],
) -> None:
    """Rule: the follower polls for ``batch`` messages (5000 by default), waiting 0.01 s per poll while
    catching up and 0.05 s once ready."""
    log = MemoryLog()
    fill(log, "t", [3])
    default, small = RecordingTransport(log), RecordingTransport(log)
    default.follower = Follower(default, "t", Applied())
    small.follower = Follower(small, "t", Applied(), batch=2)
    for transport in (default, small):
        assert transport.follower is not None
        run(followers, transport.follower)
        with transport.cond:
            assert transport.cond.wait_for(transport.polled_when_ready, DEADLINE)
    for transport, batch in ((default, 5000), (small, 2)):
        with transport.cond:
            polls = list(transport.polls)
        assert {(r, n, t) for r, n, t in polls} == {(False, batch, 0.01), (True, batch, 0.05)}


# ---------------------------------------------------------------------------------------- failures


def test_a_history_gap_is_logged_recorded_and_given_to_on_gap_only(followers: list[Follower]) -> None:
    """Rule: a history gap is logged as the error ``history_gap`` with its topic, partition, position,
    first retained offset and the hint; it is kept in ``gap`` and given to on_gap, and then neither
    ``error`` nor on_error learn of it."""
    log = MemoryLog()
    fill(log, "t", [0, 6])
    log.truncate("t", 1, 4)
    failures = Failures()
    with capture_logs() as logs:
        f = run(
            followers,
            Follower(
                MemoryTransport(log),
                "t",
                Applied(),
                start={1: 2},
                on_gap=failures.on_gap,
                on_error=failures.on_error,
            ),
        )
        assert failures.done.wait(DEADLINE)
        wait_for(lambda: not f.running, DEADLINE, message="the follower's thread to end")
    assert logs == [
        {
            "event": "history_gap",
            "log_level": "error",
            "topic": "t",
            "partition": 1,
            "position": 2,
            "low_watermark": 4,
            "hint": GAP_HINT,
        }
    ]
    assert failures.gaps == [f.gap] and failures.errors == []
    assert f.gap is not None and (f.gap.topic, f.gap.partition, f.gap.position, f.gap.low) == ("t", 1, 2, 4)
    assert f.history_gap and f.error is None and not f.ready.is_set()


def test_a_history_gap_without_on_gap_goes_to_on_error(followers: list[Follower]) -> None:
    """Rule: without on_gap, a history gap is also the follower's ``error`` and is given to on_error."""
    log = MemoryLog()
    fill(log, "t", [3])
    log.truncate("t", 0, 2)
    failures = Failures()
    f = run(
        followers, Follower(MemoryTransport(log), "t", Applied(), start={0: 1}, on_error=failures.on_error)
    )
    assert failures.done.wait(DEADLINE)
    assert failures.errors == [f.error] and f.error is f.gap and isinstance(f.gap, HistoryGap)
    assert (f.gap.topic, f.gap.partition, f.gap.position, f.gap.low) == ("t", 0, 1, 2)


def test_any_other_failure_is_logged_with_the_topic_and_the_error_and_given_to_on_error(
    followers: list[Follower],
) -> None:
    """Rule: a failure that is not a history gap is logged as the error ``follower_failed`` with the
    topic (not the name), the error's repr and the exception itself; it becomes ``error`` and goes to
    on_error, never to on_gap."""
    log = MemoryLog()
    fill(log, "t", [1])
    boom = ValueError("boom")

    def apply(batch: list[Message]) -> None:
        raise boom

    failures = Failures()
    with capture_logs() as logs:
        f = run(
            followers,
            Follower(
                MemoryTransport(log), "t", apply, name="n", on_gap=failures.on_gap, on_error=failures.on_error
            ),
        )
        assert failures.done.wait(DEADLINE)
        wait_for(lambda: not f.running, DEADLINE, message="the follower's thread to end")
    assert len(logs) == 1 and logs[0]["exc_info"] is boom
    assert logs == [
        {
            "event": "follower_failed",
            "log_level": "error",
            "topic": "t",
            "error": "ValueError('boom')",
            "exc_info": boom,
        }
    ]
    assert failures.errors == [boom] and failures.gaps == [] and f.error is boom and f.gap is None


def test_a_failure_without_on_error_is_kept_in_error() -> None:
    """Rule: without callbacks, a failure at start is still kept in ``error`` and ends the thread."""
    log = MemoryLog()
    fill(log, "t", [1])
    log.available = False
    f = Follower(MemoryTransport(log), "t", Applied())
    try:
        f.start()
        wait_for(lambda: f.error is not None, DEADLINE, message="the follower's error")
        wait_for(lambda: not f.running, DEADLINE, message="the follower's thread to end")
    finally:
        f.stop()
    assert isinstance(f.error, TransportError) and not f.ready.is_set()


# ------------------------------------------------------------------------------------------- stop


class Joins:
    """Threads that record every join: (the joining thread, timeout)."""

    def __init__(self) -> None:
        self.calls: list[tuple[threading.Thread, float | None]] = []
        joins = self

        class RecordingThread(threading.Thread):
            def join(self, timeout: float | None = None) -> None:
                joins.calls.append((threading.current_thread(), timeout))
                super().join(timeout)

        self.namespace = types.SimpleNamespace(
            Thread=RecordingThread, Event=threading.Event, current_thread=threading.current_thread
        )


@pytest.fixture
def joins(monkeypatch: pytest.MonkeyPatch) -> Joins:
    recorded = Joins()
    monkeypatch.setattr(transport_module, "threading", recorded.namespace)
    return recorded


def test_stop_waits_for_the_thread_at_most_5_seconds_by_default(
    followers: list[Follower], joins: Joins
) -> None:
    """Rule: stop() from another thread ends the loop and joins the follower's thread with a timeout of
    5 s (or the one given); the thread has ended when it returns."""
    log = MemoryLog()
    fill(log, "t", [1])
    a = run(followers, Follower(MemoryTransport(log), "t", Applied()))
    b = run(followers, Follower(MemoryTransport(log), "t", Applied()))
    assert a.wait_ready(DEADLINE) and b.wait_ready(DEADLINE)
    a.stop()
    b.stop(DEADLINE / 2)
    me = threading.current_thread()
    assert joins.calls == [(me, 5.0), (me, DEADLINE / 2)]
    assert not a.running and not b.running


def test_stop_from_the_followers_own_thread_does_not_join_it(followers: list[Follower], joins: Joins) -> None:
    """Rule: stop() called on the follower's thread (from apply) only asks the loop to end: it does not
    join its own thread, and the follower ends without an error after that batch."""
    log = MemoryLog()
    fill(log, "t", [1])
    holder: list[Follower] = []
    called = threading.Event()

    def apply(batch: list[Message]) -> None:
        holder[0].stop()
        called.set()

    failures = Failures()
    f = Follower(MemoryTransport(log), "t", apply, on_error=failures.on_error)
    holder.append(f)
    run(followers, f)
    assert called.wait(DEADLINE)
    wait_for(lambda: not f.running, DEADLINE, message="the follower's thread to end")
    assert joins.calls == [] and f.error is None and failures.errors == [] and f.records == 1


def test_produce_after_stop_is_not_applied(followers: list[Follower]) -> None:
    """Rule: once stop() has returned, nothing written later is applied."""
    log = MemoryLog()
    fill(log, "t", [1])
    applied = Applied()
    f = run(followers, Follower(MemoryTransport(log), "t", applied))
    assert f.wait_ready(DEADLINE)
    f.stop()
    assert not f.running
    fut: Future[Message] = MemoryTransport(log).produce("t", b"k", b"late", partition=0)
    assert fut.result(DEADLINE).offset == 1
    assert applied.offsets() == [(0, 0)] and f.records == 1
