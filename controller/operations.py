"""The leader's operations job: advances every unfinished operation, one pass per ``operations.interval_s``,
and carries out the operator's verbs (issue 32).

A pass (the decisions are :func:`trimtab.balance.operations.advance`'s):

1. skip while in safe mode (counted as ``safe_mode``): nothing is started or proposed again;
2. take the budget left from every bundle in flight in the channel;
3. confirm leadership, then **persist every changed operation, then publish** -- in that order, so that a
   leader killed in between leaves the started versions behind, and the next one proposes the same records
   (at most one of two copies can apply) instead of a second move;
4. count outcomes and waits, record state changes as decisions (the events topic), forget the oldest
   finished operations beyond ``operations.keep_finished``.

A new leader reads every operation from ZooKeeper (:meth:`OperationsJob.load`) and carries on where the last
one stopped; while it leads it is their only writer, so passes work from memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import msgspec
import structlog

from trimtab.balance import operations as ops
from trimtab.channel import intents
from trimtab.channel.intents import IntentRefused
from trimtab.channel.records import Record, State
from trimtab.channel.table import TableView
from trimtab.config.settings import OperationSettings
from trimtab.controller.journal import DecisionJournal
from trimtab.controller.leadership import LeaderGates
from trimtab.controller.metrics import ControllerMetrics
from trimtab.controller.operation_store import OperationConflict, OperationStore
from trimtab.controller.writes import ChannelWrites
from trimtab.errors import RequestError

log = structlog.get_logger("trimtab.operations")


class OperationsJob:
    name = "operations"

    def __init__(
        self,
        settings: Callable[[], OperationSettings],
        store: OperationStore,
        table: TableView,
        leadership: LeaderGates,
        writes: ChannelWrites,
        journal: DecisionJournal,
        metrics: ControllerMetrics,
        *,
        clock: Callable[[], float] = time.time,
        new_id: Callable[[str], str] | None = None,
        planner: Callable[[str, list[str]], Mapping[str, str | None]] | None = None,
        usable: Callable[[str], bool] | None = None,
        heal_plans: Callable[[], Mapping[str, HealPlan] | None] | None = None,
        registered: Callable[[str], bool] | None = None,
    ) -> None:
        """``settings`` is read on every pass: limits changed at run time apply from the next one.
        ``planner(broker, bundles)``: destinations for bundles that reached a broker being drained after its
        drain was planned (added to the drain); ``usable(broker)``: whether a planned destination may still
        take bundles (live, not draining, not in maintenance) -- a move to one that may not is an unload.
        ``heal_plans()``: the healing job's persisted plans (failed broker -> its first failure and the
        planned destination of each of its bundles), None until it has read them: each is followed as a
        ``heal`` operation; ``registered(broker)``: whether a broker is registered (a heal whose plan is
        gone ends as cancelled only if its broker came back; None: it always does). Splits and merges are seen in the channel (a table listener) and followed as
        ``split`` and ``merge`` operations."""
        self.settings = settings
        self.store = store
        self.table = table
        self.leadership = leadership
        self.writes = writes
        self.journal = journal
        self.metrics = metrics
        self.clock = clock
        self.new_id = new_id or (lambda kind: f"{kind}-{int(clock() * 1000):x}-{secrets.token_hex(3)}")
        self.planner = planner
        self.usable = usable
        self.heal_plans = heal_plans
        self.registered = registered
        # Splitting/Merging records seen since the last pass: kept by a table listener (the feeder's
        # thread) under the lock the pass takes them with; the table rescanned when it was replaced
        # (its generation changed: bootstrap, a history gap) or leadership starts.
        self._transitions: list[tuple[str, Record]] = []
        self._seen_lock = threading.Lock()
        self._rescan = True
        self._generation = -1
        self._unrecordable: set[str] = set()  # followed operations that could not be stored: not tried again
        table.add_listener(self._on_change)
        self.ops: dict[str, ops.Operation] = {}
        self.loaded = False
        self.last_waits: dict[str, int] = {}
        # One writer at a time: a pass, a new operation and an operator's verb each read and write the
        # operations whole; without it a verb answered during a pass was overwritten by the pass's copy.
        self._lock = asyncio.Lock()

    def _now(self) -> int:
        return int(self.clock() * 1000)

    # ------------------------------------------------------------------ leadership
    async def on_lead(self) -> None:
        await asyncio.to_thread(self.load)

    def load(self) -> None:
        """Read every stored operation (leadership starts: what the last leader left)."""
        self.ops = {op.id: op for op in self.store.list()}
        with self._seen_lock:
            self._transitions = []
        self._rescan = True
        self.loaded = True
        unfinished = [op.id for op in self.ops.values() if not op.state.terminal]
        log.info("operations_loaded", operations=len(self.ops), unfinished=len(unfinished))
        self._gauge()

    # ------------------------------------------------------------------ one pass
    async def run_once(self) -> ops.Advance | None:
        async with self._lock:
            try:
                return await self._pass()
            except OperationConflict:
                return None  # read again (in _store); the next pass decides afresh

    def _drain_arrivals(self, op: ops.Operation) -> ops.Operation:
        """A drain's broker may be given bundles after the drain was planned (an assignment in flight, a
        lookup at an agent that had not seen the draining flag, a split of one of its bundles): they join
        the drain, so that it ends only once nothing is left on the broker."""
        if (
            op.target is None
            or self.planner is None
            or op.kind not in (ops.OpKind.DRAIN, ops.OpKind.MAINTENANCE)
        ):
            return op
        planned = {m.bundle for m in op.moves}
        new = sorted(
            b
            for b, r in self.table.items()
            if b not in planned
            and r.dst == op.target
            and r.state in (State.OWNED, State.ASSIGNING, State.RELEASING)
        )
        if not new:
            return op
        dests = self.planner(op.target, new)
        try:
            return ops.extend(op, [(b, op.target, dests.get(b)) for b in new], now_ms=self._now())
        except ValueError as e:
            log.warning("operation_not_extended", operation=op.id, error=str(e))
            return op

    # ------------------------------------------------------------------ followed operations
    def _on_change(self, bundle: str, old: Record | None, new: Record | None) -> None:
        # Every one kept until the next pass records it, even if it settles before (a split is often
        # published and completed within one pass), and under the lock the pass takes them with. Only while
        # leading (followers would keep them forever).
        if self.loaded and new is not None and new.state in _TRANSITIONS:
            with self._seen_lock:
                self._transitions.append((bundle, new))

    def _take_transitions(self) -> list[tuple[str, Record]]:
        """Splits and merges seen since the last pass; the whole table's after it was replaced (bootstrap,
        a history gap: its listeners heard nothing meanwhile) or leadership started. Given back with
        :meth:`_give_back` when the pass records nothing."""
        generation = self.table.generation
        rescan = self._rescan or generation != self._generation
        self._rescan, self._generation = False, generation
        with self._seen_lock:
            taken, self._transitions = self._transitions, []
        if rescan:
            taken += [(b, r) for b, r in self.table.unsettled() if r.state in _TRANSITIONS]
        return taken

    def _give_back(self, taken: list[tuple[str, Record]]) -> None:
        with self._seen_lock:
            self._transitions[:0] = taken

    async def _follow(self) -> None:
        """Record the splits, merges and healing plans no operation follows yet, and bring the followed
        operations up to date with the channel. Nothing is published: only operations are written. What was
        seen is given back if this pass stores nothing (leadership not confirmed, a failure): the next one
        records it."""
        taken = self._take_transitions()
        stored = False
        try:
            stored = await self._follow_pass(taken)
        finally:
            if not stored:
                self._give_back(taken)

    async def _follow_pass(self, taken: list[tuple[str, Record]]) -> bool:
        now = self._now()
        tracked = {
            (m.bundle, m.started_version, m.started_ms)
            for op in self.ops.values()
            if op.kind in (ops.OpKind.SPLIT, ops.OpKind.MERGE)
            for m in op.moves
        }
        open_by_target = {
            (op.kind, op.target): op
            for op in self.ops.values()
            if op.kind in ops.FOLLOWED and not op.state.terminal
        }
        changed: dict[str, ops.Operation] = {}  # by id: an operation recorded and followed in one pass
        for seen in ops.observe(taken, lambda b, v, ts: (b, v, ts) in tracked):
            merging = (
                open_by_target.get((ops.OpKind.MERGE, seen.target)) if seen.kind is ops.OpKind.MERGE else None
            )
            if merging is not None:
                changed[merging.id] = ops.add_followed(merging, seen.moves, now_ms=now)  # its second parent
            else:
                op = ops.followed(
                    self.new_id(seen.kind.value),
                    seen.kind,
                    seen.moves,
                    reason=seen.reason,
                    requested_by=seen.requested_by,
                    now_ms=now,
                    target=seen.target,
                )
                changed[op.id] = op
        current = self._current_heals()
        for op_id, (broker, plan) in sorted((current or {}).items(), key=lambda x: x[1][0]):
            if op_id not in self.ops and op_id not in self._unrecordable and plan.bundles:
                changed[op_id] = _heal(op_id, broker, plan, now)
        for op in list({**self.ops, **changed}.values()):
            if op.kind not in ops.FOLLOWED or (op.state.terminal and not any(m.open for m in op.moves)):
                continue
            new = ops.follow(op, self.table.get, now_ms=now)
            if (
                op.kind is ops.OpKind.HEAL
                and current is not None
                and not new.state.terminal
                and op.id not in current
            ):
                why = self._heal_ended(op, {b for b, _ in current.values()})
                if why is not None:
                    new = ops.follow(ops.end_followed(new, why=why, now_ms=now), self.table.get, now_ms=now)
            if new is not op:
                changed[new.id] = new
        if not changed:
            return True
        if not await self.leadership.confirm():
            return False
        for op in changed.values():
            before = self.ops.get(op.id)
            if before is None:
                if not await self._record(op):
                    continue
            else:
                await self._store(op)
            ended = {m.bundle for m in before.moves if not m.open} if before is not None else set()
            for m in op.moves:
                if m.outcome is not None and m.bundle not in ended:
                    self.metrics.operation_moves.labels(op.kind.value, m.outcome.value).inc()
        return True

    def _heal_ended(self, op: ops.Operation, failed: Collection[str]) -> str | None:
        """Why a heal that is no longer the healing job's current plan for its broker ends before its moves
        did, or None to go on following it: its broker is registered again (it came back; a newer failure
        of it has a heal of its own). A broker the healing job forgot because nothing names it any more
        (healed, its last bundles still on their way) is followed to the end. ``failed``: the brokers the
        healing job has a plan for."""
        if op.target is not None and self.registered is not None and not self.registered(op.target):
            if op.target not in failed:
                return None  # healed: the moves settle by themselves
            return "the broker came back and failed again: its new failure has a heal of its own"
        return "the broker came back"

    async def _record(self, op: ops.Operation) -> bool:
        """Store a new followed operation; False (logged, counted, not tried again) if it would not read
        back -- a name from a channel record too long for its field -- or its id is stored already but
        unreadable to this leader. A create that failed half way is removed, so that it can be tried again."""
        if isinstance(ops.decode(ops.encode(op)), ops.Undecodable) or op.id in self._unrecordable:
            self._not_recordable(
                op, "it would not read back (a name from the channel too long for its field)"
            )
            return False
        try:
            await self._create(op)
        except RequestError as e:  # its id is stored already but did not read back when this leader loaded
            self._not_recordable(op, str(e))
            return False
        except Exception:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.store.delete, op.id)
            raise
        return True

    def _not_recordable(self, op: ops.Operation, why: str) -> None:
        self._unrecordable.add(op.id)
        self.metrics.operation_waits.labels("not_recordable").inc()
        log.warning("operation_not_recorded", operation=op.id, kind=op.kind.value, reason=why)

    def _current_heals(self) -> dict[str, tuple[str, HealPlan]] | None:
        """The heal of each plan the healing job holds now -- its id -> (broker, plan) -- or None if the plans
        are not known (not read yet, or reading them failed: logged)."""
        if self.heal_plans is None:
            return None
        try:
            plans = self.heal_plans()
        except Exception as e:
            log.warning("heal_plans_unreadable", error=str(e) or type(e).__name__)
            return None
        if plans is None:
            return None
        return {heal_id(b, p.first_failure_ms): (b, p) for b, p in plans.items()}

    def held_heals(self) -> frozenset[str]:
        """Failed brokers whose healing an operator paused (``admin ops pause``): the healing job skips
        them until resumed."""
        # This failure's heal, not one of an earlier failure of the same broker.
        current = self._current_heals() or {}
        return frozenset(
            current[op.id][0]
            for op in self.ops.values()
            if op.kind is ops.OpKind.HEAL and op.state is ops.OpState.PAUSED and op.id in current
        )

    async def _pass(self) -> ops.Advance | None:
        if not self.loaded:
            return None
        if self.leadership.safe_mode() is None:
            try:
                await self._follow()
            except OperationConflict:
                raise
            except Exception as e:  # recording what others do must never stop the leader's own operations
                self.metrics.operation_waits.labels("follow_failed").inc()
                log.warning("operations_follow_failed", error=str(e) or type(e).__name__)
        active = [op for op in self.ops.values() if _active(op) and op.kind not in ops.FOLLOWED]
        if not active:
            self.last_waits = {}
            return None
        if self.leadership.safe_mode() is not None:
            waiting = sum(1 for op in active for m in op.moves if m.open)
            self.metrics.operation_waits.labels("safe_mode").inc(waiting)
            self.last_waits = {"safe_mode": waiting}
            return None
        s = self.settings()
        budget = ops.Budget.from_table(
            self.table.unsettled(),  # every bundle in flight, without a record made per settled one
            cluster=s.max_in_flight,
            per_broker=s.max_in_flight_per_broker,
            per_namespace=s.max_in_flight_per_namespace,
        )
        before = active
        active = [self._drain_arrivals(op) if not op.state.terminal else op for op in active]
        adv = ops.advance(
            active,
            self.table.get,
            budget,
            writer=self.leadership.writer(),
            now_ms=self._now(),
            republish_after_ms=int(s.republish_after_s * 1000),
            usable=self.usable or (lambda broker: True),
        )
        changed = adv.changed(before)
        if not changed and not adv.publish:
            self._count(adv)
            return adv
        if not await self.leadership.confirm():
            return None  # not leading any more: the next leader decides from what is stored
        for op in changed:
            await self._store(op)
        for bundle, rec in adv.publish:
            try:
                await self.writes.publish(bundle, rec)
            except Exception as e:  # proposed again after republish_after_s (same version)
                log.warning("operation_publish_failed", bundle=bundle, error=str(e))
        self._count(adv)
        await self._forget_finished(s.keep_finished)
        return adv

    def _count(self, adv: ops.Advance) -> None:
        for (kind, outcome), n in adv.outcomes.items():
            self.metrics.operation_moves.labels(kind, outcome).inc(n)
        for reason, n in adv.waiting.items():
            self.metrics.operation_waits.labels(reason).inc(n)
        self.last_waits = dict(adv.waiting)

    async def _store(self, op: ops.Operation) -> None:
        before = self.ops.get(op.id)
        try:
            await asyncio.to_thread(self.store.write, op, before)
        except OperationConflict as e:
            # Another controller wrote it since we read it: what we hold is stale. Read everything again
            # (this pass publishes nothing: the caller's exception ends it); the next pass decides afresh.
            log.warning(
                "operation_conflict", operation=op.id, error=str(e), action="reloading every operation"
            )
            await asyncio.to_thread(self.load)
            raise
        self.ops[op.id] = op
        if before is None or before.state is not op.state:
            self._decision(op)
        self._gauge()

    def _decision(self, op: ops.Operation) -> None:
        done, total = op.progress()
        self.journal.record(
            "operation",
            key=op.id,
            op_kind=op.kind.value,
            state=op.state.value,
            reason=op.reason,
            state_reason=op.state_reason,
            done=done,
            total=total,
        )
        log.info(
            "operation_state",
            operation=op.id,
            kind=op.kind.value,
            state=op.state.value,
            done=done,
            total=total,
        )

    def _gauge(self) -> None:
        self.metrics.operations.clear()
        for (kind, state), n in ops.by_state(self.ops.values()).items():
            self.metrics.operations.labels(kind, state).set(n)

    async def _forget_finished(self, keep: int) -> None:
        # A finished heal stays while its plan does (until the healing job forgets the broker): forgotten
        # earlier, it would be recorded again from that plan.
        current = self._current_heals() or {}
        finished = sorted(
            (
                op
                for op in self.ops.values()
                if op.state.terminal and not _active(op) and op.id not in current
            ),
            key=lambda o: o.updated_ms,
        )
        for op in finished[: max(0, len(finished) - keep)]:
            await asyncio.to_thread(self.store.delete, op.id)
            del self.ops[op.id]
        self._gauge()

    # ------------------------------------------------------------------ the operator's verbs
    async def submit(
        self,
        kind: ops.OpKind,
        moves: Iterable[tuple[str, str, str | None]],
        *,
        reason: str,
        requested_by: str,
        deadline_ms: int | None = None,
        target: str | None = None,
    ) -> ops.Operation:
        """Store a new operation (pending); the next pass starts it."""
        async with self._lock:
            return await self._submit(
                kind, moves, reason=reason, requested_by=requested_by, deadline_ms=deadline_ms, target=target
            )

    async def _submit(
        self,
        kind: ops.OpKind,
        moves: Iterable[tuple[str, str, str | None]],
        *,
        reason: str,
        requested_by: str,
        deadline_ms: int | None,
        target: str | None,
    ) -> ops.Operation:
        self.require_loaded()
        op = ops.new(
            self.new_id(kind.value),
            kind,
            moves,
            reason=reason,
            requested_by=requested_by,
            now_ms=self._now(),
            deadline_ms=deadline_ms,
            target=target,
        )
        await self._create(op)
        return op

    async def _create(self, op: ops.Operation) -> None:
        await asyncio.to_thread(self.store.create, op)
        self.ops[op.id] = op
        self._decision(op)
        self._gauge()

    async def start_now(
        self,
        kind: ops.OpKind,
        bundle: str,
        *,
        src: str,
        dst: str | None,
        version: int,
        reason: str,
        requested_by: str,
    ) -> tuple[ops.Operation, Record]:
        """An operator's transfer or unload of ``bundle`` (owned by ``src`` at ``version``): stored as a
        started operation of one move, then its record published and acknowledged (see
        :func:`~trimtab.balance.operations.started`). Raises :class:`IntentRefused` if the bundle changed
        since ``version``; 503 if leadership cannot be confirmed; the publish's error if Kafka did not
        acknowledge -- the operation is stored by then, and proposes the same record again after
        ``operations.republish_after_s`` (at most one copy applies)."""
        async with self._lock:
            cur = self.table.get(bundle)
            if cur is not None and cur.version != version:
                raise IntentRefused("release", cur, f"the bundle changed since version {version} was read")
            if cur is None or not intents.owned_by(cur, src):
                raise IntentRefused("release", cur, f"the bundle is not owned by {src}")
            op, records = await self._start_now(kind, [(bundle, src, dst)], reason, requested_by)
            ((_, rec),) = records
            await self.writes.publish(bundle, rec)
            return op, rec

    async def start_moves(
        self,
        kind: ops.OpKind,
        moves: Iterable[tuple[str, str, str | None]],
        *,
        reason: str,
        requested_by: str,
    ) -> tuple[ops.Operation | None, list[tuple[str, Record]]]:
        """Moves decided from what the table holds now (a shedding cycle's): one operation, stored, then
        every record published; returns the operation (None when none of the moves still applied) and the
        records acknowledged. A failed publish is logged and proposed again by the operation."""
        async with self._lock:
            op, records = await self._start_now(kind, moves, reason, requested_by)
            done: list[tuple[str, Record]] = []
            for bundle, rec in records:
                try:
                    await self.writes.publish(bundle, rec)
                    done.append((bundle, rec))
                except Exception as e:  # proposed again after republish_after_s (same version)
                    log.warning("operation_publish_failed", bundle=bundle, error=str(e))
            return (op if records else None), done

    async def _start_now(
        self, kind: ops.OpKind, moves: Iterable[tuple[str, str, str | None]], reason: str, requested_by: str
    ) -> tuple[ops.Operation, list[tuple[str, Record]]]:
        """Under the lock: the started operation, stored (unless empty), and its records to publish."""
        self.require_loaded()
        if not await self.leadership.confirm():
            raise RequestError(503, "leadership could not be confirmed; retry", retryable=True)
        op, records = ops.started(
            self.new_id(kind.value),
            kind,
            [(b, self.table.get(b), src, dst) for b, src, dst in moves],
            reason=reason,
            requested_by=requested_by,
            writer=self.leadership.writer(),
            now_ms=self._now(),
        )
        if records:
            await self._create(op)
        return op, records

    def get(self, op_id: str) -> ops.Operation:
        self.require_loaded()
        op = self.ops.get(op_id)
        if op is None:
            raise RequestError(404, f"no operation {op_id!r} (admin ops list shows them)")
        return op

    def list(self) -> list[ops.Operation]:
        self.require_loaded()
        return sorted(self.ops.values(), key=lambda o: o.created_ms)

    async def verb(self, op_id: str, verb: str, *, why: str = "operator") -> ops.Operation:
        """pause, resume or cancel; refused with 409 and the reason when it does not apply."""
        async with self._lock:
            return await self._verb(op_id, verb, why=why)

    async def _verb(self, op_id: str, verb: str, *, why: str) -> ops.Operation:
        self.require_loaded()
        op = self.get(op_id)
        now = self._now()
        try:
            if verb == "pause":
                new = ops.pause(op, why=why, now_ms=now)
            elif verb == "resume":
                new = ops.resume(op, now_ms=now)
            elif verb == "cancel":
                new = ops.cancel(op, why=why, now_ms=now)
            else:
                raise RequestError(400, f"unknown verb {verb!r}: pause, resume or cancel")
        except ops.OperationRefused as e:
            raise RequestError(409, str(e)) from None
        if new is not op:
            await self._store(new)
        return new

    def require_loaded(self) -> None:
        """503 (retryable) until this leader has read the stored operations: answers about them, or
        changes to them, would be made without knowing them."""
        if not self.loaded:
            raise RequestError(
                503, "operations are not loaded yet (not leading, or leadership just started)", retryable=True
            )

    def status(self) -> dict[str, Any]:
        return {
            "operations": [
                op.summary()
                for op in sorted(self.ops.values(), key=lambda o: o.created_ms)
                if not op.state.terminal
            ],
            "finished": sum(1 for op in self.ops.values() if op.state.terminal),
            "waiting": dict(self.last_waits),
        }


_TRANSITIONS = frozenset({State.SPLITTING, State.MERGING})


def _heal(op_id: str, broker: str, plan: HealPlan, now_ms: int) -> ops.Operation:
    """The heal operation of ``broker``'s plan. A broker with more bundles than an operation holds: the
    first ones are followed, the healing job moves them all the same (``admin healing`` counts every one)."""
    planned = sorted(plan.bundles.items())
    part = "" if len(planned) <= ops.MAX_MOVES else f"; {ops.MAX_MOVES} of {len(planned)} followed"
    return ops.followed(
        op_id,
        ops.OpKind.HEAL,
        [(b, broker, d, None, None) for b, d in planned[: ops.MAX_MOVES]],
        reason=f"{broker} failed (first failure at {plan.first_failure_ms} ms{part})",
        requested_by="healing",
        now_ms=now_ms,
        target=broker,
    )


def heal_id(broker: str, first_failure_ms: int) -> str:
    """One heal per failure of a broker, whichever leader records it: the id is made from both."""
    return f"heal-{hashlib.blake2s(broker.encode(), digest_size=5).hexdigest()}-{first_failure_ms:x}"


class HealPlan(msgspec.Struct, frozen=True):
    """A failed broker's persisted healing plan, as the healing job holds it."""

    first_failure_ms: int
    bundles: Mapping[str, str | None]  # bundle -> planned destination (None: chosen when it moves)


def _active(op: ops.Operation) -> bool:
    """Still something to do: moves to start, or started moves whose outcome is not known yet (a paused,
    cancelled or failed operation's started moves are still followed to their end)."""
    if not op.state.terminal and (op.state is not ops.OpState.PAUSED or op.deadline_ms is not None):
        return True  # a paused operation with a deadline still fails at it
    return any(
        m.open and (m.started_version is not None or op.state is ops.OpState.CANCELLED) for m in op.moves
    )


def operation_detail(op: ops.Operation, moves: int = 100) -> dict[str, Any]:
    """``admin ops show``: the summary, who asked and when, why it is in its state, how its moves ended so
    far, and its first ``moves`` moves."""
    outcomes: dict[str, int] = {}
    for m in op.moves:
        key = m.outcome.value if m.outcome is not None else ("started" if m.started_version else "waiting")
        outcomes[key] = outcomes.get(key, 0) + 1
    return {
        **op.summary(),
        "requested_by": op.requested_by,
        "target": op.target,
        "created_ms": op.created_ms,
        "updated_ms": op.updated_ms,
        "state_reason": op.state_reason,
        "outcomes": outcomes,
        "moves": [msgspec.to_builtins(m) for m in op.moves[:moves]],
        "moves_shown": min(moves, len(op.moves)),
    }
