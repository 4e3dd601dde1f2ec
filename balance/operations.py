"""Operations: work the leader carries out over many bundles and many cycles, as one persisted record.

Why (issue 32): a shedding cycle's moves, an operator's transfer, unload or drain, a maintenance drain --
each used to live only in the memory of the leader that started it. Kill that leader and the work stopped
half done, nobody could see how far it had got, and nobody could pause it. Cruise Control has the same hole
(its #233: a rebalance cannot resume after a restart). Here every such piece of work is an
:class:`Operation` stored in ZooKeeper: its moves, the progress of each, and a state an operator can pause,
resume or cancel. A new leader reads every unfinished operation and carries on where the last one stopped.

This module is the pure part: the record, what the operator's verbs do to it, and :func:`advance`, which
from an operation and the channel's table decides which records to publish now and what finished. The
controller's job (``controller/operations.py``) reads and writes the store and publishes.

**No bundle is moved twice.** A move remembers the channel version of the record it published
(``started_version``). Once set, the operation never proposes another transition for that bundle: it waits
for the table to reach that version and reads the outcome. A record that never arrived (a failed publish, a
leader killed before Kafka acknowledged it) is proposed again *with the same version*: if the first copy did
land, the second is not a valid transition from it and every replica skips it (the first-valid-transition
rule, docs/protocol.md), so at most one of them moves the bundle.

**Operations do not fight.** A move whose bundle is no longer where the plan found it (another operation,
a lookup, healing moved it first) is not forced: it ends as ``moved_on``. The words of every outcome and
every wait are stable: they are metric labels and what ``trimtab admin ops show`` prints.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Literal

import msgspec

from trimtab.balance.heal import needs_healing
from trimtab.channel import intents
from trimtab.channel.bundles import parse_bundle
from trimtab.channel.records import Record, State
from trimtab.errors import BundleError, TrimtabError

SCHEMA = 1


class OpKind(StrEnum):
    SHED = "shed"  # a shedding cycle's moves
    TRANSFER = "transfer"  # an operator's transfer of one bundle
    UNLOAD = "unload"  # an operator's unload of one bundle
    DRAIN = "drain"  # every bundle off one broker
    MAINTENANCE = "maintenance"  # a drain with a deadline, the broker then kept out of service
    HEAL = "heal"  # a failed broker's bundles, moved by the healing job along its persisted plan
    SPLIT = "split"  # one bundle split by its owner's agent
    MERGE = "merge"  # two neighbouring bundles merged into one by their owner's agent


#: Operations the leader records and follows but does not carry out itself: a split or a merge is one
#: channel transition published by the owner's agent (only it has the bundle's figures), healing is driven by
#: the healing job from its own persisted plan (forced overrides, re-chosen destinations, the mass-failure
#: guard). Their moves end as the channel shows (:func:`follow`); :func:`advance` never publishes for them.
FOLLOWED = frozenset({OpKind.HEAL, OpKind.SPLIT, OpKind.MERGE})


class OpState(StrEnum):
    PENDING = "pending"  # stored, nothing started yet
    RUNNING = "running"
    PAUSED = "paused"  # started moves finish; no new one starts
    DONE = "done"  # every move has an outcome
    FAILED = "failed"  # given up, with a reason (the moves already made stay made)
    CANCELLED = "cancelled"  # by an operator; started moves finish, no new one starts

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({OpState.DONE, OpState.FAILED, OpState.CANCELLED})


class Outcome(StrEnum):
    """How one move ended (a stable word: a metric label, a field of the API)."""

    MOVED = "moved"  # the bundle reached the move's destination (or was unloaded)
    ALREADY_THERE = "already_there"  # nothing to do when the move came up
    MOVED_ON = "moved_on"  # the bundle was no longer where the plan found it: not forced
    SUPERSEDED = "superseded"  # the move was made, and something else moved the bundle afterwards
    GONE = "gone"  # the bundle was split or deleted
    CANCELLED = "cancelled"  # never started: the operation was cancelled
    SPLIT = "split"  # a split operation's bundle was replaced by its children
    MERGED = "merged"  # a merge operation's bundle was replaced by the merged bundle
    ABORTED = "aborted"  # a split or merge that did not complete: the bundle is back as it was


class Move(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One bundle off ``src`` -- to ``dst``, or unloaded when ``dst`` is None -- and how far it got."""

    bundle: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
    src: Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
    dst: Annotated[str, msgspec.Meta(min_length=1, max_length=512)] | None = None
    started_version: Annotated[int, msgspec.Meta(ge=1)] | None = None  # of the record this move published
    started_ms: int | None = None
    outcome: Outcome | None = None

    @property
    def open(self) -> bool:
        return self.outcome is None


class Operation(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The persisted record of one operation (JSON in ZooKeeper, docs/operations.md)."""

    schema: int = SCHEMA
    id: Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")]
    kind: OpKind
    reason: Annotated[str, msgspec.Meta(max_length=1024)]
    requested_by: Annotated[str, msgspec.Meta(max_length=256)]
    created_ms: int
    updated_ms: int
    state: OpState = OpState.PENDING
    state_reason: Annotated[str, msgspec.Meta(max_length=1024)] | None = None  # why paused, failed, cancelled
    deadline_ms: int | None = None  # maintenance: failed if moves are left at this time
    target: Annotated[str, msgspec.Meta(max_length=512)] | None = None  # the broker a drain empties
    moves: tuple[Move, ...] = ()

    def progress(self) -> tuple[int, int]:
        """(moves with an outcome, all moves)."""
        return sum(1 for m in self.moves if not m.open), len(self.moves)

    def summary(self) -> dict[str, object]:
        """The shape of ``trimtab admin ops list --output json``."""
        done, total = self.progress()
        return {
            "id": self.id,
            "kind": self.kind.value,
            "state": self.state.value,
            "reason": self.reason,
            "progress": {"done": done, "total": total},
        }


class OperationRefused(TrimtabError):
    """An operator's verb that does not apply to the operation's state (a 409 with this reason)."""

    def __init__(self, op: Operation, verb: str, why: str) -> None:
        self.op_id = op.id
        self.verb = verb
        super().__init__(f"cannot {verb} operation {op.id} ({op.state.value}): {why}")


class Undecodable(msgspec.Struct, frozen=True):
    """A stored value that is not an operation: skipped, counted, logged with this reason."""

    reason: str


_DECODER = msgspec.json.Decoder(Operation)
_ENCODER = msgspec.json.Encoder()
#: Moves of one operation at most (a drain of a broker with more is refused at submission): ~11 MB of moves,
#: stored in chunks (controller/operation_store.py).
MAX_MOVES = 50_000
MAX_BYTES = 16 * 1024 * 1024


def encode(op: Operation) -> bytes:
    return _ENCODER.encode(op)


def decode(value: bytes) -> Operation | Undecodable:
    """An operation read back from the store, or why not (never raises: the store is hostile too)."""
    if len(value) > MAX_BYTES:
        return Undecodable(f"{len(value)} bytes, more than {MAX_BYTES}")
    try:
        op = _DECODER.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        return Undecodable(f"not an operation: {e}")
    if op.schema != SCHEMA:
        return Undecodable(f"schema {op.schema} (this version reads {SCHEMA})")
    if len({m.bundle for m in op.moves}) != len(op.moves):
        return Undecodable("a bundle appears in two moves")
    if any(m.dst == m.src for m in op.moves):
        return Undecodable("a move to the broker it starts from")
    if len(op.moves) > MAX_MOVES:
        return Undecodable(f"{len(op.moves)} moves, more than {MAX_MOVES}")
    return op


def new(
    op_id: str,
    kind: OpKind,
    moves: Iterable[tuple[str, str, str | None]],
    *,
    reason: str,
    requested_by: str,
    now_ms: int,
    deadline_ms: int | None = None,
    target: str | None = None,
) -> Operation:
    """A pending operation of ``moves`` = (bundle, src, dst or None); a bundle appears once, never moved to
    where it is; at most :data:`MAX_MOVES` moves (ValueError otherwise)."""
    return _operation(
        op_id,
        kind,
        _moves(op_id, moves, set()),
        reason=reason,
        requested_by=requested_by,
        now_ms=now_ms,
        state=OpState.PENDING,
        deadline_ms=deadline_ms,
        target=target,
    )


def started(
    op_id: str,
    kind: OpKind,
    moves: Iterable[tuple[str, Record | None, str, str | None]],
    *,
    reason: str,
    requested_by: str,
    writer: str,
    now_ms: int,
) -> tuple[Operation, list[tuple[str, Record]]]:
    """Moves started at once -- an operator's transfer or unload, a shedding cycle's decisions: the
    operation (running, each move started at the version of its record) and the ``Releasing`` records to
    publish, *after* the operation is stored, as for every started move (:func:`advance`). ``moves`` are
    (bundle, its record now, src, dst or None); one whose record is no longer owned by ``src`` is left out
    (it moved since it was decided). The operation may therefore have no move: the caller stores nothing.

    Why such moves are operations at all: they are then listed, shown and followed to their end like any
    other (``admin ops``), and proposed again at the same version by the next leader if this one dies before
    Kafka acknowledged them. Why they start at once instead of at the next pass: an operator asking for one
    move expects it now, and a shedding cycle has already decided from the load it read; they count against
    the concurrency limits of everything that starts after them."""
    out: list[Move] = []
    publish: list[tuple[str, Record]] = []
    seen: set[str] = set()
    for bundle, cur, src, dst in moves:
        try:
            rec = intents.release(cur, src=src, dst=dst, writer=writer, now_ms=now_ms)
        except intents.IntentRefused:
            continue
        (move,) = _moves(op_id, [(bundle, src, dst)], seen)
        out.append(msgspec.structs.replace(move, started_version=rec.version, started_ms=now_ms))
        publish.append((bundle, rec))
    op = _operation(
        op_id, kind, out, reason=reason, requested_by=requested_by, now_ms=now_ms, state=OpState.RUNNING
    )
    return op, publish


def _operation(
    op_id: str,
    kind: OpKind,
    moves: list[Move],
    *,
    reason: str,
    requested_by: str,
    now_ms: int,
    state: OpState,
    deadline_ms: int | None = None,
    target: str | None = None,
) -> Operation:
    """A new operation of ``moves`` (created and updated now); ValueError beyond :data:`MAX_MOVES`."""
    if len(moves) > MAX_MOVES:
        raise ValueError(f"operation {op_id} would have {len(moves)} moves, more than {MAX_MOVES}")
    return Operation(
        id=op_id,
        kind=kind,
        reason=reason,
        requested_by=requested_by,
        created_ms=now_ms,
        updated_ms=now_ms,
        state=state,
        deadline_ms=deadline_ms,
        target=target,
        moves=tuple(moves),
    )


def _moves(op_id: str, moves: Iterable[tuple[str, str, str | None]], seen: set[str]) -> list[Move]:
    out: list[Move] = []
    for bundle, src, dst in moves:
        if bundle in seen:
            raise ValueError(f"bundle {bundle} appears twice in operation {op_id}")
        if dst == src:
            raise ValueError(f"operation {op_id} would move {bundle} to {dst}, where it is")
        seen.add(bundle)
        out.append(Move(bundle=bundle, src=src, dst=dst))
    return out


def extend(op: Operation, moves: Iterable[tuple[str, str, str | None]], *, now_ms: int) -> Operation:
    """``op`` with more moves (a drain's bundles that arrived at its broker after it was planned); a
    finished operation is not extended."""
    if op.state.terminal:
        return op
    more = _moves(op.id, moves, {m.bundle for m in op.moves})
    if not more:
        return op
    if len(op.moves) + len(more) > MAX_MOVES:
        raise ValueError(f"operation {op.id} would have more than {MAX_MOVES} moves")
    return msgspec.structs.replace(op, moves=op.moves + tuple(more), updated_ms=now_ms)


# ---------------------------------------------------------------------------------------------- the verbs
_ONE_TRANSITION = (
    "a split or merge is one channel transition published by the owner's agent: it completes or aborts by "
    "itself within channel.in_flight_timeout_s"
)


def _refuse_followed(op: Operation, verb: str) -> None:
    """Verbs that do not apply to a followed operation's kind (409 with the reason)."""
    if op.kind in (OpKind.SPLIT, OpKind.MERGE):
        raise OperationRefused(op, verb, _ONE_TRANSITION)
    if op.kind is OpKind.HEAL and verb == "cancel":
        raise OperationRefused(
            op,
            verb,
            "cancelled healing would leave the failed broker's bundles unowned; pause it to hold it, or bring "
            "the broker back (its healing then ends by itself)",
        )


def pause(op: Operation, *, why: str, now_ms: int) -> Operation:
    _refuse_followed(op, "pause")
    if op.state.terminal:
        raise OperationRefused(op, "pause", "it has finished")
    if op.state is OpState.PAUSED:
        return op
    return msgspec.structs.replace(op, state=OpState.PAUSED, state_reason=why, updated_ms=now_ms)


def resume(op: Operation, *, now_ms: int) -> Operation:
    _refuse_followed(op, "resume")
    if op.state.terminal:
        raise OperationRefused(op, "resume", "it has finished")
    if op.state is not OpState.PAUSED:
        return op
    started = op.kind in FOLLOWED or any(m.started_version is not None or not m.open for m in op.moves)
    state = OpState.RUNNING if started else OpState.PENDING
    return msgspec.structs.replace(op, state=state, state_reason=None, updated_ms=now_ms)


def cancel(op: Operation, *, why: str, now_ms: int) -> Operation:
    """Cancelled: no new move starts; moves already started are finished by the channel and their outcome
    still recorded (a move cannot be taken back half made)."""
    _refuse_followed(op, "cancel")
    if op.state.terminal:
        raise OperationRefused(op, "cancel", "it has finished")
    return msgspec.structs.replace(op, state=OpState.CANCELLED, state_reason=why, updated_ms=now_ms)


def fail(op: Operation, *, why: str, now_ms: int) -> Operation:
    if op.state.terminal:
        return op
    return msgspec.structs.replace(op, state=OpState.FAILED, state_reason=why, updated_ms=now_ms)


# ---------------------------------------------------------------------------------------------- budgets
@dataclass
class Budget:
    """How many more moves may start now: cluster-wide, per broker (source or destination) and per
    namespace, given what is already in flight. Limits of 0 or less mean none may start; None, no limit.
    :meth:`take` answers why a move may not start -- a stable word -- or takes one unit."""

    cluster: int | None = None
    per_broker: int | None = None
    per_namespace: int | None = None
    in_flight: int = 0
    by_broker: Counter[str] = field(default_factory=Counter)
    by_namespace: Counter[str] = field(default_factory=Counter)

    @classmethod
    def from_table(
        cls,
        items: Iterable[tuple[str, Record]],
        *,
        cluster: int | None,
        per_broker: int | None,
        per_namespace: int | None,
    ) -> Budget:
        """The budget left given every bundle in flight in the channel, whoever started it."""
        b = cls(cluster, per_broker, per_namespace)
        for bundle, rec in items:
            if rec.state.in_flight:
                b.count(bundle, rec.src, rec.dst)
        return b

    def count(self, bundle: str, *brokers: str | None) -> None:
        """One more move in flight (of ``bundle``, between ``brokers``)."""
        self.in_flight += 1
        for broker in {x for x in brokers if x is not None}:
            self.by_broker[broker] += 1
        self.by_namespace[_namespace(bundle)] += 1

    def take(self, move: Move) -> str | None:
        if self.cluster is not None and self.in_flight >= self.cluster:
            return "throttled_cluster"
        if self.per_broker is not None and any(
            self.by_broker[x] >= self.per_broker for x in (move.src, move.dst) if x is not None
        ):
            return "throttled_broker"
        if (
            self.per_namespace is not None
            and self.by_namespace[_namespace(move.bundle)] >= self.per_namespace
        ):
            return "throttled_namespace"
        self.count(move.bundle, move.src, move.dst)
        return None


def _namespace(bundle: str) -> str:
    try:
        return parse_bundle(bundle)[0]
    except BundleError:
        return bundle


# ---------------------------------------------------------------------------------------------- advancing
@dataclass
class Advance:
    """What one pass over the running operations decided."""

    ops: list[Operation]  # every operation given, updated (the same object when unchanged)
    publish: list[tuple[str, Record]]  # records to propose now, in order
    waiting: Counter[str]  # why moves that could start did not (throttle words)
    outcomes: Counter[tuple[str, str]]  # (kind, outcome) of the moves that ended in this pass

    def changed(self, before: Sequence[Operation]) -> list[Operation]:
        return [a for a, b in zip(self.ops, before, strict=True) if a is not b]


def _settle(move: Move, cur: Record | None) -> Outcome | None:
    """A started move's outcome from the bundle's record now, or None while it is still on its way."""
    assert move.started_version is not None
    if cur is None:
        # Tombstoned once settled (a Free record after an unload, a Deleted one after a split): versions
        # start again from here, so nothing may be proposed for this move any more.
        return Outcome.MOVED if move.dst is None else Outcome.GONE
    if cur.version < move.started_version:
        return None  # our record has not arrived (yet)
    if cur.state.in_flight:
        return None
    if cur.state is State.DELETED:
        return Outcome.GONE
    if move.dst is None:
        return Outcome.MOVED if cur.owner() != move.src else Outcome.SUPERSEDED
    return Outcome.MOVED if cur.owner() == move.dst else Outcome.SUPERSEDED


def _at_start(move: Move, cur: Record | None) -> Outcome | Literal["wait"] | None:
    """Whether a move that has not started has nothing to do (and why), must wait, or (None) can start.

    A bundle on its way *to* the move's source waits until it got there: a drain planned while a lookup
    was assigning the bundle to the broker being drained moves it once it arrived."""
    if cur is None or cur.state is State.DELETED:
        return Outcome.GONE
    if move.dst is not None and cur.owner() == move.dst and cur.state is State.OWNED:
        return Outcome.ALREADY_THERE
    if cur.state in (State.ASSIGNING, State.RELEASING) and cur.dst == move.src:
        return "wait"  # on its way to the broker it is to leave: moved once it got there
    if not intents.owned_by(cur, move.src):
        return Outcome.MOVED_ON
    return None


def advance(
    ops: Sequence[Operation],
    table_get: Callable[[str], Record | None],
    budget: Budget,
    *,
    writer: str,
    now_ms: int,
    republish_after_ms: int,
    usable: Callable[[str], bool] = lambda broker: True,
) -> Advance:
    """One pass: settle started moves, propose again what never arrived, and start new moves of running
    (or pending) operations while the budget allows -- taking them round-robin across namespaces, so that
    one namespace's 10 000 moves cannot starve another's 10 (Helix #3021).

    Pure: the caller persists every changed operation *before* publishing (so that a leader killed between
    the two finds the started version and proposes the same record, never a second move)."""
    p = _Pass(list(ops), table_get, writer, now_ms, usable)
    p.settle_started(republish_after_ms, budget)
    p.start_new(budget)
    return p.finish()


class _Pass:
    def __init__(
        self,
        ops: list[Operation],
        table_get: Callable[[str], Record | None],
        writer: str,
        now_ms: int,
        usable: Callable[[str], bool],
    ) -> None:
        self.ops = ops
        self.usable = usable
        self.get = table_get
        self.writer = writer
        self.now = now_ms
        self.publish: list[tuple[str, Record]] = []
        self.outcomes: Counter[tuple[str, str]] = Counter()
        self.waiting: Counter[str] = Counter()
        self.moves: dict[int, list[Move]] = {}  # op index -> its moves, as updated so far

    def mv(self, i: int) -> list[Move]:
        if i not in self.moves:
            self.moves[i] = list(self.ops[i].moves)
        return self.moves[i]

    def end(self, i: int, j: int, outcome: Outcome) -> None:
        self.mv(i)[j] = msgspec.structs.replace(self.mv(i)[j], outcome=outcome)
        self.outcomes[(self.ops[i].kind.value, outcome.value)] += 1

    def settle_started(self, republish_after_ms: int, budget: Budget) -> None:
        """Started moves: an outcome once the bundle is settled; proposed again if their record never
        arrived -- counted in the budget meanwhile, as the in-flight records they are meant to be."""
        for i, op in enumerate(self.ops):
            if op.kind in FOLLOWED:
                continue
            for j, m in enumerate(op.moves):
                if not m.open or m.started_version is None:
                    continue
                cur = self.get(m.bundle)
                got = _settle(m, cur)
                if got is not None:
                    self.end(i, j, got)
                    continue
                if cur is None or cur.version < m.started_version:
                    budget.count(m.bundle, m.src, m.dst)
                if cur is not None and cur.version == m.started_version - 1:
                    if not intents.owned_by(cur, m.src):
                        self.end(i, j, Outcome.MOVED_ON)  # not through the channel: a table from elsewhere
                    elif m.started_ms is None or self.now - m.started_ms >= republish_after_ms:
                        # Never arrived: the same record again (the same version: at most one applies).
                        try:
                            rec = intents.release(
                                cur, src=m.src, dst=m.dst, writer=self.writer, now_ms=self.now
                            )
                        except intents.IntentRefused:
                            self.end(i, j, Outcome.MOVED_ON)
                            continue
                        self.publish.append((m.bundle, rec))
                        self.mv(i)[j] = msgspec.structs.replace(m, started_ms=self.now)

    def start_new(self, budget: Budget) -> None:
        queues: dict[str, list[tuple[int, int]]] = {}
        for i, op in enumerate(self.ops):
            if op.kind in FOLLOWED:
                continue
            unstarted = [j for j, m in enumerate(op.moves) if m.open and m.started_version is None]
            if op.state is OpState.CANCELLED:
                for j in unstarted:
                    self.end(i, j, Outcome.CANCELLED)
            elif op.state in (OpState.PENDING, OpState.RUNNING) and not (
                op.deadline_ms is not None and self.now > op.deadline_ms
            ):  # past its deadline it starts nothing more: it fails (finish)
                for j in unstarted:
                    queues.setdefault(_namespace(op.moves[j].bundle), []).append((i, j))
        # Maintenance has a deadline: its moves take the budget first, then namespaces take turns.
        first = [(i, j) for q in queues.values() for i, j in q if self.ops[i].kind is OpKind.MAINTENANCE]
        for i, j in sorted(first):
            why = self._try(i, j, budget)
            if why is not None:
                self.waiting[why] += 1
        if first:
            urgent = set(first)
            queues = {ns: [x for x in q if x not in urgent] for ns, q in queues.items()}
            queues = {ns: q for ns, q in queues.items() if q}
        pending = [q for _, q in sorted(queues.items())]
        cursor = [0] * len(pending)
        blocked: set[int] = set()  # namespaces at their own limit: nothing more starts there this pass
        full = False  # the cluster-wide limit: nothing more starts anywhere
        progressed = True
        while progressed and not full:
            progressed = False
            for k, q in enumerate(pending):
                if k in blocked or cursor[k] >= len(q):
                    continue
                progressed = True
                why = self._try(*q[cursor[k]], budget)
                if why == "throttled_cluster":
                    full = True
                    break
                if why == "throttled_namespace":
                    blocked.add(k)
                    continue
                cursor[k] += 1
                if why is not None:  # a busy source or destination: the namespace's next move may use others
                    self.waiting[why] += 1
        for k, q in enumerate(pending):
            if cursor[k] < len(q):
                self.waiting["throttled_namespace" if k in blocked else "throttled_cluster"] += (
                    len(q) - cursor[k]
                )

    def _try(self, i: int, j: int, budget: Budget) -> str | None:
        """Start move j of operation i, end it if there is nothing to do, or say which limit stopped it."""
        m = self.mv(i)[j]
        cur = self.get(m.bundle)
        done = _at_start(m, cur)
        if done == "wait":
            return "arriving"
        if done is not None:
            self.end(i, j, done)
            return None
        if m.dst is not None and not self.usable(m.dst):
            # Its planned destination died, drains or is in maintenance since the plan: unloaded instead (the
            # next lookup places it by the rules in force), not sent where it cannot stay.
            m = msgspec.structs.replace(m, dst=None)
        why = budget.take(m)
        if why is not None:
            return why
        assert cur is not None
        try:
            rec = intents.release(cur, src=m.src, dst=m.dst, writer=self.writer, now_ms=self.now)
        except intents.IntentRefused:
            self.end(i, j, Outcome.MOVED_ON)
            return None
        self.publish.append((m.bundle, rec))
        self.mv(i)[j] = msgspec.structs.replace(m, started_version=rec.version, started_ms=self.now)
        return None

    def finish(self) -> Advance:
        """The operations' states follow their moves."""
        out = self.ops
        for i, op in enumerate(out):
            if op.kind in FOLLOWED:
                continue
            moves = tuple(self.moves[i]) if i in self.moves else op.moves
            state = op.state
            if state is OpState.PENDING and any(m.started_version is not None or not m.open for m in moves):
                state = OpState.RUNNING
            if state in (OpState.PENDING, OpState.RUNNING) and all(not m.open for m in moves):
                state = OpState.DONE
            why = op.state_reason
            if (
                state in (OpState.PENDING, OpState.RUNNING, OpState.PAUSED)
                and op.deadline_ms is not None
                and self.now > op.deadline_ms
            ):
                left = sum(1 for m in moves if m.open)
                state, why = OpState.FAILED, f"deadline passed with {left} of {len(moves)} moves left"
            if moves != op.moves or state is not op.state:
                out[i] = msgspec.structs.replace(
                    op, moves=moves, state=state, state_reason=why, updated_ms=self.now
                )
        return Advance(out, self.publish, self.waiting, self.outcomes)


# ---------------------------------------------------------------------------------------------- followed
#: A followed move as given: (bundle, src, dst or None, version and time stamp of the record that started
#: it -- or None and None: a heal's moves are not started by a record of their own).
FollowedMove = tuple[str, str, str | None, int | None, int | None]


def followed(
    op_id: str,
    kind: OpKind,
    moves: Iterable[FollowedMove],
    *,
    reason: str,
    requested_by: str,
    now_ms: int,
    target: str | None = None,
) -> Operation:
    """A running operation of a :data:`FOLLOWED` kind: ``moves`` are (bundle, src, dst or None, the version and
    the time stamp of the record that started it, or None and None). A split's one move is its bundle (src:
    its owner, started at the ``Splitting`` record); a merge's two are its parents (``target``: the merged
    bundle); a heal's are the failed broker's bundles (src: that broker, dst: the planned destination, never
    started here). A started move keeps the record's version *and* time stamp: a key deleted and made
    again counts its versions from 1 again, so the version alone would take a later split for this one."""
    if kind not in FOLLOWED:
        raise ValueError(f"{kind.value} operations are carried out by the leader, not followed")
    given = list(moves)
    out = [
        msgspec.structs.replace(m, started_version=v, started_ms=ts)
        for m, (_, _, _, v, ts) in zip(
            _moves(op_id, [(b, src, dst) for b, src, dst, _, _ in given], set()), given, strict=True
        )
    ]
    return _operation(
        op_id,
        kind,
        out,
        reason=reason[:1024],  # written from channel records (a writer's name, bundle names): cut to what
        requested_by=requested_by[:256],  # decodes again, or the next leader would skip the whole operation
        now_ms=now_ms,
        state=OpState.RUNNING,
        target=target,
    )


def add_followed(op: Operation, moves: Iterable[FollowedMove], *, now_ms: int) -> Operation:
    """A followed operation with more moves (a merge's second parent, seen after the first)."""
    given = [x for x in moves if x[0] not in {m.bundle for m in op.moves}]
    if op.state.terminal or not given:
        return op
    more = followed(op.id, op.kind, given, reason=op.reason, requested_by=op.requested_by, now_ms=now_ms)
    return msgspec.structs.replace(op, moves=op.moves + more.moves, updated_ms=now_ms)


def _followed_outcome(kind: OpKind, move: Move, cur: Record | None) -> Outcome | None:
    """How a followed move ended, from its bundle's record now; None while it is still under way."""
    if kind is OpKind.HEAL:
        # Healed once the record no longer needs the failed broker and is settled (an override in flight to
        # a live broker is still on its way).
        if cur is None or cur.state is State.DELETED:
            return Outcome.GONE
        if cur.state.in_flight or needs_healing(cur, frozenset({move.src})):
            return None
        return Outcome.MOVED if move.dst is not None and cur.owner() == move.dst else Outcome.MOVED_ON
    assert move.started_version is not None
    done = Outcome.SPLIT if kind is OpKind.SPLIT else Outcome.MERGED
    if cur is None or cur.state is State.DELETED or cur.version < move.started_version:
        return done  # replaced (tombstoned once settled; a lower version is the key made again since)
    if cur.version == move.started_version:
        return None  # still the record that started it
    return Outcome.ABORTED  # moved on without being deleted: the split or merge did not complete


@dataclass(frozen=True)
class Observed:
    """A split or merge seen in the channel that no operation follows yet: the operation to record."""

    kind: OpKind
    target: str  # the bundle split, or the merged bundle
    moves: tuple[FollowedMove, ...]  # as :func:`followed` takes them
    requested_by: str  # the record's writer: the owner's agent, or the leader for ``admin merge``
    reason: str


def observe(seen: Iterable[tuple[str, Record]], tracked: Callable[[str, int, int], bool]) -> list[Observed]:
    """The operations to record for ``Splitting`` and ``Merging`` records not ``tracked(bundle, version,
    ts)`` yet (each once, however often it was seen): one per split, one per merged bundle (both parents
    together when both are seen)."""
    out: list[Observed] = []
    merges: dict[str, list[tuple[str, Record]]] = {}
    done: set[tuple[str, int, int]] = set()
    for bundle, rec in sorted(seen, key=lambda x: (x[0], x[1].version, x[1].ts)):
        key = (bundle, rec.version, rec.ts)
        if rec.src is None or len(rec.src) > 512 or key in done or tracked(*key):
            continue  # (a broker name longer than a stored move holds would make it unreadable)
        done.add(key)
        if rec.state is State.SPLITTING:
            n = len(rec.children or ())
            out.append(
                Observed(
                    OpKind.SPLIT,
                    bundle,
                    ((bundle, rec.src, None, rec.version, rec.ts),),
                    rec.writer,
                    f"split of {bundle} into {n} bundles by its owner {rec.src}",
                )
            )
        elif rec.state is State.MERGING and rec.children and len(rec.children) == 1:
            try:
                ns = parse_bundle(bundle)[0]
            except BundleError:
                continue
            merges.setdefault(f"{ns}/{next(iter(rec.children))}", []).append((bundle, rec))
    for merged, parents in sorted(merges.items()):
        names = " and ".join(b for b, _ in parents)
        out.append(
            Observed(
                OpKind.MERGE,
                merged,
                tuple((b, r.src or "", None, r.version, r.ts) for b, r in parents),
                parents[0][1].writer,
                f"merge of {names} into {merged} by their owner {parents[0][1].src}",
            )
        )
    return out


def follow(op: Operation, table_get: Callable[[str], Record | None], *, now_ms: int) -> Operation:
    """A followed operation brought up to date with the channel (the same object when nothing changed):
    each open move ends as its bundle's record shows; the operation is done once every move ended -- failed
    when a split or merge aborted -- and a cancelled one (healing of a broker that came back) ends its open
    moves as cancelled. Pure: the caller stores what changed."""
    if op.kind not in FOLLOWED or (op.state.terminal and op.state is not OpState.CANCELLED):
        return op
    moves = list(op.moves)
    for j, m in enumerate(moves):
        if not m.open:
            continue
        got = (
            Outcome.CANCELLED
            if op.state is OpState.CANCELLED
            else _followed_outcome(op.kind, m, table_get(m.bundle))
        )
        if got is not None:
            moves[j] = msgspec.structs.replace(m, outcome=got)
    state, why = op.state, op.state_reason
    if not state.terminal and all(not m.open for m in moves):
        aborted = sum(1 for m in moves if m.outcome is Outcome.ABORTED)
        if aborted:
            state, why = (
                OpState.FAILED,
                f"{aborted} of {len(moves)} bundles aborted: the bundle is back as it was",
            )
        else:
            state = OpState.DONE
    if tuple(moves) == op.moves and state is op.state:
        return op
    return msgspec.structs.replace(op, moves=tuple(moves), state=state, state_reason=why, updated_ms=now_ms)


def end_followed(op: Operation, *, why: str, now_ms: int) -> Operation:
    """A heal that ends before its moves did (its broker came back): cancelled with ``why``, open moves
    ending as cancelled at the next :func:`follow`."""
    if op.state.terminal:
        return op
    return msgspec.structs.replace(op, state=OpState.CANCELLED, state_reason=why, updated_ms=now_ms)


def by_state(ops: Iterable[Operation]) -> Mapping[tuple[str, str], int]:
    """How many operations of each (kind, state): the gauge ``trimtab_operations``."""
    return Counter((op.kind.value, op.state.value) for op in ops)
