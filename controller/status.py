"""``/v1/status``: one page an operator reads first -- who leads, safe mode, the channel, every live
broker with its load and bundle count, the load spread against the target, shedding and healing state,
the running operations with their progress (leader only: only it holds them), and the latest decisions."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec

from trimtab.balance.explain import explain_bundle, explain_cluster
from trimtab.balance.load import BrokerLoadData, is_fresh
from trimtab.channel.client import ChannelClient
from trimtab.cluster.kvview import KeyValueView
from trimtab.cluster.placement.view import LivePlacement
from trimtab.cluster.zk import BrokerRegistry
from trimtab.config.settings import SheddingSettings
from trimtab.controller.healing import Healer
from trimtab.controller.journal import DecisionJournal
from trimtab.controller.leadership import Leadership
from trimtab.controller.operations import OperationsJob
from trimtab.controller.shedding import SheddingJob


class StatusReport:
    def __init__(
        self,
        leadership: Leadership,
        channel: ChannelClient,
        registry: BrokerRegistry,
        loads: KeyValueView[BrokerLoadData],
        shedding: SheddingJob,
        healer: Healer,
        journal: DecisionJournal,
        settings: SheddingSettings,
        operations: OperationsJob | None = None,
        placement: LivePlacement | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.leadership = leadership
        self.channel = channel
        self.registry = registry
        self.loads = loads
        self.shedding = shedding
        self.healer = healer
        self.journal = journal
        self.settings = settings
        self.operations = operations
        self.placement = placement
        self.clock = clock

    def brokers(self) -> dict[str, dict[str, Any]]:
        loads = self.loads.snapshot()
        counts: dict[str, int] = {}
        for _, r in self.channel.table.items():
            o = r.owner()
            if o is not None:
                counts[o] = counts.get(o, 0) + 1
        out = {}
        for b, info in sorted(self.registry.brokers.items()):
            ld = loads.get(b)
            out[b] = {
                "bundles": counts.get(b, 0),
                "load": round(ld.weighted_max_ema, 4) if ld else None,
                "msg_rate": round(ld.msg_rate, 1) if ld else None,
                "draining": info.draining,
            }
        return out

    def render(self) -> dict[str, Any]:
        lead = self.leadership
        leader = lead.election.leader()
        brokers = self.brokers()
        values = [v["load"] for v in brokers.values() if v["load"] is not None]
        avg = sum(values) / len(values) if values else 0.0
        std = (sum((v - avg) ** 2 for v in values) / len(values)) ** 0.5 if values else 0.0
        last = self.shedding.last
        return {
            "controller": lead.me,
            "leader": msgspec.to_builtins(leader) if leader else None,
            "is_leader": lead.is_leader,
            "term": lead.election.term,
            "safe_mode": lead.safe_mode(),
            "zookeeper": lead.zk.state,
            "channel": self.channel.status(),
            "brokers": brokers,
            "load": {"avg": round(avg, 4), "std": round(std, 4), "target_std": self.settings.target_std},
            "shedding": {
                "enabled": self.settings.enabled,
                "paused": self.shedding.switches.shedding_paused,
                "strategy": self.settings.strategy,
                "hit_count": self.shedding.state.hit_count,
                "last": {"result": last.result, "reason": last.reason} if last else None,
            },
            "healing": self.healer.status(),
            "operations": self.operations.status()
            if self.operations is not None and lead.is_leader
            else None,
            "recent": self.journal.recent(20),
        }

    # ------------------------------------------------------------------ explain (the leader's)
    def explain(self) -> dict[str, Any]:
        """``trimtab admin explain``: why the cluster is or is not balanced, from the last decisions."""
        self.leadership.require_leader()
        return explain_cluster(
            safe_mode=self.leadership.safe_mode(),
            shedding_enabled=self.settings.enabled,
            shedding_paused=self.shedding.switches.shedding_paused,
            last=self.shedding.last,
            target_std=self.settings.target_std,
            healing=self.healer.status(),
            waiting=self.operations.last_waits if self.operations is not None else {},
            draining=[b for b, i in self.registry.brokers.items() if i.draining],
            stale=self._stale_reports(),
        )

    def _stale_reports(self) -> list[str]:
        """Registered brokers whose load report is older than ``load.ttl_s``: the shedders leave them out."""
        now = int(self.clock() * 1000)
        loads = self.loads.snapshot()
        ttl = self.shedding.cfg.load_ttl_s
        return sorted(
            b
            for b in self.registry.brokers
            if (ld := loads.get(b)) is not None and not is_fresh(ld, now, ttl)
        )

    def explain_bundle(self, bundle: str) -> dict[str, Any]:
        """``trimtab admin explain BUNDLE``: why it is on its broker and why it did not move."""
        cluster = self.explain()
        rec = self.channel.table.get(bundle)
        owner = rec.owner() if rec is not None else None
        placement = self.placement.explain(bundle) if self.placement is not None else "no placement rules"
        candidates = (
            [c for c in self.placement.candidates(bundle, owner) if c != owner]
            if self.placement is not None
            else sorted(b for b in self.registry.brokers if b != owner)
        )
        return explain_bundle(
            bundle,
            rec,
            placement=placement,
            candidates=candidates,
            last=self.shedding.last,
            state=self.shedding.state,
            bundle_grace_ms=int(self.shedding.settings.bundle_grace_s * 1000),
            now_ms=int(self.clock() * 1000),
            operations=self.operations.list() if self.operations is not None else [],
            cluster=cluster,
        )
