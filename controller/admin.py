"""Operators' actions on the leader: transfer or unload a bundle (an operation of one move), split one
(forwarded to its owner's agent, which alone may split what it serves), merge two, drain a broker or take
it into maintenance (an operation of the leader's; the broker's agent only marks it draining and stays up),
pause or resume shedding (persisted, so it survives a failover). Each is refused with a
:class:`RequestError` saying why, recorded as a decision, and counted.

Transfer, unload, split, merge and drain have a dry run: every check of the real call except leadership
(any controller answers from its own replica, as the placement dry runs do), the same refusal when one
fails, and nothing published. A dry-run split is computed by the owner's agent; a dry-run drain is the
leader's plan."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from trimtab.balance.assign import BrokerInfo
from trimtab.balance.heal import plan_destinations
from trimtab.balance.maintenance import budget_refusal, deadline_refusal
from trimtab.balance.operations import Operation, OpKind
from trimtab.channel import intents
from trimtab.channel.bundles import bundle_name, merged_range, parse_bundle
from trimtab.channel.records import Record, State
from trimtab.channel.table import TableView
from trimtab.cluster.http import PeerHttp
from trimtab.cluster.openapi import declares
from trimtab.cluster.placement.view import LivePlacement
from trimtab.cluster.zk import BrokerRegistry, zk_call
from trimtab.config.settings import OperationSettings
from trimtab.controller.journal import DecisionJournal
from trimtab.controller.leadership import Leadership
from trimtab.controller.maintenance_store import InMaintenance, MaintenanceStore
from trimtab.controller.metrics import ControllerMetrics
from trimtab.controller.operations import OperationsJob
from trimtab.controller.placement.destinations import Destinations
from trimtab.controller.shedding import SheddingJob
from trimtab.controller.stores import ControllerSwitches, Switches
from trimtab.controller.writes import ChannelWrites
from trimtab.errors import BundleError, RequestError


@dataclass(frozen=True)
class MovePlan:
    """A transfer (``dst`` set) or unload that passed every check: what it publishes, and why it may."""

    bundle: str
    src: str
    dst: str | None
    version: int  # of the Owned record it replaces
    why: str

    @property
    def action(self) -> str:
        return "transfer" if self.dst is not None else "unload"

    def would(self) -> dict[str, Any]:
        """The record it publishes, in the shape of a channel record's JSON (the fields that matter)."""
        return {"state": State.RELEASING.value, "src": self.src, "dst": self.dst, "version": self.version + 1}


@dataclass(frozen=True)
class MergePlan:
    """A merge that passed every check: the parents (lower range first), the merged bundle, its owner."""

    parents: tuple[str, str]
    merged: str  # bundle name
    merged_range: str  # 0x..._0x...
    owner: str
    why: str


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
        placement: LivePlacement,
        *,
        clock: Callable[[], float] = time.time,
        forward_timeout_s: float = 30.0,
        peers: PeerHttp | None = None,
        operations: OperationsJob,
        destinations: Destinations,
        maintenance: MaintenanceStore | None = None,
        operation_settings: Callable[[], OperationSettings] | None = None,
    ) -> None:
        """``peers``: how to call the agents (their CA, this controller's token); default plain HTTP
        without a token."""
        self.table = table
        self.leadership = leadership
        self.registry = registry
        self.writes = writes
        self.journal = journal
        self.metrics = metrics
        self.switch_store = switch_store
        self.shedding = shedding
        self.placement = placement
        self.clock = clock
        self.forward_timeout_s = forward_timeout_s
        self.peers = peers if peers is not None else PeerHttp()
        # Transfers, unloads and drains run as the leader's operations (the agent only marks a drained broker).
        self.operations = operations
        self.destinations = destinations
        self.maintenance = maintenance
        self._maintenance_lock = asyncio.Lock()
        self.operation_settings = operation_settings or OperationSettings

    def plan_move(self, bundle: str, dst: str | None) -> MovePlan:
        """Every check of a transfer (``dst`` set) or unload but leadership, from this controller's replica:
        the bundle is owned (404 unknown, 409 in another state), ``dst`` is another live broker (400) and
        placement allows the move (409 with the reason)."""
        cur = self.table.get(bundle)
        if cur is None or cur.state is not State.OWNED or cur.dst is None:
            state = cur.state.value if cur else "init"
            raise RequestError(
                409 if cur is not None else 404, f"{bundle} is not owned (state {state}); nothing to move"
            )
        src = cur.dst
        if dst is not None:
            if dst == src:
                raise RequestError(400, f"{bundle} is already owned by {dst}")
            if dst not in self.registry.brokers:
                raise RequestError(400, f"{dst} is not a live broker")
            if not self.placement.may_transfer(bundle, dst):
                raise RequestError(
                    409,
                    f"placement forbids moving {bundle} to {dst} ({self.placement.explain(bundle)}); "
                    f"allowed: {self.placement.candidates(bundle, src) or 'none'}",
                )
            why = (
                f"{bundle} is owned by {src} (version {cur.version}); {dst} is live and placement allows it "
                f"({self.placement.explain(bundle)}): {src} fences it, {dst} acquires it, clients are "
                f"redirected"
            )
        elif not self.placement.may_unload(bundle):
            raise RequestError(
                409,
                f"placement forbids unloading {bundle}: no other broker may take it "
                f"({self.placement.explain(bundle)})",
            )
        else:
            why = (
                f"{bundle} is owned by {src} (version {cur.version}); after the unload the next lookup assigns "
                f"it to one of {', '.join(self.placement.candidates(bundle, src))} "
                f"({self.placement.explain(bundle)})"
            )
        return MovePlan(bundle, src, dst, cur.version, why)

    async def move(
        self, bundle: str, dst: str | None, *, reason: str = "", requested_by: str = "admin"
    ) -> tuple[Record, Operation]:
        """Transfer (dst set) or unload (dst None) a bundle, as an operator asked: with the leader's
        operations, a started operation of one move (listed by ``admin ops``, followed to its end, proposed
        again by a new leader if this one dies before Kafka acknowledged it); returns the published record
        and that operation."""
        self.leadership.require_leader()
        plan = self.plan_move(bundle, dst)
        kind = OpKind.TRANSFER if dst is not None else OpKind.UNLOAD
        op, rec = await self.operations.start_now(
            kind,
            bundle,
            src=plan.src,
            dst=dst,
            version=plan.version,
            reason=reason or f"{plan.action} {bundle}",
            requested_by=requested_by,
        )
        self.metrics.unloads.labels(plan.action, "admin").inc()
        self.metrics.admin.labels(plan.action, "ok").inc()
        self.journal.record(
            plan.action,
            bundle=bundle,
            src=plan.src,
            dst=dst,
            reason="admin",
            operation=op.id,
        )
        return rec, op

    def dry_run_move(self, bundle: str, dst: str | None) -> MovePlan:
        """What :meth:`move` would publish, or the refusal it would give; publishes nothing. Any
        controller answers (from its own replica): leadership is the one check left out."""
        plan = self.plan_move(bundle, dst)
        self.metrics.admin.labels(plan.action, "dry_run").inc()
        return plan

    def plan_merge(self, a: str, b: str) -> MergePlan:
        """Every check of a merge but leadership, from this controller's replica: two bundles of one
        namespace (400), adjacent (400), both ``Owned`` -- nothing in flight -- by one broker that is live
        (409, and how to get there), and the merged bundle's key free (409: a leftover of an earlier merge or
        split is tombstoned after ``channel.tombstone_delay_s``)."""
        try:
            ns_a, ra = parse_bundle(a)
            ns_b, rb = parse_bundle(b)
        except BundleError as e:
            raise RequestError(400, str(e)) from None
        if ns_a != ns_b:
            raise RequestError(400, f"{a} and {b} are in different namespaces: only neighbours merge")
        try:
            merged = merged_range(ra, rb)
        except BundleError as e:
            raise RequestError(400, str(e)) from None
        owners: list[str] = []
        for bundle in (a, b):
            cur = self.table.get(bundle)
            if cur is None or cur.state is not State.OWNED or cur.dst is None:
                state = cur.state.value if cur else "init"
                raise RequestError(
                    409 if cur is not None else 404,
                    f"{bundle} is not owned (state {state}); only two owned bundles merge, never one in flight",
                )
            owners.append(cur.dst)
        if owners[0] != owners[1]:
            raise RequestError(
                409,
                f"{a} is owned by {owners[0]} and {b} by {owners[1]}: move one to the other's broker first "
                f"(trimtab admin transfer {b} {owners[0]})",
            )
        owner = owners[0]
        if owner not in self.registry.brokers:
            raise RequestError(409, f"{owner}, their owner, is not a live broker")
        merged_name = bundle_name(ns_a, merged)
        left = self.table.get(merged_name)
        if left is not None:
            raise RequestError(
                409,
                f"{merged_name} still has a record (state {left.state.value}, from an earlier split or merge); "
                "it is tombstoned after channel.tombstone_delay_s -- merge then",
            )
        parents = (a, b) if ra < rb else (b, a)
        why = (
            f"{parents[0]} and {parents[1]} are adjacent and both owned by {owner}: each becomes Merging into "
            f"{merged_name}; {owner} serves the merged bundle in place (no client disconnected), publishes it "
            "as Owned, updates the namespace layout, then retires both"
        )
        return MergePlan(parents, merged_name, merged.name, owner, why)

    async def merge(self, a: str, b: str, *, requested_by: str = "admin") -> dict[str, Any]:
        """Merge two adjacent bundles owned by one broker into one (docs/protocol.md, "merge"): the leader
        writes both ``Merging`` records; the owner's agent does the rest. Refused as :meth:`plan_merge` says.
        The two records are written from one read of the table; if the second cannot be, the first bundle's
        merge aborts by itself (its partner never follows) and the answer says so."""
        self.leadership.require_leader()
        plan = self.plan_merge(a, b)
        if not await self.leadership.confirm():
            raise RequestError(503, "leadership could not be confirmed; retry", retryable=True)
        now = int(self.clock() * 1000)
        written: list[dict[str, Any]] = []
        for bundle in plan.parents:
            cur = self.table.get(bundle)
            try:
                rec = intents.merge(
                    cur, plan.owner, plan.merged_range, writer=self.leadership.writer(), now_ms=now
                )
                await self.writes.publish(bundle, rec)
            except Exception as e:
                self.metrics.admin.labels("merge", "failed").inc()
                detail = f"; {written[0]['bundle']} will abort its half by itself" if written else ""
                raise RequestError(
                    409 if isinstance(e, intents.IntentRefused) else 503,
                    f"merge of {bundle} not started: {e}{detail}",
                ) from None
            written.append({"bundle": bundle, "record": rec.to_json()})
        self.metrics.admin.labels("merge", "ok").inc()
        self.journal.record(
            "merge", key=plan.merged, parents=list(plan.parents), owner=plan.owner, by=requested_by
        )
        return {"merged": plan.merged, "owner": plan.owner, "records": written}

    def dry_run_merge(self, a: str, b: str) -> MergePlan:
        plan = self.plan_merge(a, b)
        self.metrics.admin.labels("merge", "dry_run").inc()
        return plan

    async def split(self, bundle: str, request: dict[str, Any]) -> Any:
        """Forward a split to the owner's agent; returns its JSON answer (202 for a split it started, 200
        for a dry run), or raises its refusal as it gave it. A dry run (``request["dry_run"]``) is answered
        by any controller; the agent computes the children and publishes nothing."""
        dry_run = bool(request.get("dry_run"))
        if not dry_run:
            self.leadership.require_leader()
        cur = self.table.get(bundle)
        owner = cur.owner() if cur else None
        info = self.registry.brokers.get(owner) if owner else None
        if info is None:
            state = cur.state.value if cur else "init"
            raise RequestError(409, f"{bundle} has no live owner to split it (state {state})")
        what = f"{owner}'s agent to split {bundle}"
        if dry_run:
            # An agent that does not know the field would ignore it and split: ask it first.
            await self._require_agent_field(info, "/v1/admin/split", "dry_run", what)
        return await self._forward(info, "/v1/admin/split", request, "split", what, dry_run)

    async def drain(self, broker: str, *, dry_run: bool = False, requested_by: str = "admin") -> Any:
        """Drain ``broker``: its agent marks it draining (nothing new is assigned to it; a restart undoes
        it), and the leader moves every bundle it owns away as a persisted operation -- resumed by the next
        leader if this one dies (docs/operations.md, "Operations"). 404 if ``broker`` is not live, 409 if it
        is draining already. A dry run (any controller) returns the moves the leader's drain operation would
        make now (``planned_by: leader``), and moves nothing. Returns the operation's summary with the agent's answer, or raises the refusal."""
        if not dry_run:
            self.leadership.require_leader()
        info = self.registry.brokers.get(broker)
        if info is None:
            raise RequestError(404, f"{broker} is not a live broker")
        if info.draining:
            raise RequestError(409, f"{broker} is draining already (restart its agent to undo a drain)")
        what = f"{broker}'s agent to drain it"
        if dry_run:
            self.metrics.admin.labels("drain", "dry_run").inc()
            return self._drain_plan(broker)
        # The operation first, the mark last: a step that fails leaves nothing half done behind.
        op = await self._submit_drain(OpKind.DRAIN, broker, f"drain {broker}", requested_by, None)
        answer = await self._mark_or_cancel(info, op.id, what)
        self.journal.record("drain", key=broker, broker=broker, reason="admin", operation=op.id)
        return {"broker": broker, "operation": op.summary(), "agent": answer}

    async def _submit_drain(
        self, kind: OpKind, broker: str, reason: str, requested_by: str, deadline_ms: int | None
    ) -> Operation:
        try:
            return await self.operations.submit(
                kind,
                self._drain_moves(broker),
                reason=reason,
                requested_by=requested_by,
                deadline_ms=deadline_ms,
                target=broker,
            )
        except ValueError as e:  # more moves than one operation holds
            raise RequestError(409, str(e)) from None

    async def _mark_or_cancel(self, info: BrokerInfo, op_id: str, what: str) -> Any:
        """Ask the broker's agent to mark itself draining; if it refuses or cannot be reached, cancel the
        operation just stored (nothing moves) and raise the refusal."""
        try:
            return await self._forward(info, "/v1/admin/drain", {"mark_only": True}, "drain", what, False)
        except RequestError:
            with contextlib.suppress(RequestError):
                await self.operations.verb(
                    op_id, "cancel", why="its broker's agent refused to mark it draining"
                )
            raise

    async def maintenance_start(
        self, broker: str, *, deadline_s: float, reason: str, requested_by: str
    ) -> dict[str, Any]:
        """Maintenance of ``broker``: drained before ``deadline_s`` (an operation whose moves take the budget
        first; failed with the reason if moves are left then) and kept out of service until
        :meth:`maintenance_end`. Refused: 400 a deadline that is not positive, 404 not live, 409 already in
        maintenance or draining, or its failure domain's budget used up."""
        self.leadership.require_leader()
        if self.maintenance is None:
            raise RequestError(
                503, "maintenance is not available on this controller (it has no maintenance store)"
            )
        bad = deadline_refusal(deadline_s)
        if bad is not None:
            raise RequestError(400, bad)
        async with self._maintenance_lock:  # the budget check and the znode, one start at a time
            info = self.registry.brokers.get(broker)
            if info is None:
                raise RequestError(404, f"{broker} is not a live broker")
            current = await asyncio.to_thread(self.maintenance.read)
            if broker in current:
                raise RequestError(409, f"{broker} is in maintenance already")
            if info.draining:
                raise RequestError(409, f"{broker} is draining already (restart its agent to undo a drain)")
            # A broker in maintenance counts in the domain it had when it went in, registered or not.
            domains = {b: i.failure_domain for b, i in self.registry.brokers.items()}
            domains |= {b: e.failure_domain for b, e in current.items() if e is not None}
            over = budget_refusal(
                broker, domains, current, self.operation_settings().maintenance_max_per_domain
            )
            if over is not None:
                raise RequestError(409, over)
            now = int(self.clock() * 1000)
            deadline_ms = now + int(deadline_s * 1000)
            op = await self._submit_drain(
                OpKind.MAINTENANCE, broker, reason or f"maintenance of {broker}", requested_by, deadline_ms
            )
            entry = InMaintenance(
                operation=op.id,
                reason=op.reason,
                requested_by=requested_by,
                started_ms=now,
                deadline_ms=deadline_ms,
                failure_domain=info.failure_domain,
            )
            await asyncio.to_thread(self.maintenance.start, broker, entry)
            try:
                answer = await self._mark_or_cancel(info, op.id, f"{broker}'s agent")
            except RequestError:
                await asyncio.to_thread(self.maintenance.end, broker)
                raise
        self.journal.record(
            "maintenance", key=broker, broker=broker, action="start", operation=op.id, deadline_s=deadline_s
        )
        return {"broker": broker, "operation": op.summary(), "deadline_ms": deadline_ms, "agent": answer}

    async def maintenance_end(self, broker: str, *, requested_by: str) -> dict[str, Any]:
        """Back in service: its drain (if still running) cancelled, its agent takes bundles again, and
        balance brings load back as it requires. 404 if it is not in maintenance."""
        self.leadership.require_leader()
        if self.maintenance is None:
            raise RequestError(
                503, "maintenance is not available on this controller (it has no maintenance store)"
            )
        async with self._maintenance_lock:
            current = await asyncio.to_thread(self.maintenance.read)
            if broker not in current:
                raise RequestError(404, f"{broker} is not in maintenance")
            entry = current[broker]
            self.operations.require_loaded()
            if entry is not None and entry.operation in self.operations.ops:
                op = self.operations.ops[entry.operation]
                if not op.state.terminal:
                    await self.operations.verb(op.id, "cancel", why=f"maintenance of {broker} ended")
            info = self.registry.brokers.get(broker)
            agent: Any = None
            if info is not None and info.draining:
                agent = await self._forward(
                    info, "/v1/admin/undrain", {}, "maintenance", f"{broker}'s agent", False
                )
            await asyncio.to_thread(self.maintenance.end, broker)
        self.journal.record("maintenance", key=broker, broker=broker, action="end", by=requested_by)
        return {"broker": broker, "in_maintenance": False, "agent": agent}

    async def maintenance_list(self) -> dict[str, Any]:
        current = await asyncio.to_thread(self.maintenance.read) if self.maintenance is not None else {}
        return {
            "brokers": {
                b: (msgspec.to_builtins(e) if e is not None else {"unreadable": True})
                for b, e in current.items()
            }
        }

    def _drain_plan(self, broker: str) -> dict[str, Any]:
        """The dry run of an admin drain: the moves the leader's drain operation would store now (the same
        :meth:`_drain_moves`), from this controller's replica -- not the agent's own plan, which is what a
        SIGTERM drain follows. Spare capacity breaks ties as in a healing plan, so a later drain may differ
        where brokers are equally loaded."""
        moves = self._drain_moves(broker)
        bundles = {
            b: {"dst": dst, "reason": "spare_capacity" if dst is not None else "no_allowed_destination"}
            for b, _, dst in moves
        }
        unloads = sum(1 for _, _, dst in moves if dst is None)
        return {
            "broker": broker,
            "dry_run": True,
            "planned_by": "leader",
            "bundles": bundles,
            "count": len(bundles),
            "why": (
                f"{broker} owns or is being given {len(bundles)} bundles; the drain operation would transfer "
                f"{len(bundles) - unloads} to live brokers that are not draining and the placement rules allow, "
                f"by spare capacity, and unload {unloads} that no broker may take"
            ),
        }

    def _drain_moves(self, broker: str) -> list[tuple[str, str, str | None]]:
        """Every bundle ``broker`` owns or is being given, with a destination (:func:`plan_drain`)."""
        mine = sorted(
            b
            for b, r in self.table.items()
            if r.dst == broker and r.state in (State.OWNED, State.ASSIGNING, State.RELEASING)
        )
        dests = plan_drain(self.destinations, broker, mine)
        return [(b, broker, dests[b]) for b in mine]

    async def _forward(
        self, info: BrokerInfo, path: str, body: dict[str, Any], op: str, what: str, dry_run: bool
    ) -> Any:
        """POST ``body`` to the agent's ``path``; its JSON answer. A refusal of the agent's is raised as
        the agent gave it (status, message, ``retryable``), so the operator reads the agent's own reason;
        an agent that cannot be reached, or refuses this controller's credentials, is a 502."""
        try:
            async with self.peers.client(self.forward_timeout_s) as client:
                r = await client.post(f"{info.http_url}{path}", json=body)
        except httpx.HTTPError as e:
            self.metrics.admin.labels(op, "failed").inc()
            raise RequestError(502, f"could not reach {what}: {e}", retryable=True) from None
        ok = "dry_run" if dry_run else "ok"
        self.metrics.admin.labels(op, ok if r.is_success else "failed").inc()
        if r.status_code in (401, 403):
            # Not the caller's token (the controller accepted that one): this controller's own.
            raise RequestError(
                502,
                f"{info.id}'s agent refused this controller's credentials (HTTP {r.status_code}; {what}): every "
                "node of a cluster must accept the same admin tokens (docs/security.md)",
            )
        try:
            answer = r.json()
        except ValueError:
            raise RequestError(
                502, f"{info.id}'s agent answered {r.status_code} with no JSON body ({what})", retryable=True
            ) from None
        if r.is_success:
            return answer
        error = answer.get("error") if isinstance(answer, dict) else None
        if not isinstance(error, str):  # not trimtab's error shape: say what came back
            error = f"{info.id}'s agent answered {r.status_code}: {str(answer)[:200]} ({what})"
        retryable = answer.get("retryable") if isinstance(answer, dict) else None
        raise RequestError(r.status_code, error, retryable=retryable if isinstance(retryable, bool) else None)

    async def _require_agent_field(self, info: BrokerInfo, path: str, field: str, what: str) -> None:
        """Refuse (409, nothing sent) unless the agent's API declares ``field`` for ``POST path``: an older
        agent would ignore the field (a dry run would be done for real)."""
        try:
            async with self.peers.client(self.forward_timeout_s) as client:
                r = await client.get(f"{info.http_url}/openapi.json")
            spec = r.json() if r.is_success else {}
        except (httpx.HTTPError, ValueError) as e:
            raise RequestError(502, f"could not read the API of {what}: {e}", retryable=True) from None
        if not declares(spec, "POST", path, field):
            raise RequestError(
                409,
                f"{info.id}'s agent does not support {field} on {path} (an older version?); nothing was sent",
            )

    async def set_shedding_paused(self, paused: bool, by: str) -> ControllerSwitches:
        self.leadership.require_leader()
        sw = ControllerSwitches(
            shedding_paused=paused,
            paused_by=by if paused else None,
            paused_at=int(self.clock() * 1000) if paused else None,
        )
        # Through the ZooKeeper boundary (retried, kazoo's failures mapped): the write is idempotent.
        await asyncio.to_thread(zk_call, self.switch_store.zk, self.switch_store.write, sw)
        self.shedding.switches = sw
        self.metrics.admin.labels("shedding", "ok").inc()
        self.journal.record("shedding_paused" if paused else "shedding_resumed", key="shedding", by=by)
        return sw


def plan_drain(destinations: Destinations, broker: str, bundles: list[str]) -> dict[str, str | None]:
    """Destinations for ``bundles`` leaving ``broker``: live brokers other than it, not draining, that the
    placement rules allow, spread by spare capacity as a healing plan is; None -- an unload -- where no broker
    is allowed. (The drain's own plan and the bundles that reach a drained broker later.)"""
    loads = destinations.loads.snapshot()
    candidates = {
        b: (loads[b].weighted_max_ema if b in loads else 0.5)
        for b, i in destinations.live().items()
        if b != broker and not i.draining
    }
    allowed, placed = destinations.plan_rules()
    return plan_destinations(bundles, candidates, None, allowed, placed)
