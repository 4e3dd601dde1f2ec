"""Warm standbys on the agent (docs/placement.md, "Warm standbys"): the broker is asked to pre-warm every
bundle the leader made it a standby for, so that taking one over after its owner fails is quick.

Woken by changes of the standby topic (and every ``resync_s`` as a safety net), it asks the adapter to
``prewarm`` each newly assigned bundle once. Pre-warming is advice: a failure is counted and retried at the
next wake, never fatal, and a bundle this broker owns is not pre-warmed (it is already served).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from trimtab.agent.adapters.base import BrokerAdapter
from trimtab.agent.metrics import AgentMetrics
from trimtab.cluster.placement.standbys import StandbyIndex
from trimtab.cluster.runner import Schedule

log = structlog.get_logger("trimtab.agent")


class Prewarmer:
    def __init__(
        self,
        me: str,
        adapter: BrokerAdapter,
        index: StandbyIndex,
        owned: Callable[[], set[str]],
        metrics: AgentMetrics,
        *,
        resync_s: float = 30.0,
        debounce_s: float = 0.2,
    ) -> None:
        self.me = me
        self.adapter = adapter
        self.index = index
        self.owned = owned
        self.metrics = metrics
        self.resync_s = resync_s
        self.debounce_s = debounce_s
        self.prewarmed: set[str] = set()
        self._wake = asyncio.Event()

    def changed(self) -> None:
        """The standby sets changed (on the loop)."""
        self._wake.set()

    def schedule(self) -> Schedule:
        """When the standby sets change (a burst of changes is one pass), and every ``resync_s``."""
        return Schedule(self.resync_s, wake=self._wake, first="after", settle_s=self.debounce_s)

    async def sync_once(self) -> list[str]:
        """Pre-warm what this broker newly stands by for; returns the bundles asked for."""
        want = self.index.standing_by(self.me) - self.owned()
        self.metrics.standby_bundles.set(len(want))
        self.prewarmed &= want
        asked = []
        for bundle in sorted(want - self.prewarmed):
            try:
                await self.adapter.prewarm(bundle)
            except Exception as e:
                self.metrics.prewarms.labels("failed").inc()
                log.warning("prewarm_failed", bundle=bundle, error=str(e))
                continue
            self.prewarmed.add(bundle)
            self.metrics.prewarms.labels("ok").inc()
            asked.append(bundle)
        if asked:
            log.info("prewarmed", bundles=len(asked), standing_by=len(want))
        return asked
