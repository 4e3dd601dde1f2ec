"""The channel as a node uses it: bootstrap (snapshot + tail), follow, recover, publish.

Threading: the table is written only by the follower thread. Listeners are called on that thread, in log
order, only after the table turned live; ``on_ready`` runs on that thread too, at the exact moment of
catch-up, so a consumer can scan the table and then rely on listeners for everything after the scan.

Recovery: when the follower stops -- a history gap (records deleted before this node read them) or any
other failure -- the node is not ready from that moment, says why (:meth:`ChannelClient.health`), and a
recovery thread bootstraps again from the newest snapshot that covers what is still retained, retrying
with backoff until it succeeds. ``on_ready`` then runs again: whoever scans the table on ready must expect
to be called more than once. Nothing on the channel can stop the follower (decoding is total, see
``channel.records``), so a failure here is infrastructure or a bug, and both are reported, not hidden.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import structlog

from trimtab.channel.naming import NamingIndex
from trimtab.channel.records import Record, encode
from trimtab.channel.snapshot import Snapshot, check_snapshot_topic, choose, read_snapshot_topic
from trimtab.channel.table import SkipHook, TableView
from trimtab.channel.transport import Delivered, Follower, Message, Transport, report
from trimtab.errors import HistoryGap, TransportError

log = structlog.get_logger("trimtab.channel")
#: A read of the channel's end offsets (for the lag) gives up after this long: stop() waits for one.
ENDS_TIMEOUT_S = 1.0


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
        retry_s: float = 2.0,
        max_retry_s: float = 30.0,
        ends_every_s: float | None = None,
        packed_table: bool = True,
    ) -> None:
        """``ends_every_s``: read the channel's end offsets this often on a thread of its own, so that
        :meth:`lag` counts what was written since the follower caught up -- a follower that stops receiving
        then shows a growing lag (``trimtab_channel_lag_records``) instead of 0. None (the simulator,
        tools): the lag counts only up to the ends seen when the follower started. ``packed_table``: see
        :class:`TableView` (only the simulator keeps records whole)."""
        self.transport = transport
        self.topic = topic
        self.snapshot_topic = snapshot_topic
        self.use_snapshot = use_snapshot and snapshot_topic is not None
        self._on_skip = on_skip
        self._user_on_ready = on_ready
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self.table = TableView(on_skip=on_skip, packed=packed_table)
        self.snapshot: Snapshot | None = None
        self.follower: Follower | None = None
        self.started_at = 0.0
        self.ready_at = 0.0
        self.gaps = 0  # history gaps detected (a counter)
        self.recoveries = 0  # times the follower was restarted after it stopped (a counter)
        self.stalls = 0  # times the follower found its reader stalled and reopened it (a counter)
        self.last_error: BaseException | None = None
        self._reason = "not started"
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._recovery: threading.Thread | None = None
        self._again = False  # a follower failed while the recovery loop was finishing: go round again
        self._naming = NamingIndex(self.table)
        self.ends_every_s = ends_every_s
        self._ends: dict[int, int] = {}  # partition -> end offset, as last read by the ends thread
        self._ends_thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Check the snapshot topic, install the newest usable snapshot and start following the channel.

        Returns once the follower runs (wait with :meth:`wait_ready`). Raises only what no retry can fix:
        an unusable snapshot topic (:class:`channel.snapshot.SnapshotTopicError`) or a channel that cannot
        be reached at all. A history gap is not raised: the node stays not ready and retries.
        """
        self.started_at = time.monotonic()
        partitions = self.transport.partitions(self.topic)
        self.table.partitions = partitions
        if self.use_snapshot and self.snapshot_topic is not None:
            check_snapshot_topic(self.transport, self.snapshot_topic)
        self._reason = "catching up with the channel"
        try:
            self._bootstrap(partitions)
        except HistoryGap as e:
            self._gap(e)  # recovering: the lag is worth watching from now on too
        if self.ends_every_s is not None and self._ends_thread is None:
            self._ends_thread = threading.Thread(target=self._watch_ends, name="channel-ends", daemon=True)
            self._ends_thread.start()

    def _watch_ends(self) -> None:
        """Every ``ends_every_s``: the end offset of each partition (a failure keeps the last one read)."""
        assert self.ends_every_s is not None
        while not self._stopping.wait(self.ends_every_s):
            for p in range(self.table.partitions or 0):
                if self._stopping.is_set():
                    return  # the transport closes next: no call may be in flight then
                try:
                    self._ends[p] = self.transport.watermarks(self.topic, p, timeout_s=ENDS_TIMEOUT_S)[1]
                except Exception as e:  # Kafka away: the lag stays what it was; the follower says why
                    log.debug("channel_ends_unread", partition=p, error=str(e))

    def _bootstrap(self, partitions: int) -> None:
        """Load the newest snapshot that covers what the channel still retains and start a follower from
        its positions (or from offset zero). Raises HistoryGap when no snapshot covers the retained log."""
        lows: dict[int, int] = {}
        highs: dict[int, int] = {}
        for p in range(partitions):
            lows[p], highs[p] = self.transport.watermarks(self.topic, p)
        snap: Snapshot | None = None
        if self.use_snapshot and self.snapshot_topic is not None:
            snap = choose(
                read_snapshot_topic(self.transport, self.snapshot_topic),
                channel=self.topic,
                partitions=partitions,
            )
            if snap is not None and any(snap.positions.get(p, 0) > highs[p] for p in range(partitions)):
                log.error(
                    "snapshot_ignored",
                    snapshot=snap.manifest.id,
                    reason="its positions are past the end of the channel (re-created topic?)",
                )
                snap = None
        start = {p: 0 for p in range(partitions)}
        if snap is not None:
            start.update(snap.positions)
        for p in range(partitions):
            if start[p] < lows[p]:
                raise HistoryGap(self.topic, p, start[p], lows[p])
        self.table.load(snap.states if snap is not None else {}, start if snap is not None else {})
        self.snapshot = snap
        if snap is not None:
            log.info("snapshot_loaded", snapshot=snap.manifest.id, bundles=len(snap.states), positions=start)
        with self._lock:  # against stop(): a recovery that was bootstrapping as it ran starts nothing
            if self._stopping.is_set():
                return
            self.follower = Follower(
                self.transport,
                self.topic,
                self._apply,
                start=start,
                name="channel",
                on_ready=self._became_ready,
                on_error=self._failed,
                on_gap=self._gap,
                on_stall=self._stalled,
            )
            self.follower.start()

    def _stalled(self) -> None:
        self.stalls += 1

    def _apply(self, msgs: list[Message]) -> None:
        self.table.apply_all(msgs)

    def _became_ready(self) -> None:
        self.table.set_live()
        self.ready_at = time.monotonic()
        if self._user_on_ready is not None:
            self._user_on_ready(self.table)
        self._reason = "ready"
        self._ready.set()

    # ------------------------------------------------------------------ failure and recovery
    def _gap(self, e: HistoryGap) -> None:
        self.gaps += 1
        self._stopped(e, f"history gap: {e}; re-bootstrapping from the newest snapshot")

    def _failed(self, e: BaseException) -> None:
        self._stopped(e, f"channel follower stopped: {e!r}; restarting")

    def _stopped(self, e: BaseException, reason: str) -> None:
        """The follower stopped (called on its thread, or by start()): not ready, say why, recover."""
        self._ready.clear()
        self.last_error = e
        self._reason = reason
        if self._stopping.is_set():
            return
        with self._lock:
            if self._recovery is not None and self._recovery.is_alive():
                self._again = True  # the recovery loop is at work: it must not return without this one
                return
            self._recovery = threading.Thread(target=self._recover, name="channel-recover", daemon=True)
            self._recovery.start()

    def _recover(self) -> None:
        delay = 0.0 if isinstance(self.last_error, HistoryGap) else self.retry_s
        while not self._stopping.wait(delay):
            with self._lock:
                self._again = False  # failures of the follower about to be replaced are moot
            old = self.follower
            if old is not None:
                old.stop()
            try:
                partitions = self.transport.partitions(self.topic)
                if partitions != self.table.partitions:
                    raise TransportError(
                        f"{self.topic} now has {partitions} partitions, not {self.table.partitions}: the channel "
                        "partition count must never change (replicas would diverge); restore it"
                    )
                self.recoveries += 1
                log.warning("channel_recovering", reason=self._reason, attempt=self.recoveries)
                self._bootstrap(partitions)
                with self._lock:
                    if not self._again:
                        return
                # The follower just started failed before this thread was done: _stopped left it to us.
                delay = 0.0 if isinstance(self.last_error, HistoryGap) else self.retry_s
                continue
            except HistoryGap as e:
                self.gaps += 1
                self.last_error = e
                self._reason = (
                    f"history gap not covered by any snapshot: {e}; waiting for a snapshot that covers "
                    "the retained channel"
                )
                log.error("history_gap_unrecovered", error=str(e), retry_s=self.max_retry_s)
                delay = self.max_retry_s
            except Exception as e:
                self.last_error = e
                self._reason = f"channel recovery failed: {e!r}; retrying"
                log.error("channel_recovery_failed", error=repr(e))
                delay = min(self.max_retry_s, max(self.retry_s, delay * 2))

    def wait_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout)

    @property
    def ready(self) -> bool:
        """Caught up and following; false while recovering from a gap or a failure."""
        return self._ready.is_set()

    def health(self) -> tuple[bool, str]:
        """(ready, why): the reason a node reports when it is not ready."""
        return self._ready.is_set(), self._reason

    @property
    def error(self) -> BaseException | None:
        """The last failure of the follower or of a recovery (None if there was none)."""
        return self.last_error

    @property
    def history_gap(self) -> bool:
        """A history gap has been seen and not yet recovered from."""
        return isinstance(self.last_error, HistoryGap) and not self.ready

    def stop(self) -> None:
        self._stopping.set()
        ends = self._ends_thread
        if ends is not None and ends is not threading.current_thread():
            ends.join(ENDS_TIMEOUT_S + 1.0)  # at most one short call in flight
        with self._lock:  # a follower a recovery started before this point is the one stopped here
            follower = self.follower
        if follower is not None:
            follower.stop()
        rec = self._recovery
        if rec is not None and rec is not threading.current_thread():
            rec.join(5.0)

    def naming(self, broker: str) -> dict[str, Record]:
        """Every bundle whose record names ``broker`` (dst or src), with its record: from an index kept as
        the table changes (:mod:`channel.naming`), made at the first question about ``broker``."""
        return self._naming.records(broker)

    def status(self) -> dict[str, Any]:
        """The channel replica as a node reports it (``/v1/status``): whether it is caught up and following,
        why not, how far behind, since when it last received a record, and what it recovered from."""
        ready, reason = self.health()
        follower = self.follower
        return {
            "ready": ready,
            "reason": reason,
            "lag": self.lag(),
            "bundles": len(self.table),
            "positions": dict(follower.positions) if follower is not None else {},
            "last_record_s_ago": (
                round(time.monotonic() - follower.last_activity, 3)
                if follower is not None and follower.last_activity
                else None
            ),
            "recoveries": self.recoveries,
            "stalls": self.stalls,
            "history_gaps": self.gaps,
            "last_error": repr(self.last_error) if self.last_error is not None else None,
            "stats": self.table.stats.detail(),
        }

    def lag(self) -> int:
        """Records between the replay position and the end of the channel: the ends last read by the ends
        thread (when it runs), else the ends seen when the follower started."""
        follower = self.follower
        if follower is None:
            return 0
        ends, positions = dict(self._ends), follower.positions
        if not ends:
            return follower.lag()
        return sum(
            max(0, max(ends.get(p, 0), hw) - positions.get(p, 0)) for p, hw in follower.highwater.items()
        )

    # ------------------------------------------------------------------ writing
    def publish(self, bundle: str, record: Record | None) -> Future[Message]:
        """Append a proposed transition. Acceptance is decided by replay, never by the write itself."""
        try:
            return self.transport.produce(self.topic, bundle.encode(), encode(record))
        except TransportError as e:
            fut: Future[Message] = Future()
            fut.set_exception(e)
            return fut

    async def publish_acked(self, bundle: str, record: Record | None, timeout_s: float) -> Message:
        """:meth:`publish` from the event loop, waiting for Kafka's acknowledgement: TimeoutError after
        ``timeout_s``, the TransportError if it cannot be written. (Acknowledged is not accepted: replay
        decides that.)"""
        async with asyncio.timeout(timeout_s):
            return await asyncio.wrap_future(self.publish(bundle, record))

    def send(self, bundle: str, record: Record | None, on_done: Delivered) -> None:
        """:meth:`publish` without a future (:meth:`Transport.send`): ``on_done`` gets None once the record
        is written, the TransportError if it cannot be."""
        try:
            self.transport.send(self.topic, bundle.encode(), encode(record), on_done)
        except TransportError as e:
            report(on_done, e, self.topic)
