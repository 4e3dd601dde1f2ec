"""The leader's channel writes: one record (a shedding or admin move), or a round of forced overrides
(healing, monitor) -- each round only after leadership is confirmed with ZooKeeper, each result counted."""

from __future__ import annotations

import asyncio
import concurrent.futures

import structlog

from trimtab.balance.heal import Override
from trimtab.channel.client import ChannelClient
from trimtab.channel.records import Record
from trimtab.channel.transport import Message
from trimtab.controller.leadership import Leadership
from trimtab.controller.metrics import ControllerMetrics

log = structlog.get_logger("trimtab.controller")


class ChannelWrites:
    def __init__(
        self,
        channel: ChannelClient,
        leadership: Leadership,
        metrics: ControllerMetrics,
        *,
        ack_timeout_s: float = 30.0,
    ) -> None:
        self.channel = channel
        self.leadership = leadership
        self.metrics = metrics
        self.ack_timeout_s = ack_timeout_s

    async def publish(self, bundle: str, record: Record | None) -> None:
        """Publish one record and wait for its acknowledgement (raises on failure or timeout)."""
        fut = self.channel.publish(bundle, record)
        await asyncio.wait_for(asyncio.wrap_future(fut), self.ack_timeout_s)

    async def overrides(self, overrides: list[Override]) -> int:
        """Publish a round of forced records; returns how many were acknowledged."""
        batch = self.override_round()
        await asyncio.to_thread(batch.add, overrides)
        return await batch.finish()

    def override_round(self) -> OverrideRound:
        """A round of forced records published as they are decided (see :class:`OverrideRound`)."""
        return OverrideRound(self.channel, self.leadership, self.metrics, ack_timeout_s=self.ack_timeout_s)


class OverrideRound:
    """One round of forced records, published batch by batch while the round is still deciding the rest.

    :meth:`add` runs on the round's worker thread: the first batch confirms leadership with ZooKeeper (one
    round trip for the whole round), then every batch goes to the producer at once. A failover round of
    10 000 bundles spends about a tenth of a second checking and throttling its chunks; the agents start
    on the first chunk meanwhile instead of waiting for the last. :meth:`finish` (on the event loop) waits
    for the acknowledgements in one worker thread -- wrapping each producer future for the event loop would
    cost a loop wakeup per record -- and counts them."""

    def __init__(
        self,
        channel: ChannelClient,
        leadership: Leadership,
        metrics: ControllerMetrics,
        *,
        ack_timeout_s: float,
    ) -> None:
        self.channel = channel
        self.leadership = leadership
        self.metrics = metrics
        self.ack_timeout_s = ack_timeout_s
        self._confirmed: bool | None = None
        self._sent: list[tuple[Override, concurrent.futures.Future[Message]]] = []

    def add(self, overrides: list[Override]) -> None:
        """Publish these now, if leadership is (or, on the first call, can be) confirmed. Blocking."""
        if not overrides:
            return
        if self._confirmed is None:
            self._confirmed = self.leadership.confirm_blocking()
        if self._confirmed:
            publish = self.channel.publish
            self._sent.extend((o, publish(o.bundle, o.record)) for o in overrides)

    async def finish(self) -> int:
        """Wait for every acknowledgement; returns how many were acknowledged (failures are counted and
        logged per bundle: a failed override is decided again by a later round)."""
        if not self._sent:
            return 0
        await asyncio.to_thread(concurrent.futures.wait, [f for _, f in self._sent], self.ack_timeout_s)
        ok = 0
        for o, f in self._sent:
            if f.done() and f.exception() is None:
                ok += 1
                self.metrics.overrides.labels(o.reason, "published").inc()
            else:
                err = str(f.exception()) if f.done() else f"no acknowledgement within {self.ack_timeout_s:g}s"
                self.metrics.overrides.labels(o.reason, "failed").inc()
                log.warning("override_failed", bundle=o.bundle, reason=o.reason, error=err)
        return ok
