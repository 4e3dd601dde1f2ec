"""The intents' rules (channel/intents.py; docs/protocol.md; docs/testing.md), over every current record.

Each intent is tried on Init and on a record of every state with every combination of source and
destination among ``a``, ``b`` and none, at version 5. For each the test states when the intent applies
(the owner check and the state it needs) and the record it then builds, field by field: the next
version (1 from Init), the time and the writer given, which of the current record's brokers carry over.
Where it does not apply, the refusal names the intent, why, and the state and version found -- what a
writer that read an older table logs and what the HTTP refusals show.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from trimtab.channel import intents
from trimtab.channel.intents import IntentRefused
from trimtab.channel.records import Record, State, make

NOW = 777
ME = "a"
OTHER = "b"
WRITER = "w"  # a writer that is neither broker: where the record names the writer, it is the one given

CURRENT: list[Record | None] = [None] + [
    make(state, version=5, ts=1, writer="old", src=src, dst=dst)
    for state in State
    for src, dst in itertools.product((ME, OTHER, None), repeat=2)
]


def label(cur: Record | None) -> str:
    return "init" if cur is None else f"{cur.state.value}-src={cur.src}-dst={cur.dst}"


def rec(state: State, cur: Record | None, *, writer: str = ME, **kw: object) -> Record:
    """The record an intent should build from ``cur``: the next version, NOW, ``writer``."""
    version = 1 if cur is None else cur.version + 1
    return make(state, version=version, ts=NOW, writer=writer, **kw)  # type: ignore[arg-type]


# intent name -> (call, applies to cur, the record it builds, why it refuses)
Spec = tuple[
    Callable[[Record | None], Record],
    Callable[[Record | None], bool],
    Callable[[Record | None], Record],
    str,
]


def _src(cur: Record | None) -> str | None:
    return None if cur is None else cur.src


def _dst(cur: Record | None) -> str | None:
    return None if cur is None else cur.dst


def _is(cur: Record | None, state: State, **fields: object) -> bool:
    return cur is not None and cur.state is state and all(getattr(cur, k) == v for k, v in fields.items())


SPECS: dict[str, Spec] = {
    # Rule: only an unowned bundle (Init or Free) is assigned; Assigning{dst}, no source carried over.
    "assign": (
        lambda c: intents.assign(c, OTHER, writer=WRITER, now_ms=NOW),
        lambda c: c is None or c.state is State.FREE,
        lambda c: rec(State.ASSIGNING, c, writer=WRITER, dst=OTHER),
        "only an unowned bundle (init or free) is assigned",
    ),
    # Rule: only a bundle without a record is placed, straight to Owned{dst} at version 1.
    "place": (
        lambda c: intents.place(c, OTHER, writer=WRITER, now_ms=NOW),
        lambda c: c is None,
        lambda c: rec(State.OWNED, c, writer=WRITER, dst=OTHER),
        "only a bundle without a record is placed directly",
    ),
    # Rule: only the destination of an assignment takes it: Owned{me}, the source kept, written by me.
    "take": (
        lambda c: intents.take(c, ME, now_ms=NOW),
        lambda c: _is(c, State.ASSIGNING, dst=ME),
        lambda c: rec(State.OWNED, c, dst=ME, src=_src(c)),
        f"the bundle is not being assigned to {ME}",
    ),
    # Rule: only the owner's bundle is released (transfer to b): Releasing{src=a, dst=b}.
    "release": (
        lambda c: intents.release(c, src=ME, dst=OTHER, writer=WRITER, now_ms=NOW),
        lambda c: _is(c, State.OWNED, dst=ME),
        lambda c: rec(State.RELEASING, c, writer=WRITER, src=ME, dst=OTHER),
        f"the bundle is not owned by {ME}",
    ),
    # Rule: an unload (no destination) is a release too: Releasing{src=a, dst=None}.
    "unload": (
        lambda c: intents.release(c, src=ME, dst=None, writer=WRITER, now_ms=NOW),
        lambda c: _is(c, State.OWNED, dst=ME),
        lambda c: rec(State.RELEASING, c, writer=WRITER, src=ME, dst=None),
        f"the bundle is not owned by {ME}",
    ),
    # Rule: only the source of a transfer in progress hands it over: Assigning{dst, src=me}.
    "hand over": (
        lambda c: intents.hand_over(c, ME, now_ms=NOW),
        lambda c: _is(c, State.RELEASING, src=ME) and _dst(c) is not None,
        lambda c: rec(State.ASSIGNING, c, dst=_dst(c), src=ME),
        f"no transfer out of {ME} is in progress",
    ),
    # Rule: only the source of an unload in progress frees the bundle: Free{src=me}.
    "free": (
        lambda c: intents.free(c, ME, now_ms=NOW),
        lambda c: _is(c, State.RELEASING, src=ME, dst=None),
        lambda c: rec(State.FREE, c, src=ME),
        f"no unload of {ME}'s bundle is in progress",
    ),
    # Rule: only the owner's bundle is split; every child stays with the owner.
    "split": (
        lambda c: intents.split(c, ME, ["0x0_0x1", "0x1_0x2"], writer=WRITER, now_ms=NOW),
        lambda c: _is(c, State.OWNED, dst=ME),
        lambda c: rec(State.SPLITTING, c, writer=WRITER, src=ME, children={"0x0_0x1": ME, "0x1_0x2": ME}),
        f"the bundle is not owned by {ME}",
    ),
    # Rule: only the broker splitting the bundle retires it: Deleted, the split's dst carried on.
    "retire": (
        lambda c: intents.retire(c, ME, now_ms=NOW),
        lambda c: _is(c, State.SPLITTING, src=ME),
        lambda c: rec(State.DELETED, c, src=ME, dst=_dst(c)),
        f"{ME} is not splitting the bundle",
    ),
    # Rule: only the owner's bundle is merged, the merged range to the owner.
    "merge": (
        lambda c: intents.merge(c, ME, "0x0_0x2", writer=WRITER, now_ms=NOW),
        lambda c: _is(c, State.OWNED, dst=ME),
        lambda c: rec(State.MERGING, c, writer=WRITER, src=ME, children={"0x0_0x2": ME}),
        f"the bundle is not owned by {ME}",
    ),
    # Rule: only the broker merging the bundle retires it: Deleted, the merge's dst carried on.
    "retire merged": (
        lambda c: intents.retire_merged(c, ME, now_ms=NOW),
        lambda c: _is(c, State.MERGING, src=ME),
        lambda c: rec(State.DELETED, c, src=ME, dst=_dst(c)),
        f"{ME} is not merging the bundle",
    ),
    # Rule: only the broker merging the bundle aborts the merge: Owned{me}, src == dst == me.
    "abort merge": (
        lambda c: intents.abort_merge(c, ME, now_ms=NOW),
        lambda c: _is(c, State.MERGING, src=ME),
        lambda c: rec(State.OWNED, c, dst=ME, src=ME),
        f"{ME} is not merging the bundle",
    ),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_each_intent_applies_exactly_where_its_rule_says_and_builds_the_next_record(name: str) -> None:
    """Rule: an intent applies to exactly the records its rule names (state, owner or source, and the
    destination where it matters) and then builds the next record: version + 1 (1 from Init), the time
    given, the writer given (or the broker acting), the brokers it says -- nothing else."""
    call, applies, expected, _why = SPECS[name]
    applied = 0
    for cur in CURRENT:
        if applies(cur):
            applied += 1
            assert call(cur) == expected(cur), label(cur)
        else:
            with pytest.raises(IntentRefused):
                call(cur)
    assert applied >= 1  # the grid holds a record it applies to


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_refusal_names_the_intent_why_and_the_record_found(name: str) -> None:
    """Rule: a refused intent raises IntentRefused with the intent's name, the state and version found
    (None and 0 for Init), and the message ``cannot <intent>: <why> (found <state> v<version>)`` --
    ``(found init)`` without a record."""
    call, applies, _expected, why = SPECS[name]
    intent = "release" if name == "unload" else name
    refused = 0
    for cur in CURRENT:
        if applies(cur):
            continue
        refused += 1
        with pytest.raises(IntentRefused) as caught:
            call(cur)
        e = caught.value
        found = "init" if cur is None else f"{cur.state.value} v{cur.version}"
        assert str(e) == f"cannot {intent}: {why} (found {found})", label(cur)
        assert (e.intent, e.state, e.version) == (
            intent,
            None if cur is None else cur.state,
            0 if cur is None else cur.version,
        )
    assert refused >= 1


def test_release_to_the_owner_itself_is_refused() -> None:
    """Rule: a transfer to the broker that already owns the bundle is refused, naming it."""
    cur = make(State.OWNED, version=5, ts=1, writer="old", dst=ME)
    with pytest.raises(IntentRefused) as caught:
        intents.release(cur, src=ME, dst=ME, writer=WRITER, now_ms=NOW)
    e = caught.value
    assert str(e) == f"cannot release: the bundle is already owned by {ME} (found owned v5)"
    assert (e.intent, e.state, e.version) == ("release", State.OWNED, 5)


def test_owned_by_is_the_owner_check() -> None:
    """Rule: a broker owns a bundle only when its record is Owned with that broker as destination (not
    in flight, not as a source; Init owns nobody)."""
    for cur in CURRENT:
        assert intents.owned_by(cur, ME) is _is(cur, State.OWNED, dst=ME), label(cur)


@pytest.mark.parametrize("state", list(State))
def test_force_sets_any_state_with_the_force_flag(state: State) -> None:
    """Rule: the leader's override builds any state from any record: version + 1, force set, and the
    brokers, children, writer and time it is given."""
    cur = make(State.ASSIGNING, version=5, ts=1, writer="old", src=OTHER, dst=OTHER)
    kids: dict[str, str | None] = {"0x0_0x1": ME}
    got = intents.force(cur, state, dst=ME, src=None, writer=WRITER, now_ms=NOW, children=kids)
    assert got == make(state, version=6, ts=NOW, writer=WRITER, dst=ME, src=None, force=True, children=kids)
    got = intents.force(cur, state, dst=None, src=ME, writer=WRITER, now_ms=NOW)
    assert got == make(state, version=6, ts=NOW, writer=WRITER, dst=None, src=ME, force=True)
