"""A latest-value-per-key view of a compacted topic (broker load reports, top bundles).

Unlike the channel, these topics have no transition rules: the newest value of a key wins and a
tombstone deletes it. Undecodable values are skipped and counted, never fatal.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

import msgspec
import structlog

from channel.transport import Follower, Message, Transport

log = structlog.get_logger("trimtab.kv")

T = TypeVar("T")


class KeyValueView(Generic[T]):
    def __init__(
        self, transport: Transport, topic: str, value_type: type[T], *, name: str | None = None
    ) -> None:
        self.topic = topic
        self.values: dict[str, T] = {}
        self.skipped = 0
        self.updated_at = 0.0
        self._dec = msgspec.json.Decoder(value_type)
        self._listeners: list[Callable[[str, T | None], None]] = []
        self.follower = Follower(transport, topic, self._apply, name=name or topic, low_latency=False)

    def add_listener(self, fn: Callable[[str, T | None], None]) -> None:
        self._listeners.append(fn)

    def _apply(self, msgs: list[Message]) -> None:
        for m in msgs:
            if m.key is None:
                self.skipped += 1
                continue
            key = m.key.decode(errors="replace")
            if m.value is None:
                self.values.pop(key, None)
                value: T | None = None
            else:
                try:
                    value = self._dec.decode(m.value)
                except msgspec.DecodeError:
                    self.skipped += 1
                    log.warning("kv_value_skipped", topic=self.topic, key=key)
                    continue
                self.values[key] = value
            for fn in self._listeners:
                fn(key, value)
        self.updated_at = time.monotonic()

    def start(self) -> None:
        self.follower.start()

    def stop(self) -> None:
        self.follower.stop()

    @property
    def ready(self) -> bool:
        return self.follower.ready.is_set()

    def snapshot(self) -> dict[str, T]:
        return dict(self.values)
