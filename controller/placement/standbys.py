"""Warm standbys, leader only (KIP-708; docs/placement.md "Warm standbys"): every
``placement.standby_interval_s`` the standby sets of all owned bundles are computed with the placement
rules and the sets that changed are written to the standby topic (cluster/placement/standbys.py), where agents read
what to pre-warm and healing reads whom to prefer. Not destructive -- nothing moves -- so it runs whenever
this controller leads, safe mode included.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable

import msgspec
import structlog

from trimtab.balance.placement import StandbySpec
from trimtab.channel.transport import Transport
from trimtab.cluster.placement.standbys import StandbyIndex, StandbySet
from trimtab.cluster.placement.view import LivePlacement
from trimtab.controller.leadership import Leadership
from trimtab.controller.metrics import ControllerMetrics

log = structlog.get_logger("trimtab.controller")
_enc = msgspec.json.Encoder()


class StandbyJob:
    name = "standbys"

    def __init__(
        self,
        placement: LivePlacement,
        index: StandbyIndex,
        transport: Transport,
        topic: str,
        leadership: Leadership,
        metrics: ControllerMetrics,
        spec: StandbySpec,
        *,
        view_ready: Callable[[], bool] = lambda: True,
        ack_timeout_s: float = 30.0,
    ) -> None:
        """``view_ready``: whether the standby topic has been read to its end -- until then what was
        published is unknown and every set would be rewritten."""
        self.placement = placement
        self.index = index
        self.transport = transport
        self.topic = topic
        self.leadership = leadership
        self.metrics = metrics
        self.spec = spec
        self.ack_timeout_s = ack_timeout_s
        self.view_ready = view_ready

    async def run_once(self) -> int:
        """Recompute and publish what changed; returns the number of records written."""
        if not self.leadership.is_leader:
            return 0
        published = self.index.snapshot()
        if self.spec.replicas > 0:
            # a dead owner's bundles keep the standbys that pre-warmed them until healing moves them
            sets = await asyncio.to_thread(self.placement.standbys, self.spec, published)
        else:
            sets = {}
        self._observe(sets)
        if not self.view_ready():
            log.info("standbys_not_published", reason="the standby topic has not been read yet")
            return 0
        term = self.leadership.term()
        writes: list[tuple[str, bytes | None]] = [
            (b, _enc.encode(StandbySet(brokers=brokers, term=term)))
            for b, brokers in sets.items()
            if brokers and tuple(brokers) != published.get(b)
        ]
        writes += [(b, None) for b in published if not sets.get(b)]
        if not writes:
            return 0
        futs = [self.transport.produce(self.topic, b.encode(), value) for b, value in writes]
        await asyncio.to_thread(concurrent.futures.wait, futs, self.ack_timeout_s)
        ok = 0
        for (bundle, value), f in zip(writes, futs, strict=True):
            kind = "set" if value is not None else "tombstone"
            if f.done() and f.exception() is None:
                ok += 1
                self.metrics.standby_writes.labels(kind, "ok").inc()
            else:
                self.metrics.standby_writes.labels(kind, "failed").inc()
                log.warning(
                    "standby_write_failed", bundle=bundle, error=str(f.exception()) if f.done() else "timeout"
                )
        log.info("standbys_published", written=ok, bundles=len(sets), replicas=self.spec.replicas)
        return ok

    def _observe(self, sets: dict[str, list[str]]) -> None:
        want = self.spec.replicas
        full = sum(1 for v in sets.values() if len(v) >= want)
        self.metrics.standby_coverage.set(full / len(sets) if sets and want else 1.0)
        self.metrics.standby_missing.set(sum(max(0, want - len(v)) for v in sets.values()) if want else 0)
