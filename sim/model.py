"""The simulated traffic: topics with seeded Zipf rates, bundles as hash ranges over them, and multipliers
that change with time (``load_scale`` events, diurnal curves).

A topic's rate depends only on its namespace, index and the seed, so a bundle's load follows it from broker
to broker and splits divide it exactly. Bundle figures come from prefix sums over the topics sorted by hash:
``O(log topics)`` per bundle, which is what lets a 10 000-bundle cluster be sampled every few virtual
seconds at hundreds of times real time.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from trimtab.balance.load import BundleStats
from trimtab.channel.bundles import FULL_UPPER, BundleRange, parse_bundle, topic_hash
from trimtab.sim.scenario import Model, NamespaceSpec


@dataclass(frozen=True)
class _Topics:
    hashes: list[int]  # sorted
    rates: list[float]  # msg/s in, same order
    prefix: list[float]  # prefix[i] = sum(rates[:i])
    names: list[str]  # same order


def _topics(ns: NamespaceSpec, seed: int) -> _Topics:
    rng = random.Random(f"{seed}/{ns.name}")
    ranks = list(range(ns.topics))
    rng.shuffle(ranks)
    weights = [1.0 / (r + 1) ** ns.skew for r in ranks]
    total = math.fsum(weights) or 1.0
    if ns.hot_topic_share is not None and ns.topics > 1:
        # t-000000 carries the share; the others keep their Zipf proportions of the rest.
        rest = math.fsum(weights[1:]) or 1.0
        weights = [ns.hot_topic_share] + [w / rest * (1 - ns.hot_topic_share) for w in weights[1:]]
        total = 1.0
    names = [f"persistent://{ns.name}/t-{i:06d}" for i in range(ns.topics)]
    triples = sorted((topic_hash(n), ns.msg_rate * w / total, n) for n, w in zip(names, weights, strict=True))
    hashes = [h for h, _, _ in triples]
    rates = [r for _, r, _ in triples]
    return _Topics(hashes, rates, [0.0, *itertools.accumulate(rates)], [n for _, _, n in triples])


class LoadModel:
    def __init__(self, namespaces: list[NamespaceSpec], model: Model, seed: int) -> None:
        self.specs = {n.name: n for n in namespaces}
        self.model = model
        self._topics = {n.name: _topics(n, seed) for n in namespaces}
        self.scale: dict[str, float] = {n.name: 1.0 for n in namespaces}
        self._base: dict[str, tuple[float, int, str]] = {}
        self._stats: dict[tuple[str, bool], tuple[float, BundleStats]] = {}
        self._spare: dict[str, str] = {}

    def multiplier(self, namespace: str, now_s: float) -> float:
        m = self.scale[namespace]
        d = self.specs[namespace].diurnal
        if d is not None:
            m *= 1.0 + d.amplitude * math.sin(2 * math.pi * (now_s + d.phase_s) / d.period_s)
        return m

    def _slice(self, namespace: str, rng: BundleRange) -> tuple[int, int]:
        t = self._topics[namespace]
        lo = bisect.bisect_left(t.hashes, rng.lower)
        hi = len(t.hashes) if rng.upper == FULL_UPPER else bisect.bisect_left(t.hashes, rng.upper)
        return lo, hi

    def base(self, bundle: str) -> tuple[float, int, str]:
        """(msg/s in at multiplier 1, topics, namespace) of a bundle; cached (bundles are immutable ranges)."""
        got = self._base.get(bundle)
        if got is None:
            ns, rng = parse_bundle(bundle)
            lo, hi = self._slice(ns, rng)
            p = self._topics[ns].prefix
            got = (p[hi] - p[lo], hi - lo, ns)
            self._base[bundle] = got
        return got

    def topic_of(self, bundle: str) -> str:
        """A topic whose clients look the bundle up: its first topic, or -- a bundle with none -- a name
        that hashes into its range (found once, by counting)."""
        ns, rng = parse_bundle(bundle)
        lo, hi = self._slice(ns, rng)
        if lo < hi:
            return self._topics[ns].names[lo]
        if bundle not in self._spare:
            for i in itertools.count():
                name = f"persistent://{ns}/lookup-{i}"
                h = topic_hash(name)
                if rng.lower <= h < rng.upper or h == rng.upper == FULL_UPPER:
                    self._spare[bundle] = name
                    break
        return self._spare[bundle]

    def multipliers(self, now_s: float) -> dict[str, float]:
        return {ns: self.multiplier(ns, now_s) for ns in self.specs}

    def rate(self, bundle: str, now_s: float) -> float:
        """msg/s in (out is the same) right now."""
        r, _, ns = self.base(bundle)
        return r * self.multiplier(ns, now_s)

    def stats(self, bundle: str, now_s: float, *, topic_loads: bool = False) -> BundleStats:
        """The bundle's figures as a broker reports them (``topic_loads`` only when a split needs them).
        Kept while the namespace's multiplier does not change: a simulated broker reports every bundle it
        serves, every few virtual seconds."""
        rate_in, topics, ns = self.base(bundle)
        m = self.multiplier(ns, now_s)
        key = (bundle, topic_loads)
        kept = self._stats.get(key)
        if kept is not None and kept[0] == m:
            return kept[1]
        st = self._stats_now(bundle, rate_in, topics, ns, m, topic_loads=topic_loads)
        self._stats[key] = (m, st)
        return st

    def _stats_now(
        self, bundle: str, rate_in: float, topics: int, ns: str, m: float, *, topic_loads: bool
    ) -> BundleStats:
        rate = rate_in * m
        size = self.model.msg_size_bytes
        spt = self.model.sessions_per_topic
        loads: dict[int, tuple[float, float]] = {}
        if topic_loads:
            lo, hi = self._slice(ns, parse_bundle(bundle)[1])
            t = self._topics[ns]
            for h, r in zip(t.hashes[lo:hi], t.rates[lo:hi], strict=True):
                loads[h] = (r * m * 2, r * m * size * 2)
        return BundleStats(
            bundle=bundle,
            msg_rate_in=rate,
            msg_rate_out=rate,
            msg_throughput_in=rate * size,
            msg_throughput_out=rate * size,
            topics=topics,
            producers=topics * spt // 2,
            consumers=topics * (spt - spt // 2),
            topic_loads=loads,
        )


class Served:
    """The bundles one broker serves, with running per-namespace sums: a load sample costs one multiply per
    namespace instead of a walk over thousands of bundles, and the top-k candidates come from a per-namespace
    ranking kept until that namespace's set changes."""

    def __init__(self, model: LoadModel) -> None:
        self.model = model
        self._members: dict[str, set[str]] = {}
        self._rate: dict[str, float] = {}
        self._topics: dict[str, int] = {}
        self._ranked: dict[str, list[str]] = {}
        self._all: set[str] = set()  # every member, for membership tests (the engine asks them per record)
        self.version = 0  # bumped on every change of the members

    def __contains__(self, bundle: object) -> bool:
        return bundle in self._all

    def __iter__(self) -> Iterator[str]:
        for ns in sorted(self._members):
            yield from sorted(self._members[ns])

    def __len__(self) -> int:
        return sum(len(m) for m in self._members.values())

    def __bool__(self) -> bool:
        return any(self._members.values())

    def add(self, bundle: str) -> None:
        r, t, ns = self.model.base(bundle)
        m = self._members.setdefault(ns, set())
        if bundle in m:
            return
        m.add(bundle)
        self._all.add(bundle)
        self.version += 1
        self._rate[ns] = self._rate.get(ns, 0.0) + r
        self._topics[ns] = self._topics.get(ns, 0) + t
        self._ranked.pop(ns, None)

    def discard(self, bundle: str) -> None:
        r, t, ns = self.model.base(bundle)
        m = self._members.get(ns)
        if m is None or bundle not in m:
            return
        m.discard(bundle)
        self._all.discard(bundle)
        self.version += 1
        self._rate[ns] -= r
        self._topics[ns] -= t
        if not m:
            self._rate[ns] = 0.0  # no drift from float sums once empty
        self._ranked.pop(ns, None)

    def rate(self, now_s: float) -> float:
        """msg/s in right now."""
        return sum(max(0.0, r) * self.model.multiplier(ns, now_s) for ns, r in self._rate.items())

    def topics(self) -> int:
        return sum(self._topics.values())

    def heaviest(self, n: int, now_s: float) -> list[str]:
        """The ``n`` heaviest bundles right now (by rate, then name)."""
        base = self.model.base
        cands: list[tuple[float, str]] = []
        for ns, members in self._members.items():
            ranked = self._ranked.get(ns)
            if ranked is None:
                ranked = sorted(members, key=lambda b: (-base(b)[0], b))
                self._ranked[ns] = ranked
            mult = self.model.multiplier(ns, now_s)
            cands.extend((base(b)[0] * mult, b) for b in ranked[:n])
        cands.sort(key=lambda x: (-x[0], x[1]))
        return [b for _, b in cands[:n]]


def balanced_start(
    bundles: set[str], capacity: dict[str, float], rate: Callable[[str], float]
) -> dict[str, str]:
    """The scenario's initial owners: every bundle, largest first, on the broker least loaded for its
    capacity so far (a balanced cluster, as Pulsar's published tests start from)."""
    loads = dict.fromkeys(capacity, 0.0)
    owners = {}
    for bundle in sorted(bundles, key=lambda x: (-rate(x), x)):
        dst = min(loads, key=lambda x: (loads[x] / capacity[x], x))
        loads[dst] += rate(bundle) * 2
        owners[bundle] = dst
    return owners
