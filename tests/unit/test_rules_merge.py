"""The merge rules one at a time (balance/merge.py; docs/testing.md: mutation testing).

Every test names the rule it pins: the sessions limit that 0 (and only 0) disables, the pair's sum (not
difference) kept at ``split_fraction`` of every split limit with equality allowed, a check that goes on
past a pair still counting its cold checks (and labels it ``hit_count``), pairs tried coldest first by the
sum of their throughputs, a decided pair's counter dropped, the ``room`` an owner may use exactly, the
merges in flight counted from ``Merging`` records only, and the half-written merge an owner aborts: its
own ``Merging`` only, never a committed one, never one whose merged range it cannot read.
"""

from __future__ import annotations

import pytest

from trimtab.balance.load import BundleStats
from trimtab.balance.merge import (
    MergeCycle,
    MergeDecision,
    MergeLimits,
    cold,
    fits_after_merge,
    half_written,
    merge_candidates,
    merge_room,
)
from trimtab.balance.split import MB, SplitLimits
from trimtab.channel.bundles import BundleLayout
from trimtab.channel.records import Record, State, make

ME, OTHER = "s:1", "b:2"
NS = "t/ns"
LAYOUT = BundleLayout.default(NS, 4)
A, B, C, D = LAYOUT.bundles
AB = f"{NS}/0x00000000_0x80000000"
BC = f"{NS}/0x40000000_0xc0000000"
CD = f"{NS}/0x80000000_0xffffffff"
X = "0x00000000_0x80000000"  # A and B merged, as a range
NOW = 1_000_000


def owned(dst: str = ME) -> Record:
    return make(State.OWNED, dst=dst, version=1, ts=0, writer=dst)


def stats(
    bundle: str, *, tput: float = 0.0, rate: float = 0.0, topics: int = 1, sessions: int = 0
) -> BundleStats:
    return BundleStats(
        bundle=bundle, msg_throughput_in=tput, msg_rate_in=rate, topics=topics, producers=sessions
    )


def check(
    st: dict[str, BundleStats],
    *,
    threshold: int = 0,
    hits: dict[str, int] | None = None,
    room: int | None = None,
) -> MergeCycle:
    lim = MergeLimits(enabled=True, hit_count_threshold=threshold, min_bundles_per_namespace=1)
    records = {b: owned() for b in LAYOUT.bundles}
    return merge_candidates(LAYOUT, records, st, lim, hits, owner=ME, room=room)


# ------------------------------------------------------------------------------------------- figures


def test_a_sessions_limit_of_zero_is_not_checked_and_one_is() -> None:
    """Rule: a merge ``max_sessions`` of 0 leaves sessions unchecked (any number is cold); 1 is a limit
    like any other (1 session is cold, 2 are not)."""
    many = stats(A, sessions=1_000_000)
    assert cold(many, MergeLimits(max_sessions=0))
    assert cold(stats(A, sessions=1), MergeLimits(max_sessions=1))
    assert not cold(stats(A, sessions=2), MergeLimits(max_sessions=1))


SPLIT = SplitLimits(max_topics=8, max_sessions=8, max_msg_rate=8, max_bandwidth_mbytes=8)
FRACTION = MergeLimits(split_fraction=0.5, split=SPLIT)  # every limit of the pair: 4 (4 MB)


def test_a_pair_exactly_at_split_fraction_of_every_split_limit_fits() -> None:
    """Rule: the pair fits when each summed figure is at most ``split_fraction`` x its split limit --
    exactly at it included."""
    a = stats(A, topics=1, sessions=1, rate=1.0, tput=1.0 * MB)
    b = stats(B, topics=3, sessions=3, rate=3.0, tput=3.0 * MB)
    assert fits_after_merge(a, b, FRACTION)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (stats(A, topics=1), stats(B, topics=4)),
        (stats(A, sessions=1), stats(B, sessions=4)),
        (stats(A, rate=1.0), stats(B, rate=4.0)),
        (stats(A, tput=1.0 * MB), stats(B, tput=4.0 * MB)),
    ],
    ids=["topics", "sessions", "msg_rate", "bandwidth"],
)
def test_the_sum_of_the_pair_over_the_fraction_would_split(a: BundleStats, b: BundleStats) -> None:
    """Rule: it is the pair's *sum* that is held to ``split_fraction`` x each split limit (times, not
    divided by, the fraction): 1 + 4 over a limit of 8 x 0.5 does not fit, whichever figure it is."""
    assert not fits_after_merge(a, b, FRACTION)


# ------------------------------------------------------------------------------------------ the check


def test_a_check_goes_on_past_a_pair_still_counting_its_cold_checks() -> None:
    """Rule: a pair cold for no more than ``hit_count_threshold`` checks is skipped as ``hit_count`` with
    its counter raised, and the check goes on to the next pairs; a decided pair's counter is dropped."""
    quiet = {b: stats(b) for b in LAYOUT.bundles}
    out = check(quiet, threshold=1, hits={BC: 1})
    assert out.decisions == [MergeDecision(B, C, BC, ME)]
    assert out.hits == {AB: 1, CD: 1}
    assert out.skipped == [(AB, "hit_count"), (CD, "hit_count")]


def test_pairs_are_tried_coldest_first_by_the_sum_of_their_throughputs() -> None:
    """Rule: pairs are decided in order of the sum of both bundles' throughputs (message rates do not
    count): the middle pair of 4 + 0, 0 + 0 (message rate 8), 0 + 4 goes first and its neighbours then
    overlap it."""
    st = {A: stats(A, tput=4.0), B: stats(B), C: stats(C, rate=8.0), D: stats(D, tput=4.0)}
    out = check(st)
    assert out.decisions == [MergeDecision(B, C, BC, ME)]
    assert out.skipped == [(AB, "overlaps"), (CD, "overlaps")]
    assert out.hits == {AB: 1, CD: 1}


def test_room_allows_exactly_that_many_merges() -> None:
    """Rule: with ``room`` n the check decides at most n merges -- the n+1th is ``min_bundles`` -- and
    ``room`` 0 decides none."""
    st = {A: stats(A), B: stats(B, tput=1.0), C: stats(C, tput=1.0), D: stats(D)}
    one = check(st, room=1)
    assert one.decisions == [MergeDecision(A, B, AB, ME)]
    assert one.skipped == [(CD, "min_bundles"), (BC, "overlaps")]
    none = check(st, room=0)
    assert none.decisions == []
    assert none.skipped == [(AB, "min_bundles"), (CD, "min_bundles"), (BC, "min_bundles")]


def test_merges_in_flight_are_counted_from_merging_records_only() -> None:
    """Rule: ``merge_room`` takes off the merges in flight, i.e. the ``Merging`` records; a ``Splitting``
    record's children are not a merge, and a bundle without a record is none either."""
    splitting = make(
        State.SPLITTING, src=ME, version=2, ts=0, writer=ME, children={"0x00000000_0x20000000": ME}
    )
    records = {A: splitting, B: owned(), C: owned()}  # D has no record
    assert merge_room(LAYOUT, records, ME, 1) == 3
    merging = make(State.MERGING, src=ME, version=2, ts=0, writer=ME, children={X: ME})
    assert merge_room(LAYOUT, {**records, A: merging}, ME, 1) == 2


# ------------------------------------------------------------------------------- half-written merges


def merging(state: State = State.MERGING, *, src: str = ME, writer: str = ME, into: str = X) -> Record:
    return make(state, src=src, dst=None, version=2, ts=0, writer=writer, children={into: ME})


def written(rec: Record, table: dict[str, Record]) -> bool:
    return half_written(ME, A, rec, table.get, now_ms=NOW, after_ms=NOW)


def test_an_own_merge_waiting_for_its_partner_is_half_written() -> None:
    """Rule: ``Merging{src=me, writer=me}`` exactly ``after_ms`` old, merged bundle not created, partner
    still ``Owned`` by me: half written."""
    assert written(merging(), {B: owned()})
    assert not written(merging(), {B: owned(OTHER)})
    assert not written(merging(), {})


def test_a_committed_merge_is_never_half_written() -> None:
    """Rule: once the merged bundle has a record (looked up by its full name, in the bundle's
    namespace) the merge only goes forward: not half written, whatever the partner."""
    assert not written(merging(), {B: owned(), f"{NS}/{X}": owned()})


def test_a_merged_range_that_is_no_merge_of_the_bundle_is_not_half_written() -> None:
    """Rule: a ``Merging`` whose merged range does not extend the bundle by a neighbour (no partner can be
    named) is not this rule's to abort: not half written."""
    assert not written(merging(into="0x40000000_0x80000000"), {B: owned()})


@pytest.mark.parametrize("state", [s for s in State if s is not State.MERGING])
def test_only_a_merging_record_is_half_written(state: State) -> None:
    """Rule: a record in any state but ``Merging`` is never half written, even naming me as source and
    writer with a merged range."""
    assert not written(merging(state), {B: owned()})


def test_only_my_own_merge_written_by_me_is_half_written() -> None:
    """Rule: another broker's ``Merging``, or mine written by someone else (an override), is not."""
    assert not written(merging(src=OTHER), {B: owned()})
    assert not written(merging(writer=OTHER), {B: owned()})
