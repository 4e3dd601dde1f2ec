"""Operations (balance/operations.py): what an operator's verbs do, what a paused or cancelled operation
still does, how a lost record is proposed again (same version), the outcome words, and that stored bytes
are decoded defensively."""

from __future__ import annotations

import pytest

from trimtab.balance import operations as ops
from trimtab.channel import intents
from trimtab.channel.records import Record, State, make

T0 = 1_800_000_000_000
A, B, C = "a:1", "b:1", "c:1"
B1 = "t/ns/0x00000000_0x40000000"
B2 = "t/ns/0x40000000_0x80000000"
B3 = "t/other/0x00000000_0xffffffff"


def owned(dst: str, version: int = 3) -> Record:
    return make(State.OWNED, dst=dst, version=version, ts=T0, writer="x")


def drain(*bundles: str, dst: str | None = B) -> ops.Operation:
    return ops.new(
        "op-1",
        ops.OpKind.DRAIN,
        [(b, A, dst) for b in bundles],
        reason="drain a",
        requested_by="me",
        now_ms=T0,
    )


def step(
    op: ops.Operation,
    table: dict[str, Record],
    now: int = T0 + 1000,
    budget: ops.Budget | None = None,
    republish_after_ms: int = 5000,
) -> ops.Advance:
    return ops.advance(
        [op],
        table.get,
        budget or ops.Budget(),
        writer="leader",
        now_ms=now,
        republish_after_ms=republish_after_ms,
    )


# ---------------------------------------------------------------------------------------------- verbs
def test_the_verbs_follow_the_states_and_refuse_a_finished_operation() -> None:
    op = drain(B1)
    paused = ops.pause(op, why="operator", now_ms=T0 + 1)
    assert paused.state is ops.OpState.PAUSED and paused.state_reason == "operator"
    assert ops.pause(paused, why="again", now_ms=T0 + 2) is paused  # idempotent
    assert ops.resume(paused, now_ms=T0 + 3).state is ops.OpState.PENDING  # nothing had started
    assert ops.resume(op, now_ms=T0 + 3) is op
    cancelled = ops.cancel(paused, why="not needed", now_ms=T0 + 4)
    assert cancelled.state is ops.OpState.CANCELLED
    for verb in (
        lambda o: ops.pause(o, why="x", now_ms=T0),
        lambda o: ops.resume(o, now_ms=T0),
        lambda o: ops.cancel(o, why="x", now_ms=T0),
    ):
        with pytest.raises(ops.OperationRefused, match="it has finished"):
            verb(cancelled)
    assert ops.fail(cancelled, why="x", now_ms=T0) is cancelled


def test_a_new_operation_refuses_a_bundle_twice() -> None:
    with pytest.raises(ValueError, match="twice"):
        ops.new("op-2", ops.OpKind.SHED, [(B1, A, B), (B1, A, C)], reason="r", requested_by="me", now_ms=T0)


# ---------------------------------------------------------------------------------------------- advancing
def test_a_move_starts_once_and_ends_when_the_bundle_reaches_its_destination() -> None:
    table = {B1: owned(A)}
    adv = step(drain(B1), table)
    [(bundle, rec)] = adv.publish
    assert (bundle, rec.state, rec.src, rec.dst, rec.version) == (B1, State.RELEASING, A, B, 4)
    op = adv.ops[0]
    assert op.state is ops.OpState.RUNNING and op.moves[0].started_version == 4
    table[B1] = rec
    adv = step(op, table, now=T0 + 2000)
    assert adv.publish == [] and adv.ops[0] is op  # in flight: nothing to do, nothing changed
    table[B1] = intents.take(intents.hand_over(rec, A, now_ms=T0), B, now_ms=T0)
    adv = step(op, table, now=T0 + 3000)
    assert adv.ops[0].state is ops.OpState.DONE and adv.ops[0].moves[0].outcome is ops.Outcome.MOVED
    assert adv.outcomes == {("drain", "moved"): 1}


def test_a_record_that_never_arrived_is_proposed_again_with_the_same_version() -> None:
    table = {B1: owned(A)}
    first = step(drain(B1), table)
    op = first.ops[0]
    assert step(op, table, now=T0 + 2000).publish == []  # not yet: it may still be on its way
    again = step(op, table, now=T0 + 1000 + 5000)
    assert [(b, r.version, r.state) for b, r in again.publish] == [(B1, 4, State.RELEASING)]
    assert again.ops[0].moves[0].started_version == 4


@pytest.mark.parametrize(
    ("cur", "outcome"),
    [
        (None, ops.Outcome.GONE),
        (make(State.DELETED, src=A, version=4, ts=T0, writer=A), ops.Outcome.GONE),
        (owned(B), ops.Outcome.ALREADY_THERE),
        (owned(C), ops.Outcome.MOVED_ON),
        (make(State.ASSIGNING, dst=C, version=4, ts=T0, writer="x"), ops.Outcome.MOVED_ON),
    ],
)
def test_a_move_whose_bundle_is_not_where_the_plan_found_it_is_not_forced(
    cur: Record | None, outcome: ops.Outcome
) -> None:
    table = {} if cur is None else {B1: cur}
    adv = step(drain(B1), table)
    assert adv.publish == []
    assert adv.ops[0].moves[0].outcome is outcome and adv.ops[0].state is ops.OpState.DONE


def test_a_move_made_and_then_undone_by_another_writer_is_superseded() -> None:
    table = {B1: owned(A)}
    op = step(drain(B1), table).ops[0]
    table[B1] = owned(C, version=7)  # ours landed, then the bundle went on to C
    assert step(op, table).ops[0].moves[0].outcome is ops.Outcome.SUPERSEDED


def test_paused_starts_nothing_but_settles_what_it_started_and_cancelled_ends_the_rest() -> None:
    table = {B1: owned(A), B2: owned(A)}
    op = step(drain(B1, B2), table, budget=ops.Budget(cluster=1)).ops[0]
    assert [m.started_version for m in op.moves] == [4, None]
    paused = ops.pause(op, why="operator", now_ms=T0 + 1500)
    table[B1] = owned(B, version=6)
    adv = step(paused, table, now=T0 + 2000)
    assert adv.publish == [] and adv.ops[0].state is ops.OpState.PAUSED
    assert [m.outcome for m in adv.ops[0].moves] == [ops.Outcome.MOVED, None]
    assert ops.resume(adv.ops[0], now_ms=T0 + 2500).state is ops.OpState.RUNNING
    cancelled = ops.cancel(adv.ops[0], why="operator", now_ms=T0 + 3000)
    adv = step(cancelled, table, now=T0 + 3500)
    assert adv.publish == [] and adv.ops[0].state is ops.OpState.CANCELLED
    assert [m.outcome for m in adv.ops[0].moves] == [ops.Outcome.MOVED, ops.Outcome.CANCELLED]
    assert adv.ops[0].progress() == (2, 2)


def test_every_move_that_does_not_start_says_which_limit_stopped_it() -> None:
    table = {B1: owned(A), B2: owned(A), B3: owned(A)}
    op = drain(B1, B2, B3, dst=None)
    adv = step(op, table, budget=ops.Budget(per_namespace=1))
    assert {b for b, _ in adv.publish} == {B1, B3}  # one per namespace
    assert adv.waiting == {"throttled_namespace": 1}
    adv = step(op, table, budget=ops.Budget(per_broker=2))
    assert len(adv.publish) == 2 and adv.waiting == {"throttled_broker": 1}
    adv = step(op, table, budget=ops.Budget(cluster=0))
    assert adv.publish == [] and adv.waiting == {"throttled_cluster": 3}
    busy = ops.Budget.from_table(
        [(B2, make(State.RELEASING, src=A, dst=C, version=9, ts=T0, writer="x"))],
        cluster=2,
        per_broker=None,
        per_namespace=None,
    )
    assert len(step(op, table, budget=busy).publish) == 1  # one slot left, whoever started the other


def test_summary_is_the_shape_of_the_cli_json() -> None:
    assert drain(B1, B2).summary() == {
        "id": "op-1",
        "kind": "drain",
        "state": "pending",
        "reason": "drain a",
        "progress": {"done": 0, "total": 2},
    }


# ---------------------------------------------------------------------------------------------- stored bytes
@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b"", "not an operation"),
        (b"{}", "not an operation"),
        (
            b'{"id":"Op!","kind":"drain","reason":"","requested_by":"","created_ms":1,"updated_ms":1}',
            "not an",
        ),
        (
            b'{"schema":2,"id":"x","kind":"drain","reason":"","requested_by":"","created_ms":1,"updated_ms":1}',
            "schema 2",
        ),
        (b'{"id":"x","kind":"nap","reason":"","requested_by":"","created_ms":1,"updated_ms":1}', "not an"),
        (b" " * (ops.MAX_BYTES + 1), "bytes, more than"),
    ],
)
def test_hostile_stored_values_are_refused_with_a_reason(value: bytes, why: str) -> None:
    got = ops.decode(value)
    assert isinstance(got, ops.Undecodable) and why in got.reason


def test_a_stored_operation_naming_a_bundle_twice_is_refused() -> None:
    op = drain(B1)
    twice = op.__class__(**{**{f: getattr(op, f) for f in op.__struct_fields__}, "moves": op.moves * 2})
    got = ops.decode(ops.encode(twice))
    assert isinstance(got, ops.Undecodable) and "two moves" in got.reason


def test_a_bundle_still_on_its_way_to_the_broker_being_drained_waits_for_it() -> None:
    arriving = make(State.ASSIGNING, dst=A, version=3, ts=T0, writer="lookup")
    table = {B1: arriving}
    adv = step(drain(B1), table)
    assert adv.publish == [] and adv.waiting == {"arriving": 1} and adv.ops[0].moves[0].open
    table[B1] = intents.take(arriving, A, now_ms=T0)
    adv = step(adv.ops[0], table)
    assert [(b, r.state, r.version) for b, r in adv.publish] == [(B1, State.RELEASING, 5)]


def test_ten_thousand_moves_of_one_namespace_do_not_starve_ten_of_another() -> None:
    """Helix #3021: one resource's 10 000 changes starved another's. Here namespaces take turns for the
    budget: the first pass with room for 100 moves starts all 10 of the small namespace."""

    def bundles(ns: str, n: int) -> list[str]:
        step_ = 0x100000000 // n
        return [f"t/{ns}/0x{i * step_:08x}_0x{min((i + 1) * step_, 0xFFFFFFFF):08x}" for i in range(n)]

    big, small = bundles("big", 10_000), bundles("small", 10)
    table = {b: owned(A) for b in big + small}
    ops_ = [
        ops.new("big", ops.OpKind.SHED, [(b, A, B) for b in big], reason="r", requested_by="x", now_ms=T0),
        ops.new(
            "small", ops.OpKind.DRAIN, [(b, A, C) for b in small], reason="r", requested_by="x", now_ms=T0
        ),
    ]
    adv = ops.advance(
        ops_, table.get, ops.Budget(cluster=100), writer="leader", now_ms=T0, republish_after_ms=1000
    )
    started = {b for b, _ in adv.publish}
    assert set(small) <= started and len(started) == 100
    assert adv.waiting == {"throttled_cluster": 10_000 - 90}


def test_a_settled_record_tombstoned_before_the_next_pass_ends_the_move_and_never_restarts_it() -> None:
    """Review finding: after a tombstone versions start again from 1, so a move whose record vanished must
    end, not wait (it would hold its budget forever) nor be proposed again (a second move)."""
    table = {B1: owned(A)}
    op = step(drain(B1, dst=None), table).ops[0]  # an unload, started at v4
    del table[B1]  # Free, then tombstoned by the monitor, before the operation looked again
    adv = step(op, table, now=T0 + 60_000)
    assert adv.publish == [] and adv.ops[0].moves[0].outcome is ops.Outcome.MOVED
    table[B1] = owned(A, version=2)  # a lookup gave it back to A: not ours to move again
    assert step(adv.ops[0], table, now=T0 + 120_000).publish == []


def test_a_move_to_where_the_bundle_is_is_refused_when_built_and_when_read() -> None:
    with pytest.raises(ValueError, match="where it is"):
        ops.new("op-3", ops.OpKind.SHED, [(B1, A, A)], reason="r", requested_by="x", now_ms=T0)
    good = drain(B1)
    bad = ops.encode(good).replace(f'"dst":"{B}"'.encode(), f'"dst":"{A}"'.encode())
    got = ops.decode(bad)
    assert isinstance(got, ops.Undecodable) and "starts from" in got.reason


def test_a_destination_no_longer_usable_is_an_unload_instead() -> None:
    table = {B1: owned(A)}
    adv = ops.advance(
        [drain(B1)],
        table.get,
        ops.Budget(),
        writer="l",
        now_ms=T0,
        republish_after_ms=1,
        usable=lambda b: b != B,
    )
    [(_, rec)] = adv.publish
    assert (rec.state, rec.src, rec.dst) == (State.RELEASING, A, None)


def test_a_drain_grows_with_the_bundles_that_reach_its_broker_later() -> None:
    op = drain(B1)
    more = ops.extend(op, [(B2, A, C)], now_ms=T0 + 5)
    assert [m.bundle for m in more.moves] == [B1, B2] and more.updated_ms == T0 + 5
    with pytest.raises(ValueError, match="twice"):
        ops.extend(op, [(B1, A, C)], now_ms=T0)
    done = ops.cancel(op, why="x", now_ms=T0)
    assert ops.extend(done, [(B2, A, C)], now_ms=T0) is done
