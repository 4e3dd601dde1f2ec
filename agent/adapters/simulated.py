"""The built-in simulated broker, used by the local cluster, the tests and the benchmarks.

Each namespace has ``topics_per_namespace`` synthetic topics (``<domain>://<ns>/t-0000`` ...) whose message
rates follow a seeded Zipf distribution. A topic's load depends only on its name and the settings, so a
bundle's load follows the bundle from broker to broker and every simulated broker agrees on it.

The broker keeps a timeline of every acquire/fence/close/expire with ``time.monotonic_ns()``, which on
Linux is one clock for every process on the machine: tests and the chaos suite merge the timelines of all
brokers and check that no bundle was ever served by two of them at once. Faults can be injected (fail the
next N calls of an operation, add latency).

Leases (docs/broker-adapter.md): every served or fenced bundle has a deadline; when it passes, the bundle
stops being served without anyone telling the broker, and the timeline gets an ``expire`` event stamped
with the deadline itself. The broker has no timer thread: every call and every inspection first retires
the leases that ran out (a heap keyed by deadline), so whatever is observed is exactly what a broker with
perfect timers would show.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import heapq
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from trimtab.agent.adapters.base import BrokerSample, Lease
from trimtab.balance.load import BundleStats, Usage
from trimtab.channel.bundles import (
    FULL_UPPER,
    BundleRange,
    merged_range,
    parse_bundle,
    split_range,
    topic_hash,
)
from trimtab.config.settings import SimulationSettings
from trimtab.errors import AdapterError, BundleError, LeaseRefused

DOMAIN = "persistent"


@dataclass(frozen=True, slots=True)
class SyntheticTopic:
    name: str
    hash: int
    msg_rate: float  # in; out is the same


@functools.lru_cache(maxsize=4096)
def _namespace_topics(
    namespace: str, count: int, rate: float, skew: float, seed: int
) -> tuple[SyntheticTopic, ...]:
    rng = random.Random(f"{seed}/{namespace}")
    ranks = list(range(count))
    rng.shuffle(ranks)
    weights = [1.0 / (r + 1) ** skew for r in ranks]
    mean = sum(weights) / count
    out = []
    for i, w in enumerate(weights):
        name = f"{DOMAIN}://{namespace}/t-{i:04d}"
        out.append(SyntheticTopic(name, topic_hash(name), rate * w / mean))
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _sorted_topics(
    namespace: str, count: int, rate: float, skew: float, seed: int
) -> tuple[list[int], list[SyntheticTopic]]:
    ordered = sorted(_namespace_topics(namespace, count, rate, skew, seed), key=lambda t: t.hash)
    return [t.hash for t in ordered], ordered


class LoadModel:
    """The synthetic load of every topic; ``scale`` and per-namespace multipliers change at runtime."""

    def __init__(self, settings: SimulationSettings) -> None:
        self.s = settings
        self.scale = 1.0
        self.namespace_scale: dict[str, float] = dict(settings.namespace_scale)

    def topics(self, namespace: str) -> tuple[SyntheticTopic, ...]:
        s = self.s
        return _namespace_topics(namespace, s.topics_per_namespace, s.msg_rate_per_topic, s.skew, s.seed)

    def _by_hash(self, namespace: str) -> tuple[list[int], list[SyntheticTopic]]:
        s = self.s
        return _sorted_topics(namespace, s.topics_per_namespace, s.msg_rate_per_topic, s.skew, s.seed)

    def bundle_stats(self, bundle: str) -> BundleStats:
        ns, rng = parse_bundle(bundle)
        mult = self.scale * self.namespace_scale.get(ns, 1.0)
        size = self.s.msg_size_bytes
        hashes, topics = self._by_hash(ns)
        # Only the topics inside the range (a sample covers every bundle a broker serves: thousands).
        hi = len(hashes) if rng.upper == FULL_UPPER else bisect.bisect_left(hashes, rng.upper)
        inside = topics[bisect.bisect_left(hashes, rng.lower) : hi]
        rate = sum(t.msg_rate for t in inside) * mult
        return BundleStats(
            bundle=bundle,
            msg_rate_in=rate,
            msg_rate_out=rate,
            msg_throughput_in=rate * size,
            msg_throughput_out=rate * size,
            topics=len(inside),
            producers=len(inside) * self.s.sessions_per_topic // 2,
            consumers=len(inside) * (self.s.sessions_per_topic - self.s.sessions_per_topic // 2),
            topic_loads={t.hash: (t.msg_rate * mult * 2, t.msg_rate * mult * size * 2) for t in inside},
        )


def check_merge_names(parents: Sequence[str], merged: str) -> tuple[str, str]:
    """The two parents of a merge into ``merged``, lower range first; :class:`BundleError` unless they are
    exactly two adjacent bundles of one namespace whose union is ``merged`` (what every broker checks
    before it merges anything)."""
    if len(parents) != 2:
        raise BundleError(f"a merge joins exactly two bundles, not {len(parents)}")
    ns, into = parse_bundle(merged)
    (ns_a, a), (ns_b, b) = parse_bundle(parents[0]), parse_bundle(parents[1])
    if ns_a != ns or ns_b != ns:
        raise BundleError(f"{parents[0]} and {parents[1]} do not both belong to {merged}'s namespace")
    if merged_range(a, b) != into:
        raise BundleError(f"{a} and {b} together are {merged_range(a, b)}, not {into}")
    return (parents[0], parents[1]) if a < b else (parents[1], parents[0])


class TimelineEvent(msgspec.Struct, frozen=True):
    mono_ns: int
    wall_ms: int
    op: str  # acquire | fence | close | expire | prewarm | split | merge
    bundle: str
    detail: str | None = None


class SimulatedBroker:
    """A broker that serves bundles in memory. Thread-safe (the HTTP API and the agent share it)."""

    kind = "simulated"

    def __init__(
        self,
        broker_id: str,
        settings: SimulationSettings,
        *,
        cpu_cores: float = 4.0,
        memory_bytes: float = 8 << 30,
        bandwidth_in: float = 125e6,
        bandwidth_out: float = 125e6,
    ) -> None:
        self.broker_id = broker_id
        self.model = LoadModel(settings)
        self.settings = settings
        self.cpu_cores = cpu_cores
        self.memory_bytes = memory_bytes
        self.bandwidth_in = bandwidth_in
        self.bandwidth_out = bandwidth_out
        self.serving: set[str] = set()
        self.fenced: set[str] = set()
        self.prewarmed: set[str] = set()
        self.timeline: list[TimelineEvent] = []
        self.deadline_ns: dict[str, int] = {}  # served, fenced or acquiring bundle -> end of its lease
        self.acquiring: set[str] = set()  # acquisitions under way (renewable like served bundles)
        self._deadlines: list[tuple[int, str]] = []  # heap; entries outdated by a renewal are skipped
        self.calls: Counter[str] = Counter()
        self._fail_next: Counter[str] = Counter()
        self.extra_latency_s = 0.0
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ fault injection
    def fail_next(self, op: str, times: int = 1) -> None:
        with self._lock:
            self._fail_next[op] += times

    async def _enter(self, op: str, delay_ms: float = 0.0) -> None:
        delay = self.extra_latency_s + delay_ms / 1000.0
        if delay > 0:
            await asyncio.sleep(delay)
        with self._lock:
            self.calls[op] += 1
            if self._fail_next[op] > 0:
                self._fail_next[op] -= 1
                raise AdapterError(f"simulated {op} failure (injected)")

    def _record(self, op: str, bundle: str, detail: str | None = None, at_ns: int | None = None) -> None:
        now = time.monotonic_ns()
        at = now if at_ns is None else at_ns
        wall = int(time.time() * 1000) - (now - at) // 1_000_000
        self.timeline.append(TimelineEvent(at, wall, op, bundle, detail))

    # ------------------------------------------------------------------ leases (callers hold the lock)
    def _set_lease(self, bundle: str, deadline: int) -> None:
        self.deadline_ns[bundle] = deadline
        heapq.heappush(self._deadlines, (deadline, bundle))

    def _expire(self, now: int) -> None:
        """Retire every lease that ran out by ``now``, in deadline order, stamped with its deadline."""
        heap = self._deadlines
        if not self.settings.honour_leases:
            return
        while heap and heap[0][0] <= now:
            deadline, bundle = heapq.heappop(heap)
            if self.deadline_ns.get(bundle) != deadline:
                continue  # renewed or released since
            del self.deadline_ns[bundle]
            if bundle in self.serving or bundle in self.fenced:
                self.serving.discard(bundle)
                self.fenced.discard(bundle)
                self._record("expire", bundle, None, deadline)

    @staticmethod
    def _check_fresh(op: str, lease: Lease) -> None:
        late_ms = int(time.time() * 1000) - lease.apply_by_ms
        if late_ms > 0:
            raise LeaseRefused(f"{op}: lease request arrived {late_ms} ms after its apply_by_ms; refused")

    # ------------------------------------------------------------------ the adapter contract
    async def sample(self) -> BrokerSample:
        await self._enter("sample")
        with self._lock:
            self._expire(time.monotonic_ns())
            bundles = [self.model.bundle_stats(b) for b in sorted(self.serving)]
        rate = sum(b.msg_rate for b in bundles)
        t_in = sum(b.msg_throughput_in for b in bundles)
        t_out = sum(b.msg_throughput_out for b in bundles)
        topics = sum(b.topics for b in bundles)
        cpu = self.cpu_cores * rate / self.settings.capacity_msg_rate
        mem = min(self.memory_bytes, 256e6 + topics * 2e6)
        return BrokerSample(
            cpu=Usage(cpu, self.cpu_cores),
            memory=Usage(mem, self.memory_bytes),
            bandwidth_in=Usage(t_in, self.bandwidth_in),
            bandwidth_out=Usage(t_out, self.bandwidth_out),
            bundles=bundles,
        )

    async def acquire(self, bundle: str, lease: Lease) -> None:
        self._check_fresh("acquire", lease)
        received = time.monotonic_ns()
        deadline = received + int(lease.seconds * 1e9)
        with self._lock:
            warm = bundle in self.prewarmed
            # The lease covers the acquisition too: renewals during a slow acquire extend it.
            self.acquiring.add(bundle)
            if deadline > self.deadline_ns.get(bundle, 0):
                self._set_lease(bundle, deadline)
        s = self.settings
        try:
            await self._enter("acquire", s.warm_acquire_delay_ms if warm else s.acquire_delay_ms)
        finally:
            with self._lock:
                self.acquiring.discard(bundle)
        with self._lock:
            now = time.monotonic_ns()
            deadline = max(deadline, self.deadline_ns.get(bundle, 0))
            self._expire(now)
            if now >= deadline:
                raise LeaseRefused(f"acquire {bundle}: the lease ran out while the bundle was being acquired")
            if bundle not in self.serving:
                self.serving.add(bundle)
                self.fenced.discard(bundle)
                self.prewarmed.discard(bundle)
                self._record("acquire", bundle)
            self._set_lease(bundle, max(deadline, self.deadline_ns.get(bundle, 0)))

    async def renew(self, bundles: Sequence[str], lease: Lease) -> list[str]:
        self._check_fresh("renew", lease)
        await self._enter("renew")
        with self._lock:
            now = time.monotonic_ns()
            self._expire(now)
            deadline = now + int(lease.seconds * 1e9)
            missing = []
            for b in bundles:
                if b in self.serving or b in self.acquiring:
                    if deadline > self.deadline_ns.get(b, 0):
                        self._set_lease(b, deadline)
                else:
                    missing.append(b)
            return missing

    async def fence(self, bundle: str) -> None:
        await self._enter("fence", self.settings.release_delay_ms)
        with self._lock:
            self._expire(time.monotonic_ns())
            if bundle in self.serving:
                self.serving.discard(bundle)
                self.fenced.add(bundle)
                self._record("fence", bundle)

    async def close(self, bundle: str, redirect_url: str | None) -> None:
        await self._enter("close", self.settings.release_delay_ms)
        with self._lock:
            self._expire(time.monotonic_ns())
            self.deadline_ns.pop(bundle, None)
            if bundle in self.serving or bundle in self.fenced:
                self.serving.discard(bundle)
                self.fenced.discard(bundle)
                self._record("close", bundle, redirect_url)

    async def prewarm(self, bundle: str) -> None:
        await self._enter("prewarm")
        with self._lock:
            self._expire(time.monotonic_ns())
            if bundle not in self.prewarmed and bundle not in self.serving:
                self.prewarmed.add(bundle)
                self._record("prewarm", bundle)

    async def split(self, bundle: str, children: list[str]) -> None:
        await self._enter("split")
        _, parent = parse_bundle(bundle)
        ranges = sorted(BundleRange.parse(c.rsplit("/", 1)[-1]) for c in children)
        # Children must tile the parent; the broker's topics move to the children in place (the parent's
        # serving interval ends, each child's starts, at the same instant -- no client is disconnected).
        split_range(parent, [r.lower for r in ranges[1:]])
        with self._lock:
            self._expire(time.monotonic_ns())
            was_serving = bundle in self.serving
            self.serving.discard(bundle)
            deadline = self.deadline_ns.pop(bundle, None)
            self._record("split", bundle, ",".join(children))
            if was_serving:
                for child in children:
                    if child not in self.serving:
                        self.serving.add(child)
                        self._record("acquire", child, f"split from {bundle}")
                    if deadline is not None:  # the children inherit the parent's lease
                        self._set_lease(child, max(deadline, self.deadline_ns.get(child, 0)))

    async def merge(self, parents: list[str], merged: str) -> None:
        """Serve the two adjacent ``parents`` as the one bundle ``merged``, their union, in place: each
        parent's serving interval ends (a ``merge`` event) and the merged bundle's starts at the same
        instant, so no client is disconnected. :class:`BundleError` unless the parents are exactly two
        adjacent bundles of one namespace whose union is ``merged``.

        The merged bundle is served only if BOTH parents were: a merge grants no lease (only acquire and
        renew do), so the merged bundle runs under the shorter of the parents' leases -- it must not be
        served longer than either allowed -- and a parent not served (its lease lapsed, or an override
        moved the merge to this broker) has none to give. Then the parents are dropped all the same and
        nothing new is served: the agent's renewal finds the merged bundle not served and acquires it
        under a fresh lease (the ordinary owned-but-not-serving path). Idempotent: once neither parent is
        served, fenced or leased (merged already, or a retry after a lost answer), nothing happens."""
        await self._enter("merge")
        first, second = check_merge_names(parents, merged)
        with self._lock:
            self._expire(time.monotonic_ns())
            pair = (first, second)
            if not any(p in self.serving or p in self.fenced or p in self.deadline_ns for p in pair):
                return  # done already
            both = all(p in self.serving for p in pair)
            leases = [self.deadline_ns[p] for p in pair if p in self.deadline_ns]
            deadline = min(leases) if len(leases) == len(pair) else None
            for p in pair:
                self.serving.discard(p)
                self.fenced.discard(p)
                self.prewarmed.discard(p)
                self.deadline_ns.pop(p, None)  # its heap entry is skipped when it comes up
                self._record("merge", p, merged)
            if both:
                if merged not in self.serving:
                    self.serving.add(merged)
                    self.fenced.discard(merged)
                    self.prewarmed.discard(merged)
                    self._record("acquire", merged, f"merged from {first},{second}")
                if deadline is not None:
                    self._set_lease(merged, max(deadline, self.deadline_ns.get(merged, 0)))

    async def aclose(self) -> None:
        return None

    # ------------------------------------------------------------------ inspection
    def snapshot(self) -> dict[str, object]:
        with self._lock:
            now = time.monotonic_ns()
            self._expire(now)
            return {
                "mono_ns": now,
                "leases": {b: round((d - now) / 1e9, 3) for b, d in sorted(self.deadline_ns.items())},
                "broker": self.broker_id,
                "serving": sorted(self.serving),
                "fenced": sorted(self.fenced),
                "prewarmed": sorted(self.prewarmed),
                "calls": dict(self.calls),
                "timeline": [msgspec.structs.asdict(e) for e in self.timeline],
            }
