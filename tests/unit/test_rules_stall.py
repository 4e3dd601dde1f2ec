"""Rules of the stall watch (channel/stall.py) and of the follower that acts on it (channel/transport.py):
a partition with records that stay unfetched is reopened; an idle one, a moving one and an unreachable log
are not. The follower tests drive the follower's own thread with an injected clock and a reader that stops
returning records as a stalled Kafka client does."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.clock import ManualClock
from tests.support.logs import capture_logs
from tests.support.waiting import wait_for
from trimtab.channel.memory import MemoryLog, MemoryReader, MemoryTransport
from trimtab.channel.stall import STALL_AFTER_S, STALL_CHECK_S, StallWatch
from trimtab.channel.transport import Follower, Message
from trimtab.errors import TransportError

A = STALL_AFTER_S


class Ends:
    """``end_of`` for the watch: a fixed end per partition (None: unreadable), with every question kept."""

    def __init__(self, ends: dict[int, int | None]) -> None:
        self.ends = ends
        self.asked: list[int] = []

    def __call__(self, p: int) -> int | None:
        self.asked.append(p)
        return self.ends[p]


# ------------------------------------------------------------------------------------------ the watch
def test_a_partition_behind_its_end_and_unmoved_for_twice_the_interval_is_stalled() -> None:
    w, ends = StallWatch(), Ends({0: 7})
    assert w.check({0: 5}, 0.0, ends) == {}
    assert ends.asked == []  # not asked before the position has been unmoved for the interval
    assert w.check({0: 5}, A, ends) == {}
    assert ends.asked == [0]  # asked now: found behind
    assert w.check({0: 5}, 2 * A - 0.001, ends) == {}
    assert w.check({0: 5}, 2 * A, ends) == {0: (5, 7)}
    assert ends.asked == [0]  # the end read once is the one the stall is judged against


def test_a_partition_read_to_its_end_is_idle_and_asked_again_only_after_the_interval() -> None:
    w, ends = StallWatch(), Ends({0: 5})
    w.check({0: 5}, 0.0, ends)
    for t in (A, A + 1, 2 * A - 0.001, 2 * A, 3 * A, 10 * A):
        assert w.check({0: 5}, t, ends) == {}
    assert ends.asked == [0, 0, 0, 0]  # at A, 2A, 3A and 10A


def test_a_position_that_moves_is_never_stalled_however_far_behind_it_is() -> None:
    w, ends = StallWatch(), Ends({0: 1_000_000})
    for i in range(50):
        assert w.check({0: i}, i * A, ends) == {}
    assert ends.asked == []


def test_a_move_after_the_end_was_read_starts_the_clock_again() -> None:
    w, ends = StallWatch(), Ends({0: 9})
    w.check({0: 5}, 0.0, ends)
    w.check({0: 5}, A, ends)  # behind
    assert w.check({0: 6}, 2 * A - 1, ends) == {}  # moved: no longer judged against the old end
    assert w.check({0: 6}, 2 * A, ends) == {}
    assert w.check({0: 6}, 3 * A - 1, ends) == {}  # asked again at 3A - 1 (unmoved for the interval)
    assert w.check({0: 6}, 4 * A - 1, ends) == {0: (6, 9)}


def test_an_unreadable_end_is_no_stall_and_the_other_partitions_are_not_asked_that_round() -> None:
    w, ends = StallWatch(), Ends({0: None, 1: 9, 2: 9})
    w.check({0: 1, 1: 1, 2: 1}, 0.0, ends)
    assert w.check({0: 1, 1: 1, 2: 1}, A, ends) == {}
    assert ends.asked == [0]  # one bounded question per round while the log is unreachable
    for t in (A + STALL_CHECK_S, 2 * A - 0.001):
        assert w.check({0: 1, 1: 1, 2: 1}, t, ends) == {}
    assert ends.asked == [0]  # not asked again before the interval passed
    ends.ends[0] = 1
    w.check({0: 1, 1: 1, 2: 1}, 2 * A, ends)
    assert ends.asked == [0, 0, 1, 2]
    assert w.check({0: 1, 1: 1, 2: 1}, 3 * A, ends) == {1: (1, 9), 2: (1, 9)}


def test_only_the_stalled_partitions_are_named() -> None:
    w, ends = StallWatch(), Ends({0: 5, 1: 9})
    for t in (0.0, A, 2 * A):
        got = w.check({0: 5, 1: 3}, t, ends)
    assert got == {1: (3, 9)}


def test_reset_starts_every_clock_again() -> None:
    w, ends = StallWatch(), Ends({0: 9})
    w.check({0: 5}, 0.0, ends)
    w.check({0: 5}, A, ends)
    w.reset()
    assert w.check({0: 5}, 2 * A, ends) == {}
    assert w.check({0: 5}, 3 * A - 0.001, ends) == {}
    assert w.check({0: 5}, 3 * A, ends) == {}  # behind again: judged A later
    assert w.check({0: 5}, 4 * A, ends) == {0: (5, 9)}


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[float, int, int | None]]:
    """Checks of one partition: (seconds since the last check, position, end or None)."""
    steps = draw(st.lists(st.tuples(st.floats(0, 3 * A), st.integers(0, 3), st.integers(0, 3)), max_size=40))
    out: list[tuple[float, int, int | None]] = []
    pos = 0
    for dt, move, ahead in steps:
        pos += move if draw(st.booleans()) else 0
        end = None if ahead == 3 and draw(st.booleans()) else pos + ahead
        out.append((dt, pos, end))
    return out


@settings(max_examples=300, deadline=None)
@given(histories())
def test_a_stall_is_reported_only_when_an_end_read_long_enough_ago_is_unreached_by_an_unmoved_position(
    history: list[tuple[float, int, int | None]],
) -> None:
    w = StallWatch()
    now = 0.0
    reads: list[tuple[float, int]] = []  # (when, end) of every end the watch read
    moved_at = 0.0
    last_pos: int | None = None
    for dt, pos, end in history:
        now += dt
        if pos != last_pos:
            moved_at, last_pos = now, pos
        asked: list[int] = []

        def end_of(p: int, end: int | None = end, asked: list[int] = asked) -> int | None:
            asked.append(p)
            return end

        got = w.check({0: pos}, now, end_of)
        if asked and end is not None:
            reads.append((now, end))
        # never asked about a partition that moved within the interval
        if asked:
            assert now - moved_at >= A
        if got:
            assert got == {0: (pos, got[0][1])}
            # an end beyond the position, read at least A ago, after the position's last move
            assert any(e == got[0][1] and e > pos and t >= moved_at and now - t >= A for t, e in reads)
            assert now - moved_at >= 2 * A


# ------------------------------------------------------------------------------------------ the follower
class StallingTransport(MemoryTransport):
    """Readers that stop returning records once stalled (``stall_now``: the newest reader), as a Kafka
    client that stopped fetching; every reader opened, every poll and every end asked are kept."""

    def __init__(self, log: MemoryLog) -> None:
        super().__init__(log)
        self.stalled_readers: set[int] = set()
        self.stalled = threading.Event()  # a poll has returned nothing because of the stall
        self.readers: list[tuple[dict[int, int], MemoryReader]] = []
        self.ends_asked = 0
        self.polls = 0
        self.unreachable = False
        self.unreachable_error: Exception = TransportError("unreachable")
        self.cond = threading.Condition()

    def watermarks(self, topic: str, partition: int, *, timeout_s: float = 10.0) -> tuple[int, int]:
        with self.cond:
            self.ends_asked += 1
            self.cond.notify_all()
        if self.unreachable:
            raise self.unreachable_error
        return super().watermarks(topic, partition, timeout_s=timeout_s)

    def reader(self, topic: str, start: dict[int, int], *, low_latency: bool = True) -> MemoryReader:
        index = len(self.readers)
        owner = self

        class Stalling(MemoryReader):
            def poll(self, max_messages: int, timeout: float) -> list[Message]:
                with owner.cond:
                    owner.polls += 1
                    owner.cond.notify_all()
                if index in owner.stalled_readers:
                    owner.stalled.set()
                    time.sleep(0.01)  # a poll that waits and returns nothing, as a stalled client's
                    return []
                return super().poll(max_messages, timeout)

        r = Stalling(self.log, topic, {p: start.get(p, 0) for p in range(self.partitions(topic))})
        self.readers.append((dict(start), r))
        return r

    def stall_now(self) -> None:
        """Stall the newest reader, and return once a poll of it has seen the stall: a record appended
        after this is not read by a poll already under way."""
        self.stalled.clear()
        self.stalled_readers.add(len(self.readers) - 1)
        assert self.stalled.wait(10)

    def wait_ends_asked(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.ends_asked >= n, 10), (self.ends_asked, n)

    def wait_polls(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.polls >= n, 10), (self.polls, n)


@pytest.fixture
def setup() -> Iterator[tuple[MemoryLog, StallingTransport, ManualClock, list[Message], list[int], Follower]]:
    log = MemoryLog()
    log.create("t", 2)
    for i in range(3):
        log.append("t", b"k", f"v{i}".encode(), partition=0)
    transport = StallingTransport(log)
    clock = ManualClock()
    applied: list[Message] = []
    stalls: list[int] = []
    f = Follower(
        transport,
        "t",
        applied.extend,
        start={0: 0, 1: 0},
        on_stall=lambda: stalls.append(1),
        mono=clock,
    )
    f.start()
    assert f.wait_ready(10)
    transport.ends_asked = 0  # the follower's start read the ends: only the watch's questions count
    yield log, transport, clock, applied, stalls, f
    f.stop()


def test_a_stalled_reader_is_reopened_at_the_applied_positions_and_the_records_are_read(
    setup: tuple[MemoryLog, StallingTransport, ManualClock, list[Message], list[int], Follower],
) -> None:
    log, transport, clock, applied, stalls, f = setup
    transport.stall_now()
    with capture_logs() as logs:
        for i in range(3, 5):
            log.append("t", b"k", f"v{i}".encode(), partition=0)
        clock.advance(A)
        transport.wait_ends_asked(1)  # partition 0 found behind its end (5 > 3)
        clock.advance(A)
        wait_for(lambda: len(applied) == 5, 10, message="the records after the stall read")
    assert [m.value for m in applied] == [f"v{i}".encode() for i in range(5)]
    assert len(transport.readers) == 2
    assert transport.readers[1][0] == {0: 3, 1: 0}  # the positions already applied, nothing skipped
    assert f.stalls == 1 and stalls == [1]
    [event] = [e for e in logs if e["event"] == "follower_stalled"]
    assert {k: v for k, v in event.items() if k not in ("log_level", "timestamp")} == {
        "event": "follower_stalled",
        "topic": "t",
        "partitions": {0: {"position": 3, "end": 5}},
        "stalled_s": A,
        "stalls": 1,
        "action": "reopening the reader at the applied positions",
    }
    assert f.running


def test_every_stall_is_counted(
    setup: tuple[MemoryLog, StallingTransport, ManualClock, list[Message], list[int], Follower],
) -> None:
    log, transport, clock, applied, stalls, f = setup
    for n in (1, 2):
        transport.stall_now()
        log.append("t", b"k", f"more{n}".encode(), partition=1)
        for _ in range(4):  # seen (the watch starts again after a reopen), idle and asked, stalled
            if len(applied) == 3 + n:
                break
            clock.advance(A)
            transport.wait_polls(transport.polls + 3)  # a whole turn of the loop at this time
        wait_for(lambda n=n: len(applied) == 3 + n, 10, message=f"the records after stall {n} read")
    assert f.stalls == 2 and stalls == [1, 1] and len(transport.readers) == 3


def test_the_watch_runs_once_per_check_interval_not_on_every_poll(
    setup: tuple[MemoryLog, StallingTransport, ManualClock, list[Message], list[int], Follower],
) -> None:
    _, transport, clock, _, _, f = setup
    checks: list[float] = []
    check = f._watch.check

    def counted(positions: Any, now: float, end_of: Any) -> dict[int, tuple[int, int]]:
        checks.append(now)
        return check(positions, now, end_of)

    f._watch.check = counted  # type: ignore[method-assign]
    clock.advance(STALL_CHECK_S)
    transport.wait_polls(transport.polls + 20)  # many polls at one instant of the clock
    assert checks == [STALL_CHECK_S]
    clock.advance(STALL_CHECK_S - 0.001)
    transport.wait_polls(transport.polls + 20)
    assert checks == [STALL_CHECK_S]
    clock.advance(0.001)
    wait_for(lambda: len(checks) == 2, 10, message="the next check")


def test_an_idle_follower_read_to_its_end_is_never_reopened(
    setup: tuple[MemoryLog, StallingTransport, ManualClock, list[Message], list[int], Follower],
) -> None:
    _, transport, clock, _, stalls, f = setup
    for n in (2, 4, 6):  # both partitions asked, three rounds
        clock.advance(A)
        transport.wait_ends_asked(n)
    assert len(transport.readers) == 1 and f.stalls == 0 and stalls == []


def test_an_unreachable_log_is_no_stall(
    setup: tuple[MemoryLog, StallingTransport, ManualClock, list[Message], list[int], Follower],
) -> None:
    log, transport, clock, _, _, f = setup
    transport.stall_now()
    log.append("t", b"k", b"v3", partition=0)
    transport.unreachable = True
    for n in (1, 2, 3):  # one question a round, each unanswered
        clock.advance(A)
        transport.wait_ends_asked(n)
    assert len(transport.readers) == 1 and f.stalls == 0


def test_an_end_question_that_raises_anything_is_no_stall_and_never_stops_the_follower(
    setup: tuple[MemoryLog, StallingTransport, ManualClock, list[Message], list[int], Follower],
) -> None:
    log, transport, clock, applied, _, f = setup
    transport.unreachable_error = RuntimeError("Consumer closed")  # a client closed under the question
    transport.unreachable = True
    for n in (1, 2, 3):
        clock.advance(A)
        transport.wait_ends_asked(n)
    log.append("t", b"k", b"v3", partition=0)
    wait_for(lambda: len(applied) == 4, 10, message="the follower still reading")
    assert f.running and f.error is None and f.stalls == 0


def test_reopening_is_how_the_follower_fails_when_no_reader_can_be_opened(
    setup: tuple[MemoryLog, StallingTransport, ManualClock, list[Message], list[int], Follower],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log, transport, clock, _, _, f = setup
    errors: list[BaseException] = []
    f._on_error = errors.append

    def refuse(*a: Any, **k: Any) -> Any:
        raise TransportError("no reader")

    transport.stall_now()
    log.append("t", b"k", b"v3", partition=0)
    monkeypatch.setattr(transport, "reader", refuse)
    clock.advance(A)
    transport.wait_ends_asked(1)
    clock.advance(A)
    wait_for(lambda: errors, 10, message="the failure reported")
    assert isinstance(errors[0], TransportError) and f.error is errors[0]
    wait_for(lambda: not f.running, 10, message="the follower stopped")
