"""The rules of an operations pass (balance/operations.py: ``advance``, ``Budget``; docs/operations.md,
docs/testing.md): how a started move settles or is proposed again, what counts against the limits, in
which order new moves start and what the pass reports.

Each test states the rule it pins, through ``advance``, ``Advance`` and ``Budget`` only. A started move
here started from its bundle's record at v3, so its record is v4: versions sit on the boundaries (the
started version, the one before it), the deadline and the limits are tested at equality.
"""

from __future__ import annotations

import msgspec
import pytest

from trimtab.balance import operations as ops
from trimtab.channel.records import Record, State, make

T0 = 1_800_000_000_000
NOW = T0 + 1000
A, B, C, D = "a:1", "b:1", "c:1", "d:1"


def bundle(ns: str, k: int = 0) -> str:
    """The k-th sixteenth of namespace ``t/<ns>``."""
    return f"t/{ns}/0x{k << 28:08x}_0x{(k + 1) << 28:08x}"


X1, X2, X3 = bundle("a", 0), bundle("a", 1), bundle("a", 2)
W0, W1, W2 = bundle("b", 0), bundle("b", 1), bundle("b", 2)
Z1, Z2 = bundle("c", 0), bundle("c", 1)


def owned(dst: str, version: int = 3) -> Record:
    return make(State.OWNED, dst=dst, version=version, ts=T0, writer="x")


def arriving(dst: str = A) -> Record:
    """A lookup's assignment still on its way to ``dst``."""
    return make(State.ASSIGNING, dst=dst, version=3, ts=T0, writer="lookup")


def new(
    kind: ops.OpKind,
    moves: list[tuple[str, str, str | None]],
    op_id: str = "op-1",
    deadline_ms: int | None = None,
) -> ops.Operation:
    return ops.new(op_id, kind, moves, reason="r", requested_by="me", now_ms=T0, deadline_ms=deadline_ms)


def started(moves: list[tuple[str, str, str | None]], op_id: str = "op-s", at: int = T0) -> ops.Operation:
    """An operation whose moves were started at ``at`` from bundles owned by their source at v3: each move
    has started_version 4."""
    op, _ = ops.started(
        op_id,
        ops.OpKind.SHED,
        [(b, owned(src), src, dst) for b, src, dst in moves],
        reason="r",
        requested_by="me",
        writer="leader",
        now_ms=at,
    )
    assert [m.started_version for m in op.moves] == [4] * len(moves)
    return op


def step(
    given: list[ops.Operation],
    table: dict[str, Record],
    *,
    now: int = NOW,
    budget: ops.Budget | None = None,
    republish_after_ms: int = 5000,
) -> ops.Advance:
    return ops.advance(
        given,
        table.get,
        budget or ops.Budget(),
        writer="leader",
        now_ms=now,
        republish_after_ms=republish_after_ms,
    )


def published(adv: ops.Advance) -> list[str]:
    return [b for b, _ in adv.publish]


# ---------------------------------------------------------------------------------------------- settling
@pytest.mark.parametrize(("dst", "outcome"), [(None, ops.Outcome.MOVED), (B, ops.Outcome.GONE)])
def test_a_started_move_whose_record_vanished_is_moved_for_an_unload_and_gone_for_a_transfer(
    dst: str | None, outcome: ops.Outcome
) -> None:
    """Rule: a started move whose bundle has no record any more (tombstoned once settled) ends: an unload
    reached its end (Free, then tombstone) -- moved; a transfer's bundle was split or deleted -- gone."""
    adv = step([started([(X1, A, dst)])], {})
    assert adv.ops[0].moves[0].outcome is outcome and adv.publish == []


@pytest.mark.parametrize(
    ("cur", "outcome"),
    [
        (make(State.FREE, src=A, version=6, ts=T0, writer=A), ops.Outcome.MOVED),
        (owned(B, version=6), ops.Outcome.MOVED),
        (owned(A, version=8), ops.Outcome.SUPERSEDED),
    ],
)
def test_an_unload_is_moved_once_its_source_no_longer_serves_the_bundle(
    cur: Record, outcome: ops.Outcome
) -> None:
    """Rule: a settled unload (dst None) ended ``moved`` when the bundle's owner now is anyone but its source
    (nobody, or a broker a lookup chose), ``superseded`` when it is back at the source."""
    adv = step([started([(X1, A, None)])], {X1: cur})
    assert adv.ops[0].moves[0].outcome is outcome


def test_a_settled_record_at_exactly_the_started_version_ends_the_move() -> None:
    """Rule: the move's record has arrived once the bundle's version *reaches* the started version (``<``,
    not ``<=``): a settled record at that very version -- a forced override that won the race for it --
    ends the move as the record shows, instead of leaving it open for ever."""
    forced = make(State.OWNED, dst=B, version=4, ts=T0, writer="healer", force=True)
    adv = step([started([(X1, A, B)])], {X1: forced})
    assert adv.ops[0].moves[0].outcome is ops.Outcome.MOVED and adv.ops[0].state is ops.OpState.DONE
    elsewhere = make(State.OWNED, dst=C, version=4, ts=T0, writer="healer", force=True)
    assert step([started([(X1, A, B)])], {X1: elsewhere}).ops[0].moves[0].outcome is ops.Outcome.SUPERSEDED


def test_a_lost_record_whose_bundle_left_its_source_meanwhile_ends_moved_on() -> None:
    """Rule: a started move whose record never arrived (the table one version short of it) is not proposed
    again once the bundle is no longer owned by the move's source: it ends ``moved_on``, nothing is
    published -- however long ago it started."""
    for cur in (owned(C), arriving(C)):
        adv = step([started([(X1, A, B)])], {X1: cur}, now=T0 + 60_000)
        assert adv.publish == [] and adv.ops[0].moves[0].outcome is ops.Outcome.MOVED_ON
        assert adv.outcomes == {("shed", "moved_on"): 1}


def test_a_record_proposed_again_is_written_by_this_pass_and_restarts_the_wait() -> None:
    """Rule: a lost record is proposed again with the same version, written by this pass's writer at this
    pass's time, and the move's start time becomes now (the next copy waits ``republish_after_ms`` again)."""
    op = started([(X1, A, B)])
    later = T0 + 5000
    adv = step([op], {X1: owned(A)}, now=later)
    [(b, rec)] = adv.publish
    assert (b, rec.state, rec.src, rec.dst, rec.version) == (X1, State.RELEASING, A, B, 4)
    assert (rec.writer, rec.ts) == ("leader", later)
    move = adv.ops[0].moves[0]
    assert (move.started_version, move.started_ms, move.outcome) == (4, later, None)
    assert step(adv.ops, {X1: owned(A)}, now=later + 4999).publish == []


def test_a_stored_move_the_channel_refuses_to_propose_again_ends_moved_on_and_the_pass_goes_on() -> None:
    """Rule: a lost record that ``release`` refuses to build again (a hand-made move to the broker it starts
    from, which ``new`` and ``decode`` refuse) ends ``moved_on`` instead of raising out of the pass, and the
    operation's next move is still proposed again."""
    bad = ops.Move(bundle=X1, src=A, dst=A, started_version=4)
    good = ops.Move(bundle=X2, src=A, dst=B, started_version=4)
    op = msgspec.structs.replace(
        new(ops.OpKind.DRAIN, [(X3, A, B)]), moves=(bad, good), state=ops.OpState.RUNNING
    )
    adv = step([op], {X1: owned(A), X2: owned(A)})
    assert [m.outcome for m in adv.ops[0].moves] == [ops.Outcome.MOVED_ON, None]
    assert [(b, r.version, r.dst) for b, r in adv.publish] == [(X2, 4, B)]
    assert adv.outcomes == {("drain", "moved_on"): 1}


def test_a_move_that_is_not_started_or_has_ended_does_not_stop_settling_the_next() -> None:
    """Rule: settling skips a move that has not started (its bundle still arriving) or has ended (gone) and
    goes on with the operation's next moves (``continue``, not ``break``)."""
    table = {X1: arriving(), X2: owned(A)}
    op = step([new(ops.OpKind.DRAIN, [(X1, A, B), (X2, A, B)])], table).ops[0]
    assert [(m.started_version, m.outcome) for m in op.moves] == [(None, None), (4, None)]
    table[X2] = owned(B, version=6)
    adv = step([op], table, now=NOW + 1000)
    assert [m.outcome for m in adv.ops[0].moves] == [None, ops.Outcome.MOVED]
    del table[X1]  # the first ends as gone; the second is settled in the same pass
    table[X2] = owned(A)
    op = step([new(ops.OpKind.DRAIN, [(X1, A, B), (X2, A, B)])], table).ops[0]
    assert [m.outcome for m in op.moves] == [ops.Outcome.GONE, None]
    table[X2] = owned(B, version=6)
    assert [m.outcome for m in step([op], table).ops[0].moves] == [ops.Outcome.GONE, ops.Outcome.MOVED]


def test_a_started_record_not_arrived_yet_counts_against_every_limit() -> None:
    """Rule: a started move whose record has not reached the table (version below the started one, not due
    to be proposed again) is in flight for the budget: it takes a slot of the cluster, of its source, of
    its destination and of its namespace."""
    waiting = started([(X1, A, B)], at=NOW)
    table = {X1: owned(A), X2: owned(C), W1: owned(A), W2: owned(C), Z1: owned(C)}

    def waits(move: tuple[str, str, str | None], budget: ops.Budget) -> dict[str, int]:
        adv = step([waiting, new(ops.OpKind.DRAIN, [move], op_id="op-2")], table, budget=budget)
        assert adv.ops[0] is waiting
        return dict(adv.waiting)

    assert waits((Z1, C, D), ops.Budget(cluster=1)) == {"throttled_cluster": 1}
    assert waits((W1, A, D), ops.Budget(per_broker=1)) == {"throttled_broker": 1}  # its source
    assert waits((W2, C, B), ops.Budget(per_broker=1)) == {"throttled_broker": 1}  # its destination
    assert waits((Z1, C, D), ops.Budget(per_broker=1)) == {}
    assert waits((X2, C, D), ops.Budget(per_namespace=1)) == {"throttled_namespace": 1}
    assert waits((Z1, C, D), ops.Budget(per_namespace=1)) == {}


def test_followed_operations_are_skipped_and_the_pass_goes_on_with_the_next() -> None:
    """Rule: a split, merge or heal operation is left to ``follow``: the pass skips it (``continue``) and
    settles, starts and updates the operations after it."""
    split = ops.followed(
        "split-1", ops.OpKind.SPLIT, [(Z1, C, None, 4, T0)], reason="r", requested_by="agent", now_ms=T0
    )
    done = started([(X1, A, B)])
    fresh = new(ops.OpKind.DRAIN, [(W1, A, B)], op_id="op-2")
    adv = step([split, done, fresh], {X1: owned(B, version=6), W1: owned(A)})
    assert adv.ops[0] is split
    assert adv.ops[1].state is ops.OpState.DONE and adv.ops[1].moves[0].outcome is ops.Outcome.MOVED
    assert adv.ops[2].state is ops.OpState.RUNNING and adv.ops[2].moves[0].started_version == 4
    assert published(adv) == [W1]
    assert adv.changed([split, done, fresh]) == adv.ops[1:]


# ---------------------------------------------------------------------------------------------- starting
def test_a_new_move_is_written_by_this_pass_at_this_pass_time() -> None:
    """Rule: the record that starts a move carries the pass's writer and time, and the move remembers its
    version and that time."""
    adv = step([new(ops.OpKind.DRAIN, [(X1, A, B)])], {X1: owned(A)}, now=NOW + 7)
    [(_, rec)] = adv.publish
    assert (rec.state, rec.src, rec.dst, rec.version, rec.writer, rec.ts) == (
        State.RELEASING,
        A,
        B,
        4,
        "leader",
        NOW + 7,
    )
    assert (adv.ops[0].moves[0].started_version, adv.ops[0].moves[0].started_ms) == (4, NOW + 7)


def test_a_maintenance_drain_still_starts_and_is_not_failed_at_exactly_its_deadline() -> None:
    """Rule: a maintenance drain is past its deadline only when now is *after* it (``>``): at the deadline
    its moves still start and it runs; one millisecond later nothing starts and it fails with the count."""
    op = new(ops.OpKind.MAINTENANCE, [(X1, A, B)], deadline_ms=NOW)
    adv = step([op], {X1: owned(A)}, now=NOW)
    assert published(adv) == [X1] and adv.ops[0].state is ops.OpState.RUNNING
    assert adv.ops[0].state_reason is None
    late = step([op], {X1: owned(A)}, now=NOW + 1)
    assert late.publish == [] and late.ops[0].state is ops.OpState.FAILED
    assert late.ops[0].state_reason == "deadline passed with 1 of 1 moves left"


def test_maintenance_moves_that_cannot_start_are_counted_once_each() -> None:
    """Rule: maintenance moves take the budget first; each that does not start counts once under the limit
    that stopped it."""
    op = new(ops.OpKind.MAINTENANCE, [(X1, A, B), (X2, A, B), (X3, A, B)])
    adv = step([op], {X1: owned(A), X2: owned(A), X3: owned(A)}, budget=ops.Budget(cluster=1))
    assert published(adv) == [X1]
    assert dict(adv.waiting) == {"throttled_cluster": 2}


def test_maintenance_moves_start_first_and_once_and_the_others_after_them() -> None:
    """Rule: a maintenance drain's moves start before any other operation's (whatever the namespaces'
    order), each once; the other operations' moves then take their turns."""
    drain = new(ops.OpKind.DRAIN, [(X1, A, B)], op_id="op-1")
    maintenance = new(ops.OpKind.MAINTENANCE, [(Z1, C, B), (Z2, C, B)], op_id="op-2")
    table = {X1: owned(A), Z1: owned(C), Z2: owned(C)}
    adv = step([drain, maintenance], table)
    assert published(adv) == [Z1, Z2, X1]
    adv = step([drain, maintenance], table, budget=ops.Budget(cluster=2))
    assert published(adv) == [Z1, Z2] and dict(adv.waiting) == {"throttled_cluster": 1}


def test_the_round_robin_goes_on_past_a_namespace_with_nothing_left() -> None:
    """Rule: a namespace whose moves are all tried is skipped (``continue``): the others keep taking turns
    until theirs are tried too."""
    op = new(ops.OpKind.DRAIN, [(X1, A, B), (W0, A, B), (W1, A, B), (W2, A, B)])
    adv = step([op], {b: owned(A) for b in (X1, W0, W1, W2)})
    assert published(adv) == [X1, W0, W1, W2] and adv.waiting == {}


def test_once_the_cluster_is_full_the_moves_left_are_not_looked_at() -> None:
    """Rule: at the cluster-wide limit the pass stops starting: every move left -- even one that would only
    have waited for its bundle to arrive -- counts as ``throttled_cluster``."""
    op = new(ops.OpKind.DRAIN, [(X1, A, B), (X2, A, B), (W1, A, B), (W2, A, B)])
    table = {X1: owned(A), X2: owned(A), W1: owned(A), W2: arriving()}
    adv = step([op], table, budget=ops.Budget(cluster=1))
    assert published(adv) == [X1]
    assert dict(adv.waiting) == {"throttled_cluster": 3}


def test_a_namespace_at_its_limit_is_not_looked_at_again_in_the_pass() -> None:
    """Rule: a namespace that reached its own limit starts nothing more in this pass: its moves left --
    even one whose bundle is still arriving -- count as ``throttled_namespace``."""
    op = new(ops.OpKind.DRAIN, [(X1, A, B), (X2, A, B), (X3, A, B)])
    table = {X1: owned(A), X2: owned(A), X3: arriving()}
    adv = step([op], table, budget=ops.Budget(per_namespace=1))
    assert published(adv) == [X1]
    assert dict(adv.waiting) == {"throttled_namespace": 2}


def test_a_namespace_at_its_limit_does_not_cost_the_next_namespaces_their_turn() -> None:
    """Rule: when a namespace reaches its limit the round goes on with the namespaces after it
    (``continue``): with 5 slots left, namespace a (3 moves), b (1 slot) and c (2 moves) start a, b, c,
    a, c -- not a third move of a before c's second."""
    busy = make(State.RELEASING, src=A, dst=D, version=9, ts=T0, writer="x")
    budget = ops.Budget.from_table([(W0, busy)], cluster=6, per_broker=None, per_namespace=2)
    op = new(
        ops.OpKind.DRAIN, [(X1, A, B), (X2, A, B), (X3, A, B), (W1, A, B), (W2, A, B), (Z1, A, B), (Z2, A, B)]
    )
    adv = step([op], {b: owned(A) for b in (X1, X2, X3, W1, W2, Z1, Z2)}, budget=budget)
    assert published(adv) == [X1, W1, Z1, X2, Z2]
    assert dict(adv.waiting) == {"throttled_namespace": 1, "throttled_cluster": 1}


def test_every_move_waiting_for_its_bundle_is_counted() -> None:
    """Rule: each move of the round-robin that cannot start for its own reason (its bundle still arriving,
    a busy broker) counts once: two such moves, two waits."""
    op = new(ops.OpKind.DRAIN, [(X1, A, B), (X2, A, B), (W1, A, B), (W2, A, B)])
    adv = step(
        [op], {X1: arriving(), X2: arriving(), W1: owned(A), W2: owned(A)}, budget=ops.Budget(per_broker=1)
    )
    assert published(adv) == [W1]
    assert dict(adv.waiting) == {"arriving": 2, "throttled_broker": 1}


# ---------------------------------------------------------------------------------------------- finishing
def test_a_pending_operation_with_nothing_started_or_ended_stays_pending_and_unchanged() -> None:
    """Rule: an operation becomes running only once a move started or ended; a pending one whose moves all
    wait is returned as the same object, not reported as changed."""
    op = new(ops.OpKind.DRAIN, [(X1, A, B), (W1, A, B)])
    adv = step([op], {X1: owned(A), W1: owned(A)}, budget=ops.Budget(per_broker=0))
    assert adv.ops[0] is op and adv.changed([op]) == []
    assert dict(adv.waiting) == {"throttled_broker": 2}
    adv = step([op], {X1: owned(A)}, budget=ops.Budget(per_broker=0))  # one ends (gone), one waits
    assert adv.ops[0].state is ops.OpState.RUNNING and adv.changed([op]) == adv.ops


def test_an_operation_changed_by_the_pass_keeps_its_reason_and_is_stamped_now() -> None:
    """Rule: a paused operation whose started move settles keeps its state and the operator's reason, and
    its update time is the pass's."""
    op = ops.pause(started([(X1, A, B), (X2, A, B)]), why="operator", now_ms=T0 + 1)
    in_flight = make(State.RELEASING, src=A, dst=B, version=4, ts=T0, writer="leader")
    adv = step([op], {X1: owned(B, version=6), X2: in_flight}, now=NOW + 3)
    got = adv.ops[0]
    assert (got.state, got.state_reason, got.updated_ms) == (ops.OpState.PAUSED, "operator", NOW + 3)
    assert [m.outcome for m in got.moves] == [ops.Outcome.MOVED, None]


def test_changed_compares_with_the_very_operations_given() -> None:
    """Rule: ``changed`` pairs the pass's operations with those it was given, one for one: a list of
    another length is an error, not silently cut short."""
    op, other = new(ops.OpKind.DRAIN, [(X1, A, B)]), new(ops.OpKind.DRAIN, [(X2, A, B)], op_id="op-2")
    adv = step([op, other], {X1: owned(A), X2: arriving()})
    assert adv.changed([op, other]) == [adv.ops[0]]
    with pytest.raises(ValueError):
        adv.changed([op])
    with pytest.raises(ValueError):
        adv.changed([op, other, other])


# ---------------------------------------------------------------------------------------------- the budget
def test_the_budget_from_the_table_enforces_the_limits_it_is_given() -> None:
    """Rule: ``Budget.from_table`` keeps each limit where it was given: cluster 3, 2 per broker, 1 per
    namespace."""
    b = ops.Budget.from_table([], cluster=3, per_broker=2, per_namespace=1)
    assert b.take(ops.Move(bundle=X1, src=A, dst=B)) is None
    assert b.take(ops.Move(bundle=X2, src=C, dst=D)) == "throttled_namespace"
    assert b.take(ops.Move(bundle=W1, src=A, dst=C)) is None  # A's second
    assert b.take(ops.Move(bundle=Z1, src=A, dst=D)) == "throttled_broker"  # A's third
    assert b.take(ops.Move(bundle=Z1, src=C, dst=D)) is None
    assert b.take(ops.Move(bundle=bundle("d"), src=D, dst=None)) == "throttled_cluster"


def test_a_bundle_in_flight_in_the_table_counts_against_its_source_destination_and_namespace() -> None:
    """Rule: a record in flight takes a slot of the cluster, of both brokers it names and of its bundle's
    namespace; a settled record takes none."""
    table = [(X1, make(State.RELEASING, src=A, dst=C, version=4, ts=T0, writer="x")), (X3, owned(B))]

    def take(move: ops.Move, **limits: int) -> str | None:
        kw: dict[str, int | None] = {"cluster": None, "per_broker": None, "per_namespace": None, **limits}
        return ops.Budget.from_table(table, **kw).take(move)

    assert take(ops.Move(bundle=W1, src=A, dst=D), per_broker=1) == "throttled_broker"
    assert take(ops.Move(bundle=W1, src=D, dst=C), per_broker=1) == "throttled_broker"
    assert take(ops.Move(bundle=W1, src=D, dst=B), per_broker=1) is None
    assert take(ops.Move(bundle=X2, src=D, dst=B), per_namespace=1) == "throttled_namespace"
    assert take(ops.Move(bundle=W1, src=D, dst=B), per_namespace=1) is None
    assert take(ops.Move(bundle=W1, src=D, dst=B), cluster=1) == "throttled_cluster"
    assert take(ops.Move(bundle=W1, src=D, dst=B), cluster=2) is None


def test_each_bundle_in_flight_counts_one_in_its_namespace() -> None:
    """Rule: the namespace limit is reached at equality: with a limit of 2, one bundle in flight there leaves
    room for one more, two leave none."""

    def releasing(src: str) -> Record:
        return make(State.RELEASING, src=src, dst=None, version=4, ts=T0, writer="x")

    one = ops.Budget.from_table([(X1, releasing(A))], cluster=None, per_broker=None, per_namespace=2)
    assert one.take(ops.Move(bundle=X3, src=C, dst=D)) is None
    assert one.take(ops.Move(bundle=bundle("a", 3), src=C, dst=D)) == "throttled_namespace"
    two = ops.Budget.from_table(
        [(X1, releasing(A)), (X2, releasing(B))], cluster=None, per_broker=None, per_namespace=2
    )
    assert two.take(ops.Move(bundle=X3, src=C, dst=D)) == "throttled_namespace"


def test_a_move_taken_counts_against_its_destination_too() -> None:
    """Rule: a move the budget lets start takes a slot of its source and of its destination."""
    b = ops.Budget(per_broker=1)
    assert b.take(ops.Move(bundle=X1, src=A, dst=B)) is None
    assert b.take(ops.Move(bundle=X2, src=C, dst=B)) == "throttled_broker"
    assert b.take(ops.Move(bundle=X2, src=A, dst=C)) == "throttled_broker"
    assert b.take(ops.Move(bundle=X2, src=C, dst=D)) is None
