"""Which neighbouring bundles of a namespace an agent should merge this cycle (issue 32 point 5). Pure.

Splits only ever add bundles (balance/split.py); a namespace whose traffic fell keeps them all, and every
bundle costs a channel key, a lease, lookups and a row in every balancing pass. A merge joins two
adjacent bundles that have both been cold -- every figure at or below its merge limit -- for more than
``hit_count_threshold`` consecutive checks (one quiet sample is not a trend), and only when the pair
together stays at or below ``split_fraction`` of every split limit: a merge that the next split check
undoes would churn the namespace. Namespaces keep at least ``min_bundles_per_namespace`` bundles.

The channel decides ownership per key, so the owner's agent checks what the merge flow needs before it
writes a parent's ``Merging``: both parents ``Owned`` by it and not in flight, and no record yet under the
merged bundle's name (a split parent still ``Deleted`` there must be tombstoned first: the agents take an
existing merged record as the sign that the merge committed, see balance/roles.py). Parents with different
owners are skipped (``owners_differ``): only an agent has a cold bundle's figures, and moving bundles to
bring pairs together churned (see :func:`merge_candidates`); ``admin transfer`` then ``admin merge`` joins
them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from trimtab.balance.load import BundleStats
from trimtab.balance.split import MB, SplitLimits
from trimtab.channel.bundles import BundleLayout, bundle_name, merge_partner, merged_range, parse_bundle
from trimtab.channel.records import Record, State
from trimtab.config.settings import Settings
from trimtab.errors import BundleError


@dataclass(frozen=True)
class MergeLimits:
    """A bundle is cold when each figure is at most its limit; automatic merging is off by default."""

    enabled: bool = False
    max_topics: int = 100
    max_sessions: int = 100  # 0: not checked (as split.max_sessions)
    max_msg_rate: float = 1_000
    max_bandwidth_mbytes: float = 5
    split_fraction: float = 0.5  # the pair's sum against every split limit
    min_bundles_per_namespace: int = 4  # namespace.default_bundles
    hit_count_threshold: int = 3
    max_merges_per_cycle: int = 10
    split: SplitLimits = field(default_factory=SplitLimits)

    @classmethod
    def from_settings(cls, s: Settings) -> MergeLimits:
        m = s.merge
        return cls(
            enabled=m.enabled,
            max_topics=m.max_topics,
            max_sessions=m.max_sessions,
            max_msg_rate=m.max_msg_rate,
            max_bandwidth_mbytes=m.max_bandwidth_mbytes,
            split_fraction=m.split_fraction,
            min_bundles_per_namespace=m.min_bundles_per_namespace,
            hit_count_threshold=m.hit_count_threshold,
            max_merges_per_cycle=m.max_merges_per_cycle,
            split=SplitLimits.from_settings(s),
        )


@dataclass(frozen=True)
class MergeDecision:
    left: str  # the lower range's bundle
    right: str
    merged: str  # bundle name of the union
    owner: str  # the broker that merges (and owns the merged bundle)


@dataclass
class MergeCycle:
    decisions: list[MergeDecision]
    hits: dict[str, int]  # merged bundle name -> consecutive cold checks, for the next cycle
    skipped: list[tuple[str, str]]  # (merged bundle name, reason)


def cold(s: BundleStats, lim: MergeLimits) -> bool:
    """Every figure at or below its merge limit (sessions only when that limit is set)."""
    return (
        s.topics <= lim.max_topics
        and (lim.max_sessions <= 0 or s.sessions <= lim.max_sessions)
        and s.msg_rate <= lim.max_msg_rate
        and s.throughput <= lim.max_bandwidth_mbytes * MB
    )


def fits_after_merge(a: BundleStats, b: BundleStats, lim: MergeLimits) -> bool:
    """The pair's sum keeps ``split_fraction`` of every split limit free, so it does not split back."""
    sp, f = lim.split, lim.split_fraction
    return (
        a.topics + b.topics <= sp.max_topics * f
        and (sp.max_sessions <= 0 or a.sessions + b.sessions <= sp.max_sessions * f)
        and a.msg_rate + b.msg_rate <= sp.max_msg_rate * f
        and a.throughput + b.throughput <= sp.max_bandwidth_mbytes * MB * f
    )


def settled_owner(rec: Record | None) -> str | None:
    """The owner of a bundle that may start merging: ``Owned`` with a destination, nothing in flight."""
    if rec is None or rec.state is not State.OWNED:
        return None
    return rec.dst


def _why_not(
    left: str,
    right: str,
    merged: str,
    records: Mapping[str, Record],
    stats: Mapping[str, BundleStats],
    lim: MergeLimits,
) -> str | None:
    """Why this pair cannot merge now (a bounded reason label), or None when it can."""
    if settled_owner(records.get(left)) is None or settled_owner(records.get(right)) is None:
        return "not_owned"  # in flight, free, deleted or never assigned
    if merged in records:
        return "merged_exists"
    a, b = stats.get(left), stats.get(right)
    if a is None or b is None:
        return "no_stats"  # no figures is no evidence of cold
    if not (cold(a, lim) and cold(b, lim)):
        return "hot"
    if not fits_after_merge(a, b, lim):
        return "would_split"
    return None


def _weight(s: BundleStats) -> tuple[float, float, int]:
    return (s.throughput, s.msg_rate, s.topics)


def merge_candidates(
    layout: BundleLayout,
    records: Mapping[str, Record],
    stats: Mapping[str, BundleStats],
    lim: MergeLimits,
    hits: Mapping[str, int] | None = None,
    *,
    owner: str,
    room: int | None = None,
    budget: int | None = None,
) -> MergeCycle:
    """One merge check of one namespace: neighbouring pairs of ``layout``, coldest first, no bundle in two
    pairs, the namespace never below ``min_bundles_per_namespace``. ``records`` is the channel table (by
    bundle name), ``stats`` the latest per-bundle figures, ``hits`` the previous cycle's counters.

    ``owner``: the agent whose check this is -- it has figures for its own bundles only: only pairs it owns
    both of are decided; any other pair is skipped as ``owners_differ``.
    ``room``: how many merges this call may decide before the namespace could go below its minimum, given
    merges in flight and the other owners' shares (:func:`merge_room`); ``budget``: how many are left of
    this check's ``max_merges_per_cycle`` across namespaces.
    Nothing is moved to bring a pair together. Tried in the simulator (peak-and-trough): agents that
    offered a cold bundle to the owner of its lower neighbour moved one bundle between brokers eight times
    in nine minutes -- each offer changed the owner of the next bundle's lower neighbour, and merges and
    the shedder (which spreads a namespace's bundles) changed them again."""
    previous = hits or {}
    ranges = layout.ranges
    pairs: list[tuple[float, str, str, str]] = []
    new_hits: dict[str, int] = {}
    skipped: list[tuple[str, str]] = []
    for lo, hi in itertools.pairwise(ranges):
        left, right = bundle_name(layout.namespace, lo), bundle_name(layout.namespace, hi)
        merged = bundle_name(layout.namespace, merged_range(lo, hi))
        why = _why_not(left, right, merged, records, stats, lim)
        if why != "not_owned" and not (
            settled_owner(records.get(left)) == owner == settled_owner(records.get(right))
        ):
            why = "owners_differ"
        if why is not None:
            skipped.append((merged, why))
            continue
        count = previous.get(merged, 0) + 1
        new_hits[merged] = count
        if count <= lim.hit_count_threshold:
            skipped.append((merged, "hit_count"))
            continue
        pairs.append((_weight(stats[left])[0] + _weight(stats[right])[0], merged, left, right))
    decisions: list[MergeDecision] = []
    taken: set[str] = set()
    for _, merged, left, right in sorted(pairs):
        if left in taken or right in taken:
            skipped.append((merged, "overlaps"))
        elif len(layout) - len(decisions) - 1 < lim.min_bundles_per_namespace or (
            room is not None and len(decisions) >= room
        ):
            skipped.append((merged, "min_bundles"))
        elif len(decisions) >= min(
            lim.max_merges_per_cycle, budget if budget is not None else lim.max_merges_per_cycle
        ):
            skipped.append((merged, "cycle_limit"))
        else:
            decisions.append(MergeDecision(left, right, merged, owner))
            taken.update((left, right))
            new_hits.pop(merged, None)
    return MergeCycle(decisions, new_hits, skipped)


def merge_room(layout: BundleLayout, records: Mapping[str, Record], me: str, minimum: int) -> int:
    """How many merges broker ``me`` may start in the namespace of ``layout`` without it ever going below
    ``minimum`` bundles, whatever the other owners decide at the same moment: the merges left (bundles,
    less merges in flight, less the minimum) shared between the brokers that own its bundles, the
    remainder to the first ones by name. Each agent checks with its own figures, so without a share two
    agents could each take the namespace's last merge."""
    in_flight = {
        next(iter(r.children))
        for b in layout.bundles
        if (r := records.get(b)) is not None and r.state is State.MERGING and r.children
    }
    left = len(layout) - len(in_flight) - minimum
    if left <= 0:
        return 0
    owners = sorted({o for b in layout.bundles if (o := settled_owner(records.get(b))) is not None} | {me})
    share, extra = divmod(left, len(owners))
    return share + (1 if owners.index(me) < extra else 0)


def half_written(
    me: str, bundle: str, rec: Record, lookup: Callable[[str], Record | None], *, now_ms: int, after_ms: int
) -> bool:
    """Whether ``rec`` is one of this broker's own automatic merges left half written for longer than
    ``after_ms``: ``Merging{src=me}`` written by ``me``, the merged bundle not created, and the partner still
    ``Owned`` by ``me`` -- the state in which the merge flow waits for a second half (balance/roles.py,
    ``plan_merge``) that this agent failed to write (a publish that failed or timed out, a crash between the
    two writes). Its owner aborts it (``intents.abort_merge``) rather than leave the bundle waiting for the
    monitor -- which, where no other broker may take it, would wait forever."""
    if rec.state is not State.MERGING or rec.src != me or rec.writer != me or not rec.children:
        return False
    if now_ms - rec.ts < after_ms:
        return False
    merged = next(iter(rec.children))
    try:
        partner = merge_partner(bundle, merged)
        namespace = parse_bundle(bundle)[0]
    except BundleError:
        return False
    if lookup(f"{namespace}/{merged}") is not None:
        return False  # committed: the merge only goes forward
    mate = lookup(partner)
    return mate is not None and mate.state is State.OWNED and mate.dst == me
