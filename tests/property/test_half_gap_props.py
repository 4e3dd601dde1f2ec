"""Pulsar's TransferShedder rules (``shedding.plan = half_gap``) over random pairs, swaps included.

The generator favours what makes Pulsar's loop interesting: sources with many bundles of similar size,
destinations carrying much less traffic (so swapping bundles back can make an overshooting bundle fit),
reports whose throughput differs from their top-k bundles' sum. Each decision list is replayed pair by pair
against the rules of ``TransferShedder.findBundlesForUnloading`` (docs/design.md 5.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trimtab.balance.load import BrokerLoadData, BundleStats, TopBundles
from trimtab.balance.shed import (
    SWAP_MAX_FRACTION,
    ShedConfig,
    ShedResult,
    ShedState,
    Unload,
    transfer_shedder,
)

NOW = 5_000_000_000


@dataclass
class World:
    brokers: dict[str, bool]
    loads: dict[str, BrokerLoadData]
    top: dict[str, TopBundles]
    owners: dict[str, str]
    denied: frozenset[str]
    grace: frozenset[str]
    cfg: ShedConfig

    def run(self) -> ShedResult:
        state = ShedState(recent_bundles={b: NOW - 1000 for b in self.grace})
        return transfer_shedder(
            self.brokers,
            self.loads,
            self.top,
            self.owners.get,
            state,
            self.cfg,
            NOW,
            lambda bundle, src, dst: bundle not in self.denied,
        )

    def eligible(self, broker: str, dst: str | None) -> list[BundleStats]:
        """The bundles of ``broker``'s report the pair may move, lightest first (ties by name)."""
        return sorted(
            (
                s
                for s in self.top[broker].bundles
                if self.owners.get(s.bundle) == broker
                and s.bundle not in self.grace
                and s.bundle not in self.denied
            ),
            key=lambda s: (s.throughput, s.bundle),
        )


@st.composite
def worlds(draw: Any) -> World:
    n = draw(st.integers(2, 5))
    ids = [f"b{i}" for i in range(n)]
    brokers = {b: draw(st.integers(0, 5)) > 0 for b in ids}
    loads: dict[str, BrokerLoadData] = {}
    top: dict[str, TopBundles] = {}
    owners: dict[str, str] = {}
    for b in ids:
        size = draw(st.sampled_from([10, 50, 100, 200]))
        stats = [
            BundleStats(
                bundle=f"{b}/{i}",
                msg_throughput_in=draw(st.sampled_from([0, size // 2, size, size, size * 2])),
            )
            for i in range(draw(st.integers(0, 8)))
        ]
        for s in stats:
            owners[s.bundle] = b if draw(st.integers(0, 9)) else ids[0]
        tput = sum(s.throughput for s in stats) * draw(st.sampled_from([1.0, 1.0, 1.2, 2.0]))
        loads[b] = BrokerLoadData(
            broker=b,
            weighted_max_ema=draw(st.sampled_from([0.0, 0.02, 0.1, 0.3, 0.5, 0.8, 0.95, 1.5])),
            msg_throughput_in=tput,
            msg_throughput_ema=tput * draw(st.sampled_from([0.0, 0.1, 1.0])),
            updated_at=NOW - 1000,
        )
        if stats:
            top[b] = TopBundles(broker=b, bundles=stats)
    every = sorted(owners)
    pick = st.lists(st.sampled_from(every), max_size=2) if every else st.just([])
    cfg = ShedConfig(
        hit_count_threshold=0,
        plan="half_gap",
        max_broker_pairs=draw(st.integers(1, 3)),
        transfer=draw(st.integers(0, 4)) > 0,
        target_std=draw(st.sampled_from([0.05, 0.25])),
    )
    return World(brokers, loads, top, owners, frozenset(draw(pick)), frozenset(draw(pick)), cfg)


SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def pairs(res: ShedResult) -> list[tuple[str, str | None, list[Unload]]]:
    """(source, destination, its decisions in order: forward moves and swaps back) per pair. A swap batch
    comes just before the bundle it made room for, so a pair's last decision is a forward move."""
    groups: dict[frozenset[str | None], list[Unload]] = {}
    for u in res.decisions:
        groups.setdefault(frozenset({u.src, u.dst}), []).append(u)
    return [(mine[-1].src, mine[-1].dst, mine) for mine in groups.values()]


@SETTINGS
@given(worlds())
def test_each_pair_follows_pulsars_loop(w: World) -> None:
    res = w.run()
    for u in res.decisions:  # swaps included: every move obeys the per-bundle rules
        assert w.owners.get(u.bundle) == u.src and u.bundle not in w.grace and u.bundle not in w.denied
        assert u.throughput > 0 and u.dst != u.src
        assert u.dst is None or w.brokers[u.dst]
    for hi, lo, mine in pairs(res):
        load_hi, load_lo = mine[-1].src_load, mine[-1].dst_load
        assert load_lo is not None and load_hi == w.loads[hi].weighted_max_ema
        t_max = w.loads[hi].throughput
        budget = t_max * (load_hi - load_lo) / 2 / load_hi
        forward = [u for u in mine if u.src == hi]
        assert all(u.dst == lo for u in forward)
        # Lightest first, and nothing skipped: the moves are the first eligible bundles of the report.
        eligible = [s for s in w.eligible(hi, lo) if s.throughput > 0]
        assert [u.bundle for u in forward] == [s.bundle for s in eligible[: len(forward)]]
        assert len(forward) < len(w.top[hi].bundles)  # the source keeps one
        # Replay the budget: a bundle that overshoots goes only right after a swap that makes room.
        marked = gained = 0.0
        batch: list[Unload] = []
        for u in mine:
            if u.src == lo:
                assert w.cfg.transfer and u.dst == hi and lo is not None
                batch.append(u)
                continue
            if batch:
                assert marked - gained + u.throughput > budget, "a swap that was not needed"
                t_lo = w.loads[lo].throughput if lo is not None else 0.0
                max_new = t_max - marked + gained - u.throughput
                min_new = t_lo + marked - gained + u.throughput
                for b in batch:
                    max_new += b.throughput
                    min_new -= b.throughput
                    assert max_new < t_max and min_new < t_max
                assert min_new <= max_new < t_max * SWAP_MAX_FRACTION
                gained += sum(b.throughput for b in batch)
                batch = []
            else:
                assert marked - gained + u.throughput <= budget * (1 + 1e-12)
            marked += u.throughput
        assert not batch, "swapped back, but nothing went the other way"
        # Stopped at the first overshoot (unless the source is down to its last bundle).
        left = eligible[len(forward) :]
        if left and len(forward) < len(w.top[hi].bundles) - 1 and w.owners.get(left[0].bundle) == hi:
            assert marked - gained + left[0].throughput > budget * (1 - 1e-12)


def test_the_generator_makes_swaps() -> None:
    """The property above is only as good as its inputs: enough of them must swap."""
    seen = {"swap": 0, "moved": 0}

    @settings(
        max_examples=400,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
        derandomize=True,
    )
    @given(worlds())
    def count(w: World) -> None:
        res = w.run()
        srcs = {u.src for u in res.decisions}
        seen["moved"] += bool(res.decisions)
        seen["swap"] += any(u.dst in srcs for u in res.decisions)

    count()
    assert seen["moved"] > 40 and seen["swap"] > 3, seen
