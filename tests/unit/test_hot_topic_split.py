"""Hot-topic isolation (issue 32 point 6, balance/split.py): a bundle over a split limit whose load is
mostly one topic is cut just around that topic's hash, so the topic gets a bundle of its own -- which no
split by range or topic count can do (Pulsar #3419)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trimtab.balance.load import BundleStats
from trimtab.balance.split import SplitLimits, around, children_for, decide_splits, hot_topic
from trimtab.channel.bundles import BundleRange, check_partition, parse_bundle

BUNDLE = "t/ns/0x40000000_0x80000000"
RNG = BundleRange(0x40000000, 0x80000000)


def stats(loads: dict[int, tuple[float, float]]) -> BundleStats:
    rate = sum(r for r, _ in loads.values())
    return BundleStats(bundle=BUNDLE, topics=len(loads), msg_rate_in=rate, topic_loads=loads)


def test_a_topic_with_most_of_the_load_is_cut_out_on_its_own() -> None:
    s = stats({0x50000000: (40_000.0, 1.0), 0x60000000: (1_000.0, 1.0), 0x70000000: (500.0, 1.0)})
    assert hot_topic(s, 0.5) == 0x50000000
    kids = children_for(s, SplitLimits(hot_topic_share=0.5))
    assert [(k.lower, k.upper) for k in kids] == [
        (0x40000000, 0x50000000),
        (0x50000000, 0x50000001),
        (0x50000001, 0x80000000),
    ]
    # Off (the default), or no topic dominant enough: the configured algorithm, as before.
    assert children_for(s, SplitLimits()) == children_for(s, SplitLimits(hot_topic_share=None))
    assert hot_topic(s, 0.99) is None
    assert children_for(s, SplitLimits(hot_topic_share=0.99)) == children_for(s, SplitLimits())
    # An operator's split names its algorithm: that is what it gets.
    assert children_for(s, SplitLimits(hot_topic_share=0.5), "range_equally_divide") == children_for(
        s, SplitLimits(), "range_equally_divide"
    )


def test_at_the_edges_of_the_range_one_cut_is_enough() -> None:
    assert around(RNG, RNG.lower) == [RNG.lower + 1]
    assert around(RNG, RNG.upper - 1) == [RNG.upper - 1]
    assert around(RNG, 0x50000000) == [0x50000000, 0x50000001]


def test_the_isolated_topic_is_not_split_again() -> None:
    """Its own bundle holds one topic: over the limit still, it is skipped as single_topic, not cut again."""
    s = stats({0x50000000: (40_000.0, 1.0), 0x60000000: (1_000.0, 1.0)})
    lim = SplitLimits(hot_topic_share=0.5, hit_count_threshold=0, max_msg_rate=10_000)
    cycle = decide_splits([s], {}, lim, namespace_bundles={"t/ns": 4}, owned={BUNDLE})
    [d] = cycle.decisions
    alone = d.children[1]
    child = BundleStats(
        bundle=f"t/ns/{alone.name}", topics=1, msg_rate_in=40_000.0, topic_loads={0x50000000: (40_000.0, 1.0)}
    )
    again = decide_splits([child], {}, lim, namespace_bundles={"t/ns": 6}, owned={child.bundle})
    assert again.decisions == [] and again.skipped == [(child.bundle, "single_topic")]


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.integers(min_value=RNG.lower, max_value=RNG.upper - 1),
        st.tuples(st.floats(0, 1e6), st.floats(0, 1e9)),
        min_size=2,
        max_size=20,
    ),
    st.floats(min_value=0.05, max_value=1.0),
)
def test_children_tile_the_parent_and_the_hot_hash_is_alone(
    loads: dict[int, tuple[float, float]], share: float
) -> None:
    s = stats(loads)
    kids = children_for(s, SplitLimits(hot_topic_share=share))
    h = hot_topic(s, share)
    if not kids:
        return
    check_partition(parse_bundle(BUNDLE)[1], list(kids))
    if h is not None:
        (mine,) = [k for k in kids if k.contains(h)]
        assert mine.size == 1 and [x for x in loads if mine.contains(x)] == [h]
