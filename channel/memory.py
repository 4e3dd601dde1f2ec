"""An in-memory log with Kafka's shape (topics, partitions, offsets, keyed partitioning).

Used by unit tests and the deterministic simulator. It partitions keys exactly as trimtab's Kafka
producers do (``crc32(key) % partitions``), keeps every record (no compaction, like the channel), and can
drop a prefix to imitate retention. Thread-safe; readers block on a condition instead of spinning.
"""

from __future__ import annotations

import random
import threading
import zlib
from concurrent.futures import Future

from trimtab.channel.transport import Delivered, Message, report
from trimtab.errors import HistoryGap, TransportError


class MemoryLog:
    """The shared "cluster": every transport built on it sees the same topics."""

    def __init__(self, default_partitions: int = 4) -> None:
        self.default_partitions = default_partitions
        self._topics: dict[str, list[list[tuple[bytes | None, bytes | None]]]] = {}
        self._low: dict[tuple[str, int], int] = {}
        self._cond = threading.Condition()
        self.available = True  # flip to False to imitate an unreachable cluster

    def create(self, topic: str, partitions: int | None = None) -> int:
        with self._cond:
            parts = self._topics.get(topic)
            if parts is None:
                parts = [[] for _ in range(partitions or self.default_partitions)]
                self._topics[topic] = parts
            return len(parts)

    def _check(self) -> None:
        if not self.available:
            raise TransportError("in-memory log is unavailable (fault injected)")

    def append(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None
    ) -> Message:
        with self._cond:
            self._check()
            parts = self._topics.get(topic)
            if parts is None:
                self.create(topic)
                parts = self._topics[topic]
            if partition is None:
                partition = zlib.crc32(key) % len(parts) if key is not None else random.randrange(len(parts))
            log = parts[partition]
            log.append((key, value))
            offset = len(log) - 1
            self._cond.notify_all()
            return Message(key, value, partition, offset)

    def read(self, topic: str, partition: int, offset: int, limit: int) -> list[Message]:
        parts = self._topics.get(topic)
        if parts is None:
            return []
        log = parts[partition]
        start = max(offset, self._low.get((topic, partition), 0))
        return [Message(k, v, partition, o) for o, (k, v) in enumerate(log[start : start + limit], start)]

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        with self._cond:
            self._check()
            parts = self._topics.get(topic)
            if parts is None:
                return 0, 0
            return self._low.get((topic, partition), 0), len(parts[partition])

    def truncate(self, topic: str, partition: int, before: int) -> None:
        """Imitate retention: offsets below ``before`` can no longer be read."""
        with self._cond:
            self._low[(topic, partition)] = max(self._low.get((topic, partition), 0), before)

    def messages(self, topic: str) -> list[Message]:
        """Everything readable in ``topic``, partition by partition (for tests and tools)."""
        with self._cond:
            parts = self._topics.get(topic, [])
            out: list[Message] = []
            for p in range(len(parts)):
                out.extend(self.read(topic, p, 0, len(parts[p])))
            return out

    def wait(self, timeout: float) -> None:
        with self._cond:
            self._cond.wait(timeout)


class MemoryReader:
    def __init__(self, log: MemoryLog, topic: str, start: dict[int, int]) -> None:
        self._log = log
        self._topic = topic
        self._pos = dict(start)

    def positions(self) -> dict[int, int]:
        return dict(self._pos)

    def poll(self, max_messages: int, timeout: float) -> list[Message]:
        out = self._drain(max_messages)
        if not out and timeout > 0:
            self._log.wait(timeout)
            out = self._drain(max_messages)
        return out

    def _drain(self, max_messages: int) -> list[Message]:
        out: list[Message] = []
        with self._log._cond:
            for p in sorted(self._pos):
                low = self._log._low.get((self._topic, p), 0)
                if self._pos[p] < low:
                    raise HistoryGap(self._topic, p, self._pos[p], low)
            for p in sorted(self._pos):
                if len(out) >= max_messages:
                    break
                got = self._log.read(self._topic, p, self._pos[p], max_messages - len(out))
                if got:
                    self._pos[p] = got[-1].offset + 1
                    out.extend(got)
        return out

    def close(self) -> None:
        """Nothing to release: the log is shared, and a reader holds only its positions."""


class MemoryTransport:
    """A :class:`channel.transport.Transport` over a :class:`MemoryLog`."""

    def __init__(self, log: MemoryLog | None = None) -> None:
        self.log = log or MemoryLog()

    def partitions(self, topic: str) -> int:
        self.log._check()
        return self.log.create(topic)

    def watermarks(self, topic: str, partition: int, *, timeout_s: float = 10.0) -> tuple[int, int]:
        return self.log.watermarks(topic, partition)

    def produce(
        self, topic: str, key: bytes, value: bytes | None, *, partition: int | None = None
    ) -> Future[Message]:
        fut: Future[Message] = Future()
        try:
            fut.set_result(self.log.append(topic, key, value, partition))
        except TransportError as e:
            fut.set_exception(e)
        return fut

    def send(self, topic: str, key: bytes, value: bytes | None, on_done: Delivered) -> None:
        try:
            self.log.append(topic, key, value, None)
        except TransportError as e:
            report(on_done, e, topic)
            return
        report(on_done, None, topic)

    def flush(self, timeout: float) -> int:
        return 0

    def reader(self, topic: str, start: dict[int, int], *, low_latency: bool = True) -> MemoryReader:
        n = self.partitions(topic)
        return MemoryReader(self.log, topic, {p: start.get(p, 0) for p in range(n)})

    def close(self) -> None:
        pass
