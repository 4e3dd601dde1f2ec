"""First valid transition wins (docs/design.md 3.1 and 3.3): the transition table and every broker check."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from trimtab.channel.bundles import BundleRange
from trimtab.channel.records import Record, State, make
from trimtab.channel.resolve import TRANSITIONS, Verdict, resolve, shape_ok

A, B, C = "a:1", "b:2", "c:3"
RNG = BundleRange(0, 0x80000000)
CHILDREN = {"0x00000000_0x40000000": A, "0x40000000_0x80000000": A}
MERGED = {"0x00000000_0xc0000000": A}  # RNG and its right-hand neighbour

ACCEPT = Verdict.ACCEPT
STALE = Verdict.STALE_VERSION
GAP = Verdict.VERSION_GAP
INVALID = Verdict.INVALID_TRANSITION
MISMATCH = Verdict.BROKER_MISMATCH
BAD = Verdict.BAD_RECORD

# docs/design.md 3.1, copied by hand: from -> to; None is Init (no record, or a tombstone as the target).
DESIGN = {
    None: {State.ASSIGNING, State.OWNED},
    State.FREE: {State.ASSIGNING, None},
    State.OWNED: {State.SPLITTING, State.RELEASING, State.MERGING},
    State.ASSIGNING: {State.OWNED},
    State.RELEASING: {State.ASSIGNING, State.FREE},
    State.SPLITTING: {State.DELETED},
    State.MERGING: {State.DELETED, State.OWNED},
    State.DELETED: {None},
}


def r(state: State, version: int, **kw: Any) -> Record:
    return make(state, version=version, ts=0, writer=kw.pop("writer", "w"), **kw)


def forced(new: Record, version: int | None = None) -> Record:
    """``new`` forced by the leader (at ``version`` if given): what skips the broker checks."""
    v = new.version if version is None else version
    return r(new.state, v, writer="leader", dst=new.dst, src=new.src, force=True, children=new.children)


# One representative current record per state (version 3), as the flows produce them.
CURRENT: dict[State | None, Record | None] = {
    None: None,
    State.FREE: r(State.FREE, 3, src=A),
    State.OWNED: r(State.OWNED, 3, dst=A),
    State.ASSIGNING: r(State.ASSIGNING, 3, src=A, dst=B),
    State.RELEASING: r(State.RELEASING, 3, src=A, dst=B),
    State.SPLITTING: r(State.SPLITTING, 3, src=A, children=CHILDREN),
    State.MERGING: r(State.MERGING, 3, src=A, children=MERGED),
    State.DELETED: r(State.DELETED, 3, src=A),
}


def continuation(cur: Record | None, to: State, *, force: bool = False) -> Record:
    """A well-formed proposal of state ``to`` that continues ``cur`` as the flows would write it."""
    v = 1 if cur is None else cur.version + 1
    frm = None if cur is None else cur.state
    if to is State.ASSIGNING:
        if frm is State.RELEASING:
            return r(to, v, src=cur.src, dst=cur.dst, force=force)  # type: ignore[union-attr]
        return r(to, v, dst=B, force=force)
    if to is State.OWNED:
        if frm is State.ASSIGNING:
            return r(to, v, src=cur.src, dst=cur.dst, force=force)  # type: ignore[union-attr]
        if frm is State.MERGING:
            return r(to, v, src=A, dst=A, force=force)  # an aborted merge
        return r(to, v, dst=A, force=force)
    if to is State.RELEASING:
        return r(to, v, src=A, force=force)
    if to is State.SPLITTING:
        return r(to, v, src=A, children=CHILDREN, force=force)
    if to is State.MERGING:
        return r(to, v, src=A, children=MERGED, force=force)
    if to is State.FREE:
        return r(to, v, src=A, force=force)
    return r(to, v, src=A, force=force)  # DELETED


def test_transition_table_is_the_design_table() -> None:
    assert TRANSITIONS == DESIGN


@pytest.mark.parametrize(
    "frm,to",
    list(itertools.product(CURRENT, list(State))),
    ids=lambda x: getattr(x, "value", str(x)),
)
def test_every_transition(frm: State | None, to: State) -> None:
    cur = CURRENT[frm]
    if frm is State.RELEASING and to is State.FREE:
        cur = r(State.RELEASING, 3, src=A)  # only an unload ends in Free
    new = continuation(cur, to)
    expected = ACCEPT if to in DESIGN[frm] else INVALID
    assert resolve(RNG, cur, new) is expected
    # force skips the transition check (the leader's override: any -> X).
    assert resolve(RNG, cur, continuation(cur, to, force=True)) is ACCEPT


@pytest.mark.parametrize("frm", list(CURRENT), ids=lambda x: getattr(x, "value", "init"))
def test_tombstones(frm: State | None) -> None:
    expected = ACCEPT if None in DESIGN[frm] else INVALID
    assert resolve(RNG, CURRENT[frm], None) is expected


def test_flows_end_to_end() -> None:
    def run(cur: Record | None, *steps: Record | None) -> Record | None:
        for s in steps:
            assert resolve(RNG, cur, s) is ACCEPT, s
            cur = s
        return cur

    # assign: Init -> Assigning{dst} -> Owned{dst}
    owned_a = run(None, r(State.ASSIGNING, 1, dst=A), r(State.OWNED, 2, dst=A))
    # transfer: Owned{A} -> Releasing{A->B} -> Assigning{A->B} -> Owned{B}
    run(
        owned_a,
        r(State.RELEASING, 3, src=A, dst=B),
        r(State.ASSIGNING, 4, src=A, dst=B),
        r(State.OWNED, 5, src=A, dst=B),
    )
    # unload: Owned{A} -> Releasing{src=A} -> Free -> Init -> assigned again from version 1
    run(
        owned_a,
        r(State.RELEASING, 3, src=A),
        r(State.FREE, 4, src=A),
        None,
        r(State.ASSIGNING, 1, dst=C),
    )
    # unload, then assigned again without a tombstone
    run(owned_a, r(State.RELEASING, 3, src=A), r(State.FREE, 4, src=A), r(State.ASSIGNING, 5, dst=C))
    # split: Owned{A} -> Splitting{src=A} -> Deleted -> Init; each child Init -> Owned{A} at version 1
    run(owned_a, r(State.SPLITTING, 3, src=A, children=CHILDREN), r(State.DELETED, 4, src=A), None)
    run(None, r(State.OWNED, 1, dst=A))
    # merge: Owned{A} -> Merging{src=A, {X}} -> Deleted -> Init; the merged X Init -> Owned{A} at version 1
    run(owned_a, r(State.MERGING, 3, src=A, children=MERGED), r(State.DELETED, 4, src=A), None)
    # an aborted merge: Merging{src=A} -> Owned{dst=A, src=A}, and on as any owned bundle
    run(
        owned_a,
        r(State.MERGING, 3, src=A, children=MERGED),
        r(State.OWNED, 4, src=A, dst=A),
        r(State.RELEASING, 5, src=A, dst=B),
    )


# ----------------------------------------------------------------------------------------- broker checks


@pytest.mark.parametrize(
    "cur,new,expected",
    [
        # Only the owner releases or splits.
        (r(State.OWNED, 3, dst=A), r(State.RELEASING, 4, src=B), MISMATCH),
        (r(State.OWNED, 3, dst=A), r(State.RELEASING, 4, src=B, dst=C), MISMATCH),
        (r(State.OWNED, 3, dst=A), r(State.SPLITTING, 4, src=B, children=CHILDREN), MISMATCH),
        (r(State.OWNED, 3, dst=A), r(State.SPLITTING, 4, src=A, dst=C, children=CHILDREN), MISMATCH),
        (r(State.OWNED, 3, dst=A), r(State.RELEASING, 4, src=A, dst=B), ACCEPT),
        # No transfer to self (refused by the shape of Releasing).
        (r(State.OWNED, 3, dst=A), r(State.RELEASING, 4, src=A, dst=A), BAD),
        # Assigning -> Owned keeps the same src and dst.
        (r(State.ASSIGNING, 3, src=A, dst=B), r(State.OWNED, 4, dst=B), MISMATCH),
        (r(State.ASSIGNING, 3, src=A, dst=B), r(State.OWNED, 4, src=A, dst=C), MISMATCH),
        (r(State.ASSIGNING, 3, dst=B), r(State.OWNED, 4, src=A, dst=B), MISMATCH),
        (r(State.ASSIGNING, 3, dst=B), r(State.OWNED, 4, dst=B), ACCEPT),
        # Releasing -> Assigning needs the transfer's dst.
        (r(State.RELEASING, 3, src=A), r(State.ASSIGNING, 4, src=A, dst=B), MISMATCH),
        (r(State.RELEASING, 3, src=A), r(State.ASSIGNING, 4, src=A), BAD),  # Assigning without dst
        (r(State.RELEASING, 3, src=A, dst=B), r(State.ASSIGNING, 4, src=A, dst=C), MISMATCH),
        (r(State.RELEASING, 3, src=A, dst=B), r(State.ASSIGNING, 4, src=C, dst=B), MISMATCH),
        (r(State.RELEASING, 3, src=A, dst=B), r(State.ASSIGNING, 4, dst=B), MISMATCH),
        # A transfer cannot end as an unload.
        (r(State.RELEASING, 3, src=A, dst=B), r(State.FREE, 4, src=A, dst=B), MISMATCH),
        (r(State.RELEASING, 3, src=A, dst=B), r(State.FREE, 4, src=A), MISMATCH),
        (r(State.RELEASING, 3, src=A), r(State.FREE, 4, src=B), MISMATCH),
        (r(State.RELEASING, 3, src=A), r(State.FREE, 4, src=A), ACCEPT),
        # Free -> Assigning and Init -> Assigning are fresh assignments: no src.
        (r(State.FREE, 3, src=A), r(State.ASSIGNING, 4, src=A, dst=B), MISMATCH),
        (r(State.FREE, 3, src=A), r(State.ASSIGNING, 4, dst=A), ACCEPT),
        (None, r(State.ASSIGNING, 1, src=A, dst=B), MISMATCH),
        # Splitting -> Deleted keeps src/dst.
        (r(State.SPLITTING, 3, src=A, children=CHILDREN), r(State.DELETED, 4, src=B), MISMATCH),
        (r(State.SPLITTING, 3, src=A, children=CHILDREN), r(State.DELETED, 4, src=A, dst=B), MISMATCH),
        # Only the owner merges, and a merge names no destination.
        (r(State.OWNED, 3, dst=A), r(State.MERGING, 4, src=B, children=MERGED), MISMATCH),
        (r(State.OWNED, 3, dst=A), r(State.MERGING, 4, src=A, dst=A, children=MERGED), MISMATCH),
        (r(State.OWNED, 3, dst=A), r(State.MERGING, 4, src=A, children=MERGED), ACCEPT),
        # Merging -> Deleted keeps src/dst.
        (r(State.MERGING, 3, src=A, children=MERGED), r(State.DELETED, 4, src=B), MISMATCH),
        (r(State.MERGING, 3, src=A, children=MERGED), r(State.DELETED, 4, src=A, dst=B), MISMATCH),
        (r(State.MERGING, 3, src=A, children=MERGED), r(State.DELETED, 4, src=A), ACCEPT),
        # An abort leaves the bundle with the merging broker, src kept.
        (r(State.MERGING, 3, src=A, children=MERGED), r(State.OWNED, 4, src=A, dst=A), ACCEPT),
        (r(State.MERGING, 3, src=A, children=MERGED), r(State.OWNED, 4, dst=A), MISMATCH),
        (r(State.MERGING, 3, src=A, children=MERGED), r(State.OWNED, 4, src=A, dst=B), MISMATCH),
        (r(State.MERGING, 3, src=A, children=MERGED), r(State.OWNED, 4, src=B, dst=B), MISMATCH),
        # Merging goes nowhere else without force.
        (r(State.MERGING, 3, src=A, children=MERGED), r(State.RELEASING, 4, src=A, dst=B), INVALID),
        (
            r(State.MERGING, 3, src=A, children=MERGED),
            r(State.SPLITTING, 4, src=A, children=CHILDREN),
            INVALID,
        ),
    ],
)
def test_broker_checks(cur: Record | None, new: Record, expected: Verdict) -> None:
    assert resolve(RNG, cur, new) is expected
    # A forced record skips the broker checks, never the shape rules.
    assert resolve(RNG, cur, forced(new)) is (BAD if expected is BAD else ACCEPT)


# ---------------------------------------------------------------------------------------------- versions


@pytest.mark.parametrize("version,expected", [(1, ACCEPT), (2, GAP), (0, GAP), (7, GAP)])
def test_versions_from_init(version: int, expected: Verdict) -> None:
    assert resolve(RNG, None, r(State.ASSIGNING, version, dst=A)) is expected


@pytest.mark.parametrize(
    "version,expected", [(4, ACCEPT), (3, STALE), (2, STALE), (1, STALE), (5, GAP), (9, GAP)]
)
@pytest.mark.parametrize("force", [False, True])
def test_versions_are_strict_even_when_forced(version: int, expected: Verdict, force: bool) -> None:
    cur = r(State.OWNED, 3, dst=A)
    assert resolve(RNG, cur, r(State.RELEASING, version, src=A, force=force)) is expected


def test_version_check_comes_first() -> None:
    cur = r(State.OWNED, 3, dst=A)
    # A stale proposal is stale even if it is also invalid, badly shaped or from the wrong broker.
    assert resolve(RNG, cur, r(State.OWNED, 3)) is STALE
    assert resolve(RNG, cur, r(State.DELETED, 2, src=B)) is STALE
    assert resolve(RNG, cur, r(State.OWNED, 5)) is GAP


def test_racing_writers_first_wins() -> None:
    cur = r(State.OWNED, 3, dst=A)
    unload = r(State.RELEASING, 4, src=A, writer="leader")
    transfer = r(State.RELEASING, 4, src=A, dst=B, writer="leader")
    assert resolve(RNG, cur, unload) is ACCEPT
    assert resolve(RNG, unload, transfer) is STALE
    assert resolve(RNG, cur, transfer) is ACCEPT
    assert resolve(RNG, transfer, unload) is STALE


# ---------------------------------------------------------------------------------------------- shapes


@pytest.mark.parametrize(
    "new",
    [
        r(State.OWNED, 1),  # owned without dst
        r(State.ASSIGNING, 1),
        r(State.RELEASING, 1),  # releasing without src
        r(State.RELEASING, 1, src=A, dst=A),
        r(State.DELETED, 1),  # deleted naming nobody
        r(State.SPLITTING, 1, src=A),  # no children
        r(State.SPLITTING, 1, children=CHILDREN),  # no src
        r(State.SPLITTING, 1, src=A, children={"0x00000000_0x80000000": A}),  # one child
        r(State.SPLITTING, 1, src=A, children={"0x00000000_0x40000000": A, "0x40000001_0x80000000": A}),
        r(State.SPLITTING, 1, src=A, children={"0x00000000_0x40000001": A, "0x40000000_0x80000000": A}),
        r(State.SPLITTING, 1, src=A, children={"0x00000000_0x40000000": A, "0x40000000_0x90000000": A}),
        r(State.SPLITTING, 1, src=A, children={"0x00000000_0x40000000": A, "junk": A}),
        r(State.SPLITTING, 1, src=A, children={"0x00000000_0x40000000": A, "0x40000000_0x80000000\n": A}),
        r(State.OWNED, 1, dst=A, children=CHILDREN),  # children only on splits and merges
        r(State.OWNED, 1, dst=A, children=MERGED),
        r(State.DELETED, 1, src=A, children=MERGED),
        r(State.FREE, 1, children={}),
        r(State.MERGING, 1, src=A),  # no merged range
        r(State.MERGING, 1, children=MERGED),  # no src
        r(State.MERGING, 1, src=A, children={}),
        r(State.MERGING, 1, src=A, children={"0x00000000_0xc0000000": A, "0x00000000_0xffffffff": A}),
        r(State.MERGING, 1, src=A, children={"0x00000000_0x80000000": A}),  # the bundle itself
        r(State.MERGING, 1, src=A, children={"0x00000000_0x40000000": A}),  # inside it
        r(State.MERGING, 1, src=A, children={"0x40000000_0xc0000000": A}),  # overlaps, no shared edge
        r(State.MERGING, 1, src=A, children={"0x80000000_0xc0000000": A}),  # the neighbour alone
        r(State.MERGING, 1, src=A, children={"junk": A}),
        r(State.MERGING, 1, src=A, children={"0x00000000_0xc0000000\n": A}),
        r(State.MERGING, 1, src=A, children=CHILDREN),  # a split's children are no merged range
    ],
    ids=repr,
)
def test_bad_shapes_are_refused_even_when_forced(new: Record) -> None:
    assert not shape_ok(RNG, new)
    assert resolve(RNG, None, new) is BAD
    assert resolve(RNG, None, forced(new, version=1)) is BAD


def test_split_children_are_checked_against_the_bundle_range() -> None:
    split = r(State.SPLITTING, 4, src=A, children=CHILDREN)
    cur = r(State.OWNED, 3, dst=A)
    assert resolve(RNG, cur, split) is ACCEPT
    assert resolve(BundleRange(0, 0x90000000), cur, split) is BAD
    three = {"0x00000000_0x10000000": A, "0x10000000_0x40000000": None, "0x40000000_0x80000000": B}
    assert resolve(RNG, cur, r(State.SPLITTING, 4, src=A, children=three)) is ACCEPT


def test_merged_range_is_checked_against_the_bundle_range() -> None:
    cur = r(State.OWNED, 3, dst=A)
    for merged in ("0x00000000_0xc0000000", "0x00000000_0xffffffff"):  # with the right neighbour
        assert resolve(RNG, cur, r(State.MERGING, 4, src=A, children={merged: A})) is ACCEPT
    right = BundleRange(0x80000000, 0xFFFFFFFF)  # with the left neighbour: shares the upper edge
    assert resolve(right, cur, r(State.MERGING, 4, src=A, children={"0x40000000_0xffffffff": A})) is ACCEPT
    assert resolve(right, cur, r(State.MERGING, 4, src=A, children={"0x00000000_0xffffffff": None})) is ACCEPT
    assert resolve(right, cur, r(State.MERGING, 4, src=A, children=MERGED)) is BAD
    # spanning both neighbours shares no edge with the bundle
    middle = BundleRange(0x40000000, 0x80000000)
    assert resolve(middle, cur, r(State.MERGING, 4, src=A, children={"0x00000000_0xc0000000": A})) is BAD


def test_forced_overrides() -> None:
    # Init -> Free and other targets only via force; forced records still need the right version.
    assert resolve(RNG, None, r(State.FREE, 1, src=A)) is INVALID
    assert resolve(RNG, None, r(State.FREE, 1, src=A, force=True)) is ACCEPT
    stuck = r(State.ASSIGNING, 7, dst=B)
    assert resolve(RNG, stuck, r(State.OWNED, 8, dst=C, force=True)) is ACCEPT
    assert resolve(RNG, stuck, r(State.OWNED, 7, dst=C, force=True)) is STALE
    assert resolve(RNG, stuck, r(State.FREE, 8, force=True)) is ACCEPT
    # forced Owned without dst is a bad record, not an accepted override
    assert resolve(RNG, stuck, r(State.OWNED, 8, force=True)) is BAD
