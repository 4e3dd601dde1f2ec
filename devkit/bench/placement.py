"""The placement benchmark (docs/benchmarks.md): candidates for 100 000 bundles under isolation policies,
failure domains and anti-affinity, against the < 1 s target; plus standby placement. Prints JSON."""

from __future__ import annotations

import os
import platform
import random
import time
from typing import Any

from trimtab.balance.placement import (
    Broker,
    IsolationPolicy,
    Placement,
    PlacementPolicy,
    StandbySpec,
    anti_affinity_filter,
    isolation_candidates,
    namespace_of,
)


def bench(bundles: int = 100_000, *, seed: int = 7) -> dict[str, Any]:
    """Time ``candidates`` for every bundle of a synthetic cluster with policies and anti-affinity.

    64 brokers in 4 failure domains; 2 000 namespaces of ``bundles / 2000`` bundles each, all owned; two
    isolation policies (one with secondaries, one failing over); half the namespaces in 100
    anti-affinity groups. Reports the build time (policy + ownership index) and the query passes: the first
    fills the memo, the second is the steady state, the third moves a bundle between every query (worst case
    for the memo). Figures are wall-clock seconds on this machine; not a unit test.
    """
    rng = random.Random(seed)
    brokers = [
        Broker(
            f"{'iso' if i < 8 else 'host'}{i}:8080", f"d{i % 4}", {"zone": f"z{i % 3}", "rack": f"r{i % 8}"}
        )
        for i in range(64)
    ]
    namespaces = [f"tenant{i % 20}/ns{i}" for i in range(2000)]
    per_ns = max(1, bundles // len(namespaces))
    names = [f"{ns}/0x{j:08x}_0x{j + 1:08x}" for ns in namespaces for j in range(per_ns)][:bundles]
    groups = {ns: f"g{i % 100}" for i, ns in enumerate(namespaces) if i % 2 == 0}
    policies = [
        IsolationPolicy(
            name="a-iso",
            namespaces=(r"tenant0/.*",),
            primary=(r"iso[0-3]",),
            secondary=(r"iso[4-7]",),
            min_limit=2,
        ),
        IsolationPolicy(
            name="b-iso",
            namespaces=(r"tenant1/.*",),
            primary=(r"iso9\d",),
            secondary=(r"iso[4-7]",),
            min_limit=1,
        ),
    ]
    t0 = time.perf_counter()
    policy = PlacementPolicy(
        brokers, failure_domains_enabled=True, anti_affinity_groups=groups, isolation_policies=policies
    )
    ids = list(policy.broker_ids)
    placement = Placement(policy, {b: rng.choice(ids) for b in names})
    t_build = time.perf_counter() - t0

    def one_pass() -> tuple[float, int]:
        # candidates for every bundle, as a shedding or healing pass would ask them
        total = 0
        t = time.perf_counter()
        for b in names:
            total += len(placement.candidates(b))
        return time.perf_counter() - t, total

    cold, total = one_pass()
    warm, _ = one_pass()
    moves = [rng.choice(ids) for _ in names]
    t = time.perf_counter()
    for b, to in zip(names, moves, strict=True):
        placement.candidates(b)
        placement.set_owner(b, to)
    churn = time.perf_counter() - t
    t = time.perf_counter()
    standbys = placement.standbys(names[:10_000], StandbySpec(2, ("zone", "rack")))
    standby_s = time.perf_counter() - t
    # a benchmark that measured wrong answers reports nothing: recheck a sample without the memo
    for b in rng.sample(names, min(500, len(names))):
        ns = namespace_of(b)
        expected = isolation_candidates(ns, policy.broker_ids, policy.isolation_policies)
        counts = placement.group_counts(b)
        if counts is not None:
            expected = anti_affinity_filter(expected, counts, policy.domain_of)
        if placement.candidates(b) != expected:
            raise AssertionError(f"bench: candidates of {b} differ from the unmemoised rules")
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "bench": "placement.candidates",
        "bundles": len(names),
        "brokers": len(brokers),
        "namespaces": len(namespaces),
        "build_s": round(t_build, 4),
        "candidates_cold_s": round(cold, 4),
        "candidates_warm_s": round(warm, 4),
        "candidates_with_moves_s": round(churn, 4),
        "target_candidates_s": 1.0,
        "mean_candidates": round(total / len(names), 2),
        "standbys_10k_bundles_2_replicas_s": round(standby_s, 4),
        "standbys_placed": sum(len(v) for v in standbys.values()),
        "environment": {
            "cpus": os.cpu_count(),
            "loadavg": load,
            "python": platform.python_version(),
        },
    }
