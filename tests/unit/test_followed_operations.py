"""Followed operations (balance/operations.py, issue 32): splits, merges and healing plans are carried out
by someone else -- the owner's agent, the healing job -- and the leader records each as an operation and
follows it to its end from the channel. These tests pin how each move ends, when the operation is done or
failed, which verbs are refused (and why), and that :func:`advance` never publishes for them."""

from __future__ import annotations

import pytest

from trimtab.balance import operations as ops
from trimtab.channel import intents
from trimtab.channel.records import Record, State, make

T0 = 1_800_000_000_000
A, B, C = "a:1", "b:1", "c:1"
P = "t/ns/0x00000000_0x80000000"
Q = "t/ns/0x80000000_0xffffffff"
M = "t/ns/0x00000000_0xffffffff"


def owned(dst: str, version: int = 3) -> Record:
    return make(State.OWNED, dst=dst, version=version, ts=T0, writer="x")


def splitting(version: int = 4) -> Record:
    return intents.split(
        owned(A, version - 1),
        A,
        ["0x00000000_0x40000000", "0x40000000_0x80000000"],
        writer="agent-a",
        now_ms=T0,
    )


def merging(version: int = 4) -> Record:
    return intents.merge(owned(A, version - 1), A, "0x00000000_0xffffffff", writer="leader", now_ms=T0)


def test_a_split_is_observed_once_and_ends_split_when_its_bundle_is_gone() -> None:
    (seen,) = ops.observe([(P, splitting())], lambda b, v, ts: False)
    assert seen.kind is ops.OpKind.SPLIT and seen.target == P and seen.requested_by == "agent-a"
    assert "into 2 bundles" in seen.reason
    assert ops.observe([(P, splitting())], lambda b, v, ts: (b, v) == (P, 4)) == []  # already followed
    op = ops.followed("s-1", seen.kind, seen.moves, reason=seen.reason, requested_by="a", now_ms=T0)
    assert op.state is ops.OpState.RUNNING and op.progress() == (0, 1)
    assert ops.follow(op, {P: splitting()}.get, now_ms=T0 + 1) is op  # still the record that started it
    deleted = make(State.DELETED, src=A, version=5, ts=T0, writer=A)
    for table in ({P: deleted}, {}, {P: owned(B, version=1)}):  # deleted, tombstoned, the key made again
        done = ops.follow(op, table.get, now_ms=T0 + 2)
        assert done.state is ops.OpState.DONE and done.moves[0].outcome is ops.Outcome.SPLIT, table


def test_a_split_that_did_not_complete_fails_with_the_reason() -> None:
    (seen,) = ops.observe([(P, splitting())], lambda b, v, ts: False)
    op = ops.followed("s-1", seen.kind, seen.moves, reason=seen.reason, requested_by="a", now_ms=T0)
    back = owned(A, version=5)  # aborted (or forced onward by the monitor): the bundle is back, not deleted
    failed = ops.follow(op, {P: back}.get, now_ms=T0 + 2)
    assert failed.state is ops.OpState.FAILED and failed.moves[0].outcome is ops.Outcome.ABORTED
    assert failed.state_reason is not None and "aborted" in failed.state_reason


def test_a_merge_is_one_operation_for_both_parents_even_when_seen_one_at_a_time() -> None:
    (first,) = ops.observe([(P, merging())], lambda b, v, ts: False)
    assert first.kind is ops.OpKind.MERGE and first.target == M
    op = ops.followed(
        "m-1", first.kind, first.moves, reason=first.reason, requested_by="l", now_ms=T0, target=M
    )
    (second,) = ops.observe([(P, merging()), (Q, merging())], lambda b, v, ts: b == P)
    assert second.target == M
    both = ops.add_followed(op, second.moves, now_ms=T0 + 1)
    assert [m.bundle for m in both.moves] == [P, Q]
    assert ops.add_followed(both, second.moves, now_ms=T0 + 2) is both  # a parent is added once
    half = ops.follow(
        both, {P: make(State.DELETED, src=A, version=5, ts=T0, writer=A), Q: merging()}.get, now_ms=T0 + 3
    )
    assert half.state is ops.OpState.RUNNING and half.progress() == (1, 2)
    done = ops.follow(half, {}.get, now_ms=T0 + 4)
    assert done.state is ops.OpState.DONE and {m.outcome for m in done.moves} == {ops.Outcome.MERGED}


def test_both_parents_seen_together_make_one_merge() -> None:
    (seen,) = ops.observe([(Q, merging()), (P, merging())], lambda b, v, ts: False)
    assert [m[0] for m in seen.moves] == [P, Q] and P in seen.reason and Q in seen.reason


def test_a_heal_move_ends_when_its_bundle_no_longer_needs_the_failed_broker() -> None:
    op = ops.followed(
        "h-1",
        ops.OpKind.HEAL,
        [(P, A, B, None, None), (Q, A, None, None, None)],
        reason="a failed",
        requested_by="healing",
        now_ms=T0,
    )
    assert ops.follow(op, {P: owned(A), Q: owned(A)}.get, now_ms=T0 + 1) is op
    on_its_way = make(State.ASSIGNING, dst=B, src=A, version=4, ts=T0, writer="leader", force=True)
    assert ops.follow(op, {P: on_its_way, Q: owned(A)}.get, now_ms=T0 + 1) is op  # in flight: not yet
    one = ops.follow(op, {P: owned(B, 5), Q: owned(A)}.get, now_ms=T0 + 2)
    assert one.moves[0].outcome is ops.Outcome.MOVED and one.state is ops.OpState.RUNNING
    done = ops.follow(one, {P: owned(B, 5), Q: owned(C, 5)}.get, now_ms=T0 + 3)
    assert done.moves[1].outcome is ops.Outcome.MOVED_ON  # placed elsewhere than planned (no destination)
    assert done.state is ops.OpState.DONE


def test_a_heal_ended_because_the_broker_came_back_cancels_its_open_moves() -> None:
    op = ops.followed(
        "h-1", ops.OpKind.HEAL, [(P, A, B, None, None)], reason="a failed", requested_by="healing", now_ms=T0
    )
    ended = ops.follow(
        ops.end_followed(op, why="the broker came back", now_ms=T0 + 1), {P: owned(A)}.get, now_ms=T0 + 1
    )
    assert ended.state is ops.OpState.CANCELLED and ended.state_reason == "the broker came back"
    assert ended.moves[0].outcome is ops.Outcome.CANCELLED


@pytest.mark.parametrize("kind", [ops.OpKind.SPLIT, ops.OpKind.MERGE])
@pytest.mark.parametrize("verb", ["pause", "resume", "cancel"])
def test_a_split_or_merge_refuses_every_verb_with_the_reason(kind: ops.OpKind, verb: str) -> None:
    op = ops.followed("x-1", kind, [(P, A, None, 4, T0)], reason="r", requested_by="a", now_ms=T0)
    with pytest.raises(ops.OperationRefused, match="one channel transition"):
        if verb == "pause":
            ops.pause(op, why="operator", now_ms=T0)
        elif verb == "resume":
            ops.resume(op, now_ms=T0)
        else:
            ops.cancel(op, why="operator", now_ms=T0)


def test_healing_can_be_paused_and_resumed_but_not_cancelled() -> None:
    op = ops.followed(
        "h-1", ops.OpKind.HEAL, [(P, A, B, None, None)], reason="a failed", requested_by="healing", now_ms=T0
    )
    paused = ops.pause(op, why="operator", now_ms=T0 + 1)
    assert paused.state is ops.OpState.PAUSED
    assert ops.resume(paused, now_ms=T0 + 2).state is ops.OpState.RUNNING  # never "pending" again
    with pytest.raises(ops.OperationRefused, match="unowned"):
        ops.cancel(op, why="operator", now_ms=T0)


def test_advance_never_publishes_for_a_followed_operation() -> None:
    heal = ops.followed(
        "h-1", ops.OpKind.HEAL, [(P, A, B, None, None)], reason="r", requested_by="healing", now_ms=T0
    )
    split = ops.followed(
        "s-1", ops.OpKind.SPLIT, [(Q, A, None, 4, T0)], reason="r", requested_by="a", now_ms=T0
    )
    table = {P: owned(A), Q: owned(A, 2)}  # Q's record "never arrived": a release op would republish it
    adv = ops.advance(
        [heal, split], table.get, ops.Budget(), writer="leader", now_ms=T0 + 60_000, republish_after_ms=1
    )
    assert adv.publish == [] and adv.ops == [heal, split]


def test_only_followed_kinds_are_followed() -> None:
    with pytest.raises(ValueError, match="carried out by the leader"):
        ops.followed(
            "d-1", ops.OpKind.DRAIN, [(P, A, B, None, None)], reason="r", requested_by="a", now_ms=T0
        )


def test_what_comes_from_channel_records_is_cut_to_what_decodes_again() -> None:
    """A writer's name or bundle names longer than an operation's fields hold would make the stored
    operation unreadable to the next leader: cut (reason, who asked) or not followed (a broker name)."""
    long_writer = intents.split(owned(A, 3), A, ["0x00000000_0x40000000"], writer="w" * 5000, now_ms=T0)
    (seen,) = ops.observe([(P, long_writer)], lambda b, v, ts: False)
    op = ops.followed(
        "s-1", seen.kind, seen.moves, reason="r" * 5000, requested_by=seen.requested_by, now_ms=T0
    )
    assert ops.decode(ops.encode(op)) == op
    far = "b" * 600
    assert (
        ops.observe(
            [(P, intents.split(owned(far, 3), far, ["0x0_0x1"], writer="w", now_ms=T0))],
            lambda b, v, ts: False,
        )
        == []
    )
