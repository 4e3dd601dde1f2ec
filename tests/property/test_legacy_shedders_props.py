"""Properties of Pulsar's modular-load-manager shedders (sim/legacy.py) over random clusters.

The channel's ownership is the truth here: each broker owns a set of bundles (``owned``) and reports their
count; its top-bundles report lists some of them (the busy ones, maybe not all) and sometimes stale entries
for bundles that moved away or were unloaded. Usages go above 100%, throughputs and rates to zero, and the
thresholds down to where everything triggers.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trimtab.balance.load import BrokerLoadData, BundleStats, TopBundles, Usage, Weights, with_ema
from trimtab.balance.shed import ShedConfig, ShedResult, ShedState
from trimtab.sim.legacy import (
    LegacyConfig,
    legacy_threshold_shedder,
    overload_shedder,
    uniform_load_shedder,
)

NOW = 5_000_000_000
M = 1024 * 1024
IDS = [f"b{i}" for i in range(6)]
SHEDDERS = [overload_shedder, legacy_threshold_shedder, uniform_load_shedder]
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class Case:
    brokers: dict[str, bool]
    loads: dict[str, BrokerLoadData]
    top: dict[str, TopBundles]
    owners: dict[str, str | None]
    owned: dict[str, set[str]]
    denied: frozenset[str]
    state: ShedState
    cfg: ShedConfig
    legacy: LegacyConfig

    def owner(self, bundle: str) -> str | None:
        return self.owners.get(bundle)

    def transferable(self, bundle: str, src: str, dst: str | None) -> bool:
        assert dst is None  # legacy shedders only ever ask about plain unloads
        return bundle not in self.denied

    def run(self, fn: Any, state: ShedState) -> ShedResult:
        res: ShedResult = fn(
            self.brokers,
            self.loads,
            self.top,
            self.owner,
            state,
            self.cfg,
            NOW,
            self.transferable,
            legacy=self.legacy,
        )
        return res

    def in_grace(self) -> set[str]:
        return {b for b, t in self.state.recent_bundles.items() if NOW - t <= self.cfg.bundle_grace_s * 1000}


@st.composite
def cases(draw: Any) -> Case:
    small = draw(st.integers(0, 9)) == 0
    ids = draw(st.lists(st.sampled_from(IDS), min_size=0 if small else 2, max_size=len(IDS), unique=True))
    brokers = {b: draw(st.booleans()) for b in ids}  # False: draining (still a source)
    owners: dict[str, str | None] = {}
    owned: dict[str, set[str]] = {b: set() for b in ids}
    stats: dict[str, list[BundleStats]] = {}
    for b in ids:
        mine = []
        for i in range(draw(st.integers(0, 5))):
            name = f"{b}/{i}"
            mine.append(
                BundleStats(
                    bundle=name,
                    msg_throughput_in=draw(st.sampled_from([0, 1, 5, 20, 50, 100])) * M,
                    msg_throughput_out=float(draw(st.integers(0, 9))),
                    msg_rate_in=float(draw(st.sampled_from([0, 10, 500, 1000, 3000, 8000]))),
                )
            )
            # mostly still the reporter's; sometimes moved to another broker or unloaded (stale entry)
            o = draw(st.sampled_from([b, b, b, None, *ids]))
            owners[name] = o
            if o is not None:
                owned[o].add(name)
        stats[b] = mine
    # bundles a broker owns that its report does not list (idle, or beyond the top k)
    for b in ids:
        for i in range(draw(st.integers(0, 2))):
            owners[f"{b}/idle{i}"] = b
            owned[b].add(f"{b}/idle{i}")
    loads: dict[str, BrokerLoadData] = {}
    top: dict[str, TopBundles] = {}
    for b in ids:
        if draw(st.integers(0, 9)) == 0:
            continue  # no report yet
        sample = BrokerLoadData(
            broker=b,
            cpu=Usage(float(draw(st.sampled_from([0, 1, 12, 30, 50, 84, 85, 90, 99, 100, 150]))), 100.0),
            bandwidth_out=Usage(float(draw(st.sampled_from([0, 40, 95]))), 100.0),
            msg_throughput_in=float(draw(st.sampled_from([0, 1, 10, 100, 400, 2000]))) * M,
            msg_rate_in=float(draw(st.sampled_from([0, 100, 1000, 5000, 20000]))),
            bundles=len(owned[b]),  # the truth, as the broker counts it
            updated_at=NOW - draw(st.sampled_from([0, 1_000, 1_800_000, 1_800_001])),
        )
        loads[b] = with_ema(sample, None, Weights(), 0.9)
        if stats[b] or draw(st.booleans()):
            top[b] = TopBundles(broker=b, bundles=draw(st.permutations(stats[b])))
    every = sorted(owners)
    denied = frozenset(draw(st.lists(st.sampled_from(every), max_size=3))) if every else frozenset()
    recent_bundles = (
        {
            n: NOW - draw(st.sampled_from([0, 60_000, 1_800_000, 1_800_001]))
            for n in draw(st.lists(st.sampled_from(every), max_size=4))
        }
        if every
        else {}
    )
    usage_ema = {b: draw(st.sampled_from([0.0, 0.2, 0.6, 1.0])) for b in ids if draw(st.booleans())}
    state = ShedState(recent_bundles=recent_bundles, usage_ema=usage_ema)
    legacy = LegacyConfig(
        overload_threshold=draw(st.sampled_from([0.5, 0.85])),
        threshold=draw(st.sampled_from([0.0, 0.05, 0.1])),
        min_throughput=draw(st.sampled_from([0.0, 10 * M])),
        lower_boundary_shedding=draw(st.booleans()),
        msg_rate_difference_pct=draw(st.sampled_from([0.0, 10.0, 50.0])),
        throughput_multiplier=draw(st.sampled_from([0.0, 1.5, 4.0])),
        max_unload_percentage=draw(st.sampled_from([0.2, 1.0])),
        min_unload_message=draw(st.sampled_from([0.0, 1000.0])),
        min_unload_throughput=draw(st.sampled_from([0.0, float(M)])),
        max_unload_bundles=draw(st.sampled_from([-1, 1, 2])),
    )
    return Case(brokers, loads, top, owners, owned, denied, state, ShedConfig(), legacy)


def check(c: Case, res: ShedResult) -> None:
    us = res.decisions
    assert len({u.bundle for u in us}) == len(us)  # each bundle at most once
    grace = c.in_grace()
    for u in us:
        assert u.dst is None  # plain unloads
        assert c.owner(u.bundle) == u.src  # only a bundle the source owns, per the channel
        assert u.bundle not in grace
        assert u.bundle not in c.denied
        assert u.src in c.brokers and u.src in c.loads
        assert u.bundle in {s.bundle for s in c.top[u.src].bundles}
    # never a broker's last bundle
    for src, n in Counter(u.src for u in us).items():
        assert n < len(c.owned[src])
    assert (res.result == "success") == bool(us)
    assert res.reason


@SETTINGS
@given(cases())
def test_overload_shedder_invariants(c: Case) -> None:
    res = c.run(overload_shedder, copy.deepcopy(c.state))
    check(c, res)
    for u in res.decisions:
        assert u.src_load >= c.legacy.overload_threshold


@SETTINGS
@given(cases())
def test_threshold_shedder_invariants(c: Case) -> None:
    state = copy.deepcopy(c.state)
    res = c.run(legacy_threshold_shedder, state)
    check(c, res)
    # its own EMA: updated for every broker of the population, kept for the others
    for b, v in c.state.usage_ema.items():
        if b not in res.loads:
            assert state.usage_ema[b] == v
    assert set(res.loads) <= set(state.usage_ema)
    for u in res.decisions:
        if u.reason == "overloaded":
            assert u.src_load >= res.avg + c.legacy.threshold - 1e-12
        else:
            assert c.legacy.lower_boundary_shedding and u.reason == "underloaded"


@SETTINGS
@given(cases())
def test_uniform_shedder_invariants(c: Case) -> None:
    res = c.run(uniform_load_shedder, copy.deepcopy(c.state))
    check(c, res)
    assert len({u.src for u in res.decisions}) <= 1  # one broker per cycle
    if c.legacy.max_unload_bundles != -1:
        assert len(res.decisions) <= c.legacy.max_unload_bundles


@SETTINGS
@given(cases())
def test_deterministic_and_remembered(c: Case) -> None:
    for fn in SHEDDERS:
        s1, s2 = copy.deepcopy(c.state), copy.deepcopy(c.state)
        r1, r2 = c.run(fn, s1), c.run(fn, s2)
        assert r1 == r2 and s1 == s2
        # moves are remembered: grace period for each bundle, the source's last shed
        for u in r1.decisions:
            assert s1.recent_bundles[u.bundle] == NOW and s1.recent_brokers[u.src] == NOW
        # moves older than the grace period are forgotten
        assert all(NOW - t <= c.cfg.bundle_grace_s * 1000 for t in s1.recent_bundles.values())
