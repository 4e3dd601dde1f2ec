"""The rules of an operation's life as a record (balance/operations.py; docs/operations.md; docs/testing.md).

Operations the leader carries out (drains, transfers, shedding cycles): how they are created (``new``,
``started``), grown (``extend``), and what each operator verb does to them (``pause``, ``resume``,
``cancel``) and the leader's ``fail`` -- the state, the reason and the time each one records, and the
refusal an operator reads (``cannot <verb> operation <id> (<state>): <why>``), word for word. Operations
the leader only follows (splits, merges, healing): how ``observe`` finds them in the channel (once each,
the record's writer, the reason word for word), how ``followed``/``add_followed`` record them and how
``follow``/``end_followed`` end them. And the stored bytes: ``decode``'s limits at equality and its
reasons, and ``by_state``'s counts. Each test's docstring names the rule it pins.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from trimtab.balance import operations as ops
from trimtab.channel.records import Record, State, make

T0 = 1_800_000_000_000
A, B, C = "a:1", "b:1", "c:1"
B1 = "t/ns/0x00000000_0x40000000"
B2 = "t/ns/0x40000000_0x80000000"
P = "t/ns/0x00000000_0x80000000"
Q = "t/ns/0x80000000_0xffffffff"
M = "t/ns/0x00000000_0xffffffff"
MAX = ops.MAX_MOVES
ONE_TRANSITION = (
    "a split or merge is one channel transition published by the owner's agent: it completes or aborts by "
    "itself within channel.in_flight_timeout_s"
)
HEAL_CANCEL = (
    "cancelled healing would leave the failed broker's bundles unowned; pause it to hold it, or bring the "
    "broker back (its healing then ends by itself)"
)


def owned(dst: str, version: int = 3) -> Record:
    return make(State.OWNED, dst=dst, version=version, ts=T0, writer="x")


def merging(version: int = 4, *, writer: str = "agent-a") -> Record:
    return make(
        State.MERGING,
        src=A,
        version=version,
        ts=T0 + version,
        writer=writer,
        children={"0x00000000_0xffffffff": A},
    )


def splitting(version: int = 4, *, src: str = A) -> Record:
    return make(
        State.SPLITTING,
        src=src,
        version=version,
        ts=T0 + version,
        writer="agent-a",
        children={"0x00000000_0x40000000": src, "0x40000000_0x60000000": src, "0x60000000_0x80000000": src},
    )


def drain(*bundles: str, op_id: str = "op-1") -> ops.Operation:
    return ops.new(
        op_id, ops.OpKind.DRAIN, [(b, A, B) for b in bundles], reason="drain a", requested_by="me", now_ms=T0
    )


def bundles(n: int) -> list[str]:
    return [f"b{i}" for i in range(n)]


def step(op: ops.Operation, table: dict[str, Record], budget: ops.Budget) -> ops.Operation:
    return ops.advance(
        [op], table.get, budget, writer="leader", now_ms=T0 + 100, republish_after_ms=1000
    ).ops[0]


def heal(*moves: tuple[str, str, str | None]) -> ops.Operation:
    return ops.followed(
        "h-1",
        ops.OpKind.HEAL,
        [(b, src, dst, None, None) for b, src, dst in moves],
        reason="a failed",
        requested_by="healing",
        now_ms=T0,
    )


def never(bundle: str, version: int, ts: int) -> bool:
    return False


# ---------------------------------------------------------------------------------------------- the verbs
def test_pause_records_why_and_when() -> None:
    """Rule: pausing an unfinished operation sets it paused with the reason given and the time of the
    pause; its moves and its other fields stay as they were."""
    op = drain(B1)
    paused = ops.pause(op, why="operator", now_ms=T0 + 7)
    assert (paused.state, paused.state_reason, paused.updated_ms) == (ops.OpState.PAUSED, "operator", T0 + 7)
    assert (paused.created_ms, paused.moves, paused.reason) == (T0, op.moves, "drain a")


def test_resume_clears_the_reason_and_records_when() -> None:
    """Rule: resuming a paused operation clears the reason it was paused for and records the time of the
    resume."""
    paused = ops.pause(drain(B1), why="operator", now_ms=T0 + 1)
    resumed = ops.resume(paused, now_ms=T0 + 9)
    assert (resumed.state, resumed.state_reason, resumed.updated_ms) == (ops.OpState.PENDING, None, T0 + 9)


@pytest.mark.parametrize(
    ("table", "cluster_limit", "first"),
    [
        ({B1: owned(A), B2: owned(A)}, 1, (4, None)),  # started, in flight
        ({B1: owned(B), B2: owned(A)}, 0, (None, ops.Outcome.ALREADY_THERE)),
    ],
    ids=["a-move-started-not-ended", "a-move-ended-never-started"],
)
def test_resume_is_running_once_any_move_started_or_ended(
    table: dict[str, Record], cluster_limit: int, first: tuple[int | None, ops.Outcome | None]
) -> None:
    """Rule: a resumed operation is running as soon as any one of its moves started *or* ended (either
    alone is enough); pending only when none did. (The budget is made per run: a pass takes from it.)"""
    op = step(drain(B1, B2), table, ops.Budget(cluster=cluster_limit))
    assert [(m.started_version, m.outcome) for m in op.moves] == [first, (None, None)]
    resumed = ops.resume(ops.pause(op, why="operator", now_ms=T0 + 200), now_ms=T0 + 300)
    assert resumed.state is ops.OpState.RUNNING


def test_cancel_records_why_and_when() -> None:
    """Rule: cancelling an unfinished operation (paused too) sets it cancelled with the reason given and
    the time of the cancel."""
    for op in (drain(B1), ops.pause(drain(B1), why="hold", now_ms=T0 + 1)):
        cancelled = ops.cancel(op, why="not needed", now_ms=T0 + 5)
        assert (cancelled.state, cancelled.state_reason, cancelled.updated_ms) == (
            ops.OpState.CANCELLED,
            "not needed",
            T0 + 5,
        )


def test_fail_records_why_and_when_and_leaves_a_finished_operation_alone() -> None:
    """Rule: failing an unfinished operation sets it failed with the reason given and the time; a finished
    one is returned as it is."""
    for op in (drain(B1), ops.pause(drain(B1), why="hold", now_ms=T0 + 1)):
        failed = ops.fail(op, why="the broker is gone", now_ms=T0 + 6)
        assert (failed.state, failed.state_reason, failed.updated_ms) == (
            ops.OpState.FAILED,
            "the broker is gone",
            T0 + 6,
        )
        assert (failed.id, failed.moves) == (op.id, op.moves)
        assert ops.fail(failed, why="again", now_ms=T0 + 7) is failed


def refusal(call: Callable[[], object]) -> ops.OperationRefused:
    with pytest.raises(ops.OperationRefused) as caught:
        call()
    return caught.value


def verb_call(verb: str, op: ops.Operation) -> Callable[[], object]:
    if verb == "pause":
        return lambda: ops.pause(op, why="operator", now_ms=T0 + 1)
    if verb == "resume":
        return lambda: ops.resume(op, now_ms=T0 + 1)
    return lambda: ops.cancel(op, why="operator", now_ms=T0 + 1)


@pytest.mark.parametrize("verb", ["pause", "resume", "cancel"])
@pytest.mark.parametrize("end", ["cancel", "fail"])
def test_a_finished_operation_refuses_every_verb_word_for_word(verb: str, end: str) -> None:
    """Rule: pause, resume and cancel of a finished operation are refused with ``cannot <verb> operation
    <id> (<state>): it has finished``; the refusal carries the operation's id and the verb."""
    op = drain(B1, op_id="op-7")
    finished = ops.cancel(op, why="x", now_ms=T0) if end == "cancel" else ops.fail(op, why="x", now_ms=T0)
    got = refusal(verb_call(verb, finished))
    state = "cancelled" if end == "cancel" else "failed"
    assert str(got) == f"cannot {verb} operation op-7 ({state}): it has finished"
    assert (got.op_id, got.verb) == ("op-7", verb)


@pytest.mark.parametrize("kind", [ops.OpKind.SPLIT, ops.OpKind.MERGE])
@pytest.mark.parametrize("verb", ["pause", "resume", "cancel"])
def test_a_split_or_merge_refuses_every_verb_word_for_word(kind: ops.OpKind, verb: str) -> None:
    """Rule: a split or merge refuses pause, resume and cancel with ``cannot <verb> operation <id>
    (running): a split or merge is one channel transition ...`` (the 409 an operator reads), naming the
    verb asked."""
    op = ops.followed("x-1", kind, [(P, A, None, 4, T0)], reason="r", requested_by="a", now_ms=T0)
    got = refusal(verb_call(verb, op))
    assert str(got) == f"cannot {verb} operation x-1 (running): {ONE_TRANSITION}"
    assert (got.op_id, got.verb) == ("x-1", verb)


def test_cancelling_healing_is_refused_word_for_word() -> None:
    """Rule: healing refuses cancel -- its bundles would stay unowned -- with the reason an operator reads,
    word for word, telling them to pause it or bring the broker back."""
    got = refusal(verb_call("cancel", heal((P, A, B))))
    assert str(got) == f"cannot cancel operation h-1 (running): {HEAL_CANCEL}"
    assert (got.op_id, got.verb) == ("h-1", "cancel")


# ---------------------------------------------------------------------------------------------- creating
def test_started_moves_carry_the_record_version_the_time_and_the_writer() -> None:
    """Rule: ``started`` starts each move at the version of the Releasing record it builds -- written by the
    writer given at the time given -- and records that time as the move's start; the operation is running,
    created and updated then."""
    op, publish = ops.started(
        "op-1",
        ops.OpKind.TRANSFER,
        [(B1, owned(A, 3), A, B), (B2, owned(A, 8), A, None)],
        reason="operator transfer",
        requested_by="admin",
        writer="leader-1",
        now_ms=T0 + 11,
    )
    assert publish == [
        (B1, make(State.RELEASING, src=A, dst=B, version=4, ts=T0 + 11, writer="leader-1")),
        (B2, make(State.RELEASING, src=A, dst=None, version=9, ts=T0 + 11, writer="leader-1")),
    ]
    assert op.moves == (
        ops.Move(bundle=B1, src=A, dst=B, started_version=4, started_ms=T0 + 11),
        ops.Move(bundle=B2, src=A, dst=None, started_version=9, started_ms=T0 + 11),
    )
    assert (op.state, op.created_ms, op.updated_ms, op.reason, op.requested_by) == (
        ops.OpState.RUNNING,
        T0 + 11,
        T0 + 11,
        "operator transfer",
        "admin",
    )


def test_started_leaves_out_a_move_whose_bundle_moved_and_keeps_the_next() -> None:
    """Rule: a move whose bundle is no longer owned by its source is left out of ``started`` -- and the
    moves after it are still started (skip it, do not stop)."""
    op, publish = ops.started(
        "op-1",
        ops.OpKind.SHED,
        [(B1, owned(C), A, B), (B2, owned(A), A, B)],
        reason="r",
        requested_by="shedder",
        writer="leader",
        now_ms=T0,
    )
    assert [m.bundle for m in op.moves] == [B2] and [b for b, _ in publish] == [B2]


@pytest.mark.parametrize(
    "make_twice",
    [
        lambda: ops.new(
            "op-1", ops.OpKind.SHED, [(B1, A, B), (B1, A, C)], reason="r", requested_by="x", now_ms=T0
        ),
        lambda: ops.started(
            "op-1",
            ops.OpKind.SHED,
            [(B1, owned(A), A, B), (B1, owned(A), A, C)],
            reason="r",
            requested_by="x",
            writer="l",
            now_ms=T0,
        ),
        lambda: ops.extend(drain(B2), [(B1, A, B), (B1, A, C)], now_ms=T0),
        lambda: ops.extend(drain(B1), [(B1, A, C)], now_ms=T0),
        lambda: ops.followed(
            "op-1",
            ops.OpKind.HEAL,
            [(B1, A, B, None, None), (B1, A, C, None, None)],
            reason="r",
            requested_by="h",
            now_ms=T0,
        ),
        lambda: ops.add_followed(
            ops.followed(
                "op-1", ops.OpKind.MERGE, [(P, A, None, 4, T0)], reason="r", requested_by="a", now_ms=T0
            ),
            [(B1, A, None, 4, T0), (B1, A, None, 4, T0)],
            now_ms=T0,
        ),
    ],
    ids=["new", "started", "extend", "extend-existing", "followed", "add_followed"],
)
def test_a_bundle_twice_is_refused_naming_it_and_the_operation(make_twice: Callable[[], object]) -> None:
    """Rule: a bundle given twice to one operation -- when it is created, started, extended or followed --
    is refused with ``bundle <bundle> appears twice in operation <id>``."""
    with pytest.raises(ValueError) as caught:
        make_twice()
    assert str(caught.value) == f"bundle {B1} appears twice in operation op-1"


def test_a_move_to_where_the_bundle_is_is_refused_naming_the_operation() -> None:
    """Rule: a move to the broker it starts from is refused with ``operation <id> would move <bundle> to
    <broker>, where it is``."""
    with pytest.raises(ValueError) as caught:
        ops.new("op-3", ops.OpKind.SHED, [(B1, A, A)], reason="r", requested_by="x", now_ms=T0)
    assert str(caught.value) == f"operation op-3 would move {B1} to {A}, where it is"


def test_an_operation_holds_at_most_max_moves() -> None:
    """Rule: an operation of exactly MAX_MOVES moves is made; one more is refused with ``operation <id>
    would have <n> moves, more than <MAX_MOVES>``."""
    assert (
        len(
            ops.new(
                "op-1",
                ops.OpKind.DRAIN,
                [(b, A, B) for b in bundles(MAX)],
                reason="r",
                requested_by="x",
                now_ms=T0,
            ).moves
        )
        == MAX
    )
    with pytest.raises(ValueError) as caught:
        ops.new(
            "op-1",
            ops.OpKind.DRAIN,
            [(b, A, B) for b in bundles(MAX + 1)],
            reason="r",
            requested_by="x",
            now_ms=T0,
        )
    assert str(caught.value) == f"operation op-1 would have {MAX + 1} moves, more than {MAX}"


def test_extend_counts_the_moves_it_had_and_the_new_ones_against_max_moves() -> None:
    """Rule: an operation is extended up to exactly MAX_MOVES moves in all (the moves it had plus the new
    ones); beyond, refused with ``operation <id> would have more than <MAX_MOVES> moves``."""
    names = bundles(MAX + 1)
    op = drain(*names[:2])
    assert len(ops.extend(op, [(b, A, B) for b in names[2:MAX]], now_ms=T0 + 1).moves) == MAX
    with pytest.raises(ValueError) as caught:
        ops.extend(op, [(b, A, B) for b in names[2:]], now_ms=T0 + 1)
    assert str(caught.value) == f"operation op-1 would have more than {MAX} moves"


# ---------------------------------------------------------------------------------------------- followed
def test_a_followed_operation_grows_by_the_moves_it_does_not_hold_yet_and_records_when() -> None:
    """Rule: ``add_followed`` adds the moves whose bundle the operation does not hold yet, keeping each
    one's start version and time, and records the time it grew; nothing else changes."""
    op = ops.followed(
        "m-1", ops.OpKind.MERGE, [(P, A, None, 4, T0)], reason="merge", requested_by="a", now_ms=T0, target=M
    )
    both = ops.add_followed(op, [(P, A, None, 4, T0), (Q, A, None, 5, T0 + 3)], now_ms=T0 + 8)
    assert both.moves == (
        ops.Move(bundle=P, src=A, started_version=4, started_ms=T0),
        ops.Move(bundle=Q, src=A, started_version=5, started_ms=T0 + 3),
    )
    assert (both.updated_ms, both.created_ms, both.reason, both.requested_by, both.target) == (
        T0 + 8,
        T0,
        "merge",
        "a",
        M,
    )


def test_end_followed_cancels_with_why_and_when() -> None:
    """Rule: ``end_followed`` of an unfinished followed operation sets it cancelled with the reason and the
    time given; a finished one is returned as it is."""
    ended = ops.end_followed(heal((P, A, B)), why="the broker came back", now_ms=T0 + 4)
    assert (ended.state, ended.state_reason, ended.updated_ms) == (
        ops.OpState.CANCELLED,
        "the broker came back",
        T0 + 4,
    )
    assert ops.end_followed(ended, why="again", now_ms=T0 + 5) is ended


def test_follow_leaves_an_operation_the_leader_carries_out_alone() -> None:
    """Rule: ``follow`` only follows the followed kinds: a drain -- started or not -- comes back as it is,
    whatever the table shows."""
    op = step(drain(B1, B2), {B1: owned(A), B2: owned(A)}, ops.Budget(cluster=1))
    assert ops.follow(op, {B1: owned(B, 9), B2: owned(C, 9)}.get, now_ms=T0 + 1000) is op


def test_a_merge_with_an_aborted_parent_fails_counting_the_aborted_ones() -> None:
    """Rule: a followed operation whose moves all ended, some aborted, fails with ``<aborted> of <moves>
    bundles aborted: the bundle is back as it was``, at the time of the follow."""
    op = ops.followed(
        "m-1",
        ops.OpKind.MERGE,
        [(P, A, None, 4, T0), (Q, A, None, 4, T0)],
        reason="r",
        requested_by="a",
        now_ms=T0,
    )
    table = {P: owned(A, 5), Q: make(State.DELETED, src=A, version=5, ts=T0, writer=A)}
    failed = ops.follow(op, table.get, now_ms=T0 + 9)
    assert [m.outcome for m in failed.moves] == [ops.Outcome.ABORTED, ops.Outcome.MERGED]
    assert (failed.state, failed.state_reason, failed.updated_ms) == (
        ops.OpState.FAILED,
        "1 of 2 bundles aborted: the bundle is back as it was",
        T0 + 9,
    )


def test_a_heal_move_settled_elsewhere_than_planned_moved_on() -> None:
    """Rule: a heal move with a planned destination ends ``moved`` only when its bundle settled *at* that
    destination; settled at another live broker it ends ``moved_on``."""
    op = heal((P, A, B), (Q, A, B))
    done = ops.follow(op, {P: owned(C, 5), Q: owned(B, 5)}.get, now_ms=T0 + 2)
    assert [m.outcome for m in done.moves] == [ops.Outcome.MOVED_ON, ops.Outcome.MOVED]
    assert (done.state, done.updated_ms) == (ops.OpState.DONE, T0 + 2)


# ---------------------------------------------------------------------------------------------- observing
def test_a_split_and_a_merge_are_observed_word_for_word() -> None:
    """Rule: a Splitting record is observed as a split of its bundle by the record's writer, its one move
    from the source at the record's version and time, reason ``split of <bundle> into <n> bundles by its
    owner <src>``; Merging parents as one merge of the merged bundle, requested by the first parent's
    writer, reason ``merge of <p> and <q> into <merged> by their owner <src>``."""
    got = ops.observe([(Q, merging(6, writer="leader")), (P, merging(4)), (B1, splitting(7))], never)
    assert got == [
        ops.Observed(
            ops.OpKind.SPLIT,
            B1,
            ((B1, A, None, 7, T0 + 7),),
            "agent-a",
            f"split of {B1} into 3 bundles by its owner {A}",
        ),
        ops.Observed(
            ops.OpKind.MERGE,
            M,
            ((P, A, None, 4, T0 + 4), (Q, A, None, 6, T0 + 6)),
            "agent-a",
            f"merge of {P} and {Q} into {M} by their owner {A}",
        ),
    ]


def test_a_bundle_seen_at_two_versions_is_observed_once_per_version_oldest_first() -> None:
    """Rule: each (bundle, version, time) is observed once however often it is seen, and records of one
    bundle are taken oldest version first."""
    got = ops.observe([(P, splitting(9)), (P, splitting(4)), (P, splitting(4)), (P, splitting(9))], never)
    assert [o.moves for o in got] == [((P, A, None, 4, T0 + 4),), ((P, A, None, 9, T0 + 9),)]


def test_a_source_longer_than_a_move_holds_is_not_observed() -> None:
    """Rule: a record whose source is longer than a stored move holds (512 characters) is not observed;
    exactly 512 is."""
    fits, too_long = "s" * 512, "s" * 513
    got = ops.observe([(P, splitting(src=fits)), (Q, splitting(src=too_long))], never)
    assert [(o.target, o.moves[0][1]) for o in got] == [(P, fits)]


def test_only_splitting_and_merging_records_with_one_merged_range_are_observed() -> None:
    """Rule: only Splitting records and Merging records naming exactly one merged range are observed: a
    Releasing record, a Merging record with two ranges or none is not."""
    two = make(State.MERGING, src=A, version=4, ts=T0, writer="w", children={"0x0_0x1": A, "0x1_0x2": A})
    none = make(State.MERGING, src=A, version=4, ts=T0, writer="w")
    releasing = make(State.RELEASING, src=A, dst=B, version=4, ts=T0, writer="w")
    assert ops.observe([(P, two), (Q, none), (B1, releasing)], never) == []


def test_a_merge_of_a_bundle_whose_name_does_not_parse_is_skipped_and_the_rest_observed() -> None:
    """Rule: a Merging record of a bundle name that does not parse is skipped -- and the records after it
    are still observed (skip it, do not stop)."""
    got = ops.observe([("a-bad-name", merging(4)), (P, merging(4))], never)
    assert [(o.kind, o.target) for o in got] == [(ops.OpKind.MERGE, M)]


def test_by_state_counts_operations_per_kind_and_state() -> None:
    """Rule: ``by_state`` counts the operations of each (kind, state), by their words."""
    split = ops.followed(
        "s-1", ops.OpKind.SPLIT, [(P, A, None, 4, T0)], reason="r", requested_by="a", now_ms=T0
    )
    got = ops.by_state([drain(B1), drain(B2, op_id="op-2"), split])
    assert dict(got) == {("drain", "pending"): 2, ("split", "running"): 1}


# ---------------------------------------------------------------------------------------------- stored bytes
def stored(n: int) -> ops.Operation:
    return ops.Operation(
        id="op-1",
        kind=ops.OpKind.DRAIN,
        reason="r",
        requested_by="x",
        created_ms=T0,
        updated_ms=T0,
        moves=tuple(ops.Move(bundle=b, src=A, dst=B) for b in bundles(n)),
    )


def test_a_stored_value_of_exactly_max_bytes_is_read() -> None:
    """Rule: a stored value of exactly MAX_BYTES is decoded; one byte more is refused with ``<n> bytes, more
    than <MAX_BYTES>``."""
    value = ops.encode(drain(B1))
    padded = value + b" " * (ops.MAX_BYTES - len(value))
    assert ops.decode(padded) == drain(B1)
    assert ops.decode(padded + b" ") == ops.Undecodable(
        f"{ops.MAX_BYTES + 1} bytes, more than {ops.MAX_BYTES}"
    )


def test_a_stored_operation_of_exactly_max_moves_is_read_one_more_is_refused() -> None:
    """Rule: a stored operation of exactly MAX_MOVES moves is decoded; one more is refused with ``<n>
    moves, more than <MAX_MOVES>``."""
    assert ops.decode(ops.encode(stored(MAX))) == stored(MAX)
    assert ops.decode(ops.encode(stored(MAX + 1))) == ops.Undecodable(f"{MAX + 1} moves, more than {MAX}")


def test_a_stored_operation_that_breaks_a_move_rule_is_refused_word_for_word() -> None:
    """Rule: a stored operation naming a bundle in two moves is refused with ``a bundle appears in two
    moves``; one with a move to the broker it starts from with ``a move to the broker it starts from``."""
    twice = msgspec.structs.replace(stored(1), moves=stored(1).moves * 2)
    assert ops.decode(ops.encode(twice)) == ops.Undecodable("a bundle appears in two moves")
    here = msgspec.structs.replace(stored(1), moves=(ops.Move(bundle=B1, src=A, dst=A),))
    assert ops.decode(ops.encode(here)) == ops.Undecodable("a move to the broker it starts from")
