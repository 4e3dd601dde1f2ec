"""``/v1/status``: one page an operator reads first -- who leads, safe mode, the channel, every live
broker with its load and bundle count, the load spread against the target, shedding and healing state,
the running operations with their progress (leader only: only it holds them), and the latest decisions."""

from __future__ import annotations

from typing import Any

import msgspec

from trimtab.balance.load import BrokerLoadData
from trimtab.channel.client import ChannelClient
from trimtab.cluster.kvview import KeyValueView
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
            "channel": {
                "ready": self.channel.ready,
                "lag": self.channel.lag(),
                "bundles": len(self.channel.table),
            },
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
