"""The leader's channel writes: one record (a shedding or admin move), the admin's unloads (a transfer or
unload, and the bulk unloads of an isolation-policy change or a namespace deletion: one way to release a
bundle), or a round of forced overrides (healing, monitor) -- each round only after leadership is confirmed
with ZooKeeper, each result counted."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import Counter
from collections.abc import Iterable

import structlog

from trimtab.balance.heal import Override
from trimtab.channel import intents
from trimtab.channel.client import ChannelClient
from trimtab.channel.intents import IntentRefused
from trimtab.channel.records import Record, State
from trimtab.controller.leadership import LeaderGates
from trimtab.controller.metrics import ControllerMetrics
from trimtab.errors import TransportError

log = structlog.get_logger("trimtab.controller")


class ChannelWrites:
    def __init__(
        self,
        channel: ChannelClient,
        leadership: LeaderGates,
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
        await self.channel.publish_acked(bundle, record, self.ack_timeout_s)

    async def release(
        self, bundle: str, *, src: str, dst: str | None, version: int, writer: str, now_ms: int
    ) -> Record:
        """An operator's move of an ``Owned`` bundle (at ``version``, owned by ``src``): publish
        ``Releasing{src, dst}`` -- a transfer to ``dst``, or an unload when ``dst`` is None (the owner
        fences and frees it; the next lookup assigns it, if its namespace still exists). Returns the record
        once acknowledged (raises on failure or timeout; :class:`IntentRefused` if the bundle is no longer
        owned by ``src`` at ``version``)."""
        cur = self.channel.table.get(bundle)
        if cur is not None and cur.version != version:
            raise IntentRefused("release", cur, f"the bundle changed since version {version} was read")
        rec = intents.release(cur, src=src, dst=dst, writer=writer, now_ms=now_ms)
        await self.publish(bundle, rec)
        return rec

    async def unload_owned(
        self, bundles: Iterable[tuple[str, Record]], *, writer: str, now_ms: int
    ) -> tuple[list[str], dict[str, str]]:
        """Unload (:meth:`release` with no destination) each bundle that is still ``Owned`` exactly as
        when it was chosen (same version); one that moved meanwhile is left alone (it is being placed
        already). Returns the bundles unloaded and, for those whose record could not be published, why.
        Each unload is counted in ``trimtab_unloads_total{kind="unload", reason="admin"}``."""
        todo: list[tuple[str, Record]] = []
        for bundle, seen in bundles:
            cur = self.channel.table.get(bundle)
            if cur is None or cur.state is not State.OWNED or cur.dst is None or cur.version != seen.version:
                continue
            todo.append((bundle, cur))
        results = await asyncio.gather(
            *(
                self.release(
                    b, src=cur.dst or "", dst=None, version=cur.version, writer=writer, now_ms=now_ms
                )
                for b, cur in todo
            ),
            return_exceptions=True,
        )
        unloaded: list[str] = []
        failed: dict[str, str] = {}
        for (bundle, _), res in zip(todo, results, strict=True):
            if isinstance(res, BaseException):
                failed[bundle] = str(res) or type(res).__name__
            else:
                unloaded.append(bundle)
                self.metrics.unloads.labels("unload", "admin").inc()
        return unloaded, failed

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
    in one worker thread until every record is acknowledged (or failed), then counts them. The records go
    out with :meth:`ChannelClient.send` and their delivery reports are tallied here as they come: a future
    per record -- and waiting on ten thousand of them -- cost the leader more CPU than deciding the round."""

    def __init__(
        self,
        channel: ChannelClient,
        leadership: LeaderGates,
        metrics: ControllerMetrics,
        *,
        ack_timeout_s: float,
    ) -> None:
        self.channel = channel
        self.leadership = leadership
        self.metrics = metrics
        self.ack_timeout_s = ack_timeout_s
        self._confirmed: bool | None = None
        self._lock = threading.Lock()
        self._sent = 0
        self._waiting: dict[int, Override] = {}  # sent and not yet reported, by send order
        self._published: Counter[str] = Counter()  # acknowledged, by reason
        self._failed: list[tuple[Override, str]] = []
        self._finishing = False
        self._settled = threading.Event()  # finishing, and nothing is waiting

    def add(self, overrides: list[Override]) -> None:
        """Publish these now, if leadership is (or, on the first call, can be) confirmed. Blocking."""
        if not overrides:
            return
        if self._confirmed is None:
            self._confirmed = self.leadership.confirm_blocking()
        if not self._confirmed:
            return
        with self._lock:  # registered before any is sent: a report may come back before send returns
            first = self._sent
            self._sent += len(overrides)
            self._waiting.update(enumerate(overrides, first))
        send, delivered = self.channel.send, self._delivered
        for i, o in enumerate(overrides, first):
            send(o.bundle, o.record, functools.partial(delivered, i))

    def _delivered(self, i: int, err: TransportError | None) -> None:
        """A delivery report (the producer's thread)."""
        with self._lock:
            o = self._waiting.pop(i, None)
            if o is None:
                return
            if err is None:
                self._published[o.reason] += 1
            else:
                self._failed.append((o, str(err)))
            if self._finishing and not self._waiting:
                self._settled.set()

    async def finish(self) -> int:
        """Wait for every acknowledgement; returns how many were acknowledged (failures are counted and
        logged per bundle: a failed override is decided again by a later round)."""
        if not self._sent:
            return 0
        with self._lock:
            self._finishing = True
            if not self._waiting:
                self._settled.set()
        await asyncio.to_thread(self._settled.wait, self.ack_timeout_s)
        with self._lock:
            published = dict(self._published)
            late = f"no acknowledgement within {self.ack_timeout_s:g}s"
            failed = [*self._failed, *((o, late) for o in self._waiting.values())]
        for reason, n in published.items():
            self.metrics.overrides.labels(reason, "published").inc(n)
        for o, err in failed:
            self.metrics.overrides.labels(o.reason, "failed").inc()
            log.warning("override_failed", bundle=o.bundle, reason=o.reason, error=err)
        return sum(published.values())
