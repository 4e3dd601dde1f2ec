"""The simulated Kafka: a :class:`~trimtab.channel.transport.Transport` the daemons' code produces to, with
the delays and faults of the cluster model.

* A produced record is acknowledged at once (the producer's future, or its delivery report) and reaches
  every reader ``delay_s`` later, all at the same instant (every node sees the channel at the same time).
  Channel records produced while a delivery is on its way travel with it, in produce order (one poll of
  the table resolves them together); a load report travels alone.
* During a Kafka outage nothing reaches the readers: what was produced is delivered when it ends.
* ``misbehave`` (the fault injector) may duplicate or reorder the channel records of a delivery.
* Topics nobody follows (the events topic) are dropped: the simulator reports from its own recorder.

Readers are :meth:`follow` callbacks (the channel table, the load views): they run on the loop, at the
delivery instant, with the messages in log order -- the daemons' follower threads, without the threads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future

from trimtab.channel.memory import MemoryLog, MemoryTransport
from trimtab.channel.transport import Delivered, Message, Reader, report

Pending = tuple[str, bytes, bytes | None]
Misbehave = Callable[[list[Pending]], list[Pending]]
Observer = Callable[[str, bytes, bytes | None], None]


class SimTransport(MemoryTransport):
    """The in-memory transport, with the cluster model's delivery: only :meth:`produce` and :meth:`send`
    differ (a record reaches the log, and its readers, when it is delivered)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        delay_s: float,
        held_until: Callable[[], float],
        channel_topic: str,
        misbehave: Misbehave,
        partitions: int = 8,
    ) -> None:
        """``held_until``: when the current Kafka outage ends (in the past when there is none)."""
        self.loop = loop
        self.delay_s = delay_s
        self.held_until = held_until
        self.channel_topic = channel_topic
        self.misbehave = misbehave
        super().__init__(MemoryLog(default_partitions=partitions))
        self._readers: dict[str, tuple[Reader, list[Callable[[list[Message]], None]]]] = {}
        self._pending: list[Pending] = []
        self._scheduled = False
        self.observers: list[Observer] = []  # see every produced record, at produce time (the recorder)
        self.delivered = 0  # channel records delivered (duplicates included)

    def follow(self, topic: str, apply: Callable[[list[Message]], None]) -> None:
        """``apply`` gets every later message of ``topic``, at its delivery instant."""
        if topic not in self._readers:
            self._readers[topic] = (self.reader(topic, {}), [])
        self._readers[topic][1].append(apply)

    # ------------------------------------------------------------------ Transport
    def produce(
        self, topic: str, key: bytes, value: bytes | None, *, partition: int | None = None
    ) -> Future[Message]:
        fut: Future[Message] = Future()
        fut.set_result(Message(key, value, partition or 0, -1))
        self._enqueue(topic, key, value)
        return fut

    def send(self, topic: str, key: bytes, value: bytes | None, on_done: Delivered) -> None:
        self._enqueue(topic, key, value)
        report(on_done, None, topic)

    # ------------------------------------------------------------------ delivery
    def _enqueue(self, topic: str, key: bytes, value: bytes | None) -> None:
        for fn in self.observers:
            fn(topic, key, value)
        if topic not in self._readers:
            return
        if topic != self.channel_topic:
            # A report travels alone: it reaches the readers exactly delay_s after it was produced.
            now = self.loop.time()
            self.loop.call_at(
                max(now + self.delay_s, self.held_until()), self._deliver_one, topic, key, value
            )
            return
        self._pending.append((topic, key, value))
        if not self._scheduled:
            self._scheduled = True
            now = self.loop.time()
            self.loop.call_at(max(now + self.delay_s, self.held_until()), self._deliver)

    def _deliver_one(self, topic: str, key: bytes, value: bytes | None) -> None:
        until = self.held_until()
        if self.loop.time() < until:
            self.loop.call_at(until, self._deliver_one, topic, key, value)
            return
        self.log.append(topic, key, value, None)
        self._poll(topic)

    def _poll(self, topic: str) -> None:
        reader, appliers = self._readers[topic]
        msgs = reader.poll(1 << 30, 0)
        if msgs:
            for apply in appliers:
                apply(msgs)

    def _deliver(self) -> None:
        until = self.held_until()
        if self.loop.time() < until:
            self.loop.call_at(until, self._deliver)
            return
        self._scheduled = False
        batch, self._pending = self._pending, []
        for topic, key, value in self.misbehave(batch):
            self.log.append(topic, key, value, None)
            self.delivered += 1
        self._poll(self.channel_topic)
