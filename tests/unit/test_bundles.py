"""Bundle names and ranges, the topic -> bundle hash, layouts and the split algorithms (examples)."""

from __future__ import annotations

import itertools
import zlib

import pytest

from trimtab.channel.bundles import (
    FULL_RANGE,
    FULL_UPPER,
    SPLIT_ALGORITHMS,
    BundleLayout,
    BundleRange,
    TopicName,
    bundle_name,
    check_partition,
    equal_boundaries,
    flow_or_qps_equally_divide,
    is_bundle_name,
    parse_bundle,
    range_equally_divide,
    specified_positions_divide,
    split_boundaries,
    split_range,
    topic_count_equally_divide,
    topic_hash,
    validate_namespace,
)
from trimtab.errors import BundleError

# ----------------------------------------------------------------------------------- CRC32 forging


def _crc_with_suffix(prefix: bytes, target: int) -> bytes | None:
    """Four bytes that make ``crc32(prefix + bytes) == target`` (CRC32 is affine over GF(2)), or None."""
    base = zlib.crc32(prefix + b"\0\0\0\0")
    columns = [zlib.crc32(prefix + (1 << j).to_bytes(4, "little")) ^ base for j in range(32)]
    # Solve sum(x_j * columns[j]) == target ^ base by Gaussian elimination over GF(2).
    rows = [(columns[j], 1 << j) for j in range(32)]
    want, pick = target ^ base, 0
    basis: list[tuple[int, int]] = []
    for vec, tag in rows:
        for bvec, btag in basis:
            if vec ^ bvec < vec:
                vec, tag = vec ^ bvec, tag ^ btag
        if vec:
            basis.append((vec, tag))
            basis.sort(reverse=True)
    for bvec, btag in basis:
        if want ^ bvec < want:
            want, pick = want ^ bvec, pick ^ btag
    return pick.to_bytes(4, "little") if want == 0 else None


def topic_with_hash(target: int, namespace: str = "t/ns") -> str:
    """A full topic name whose CRC32 is ``target`` (printable ASCII, so a valid topic name)."""
    for i in range(100_000):
        prefix = f"persistent://{namespace}/forged-{i}-".encode()
        suffix = _crc_with_suffix(prefix, target)
        if suffix is not None and all(0x21 <= c <= 0x7E for c in suffix):
            name = (prefix + suffix).decode("ascii")
            assert zlib.crc32(name.encode()) == target
            return name
    raise AssertionError("could not forge a topic name")


# --------------------------------------------------------------------------------------------- ranges


def test_range_name_parse_round_trip() -> None:
    r = BundleRange(0x10, 0xABCDEF01)
    assert r.name == "0x00000010_0xabcdef01" == str(r)
    assert BundleRange.parse(r.name) == r
    assert BundleRange.parse("0x00000000_0xffffffff") == FULL_RANGE


@pytest.mark.parametrize(
    "text",
    [
        "0x0_0x1",
        "0xABCDEF00_0xFFFFFFFF",  # upper-case hex
        "0x00000010_0x00000010",  # empty
        "0x00000010_0x00000001",  # reversed
        "00000000_ffffffff",
        "0x00000000-0xffffffff",
        " 0x00000000_0xffffffff",
        "0x00000000_0xffffffff ",
        "0x00000000_0xffffffff\n",
        "0x00000000_0x1ffffffff",
        "",
    ],
)
def test_invalid_range_text_is_rejected(text: str) -> None:
    with pytest.raises(BundleError):
        BundleRange.parse(text)


@pytest.mark.parametrize("lower,upper", [(5, 5), (6, 5), (-1, 5), (0, 2**32), (FULL_UPPER, FULL_UPPER)])
def test_invalid_range_values_are_rejected(lower: int, upper: int) -> None:
    with pytest.raises(BundleError):
        BundleRange(lower, upper)


def test_contains_is_half_open_except_for_the_last_bundle() -> None:
    r = BundleRange(0x10, 0x20)
    assert [r.contains(h) for h in (0x0F, 0x10, 0x1F, 0x20)] == [False, True, True, False]
    assert r.size == 0x10
    last = BundleRange(0x80000000, FULL_UPPER)
    assert last.contains(FULL_UPPER) and last.contains(FULL_UPPER - 1) and not last.contains(0x7FFFFFFF)
    assert last.size == 0x80000000
    assert FULL_RANGE.size == 2**32
    assert not BundleRange(0, 0x80000000).contains(0x80000000)


def test_bundle_names() -> None:
    name = bundle_name("my-tenant/ns.1", BundleRange(0, 0x40000000))
    assert name == "my-tenant/ns.1/0x00000000_0x40000000"
    assert parse_bundle(name) == ("my-tenant/ns.1", BundleRange(0, 0x40000000))
    assert is_bundle_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "ns/0x00000000_0x40000000",  # no tenant
        "a/b/c/0x00000000_0x40000000",  # three-part namespace
        "a/b/0x40000000_0x00000000",  # reversed
        "a/b/0x40000000_0x40000000",  # empty
        "a/b/0X00000000_0X40000000",
        "a/b/0x00000000_0x4000000",
        "a/b/0x00000000_0x40000000/",
        "a/b/0x00000000_0x40000000\n",  # a second key for the same bundle
        "\na/b/0x00000000_0x40000000",
        "-a/b/0x00000000_0x40000000",
        "a /b/0x00000000_0x40000000",
        "",
    ],
)
def test_invalid_bundle_names_are_rejected(name: str) -> None:
    assert not is_bundle_name(name)
    with pytest.raises(BundleError):
        parse_bundle(name)


def test_namespaces() -> None:
    assert validate_namespace("public/default") == "public/default"
    for bad in ("public", "public/default/x", "/default", "public/", "pub lic/default", "public/default\n"):
        with pytest.raises(BundleError):
            validate_namespace(bad)


# ---------------------------------------------------------------------------------------------- topics


def test_topic_names() -> None:
    t = TopicName.parse("persistent://public/default/orders-1")
    assert (t.domain, t.tenant, t.namespace_local, t.local) == ("persistent", "public", "default", "orders-1")
    assert t.namespace == "public/default"
    assert t.full == "persistent://public/default/orders-1"
    assert TopicName.parse("non-persistent://a/b/c/d").local == "c/d"
    for bad in (
        "orders",
        "public/default/orders",
        "persistent://public/orders",
        "persistent://public/default/",
        "persistent://public/default/a b",
        "persistent://public/default/x\n",  # would hash the name without the newline
        "Persistent://public/default/x",
    ):
        with pytest.raises(BundleError):
            TopicName.parse(bad)


def test_topic_hash_is_crc32_of_the_utf8_name() -> None:
    # The standard CRC-32 check value, independent of zlib.
    assert topic_hash("123456789") == 0xCBF43926
    assert topic_hash("The quick brown fox jumps over the lazy dog") == 0x414FA339
    for name in ("persistent://public/default/orders", "persistent://t/ns/ünïcödé-主题"):
        assert topic_hash(name) == zlib.crc32(name.encode("utf-8"))
    assert topic_hash("persistent://t/ns/é") != zlib.crc32("persistent://t/ns/é".encode("latin-1"))


def test_topic_to_bundle_follows_the_hash() -> None:
    layout = BundleLayout.default("t/ns", 4)
    b = layout.boundaries
    assert len(b) == 5 and b[0] == 0 and b[-1] == FULL_UPPER
    cases = {
        0: 0,
        b[1] - 1: 0,
        b[1]: 1,
        b[2]: 2,
        b[3] - 1: 2,
        b[3]: 3,
        FULL_UPPER - 1: 3,
        FULL_UPPER: 3,  # the last bundle holds 0xffffffff
    }
    for h, index in cases.items():
        topic = TopicName.parse(topic_with_hash(h))
        assert topic_hash(topic.full) == h
        assert layout.bundle_for_topic(topic) == bundle_name("t/ns", layout.ranges[index])
        assert layout.range_for_hash(h) == layout.ranges[index]


def test_topic_of_another_namespace_is_refused() -> None:
    layout = BundleLayout.default("t/ns", 4)
    with pytest.raises(BundleError):
        layout.bundle_for_topic(TopicName.parse("persistent://t/other/x"))


# --------------------------------------------------------------------------------------------- layouts


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 16, 1000])
def test_default_layout_covers_the_space(count: int) -> None:
    layout = BundleLayout.default("t/ns", count)
    ranges = layout.ranges
    assert len(layout) == count == len(layout.bundles)
    assert ranges[0].lower == 0 and ranges[-1].upper == FULL_UPPER
    assert all(a.upper == b.lower for a, b in itertools.pairwise(ranges))
    assert sum(r.size for r in ranges) == 2**32
    sizes = [r.size for r in ranges]
    assert max(sizes) - min(sizes) <= count + 1  # equal up to rounding
    assert equal_boundaries(count) == list(layout.boundaries)


@pytest.mark.parametrize(
    "boundaries",
    [(0,), (1, FULL_UPPER), (0, 5), (0, 5, 5, FULL_UPPER), (0, 9, 5, FULL_UPPER), ()],
)
def test_invalid_layouts_are_rejected(boundaries: tuple[int, ...]) -> None:
    with pytest.raises(BundleError):
        BundleLayout("t/ns", boundaries)


def test_layout_needs_a_valid_namespace_and_a_bundle() -> None:
    with pytest.raises(BundleError):
        BundleLayout("nope", (0, FULL_UPPER))
    with pytest.raises(BundleError):
        BundleLayout.default("t/ns", 0)


def test_with_split_example() -> None:
    layout = BundleLayout.default("t/ns", 2)
    mid = layout.boundaries[1]
    parent = layout.ranges[1]
    children = split_range(parent, [0xC0000000])
    after = layout.with_split(parent, children)
    assert after.boundaries == (0, mid, 0xC0000000, FULL_UPPER)
    assert after.bundles == [
        f"t/ns/0x00000000_0x{mid:08x}",
        f"t/ns/0x{mid:08x}_0xc0000000",
        "t/ns/0xc0000000_0xffffffff",
    ]
    assert after.with_split(parent, children) == after
    assert layout.boundaries == (0, mid, FULL_UPPER)  # layouts are values


# ------------------------------------------------------------------------------------------- splitting


def test_split_range_examples_and_errors() -> None:
    parent = BundleRange(0, 100)
    assert split_range(parent, [50, 25, 50]) == [
        BundleRange(0, 25),
        BundleRange(25, 50),
        BundleRange(50, 100),
    ]
    for cuts in ([], [0], [100], [101]):
        with pytest.raises(BundleError):
            split_range(parent, cuts)


def test_check_partition_errors() -> None:
    parent = BundleRange(0, 100)
    check_partition(parent, [BundleRange(0, 40), BundleRange(40, 100)])
    for children in (
        [parent],
        [BundleRange(0, 40), BundleRange(41, 100)],  # gap
        [BundleRange(0, 41), BundleRange(40, 100)],  # overlap
        [BundleRange(1, 40), BundleRange(40, 100)],
        [BundleRange(0, 40), BundleRange(40, 99)],
    ):
        with pytest.raises(BundleError):
            check_partition(parent, children)


def test_range_equally_divide_examples() -> None:
    assert range_equally_divide(FULL_RANGE) == [0x7FFFFFFF]
    assert range_equally_divide(BundleRange(0, 2)) == [1]
    assert range_equally_divide(BundleRange(0, 1)) == []
    assert range_equally_divide(BundleRange(FULL_UPPER - 1, FULL_UPPER)) == []


def test_topic_count_equally_divide_examples() -> None:
    parent = BundleRange(0, 1000)
    [cut] = topic_count_equally_divide(parent, [10, 20, 30, 40, 5000])
    assert 20 < cut <= 30  # two topics on each side; 5000 is outside the bundle
    [cut] = topic_count_equally_divide(parent, [10, 20, 30])
    assert 10 < cut <= 20  # floor(3/2) = 1 on the left
    assert topic_count_equally_divide(parent, [7]) == []
    assert topic_count_equally_divide(parent, [7, 7, 7]) == []  # collided hashes cannot be separated
    [cut] = topic_count_equally_divide(parent, [7, 7, 7, 9])
    assert 7 < cut <= 9


def test_specified_positions_divide_examples() -> None:
    parent = BundleRange(100, 200)
    assert specified_positions_divide(parent, [150, 100, 200, 120, 150, 5]) == [120, 150]
    assert specified_positions_divide(parent, []) == []


def test_flow_or_qps_equally_divide_examples() -> None:
    parent = BundleRange(0, 1000)
    loads = {100: (60.0, 0.0), 200: (60.0, 0.0), 300: (60.0, 0.0)}
    # 180 msg/s over a 100 limit: cut wherever the running rate would pass 100.
    cuts = flow_or_qps_equally_divide(parent, loads, max_msg_rate=100, max_bandwidth_bytes=1e9)
    assert len(cuts) == 2 and 100 < cuts[0] <= 200 < cuts[1] <= 300
    # Within (1 + 10%) of the limit: no churn.
    assert flow_or_qps_equally_divide(parent, loads, max_msg_rate=170, max_bandwidth_bytes=1e9) == []
    # Bandwidth alone can trigger it too.
    bw = {100: (0.0, 80.0), 200: (0.0, 80.0)}
    assert len(flow_or_qps_equally_divide(parent, bw, max_msg_rate=1e9, max_bandwidth_bytes=100)) == 1
    # Idle topics are not counted; one loaded topic cannot be split.
    assert flow_or_qps_equally_divide(parent, {1: (500.0, 0.0), 2: (0.0, 0.0)}, 100, 1e9) == []


def test_split_boundaries_dispatch() -> None:
    parent = BundleRange(0, 1000)
    assert split_boundaries("range_equally_divide", parent) == [500]
    assert split_boundaries("specified_positions_divide", parent, positions=[7, 2000]) == [7]
    assert split_boundaries("topic_count_equally_divide", parent, topic_hashes=[1, 2]) == [2]
    assert split_boundaries(
        "flow_or_qps_equally_divide", parent, topic_loads={1: (9e4, 0.0), 3: (9e4, 0.0)}, max_msg_rate=1e5
    ) == [2]
    assert split_boundaries("flow_or_qps_equally_divide", parent) == []
    assert set(SPLIT_ALGORITHMS) == {
        "range_equally_divide",
        "topic_count_equally_divide",
        "specified_positions_divide",
        "flow_or_qps_equally_divide",
    }
    with pytest.raises(BundleError, match="unknown split algorithm"):
        split_boundaries("by_magic", parent)
