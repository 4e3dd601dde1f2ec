"""The bundle model's rules that the other bundle tests leave loose (channel/bundles.py; docs/testing.md).

Each test pins one rule where it can break: a limit reached exactly (the split thresholds, a running load
equal to a limit), a boundary on an edge of its range (a cut at the parent's lower or upper end, at
0xffffffff, an inner boundary of a merge on the merged range's edge), a layout wrong at one end only, the
collided middle of the topic-count split at either end of the distinct hashes, and the refusals' exact
words (what an operator and the HTTP refusals read). Loads are small dyadic numbers, so every sum is exact.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trimtab.channel.bundles import (
    FULL_RANGE,
    FULL_UPPER,
    BundleLayout,
    BundleRange,
    TopicName,
    check_merge,
    check_partition,
    equal_boundaries,
    flow_or_qps_equally_divide,
    split_boundaries,
    split_range,
    topic_count_equally_divide,
    validate_namespace,
)
from trimtab.errors import BundleError

NS = "t/ns"
LAYOUT = BundleLayout(NS, (0, 0x100, 0x200, 0x300, FULL_UPPER))
LAST = BundleRange(0x80000000, FULL_UPPER)  # a namespace's last bundle: it holds 0xffffffff too
MIB = 1024 * 1024


def refusal(call: Callable[[], object]) -> str:
    """The message of the BundleError ``call`` raises."""
    with pytest.raises(BundleError) as caught:
        call()
    return str(caught.value)


def r(lower: int, upper: int) -> BundleRange:
    return BundleRange(lower, upper)


def flow(
    loads: dict[int, tuple[float, float]],
    *,
    rate: float = 1000,
    bw: float = 1000,
    diff: float = 0.0,
    parent: BundleRange = FULL_RANGE,
) -> list[int]:
    return flow_or_qps_equally_divide(parent, loads, rate, bw, diff)


# ------------------------------------------------------------------------------------- the refusals' words

REFUSALS: list[tuple[str, Callable[[], object], str]] = [
    (
        "namespace",
        lambda: validate_namespace("no-slash"),
        "invalid namespace 'no-slash': expected tenant/name",
    ),
    (
        "topic",
        lambda: TopicName.parse("orders"),
        "invalid topic 'orders': expected a full topic name domain://tenant/namespace/topic "
        "(e.g. persistent://public/default/orders)",
    ),
    ("no bundles", lambda: equal_boundaries(0), "a namespace needs at least one bundle"),
    (
        "layout start",
        lambda: BundleLayout(NS, (1, FULL_UPPER)),
        "layout of t/ns must start at 0x00000000 and end at 0xffffffff",
    ),
    (
        "layout order",
        lambda: BundleLayout(NS, (0, 0x200, 0x100, FULL_UPPER)),
        "layout of t/ns has boundaries out of order or repeated",
    ),
    (
        "topic elsewhere",
        lambda: LAYOUT.bundle_for_topic(TopicName.parse("persistent://t/other/orders")),
        "topic persistent://t/other/orders is not in namespace t/ns",
    ),
    (
        "split of no bundle",
        lambda: LAYOUT.with_split(r(0x100, 0x280), [r(0x100, 0x180), r(0x180, 0x280)]),
        "0x00000100_0x00000280 is not a bundle of t/ns",
    ),
    (
        "merge inner outside",
        lambda: LAYOUT.with_merge(r(0x100, 0x300), 0x300),
        "0x00000300 is not strictly inside 0x00000100_0x00000300",
    ),
    (
        "merge off the boundaries",
        lambda: LAYOUT.with_merge(r(0x80, 0x200), 0x100),
        "0x00000080_0x00000200 does not start and end at bundle boundaries of t/ns",
    ),
    (
        "merge of three",
        lambda: LAYOUT.with_merge(r(0, 0x300), 0x100),
        "0x00000000_0x00000300 is not two adjacent bundles of t/ns meeting at 0x00000100",
    ),
    ("one child", lambda: check_partition(r(0, 0x100), [r(0, 0x100)]), "a split needs at least two children"),
    (
        "children short",
        lambda: check_partition(r(0, 0x100), [r(0, 0x80), r(0x80, 0xFF)]),
        "children do not cover 0x00000000_0x00000100 exactly",
    ),
    (
        "children gap",
        lambda: check_partition(r(0, 0x100), [r(0, 0x40), r(0x80, 0x100)]),
        "children 0x00000000_0x00000040 and 0x00000080_0x00000100 leave a gap or overlap",
    ),
    (
        "merge not containing",
        lambda: check_merge(r(0x100, 0x200), r(0x100, 0x200)),
        "merged range 0x00000100_0x00000200 does not strictly contain 0x00000100_0x00000200",
    ),
    (
        "merge on no edge",
        lambda: check_merge(r(0x100, 0x200), r(0, 0x300)),
        "merged range 0x00000000_0x00000300 does not share exactly one edge with 0x00000100_0x00000200",
    ),
    ("no cut", lambda: split_range(r(0, 0x100), []), "no split boundary inside 0x00000000_0x00000100"),
    (
        "cut outside",
        lambda: split_range(r(0, 0x100), [0x80, 0x180]),
        "split boundary 0x00000180 is not strictly inside 0x00000000_0x00000100",
    ),
    (
        "unknown algorithm",
        lambda: split_boundaries("halve", FULL_RANGE),
        "unknown split algorithm 'halve'; choose one of range_equally_divide, topic_count_equally_divide, "
        "specified_positions_divide, flow_or_qps_equally_divide",
    ),
]


@pytest.mark.parametrize(
    ("call", "message"), [(c, m) for _, c, m in REFUSALS], ids=[i for i, _, _ in REFUSALS]
)
def test_each_refusal_names_what_was_refused_and_why(call: Callable[[], object], message: str) -> None:
    """Rule: every BundleError of the model says exactly what was refused (the name, range or value, in the
    model's spelling 0xLLLLLLLL_0xUUUUUUUU) and why -- the words the logs and the HTTP refusals carry."""
    assert refusal(call) == message


# ------------------------------------------------------------------------------------------- the layout


def test_equal_bundles_are_segments_of_two_to_the_32_divided_by_count() -> None:
    """Rule: ``count`` equal bundles are segments of ``2**32 // count`` (Pulsar's layout), not of
    ``(2**32 + 1) // count``: the two differ for 641 bundles (641 divides 2**32 + 1)."""
    b = equal_boundaries(641)
    assert b[:3] == [0, 6_700_416, 13_400_832]
    assert b[-2:] == [640 * 6_700_416, FULL_UPPER]
    assert len(b) == 642


def test_a_layout_whose_last_two_boundaries_repeat_is_refused() -> None:
    """Rule: every pair of neighbouring boundaries is checked, the last one too: a repeated 0xffffffff
    would make an empty last bundle."""
    msg = refusal(lambda: BundleLayout(NS, (0, FULL_UPPER, FULL_UPPER)))
    assert msg == "layout of t/ns has boundaries out of order or repeated"
    msg = refusal(lambda: BundleLayout(NS, (0, 0x100, FULL_UPPER, FULL_UPPER)))
    assert msg == "layout of t/ns has boundaries out of order or repeated"


def test_a_split_parent_must_be_a_bundle_at_both_ends() -> None:
    """Rule: a split is applied only to a range whose lower *and* upper ends are boundaries of the layout;
    one end alone is not a bundle (a split decided on a range since merged or split is refused)."""
    lower_only = r(0x100, 0x280)
    upper_only = r(0x180, 0x300)
    assert refusal(lambda: LAYOUT.with_split(lower_only, [r(0x100, 0x180), r(0x180, 0x280)])) == (
        "0x00000100_0x00000280 is not a bundle of t/ns"
    )
    assert refusal(lambda: LAYOUT.with_split(upper_only, [r(0x180, 0x200), r(0x200, 0x300)])) == (
        "0x00000180_0x00000300 is not a bundle of t/ns"
    )
    done = LAYOUT.with_split(r(0x100, 0x200), [r(0x100, 0x180), r(0x180, 0x200)])
    assert done.boundaries == (0, 0x100, 0x180, 0x200, 0x300, FULL_UPPER)


def test_a_merge_inner_boundary_on_an_edge_of_the_merged_range_is_refused() -> None:
    """Rule: the boundary a merge removes lies strictly inside the merged range: at its lower or its upper
    end it would remove a boundary of a neighbour (refused before the layout is looked at)."""
    merged = r(0x100, 0x300)
    assert refusal(lambda: LAYOUT.with_merge(merged, 0x100)) == (
        "0x00000100 is not strictly inside 0x00000100_0x00000300"
    )
    assert refusal(lambda: LAYOUT.with_merge(merged, 0x300)) == (
        "0x00000300 is not strictly inside 0x00000100_0x00000300"
    )
    # The same merged range, already merged (one bundle): the edges are still refused.
    once = LAYOUT.with_merge(merged, 0x200)
    assert once.boundaries == (0, 0x100, 0x300, FULL_UPPER)
    assert refusal(lambda: once.with_merge(merged, 0x100)) == (
        "0x00000100 is not strictly inside 0x00000100_0x00000300"
    )
    assert refusal(lambda: once.with_merge(merged, 0x300)) == (
        "0x00000300 is not strictly inside 0x00000100_0x00000300"
    )


def test_a_merged_range_must_start_and_end_at_boundaries() -> None:
    """Rule: a merge is applied only when the merged range starts *and* ends at boundaries of the layout;
    one end alone is refused even though the inner boundary is the only one inside."""
    start_off = r(0x80, 0x200)
    end_off = r(0x100, 0x280)
    assert refusal(lambda: LAYOUT.with_merge(start_off, 0x100)) == (
        "0x00000080_0x00000200 does not start and end at bundle boundaries of t/ns"
    )
    assert refusal(lambda: LAYOUT.with_merge(end_off, 0x200)) == (
        "0x00000100_0x00000280 does not start and end at bundle boundaries of t/ns"
    )


# ---------------------------------------------------------------------------------------- split_range


def test_a_cut_on_an_edge_of_the_parent_is_refused_as_not_strictly_inside() -> None:
    """Rule: split_range refuses a cut at the parent's lower or upper end itself (not inside), saying so --
    it does not go on to build an empty child."""
    parent = r(0x100, 0x200)
    assert refusal(lambda: split_range(parent, [0x100, 0x180])) == (
        "split boundary 0x00000100 is not strictly inside 0x00000100_0x00000200"
    )
    assert refusal(lambda: split_range(parent, [0x180, 0x200])) == (
        "split boundary 0x00000200 is not strictly inside 0x00000100_0x00000200"
    )
    assert split_range(parent, [0x101, 0x1FF]) == [r(0x100, 0x101), r(0x101, 0x1FF), r(0x1FF, 0x200)]


# ------------------------------------------------------------------------------ topic_count_equally_divide


def test_topic_count_puts_half_of_the_topics_below_the_boundary() -> None:
    """Rule: with n distinct hashes the boundary lies between the (n//2)-th and the next, at
    ``left + (right - left + 1) // 2`` (left < boundary <= right): 8 topics, 4 on each side."""
    assert topic_count_equally_divide(FULL_RANGE, range(10, 90, 10)) == [45]
    assert topic_count_equally_divide(FULL_RANGE, [10, 20, 30, 40, 50, 60, 70, 80, 90]) == [45]
    assert topic_count_equally_divide(FULL_RANGE, [10, 11]) == [11]
    assert topic_count_equally_divide(FULL_RANGE, [10, 12]) == [11]


@given(st.sets(st.integers(0, FULL_UPPER - 1), min_size=2, max_size=40))
def test_topic_count_boundary_halves_any_set_of_distinct_hashes(hashes: set[int]) -> None:
    """Rule (general): for distinct hashes below 0xffffffff the boundary is the rounded-up midpoint of the
    two middle hashes, so exactly n // 2 topics lie below it."""
    s = sorted(hashes)
    n = len(s)
    left, right = s[n // 2 - 1], s[n // 2]
    expected = left + (right - left + 1) // 2
    assert topic_count_equally_divide(FULL_RANGE, hashes) == [expected]
    assert sum(1 for h in s if h < expected) == n // 2


def test_a_collided_middle_at_the_highest_distinct_hash_cuts_below_it() -> None:
    """Rule: when the middle hashes collide on the highest distinct hash, the boundary goes between the
    next lower distinct hash and it (nothing lies above to cut towards)."""
    assert topic_count_equally_divide(FULL_RANGE, [1, 5, 5, 5]) == [3]
    assert topic_count_equally_divide(FULL_RANGE, [1, 2, 9, 9, 9, 9]) == [6]


def test_a_collided_middle_below_the_highest_distinct_hash_cuts_above_it() -> None:
    """Rule: when the middle hashes collide on a hash with a higher distinct one, the boundary goes between
    it and the next higher distinct hash -- also when that one is the highest."""
    assert topic_count_equally_divide(FULL_RANGE, [1, 5, 5, 9]) == [7]
    assert topic_count_equally_divide(FULL_RANGE, [1, 5, 5, 9, 13]) == [7]


def test_topic_count_never_cuts_at_0xffffffff() -> None:
    """Rule: in a namespace's last bundle, hashes 0xfffffffe and 0xffffffff cannot be separated (the cut
    would be the bundle's upper end, which holds 0xffffffff): no boundary."""
    assert topic_count_equally_divide(LAST, [0xFFFFFFFE, FULL_UPPER]) == []
    assert topic_count_equally_divide(LAST, [0xFFFFFFFD, FULL_UPPER]) == [0xFFFFFFFE]


# ------------------------------------------------------------------------------ flow_or_qps_equally_divide


def test_flow_runs_only_over_ten_percent_above_a_limit_by_default() -> None:
    """Rule: by default the flow split runs once a total is more than 10 % over its limit: 1 105 msg/s
    against a limit of 1 000 is cut, 1 095 is not (11 % would leave 1 105 alone too)."""
    assert flow_or_qps_equally_divide(FULL_RANGE, {100: (600, 0), 200: (505, 0)}, 1000, 1000) == [150]
    assert flow_or_qps_equally_divide(FULL_RANGE, {100: (600, 0), 200: (495, 0)}, 1000, 1000) == []
    assert flow_or_qps_equally_divide(FULL_RANGE, {100: (0, 600), 200: (0, 505)}, 1000, 1000) == [150]


def test_a_total_exactly_at_the_threshold_is_not_split() -> None:
    """Rule: a bundle whose total rate or throughput is exactly ``(1 + diff/100) x`` its limit is not split
    (``<=``), for each figure alone; one unit more is."""
    assert flow({100: (625, 0), 200: (625, 0)}, diff=25) == []
    assert flow({100: (0, 625), 200: (0, 625)}, diff=25) == []
    assert flow({100: (625, 0), 200: (626, 0)}, diff=25) == [150]
    assert flow({100: (0, 625), 200: (0, 626)}, diff=25) == [150]


def test_the_threshold_is_over_the_bandwidth_limit_not_under_it() -> None:
    """Rule: the throughput threshold is the limit *times* ``1 + diff/100``: 1 100 bytes/s against 1 000
    with a 25 % margin stays whole, although the running sum passes the limit."""
    assert flow({100: (0, 550), 200: (0, 550)}, diff=25) == []
    assert flow({100: (550, 0), 200: (550, 0)}, diff=25) == []


def test_any_positive_load_counts_a_topic() -> None:
    """Rule: a topic counts if its rate or its throughput is above 0, however small (half a message per
    second, half a byte per second): two such topics over the limits are cut apart."""
    assert flow({100: (0.5, 0), 200: (0.75, 0)}, rate=1, bw=1) == [150]
    assert flow({100: (0, 0.5), 200: (0, 0.75)}, rate=1, bw=1) == [150]
    assert flow({100: (0, 0), 200: (0.75, 0), 300: (0.75, 0)}, rate=1, bw=1) == [250]


def test_a_running_load_equal_to_the_limit_is_not_cut() -> None:
    """Rule: the cut comes before the topic that would take the running sum *over* a limit; a sum that
    reaches the limit exactly stays in one child, and after a cut the sum restarts at 0."""
    five = {h: (500.0, 0.0) for h in (100, 200, 300, 400, 500)}
    assert flow(five) == [250, 450]
    five_bw = {h: (0.0, 500.0) for h in (100, 200, 300, 400, 500)}
    assert flow(five_bw) == [250, 450]


def test_the_running_load_accumulates_across_topics() -> None:
    """Rule: the running sum adds every topic since the last cut: of three topics of 400 against a limit of
    1 000 no two exceed it, but the third takes the sum over: one cut, before the third."""
    three = {100: (400.0, 0.0), 200: (400.0, 0.0), 300: (400.0, 0.0)}
    assert flow(three) == [250]
    three_bw = {100: (0.0, 400.0), 200: (0.0, 400.0), 300: (0.0, 400.0)}
    assert flow(three_bw) == [250]


def test_the_first_topic_never_has_a_cut_before_it() -> None:
    """Rule: a cut lies between a topic and the one before it, so the lowest topic never gets one, even when
    it alone exceeds the limit: a heavy first topic is cut from the rest after it."""
    assert flow({100: (2000, 0), 200: (1, 0), 300: (1, 0)}) == [150]
    assert flow({100: (0, 2000), 200: (0, 1), 300: (0, 1)}) == [150]


def test_flow_never_cuts_at_0xffffffff() -> None:
    """Rule: a flow cut must lie strictly inside the parent: between hashes 0xfffffffe and 0xffffffff of a
    namespace's last bundle it would be the bundle's own upper end, so there is none."""
    assert flow({0xFFFFFFFE: (2000, 0), FULL_UPPER: (2000, 0)}, parent=LAST) == []
    assert flow({0xFFFFFFFD: (2000, 0), FULL_UPPER: (2000, 0)}, parent=LAST) == [0xFFFFFFFE]


# ---------------------------------------------------------------------------------------- split_boundaries


def test_split_boundaries_defaults_are_pulsars_limits() -> None:
    """Rule: split_boundaries' flow defaults are Pulsar's: 30 000 msg/s and 100 MiB/s per bundle, 10 % over
    before splitting. A running 30 001 msg/s is over the rate limit; 33 151 in all is over 110 %."""
    loads = {100: (20_001.0, 0.0), 200: (10_000.0, 0.0), 300: (3_150.0, 0.0)}
    assert split_boundaries("flow_or_qps_equally_divide", FULL_RANGE, topic_loads=loads) == [150]
    under = {100: (20_000.0, 0.0), 200: (10_000.0, 0.0), 300: (2_900.0, 0.0)}
    assert split_boundaries("flow_or_qps_equally_divide", FULL_RANGE, topic_loads=under) == []
    bw = {100: (0.0, 60.0 * MIB), 200: (0.0, 50.5 * MIB)}
    assert split_boundaries("flow_or_qps_equally_divide", FULL_RANGE, topic_loads=bw) == [150]
    bw_under = {100: (0.0, 60.0 * MIB), 200: (0.0, 49.5 * MIB)}
    assert split_boundaries("flow_or_qps_equally_divide", FULL_RANGE, topic_loads=bw_under) == []


def test_split_boundaries_passes_the_threshold_on() -> None:
    """Rule: the ``diff_threshold_pct`` given to split_boundaries is the one the flow split uses: 1 105
    msg/s against 1 000 is left whole with 50 %, though over the default 10 %."""
    loads = {100: (600.0, 0.0), 200: (505.0, 0.0)}
    algorithm = "flow_or_qps_equally_divide"
    assert split_boundaries(
        algorithm, FULL_RANGE, topic_loads=loads, max_msg_rate=1000, max_bandwidth_bytes=1000
    ) == [150]
    assert (
        split_boundaries(
            algorithm,
            FULL_RANGE,
            topic_loads=loads,
            max_msg_rate=1000,
            max_bandwidth_bytes=1000,
            diff_threshold_pct=50,
        )
        == []
    )
