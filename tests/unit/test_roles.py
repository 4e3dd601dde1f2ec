"""What an agent does about one bundle: every row of the table in balance/roles.py's docstring.

Also the property that matters most: every record a plan publishes is accepted by the channel
(``channel.resolve.resolve``) as the next state of the record it reacts to.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from trimtab.balance.roles import (
    Acquire,
    Close,
    Fence,
    Forget,
    Plan,
    Publish,
    PublishChildren,
    PublishMerged,
    SplitOnBroker,
    UpdateLayout,
    needs_attention,
    plan,
)
from trimtab.channel.bundles import parse_bundle
from trimtab.channel.records import Record, State, make
from trimtab.channel.resolve import ACCEPT, resolve, shape_ok

ME, B, C = "me:1", "b:2", "c:3"
BUNDLE = "t/ns/0x40000000_0x80000000"
RNG = parse_bundle(BUNDLE)[1]
KIDS: dict[str, str | None] = {"0x40000000_0x60000000": ME, "0x60000000_0x80000000": ME}
NOW = 1_700_000_000_000


def r(state: State, v: int = 4, *, force: bool = False, **kw: object) -> Record:
    return make(state, version=v, ts=1, writer="x", force=force, **kw)  # type: ignore[arg-type]


def nxt(state: State, v: int = 5, **kw: object) -> Record:
    """What this agent publishes: version v, written by me, now."""
    return make(state, version=v, ts=NOW, writer=ME, **kw)  # type: ignore[arg-type]


def p(
    cur: Record | None,
    *,
    serving: bool = False,
    fenced: bool = False,
    stale: bool = False,
    late: bool = False,
) -> Plan | None:
    return plan(ME, BUNDLE, cur, serving=serving, fenced=fenced, now_ms=NOW, stale=stale, late=late)


def accepted(cur: Record | None, new: Record | None) -> bool:
    return resolve(RNG, cur, new) is ACCEPT


# ------------------------------------------------------------------------------------------ the table


@pytest.mark.parametrize("serving", [False, True])
def test_assigning_to_me_acquires_and_confirms(serving: bool) -> None:
    for src in (None, B):
        cur = r(State.ASSIGNING, dst=ME, src=src)
        got = p(cur, serving=serving)
        assert got == Plan("assign", (Acquire(), Publish(nxt(State.OWNED, dst=ME, src=src))))
        assert accepted(cur, got.steps[-1].record)  # type: ignore[union-attr]


def test_assigning_forced_to_me_is_confirmed() -> None:
    cur = r(State.ASSIGNING, 9, dst=ME, src=B, force=True)
    got = p(cur)
    assert got is not None and got.kind == "assign"
    rec = got.steps[-1].record  # type: ignore[union-attr]
    assert rec == nxt(State.OWNED, 10, dst=ME, src=B)
    assert not rec.force and accepted(cur, rec)


@pytest.mark.parametrize(("serving", "fenced"), [(True, False), (False, True), (False, False)])
def test_releasing_transfer_fences_then_hands_over(serving: bool, fenced: bool) -> None:
    cur = r(State.RELEASING, src=ME, dst=B)
    got = p(cur, serving=serving, fenced=fenced)
    assert got == Plan("transfer_out", (Fence(), Publish(nxt(State.ASSIGNING, dst=B, src=ME))))
    assert accepted(cur, got.steps[-1].record)  # type: ignore[union-attr]


def test_releasing_unload_fences_closes_and_frees() -> None:
    cur = r(State.RELEASING, src=ME)
    got = p(cur, serving=True)
    assert got == Plan("unload", (Fence(), Close(None), Publish(nxt(State.FREE, src=ME))))
    assert accepted(cur, got.steps[-1].record)  # type: ignore[union-attr]


def test_transfer_second_phase_closes_with_a_redirect() -> None:
    cur = r(State.OWNED, dst=B, src=ME)
    assert p(cur, fenced=True) == Plan("close_after_transfer", (Close(B),))
    # after the close we are neither serving nor fenced: nothing more to do
    assert p(cur) is None


def test_no_early_close_while_our_transfer_is_in_flight() -> None:
    assert p(r(State.ASSIGNING, dst=B, src=ME), fenced=True) is None


def test_split_steps() -> None:
    cur = r(State.SPLITTING, src=ME, children=KIDS)
    got = p(cur, serving=True)
    kids = ("t/ns/0x40000000_0x60000000", "t/ns/0x60000000_0x80000000")
    assert got == Plan(
        "split",
        (
            SplitOnBroker(kids),
            PublishChildren(kids, ME),
            UpdateLayout(kids),
            Publish(nxt(State.DELETED, src=ME)),
        ),
    )
    assert accepted(cur, got.steps[-1].record)  # type: ignore[union-attr]
    for child in kids:  # each child: Owned{dst=me, v=1} from Init
        assert (
            resolve(parse_bundle(child)[1], None, make(State.OWNED, dst=ME, version=1, ts=NOW, writer=ME))
            is ACCEPT
        )


def test_split_children_are_sorted_full_names() -> None:
    kids = {"0x60000000_0x70000000": None, "0x40000000_0x60000000": None, "0x70000000_0x80000000": None}
    got = p(r(State.SPLITTING, src=ME, children=kids), serving=True)
    assert got is not None
    (split, *_rest) = got.steps
    assert split == SplitOnBroker(
        ("t/ns/0x40000000_0x60000000", "t/ns/0x60000000_0x70000000", "t/ns/0x70000000_0x80000000")
    )


def test_deleted_parent_is_forgotten_but_not_tombstoned() -> None:
    # The parent stays Deleted until the leader's tombstone delay (see balance/roles.py): a tombstoned
    # parent would look unowned to a lookup with an outdated layout.
    cur = r(State.DELETED, src=ME)
    assert p(cur, serving=True) == Plan("forget_split_parent", (Forget(),))
    assert p(cur, fenced=True) == Plan("forget_split_parent", (Forget(),))
    assert p(cur) is None


def test_owned_by_me() -> None:
    cur = r(State.OWNED, dst=ME)
    assert p(cur, serving=True) is None
    assert p(cur) == Plan("acquire_owned", (Acquire(),))
    assert p(cur, fenced=True) == Plan("acquire_owned", (Acquire(),))  # a transfer forced back to me
    # a split child claimed for me (version 1, from another src): acquire it
    assert p(r(State.OWNED, 1, dst=ME)) == Plan("acquire_owned", (Acquire(),))


@pytest.mark.parametrize(
    ("cur", "redirect"),
    [
        (r(State.OWNED, dst=B, src=ME, force=True), B),  # forced override while I served
        (r(State.OWNED, dst=B), B),
        (r(State.ASSIGNING, dst=C, src=ME, force=True), C),
        (r(State.ASSIGNING, dst=C, force=True), C),
        (r(State.RELEASING, src=B, dst=C), C),
        (r(State.SPLITTING, src=B, children=KIDS), None),
        (r(State.FREE, src=ME), None),
        (r(State.FREE, force=True), None),
        (r(State.DELETED, src=B), None),
    ],
)
def test_anything_else_while_serving_closes(cur: Record, redirect: str | None) -> None:
    got = p(cur, serving=True)
    assert got is not None and got.steps == (Close(redirect),)
    assert got.kind == "forced_close"


def test_tombstone_while_serving_closes() -> None:
    assert p(None, serving=True) == Plan("forced_close", (Close(None),))
    assert p(None, fenced=True) == Plan("forced_close", (Close(None),))
    assert p(None) is None


def test_free_while_fenced_closes() -> None:
    # our transfer was forced to Free (nobody could take it): let the clients go
    assert p(r(State.FREE, src=ME, force=True), fenced=True) == Plan("forced_close", (Close(None),))


@pytest.mark.parametrize(
    "cur",
    [
        r(State.OWNED, dst=B),
        r(State.OWNED, dst=B, src=C),
        r(State.ASSIGNING, dst=B),
        r(State.RELEASING, src=B, dst=C),
        r(State.RELEASING, src=B),
        r(State.SPLITTING, src=B, children=KIDS),
        r(State.DELETED, src=B),
        r(State.FREE, src=B),
        r(State.FREE),
    ],
)
def test_records_not_naming_me(cur: Record) -> None:
    assert p(cur) is None
    assert not needs_attention(ME, cur)


@pytest.mark.parametrize(
    "cur",
    [
        r(State.OWNED, dst=B, src=ME),  # transfer done and closed
        r(State.ASSIGNING, dst=B, src=ME),  # transfer in flight, already closed
        r(State.FREE, src=ME),  # unloaded
    ],
)
def test_history_naming_me_needs_nothing_when_idle(cur: Record) -> None:
    assert needs_attention(ME, cur)
    assert p(cur) is None


def test_needs_attention() -> None:
    assert needs_attention(ME, r(State.OWNED, dst=ME))
    assert needs_attention(ME, r(State.RELEASING, src=ME))
    assert not needs_attention(ME, None)


# ------------------------------------------------------------------------------------------- property

brokers = st.sampled_from([None, ME, B, C])


@st.composite
def current(draw: Any) -> Record | None:
    if draw(st.integers(0, 9)) == 0:
        return None
    state = draw(st.sampled_from(list(State)))
    children = None
    if state is State.SPLITTING:
        children = {k: draw(brokers) for k in KIDS}
    if state is State.MERGING:  # with the left or the right neighbour
        children = {draw(st.sampled_from(["0x00000000_0x80000000", "0x40000000_0xc0000000"])): draw(brokers)}
    rec = make(
        state,
        version=draw(st.integers(1, 20)),
        ts=draw(st.integers(0, NOW)),
        writer=draw(st.sampled_from([ME, B, "leader"])),
        dst=draw(brokers),
        src=draw(brokers),
        force=draw(st.booleans()),
        children=children,
    )
    assume(shape_ok(RNG, rec))
    # every writer of Splitting or Merging (the owner, the leader's override) leaves dst empty
    assume(state not in (State.SPLITTING, State.MERGING) or rec.dst is None)
    return rec


@st.composite
def others(draw: Any) -> dict[str, Record | None]:
    """What a merge's plan may find in its neighbours' and the merged bundles' keys: anything."""
    names = [
        "t/ns/0x00000000_0x40000000",
        "t/ns/0x80000000_0xc0000000",
        "t/ns/0x00000000_0x80000000",
        "t/ns/0x40000000_0xc0000000",
    ]
    return {n: draw(current()) for n in names}


@settings(max_examples=400, deadline=None)
@given(
    current(),
    st.sampled_from([(False, False), (True, False), (False, True)]),
    st.booleans(),
    st.booleans(),
    others(),
)
def test_every_published_record_is_accepted(
    cur: Record | None, flags: tuple[bool, bool], stale: bool, late: bool, table: dict[str, Record | None]
) -> None:
    serving, fenced = flags
    got = plan(
        ME, BUNDLE, cur, serving=serving, fenced=fenced, now_ms=NOW, stale=stale, late=late, lookup=table.get
    )
    if got is None:
        return
    assert got.steps
    for step in got.steps:
        if isinstance(step, Publish):
            assert accepted(cur, step.record), f"{cur} -> {step.record}: {resolve(RNG, cur, step.record)}"
            if step.record is not None:
                assert step.record.writer == ME and step.record.ts == NOW and not step.record.force
        elif isinstance(step, PublishChildren):
            assert step.owner == ME
            for child in step.children:
                ns, rng = parse_bundle(child)
                assert ns == "t/ns"
                assert resolve(rng, None, make(State.OWNED, dst=ME, version=1, ts=NOW, writer=ME)) is ACCEPT
        elif isinstance(step, PublishMerged):
            assert step.owner == ME
            ns, rng = parse_bundle(step.merged)
            assert ns == "t/ns" and rng.lower <= RNG.lower and RNG.upper <= rng.upper
            assert resolve(rng, None, make(State.OWNED, dst=ME, version=1, ts=NOW, writer=ME)) is ACCEPT
    # only records naming me, or bundles I hold, ever need work
    assert cur is None or needs_attention(ME, cur) or serving or fenced
    # at most one publish, and it comes last
    pubs = [i for i, s in enumerate(got.steps) if isinstance(s, Publish)]
    assert len(pubs) <= 1 and (not pubs or pubs[0] == len(got.steps) - 1)


@settings(max_examples=200, deadline=None)
@given(current(), st.sampled_from([(False, False), (True, False), (False, True)]))
def test_plan_is_idempotent_on_the_same_record(cur: Record | None, flags: tuple[bool, bool]) -> None:
    serving, fenced = flags
    assert p(cur, serving=serving, fenced=fenced) == p(cur, serving=serving, fenced=fenced)


# ------------------------------------------------------------------------------------------ stale records


def test_stale_assigning_is_confirmed_before_anything_is_acquired() -> None:
    cur = r(State.ASSIGNING, dst=ME, src=B)
    assert p(cur, stale=True) == Plan("assign_stale", (Publish(nxt(State.OWNED, dst=ME, src=B)),))


def test_a_late_assignment_is_confirmed_through_the_channel_before_anything_is_acquired() -> None:
    """An Assigning too old for any lease (a producer held it through a Kafka outage): Owned first -- the
    version check orders it against the monitor's override -- then acquired as an owned bundle. Before, the
    agent retried an acquire no lease could cover until the monitor moved the bundle elsewhere."""
    cur = r(State.ASSIGNING, dst=ME, src=B)
    owned = nxt(State.OWNED, dst=ME, src=B)
    assert p(cur, late=True) == Plan("assign_late", (Publish(owned),))
    assert p(cur, late=True, stale=True) == Plan("assign_stale", (Publish(owned),))
    assert p(owned) == Plan("acquire_owned", (Acquire(),))
    # Only an assignment to me is concerned: late changes nothing else.
    for other in (r(State.ASSIGNING, dst=B), r(State.RELEASING, src=ME, dst=B), r(State.OWNED, dst=ME)):
        assert p(other, late=True) == p(other)


def test_stale_owned_is_given_up_through_the_channel() -> None:
    cur = r(State.OWNED, dst=ME)
    want = Plan("relinquish", (Publish(nxt(State.RELEASING, dst=None, src=ME)),))
    assert p(cur, stale=True) == want
    assert p(cur, stale=True, fenced=True) == want


@settings(max_examples=400, deadline=None)
@given(current(), st.sampled_from([(False, False), (True, False), (False, True)]))
def test_a_stale_record_never_makes_the_broker_acquire(cur: Record | None, flags: tuple[bool, bool]) -> None:
    """Whatever names this broker from before its session is settled through the channel (whose version
    check orders it against any override of the leader) before the broker serves anything for it."""
    serving, fenced = flags
    got = p(cur, serving=serving, fenced=fenced, stale=True)
    if got is not None and cur is not None and cur.dst == ME and cur.state in (State.OWNED, State.ASSIGNING):
        assert not any(isinstance(step, Acquire) for step in got.steps)
