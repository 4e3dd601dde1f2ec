"""Namespaces, bundles and the topic -> bundle hash.

The hash (CRC32 of the UTF-8 full topic name, as Pulsar does by default) is part of the protocol: every
node must map a topic to the same bundle, so it never changes. Bundles are contiguous ranges of the 32-bit
hash space. Like Pulsar, a range is half-open ``[lower, upper)`` except that the last bundle of a namespace
(``upper == 0xffffffff``) also holds ``0xffffffff`` itself, so the full space is covered with no gap.

Everything here is pure: the split algorithms and the merge rules are plain functions of ranges and the
load figures they are given, so the agent, the controller, the simulator and the tests all run the same code.
"""

from __future__ import annotations

import bisect
import itertools
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from trimtab.errors import BundleError

FULL_LOWER = 0x00000000
FULL_UPPER = 0xFFFFFFFF

_NAME_PART = r"[A-Za-z0-9][A-Za-z0-9_.=:-]{0,127}"
# \Z, not $: $ also matches before a trailing newline, which made "ns/0x.._0x..\n" a second key (a second
# owner) for the same bundle.
_NAMESPACE_RE = re.compile(rf"^({_NAME_PART})/({_NAME_PART})\Z")
_RANGE_RE = re.compile(r"^0x([0-9a-f]{8})_0x([0-9a-f]{8})\Z")
_BUNDLE_RE = re.compile(rf"^({_NAME_PART}/{_NAME_PART})/(0x([0-9a-f]{{8}})_0x([0-9a-f]{{8}}))\Z")
_TOPIC_RE = re.compile(rf"^([a-z][a-z0-9+.-]{{0,31}})://({_NAME_PART})/({_NAME_PART})/(\S{{1,1024}})\Z")

SPLIT_ALGORITHMS = (
    "range_equally_divide",
    "topic_count_equally_divide",
    "specified_positions_divide",
    "flow_or_qps_equally_divide",
)


@dataclass(frozen=True, slots=True, order=True)
class BundleRange:
    """A contiguous slice of the hash space; see the module docstring for the inclusive-last rule."""

    lower: int
    upper: int

    def __post_init__(self) -> None:
        if not (FULL_LOWER <= self.lower < self.upper <= FULL_UPPER):
            raise BundleError(
                f"invalid bundle range 0x{self.lower:08x}_0x{self.upper:08x}: need lower < upper"
            )

    @property
    def name(self) -> str:
        return f"0x{self.lower:08x}_0x{self.upper:08x}"

    def contains(self, h: int) -> bool:
        return self.lower <= h < self.upper or (h == FULL_UPPER and self.upper == FULL_UPPER)

    @property
    def size(self) -> int:
        """Number of hash values this range holds."""
        return self.upper - self.lower + (1 if self.upper == FULL_UPPER else 0)

    @classmethod
    def parse(cls, text: str) -> BundleRange:
        m = _RANGE_RE.match(text)
        if not m:
            raise BundleError(
                f"invalid bundle range {text!r}: expected 0xLLLLLLLL_0xUUUUUUUU (lower-case hex)"
            )
        return cls(int(m.group(1), 16), int(m.group(2), 16))

    def __str__(self) -> str:
        return self.name


FULL_RANGE = BundleRange(FULL_LOWER, FULL_UPPER)


def validate_namespace(namespace: str) -> str:
    if not _NAMESPACE_RE.match(namespace):
        raise BundleError(f"invalid namespace {namespace!r}: expected tenant/name")
    return namespace


def bundle_name(namespace: str, rng: BundleRange) -> str:
    return f"{namespace}/{rng.name}"


def parse_bundle(name: str) -> tuple[str, BundleRange]:
    """Split ``tenant/ns/0x..._0x...`` into its namespace and range, or raise BundleError."""
    m = _BUNDLE_RE.match(name)
    if not m:
        raise BundleError(f"invalid bundle name {name!r}: expected tenant/name/0xLLLLLLLL_0xUUUUUUUU")
    return m.group(1), BundleRange.parse(m.group(2))


def is_bundle_name(name: str) -> bool:
    """Cheap validity check (used once per new key during replay)."""
    m = _BUNDLE_RE.match(name)
    # Fixed-width lower-case hex orders like the numbers it spells, so no int() conversion is needed.
    return m is not None and m.group(3) < m.group(4)


@dataclass(frozen=True, slots=True)
class TopicName:
    domain: str
    tenant: str
    namespace_local: str
    local: str

    @property
    def namespace(self) -> str:
        return f"{self.tenant}/{self.namespace_local}"

    @property
    def full(self) -> str:
        return f"{self.domain}://{self.tenant}/{self.namespace_local}/{self.local}"

    @classmethod
    def parse(cls, text: str) -> TopicName:
        m = _TOPIC_RE.match(text)
        if not m:
            raise BundleError(
                f"invalid topic {text!r}: expected a full topic name domain://tenant/namespace/topic "
                "(e.g. persistent://public/default/orders)"
            )
        return cls(m.group(1), m.group(2), m.group(3), m.group(4))


def topic_hash(full_topic_name: str) -> int:
    """CRC32 of the UTF-8 full topic name: part of the protocol, never change it."""
    return zlib.crc32(full_topic_name.encode("utf-8")) & 0xFFFFFFFF


def equal_boundaries(count: int) -> list[int]:
    """Boundaries of ``count`` equal bundles over the full space, as Pulsar lays them out (segments of
    ``2**32 // count``; the last bundle ends at, and includes, 0xffffffff)."""
    if count < 1:
        raise BundleError("a namespace needs at least one bundle")
    step = (FULL_UPPER + 1) // count
    return [FULL_LOWER + i * step for i in range(count)] + [FULL_UPPER]


@dataclass(frozen=True, slots=True)
class BundleLayout:
    """The bundles of one namespace, as sorted boundaries ``b0=0 < b1 < ... < bn=0xffffffff``."""

    namespace: str
    boundaries: tuple[int, ...]

    def __post_init__(self) -> None:
        validate_namespace(self.namespace)
        b = self.boundaries
        if len(b) < 2 or b[0] != FULL_LOWER or b[-1] != FULL_UPPER:
            raise BundleError(f"layout of {self.namespace} must start at 0x00000000 and end at 0xffffffff")
        if any(b[i] >= b[i + 1] for i in range(len(b) - 1)):
            raise BundleError(f"layout of {self.namespace} has boundaries out of order or repeated")

    @classmethod
    def default(cls, namespace: str, count: int) -> BundleLayout:
        return cls(namespace, tuple(equal_boundaries(count)))

    @property
    def ranges(self) -> list[BundleRange]:
        b = self.boundaries
        return [BundleRange(b[i], b[i + 1]) for i in range(len(b) - 1)]

    @property
    def bundles(self) -> list[str]:
        return [bundle_name(self.namespace, r) for r in self.ranges]

    def __len__(self) -> int:
        return len(self.boundaries) - 1

    def range_for_hash(self, h: int) -> BundleRange:
        b = self.boundaries
        i = bisect.bisect_right(b, h) - 1
        i = min(i, len(b) - 2)  # 0xffffffff belongs to the last bundle
        return BundleRange(b[i], b[i + 1])

    def bundle_for_topic(self, topic: TopicName) -> str:
        if topic.namespace != self.namespace:
            raise BundleError(f"topic {topic.full} is not in namespace {self.namespace}")
        return bundle_name(self.namespace, self.range_for_hash(topic_hash(topic.full)))

    def with_split(self, parent: BundleRange, children: Sequence[BundleRange]) -> BundleLayout:
        """The layout after ``parent`` was replaced by ``children``; idempotent if already applied."""
        if parent.lower not in self.boundaries or parent.upper not in self.boundaries:
            raise BundleError(f"{parent} is not a bundle of {self.namespace}")
        check_partition(parent, children)
        inner = {c.lower for c in children[1:]}
        return BundleLayout(self.namespace, tuple(sorted(set(self.boundaries) | inner)))

    def with_merge(self, merged: BundleRange, inner: int) -> BundleLayout:
        """The layout after the two bundles meeting at ``inner`` were replaced by ``merged``; idempotent if
        already applied. Refused when ``merged`` is not exactly two bundles of this layout (or one, once
        merged): a parent split since the merge was decided would otherwise vanish from the layout."""
        if not merged.lower < inner < merged.upper:
            raise BundleError(f"0x{inner:08x} is not strictly inside {merged}")
        b = self.boundaries
        if merged.lower not in b or merged.upper not in b:
            raise BundleError(f"{merged} does not start and end at bundle boundaries of {self.namespace}")
        inside = [x for x in b if merged.lower < x < merged.upper]
        if inside not in ([], [inner]):
            raise BundleError(
                f"{merged} is not two adjacent bundles of {self.namespace} meeting at 0x{inner:08x}"
            )
        return BundleLayout(self.namespace, tuple(x for x in b if x != inner))


# --------------------------------------------------------------------------------------------- splitting


def check_partition(parent: BundleRange, children: Sequence[BundleRange]) -> None:
    """Raise unless ``children`` (in order) tile ``parent`` exactly, with no gap or overlap."""
    if len(children) < 2:
        raise BundleError("a split needs at least two children")
    if children[0].lower != parent.lower or children[-1].upper != parent.upper:
        raise BundleError(f"children do not cover {parent} exactly")
    for a, b in itertools.pairwise(children):
        if a.upper != b.lower:
            raise BundleError(f"children {a} and {b} leave a gap or overlap")


# ---------------------------------------------------------------------------------------------- merging


def adjacent(a: BundleRange, b: BundleRange) -> bool:
    """Whether ``a`` and ``b`` touch end to start, in either order (two bundles a merge may join)."""
    return a.upper == b.lower or b.upper == a.lower


def merged_range(a: BundleRange, b: BundleRange) -> BundleRange:
    """The one range that ``a`` and ``b`` cover together; they must be adjacent (no gap, no overlap)."""
    if not adjacent(a, b):
        raise BundleError(f"{a} and {b} are not adjacent: only neighbouring bundles merge")
    return BundleRange(min(a.lower, b.lower), max(a.upper, b.upper))


def check_merge(rng: BundleRange, merged: BundleRange) -> None:
    """Raise unless ``merged`` can be the union of ``rng`` and one neighbour: it strictly contains ``rng``
    and shares exactly one of its edges. The channel checks this much for each merging record; that the
    rest of ``merged`` is one bundle, itself merging, is for the writers (validity is per key)."""
    if not (merged.lower <= rng.lower and rng.upper <= merged.upper) or merged == rng:
        raise BundleError(f"merged range {merged} does not strictly contain {rng}")
    if (merged.lower == rng.lower) == (merged.upper == rng.upper):
        raise BundleError(f"merged range {merged} does not share exactly one edge with {rng}")


def merge_remainder(rng: BundleRange, merged: BundleRange) -> BundleRange:
    """The partner's range: ``merged`` without ``rng`` (see :func:`check_merge`)."""
    check_merge(rng, merged)
    if merged.lower == rng.lower:
        return BundleRange(rng.upper, merged.upper)
    return BundleRange(merged.lower, rng.lower)


def merge_partner(bundle: str, merged: str) -> str:
    """The full name of the bundle ``bundle`` merges with into the range ``merged`` (``0x..._0x...``): the
    rest of the merged range, in the same namespace. Raises BundleError for a range it cannot merge into."""
    namespace, rng = parse_bundle(bundle)
    return bundle_name(namespace, merge_remainder(rng, BundleRange.parse(merged)))


def split_range(parent: BundleRange, boundaries: Iterable[int]) -> list[BundleRange]:
    """Cut ``parent`` at the given inner boundaries (each strictly inside the range)."""
    cuts = sorted(set(boundaries))
    if not cuts:
        raise BundleError(f"no split boundary inside {parent}")
    for c in cuts:
        if not (parent.lower < c < parent.upper):
            raise BundleError(f"split boundary 0x{c:08x} is not strictly inside {parent}")
    edges = [parent.lower, *cuts, parent.upper]
    return [BundleRange(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


def range_equally_divide(parent: BundleRange) -> list[int]:
    """The midpoint of the range (Pulsar's default algorithm)."""
    if parent.upper - parent.lower < 2:
        return []
    return [parent.lower + (parent.upper - parent.lower) // 2]


def topic_count_equally_divide(parent: BundleRange, topic_hashes: Iterable[int]) -> list[int]:
    """A boundary with half of the bundle's topics on each side (needs two distinct hashes)."""
    hashes = sorted(h for h in topic_hashes if parent.contains(h))
    n = len(hashes)
    if n < 2:
        return []
    left, right = hashes[n // 2 - 1], hashes[n // 2]
    # The boundary is the first hash of the right half's side: left < b <= right.
    if left == right:
        # Collided hashes cannot be separated; move to the nearest distinct pair.
        distinct = sorted(set(hashes))
        if len(distinct) < 2:
            return []
        i = bisect.bisect_left(distinct, left)
        if i + 1 < len(distinct):
            left, right = distinct[i], distinct[i + 1]
        else:
            left, right = distinct[i - 1], distinct[i]
    boundary = left + (right - left + 1) // 2
    if not (parent.lower < boundary < parent.upper):
        return []
    return [boundary]


def specified_positions_divide(parent: BundleRange, positions: Iterable[int]) -> list[int]:
    """The operator's positions that lie strictly inside the range, sorted and de-duplicated."""
    return sorted({p for p in positions if parent.lower < p < parent.upper})


def flow_or_qps_equally_divide(
    parent: BundleRange,
    topic_loads: Mapping[int, tuple[float, float]],
    max_msg_rate: float,
    max_bandwidth_bytes: float,
    diff_threshold_pct: float = 10.0,
) -> list[int]:
    """Cut wherever the running load would exceed the per-bundle message-rate or bandwidth limit.

    ``topic_loads`` maps topic hash -> (msg rate, throughput bytes/s). Runs only when the bundle is over
    ``(1 + diff/100) x`` a limit, as Pulsar does, so a bundle hovering at the threshold is not churned.
    May return several boundaries.
    """
    loads = sorted((h, r, t) for h, (r, t) in topic_loads.items() if parent.contains(h) and (r > 0 or t > 0))
    if len(loads) < 2:
        return []
    total_rate = sum(r for _, r, _ in loads)
    total_bw = sum(t for _, _, t in loads)
    factor = 1 + diff_threshold_pct / 100
    if total_rate <= max_msg_rate * factor and total_bw <= max_bandwidth_bytes * factor:
        return []
    cuts: list[int] = []
    acc_rate = acc_bw = 0.0
    for i, (h, r, t) in enumerate(loads):
        if i > 0 and (acc_rate + r > max_msg_rate or acc_bw + t > max_bandwidth_bytes):
            prev = loads[i - 1][0]
            boundary = prev + (h - prev + 1) // 2
            if parent.lower < boundary < parent.upper and (not cuts or boundary > cuts[-1]):
                cuts.append(boundary)
            acc_rate = acc_bw = 0.0
        acc_rate += r
        acc_bw += t
    return cuts


def split_boundaries(
    algorithm: str,
    parent: BundleRange,
    *,
    topic_hashes: Iterable[int] = (),
    positions: Iterable[int] = (),
    topic_loads: Mapping[int, tuple[float, float]] | None = None,
    max_msg_rate: float = 30_000,
    max_bandwidth_bytes: float = 100 * 1024 * 1024,
    diff_threshold_pct: float = 10.0,
) -> list[int]:
    """Dispatch to one of :data:`SPLIT_ALGORITHMS` by name; an empty result means "cannot split"."""
    if algorithm == "range_equally_divide":
        return range_equally_divide(parent)
    if algorithm == "topic_count_equally_divide":
        return topic_count_equally_divide(parent, topic_hashes)
    if algorithm == "specified_positions_divide":
        return specified_positions_divide(parent, positions)
    if algorithm == "flow_or_qps_equally_divide":
        return flow_or_qps_equally_divide(
            parent, topic_loads or {}, max_msg_rate, max_bandwidth_bytes, diff_threshold_pct
        )
    raise BundleError(f"unknown split algorithm {algorithm!r}; choose one of {', '.join(SPLIT_ALGORITHMS)}")
