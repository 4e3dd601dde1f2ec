"""Automatic merges of this broker's cold neighbouring bundles (issue 32 point 5; docs/operations.md,
"Merging bundles").

Splits only ever add bundles; after a traffic peak a namespace keeps every one of them. Every
``merge.interval_s`` this scheduler feeds the broker's latest per-bundle stats (those of the last load
report, else a fresh sample) to :func:`balance.merge.merge_candidates` for each namespace it holds bundles
of, and starts each merge it decides: ``Merging{src=me, children={merged: me}}`` for both parents; the
reconciler then carries the merge out like any other step it owes (:mod:`balance.roles`).

Why here, beside the split scheduler, and not in the leader: a merge needs the figures of *cold* bundles,
which only their owner has (the leader reads each broker's top bundles, the hot ones). So, as splits, the
owner decides, for pairs it owns both of; a pair split across two brokers is skipped as ``owners_differ``
until one broker owns both (a transfer, a drain, the shedder). Off by default (``merge.enabled``); paused
while the broker drains.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from trimtab.agent.adapters.base import Sampler
from trimtab.agent.metrics import AgentMetrics
from trimtab.agent.ownjobs import OwnerJobs
from trimtab.agent.reporter import LoadReporter
from trimtab.balance.merge import MergeDecision, MergeLimits, half_written, merge_candidates, merge_room
from trimtab.channel import intents
from trimtab.channel.bundles import BundleLayout, bundle_name, merged_range, parse_bundle
from trimtab.channel.client import ChannelClient
from trimtab.channel.records import Record
from trimtab.cluster.events import EventPublisher
from trimtab.cluster.runner import Schedule
from trimtab.config.settings import Settings
from trimtab.errors import BundleError, TransportError

log = structlog.get_logger("trimtab.agent")

#: A namespace's current layout as ZooKeeper holds it (None: no such namespace). Read for every check, not
#: from the lookups' cache: a cold namespace is rarely looked up, and cold namespaces are what merges are for.
LayoutSource = Callable[[str], Awaitable["BundleLayout | None"]]


class MergeScheduler:
    def __init__(
        self,
        me: str,
        channel: ChannelClient,
        *,
        reporter: LoadReporter,
        adapter: Sampler,
        layouts: LayoutSource,
        events: EventPublisher,
        metrics: AgentMetrics,
        limits: MergeLimits,
        interval_s: float,
        paused: Callable[[], bool],
        clock: Callable[[], float] = time.time,
        publish_timeout_s: float = 30.0,
    ) -> None:
        self.me = me
        self.channel = channel
        self.reporter = reporter
        self.adapter = adapter
        self.layouts = layouts
        self.events = events
        self.metrics = metrics
        self.limits = limits
        self.interval_s = interval_s
        self._paused = paused
        self.clock = clock
        self.publish_timeout_s = publish_timeout_s
        self.hits: dict[str, dict[str, int]] = {}  # namespace -> merged bundle -> consecutive cold checks
        self.last: dict[str, Any] | None = None  # the last check, for the agent's status

    @classmethod
    def from_settings(cls, s: Settings, jobs: OwnerJobs, *, layouts: LayoutSource) -> MergeScheduler:
        """One construction for the agent's wiring and the simulator's agents."""
        return cls(
            jobs.me,
            jobs.channel,
            reporter=jobs.reporter,
            adapter=jobs.adapter,
            layouts=layouts,
            events=jobs.events,
            metrics=jobs.metrics,
            limits=MergeLimits.from_settings(s),
            interval_s=s.merge.interval_s,
            paused=jobs.paused,
            clock=jobs.clock,
        )

    def schedule(self) -> Schedule:
        """Every ``merge.interval_s`` (the first one interval after start)."""
        return Schedule(self.interval_s, first="after")

    def active(self) -> bool:
        """Auto-merging is on and not paused (a drain pauses it)."""
        return self.limits.enabled and not self._paused()

    async def merge_cycle(self) -> list[MergeDecision]:
        """One check of every namespace this broker owns a bundle of; returns the merges started. First,
        this agent's own merges left half written are aborted (:func:`balance.merge.half_written`)."""
        await self._abort_half_written(after_ms=int(self.publish_timeout_s * 2000))
        stats = {b.bundle: b for b in (self.reporter.last_bundles or (await self.adapter.sample()).bundles)}
        table = self.channel.table
        mine: set[str] = set()
        for bundle in stats:
            try:
                namespace = parse_bundle(bundle)[0]
            except BundleError:  # a broker's sample is its bytes: a bad name is skipped, never fatal
                self.metrics.merges.labels("bad_bundle_name").inc()
                continue
            if intents.owned_by(table.get(bundle), self.me):  # not every name a broker reports: its own
                mine.add(namespace)
        started: list[MergeDecision] = []
        skipped: Counter[str] = Counter()
        for ns in sorted(mine):
            try:
                layout = await self.layouts(ns)
            # ZooKeeper away, or a hostile znode: this namespace waits for the next check, the rest go on.
            except Exception as e:
                self.metrics.merges.labels("layout_unavailable").inc()
                log.warning("merge_layout_unavailable", namespace=ns, error=str(e) or type(e).__name__)
                continue
            if layout is None:
                continue  # deleted meanwhile
            # The namespace's bundles and the names their merges would take (a leftover record there
            # blocks a merge: merged_exists).
            names = layout.bundles + [
                bundle_name(ns, merged_range(lo, hi)) for lo, hi in itertools.pairwise(layout.ranges)
            ]
            records = {name: rec for name in names if (rec := table.get(name)) is not None}
            cycle = merge_candidates(
                layout,
                records,
                stats,
                self.limits,
                self.hits.get(ns),
                owner=self.me,
                room=merge_room(layout, records, self.me, self.limits.min_bundles_per_namespace),
                budget=self.limits.max_merges_per_cycle - len(started),
            )
            self.hits[ns] = cycle.hits
            for _merged, reason in cycle.skipped:
                self.metrics.merges.labels(reason).inc()
                skipped[reason] += 1
            for d in cycle.decisions:
                if self._paused():
                    break  # a drain began during this check: start nothing more
                if await self._start(d):
                    started.append(d)
        # Forget the counters of namespaces this broker no longer holds bundles of.
        for ns in set(self.hits) - mine:
            del self.hits[ns]
        self.last = {
            "at_ms": int(self.clock() * 1000),
            "namespaces": len(mine),
            "started": [d.merged for d in started],
            "skipped": dict(sorted(skipped.items())),
        }
        return started

    def status(self) -> dict[str, Any]:
        """For the agent's ``/v1/status``: on or off, paused or not, and what the last check did and why it
        left the other pairs alone (the same reasons as ``trimtab_merges_total``)."""
        return {"enabled": self.limits.enabled, "paused": self._paused(), "last_check": self.last}

    async def _abort_half_written(self, after_ms: int, only: str | None = None) -> None:
        """Abort this agent's half-written merges (all of them, or ``only`` that bundle's) older than
        ``after_ms``: the bundle is ``Owned`` here again instead of waiting for a second half that is not
        coming."""
        table = self.channel.table
        now = int(self.clock() * 1000)
        found = [(only, table.get(only))] if only is not None else table.items()
        for bundle, rec in found:
            if rec is None or not half_written(
                self.me, bundle, rec, table.get, now_ms=now, after_ms=after_ms
            ):
                continue
            try:
                aborted = intents.abort_merge(rec, self.me, now_ms=now)
                await self.channel.publish_acked(bundle, aborted, self.publish_timeout_s)
            except (intents.IntentRefused, TransportError, TimeoutError) as e:
                log.warning("merge_abort_failed", bundle=bundle, error=str(e) or type(e).__name__)
                continue
            self.metrics.merges.labels("aborted_half_written").inc()
            log.info("merge_aborted_half_written", bundle=bundle)

    async def _start(self, d: MergeDecision) -> bool:
        """Both ``Merging`` records, each from the table as it stands. If the second cannot be written, the
        first is aborted at once if its partner is still ``Owned`` here (the merge flow would wait for the
        second half, balance/roles.py); if the partner moved meanwhile, the flow aborts it by itself. A
        second half that Kafka delivers after all is aborted by the next check."""
        _, union = d.merged.rsplit("/", 1)
        now = int(self.clock() * 1000)
        for bundle in (d.left, d.right):
            cur: Record | None = self.channel.table.get(bundle)
            try:
                rec = intents.merge(cur, self.me, union, writer=self.me, now_ms=now)
                await self.channel.publish_acked(bundle, rec, self.publish_timeout_s)
            except (intents.IntentRefused, TransportError, TimeoutError) as e:
                self.metrics.merges.labels("refused").inc()
                log.info("merge_refused", bundle=bundle, merged=d.merged, reason=str(e) or type(e).__name__)
                if bundle == d.right:  # the first half is written: take it back now, not at the next check
                    await self._abort_half_written(after_ms=0, only=d.left)
                return False
        self.metrics.merges.labels("started").inc()
        self.events.publish("merge", bundle=d.merged, parents=[d.left, d.right], reason="cold")
        log.info("merge_started", merged=d.merged, parents=[d.left, d.right])
        return True
