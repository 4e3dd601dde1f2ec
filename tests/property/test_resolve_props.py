"""Properties of the first-valid-transition predicate (docs/design.md 3.3), against the reference model."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import (
    BROKERS,
    DESIGN_TRANSITIONS,
    STATE_NAMES,
    bundle_ranges,
    children_for,
    merged_for,
    oracle_accepts,
    oracle_shape_ok,
    rec,
    to_record,
)

from trimtab.channel.bundles import BundleRange
from trimtab.channel.records import Record
from trimtab.channel.resolve import ACCEPT, Verdict, resolve

brokers = st.sampled_from([None, *BROKERS])


@st.composite
def cases(draw: Any) -> tuple[BundleRange, Record | None, Record | None]:
    """A bundle, its current record, and a proposal near it (versions around cur+1, few brokers)."""
    rng = draw(bundle_ranges())
    cur = None
    if draw(st.integers(0, 4)):
        cur = to_record(
            rec(
                draw(st.sampled_from(STATE_NAMES)),
                draw(st.integers(1, 5)),
                dst=draw(brokers),
                src=draw(brokers),
                force=draw(st.booleans()),
            )
        )
    if draw(st.integers(0, 9)) == 0:
        return rng, cur, None  # a tombstone
    base = 0 if cur is None else cur.version
    state = draw(st.sampled_from(STATE_NAMES))
    children = None
    if state == "merging":
        children = draw(merged_for(rng))
    elif state == "splitting" or draw(st.integers(0, 15)) == 0:
        children = draw(children_for(rng))
    new = to_record(
        rec(
            state,
            max(1, base + draw(st.sampled_from([1, 1, 1, 1, 0, -1, 2]))),
            dst=draw(brokers),
            src=draw(brokers),
            force=draw(st.integers(0, 4)) == 0,
            children=children,
        )
    )
    return rng, cur, new


def as_dict(r: Record | None) -> dict[str, Any] | None:
    return None if r is None else r.to_json()


@settings(max_examples=600, deadline=None)
@given(cases())
def test_resolve_agrees_with_the_reference_model(
    case: tuple[BundleRange, Record | None, Record | None],
) -> None:
    rng, cur, new = case
    verdict = resolve(rng, cur, new)
    assert (verdict is ACCEPT) == oracle_accepts(rng.lower, rng.upper, as_dict(cur), as_dict(new))


@settings(deadline=None)
@given(cases())
def test_verdict_reasons(case: tuple[BundleRange, Record | None, Record | None]) -> None:
    """The reason follows the order of the checks: version, then shape, then force, then transition."""
    rng, cur, new = case
    verdict = resolve(rng, cur, new)
    if new is None:
        assert verdict in (Verdict.ACCEPT, Verdict.INVALID_TRANSITION)
        return
    expected = 1 if cur is None else cur.version + 1
    if new.version != expected:
        # Never accepted, forced or not; a lower version is stale, a higher one (or not 1 from Init) a gap.
        stale = cur is not None and new.version <= cur.version
        assert verdict is (Verdict.STALE_VERSION if stale else Verdict.VERSION_GAP)
    elif not oracle_shape_ok(rng.lower, rng.upper, new.to_json()):
        assert verdict is Verdict.BAD_RECORD
    elif new.force:
        assert verdict is ACCEPT
    elif new.state.value not in DESIGN_TRANSITIONS[None if cur is None else cur.state.value]:
        assert verdict is Verdict.INVALID_TRANSITION
    else:
        assert verdict in (ACCEPT, Verdict.BROKER_MISMATCH)


@settings(deadline=None)
@given(cases())
def test_resolve_is_deterministic_and_pure(case: tuple[BundleRange, Record | None, Record | None]) -> None:
    rng, cur, new = case
    cur_before, new_before = copy.deepcopy(as_dict(cur)), copy.deepcopy(as_dict(new))
    first = resolve(rng, cur, new)
    # Equal but distinct inputs give the same verdict: nothing depends on identity or on earlier calls.
    twin_cur = None if cur is None else to_record(copy.deepcopy(cur.to_json()))
    twin_new = None if new is None else to_record(copy.deepcopy(new.to_json()))
    assert resolve(BundleRange(rng.lower, rng.upper), twin_cur, twin_new) is first
    assert resolve(rng, cur, new) is first
    assert as_dict(cur) == cur_before and as_dict(new) == new_before


@settings(deadline=None)
@given(data=st.data())
def test_at_most_one_record_per_version_is_accepted(data: st.DataObject) -> None:
    """Racing writers that computed the same version: whatever order they land in, at most one wins,
    and the winner is the first of them that is valid (first valid transition wins)."""
    rng, cur, _ = data.draw(cases())
    version = 1 if cur is None else cur.version + 1
    rivals = data.draw(
        st.lists(
            st.builds(
                lambda state, dst, src, force: to_record(rec(state, version, dst=dst, src=src, force=force)),
                st.sampled_from(STATE_NAMES),
                brokers,
                brokers,
                st.booleans(),
            ),
            min_size=1,
            max_size=6,
        )
    )
    state = cur
    winners = []
    for r in rivals:
        if resolve(rng, state, r) is ACCEPT:
            winners.append(r)
            state = r
    assert len(winners) <= 1
    valid = [r for r in rivals if resolve(rng, cur, r) is ACCEPT]
    assert winners == valid[:1]
