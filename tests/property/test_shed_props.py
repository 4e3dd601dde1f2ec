"""Properties of the shedders (docs/design.md 5.2) over random clusters, reports, ownership and memory."""

from __future__ import annotations

import copy
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trimtab.balance.load import BrokerLoadData, BundleStats, TopBundles
from trimtab.balance.shed import (
    ShedConfig,
    ShedResult,
    ShedState,
    Unload,
    threshold_shedder,
    transfer_shedder,
)

NOW = 5_000_000_000
IDS = [f"b{i}" for i in range(7)]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class Case:
    brokers: dict[str, bool]
    loads: dict[str, BrokerLoadData]
    top: dict[str, TopBundles]
    owners: dict[str, str | None]
    denied: frozenset[str]
    with_policies: frozenset[str]  # bundles whose namespace has an isolation policy or anti-affinity group
    state: ShedState
    cfg: ShedConfig

    def owner(self, bundle: str) -> str | None:
        return self.owners.get(bundle)

    def transferable(self, bundle: str, src: str, dst: str | None) -> bool:
        return bundle not in self.denied

    def has_policies(self, bundle: str) -> bool:
        return bundle in self.with_policies

    def run(self, fn: Any, state: ShedState | None = None) -> ShedResult:
        return fn(
            self.brokers,
            self.loads,
            self.top,
            self.owner,
            self.state if state is None else state,
            self.cfg,
            NOW,
            self.transferable,
            has_policies=self.has_policies,
        )

    def cooling(self) -> set[str]:
        return {
            b for b, t in self.state.recent_brokers.items() if NOW - t < self.cfg.broker_cooldown_s * 1000
        }

    def in_grace(self) -> set[str]:
        return {b for b, t in self.state.recent_bundles.items() if NOW - t <= self.cfg.bundle_grace_s * 1000}


@st.composite
def cases(draw: Any) -> Case:
    small = draw(st.integers(0, 9)) == 0
    ids = draw(st.lists(st.sampled_from(IDS), min_size=0 if small else 2, max_size=len(IDS), unique=True))
    brokers = {b: draw(st.integers(0, 4)) > 0 for b in ids}  # False: draining
    bundles: dict[str, list[BundleStats]] = {}
    owners: dict[str, str | None] = {}
    for b in ids:
        mine = []
        for i in range(draw(st.integers(0, 6))):
            name = f"{b}/{i}"
            tin = draw(st.sampled_from([0, 1, 10, 50, 100, 250, 500, 1000]))
            mine.append(
                BundleStats(bundle=name, msg_throughput_in=tin, msg_throughput_out=draw(st.integers(0, 9)))
            )
            # the channel mostly agrees with the report; sometimes the bundle moved or was unloaded
            owners[name] = draw(st.sampled_from([b, b, b, b, None, *ids]))
        bundles[b] = mine
    loads: dict[str, BrokerLoadData] = {}
    top: dict[str, TopBundles] = {}
    silent = draw(st.sampled_from(ids)) if ids and draw(st.integers(0, 9)) == 0 else None
    for b in ids:
        if b == silent:
            continue  # no report yet
        tput = sum(s.throughput for s in bundles[b])
        loads[b] = BrokerLoadData(
            broker=b,
            weighted_max_ema=draw(
                st.one_of(
                    st.sampled_from([0.0, 0.05, 0.1, 0.3, 0.5, 0.7, 0.86, 0.95, 1.2]),
                    st.floats(0.0, 1.2, allow_nan=False).map(lambda x: round(x, 3)),
                )
            ),
            msg_throughput_in=tput if draw(st.booleans()) else float(draw(st.integers(0, 5000))),
            msg_throughput_ema=float(draw(st.integers(0, 5000))),
            updated_at=NOW - draw(st.sampled_from([0, 1_000, 100_000, 170_000, 1_800_000, 1_800_001])),
        )
        if bundles[b] or draw(st.booleans()):
            top[b] = TopBundles(
                broker=b,
                bundles=sorted(bundles[b], key=lambda s: -s.throughput)[: draw(st.integers(0, 6))],
            )
    every = sorted(owners)
    denied = frozenset(draw(st.lists(st.sampled_from(every), max_size=3))) if every else frozenset()
    with_policies = frozenset(draw(st.lists(st.sampled_from(every), max_size=3))) if every else frozenset()
    recent_bundles = (
        {
            n: NOW - draw(st.sampled_from([0, 60_000, 1_800_000, 1_800_001]))
            for n in draw(st.lists(st.sampled_from(every), max_size=4))
        }
        if every
        else {}
    )
    recent_brokers = (
        {
            b: NOW - draw(st.sampled_from([0, 2_000, 150_000, 180_000, 500_000]))
            for b in draw(st.lists(st.sampled_from(ids), max_size=2))
        }
        if ids and draw(st.booleans())
        else {}
    )
    state = ShedState(
        hit_count=draw(st.integers(0, 5)), recent_bundles=recent_bundles, recent_brokers=recent_brokers
    )
    cfg = ShedConfig(
        target_std=draw(st.sampled_from([0.05, 0.25])),
        hit_count_threshold=draw(st.integers(0, 2)),
        max_broker_pairs=draw(st.integers(1, 3)),
        transfer=draw(st.booleans()),
        plan=draw(st.sampled_from(["to_target", "half_gap"])),
        threshold=draw(st.sampled_from([0.05, 0.1])),
        min_unload_throughput=draw(st.sampled_from([0.0, 100.0])),
        lower_boundary=draw(st.booleans()),
        shed_bundles_with_policies=draw(st.booleans()),
    )
    return Case(brokers, loads, top, owners, denied, with_policies, state, cfg)


def swaps(c: Case, res: ShedResult) -> list[Unload]:
    """The half-gap plan's swaps: bundles sent back from a pair's destination to its source. A swap batch
    comes just before the bundle it made room for, so a pair's last decision goes the forward way and
    those going the other way are the swaps. No other plan has any."""
    last: dict[frozenset[str | None], Unload] = {}
    for u in res.decisions:
        last[frozenset({u.src, u.dst})] = u
    return [u for u in res.decisions if u.src != last[frozenset({u.src, u.dst})].src]


def common_checks(c: Case, res: ShedResult) -> None:
    us = res.decisions
    # never the same bundle twice
    assert len({u.bundle for u in us}) == len(us)
    cooling, grace = c.cooling(), c.in_grace()
    back = swaps(c, res)
    assert not back or (c.cfg.plan == "half_gap" and c.cfg.transfer)
    for u in us:
        # owned by its source, per the channel, at decision time
        assert c.owner(u.bundle) == u.src
        # a bundle the source reported
        assert u.bundle in {s.bundle for s in c.top[u.src].bundles}
        assert u.throughput > 0
        assert u.bundle not in grace
        assert u.bundle not in c.denied
        assert c.cfg.shed_bundles_with_policies or u.bundle not in c.with_policies
        assert u.src not in cooling
        assert u.src in c.brokers
        if u.dst is not None:
            assert c.cfg.transfer
            assert u.dst != u.src
            assert c.brokers.get(u.dst) is True  # live and not draining
            assert u.dst not in cooling
            assert u.dst_load is not None
            assert u.src_load > u.dst_load or u in back  # a swap goes back up to the pair's source
    # no source loses all the bundles of its top-k report (a swap's source receives the pair's bundles)
    for src, n in Counter(u.src for u in us if u not in back).items():
        assert n < len(c.top[src].bundles)
    assert (res.result == "success") == bool(us)


@SETTINGS
@given(cases())
def test_transfer_shedder_invariants(c: Case) -> None:
    before = copy.deepcopy(c.state)
    res = c.run(transfer_shedder)
    c.state, after = before, c.state  # check against the memory the cycle started from
    common_checks(c, res)
    us = res.decisions
    back = swaps(c, res)
    srcs = {u.src for u in us if u not in back}
    assert len(srcs) <= c.cfg.max_broker_pairs
    if c.cfg.plan == "to_target":
        to_target_checks(c, res)
    else:
        half_gap_checks(c, res)
    dsts = [u.dst for u in us if u.dst is not None and u not in back]
    assert not srcs & set(dsts)  # a broker is a source or a destination, not both
    # the memory it keeps
    if us:
        assert after.hit_count == 0
        assert all(after.recent_bundles[u.bundle] == NOW for u in us)
        assert all(after.recent_brokers[u.src] == NOW for u in us)
    else:
        assert after.hit_count == res.hit_count
        if res.reason in ("no_brokers", "no_load_data", "stale_load_data") and not res.loads:
            assert after.hit_count == before.hit_count  # a cycle that never looked neither counts nor resets


def half_gap_checks(c: Case, res: ShedResult) -> None:
    """Pulsar's pairs: each source sheds to one destination, lightest bundles first, within half the pair's
    gap net of what the destination swapped back; a swap only when the next bundle would overshoot."""
    us, back = res.decisions, swaps(c, res)
    for src in {u.src for u in us if u not in back}:
        mine = [u for u in us if u.src == src]
        assert len({u.dst_load for u in mine}) == 1
        u0 = mine[0]
        assert u0.src_load == c.loads[src].weighted_max_ema
        assert u0.dst_load is not None
        if c.cfg.transfer:
            assert len({u.dst for u in mine}) == 1
        # the source's report read lightest first: what moved is a prefix of what could have moved
        assert [u.throughput for u in mine] == sorted(u.throughput for u in mine)
        gained = [u for u in back if u.dst == src]
        assert all(u.src == mine[0].dst for u in gained)
        if not gained:
            # half the gap: never more than T_max * (L_max - L_min) / 2 / L_max
            budget = c.loads[src].throughput * (u0.src_load - u0.dst_load) / 2 / u0.src_load
            assert sum(u.throughput for u in mine) <= budget * (1 + 1e-9)
    # a broker is in one pair at most
    pairs = [frozenset({u.src, u.dst or ""}) for u in us]
    for a in pairs:
        for b in pairs:
            assert a == b or not (a & b) - {""}


def to_target_checks(c: Case, res: ShedResult) -> None:
    """Replays the cycle's projection: every move was needed, went to the least loaded broker that may
    take load, and fitted within half that pair's gap."""
    load = dict(res.loads)
    tput = {b: c.loads[b].throughput for b in load}
    ema = {b: c.loads[b].msg_throughput_ema for b in load}
    cooling = c.cooling()
    m = min(0.5, max(0.0, c.cfg.target_std / 2))
    sources: set[str] = set()
    for u in res.decisions:
        n = len(load)
        avg = sum(load.values()) / n
        std = math.sqrt(max(0.0, sum(v * v for v in load.values()) / n - avg * avg))
        dests = [b for b in load if c.brokers.get(b) and b not in cooling and b not in sources]
        lo = min(dests, key=lambda b: (load[b], b))
        underloaded = load[lo] < avg * m or ema[lo] < max(ema.values()) * m
        overloaded = any(v > c.cfg.overload_threshold and v > avg + c.cfg.target_std for v in load.values())
        assert std > c.cfg.target_std or underloaded or overloaded, "a move after the target was met"
        assert u.dst == (lo if c.cfg.transfer else None)
        assert u.src_load == load[u.src] and u.dst_load == load[lo]
        per_byte = load[u.src] / (ema[u.src] if ema[u.src] > 0 else tput[u.src])
        shift = u.throughput * per_byte
        assert shift <= (load[u.src] - load[lo]) / 2 * (1 + 1e-9) + 1e-12, "a move that overshoots its pair"
        load[u.src] -= shift
        load[lo] += shift
        for proj in (tput, ema):
            proj[u.src] -= u.throughput
            proj[lo] += u.throughput
        sources.add(u.src)


@SETTINGS
@given(cases())
def test_threshold_shedder_invariants(c: Case) -> None:
    before = copy.deepcopy(c.state)
    res = c.run(threshold_shedder)
    c.state = before
    common_checks(c, res)
    for u in res.decisions:
        if u.reason == "overloaded":
            assert u.src_load >= res.avg + c.cfg.threshold - 1e-12
        else:
            # lower-boundary shedding: only when on, nothing else shed, and some broker below the line;
            # the most loaded broker with two or more reported bundles (not cooling) sheds, and only it
            assert c.cfg.lower_boundary and u.reason == "underloaded"
            assert {(v.reason, v.src) for v in res.decisions} == {("underloaded", u.src)}
            assert u.src_load > res.avg - c.cfg.threshold
            assert min(res.loads.values()) < res.avg - c.cfg.threshold
            able = [b for b in res.loads if b not in c.cooling() and b in c.top and len(c.top[b].bundles) > 1]
            assert u.src_load == max(res.loads[b] for b in able)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_shedders_are_pure(c: Case) -> None:
    for fn in (transfer_shedder, threshold_shedder):
        s1, s2 = copy.deepcopy(c.state), copy.deepcopy(c.state)
        r1, r2 = c.run(fn, s1), c.run(fn, s2)
        assert r1 == r2
        assert s1 == s2
