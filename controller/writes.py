"""The leader's channel writes: one record (a shedding or admin move), or a round of forced overrides
(healing, monitor) -- each round only after leadership is confirmed with ZooKeeper, each result counted."""

from __future__ import annotations

import asyncio
import concurrent.futures

import structlog

from trimtab.balance.heal import Override
from trimtab.channel.client import ChannelClient
from trimtab.channel.records import Record
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
        """Publish a round of forced records; returns how many were acknowledged.

        The acknowledgements are awaited in one worker thread: wrapping each producer future for the event
        loop would cost a loop wakeup per record, and a failover round holds thousands."""
        if not overrides or not await self.leadership.confirm():
            return 0
        futs = [self.channel.publish(o.bundle, o.record) for o in overrides]
        await asyncio.to_thread(concurrent.futures.wait, futs, self.ack_timeout_s)
        ok = 0
        for o, f in zip(overrides, futs, strict=True):
            if f.done() and f.exception() is None:
                ok += 1
                self.metrics.overrides.labels(o.reason, "published").inc()
            else:
                err = str(f.exception()) if f.done() else f"no acknowledgement within {self.ack_timeout_s:g}s"
                self.metrics.overrides.labels(o.reason, "failed").inc()
                log.warning("override_failed", bundle=o.bundle, reason=o.reason, error=err)
        return ok
