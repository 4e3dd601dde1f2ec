"""The channel as a node uses it: bootstrap (snapshot + tail), follow, publish.

Threading: the table is written only by the follower thread. Listeners are called on that thread, in log
order, only after the table turned live; ``on_ready`` runs on that thread too, at the exact moment of
catch-up, so a consumer can scan the table and then rely on listeners for everything after the scan.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import structlog

from channel.records import Record, encode
from channel.snapshot import Snapshot, choose, read_all
from channel.table import SkipHook, TableView
from channel.transport import Follower, Message, Transport, TransportError

log = structlog.get_logger("trimtab.channel")


class ChannelClient:
    def __init__(
        self,
        transport: Transport,
        topic: str,
        snapshot_topic: str | None = None,
        *,
        on_skip: SkipHook | None = None,
        on_ready: Callable[[TableView], None] | None = None,
        use_snapshot: bool = True,
    ) -> None:
        self.transport = transport
        self.topic = topic
        self.snapshot_topic = snapshot_topic
        self.use_snapshot = use_snapshot and snapshot_topic is not None
        self._on_skip = on_skip
        self._user_on_ready = on_ready
        self.table = TableView(on_skip=on_skip)
        self.snapshot: Snapshot | None = None
        self.follower: Follower | None = None
        self.started_at = 0.0
        self.ready_at = 0.0
        self._ready = threading.Event()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Install the newest snapshot (if any) and start following the channel. Non-blocking after the
        snapshot read; wait with :meth:`wait_ready`."""
        self.started_at = time.monotonic()
        partitions = self.transport.partitions(self.topic)
        self.table.partitions = partitions
        start: dict[int, int] = {}
        if self.use_snapshot and self.snapshot_topic is not None:
            snap = choose(
                ((m.key, m.value) for m in read_all(self.transport, self.snapshot_topic)), channel=self.topic
            )
            if snap is not None and snap.manifest.partitions == partitions and self._usable(snap, partitions):
                self.table.load(snap.states, snap.positions)
                self.snapshot = snap
                start = snap.positions
                log.info(
                    "snapshot_loaded",
                    snapshot=snap.manifest.id,
                    bundles=len(snap.states),
                    positions=snap.positions,
                )
        self.follower = Follower(
            self.transport,
            self.topic,
            self._apply,
            start=start,
            name="channel",
            on_ready=self._became_ready,
        )
        self.follower.start()

    def _usable(self, snap: Snapshot, partitions: int) -> bool:
        for p in range(partitions):
            _low, high = self.transport.watermarks(self.topic, p)
            if snap.positions.get(p, 0) > high:
                log.error(
                    "snapshot_ignored",
                    snapshot=snap.manifest.id,
                    reason="its positions are past the end of the channel (re-created topic?)",
                    partition=p,
                )
                return False
        return True

    def _apply(self, msgs: list[Message]) -> None:
        self.table.apply_all(msgs)

    def _became_ready(self) -> None:
        self.table.set_live()
        self.ready_at = time.monotonic()
        if self._user_on_ready is not None:
            self._user_on_ready(self.table)
        self._ready.set()

    def wait_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout)

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def error(self) -> BaseException | None:
        return self.follower.error if self.follower else None

    def stop(self) -> None:
        if self.follower is not None:
            self.follower.stop()

    def lag(self) -> int:
        return self.follower.lag() if self.follower else 0

    # ------------------------------------------------------------------ writing
    def publish(self, bundle: str, record: Record | None) -> Future[Message]:
        """Append a proposed transition. Acceptance is decided by replay, never by the write itself."""
        try:
            return self.transport.produce(self.topic, bundle.encode(), encode(record))
        except TransportError as e:
            fut: Future[Message] = Future()
            fut.set_exception(e)
            return fut
