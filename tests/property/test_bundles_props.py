"""Properties of the bundle model: names round-trip, the topic hash is CRC32, split algorithms partition."""

from __future__ import annotations

import itertools
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import EDGE_HASHES, bundle_ranges, hashes, namespaces, topic_names

from trimtab.channel.bundles import (
    FULL_UPPER,
    SPLIT_ALGORITHMS,
    BundleLayout,
    BundleRange,
    TopicName,
    bundle_name,
    flow_or_qps_equally_divide,
    is_bundle_name,
    parse_bundle,
    range_equally_divide,
    specified_positions_divide,
    split_boundaries,
    split_range,
    topic_count_equally_divide,
    topic_hash,
)
from trimtab.errors import BundleError


def holds(lower: int, upper: int, h: int) -> bool:
    """docs/design.md 1 / Pulsar: [lower, upper), except that the last bundle also holds 0xffffffff."""
    return lower <= h < upper or (h == upper == FULL_UPPER)


def probe_hashes(parent: BundleRange, extra: list[int]) -> list[int]:
    edges = [parent.lower, parent.lower + 1, parent.upper - 1, parent.upper, FULL_UPPER, *EDGE_HASHES]
    if parent.lower > 0:
        edges.append(parent.lower - 1)
    return [h for h in [*edges, *extra] if 0 <= h <= FULL_UPPER]


def assert_partitions(parent: BundleRange, boundaries: list[int], extra: list[int]) -> list[BundleRange]:
    children = split_range(parent, boundaries)
    assert len(children) == len(set(boundaries)) + 1
    assert children[0].lower == parent.lower
    assert children[-1].upper == parent.upper
    for a, b in itertools.pairwise(children):
        assert a.upper == b.lower
    assert sum(c.size for c in children) == parent.size
    for h in probe_hashes(parent, extra):
        owners = [c for c in children if c.contains(h)]
        assert len(owners) == (1 if holds(parent.lower, parent.upper, h) else 0), hex(h)
        assert parent.contains(h) == holds(parent.lower, parent.upper, h)
    return children


samples = st.lists(st.integers(0, FULL_UPPER), max_size=20)


@settings(deadline=None)
@given(parent=bundle_ranges(), extra=samples)
def test_range_equally_divide_partitions_in_halves(parent: BundleRange, extra: list[int]) -> None:
    cuts = range_equally_divide(parent)
    if parent.upper - parent.lower < 2:
        assert cuts == []
        return
    assert len(cuts) == 1
    left, right = assert_partitions(parent, cuts, extra)
    assert abs(left.size - right.size) <= 2


@settings(deadline=None)
@given(parent=bundle_ranges(), data=st.data())
def test_topic_count_equally_divide_halves_the_topics(parent: BundleRange, data: st.DataObject) -> None:
    inside = sorted(data.draw(st.sets(st.integers(parent.lower, parent.upper), max_size=12)))
    inside = [h for h in inside if holds(parent.lower, parent.upper, h)]
    outside = data.draw(st.lists(st.integers(0, FULL_UPPER), max_size=5))
    outside = [h for h in outside if not holds(parent.lower, parent.upper, h)]
    cuts = topic_count_equally_divide(parent, [*inside, *outside])
    n = len(inside)
    # A fair cut b exists iff n >= 2 and some lower < b < upper has inside[n//2-1] < b <= inside[n//2].
    fair_cut_exists = n >= 2 and inside[n // 2 - 1] + 1 < parent.upper
    assert bool(cuts) == fair_cut_exists
    if cuts:
        left, right = assert_partitions(parent, cuts, inside)
        assert sum(left.contains(h) for h in inside) == n // 2
        assert sum(right.contains(h) for h in inside) == n - n // 2


@settings(deadline=None)
@given(parent=bundle_ranges(), data=st.data())
def test_topic_count_equally_divide_with_colliding_hashes(parent: BundleRange, data: st.DataObject) -> None:
    pool = data.draw(st.lists(st.integers(parent.lower, parent.upper), min_size=1, max_size=4))
    topics = data.draw(st.lists(st.sampled_from(pool), max_size=12))
    cuts = topic_count_equally_divide(parent, topics)
    if cuts:
        children = assert_partitions(parent, cuts, topics)
        assert all(any(c.contains(h) for h in topics) for c in children), "a side got no topic"
    else:
        distinct = sorted({h for h in topics if parent.contains(h)})
        # Only when there are fewer than two distinct hashes, or the pair it picked cannot be separated
        # (0xfffffffe and 0xffffffff: a range cannot end at 0xffffffff without holding it).
        assert len(distinct) < 2 or distinct[-2:] == [FULL_UPPER - 1, FULL_UPPER]


@settings(deadline=None)
@given(parent=bundle_ranges(), positions=st.lists(hashes, max_size=8), extra=samples)
def test_specified_positions_divide(parent: BundleRange, positions: list[int], extra: list[int]) -> None:
    cuts = specified_positions_divide(parent, positions)
    assert cuts == sorted({p for p in positions if parent.lower < p < parent.upper})
    if cuts:
        assert_partitions(parent, cuts, [*extra, *positions])


loads = st.tuples(st.integers(0, 50).map(float), st.integers(0, 50).map(float))


@settings(deadline=None)
@given(
    parent=bundle_ranges(),
    data=st.data(),
    max_rate=st.integers(1, 100).map(float),
    max_bw=st.integers(1, 100).map(float),
    diff=st.sampled_from([0.0, 10.0, 50.0]),
)
def test_flow_or_qps_equally_divide(
    parent: BundleRange, data: st.DataObject, max_rate: float, max_bw: float, diff: float
) -> None:
    topic_loads = data.draw(st.dictionaries(st.integers(parent.lower, parent.upper), loads, max_size=10))
    topic_loads.update(data.draw(st.dictionaries(st.integers(0, FULL_UPPER), loads, max_size=3)))
    cuts = flow_or_qps_equally_divide(parent, topic_loads, max_rate, max_bw, diff)
    mine = {h: v for h, v in topic_loads.items() if parent.contains(h) and (v[0] > 0 or v[1] > 0)}
    total_rate = sum(r for r, _ in mine.values())
    total_bw = sum(t for _, t in mine.values())
    factor = 1 + diff / 100
    if len(mine) < 2 or (total_rate <= max_rate * factor and total_bw <= max_bw * factor):
        assert cuts == []
        return
    if FULL_UPPER in mine and not cuts:
        return  # the only cut was between 0xfffffffe and 0xffffffff: impossible
    assert cuts, "over the limit but not split"
    assert cuts == sorted(set(cuts))
    children = assert_partitions(parent, cuts, list(topic_loads))
    if FULL_UPPER not in mine:  # 0xffffffff cannot be cut off the last bundle, so skip that edge
        for c in children:
            held = [v for h, v in mine.items() if c.contains(h)]
            # Each child is within the limits, unless one topic alone exceeds them.
            assert len(held) == 1 or (
                sum(r for r, _ in held) <= max_rate and sum(t for _, t in held) <= max_bw
            )


@settings(deadline=None)
@given(parent=bundle_ranges(), algorithm=st.sampled_from(SPLIT_ALGORITHMS), data=st.data())
def test_split_boundaries_results_always_partition(
    parent: BundleRange, algorithm: str, data: st.DataObject
) -> None:
    probe = data.draw(st.lists(st.integers(parent.lower, parent.upper), max_size=10))
    cuts = split_boundaries(
        algorithm,
        parent,
        topic_hashes=probe,
        positions=probe,
        topic_loads={h: (1000.0, 1.0) for h in probe},
        max_msg_rate=1500.0,
    )
    if cuts:
        assert_partitions(parent, cuts, probe)


@settings(deadline=None)
@given(rng=bundle_ranges(), ns=namespaces)
def test_names_round_trip(rng: BundleRange, ns: str) -> None:
    assert BundleRange.parse(rng.name) == rng
    assert str(rng) == rng.name == f"0x{rng.lower:08x}_0x{rng.upper:08x}"
    name = bundle_name(ns, rng)
    assert is_bundle_name(name)
    assert parse_bundle(name) == (ns, rng)


@settings(deadline=None)
@given(
    st.one_of(
        st.text(max_size=40),
        st.builds(lambda r, s: bundle_name("t/ns", r) + s, bundle_ranges(), st.text(max_size=3)),
    )
)
def test_is_bundle_name_agrees_with_parse_bundle(text: str) -> None:
    try:
        parse_bundle(text)
        parsed = True
    except BundleError:
        parsed = False
    assert is_bundle_name(text) == parsed


@settings(deadline=None)
@given(topic=topic_names)
def test_topic_hash_is_crc32_of_utf8_name(topic: str) -> None:
    assert topic_hash(topic) == zlib.crc32(topic.encode("utf-8"))
    parsed = TopicName.parse(topic)
    assert parsed.full == topic


@settings(deadline=None)
@given(count=st.integers(1, 4096), probe=st.lists(hashes, max_size=20))
def test_default_layout_covers_the_space(count: int, probe: list[int]) -> None:
    layout = BundleLayout.default("t/ns", count)
    ranges = layout.ranges
    assert len(layout) == len(ranges) == count
    assert ranges[0].lower == 0 and ranges[-1].upper == FULL_UPPER
    assert all(a.upper == b.lower for a, b in itertools.pairwise(ranges))
    assert sum(r.size for r in ranges) == 2**32
    b = layout.boundaries
    around = [x + d for x in (b[1], b[len(b) // 2], b[-2]) for d in (-1, 0, 1) if 0 <= x + d <= FULL_UPPER]
    for h in [*probe, *EDGE_HASHES, *around]:
        owners = [r for r in ranges if holds(r.lower, r.upper, h)]
        assert len(owners) == 1
        assert layout.range_for_hash(h) == owners[0]


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(1, 8),
    splits=st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(SPLIT_ALGORITHMS)), max_size=6),
    topics=st.lists(topic_names, min_size=1, max_size=15),
)
def test_with_split_is_idempotent_and_keeps_every_topic_in_one_bundle(
    count: int, splits: list[tuple[int, str]], topics: list[str]
) -> None:
    layout = BundleLayout.default("t/ns", count)
    topic_objs = [TopicName.parse(t) for t in topics]
    topic_objs = [TopicName(t.domain, "t", "ns", t.local) for t in topic_objs]
    for pick, algorithm in splits:
        parent = layout.ranges[pick % len(layout)]
        th = [zlib.crc32(t.full.encode()) for t in topic_objs]
        cuts = split_boundaries(
            algorithm, parent, topic_hashes=th, positions=th, topic_loads={h: (1e6, 1e9) for h in th}
        )
        if not cuts:
            continue
        children = split_range(parent, cuts)
        after = layout.with_split(parent, children)
        assert after.with_split(parent, children) == after
        assert len(after) == len(layout) + len(children) - 1
        assert set(after.ranges) == (set(layout.ranges) - {parent}) | set(children)
        layout = after
        for t in topic_objs:
            h = zlib.crc32(t.full.encode("utf-8"))
            owners = [r for r in layout.ranges if holds(r.lower, r.upper, h)]
            assert len(owners) == 1
            assert layout.bundle_for_topic(t) == bundle_name("t/ns", owners[0])


def test_with_split_rejects_foreign_parent_and_bad_children() -> None:
    layout = BundleLayout.default("t/ns", 2)
    half = 0x7FFFFFFF
    with pytest.raises(BundleError):
        layout.with_split(BundleRange(1, half), split_range(BundleRange(1, half), [100]))
    parent = BundleRange(0, half)
    with pytest.raises(BundleError):
        layout.with_split(parent, [BundleRange(0, 10), BundleRange(11, half)])
    with pytest.raises(BundleError):
        layout.with_split(parent, [parent])
