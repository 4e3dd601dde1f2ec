"""Operators' actions on the leader: transfer or unload a bundle, split one (forwarded to its owner's
agent, which alone may split what it serves), pause or resume shedding (persisted, so it survives a
failover). Each is refused with a :class:`RequestError` saying why, recorded as a decision, and counted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx

from trimtab.channel.records import Record, State, make
from trimtab.channel.table import TableView
from trimtab.cluster.zk import BrokerRegistry
from trimtab.controller.journal import DecisionJournal
from trimtab.controller.leadership import Leadership
from trimtab.controller.metrics import ControllerMetrics
from trimtab.controller.shedding import SheddingJob
from trimtab.controller.stores import ControllerSwitches, Switches
from trimtab.controller.writes import ChannelWrites
from trimtab.errors import RequestError


class Admin:
    def __init__(
        self,
        table: TableView,
        leadership: Leadership,
        registry: BrokerRegistry,
        writes: ChannelWrites,
        journal: DecisionJournal,
        metrics: ControllerMetrics,
        switch_store: Switches,
        shedding: SheddingJob,
        *,
        clock: Callable[[], float] = time.time,
        forward_timeout_s: float = 30.0,
    ) -> None:
        self.table = table
        self.leadership = leadership
        self.registry = registry
        self.writes = writes
        self.journal = journal
        self.metrics = metrics
        self.switch_store = switch_store
        self.shedding = shedding
        self.clock = clock
        self.forward_timeout_s = forward_timeout_s

    async def move(self, bundle: str, dst: str | None) -> Record:
        """Transfer (dst set) or unload (dst None) a bundle, as an operator asked."""
        self.leadership.require_leader()
        cur = self.table.get(bundle)
        if cur is None or cur.state is not State.OWNED or cur.dst is None:
            state = cur.state.value if cur else "init"
            raise RequestError(
                409 if cur is not None else 404, f"{bundle} is not owned (state {state}); nothing to move"
            )
        if dst is not None:
            if dst == cur.dst:
                raise RequestError(400, f"{bundle} is already owned by {dst}")
            if dst not in self.registry.brokers:
                raise RequestError(400, f"{dst} is not a live broker")
        rec = make(
            State.RELEASING,
            src=cur.dst,
            dst=dst,
            version=cur.version + 1,
            ts=int(self.clock() * 1000),
            writer=self.leadership.writer(),
        )
        await self.writes.publish(bundle, rec)
        action = "transfer" if dst else "unload"
        self.metrics.unloads.labels(action, "admin").inc()
        self.metrics.admin.labels(action, "ok").inc()
        self.journal.record(action, bundle=bundle, src=cur.dst, dst=dst, reason="admin")
        return rec

    async def split(self, bundle: str, request: dict[str, Any]) -> tuple[int, Any]:
        """Forward a split to the owner's agent; returns its status code and JSON body."""
        self.leadership.require_leader()
        cur = self.table.get(bundle)
        owner = cur.owner() if cur else None
        info = self.registry.brokers.get(owner) if owner else None
        if info is None:
            state = cur.state.value if cur else "init"
            raise RequestError(409, f"{bundle} has no live owner to split it (state {state})")
        try:
            async with httpx.AsyncClient(timeout=self.forward_timeout_s) as client:
                r = await client.post(f"{info.http_url}/v1/admin/split", json=request)
        except httpx.HTTPError as e:
            self.metrics.admin.labels("split", "failed").inc()
            raise RequestError(
                502, f"could not reach {owner}'s agent to split {bundle}: {e}", retryable=True
            ) from None
        self.metrics.admin.labels("split", "ok" if r.is_success else "failed").inc()
        try:
            body = r.json()
        except ValueError:
            raise RequestError(
                502,
                f"{owner}'s agent answered the split with {r.status_code} and no JSON body",
                retryable=True,
            ) from None
        return r.status_code, body

    async def set_shedding_paused(self, paused: bool, by: str) -> ControllerSwitches:
        self.leadership.require_leader()
        sw = ControllerSwitches(
            shedding_paused=paused,
            paused_by=by if paused else None,
            paused_at=int(self.clock() * 1000) if paused else None,
        )
        await asyncio.to_thread(self.switch_store.write, sw)
        self.shedding.switches = sw
        self.metrics.admin.labels("shedding", "ok").inc()
        self.journal.record("shedding_paused" if paused else "shedding_resumed", key="shedding", by=by)
        return sw
