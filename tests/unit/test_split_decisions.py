"""Which bundles an agent splits (docs/design.md 5.3; digest pulsar_elb.md 5.3) and the child ranges."""

from __future__ import annotations

import pytest

from trimtab.balance.load import BundleStats
from trimtab.balance.split import MB, SplitLimits, children_for, decide_splits, over_limit
from trimtab.channel.bundles import FULL_UPPER, BundleRange, check_partition, parse_bundle, split_range

NS = "t/ns"
LIM = SplitLimits(hit_count_threshold=0)  # decide on the first check


def b(lo: int, hi: int, ns: str = NS) -> str:
    return f"{ns}/0x{lo:08x}_0x{hi:08x}"


BUNDLE = b(0, 0x40000000)


def stats(bundle: str = BUNDLE, **kw: object) -> BundleStats:
    kw.setdefault("topics", 10)
    return BundleStats(bundle=bundle, **kw)  # type: ignore[arg-type]


HOT = {
    "topics": {"topics": 1001},
    "sessions": {"producers": 600, "consumers": 401},
    "msg_rate": {"msg_rate_in": 20_000.0, "msg_rate_out": 10_001.0},
    "bandwidth": {"msg_throughput_in": 60 * MB, "msg_throughput_out": 40 * MB + 1},
}


def run(
    ss: list[BundleStats],
    hits: dict[str, int] | None = None,
    lim: SplitLimits = LIM,
    ns_bundles: dict[str, int] | None = None,
    owned: set[str] | None = None,
):  # type: ignore[no-untyped-def]
    return decide_splits(
        ss,
        hits or {},
        lim,
        namespace_bundles=ns_bundles if ns_bundles is not None else {NS: 4},
        owned={s.bundle for s in ss} if owned is None else owned,
    )


# --------------------------------------------------------------------------------------------- reasons


@pytest.mark.parametrize("reason", list(HOT))
def test_each_reason(reason: str) -> None:
    s = stats(**HOT[reason])
    assert over_limit(s, LIM) == reason
    cycle = run([s])
    assert [(d.bundle, d.reason) for d in cycle.decisions] == [(BUNDLE, reason)]


@pytest.mark.parametrize(
    "reason",
    ["topics", "sessions", "msg_rate", "bandwidth"],
)
def test_at_the_limit_is_not_over_it(reason: str) -> None:
    at = {
        "topics": {"topics": 1000},
        "sessions": {"producers": 600, "consumers": 400},
        "msg_rate": {"msg_rate_in": 30_000.0},
        "bandwidth": {"msg_throughput_in": 100 * MB},
    }[reason]
    assert over_limit(stats(**at), LIM) is None
    assert run([stats(**at)]).decisions == []


def test_reason_priority_topics_sessions_msg_rate_bandwidth() -> None:
    order = ["topics", "sessions", "msg_rate", "bandwidth"]
    for i, first in enumerate(order):
        kw: dict[str, object] = {}
        for r in order[i:]:
            kw.update(HOT[r])
        assert over_limit(stats(**kw), LIM) == first
        assert run([stats(**kw)]).decisions[0].reason == first


def test_sessions_limit_zero_disables_it() -> None:
    s = stats(producers=5000)
    assert over_limit(s, SplitLimits(max_sessions=0)) is None
    assert over_limit(s, SplitLimits()) == "sessions"


# ------------------------------------------------------------------------------------------ hit counts


def test_split_only_after_more_than_threshold_checks() -> None:
    lim = SplitLimits(hit_count_threshold=3)
    s = stats(**HOT["topics"])
    hits: dict[str, int] = {}
    for n in (1, 2, 3):
        cycle = run([s], hits, lim)
        assert cycle.decisions == []
        assert cycle.hits == {BUNDLE: n}
        assert (BUNDLE, "hit_count") in cycle.skipped
        hits = cycle.hits
    cycle = run([s], hits, lim)
    assert [d.bundle for d in cycle.decisions] == [BUNDLE]
    assert BUNDLE not in cycle.hits  # the counter starts over after a split


def test_hit_count_resets_when_the_condition_clears() -> None:
    lim = SplitLimits(hit_count_threshold=3)
    cycle = run([stats(**HOT["topics"])], {BUNDLE: 3}, lim)
    assert cycle.decisions  # 4 > 3
    cycle = run([stats(topics=10)], {BUNDLE: 3}, lim)
    assert cycle.hits == {} and cycle.decisions == []
    cycle = run([stats(**HOT["topics"])], cycle.hits, lim)
    assert cycle.hits == {BUNDLE: 1} and cycle.decisions == []


def test_hits_of_bundles_no_longer_reported_are_dropped() -> None:
    cycle = run([stats(**HOT["topics"])], {b(0x40000000, 0x80000000): 2}, SplitLimits())
    assert cycle.hits == {BUNDLE: 1}


# -------------------------------------------------------------------------------------------- skipping


def test_single_topic_bundles_are_not_split() -> None:
    s = stats(topics=1, producers=5000)
    cycle = run([s])
    assert cycle.decisions == []
    assert (BUNDLE, "single_topic") in cycle.skipped
    assert run([stats(topics=0, msg_rate_in=1e6)]).decisions == []


def test_only_owned_bundles() -> None:
    a, c = stats(b(0, 0x40000000), **HOT["topics"]), stats(b(0x40000000, 0x80000000), **HOT["topics"])
    cycle = run([a, c], owned={c.bundle})
    assert [d.bundle for d in cycle.decisions] == [c.bundle]
    assert a.bundle not in cycle.hits


def test_per_cycle_limit() -> None:
    ss = [stats(b(i << 28, (i + 1) << 28), msg_throughput_in=float(200 * MB + i)) for i in range(5)]
    cycle = run(ss, lim=SplitLimits(hit_count_threshold=0, max_splits_per_cycle=2), ns_bundles={NS: 16})
    assert len(cycle.decisions) == 2
    # the busiest bundles first
    assert [d.bundle for d in cycle.decisions] == [ss[4].bundle, ss[3].bundle]
    assert sum(1 for _, r in cycle.skipped if r == "cycle_limit") == 3
    assert all(cycle.hits[s.bundle] == 1 for s in ss[:3])  # still counting for the next cycle


def test_namespace_bundle_limit() -> None:
    ss = [stats(b(i << 28, (i + 1) << 28), **HOT["topics"]) for i in range(3)]
    lim = SplitLimits(hit_count_threshold=0, max_bundles_per_namespace=128)
    cycle = run(ss, lim=lim, ns_bundles={NS: 127})
    assert len(cycle.decisions) == 1  # 127 + 1 = 128 bundles: at the limit, never over it
    assert sum(1 for _, r in cycle.skipped if r == "namespace_limit") == 2
    assert run(ss, lim=lim, ns_bundles={NS: 128}).decisions == []
    cycle = run(ss, lim=lim, ns_bundles={NS: 126})
    assert len(cycle.decisions) == 2


@pytest.mark.parametrize("existing", [1, 5, 9, 10])
def test_namespace_final_count_never_exceeds_max(existing: int) -> None:
    ss = [stats(b(i << 28, (i + 1) << 28), **HOT["msg_rate"]) for i in range(10)]
    lim = SplitLimits(hit_count_threshold=0, max_bundles_per_namespace=10)
    cycle = run(ss, lim=lim, ns_bundles={NS: existing})
    final = existing + sum(len(d.children) - 1 for d in cycle.decisions)
    assert final <= 10
    assert final == max(existing, 10) or len(cycle.decisions) == len(ss)


def test_namespace_limits_are_per_namespace() -> None:
    a = stats(b(0, 0x80000000, "t/a"), **HOT["topics"])
    c = stats(b(0, 0x80000000, "t/c"), **HOT["topics"])
    lim = SplitLimits(hit_count_threshold=0, max_bundles_per_namespace=4)
    cycle = run([a, c], lim=lim, ns_bundles={"t/a": 4, "t/c": 2})
    assert [d.bundle for d in cycle.decisions] == [c.bundle]


def test_decision_children_tile_the_parent() -> None:
    cycle = run([stats(**HOT["topics"])])
    (d,) = cycle.decisions
    _, rng = parse_bundle(BUNDLE)
    check_partition(rng, list(d.children))
    assert d.children == (BundleRange(0, 0x20000000), BundleRange(0x20000000, 0x40000000))


def test_unsplittable_range() -> None:
    tiny = b(5, 6)
    cycle = run([stats(tiny, **HOT["topics"])])
    assert cycle.decisions == [] and (tiny, "no_boundary") in cycle.skipped


# ----------------------------------------------------------------------------------------- algorithms

HASHES = {
    0x01000000: (10.0, 100.0),
    0x05000000: (10.0, 100.0),
    0x09000000: (10.0, 100.0),
    0x30000000: (10.0, 100.0),
}


@pytest.mark.parametrize(
    ("algorithm", "positions", "lim", "loads"),
    [
        ("range_equally_divide", (), SplitLimits(), {}),
        ("topic_count_equally_divide", (), SplitLimits(), HASHES),
        ("specified_positions_divide", (0x10000000, 0x38000000, 0x90000000), SplitLimits(), {}),
        ("flow_or_qps_equally_divide", (), SplitLimits(max_msg_rate=15.0), HASHES),
    ],
)
def test_children_for_each_algorithm_tile_the_parent(
    algorithm: str, positions: tuple[int, ...], lim: SplitLimits, loads: dict[int, tuple[float, float]]
) -> None:
    s = stats(topic_loads=loads)
    kids = children_for(s, lim, algorithm, positions)
    assert len(kids) >= 2
    _, parent = parse_bundle(BUNDLE)
    check_partition(parent, list(kids))
    assert sum(k.size for k in kids) == parent.size
    if algorithm == "topic_count_equally_divide":
        left = [h for h in loads if kids[0].contains(h)]
        assert len(left) == len(loads) // 2
    if algorithm == "specified_positions_divide":
        assert [k.lower for k in kids[1:]] == [0x10000000, 0x38000000]  # 0x90000000 is outside
    if algorithm == "flow_or_qps_equally_divide":
        for k in kids:  # every child within the rate limit
            assert sum(r for h, (r, _) in loads.items() if k.contains(h)) <= 15.0


def test_children_for_the_last_bundle_keeps_the_top_hash() -> None:
    last = b(0xC0000000, FULL_UPPER)
    kids = children_for(stats(last), SplitLimits())
    assert kids[-1].upper == FULL_UPPER and kids[-1].contains(FULL_UPPER)
    check_partition(parse_bundle(last)[1], list(kids))


def test_children_for_without_a_boundary() -> None:
    assert children_for(stats(), SplitLimits(), "topic_count_equally_divide") == ()
    assert children_for(stats(), SplitLimits(), "specified_positions_divide", (0x90000000,)) == ()
    assert children_for(stats(topic_loads=HASHES), SplitLimits(), "flow_or_qps_equally_divide") == ()


def test_children_for_uses_the_configured_algorithm() -> None:
    s = stats(topic_loads=HASHES)
    lim = SplitLimits(algorithm="topic_count_equally_divide")
    assert children_for(s, lim) == children_for(s, SplitLimits(), "topic_count_equally_divide")
    assert children_for(s, lim) != children_for(s, SplitLimits())
    assert children_for(s, SplitLimits()) == tuple(split_range(BundleRange(0, 0x40000000), [0x20000000]))
