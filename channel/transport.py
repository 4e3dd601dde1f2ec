"""The small interface every log transport implements (in-memory for tests and the simulator, Kafka for
everything else), and the follower that turns a topic into a caught-up, live-updating view.

A transport knows four things: how many partitions a topic has (creating it if the backend auto-creates),
its watermarks, how to append, and how to read a partition range from a position. Everything else (catch-
up, readiness, positions, lag) is written once, in :class:`Follower`, on top of that interface.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import NamedTuple, Protocol

import structlog

from trimtab.channel.stall import STALL_AFTER_S, STALL_CHECK_S, StallWatch
from trimtab.errors import HistoryGap, TransportError

log = structlog.get_logger("trimtab.channel")


class Message(NamedTuple):
    key: bytes | None
    value: bytes | None
    partition: int
    offset: int


#: A delivery report of :meth:`Transport.send`: None once written, else why not.
Delivered = Callable[[TransportError | None], object]


def report(on_done: Delivered, err: TransportError | None, topic: str) -> None:
    """Give ``on_done`` its delivery report. Whatever it raises is logged, never passed on: the report
    runs on the producer's delivery thread, which must go on serving every other record's report."""
    try:
        on_done(err)
    except Exception:
        log.exception("delivery_report_failed", topic=topic)


class Reader(Protocol):
    def poll(self, max_messages: int, timeout: float) -> list[Message]:
        """Up to ``max_messages`` messages in per-partition order; [] after ``timeout`` seconds.
        Raises :class:`HistoryGap` when the next record to read was deleted, never skips ahead."""
        ...

    def positions(self) -> dict[int, int]:
        """Next offset to be returned, per partition (past gaps such as transaction markers)."""
        ...

    def close(self) -> None: ...


class Transport(Protocol):
    def partitions(self, topic: str) -> int:
        """Partition count (creating the topic where the backend auto-creates). Raises TransportError."""
        ...

    def watermarks(self, topic: str, partition: int, *, timeout_s: float = 10.0) -> tuple[int, int]:
        """``(low, high)``: the first retained offset and the next offset to be written; TransportError
        when the backend does not answer within about ``timeout_s``."""
        ...

    def produce(
        self, topic: str, key: bytes, value: bytes | None, *, partition: int | None = None
    ) -> Future[Message]:
        """Append (to ``partition``, or the key's partition ``crc32(key) % partitions``); the future
        resolves with the written message (its offset) or a TransportError."""
        ...

    def send(self, topic: str, key: bytes, value: bytes | None, on_done: Delivered) -> None:
        """Append like :meth:`produce`, without a future: ``on_done(None)`` once the record is written,
        ``on_done(error)`` (a TransportError) if it cannot be -- on a transport thread, or before this
        returns. For writers of thousands of records at once (a failover's overrides and acquisitions),
        where a future per record cost more than the record itself. What ``on_done`` raises is logged
        (``delivery_report_failed``), never raised here or on the delivery thread."""
        ...

    def flush(self, timeout: float) -> int:
        """Wait for outstanding appends; returns how many are still pending."""
        ...

    def reader(self, topic: str, start: dict[int, int], *, low_latency: bool = True) -> Reader:
        """A reader over every partition of ``topic`` from ``start`` (partition -> offset)."""
        ...

    def close(self) -> None: ...


Apply = Callable[[list[Message]], None]


class Follower:
    """Reads every partition of one topic from given positions, catches up to the high watermarks seen
    at start (then ``ready`` is set), then keeps following the tail. No consumer group: every node
    reads everything, and positions live in memory (or in a snapshot), never in Kafka.

    ``apply`` is called on the follower's thread with each batch, in per-partition order.

    ``start=None`` starts at the first retained offset of every partition (for latest-value topics, where
    older history does not matter). With explicit positions, a position below the first retained offset is
    a :class:`HistoryGap`, at start or at any later time: the follower stops and calls ``on_gap`` (or
    ``on_error`` when there is no ``on_gap``) instead of skipping what it never read. Any other failure
    stops it too and calls ``on_error``; the owner decides what to do next.

    **A stalled reader is reopened**: when :class:`channel.stall.StallWatch` finds a partition whose
    records stay unfetched (a client library that stopped fetching without a word), the reader is closed
    and a new one opened at the positions already applied -- nothing skipped, nothing read twice -- logged
    ``follower_stalled`` and counted (``stalls``, ``on_stall``).
    """

    def __init__(
        self,
        transport: Transport,
        topic: str,
        apply: Apply,
        *,
        start: dict[int, int] | None = None,
        name: str | None = None,
        batch: int = 5000,
        low_latency: bool = True,
        on_error: Callable[[BaseException], None] | None = None,
        on_ready: Callable[[], None] | None = None,
        on_gap: Callable[[HistoryGap], None] | None = None,
        on_stall: Callable[[], None] | None = None,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self.transport = transport
        self.topic = topic
        self._apply = apply
        self._start = None if start is None else dict(start)
        self.name = name or topic
        self._batch = batch
        self._low_latency = low_latency
        self._on_error = on_error
        self._on_ready = on_ready
        self._on_gap = on_gap
        self._on_stall = on_stall
        self._mono = mono
        self.ready = threading.Event()
        self.positions: dict[int, int] = {}
        self.highwater: dict[int, int] = {}
        self.gap: HistoryGap | None = None
        self.records = 0
        self.stalls = 0
        self.last_activity = time.monotonic()
        self._watch = StallWatch()
        self._next_watch = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    @property
    def history_gap(self) -> bool:
        return self.gap is not None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"follow-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait_ready(self, timeout: float) -> bool:
        return self.ready.wait(timeout)

    def lag(self) -> int:
        """Records between our position and the high watermarks seen at start (0 once caught up)."""
        return sum(max(0, hw - self.positions.get(p, 0)) for p, hw in self.highwater.items())

    # ------------------------------------------------------------------ the loop
    def _prepare(self) -> Reader:
        n = self.transport.partitions(self.topic)
        start: dict[int, int] = {}
        for p in range(n):
            low, high = self.transport.watermarks(self.topic, p)
            pos = low if self._start is None else self._start.get(p, 0)
            if pos > high:
                # Positions from another incarnation of the topic (deleted and re-created): unusable.
                raise TransportError(
                    f"{self.topic}[{p}]: start position {pos} is beyond the end ({high}); "
                    "was the topic re-created? refusing to guess"
                )
            if pos < low:
                raise HistoryGap(self.topic, p, pos, low)
            start[p] = pos
            self.highwater[p] = high
        self.positions = dict(start)
        return self.transport.reader(self.topic, start, low_latency=self._low_latency)

    def _set_ready(self) -> None:
        # Runs on the follower thread, before any further batch: whatever on_ready does (turn a table
        # live, scan it) sees exactly the caught-up state, and every later record is delivered after it.
        if self._on_ready is not None:
            self._on_ready()
        # Logged before the event: whoever waits for readiness finds it already in the log.
        log.info("follower_ready", topic=self.topic, records=self.records, positions=self.positions)
        self.ready.set()

    def _caught_up(self) -> bool:
        return all(self.positions.get(p, 0) >= hw for p, hw in self.highwater.items())

    def _failed(self, e: BaseException) -> None:
        if isinstance(e, HistoryGap):
            self.gap = e
            log.error(
                "history_gap",
                topic=e.topic,
                partition=e.partition,
                position=e.position,
                low_watermark=e.low,
                hint="records were deleted by retention before this node read them; "
                "raise retention or snapshot more often",
            )
            if self._on_gap is not None:
                self._on_gap(e)
                return
        else:
            log.error("follower_failed", topic=self.topic, error=repr(e), exc_info=e)
        self.error = e
        if self._on_error is not None:
            self._on_error(e)

    # ------------------------------------------------------------------ the stall watch
    def _end(self, partition: int) -> int | None:
        """The partition's end, or None when it cannot be read -- for whatever reason: the watch is
        advice, and a question it could not get answered must never stop the follower."""
        try:
            return self.transport.watermarks(self.topic, partition, timeout_s=2.0)[1]
        except Exception as e:
            log.debug("follower_end_unread", topic=self.topic, partition=partition, error=repr(e))
            return None

    def _reopen(self, reader: Reader, stalled: dict[int, tuple[int, int]]) -> Reader:
        self.stalls += 1
        log.warning(
            "follower_stalled",
            topic=self.topic,
            partitions={p: {"position": pos, "end": end} for p, (pos, end) in sorted(stalled.items())},
            stalled_s=STALL_AFTER_S,
            stalls=self.stalls,
            action="reopening the reader at the applied positions",
        )
        reader.close()
        self._watch.reset()
        new = self.transport.reader(self.topic, dict(self.positions), low_latency=self._low_latency)
        if self._on_stall is not None:
            self._on_stall()
        return new

    def _run(self) -> None:
        try:
            reader = self._prepare()
        except BaseException as e:
            self._failed(e)
            return
        try:
            if self._caught_up():
                self._set_ready()
            while not self._stop.is_set():
                msgs = reader.poll(self._batch, 0.05 if self.ready.is_set() else 0.01)
                if msgs:
                    self._apply(msgs)
                    self.records += len(msgs)
                    self.last_activity = time.monotonic()
                if msgs or not self.ready.is_set():
                    self.positions.update(reader.positions())
                    if not self.ready.is_set() and self._caught_up():
                        self._set_ready()
                if self._mono() >= self._next_watch:
                    self._next_watch = self._mono() + STALL_CHECK_S
                    self.positions.update(reader.positions())
                    stalled = self._watch.check(self.positions, self._mono(), self._end)
                    if stalled:
                        reader = self._reopen(reader, stalled)
        except BaseException as e:
            self._failed(e)
        finally:
            reader.close()
