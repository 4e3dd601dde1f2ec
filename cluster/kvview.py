"""A latest-value-per-key view of a compacted topic (broker load reports, top bundles).

Unlike the channel, these topics have no transition rules: the newest value of a key wins and a
tombstone deletes it. Every value is hostile until decoded (:class:`channel.values.StrictDecoder`): a
value that is refused is skipped, counted by reason, logged with its partition and offset (the first
few of each reason, then every thousandth) and never stops the view. The previous value of its key is
kept: a garbled report does not erase a broker's last good one (reports also expire by age).

History: the view starts at the first retained offset of each partition. If retention deletes records
it has not read yet (a paused process), it says so, counts it, and reads the topic again from the first
retained offset -- for latest-value data that is a full recovery.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import structlog

from trimtab.channel.transport import Follower, Message, Transport
from trimtab.channel.values import Refused, StrictDecoder
from trimtab.errors import HistoryGap

log = structlog.get_logger("trimtab.kv")

T = TypeVar("T")


class LatestValues(Protocol[T]):
    """The newest value of every key, as a job reads it: a :class:`KeyValueView` in the daemons."""

    def snapshot(self) -> dict[str, T]: ...


#: A load or top-bundles report is a few KB; anything over this is refused unread.
MAX_REPORT_BYTES = 1 << 20


class KeyValueView(Generic[T]):
    def __init__(
        self,
        transport: Transport,
        topic: str,
        value_type: type[T],
        *,
        name: str | None = None,
        max_bytes: int = MAX_REPORT_BYTES,
    ) -> None:
        self.transport = transport
        self.topic = topic
        self.name = name or topic
        self.values: dict[str, T] = {}
        self.skipped: Counter[str] = Counter()
        self.gaps = 0
        self.stalls = 0  # times its follower found the reader stalled and reopened it
        self.updated_at = 0.0
        self._dec = StrictDecoder(value_type, max_bytes)
        self._listeners: list[Callable[[str, T | None], None]] = []
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # stop() and a restart never interleave
        self.follower = self._follower()

    def _follower(self) -> Follower:
        return Follower(
            self.transport,
            self.topic,
            self.apply,
            name=self.name,
            low_latency=False,
            on_ready=self._ready.set,
            on_gap=self._gap,
            on_error=self._failed,
            on_stall=self._stalled,
        )

    def _stalled(self) -> None:
        self.stalls += 1

    def add_listener(self, fn: Callable[[str, T | None], None]) -> None:
        self._listeners.append(fn)

    def _skip(self, m: Message, key: str | None, reason: str, detail: str = "") -> None:
        self.skipped[reason] += 1
        n = self.skipped[reason]
        if n <= 5 or n % 1000 == 0:
            log.warning(
                "kv_value_skipped",
                topic=self.topic,
                partition=m.partition,
                offset=m.offset,
                key=key,
                reason=reason,
                detail=detail[:200],
                seen=n,
            )

    def apply(self, msgs: list[Message]) -> None:
        """Messages of the topic, in log order (the follower's thread; the simulator delivers them itself)."""
        for m in msgs:
            if m.key is None:
                self._skip(m, None, "bad_key")
                continue
            try:
                key = m.key.decode()
            except UnicodeDecodeError:
                self._skip(m, None, "bad_key")
                continue
            if m.value is None:
                self.values.pop(key, None)
                value: T | None = None
            else:
                decoded = self._dec.decode(m.value)
                if isinstance(decoded, Refused):
                    self._skip(m, key[:200], decoded.reason, decoded.detail)
                    continue
                value = decoded
                self.values[key] = decoded
            for fn in self._listeners:
                fn(key, value)
        self.updated_at = time.monotonic()

    def _gap(self, e: HistoryGap) -> None:
        self.gaps += 1
        self._restart(f"history gap: {e}")

    def _failed(self, e: BaseException) -> None:
        self._restart(f"follower stopped: {e!r}")

    def _restart(self, why: str) -> None:
        """Read the topic again from its first retained offset (on a new thread, after a pause)."""
        if self._stopping.is_set():
            return
        log.warning("kv_view_restarting", topic=self.topic, reason=why)

        def again() -> None:
            if self._stopping.wait(1.0):
                return
            self.follower.stop()
            with self._lock:
                if self._stopping.is_set():
                    return
                self.follower = self._follower()
                self.follower.start()

        threading.Thread(target=again, name=f"kv-restart-{self.name}", daemon=True).start()

    def start(self) -> None:
        self.follower.start()

    def stop(self) -> None:
        with self._lock:
            self._stopping.set()
        self.follower.stop()

    @property
    def ready(self) -> bool:
        """Caught up once (a later restart keeps serving the values it has)."""
        return self._ready.is_set()

    def snapshot(self) -> dict[str, T]:
        return dict(self.values)
