"""Draining before exit (docs/design.md section 7): the first SIGTERM marks the broker draining in its
registration (so nobody assigns to it, this agent included), transfers every bundle it owns to another
broker -- ``Releasing{src=me, dst=B}``, or a plain unload when no other broker is left -- and waits,
bounded by ``agent.drain_timeout_s``, until the channel names it nowhere *and* its broker closed (with
redirects) everything it fenced. Exiting earlier would drop clients without telling them where to go.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterable, Set
from typing import Protocol

import structlog

from trimtab.agent.identity import BrokerIdentity
from trimtab.agent.metrics import AgentMetrics
from trimtab.balance.assign import (
    AssignContext,
    BurstPicks,
    PlacementRule,
    Selection,
    headed_to,
    select_broker,
)
from trimtab.channel import intents
from trimtab.channel.client import ChannelClient
from trimtab.channel.records import Record, State
from trimtab.cluster.zk import Registration

log = structlog.get_logger("trimtab.agent")


class Closing(Protocol):
    """What the broker still serves or keeps fenced (the :class:`~trimtab.agent.reconciler.Reconciler`'s
    view; the simulated broker's in the simulator): the drain is over only once both are empty."""

    @property
    def served(self) -> Set[str]: ...

    @property
    def fenced(self) -> Set[str]: ...


class Drainer:
    def __init__(
        self,
        identity: BrokerIdentity,
        channel: ChannelClient,
        reconciler: Closing,
        registry: Registration,
        *,
        assign_context: Callable[[frozenset[str]], AssignContext],
        placement: PlacementRule,
        rng: random.Random,
        metrics: AgentMetrics,
        timeout_s: float,
        diff: float,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        poll_s: float = 0.05,
    ) -> None:
        """``reconciler`` tells what the broker still serves or keeps fenced; ``registry`` where the
        bundles can go (live brokers not draining) and where the draining flag is published. ``diff``:
        ``assignment.average_usage_diff_threshold_pct`` as a fraction, the same margin lookups choose by --
        a drain that ignored it would place by a different rule than the lookups that place the same
        bundles otherwise."""
        self.identity = identity
        self.me = identity.id
        self.channel = channel
        self.reconciler = reconciler
        self.registry = registry
        self._assign_context = assign_context
        self._placement = placement
        self.rng = rng
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.diff = diff
        self.clock = clock
        self._monotonic = monotonic
        self.poll_s = poll_s
        self.draining = False

    async def mark(self) -> None:
        """Draining from now on: published in the registration, so that nothing new is assigned here.
        The drain itself marks first; a drain the leader runs as an operation only marks (the leader moves
        the bundles)."""
        self.draining = True
        self.metrics.draining.set(1)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.registry.update, self.identity.info(draining=True))

    async def unmark(self) -> None:
        """Not draining any more (a maintenance the leader ran is over): registered to take bundles again."""
        await asyncio.to_thread(self.registry.update, self.identity.info(draining=False))
        self.draining = False  # only once registered so: a failed update can be retried
        self.metrics.draining.set(0)

    def owned(self) -> set[str]:
        return {k for k, r in self.channel.naming(self.me).items() if intents.owned_by(r, self.me)}

    def picks(self, bundles: int) -> BurstPicks:
        """The ledger of one drain of ``bundles`` bundles, starting from what the channel already gives
        each broker beyond its last report (see :class:`BurstPicks`)."""
        headed = headed_to(r for _, r in self.channel.table.items())
        return BurstPicks.for_drain(self._assign_context(frozenset()).loads, self.me, bundles, headed)

    def destination(self, bundle: str, picks: BurstPicks | None = None) -> Selection:
        """Where the drain sends ``bundle`` now: a live, non-draining broker other than this one, chosen
        by the placement rules (warm standbys first) and then load -- counting what ``picks`` already sent
        each broker in this drain; ``broker`` None -- a plain unload -- when the rules allow nobody. The
        drain and its dry run both ask this."""
        others = {k: v for k, v in self.registry.brokers.items() if k != self.me and not v.draining}
        ctx = self._assign_context(frozenset({self.me}))
        select = select_broker if picks is None else picks.select
        return select(bundle, others, ctx, self.rng, placement=self._placement, diff=self.diff)

    def plan(self) -> dict[str, Selection]:
        """A dry run: each owned bundle and where :meth:`destination` would send it now."""
        owned = sorted(self.owned())
        picks = self.picks(len(owned))
        return {bundle: self.destination(bundle, picks) for bundle in owned}

    def _naming_me(self, records: Iterable[tuple[str, Record]] | None = None) -> dict[str, Record]:
        """The records that keep the drain going: owned by this broker, or in flight with it named. From
        the index of the records naming it (not a scan of the whole table every poll); from ``records``
        when given."""
        me = self.me
        return {
            k: r
            for k, r in (self.channel.naming(me).items() if records is None else records)
            if (r.state is State.OWNED and r.dst == me) or (r.state.in_flight and r.names(me))
        }

    async def drain(self, force_exit: asyncio.Event) -> str:
        """Transfer every owned bundle away and wait until they are owned elsewhere and closed here.

        Returns "" when done, else why it stopped early (``force_exit`` set, or the drain timeout)."""
        await self.mark()
        deadline = self._monotonic() + self.timeout_s
        requested: dict[str, int] = {}  # bundle -> version we asked to release
        owned = len(self.owned())
        picks = self.picks(owned)
        log.info("drain_started", owned=owned, timeout_s=self.timeout_s)
        while True:
            mine = self._naming_me()
            closing = self.reconciler.served | self.reconciler.fenced
            if not mine and not closing:
                log.info("drain_complete", moved=len(requested))
                return ""
            if force_exit.is_set() or self._monotonic() > deadline:
                why = "second signal" if force_exit.is_set() else "drain timeout"
                log.warning("drain_incomplete", reason=why, bundles_left=len(mine), not_closed=len(closing))
                return f"drain incomplete ({why}): {len(mine)} bundles left"
            if any(r.state is State.OWNED and requested.get(b) != r.version for b, r in mine.items()):
                # Releases to ask for: in the table's order, as drains always chose their destinations
                # (the picks depend on it) -- one scan, only in the polls that have something to release.
                mine = self._naming_me(self.channel.table.items())
            for bundle, rec in mine.items():
                if rec.state is not State.OWNED or requested.get(bundle) == rec.version:
                    continue
                sel = self.destination(bundle, picks)
                # sel.broker None: a plain unload, when no other broker is left
                nxt = intents.release(
                    rec, src=self.me, dst=sel.broker, writer=self.me, now_ms=int(self.clock() * 1000)
                )
                self.channel.publish(bundle, nxt)
                requested[bundle] = rec.version
            # The channel and the broker move on other threads and tasks; re-check shortly.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_s):
                    await force_exit.wait()
