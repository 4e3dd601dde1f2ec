"""Which of its own bundles an agent should split this cycle (docs/design.md section 5.3). Pure.

A bundle is split when, for more than ``hit_count_threshold`` consecutive checks, it exceeds one of the
limits (first match names the reason): topics, sessions, message rate, bandwidth. Namespaces stay under
``max_bundles_per_namespace`` and at most ``max_splits_per_cycle`` splits are decided per cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from trimtab.balance.load import BundleStats
from trimtab.channel.bundles import BundleRange, parse_bundle, split_boundaries, split_range
from trimtab.config.settings import Settings

MB = 1024 * 1024


@dataclass(frozen=True)
class SplitLimits:
    max_topics: int = 1000
    max_sessions: int = 1000
    max_msg_rate: float = 30_000
    max_bandwidth_mbytes: float = 100
    hit_count_threshold: int = 3
    max_bundles_per_namespace: int = 128
    max_splits_per_cycle: int = 10
    algorithm: str = "range_equally_divide"
    flow_or_qps_diff_threshold_pct: float = 10.0
    hot_topic_share: float | None = None

    @classmethod
    def from_settings(cls, s: Settings) -> SplitLimits:
        sp = s.split
        return cls(
            max_topics=sp.max_topics,
            max_sessions=sp.max_sessions,
            max_msg_rate=sp.max_msg_rate,
            max_bandwidth_mbytes=sp.max_bandwidth_mbytes,
            hit_count_threshold=sp.hit_count_threshold,
            max_bundles_per_namespace=sp.max_bundles_per_namespace,
            max_splits_per_cycle=sp.max_splits_per_cycle,
            algorithm=sp.algorithm,
            flow_or_qps_diff_threshold_pct=sp.flow_or_qps_diff_threshold_pct,
            hot_topic_share=sp.hot_topic_share,
        )


@dataclass(frozen=True)
class SplitDecision:
    bundle: str
    reason: str  # topics | sessions | msg_rate | bandwidth | admin
    children: tuple[BundleRange, ...]


def over_limit(s: BundleStats, lim: SplitLimits) -> str | None:
    if s.topics > lim.max_topics:
        return "topics"
    if lim.max_sessions > 0 and s.sessions > lim.max_sessions:
        return "sessions"
    if s.msg_rate > lim.max_msg_rate:
        return "msg_rate"
    if s.throughput > lim.max_bandwidth_mbytes * MB:
        return "bandwidth"
    return None


def hot_topic(s: BundleStats, share: float) -> int | None:
    """The hash of the topic carrying at least ``share`` of ``s``'s message rate or throughput, if one does
    (the largest such), else None."""
    if not s.topic_loads or len(s.topic_loads) < 2:
        return None
    rate = sum(r for r, _ in s.topic_loads.values())
    tput = sum(t for _, t in s.topic_loads.values())
    best = max(
        s.topic_loads.items(),
        key=lambda kv: (max(kv[1][0] / rate if rate else 0, kv[1][1] / tput if tput else 0), -kv[0]),
    )
    h, (r, t) = best
    return h if (rate and r / rate >= share) or (tput and t / tput >= share) else None


def around(rng: BundleRange, h: int) -> list[int]:
    """Boundaries that give hash ``h`` a child range of its own: [h, h + 1), clipped to ``rng``."""
    return [c for c in (h, h + 1) if rng.lower < c < rng.upper]


def children_for(
    s: BundleStats, lim: SplitLimits, algorithm: str | None = None, positions: tuple[int, ...] = ()
) -> tuple[BundleRange, ...]:
    """The child ranges of ``s.bundle`` under an algorithm; empty when it cannot be split that way. With
    ``lim.hot_topic_share`` set and no explicit algorithm, a dominant topic is cut out on its own first."""
    _, rng = parse_bundle(s.bundle)
    if algorithm is None and lim.hot_topic_share is not None:
        h = hot_topic(s, lim.hot_topic_share)
        if h is not None and rng.contains(h):
            cuts = around(rng, h)
            if cuts:
                return tuple(split_range(rng, cuts))
    cuts = split_boundaries(
        algorithm or lim.algorithm,
        rng,
        topic_hashes=s.topic_loads.keys(),
        positions=positions,
        topic_loads=s.topic_loads,
        max_msg_rate=lim.max_msg_rate,
        max_bandwidth_bytes=lim.max_bandwidth_mbytes * MB,
        diff_threshold_pct=lim.flow_or_qps_diff_threshold_pct,
    )
    return tuple(split_range(rng, cuts)) if cuts else ()


@dataclass
class SplitCycle:
    decisions: list[SplitDecision]
    hits: dict[str, int]
    skipped: list[tuple[str, str]]  # (bundle, reason)


def decide_splits(
    stats: list[BundleStats],
    hits: Mapping[str, int],
    lim: SplitLimits,
    *,
    namespace_bundles: Mapping[str, int],
    owned: set[str],
) -> SplitCycle:
    """One split cycle over this broker's bundle stats. ``hits`` is the previous cycle's counters."""
    new_hits: dict[str, int] = {}
    decisions: list[SplitDecision] = []
    skipped: list[tuple[str, str]] = []
    planned: dict[str, int] = {}
    for s in sorted(stats, key=lambda x: (-x.throughput, x.bundle)):
        if s.bundle not in owned:
            continue
        reason = over_limit(s, lim)
        if reason is None:
            continue
        count = hits.get(s.bundle, 0) + 1
        new_hits[s.bundle] = count
        if count <= lim.hit_count_threshold:
            skipped.append((s.bundle, "hit_count"))
            continue
        if s.topics < 2:
            skipped.append((s.bundle, "single_topic"))
            continue
        if len(decisions) >= lim.max_splits_per_cycle:
            skipped.append((s.bundle, "cycle_limit"))
            continue
        ns = parse_bundle(s.bundle)[0]
        children = children_for(s, lim)
        if not children:
            skipped.append((s.bundle, "no_boundary"))
            continue
        total = namespace_bundles.get(ns, 1) + planned.get(ns, 0) + len(children) - 1
        if total > lim.max_bundles_per_namespace:
            skipped.append((s.bundle, "namespace_limit"))
            continue
        planned[ns] = planned.get(ns, 0) + len(children) - 1
        decisions.append(SplitDecision(s.bundle, reason, children))
        new_hits.pop(s.bundle, None)
    return SplitCycle(decisions, new_hits, skipped)
