"""Intents (channel/intents.py) propose only what every replica accepts, and refuse the rest.

For any current record and any intent with any arguments: either the intent raises IntentRefused, or the
record it builds is accepted by the first-valid-transition predicate (channel.resolve) from that record.
And each intent is refused exactly where its precondition fails -- the owner check is the one rule.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import BROKERS, bundle_ranges, records

from trimtab.channel import intents
from trimtab.channel.bundles import BundleRange
from trimtab.channel.intents import IntentRefused
from trimtab.channel.records import Record, State
from trimtab.channel.resolve import ACCEPT, merged_ok, resolve

brokers = st.sampled_from(BROKERS)
maybe_broker = st.sampled_from([None, *BROKERS])
NOW = 1_700_000_000_000


def merged_with_a_neighbour(rng: BundleRange) -> str | None:
    """The union of ``rng`` with its right-hand neighbour, or the left-hand one for the last bundle; None
    for the full range, which has no neighbour."""
    if rng.upper < 0xFFFFFFFF:
        return f"0x{rng.lower:08x}_0xffffffff"
    return f"0x00000000_0x{rng.upper:08x}" if rng.lower > 0 else None


def split_children(rng: BundleRange) -> list[str]:
    mid = (rng.lower + rng.upper) // 2
    return [f"0x{rng.lower:08x}_0x{mid:08x}", f"0x{mid:08x}_0x{rng.upper:08x}"]


@st.composite
def cases(draw: Any) -> tuple[BundleRange, Record | None]:
    rng = draw(bundle_ranges().filter(lambda r: r.upper - r.lower >= 2))
    cur = draw(st.one_of(st.none(), records(rng)))
    return rng, cur


def attempt(intent: str, rng: BundleRange, cur: Record | None, a: str, b: str | None) -> Record | None:
    """The intent's record, or None when it was refused."""
    try:
        if intent == "assign":
            return intents.assign(cur, a, writer=a, now_ms=NOW)
        if intent == "place":
            return intents.place(cur, a, writer=a, now_ms=NOW)
        if intent == "take":
            return intents.take(cur, a, now_ms=NOW)
        if intent == "release":
            return intents.release(cur, src=a, dst=b, writer="leader", now_ms=NOW)
        if intent == "hand_over":
            return intents.hand_over(cur, a, now_ms=NOW)
        if intent == "free":
            return intents.free(cur, a, now_ms=NOW)
        if intent == "split":
            return intents.split(cur, a, split_children(rng), writer=a, now_ms=NOW)
        if intent == "retire":
            return intents.retire(cur, a, now_ms=NOW)
        if intent == "merge":
            merged = merged_with_a_neighbour(rng)
            return None if merged is None else intents.merge(cur, a, merged, writer="leader", now_ms=NOW)
        if intent == "retire_merged":
            return intents.retire_merged(cur, a, now_ms=NOW)
        if intent == "abort_merge":
            return intents.abort_merge(cur, a, now_ms=NOW)
    except IntentRefused:
        return None
    raise AssertionError(intent)


INTENTS = [
    "assign",
    "place",
    "take",
    "release",
    "hand_over",
    "free",
    "split",
    "retire",
    "merge",
    "retire_merged",
    "abort_merge",
]


def accepted_current(cur: Record | None, cur_range: BundleRange) -> bool:
    """Whether ``cur`` could be the table's record at all (a replica only ever holds accepted records)."""
    if cur is not None and cur.state is State.MERGING:
        return cur.children is not None and merged_ok(cur_range, cur.children)
    return cur is None or cur.state is not State.SPLITTING or cur.children is not None


@settings(max_examples=600)
@given(cases(), st.sampled_from(INTENTS), brokers, maybe_broker)
def test_an_intent_is_refused_or_accepted_by_every_replica(
    case: tuple[BundleRange, Record | None], intent: str, a: str, b: str | None
) -> None:
    rng, cur = case
    new = attempt(intent, rng, cur, a, b)
    if new is None:
        return
    assert new.version == (1 if cur is None else cur.version + 1)
    assert not new.force
    if cur is not None and not accepted_current(cur, rng):
        return
    verdict = resolve(rng, cur, new)
    # A forced current record may carry brokers a normal one cannot (e.g. Assigning whose src is its dst);
    # everything an intent builds from a well-formed current record is accepted.
    assert verdict is ACCEPT, (intent, cur, new, verdict)


@settings(max_examples=400)
@given(cases(), brokers, maybe_broker)
def test_release_and_split_are_refused_exactly_when_the_writer_names_someone_not_the_owner(
    case: tuple[BundleRange, Record | None], owner: str, dst: str | None
) -> None:
    rng, cur = case
    owns = cur is not None and cur.state is State.OWNED and cur.dst == owner
    released = attempt("release", rng, cur, owner, dst)
    assert (released is not None) == (owns and dst != owner)
    assert (attempt("split", rng, cur, owner, None) is not None) == owns
    mergeable = merged_with_a_neighbour(rng) is not None
    assert (attempt("merge", rng, cur, owner, None) is not None) == (owns and mergeable)


@settings(max_examples=300)
@given(cases(), brokers)
def test_an_unowned_bundle_is_assigned_and_nothing_else_is(
    case: tuple[BundleRange, Record | None], dst: str
) -> None:
    rng, cur = case
    unowned = cur is None or cur.state is State.FREE
    assert (attempt("assign", rng, cur, dst, None) is not None) == unowned


def test_a_refusal_names_the_intent_and_the_state_found() -> None:
    cur = intents.take(intents.assign(None, "b1:1", writer="b2:2", now_ms=NOW), "b1:1", now_ms=NOW)
    with pytest.raises(
        IntentRefused, match=r"cannot release: the bundle is not owned by b2:2 \(found owned v2\)"
    ):
        intents.release(cur, src="b2:2", dst=None, writer="leader", now_ms=NOW)
    with pytest.raises(IntentRefused, match="already owned by b1:1"):
        intents.release(cur, src="b1:1", dst="b1:1", writer="leader", now_ms=NOW)
