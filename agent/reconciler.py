"""Carries out :func:`balance.roles.plan` for every bundle that needs this broker.

Bundles are marked dirty by channel events (and by a full scan when the channel turns live); a pool of
workers takes dirty bundles one at a time per bundle, re-reads the *current* record, plans and executes.
A failed step (adapter or Kafka) is retried with backoff for as long as the record is unchanged; it never
publishes the next record after a failed side effect, so a failing broker can stall a transition (the
leader's monitor resolves stuck states) but cannot corrupt ownership.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from trimtab.agent.adapters.base import BrokerAdapter
from trimtab.agent.leases import MIN_LEASE_S, LeaseGuard
from trimtab.agent.metrics import AgentMetrics
from trimtab.agent.session_barrier import SessionBarrier
from trimtab.balance.roles import (
    Acquire,
    Close,
    Fence,
    Forget,
    MergeOnBroker,
    Plan,
    Publish,
    PublishChildren,
    PublishMerged,
    SplitOnBroker,
    UpdateLayout,
    UpdateLayoutMerge,
    needs_attention,
    plan,
)
from trimtab.channel import intents
from trimtab.channel.bundles import BundleRange, merge_partner, parse_bundle
from trimtab.channel.client import ChannelClient
from trimtab.channel.records import Record, State
from trimtab.channel.table import TableView
from trimtab.errors import AdapterError, BundleError, TransportError

log = structlog.get_logger("trimtab.agent")


class Reconciler:
    def __init__(
        self,
        me: str,
        channel: ChannelClient,
        adapter: BrokerAdapter,
        *,
        url_of: Callable[[str], str | None],
        apply_split: Callable[[str, BundleRange, list[BundleRange]], Any],
        metrics: AgentMetrics,
        on_served_change: Callable[[str, bool], None],
        leases: LeaseGuard,
        in_flight_timeout_s: float,
        clock: Callable[[], float] = time.time,
        workers: int = 32,
        publish_timeout_s: float = 30.0,
        apply_merge: Callable[[str, BundleRange, int], Any] | None = None,
    ) -> None:
        """``apply_split(namespace, parent, children)`` and ``apply_merge(namespace, merged, inner)`` change
        the namespace's layout in ZooKeeper (``inner``: the boundary the merge removes); without
        ``apply_merge`` a merge fails at that step and is retried (a misconfigured agent, never a silent
        one)."""
        self.me = me
        self.apply_merge = apply_merge
        # Merges of ours waiting for, or carried on by, other keys' records: partner or merged bundle ->
        # the merging bundles of ours whose plans read it (a change there queues them again).
        self._merge_watch: dict[str, set[str]] = {}
        self.leases = leases
        self.in_flight_timeout_s = in_flight_timeout_s
        # Bundles whose record names this broker from before its current ZooKeeper session (balance.roles):
        # settled through the channel before anything is acquired for them. A new record clears it.
        self.stale: set[str] = set()
        # Where the channel stood when this broker registered in its current session: records before it
        # are stale too (agent/session_barrier.py).
        self.barrier = SessionBarrier()
        self.acquiring: set[str] = set()
        self.channel = channel
        self.adapter = adapter
        self.url_of = url_of
        self.apply_split = apply_split
        self.metrics = metrics
        self.clock = clock
        self.workers = workers
        self.publish_timeout_s = publish_timeout_s
        self.served: set[str] = set()
        self.fenced: set[str] = set()
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._busy: set[str] = set()
        self._again: set[str] = set()  # marked while a worker was on it
        self._done: dict[str, tuple[int, str]] = {}  # bundle -> (version, plan kind) already carried out
        self._failures: dict[str, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.idle = asyncio.Event()
        self.idle.set()
        self.on_served_change = on_served_change
        self._summary: Counter[str] = Counter()

    # ------------------------------------------------------------------ queueing (event loop thread only)
    def mark(self, bundle: str) -> None:
        if bundle in self._queued:
            return
        self._queued.add(bundle)
        self.idle.clear()
        self._queue.put_nowait(bundle)

    def on_change(self, bundle: str, old: Record | None, new: Record | None, predates: bool = False) -> None:
        """A channel change (loop thread): queue the bundle if the change may concern this broker.
        ``predates``: the record entered the channel before this broker's current registration
        (:meth:`SessionBarrier.predates`, judged as it was applied) -- if it names this broker, it is stale."""
        if (
            predates
            and new is not None
            and new.dst == self.me
            and new.state in (State.OWNED, State.ASSIGNING)
        ):
            self.stale.add(bundle)
        else:
            self.stale.discard(bundle)
        if needs_attention(self.me, new) or needs_attention(self.me, old) or bundle in self.served:
            self.mark(bundle)
        for waiting in self._merge_watch.get(bundle, ()):
            self.mark(waiting)

    def rescan(self, table: TableView) -> None:
        """The table caught up: at start, or again after a re-bootstrap (history gap, follower restart),
        when it may differ from what the listeners last heard -- so what the broker serves is checked too
        (in name order: the order bundles are queued in must not depend on the interpreter's string hashes,
        or the simulator, which runs this code, would not replay a seed exactly)."""
        naming_me = 0
        for bundle, rec in table.items():
            if needs_attention(self.me, rec):
                self.mark(bundle)
                naming_me += 1
        for bundle in sorted(self.served):
            self.mark(bundle)
        log.info("channel_scan", bundles=len(table), naming_me=naming_me, serving=len(self.served))

    def mark_stale(self, table: TableView) -> int:
        """A new ZooKeeper session (start-up, or after the last one was lost): every record naming this
        broker as owner or destination was decided before it, and is settled first (balance.roles)."""
        for bundle, rec in table.items():
            if rec.dst == self.me and rec.state in (State.OWNED, State.ASSIGNING):
                self.stale.add(bundle)
                self.mark(bundle)
        return len(self.stale)

    async def fence_all(self, bundles: Iterable[str], reason: str, concurrency: int = 64) -> list[str]:
        """Fence every bundle at once (a lost session, a new incarnation, shutdown); returns those whose
        fence failed (their leases still end them). Fenced bundles are closed later by the plans."""
        todo = sorted(set(bundles))
        if not todo:
            return []
        self.metrics.fenced_all.labels(reason).inc()
        gate = asyncio.Semaphore(concurrency)
        failed: list[str] = []

        async def one(bundle: str) -> None:
            async with gate:
                try:
                    await self.adapter.fence(bundle)
                except (AdapterError, TimeoutError, OSError):
                    failed.append(bundle)
                    return
            if bundle in self.served:
                self._set_served(bundle, False)
            self.fenced.add(bundle)
            self.mark(bundle)

        await asyncio.gather(*(one(b) for b in todo))
        log.warning("fenced_all", reason=reason, bundles=len(todo), failed=len(failed))
        return failed

    def lost(self, bundles: Iterable[str]) -> None:
        """The broker no longer serves these (their leases ran out): acquire again if still ours."""
        for bundle in bundles:
            if bundle in self.served:
                self._set_served(bundle, False)
                self.mark(bundle)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._worker(i), name=f"reconcile-{i}") for i in range(self.workers)
        ]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def pending(self) -> int:
        return len(self._queued) + len(self._busy)

    async def _worker(self, n: int) -> None:
        while True:
            bundle = await self._queue.get()
            self._queued.discard(bundle)
            if bundle in self._busy:
                # Another worker is on it; it re-checks the current record when it finishes.
                self._again.add(bundle)
                continue
            self._busy.add(bundle)
            try:
                await self._handle(bundle)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reconcile_crashed", bundle=bundle)
            finally:
                self._busy.discard(bundle)
                if bundle in self._again:
                    self._again.discard(bundle)
                    self.mark(bundle)
                if not self._queued and not self._busy:
                    self.idle.set()
            # Give the loop back after every bundle. A plan can finish without suspending (only a publish,
            # a forget, an adapter that answers at once) and a queue with items hands the next one over
            # without suspending either, so one worker could otherwise carry a whole failover -- thousands
            # of bundles, seconds -- while lease renewals, lookups and /healthz wait (measured: renewals
            # 2.5 s late, so survivors of the failover benchmark let the leases they had just taken lapse).
            await asyncio.sleep(0)

    def _requeue_later(self, bundle: str, delay: float) -> None:
        asyncio.get_running_loop().call_later(delay, self.mark, bundle)

    # ------------------------------------------------------------------ one bundle
    def _watch_merge(self, bundle: str, cur: Record | None) -> None:
        """Keep :attr:`_merge_watch` current for ``bundle``: a merge of ours is decided by its partner's and
        the merged bundle's records, so changes there must queue it again."""
        if self._merge_watch:
            for key in [k for k, keys in self._merge_watch.items() if bundle in keys]:
                self._merge_watch[key].discard(bundle)
                if not self._merge_watch[key]:
                    del self._merge_watch[key]
        if cur is None or cur.state is not State.MERGING or cur.src != self.me or not cur.children:
            return
        merged = next(iter(cur.children))
        ns, _ = parse_bundle(bundle)
        try:
            partner = merge_partner(bundle, merged)
        except BundleError:
            return  # a shape the channel refuses: never accepted
        for other in (partner, f"{ns}/{merged}"):
            self._merge_watch.setdefault(other, set()).add(bundle)

    async def _handle(self, bundle: str) -> None:
        cur = self.channel.table.get(bundle)
        self._watch_merge(bundle, cur)
        p = plan(
            self.me,
            bundle,
            cur,
            serving=bundle in self.served,
            fenced=bundle in self.fenced,
            now_ms=int(self.clock() * 1000),
            stale=bundle in self.stale,
            late=self._late(bundle, cur),
            lookup=self.channel.table.get,
        )
        if p is None:
            self._failures.pop(bundle, None)
            return
        version = cur.version if cur is not None else 0
        if self._done.get(bundle) == (version, p.kind) and any(isinstance(s, Publish) for s in p.steps):
            return  # this record was already handled; our next record is on its way
        t0 = time.perf_counter()
        try:
            await self._execute(bundle, p)
        except (AdapterError, TransportError, TimeoutError, OSError) as e:
            n = self._failures.get(bundle, 0) + 1
            self._failures[bundle] = n
            delay = min(0.2 * 2 ** (n - 1), 10.0)
            self.metrics.reaction(p.kind, "failed").inc()
            log.warning(
                "reaction_failed",
                bundle=bundle,
                kind=p.kind,
                version=version,
                error=str(e),
                retry_in_s=round(delay, 2),
            )
            self._requeue_later(bundle, delay)
            return
        self._failures.pop(bundle, None)
        self._done[bundle] = (version, p.kind)
        self.metrics.reaction(p.kind, "ok").inc()
        self.metrics.reaction_time(p.kind).observe(time.perf_counter() - t0)
        # Per bundle at debug (the channel itself is the per-bundle audit log); a summary every few
        # seconds at info, so a failover moving thousands of bundles is a handful of lines.
        self._summary[p.kind] += 1
        log.debug(
            "reaction", bundle=bundle, kind=p.kind, version=version, state=cur.state.value if cur else "init"
        )
        if len(self._done) > 200_000:
            self._done.clear()

    async def _merge_step(self, step: MergeOnBroker | PublishMerged | UpdateLayoutMerge) -> None:
        """The steps of a merge (balance/roles.py ``plan_merge``), each idempotent: the partner's plan may
        carry out the same ones."""
        if isinstance(step, MergeOnBroker):
            await self.adapter.merge(list(step.parents), step.merged)
            # The parents' topics are the merged bundle's now, served in place: the parents are no longer
            # served (an override of one of them must not close the merged bundle's topics).
            for parent in step.parents:
                self._set_served(parent, False)
                self.fenced.discard(parent)
            self._set_served(step.merged, True)
        elif isinstance(step, PublishMerged):
            if self.channel.table.get(step.merged) is None:
                rec = intents.place(None, step.owner, writer=self.me, now_ms=int(self.clock() * 1000))
                await self.channel.publish_acked(step.merged, rec, self.publish_timeout_s)
        else:
            if self.apply_merge is None:
                raise AdapterError("this agent cannot change namespace layouts (no apply_merge wired)")
            ns, merged = parse_bundle(step.merged)
            first, second = (parse_bundle(p)[1] for p in step.parents)
            inner = first.upper if first.upper == second.lower else second.upper
            await asyncio.to_thread(self.apply_merge, ns, merged, inner)

    def _publish_last(self, bundle: str, record: Any, version: int, kind: str) -> None:
        """Publish a plan's final record without holding a worker until Kafka acknowledges it.

        Nothing after it depends on the acknowledgement (the channel replay tells us what happened), so
        the worker moves on; a failed delivery comes back through the callback and retries the bundle.
        """
        loop = asyncio.get_running_loop()

        def delivered(err: TransportError | None) -> None:
            if err is not None:
                loop.call_soon_threadsafe(self._delivery_failed, bundle, version, kind, err)

        self.channel.send(bundle, record, delivered)  # no future: a failover publishes thousands at once

    def _delivery_failed(self, bundle: str, version: int, kind: str, exc: BaseException) -> None:
        if self._done.get(bundle) == (version, kind):
            del self._done[bundle]
        n = self._failures.get(bundle, 0) + 1
        self._failures[bundle] = n
        delay = min(0.2 * 2 ** (n - 1), 10.0)
        self.metrics.reaction(kind, "failed").inc()
        log.warning(
            "reaction_failed", bundle=bundle, kind=kind, version=version, error=str(exc), retry_in_s=delay
        )
        self._requeue_later(bundle, delay)

    def _set_served(self, bundle: str, serving: bool) -> None:
        if serving:
            self.served.add(bundle)
            self.fenced.discard(bundle)
        else:
            self.served.discard(bundle)
        self.metrics.owned_bundles.set(len(self.served))
        self.on_served_change(bundle, serving)

    def _late(self, bundle: str, cur: Record | None) -> bool:
        """``cur`` assigns ``bundle`` to us but is too old for any lease (delivered late, e.g. held by a
        producer through a Kafka outage): settled through the channel first (balance/roles.py)."""
        if cur is None or cur.state is not State.ASSIGNING or cur.dst != self.me:
            return False
        limit = self._lease_limit(bundle)
        return limit is not None and limit < MIN_LEASE_S

    def _lease_limit(self, bundle: str) -> float | None:
        """How long a lease on ``bundle`` may last by its current record (None: not ours to vouch for)."""
        return self.leases.limit(
            self.me,
            bundle,
            self.channel.table.get(bundle),
            in_flight_timeout_s=self.in_flight_timeout_s,
            stale=bundle in self.stale,
        )

    async def _execute(self, bundle: str, p: Plan) -> None:
        for step in p.steps:
            if isinstance(step, Acquire):
                # The record is read again once the session is confirmed (LeaseGuard.lease_for_acquire):
                # it may have moved on while we planned or while the confirmation waited; the next plan
                # decides then.
                lease = await self.leases.lease_for_acquire(lambda: self._lease_limit(bundle))
                if lease is None:
                    return
                self.acquiring.add(bundle)  # renewed while the broker takes it over (a slow acquire)
                try:
                    await self.adapter.acquire(bundle, lease)
                finally:
                    self.acquiring.discard(bundle)
                self._set_served(bundle, True)
            elif isinstance(step, Fence):
                await self.adapter.fence(bundle)
                self._set_served(bundle, False)
                self.fenced.add(bundle)
            elif isinstance(step, Close):
                url = self.url_of(step.redirect_to) if step.redirect_to else None
                await self.adapter.close(bundle, url)
                self._set_served(bundle, False)
                self.fenced.discard(bundle)
            elif isinstance(step, SplitOnBroker):
                await self.adapter.split(bundle, list(step.children))
            elif isinstance(step, PublishChildren):
                now = int(self.clock() * 1000)
                futs = []
                for child in step.children:
                    if self.channel.table.get(child) is None:
                        rec = intents.place(None, step.owner, writer=self.me, now_ms=now)
                        futs.append(asyncio.wrap_future(self.channel.publish(child, rec)))
                if futs:
                    async with asyncio.timeout(self.publish_timeout_s):
                        await asyncio.gather(*futs)
            elif isinstance(step, UpdateLayout):
                ns, parent = parse_bundle(bundle)
                children = sorted(parse_bundle(c)[1] for c in step.children)
                await asyncio.to_thread(self.apply_split, ns, parent, children)
            elif isinstance(step, MergeOnBroker | PublishMerged | UpdateLayoutMerge):
                await self._merge_step(step)
            elif isinstance(step, Forget):
                self._set_served(bundle, False)
                self.fenced.discard(bundle)
            elif isinstance(step, Publish):
                cur = self.channel.table.get(bundle)
                self._publish_last(bundle, step.record, cur.version if cur is not None else 0, p.kind)
            else:  # pragma: no cover - exhaustive over Step
                raise AssertionError(step)
