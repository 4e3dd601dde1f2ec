"""Bundle splits started by this broker (docs/design.md section 5.3): the automatic split scheduler and
the admin split.

Every ``split.interval_s`` the scheduler feeds the latest per-bundle stats of the broker (those of the
last load report, else a fresh sample) to :func:`balance.split.decide_splits` and publishes
``Splitting{src=me, children}`` for each decision; the reconciler then carries the split out like any
other step it owes (:mod:`balance.roles`). Only the owner may start a split: a bundle owned elsewhere is
refused with 409, a bundle in flight on this broker with a retryable 503. Paused while draining.

With ``split.auto_unload`` (Pulsar's ``loadBalancerAutoUnloadSplitBundlesEnabled``, as the modular load
manager's auto-split honours it: ``splitAndOwnBundle(..., unload=true)``), the children of an automatic
split are unloaded once the split is done -- ``Releasing{src=me, dst=None}`` each, so the next lookup
places them on the least loaded broker instead of both staying here until the shedder moves one. The
scheduler waits for the children for up to ``children_wait_s`` after publishing the split; children not
there yet are unloaded at the next cycle. A child that moved meanwhile, or is in flight, is left alone.
Without it, as Pulsar's extensible load manager does, children start on the parent's owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import structlog

from trimtab.agent.adapters.base import Sampler
from trimtab.agent.metrics import AgentMetrics
from trimtab.agent.ownjobs import OwnerJobs
from trimtab.agent.reporter import LoadReporter
from trimtab.balance.load import BundleStats
from trimtab.balance.split import SplitDecision, SplitLimits, children_for, decide_splits
from trimtab.channel import intents
from trimtab.channel.bundles import BundleLayout, parse_bundle
from trimtab.channel.client import ChannelClient
from trimtab.channel.records import Record
from trimtab.cluster.events import EventPublisher
from trimtab.cluster.runner import Schedule
from trimtab.config.settings import Settings
from trimtab.errors import BundleError, RequestError

log = structlog.get_logger("trimtab.agent")

#: How long a child of an automatic split is awaited for ``split.auto_unload`` before it is given up: far
#: longer than the leader takes to force a stuck split onward (channel.in_flight_timeout_s plus a monitor
#: period, 90 s by default) -- a child still missing by then belongs to a split that did not happen.
CHILD_WAIT_MAX_S = 600.0


class Layouts(Protocol):
    """The bundle layout of every namespace seen (:class:`~trimtab.agent.lookup.LayoutCache`)."""

    def cached(self) -> Mapping[str, BundleLayout]: ...


class SplitRefused(RequestError):
    """A split this agent will not start (not the owner, bad input, in flight)."""


class SplitScheduler:
    def __init__(
        self,
        me: str,
        channel: ChannelClient,
        *,
        reporter: LoadReporter,
        adapter: Sampler,
        layouts: Layouts,
        events: EventPublisher,
        metrics: AgentMetrics,
        limits: SplitLimits,
        enabled: bool,
        interval_s: float,
        paused: Callable[[], bool],
        clock: Callable[[], float] = time.time,
        publish_timeout_s: float = 30.0,
        auto_unload: bool = False,
        children_wait_s: float = 30.0,
    ) -> None:
        """``reporter`` gives the stats of the last load report; ``layouts`` the bundle count of every
        namespace seen; ``paused`` (draining) suspends the automatic splits (not the admin ones)."""
        self.me = me
        self.channel = channel
        self.reporter = reporter
        self.adapter = adapter
        self.layouts = layouts
        self.events = events
        self.metrics = metrics
        self.limits = limits
        self.enabled = enabled
        self.interval_s = interval_s
        self._paused = paused
        self.clock = clock
        self.publish_timeout_s = publish_timeout_s
        self.hits: dict[str, int] = {}  # consecutive cycles each bundle was over a limit
        self.auto_unload = auto_unload
        self.children_wait_s = children_wait_s
        # Children of automatic splits to unload once they are Owned here: child -> (the split's reason,
        # when it was published, s).
        self.unload_after: dict[str, tuple[str, float]] = {}
        self._children_changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        # Registered before the channel is followed (and never removed: the follower iterates its listeners).
        channel.table.add_listener(self._record_changed)

    @classmethod
    def from_settings(cls, s: Settings, jobs: OwnerJobs, *, layouts: Layouts) -> SplitScheduler:
        """The scheduler with the ``split`` settings (limits, cadence, auto-unload): one construction for the
        agent's wiring and the simulator's agents."""
        return cls(
            jobs.me,
            jobs.channel,
            reporter=jobs.reporter,
            adapter=jobs.adapter,
            layouts=layouts,
            events=jobs.events,
            metrics=jobs.metrics,
            limits=SplitLimits.from_settings(s),
            enabled=s.split.enabled,
            interval_s=s.split.interval_s,
            paused=jobs.paused,
            clock=jobs.clock,
            auto_unload=s.split.auto_unload,
        )

    def owned(self) -> set[str]:
        return {k for k, r in self.channel.naming(self.me).items() if intents.owned_by(r, self.me)}

    def schedule(self) -> Schedule:
        """Every ``split.interval_s`` (the first one interval after start)."""
        return Schedule(self.interval_s, first="after")

    def active(self) -> bool:
        """Auto-splitting is on and not paused (a drain pauses it)."""
        return self.enabled and not self._paused()

    async def split_cycle(self) -> list[SplitDecision]:
        self._loop = asyncio.get_running_loop()
        stats = self.reporter.last_bundles or (await self.adapter.sample()).bundles
        counts = {ns: len(layout) for ns, layout in self.layouts.cached().items()}
        cycle = decide_splits(stats, self.hits, self.limits, namespace_bundles=counts, owned=self.owned())
        self.hits = cycle.hits
        for _bundle, reason in cycle.skipped:
            self.metrics.splits.labels("auto", reason).inc()
        for d in cycle.decisions:
            try:
                await self.publish_split(d)
                self.metrics.splits.labels(d.reason, "published").inc()
            except SplitRefused as e:
                self.metrics.splits.labels(d.reason, "refused").inc()
                log.info("split_refused", bundle=d.bundle, reason=str(e))
                continue
            if self.auto_unload:
                ns, now = d.bundle.rsplit("/", 1)[0], self.clock()
                self.unload_after.update((f"{ns}/{c.name}", (d.reason, now)) for c in d.children)
        if self.unload_after:  # this cycle's children, and those of earlier ones that were not there yet
            await self.unload_children(self.children_wait_s)
        return cycle.decisions

    def _record_changed(self, bundle: str, old: Record | None, new: Record | None) -> None:
        """A channel listener (on the follower thread): wake :meth:`unload_children` for a child it awaits."""
        loop = self._loop
        if loop is not None and bundle in self.unload_after and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (shutdown)
                loop.call_soon_threadsafe(self._children_changed.set)

    async def unload_children(self, wait_s: float) -> list[str]:
        """Unload the awaited split children that are Owned here now, waiting up to ``wait_s`` for the rest
        (the reconciler publishes them when it carries the split out). Returns the children unloaded."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        done: list[str] = []
        while self.unload_after:
            self._children_changed.clear()
            for child, (reason, since) in sorted(self.unload_after.items()):
                cur = self.channel.table.get(child)
                if cur is None:
                    if self.clock() - since > CHILD_WAIT_MAX_S:
                        del self.unload_after[child]
                        log.warning(
                            "split_child_never_appeared", bundle=child, waited_s=round(self.clock() - since)
                        )
                    continue  # the split is not done yet
                del self.unload_after[child]
                if not intents.owned_by(cur, self.me):
                    continue  # moved (or moving) since: not ours to unload
                rec = intents.release(
                    cur, src=self.me, dst=None, writer=self.me, now_ms=int(self.clock() * 1000)
                )
                try:
                    await self.channel.publish_acked(child, rec, self.publish_timeout_s)
                except Exception as e:
                    log.warning("split_child_unload_failed", bundle=child, error=str(e))
                    continue
                self.metrics.splits.labels(reason, "child_unloaded").inc()
                done.append(child)
            remaining = deadline - loop.time()
            if not self.unload_after or remaining <= 0:
                break
            try:
                async with asyncio.timeout(remaining):
                    await self._children_changed.wait()
            except TimeoutError:
                break
        if done:
            log.info("split_children_unloaded", bundles=done)
            self.events.publish("split_children_unloaded", bundles=done)
        return done

    def check_owned(self, bundle: str) -> Record:
        """The bundle's Owned record, if this broker may split it now; else :class:`SplitRefused` (409 owned
        elsewhere or not at all, 503 in flight here)."""
        cur = self.channel.table.get(bundle)
        if cur is not None and cur.state.in_flight and cur.names(self.me):
            raise SplitRefused(503, f"{bundle} is {cur.state.value} here right now; retry in a moment")
        if not intents.owned_by(cur, self.me):
            owner = cur.owner() if cur else None
            raise SplitRefused(409, f"{bundle} is not owned by this broker (owner: {owner}); ask its owner")
        assert cur is not None
        return cur

    async def publish_split(self, d: SplitDecision) -> Record:
        cur = self.check_owned(d.bundle)
        children = [c.name for c in d.children]
        rec = intents.split(cur, self.me, children, writer=self.me, now_ms=int(self.clock() * 1000))
        await self.channel.publish_acked(d.bundle, rec, self.publish_timeout_s)
        self.events.publish("split", bundle=d.bundle, reason=d.reason, children=children)
        log.info("split_published", bundle=d.bundle, reason=d.reason, children=children)
        return rec

    async def admin_split(
        self, bundle: str, algorithm: str | None, boundaries: list[int], *, dry_run: bool = False
    ) -> SplitDecision:
        """Split ``bundle`` now (``algorithm`` defaults to ``split.algorithm``, or to
        specified_positions_divide when ``boundaries`` are given). A dry run makes the same checks and
        returns the children without publishing anything."""
        try:
            parse_bundle(bundle)
        except BundleError as e:
            raise SplitRefused(400, str(e)) from None
        stats = next(
            (b for b in self.reporter.last_bundles if b.bundle == bundle), BundleStats(bundle=bundle)
        )
        algo = algorithm or ("specified_positions_divide" if boundaries else self.limits.algorithm)
        try:
            children = children_for(stats, self.limits, algo, tuple(boundaries))
        except BundleError as e:
            raise SplitRefused(400, str(e)) from None
        if not children:
            raise SplitRefused(422, f"{algo} found no split boundary for {bundle}")
        decision = SplitDecision(bundle, "admin", children)
        if dry_run:
            self.check_owned(bundle)
            self.metrics.splits.labels("admin", "dry_run").inc()
            return decision
        await self.publish_split(decision)
        self.metrics.splits.labels("admin", "published").inc()
        return decision
