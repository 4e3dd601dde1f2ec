"""The events topic: append-only decision and audit records (assignments, unloads, transfers, splits,
overrides, skips) with the reasons and load figures behind them. The data pipeline reads it.

Publishing is fire-and-forget: an unreachable events topic must never block or fail a decision; failed
deliveries are counted and logged.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import orjson
import structlog

from trimtab.channel.transport import Message, Transport

log = structlog.get_logger("trimtab.events")


class EventPublisher:
    def __init__(self, transport: Transport, topic: str, *, source: str, role: str) -> None:
        self.transport = transport
        self.topic = topic
        self.source = source
        self.role = role
        self.context: dict[str, Any] = {}
        self.failed = 0
        self.published = 0

    def publish(self, kind: str, key: str | None = None, **fields: Any) -> None:
        body = {
            "schema": 1,
            "ts": int(time.time() * 1000),
            "kind": kind,
            "source": self.source,
            "role": self.role,
            **self.context,
            **fields,
        }
        try:
            fut = self.transport.produce(
                self.topic, (key or fields.get("bundle") or kind).encode(), orjson.dumps(body)
            )
        except Exception as e:
            self.failed += 1
            log.warning("event_publish_failed", kind=kind, error=str(e))
            return
        fut.add_done_callback(self._done)

    def _done(self, fut: Future[Message]) -> None:
        if fut.exception() is not None:
            self.failed += 1
            log.warning("event_publish_failed", error=str(fut.exception()))
        else:
            self.published += 1
