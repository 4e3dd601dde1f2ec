"""The split rules one at a time (balance/split.py; docs/testing.md: mutation testing).

Every test names the rule it pins: every split setting reaching the limits, the sessions limit that 0
disables, a cycle that goes on past a bundle it skips (for any reason), a namespace missing from the count
holding one bundle, the counters a cycle hands on, the limits the flow-or-qps algorithm is given, and the
hot topic -- found by message rate or by throughput, at its share exactly, the smaller hash of two equally
hot ones, never among fewer than two topics.
"""

from __future__ import annotations

from typing import Any

import pytest

from trimtab.balance.load import BundleStats
from trimtab.balance.split import (
    MB,
    SplitCycle,
    SplitLimits,
    children_for,
    decide_splits,
    hot_topic,
    over_limit,
)
from trimtab.channel.bundles import BundleRange
from trimtab.config.settings import Settings, SplitSettings

NS = "t/ns"
ONE = f"{NS}/0x00000000_0x40000000"
TWO = f"{NS}/0x40000000_0x80000000"
TINY = f"{NS}/0x80000000_0x80000001"  # one hash wide: no boundary inside


def stats(bundle: str, *, topics: int = 10, tput: float = 0.0, **kw: float) -> BundleStats:
    return BundleStats(bundle=bundle, topics=topics, msg_throughput_in=tput, **kw)  # type: ignore[arg-type]


def cycle(
    ss: list[BundleStats],
    lim: SplitLimits,
    *,
    hits: dict[str, int] | None = None,
    ns_bundles: dict[str, int] | None = None,
) -> SplitCycle:
    return decide_splits(
        ss,
        hits or {},
        lim,
        namespace_bundles={NS: 4} if ns_bundles is None else ns_bundles,
        owned={s.bundle for s in ss},
    )


def loads(**by_hash: tuple[float, float]) -> BundleStats:
    """A bundle over the whole hash space with these topic loads (keys h<hash>)."""
    tl = {int(k[1:]): v for k, v in by_hash.items()}
    return BundleStats(bundle=f"{NS}/0x00000000_0xffffffff", topics=len(tl), topic_loads=tl)


# ------------------------------------------------------------------------------------ configuration


def test_from_settings_maps_every_field() -> None:
    """Rule: every split setting reaches ``SplitLimits`` (no field left at its default, none mixed up),
    and the settings' defaults give the default limits."""
    fields: dict[str, Any] = {
        "max_topics": 7,
        "max_sessions": 8,
        "max_msg_rate": 9.5,
        "max_bandwidth_mbytes": 10.5,
        "hit_count_threshold": 11,
        "max_bundles_per_namespace": 12,
        "max_splits_per_cycle": 13,
        "algorithm": "flow_or_qps_equally_divide",
        "flow_or_qps_diff_threshold_pct": 14.0,
        "hot_topic_share": 0.25,
    }
    s = Settings(split=SplitSettings(**fields))
    assert SplitLimits.from_settings(s) == SplitLimits(**fields)
    assert SplitLimits.from_settings(Settings()) == SplitLimits()


# ------------------------------------------------------------------------------------------- limits


def test_a_sessions_limit_of_one_counts_and_zero_disables_it() -> None:
    """Rule: ``max_sessions`` 0 disables the sessions limit; any other value, 1 included, is a limit that
    more sessions exceed (``sessions > max_sessions``)."""
    two = BundleStats(bundle=ONE, producers=1, consumers=1)
    assert over_limit(two, SplitLimits(max_sessions=1)) == "sessions"
    assert over_limit(BundleStats(bundle=ONE, producers=1), SplitLimits(max_sessions=1)) is None
    assert over_limit(BundleStats(bundle=ONE, producers=10**6), SplitLimits(max_sessions=0)) is None


# ------------------------------------------------------------------------------------------- cycle

SKIPPED_FIRST = {
    # the heavier bundle (looked at first) and why the cycle passes it; hits are the previous cycle's
    "under_limits": (stats(ONE, tput=2.0), {TWO: 1}),
    "hit_count": (stats(ONE, topics=1001, tput=2.0), {TWO: 1}),
    "single_topic": (stats(ONE, topics=1, msg_rate_in=30_001.0, tput=2.0), {TWO: 1, ONE: 1}),
    "no_boundary": (stats(TINY, topics=1001, tput=2.0), {TWO: 1, TINY: 1}),
}


@pytest.mark.parametrize("why", list(SKIPPED_FIRST))
def test_a_skipped_bundle_does_not_end_the_cycle(why: str) -> None:
    """Rule: a bundle the cycle passes -- under every limit, its hits not above the threshold yet (equal to
    it: still skipped), a single topic, no boundary inside its range -- is skipped and the cycle goes on
    (``continue``, not ``break``): the lighter bundle after it is split."""
    first, hits = SKIPPED_FIRST[why]
    lighter = stats(TWO, topics=1001, tput=1.0)
    out = cycle([lighter, first], SplitLimits(hit_count_threshold=1), hits=hits)
    assert [(d.bundle, d.reason) for d in out.decisions] == [(TWO, "topics")]
    assert out.skipped == ([] if why == "under_limits" else [(first.bundle, why)])


def test_a_namespace_missing_from_the_count_holds_one_bundle() -> None:
    """Rule: a namespace the bundle counts do not name holds one bundle (the one being split): a split in
    two makes it 2, within a limit of 2, over a limit of 1."""
    s = stats(ONE, topics=1001)
    within = cycle([s], SplitLimits(hit_count_threshold=0, max_bundles_per_namespace=2), ns_bundles={})
    assert [d.bundle for d in within.decisions] == [ONE]
    over = cycle([s], SplitLimits(hit_count_threshold=0, max_bundles_per_namespace=1), ns_bundles={})
    assert over.decisions == [] and over.skipped == [(ONE, "namespace_limit")]


def test_a_split_bundle_loses_its_counter_and_a_waiting_one_keeps_it() -> None:
    """Rule: the counters handed to the next cycle are those of the bundles over a limit that were not
    split (previous + 1); a split bundle's counter is dropped, a bundle under every limit has none."""
    out = cycle(
        [stats(ONE, topics=1001, tput=2.0), stats(TWO, topics=1001, tput=1.0), stats(TINY)],
        SplitLimits(hit_count_threshold=1),
        hits={ONE: 1, TINY: 5},
    )
    assert [d.bundle for d in out.decisions] == [ONE]
    assert out.hits == {TWO: 1}


# --------------------------------------------------------------------------------------- algorithms


def test_flow_or_qps_is_given_the_bandwidth_limit_and_the_difference_threshold() -> None:
    """Rule: the flow-or-qps algorithm cuts by the limits' bandwidth (``max_bandwidth_mbytes`` MB) and
    runs only past ``(1 + flow_or_qps_diff_threshold_pct / 100) x`` a limit, both from the limits."""
    whole = BundleRange(0, 0xFFFFFFFF)
    by_bw = BundleStats(
        bundle=f"{NS}/0x00000000_0xffffffff", topic_loads={16: (0.0, 0.75 * MB), 48: (0.0, 0.75 * MB)}
    )
    bw = SplitLimits(algorithm="flow_or_qps_equally_divide", max_bandwidth_mbytes=1)
    assert children_for(by_bw, bw) == (BundleRange(0, 32), BundleRange(32, whole.upper))
    by_rate = BundleStats(
        bundle=f"{NS}/0x00000000_0xffffffff", topic_loads={16: (0.5, 0.0), 48: (0.5625, 0.0)}
    )
    rate = SplitLimits(algorithm="flow_or_qps_equally_divide", max_msg_rate=1)
    assert children_for(by_rate, rate) == ()  # 1.0625 is within 1.1 x the limit
    exact = SplitLimits(
        algorithm="flow_or_qps_equally_divide", max_msg_rate=1, flow_or_qps_diff_threshold_pct=0
    )
    assert children_for(by_rate, exact) == (BundleRange(0, 32), BundleRange(32, whole.upper))


# ---------------------------------------------------------------------------------------- hot topic


def test_a_hot_topic_needs_another_topic_beside_it() -> None:
    """Rule: a bundle with fewer than two topics has no hot topic (cutting it out would change nothing);
    with two, the one carrying the share is hot."""
    assert hot_topic(loads(h5=(1.0, 1.0)), 0.5) is None
    assert hot_topic(loads(h5=(0.75, 0.0), h9=(0.25, 0.0)), 0.75) == 5
    assert hot_topic(loads(h5=(0.25, 0.0), h9=(0.75, 0.0)), 0.75) == 9


def test_a_topic_is_hot_by_message_rate_whatever_its_throughput() -> None:
    """Rule: the hot topic is the one with the largest share of message rate *or* throughput; a topic
    with 7/8 of the rate is hot at a share of 13/16 though another has 3/4 of the throughput."""
    s = loads(h1=(0.4375, 0.25), h2=(0.0625, 0.75))
    assert hot_topic(s, 0.8125) == 1


def test_a_topic_is_hot_by_throughput_whatever_its_message_rate() -> None:
    """Rule: as by message rate, by throughput: 7/8 of the throughput is hot at 13/16 though another topic
    has 3/4 of the message rate."""
    s = loads(h1=(0.25, 0.4375), h2=(0.75, 0.0625))
    assert hot_topic(s, 0.8125) == 1


def test_without_any_message_rate_or_throughput_the_other_measure_decides() -> None:
    """Rule: a measure that is 0 for every topic gives every topic a share of 0 in it: the other one
    decides (the heavier topic, not the smaller hash)."""
    assert hot_topic(loads(h1=(0.0, 0.25), h2=(0.0, 0.75)), 0.5) == 2
    assert hot_topic(loads(h1=(0.25, 0.0), h2=(0.75, 0.0)), 0.5) == 2


def test_a_share_exactly_at_the_threshold_is_hot() -> None:
    """Rule: a topic carrying exactly ``share`` of the message rate, or of the throughput, is hot
    (``>=``)."""
    assert hot_topic(loads(h1=(0.75, 0.0), h2=(0.25, 0.0)), 0.75) == 1
    assert hot_topic(loads(h1=(0.0, 0.75), h2=(0.0, 0.25)), 0.75) == 1
    assert hot_topic(loads(h1=(0.5, 0.0), h2=(0.5, 0.0)), 0.625) is None


def test_of_two_equally_hot_topics_the_smaller_hash_is_cut_out() -> None:
    """Rule: between topics with the same largest share, the smaller hash is the hot topic."""
    assert hot_topic(loads(h7=(0.5, 0.0), h3=(0.5, 0.0)), 0.5) == 3
