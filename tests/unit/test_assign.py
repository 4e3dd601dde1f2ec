"""Choosing a broker for an unowned bundle (docs/design.md 5.1; digest pulsar_elb.md 5.1-5.2)."""

from __future__ import annotations

import itertools
import random

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trimtab.balance.assign import (
    DEFAULT_FILTERS,
    AssignContext,
    BrokerInfo,
    BurstPicks,
    MaxTopicsFilter,
    VersionFilter,
    headed_to,
    least_resource_usage,
    per_bundle_load,
    select_broker,
)
from trimtab.balance.load import BrokerLoadData
from trimtab.channel.records import State, make

NOW = 100_000_000
TTL = 1800.0
BUNDLE = "t/ns/0x00000000_0x40000000"


def info(bid: str, **kw: object) -> BrokerInfo:
    return BrokerInfo(id=bid, service_url=f"svc://{bid}", http_url=f"http://{bid}", **kw)  # type: ignore[arg-type]


def ld(bid: str, ema: float, *, topics: int = 0, age_s: float = 0.0) -> BrokerLoadData:
    return BrokerLoadData(broker=bid, weighted_max_ema=ema, topics=topics, updated_at=int(NOW - age_s * 1000))


def ctx(loads: dict[str, BrokerLoadData] | None = None, **kw: object) -> AssignContext:
    return AssignContext(loads=loads or {}, now_ms=NOW, load_ttl_s=TTL, **kw)  # type: ignore[arg-type]


def picks(fn: object, n: int = 300) -> set[str | None]:
    """Every broker a selection can return, over many seeds."""
    return {fn(random.Random(seed)) for seed in range(n)}  # type: ignore[operator]


# ------------------------------------------------------------------------------ least resource usage


@pytest.mark.parametrize("order", list(itertools.permutations(["a", "b", "c"])))
def test_documented_example_best_is_10_and_30_percent(order: tuple[str, ...]) -> None:
    # usages 10%, 30%, 80% -> avg 40% -> best = {10%, 30%} with diff 10% (30% + 10% <= 40%, on the line).
    loads = {"a": ld("a", 0.10), "b": ld("b", 0.30), "c": ld("c", 0.80)}
    got = picks(lambda r: least_resource_usage(list(order), loads, 0.10, r, NOW, TTL))
    assert got == {"a", "b"}


def test_best_excludes_brokers_above_the_line() -> None:
    loads = {"a": ld("a", 0.10), "b": ld("b", 0.31), "c": ld("c", 0.80)}  # avg .403: b + .1 > avg
    got = picks(lambda r: least_resource_usage(["a", "b", "c"], loads, 0.10, r, NOW, TTL))
    assert got == {"a"}


def test_falls_back_to_all_candidates_when_none_is_best() -> None:
    loads = {b: ld(b, 0.5) for b in "abc"}  # all equal: nobody is 10% below the average
    got = picks(lambda r: least_resource_usage(["a", "b", "c", "d"], loads, 0.10, r, NOW, TTL))
    assert got == {"a", "b", "c", "d"}  # including d, which has no report


def test_brokers_without_a_fresh_report_are_never_best() -> None:
    loads = {
        "a": ld("a", 0.40),
        "b": ld("b", 0.90),
        "stale": ld("stale", 0.0, age_s=TTL + 1),  # looks idle, but its report is outdated
    }
    got = picks(lambda r: least_resource_usage(["a", "b", "stale", "silent"], loads, 0.10, r, NOW, TTL))
    assert got == {"a"}  # avg over a, b = .65; a is best; stale and silent never are


def test_single_fresh_report_falls_back_to_all() -> None:
    loads = {"a": ld("a", 0.0)}
    got = picks(lambda r: least_resource_usage(["a", "b"], loads, 0.10, r, NOW, TTL))
    assert got == {"a", "b"}


def test_no_candidates() -> None:
    assert least_resource_usage([], {}, 0.1, random.Random(1), NOW, TTL) is None


def test_least_resource_usage_is_deterministic_for_a_seed() -> None:
    loads = {b: ld(b, i / 20) for i, b in enumerate("abcdefgh")}
    cands = list("abcdefgh")
    first = [least_resource_usage(cands, loads, 0.1, random.Random(s), NOW, TTL) for s in range(50)]
    again = [least_resource_usage(cands[::-1], loads, 0.1, random.Random(s), NOW, TTL) for s in range(50)]
    assert first == again  # same seed, same answer, whatever the candidate order


# ------------------------------------------------------------------------------------ select_broker


def test_select_excludes_and_draining_are_never_chosen() -> None:
    brokers = {"a": info("a"), "b": info("b", draining=True), "c": info("c"), "d": info("d")}
    loads = {b: ld(b, 0.0) for b in brokers}  # b and a would be the best choices by load
    c = ctx(loads, exclude=frozenset({"a"}))
    got = picks(lambda r: select_broker(BUNDLE, brokers, c, r).broker)
    assert got == {"c", "d"}


@pytest.mark.parametrize(
    ("brokers", "exclude"),
    [
        ({}, frozenset()),
        ({"a": info("a", draining=True)}, frozenset()),
        ({"a": info("a"), "b": info("b")}, frozenset({"a", "b"})),
    ],
)
def test_select_no_eligible_broker(brokers: dict[str, BrokerInfo], exclude: frozenset[str]) -> None:
    sel = select_broker(BUNDLE, brokers, ctx(exclude=exclude), random.Random(0))
    assert sel.broker is None
    assert sel.reason == "no_brokers"
    assert sel.candidates == 0


def test_select_uses_least_resource_usage() -> None:
    brokers = {b: info(b) for b in "abc"}
    loads = {"a": ld("a", 0.10), "b": ld("b", 0.30), "c": ld("c", 0.80)}
    sels = [select_broker(BUNDLE, brokers, ctx(loads), random.Random(s)) for s in range(200)]
    assert {s.broker for s in sels} == {"a", "b"}
    assert all(s.reason == "selected" and s.candidates == 3 and s.skipped_filters == [] for s in sels)


class Nobody:
    name = "nobody"

    def apply(
        self, bundle: str, candidates: dict[str, BrokerInfo], c: AssignContext
    ) -> dict[str, BrokerInfo]:
        return {}


class OnlyPrefix:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.name = f"only_{prefix}"
        self.seen: list[set[str]] = []

    def apply(
        self, bundle: str, candidates: dict[str, BrokerInfo], c: AssignContext
    ) -> dict[str, BrokerInfo]:
        self.seen.append(set(candidates))
        return {k: v for k, v in candidates.items() if k.startswith(self.prefix)}


def test_each_filter_narrows_never_empties() -> None:
    brokers = {b: info(b) for b in ("x1", "x2", "y1")}
    f1, f3 = OnlyPrefix("x"), OnlyPrefix("x2")
    sel = select_broker(BUNDLE, brokers, ctx(), random.Random(3), filters=(f1, Nobody(), f3, OnlyPrefix("z")))
    assert sel.broker == "x2"
    assert sel.skipped_filters == ["nobody", "only_z"]
    assert sel.candidates == 1
    # each filter sees what the previous ones left (the skipped one changed nothing)
    assert f1.seen == [{"x1", "x2", "y1"}]
    assert f3.seen == [{"x1", "x2"}]


def test_a_filter_may_not_see_excluded_or_draining_brokers() -> None:
    brokers = {"a": info("a"), "b": info("b", draining=True), "c": info("c")}
    f = OnlyPrefix("")
    select_broker(BUNDLE, brokers, ctx(exclude=frozenset({"c"})), random.Random(0), filters=(f,))
    assert f.seen == [{"a"}]


def test_filter_mutating_its_input_does_not_leak() -> None:
    class Greedy:
        name = "greedy"

        def apply(self, bundle: str, cands: dict[str, BrokerInfo], c: AssignContext) -> dict[str, BrokerInfo]:
            cands.clear()
            return cands

    brokers = {b: info(b) for b in "ab"}
    sel = select_broker(BUNDLE, brokers, ctx(), random.Random(0), filters=(Greedy(),))
    assert sel.broker in {"a", "b"}
    assert sel.skipped_filters == ["greedy"]
    assert set(brokers) == {"a", "b"}


# ------------------------------------------------------------------------------------ version filter


def test_version_filter_off_by_default() -> None:
    brokers = {"a": info("a", version="1.0.0"), "b": info("b", version="2.0.0")}
    got = picks(lambda r: select_broker(BUNDLE, brokers, ctx(), r).broker, 100)
    assert got == {"a", "b"}


@pytest.mark.parametrize(
    ("versions", "newest"),
    [
        ({"a": "1.0.0", "b": "2.0.0", "c": "2.0.0"}, {"b", "c"}),
        ({"a": "1.9.0", "b": "1.10.0"}, {"b"}),  # numeric, not lexical
        ({"a": "3.0.1", "b": "3.0.0", "c": "2.99.99"}, {"a"}),
        ({"a": "2.0.0-rc1", "b": "2.0.0"}, {"b"}),  # a release is newer than its pre-release (semver)
        ({"a": "2.0.0-rc1", "b": "1.9.9"}, {"a"}),
        ({"a": "2.0.0-rc2", "b": "2.0.0-rc1"}, {"a"}),
    ],
)
def test_version_filter_prefers_later_versions(versions: dict[str, str], newest: set[str]) -> None:
    brokers = {b: info(b, version=v) for b, v in versions.items()}
    c = ctx(prefer_later_versions=True)
    assert set(VersionFilter().apply(BUNDLE, dict(brokers), c)) == newest
    got = picks(lambda r: select_broker(BUNDLE, brokers, c, r).broker, 100)
    assert got == newest


def test_version_filter_newest_may_be_excluded() -> None:
    brokers = {
        "a": info("a", version="1.0.0"),
        "b": info("b", version="2.0.0"),
        "c": info("c", version="1.0.0"),
    }
    c = ctx(prefer_later_versions=True, exclude=frozenset({"b"}))
    got = picks(lambda r: select_broker(BUNDLE, brokers, c, r).broker, 100)
    assert got == {"a", "c"}  # the newest among the eligible


# --------------------------------------------------------------------------------- max topics filter


def test_max_topics_filter_drops_full_brokers() -> None:
    brokers = {b: info(b) for b in "abc"}
    loads = {"a": ld("a", 0.5, topics=100), "b": ld("b", 0.5, topics=99), "c": ld("c", 0.5, topics=150)}
    c = ctx(loads, max_topics=100)
    assert set(MaxTopicsFilter().apply(BUNDLE, dict(brokers), c)) == {"b"}
    sel = select_broker(BUNDLE, brokers, c, random.Random(0))
    assert sel.broker == "b" and sel.skipped_filters == []


def test_max_topics_filter_ignores_missing_and_stale_reports() -> None:
    brokers = {b: info(b) for b in "abc"}
    loads = {"a": ld("a", 0.5, topics=500), "b": ld("b", 0.5, topics=500, age_s=TTL + 1)}
    kept = MaxTopicsFilter().apply(BUNDLE, dict(brokers), ctx(loads, max_topics=100))
    assert set(kept) == {"b", "c"}


def test_max_topics_filter_skipped_when_everyone_is_full() -> None:
    brokers = {b: info(b) for b in "ab"}
    loads = {b: ld(b, 0.5, topics=1000) for b in "ab"}
    sel = select_broker(BUNDLE, brokers, ctx(loads, max_topics=10), random.Random(0))
    assert sel.broker in {"a", "b"}
    assert sel.skipped_filters == ["max_topics"]


def test_default_filter_names() -> None:
    assert [f.name for f in DEFAULT_FILTERS] == ["version", "max_topics"]


# ------------------------------------------------------------------------------------- determinism


def test_select_is_deterministic_for_a_seeded_random() -> None:
    brokers = {f"b{i}": info(f"b{i}", version="1.1.0" if i < 10 else "1.0.0") for i in range(12)}
    loads = {b: ld(b, (i * 7 % 10) / 10) for i, b in enumerate(brokers)}
    c = ctx(loads, prefer_later_versions=True)
    a = [select_broker(BUNDLE, brokers, c, random.Random(seed)).broker for seed in range(40)]
    b = [select_broker(BUNDLE, brokers, c, random.Random(seed)).broker for seed in range(40)]
    assert a == b
    assert len(set(a)) > 1  # and it is random across seeds


# ------------------------------------------------------------------------------ a burst counts its picks


def test_a_drain_burst_spreads_where_a_stale_view_piles_onto_the_idle_broker() -> None:
    # One idle broker among nine at 80 %: without a ledger every one of 50 drained bundles goes to it
    # (it stays "best" until its next report); with one, it takes what brings it near the others.
    loads = (
        {"me": ld("me", 0.80)} | {f"b{i}": ld(f"b{i}", 0.80) for i in range(9)} | {"idle": ld("idle", 0.0)}
    )
    brokers = {b: info(b) for b in loads if b != "me"}
    c = ctx(loads, exclude=frozenset({"me"}))
    blind = [select_broker(f"x{i}", brokers, c, random.Random(i)).broker for i in range(50)]
    assert set(blind) == {"idle"}
    burst = BurstPicks.for_drain(loads, "me", 50)
    assert burst.share == pytest.approx(0.80 / 50)
    rng = random.Random(7)
    counted = []
    for i in range(50):
        counted.append(burst.select(f"x{i}", brokers, c, rng).broker)
    # idle takes bundles while it is 10 points below the average of the raised loads (44 of 50 here),
    # then the rest spread over everyone.
    assert 30 <= counted.count("idle") < 50
    assert len(set(counted)) > 2
    assert sum(burst.picked.values()) == pytest.approx(0.80)


def test_a_burst_without_an_own_report_or_picks_changes_nothing() -> None:
    loads = {"a": ld("a", 0.2)}
    c = ctx(loads)
    assert BurstPicks.for_drain(loads, "me", 10).share == 0.0
    burst = BurstPicks.for_drain(loads | {"me": ld("me", 0.5)}, "me", 10)
    assert burst.context(c) is c  # nothing picked yet
    burst.record(None)  # a plain unload goes nowhere
    assert burst.picked == {}
    burst.record("a")
    burst.record("gone")  # picked, but without a report: nothing to raise
    raised = burst.context(c)
    assert raised.loads["a"].weighted_max_ema == pytest.approx(0.25)
    assert "gone" not in raised.loads and c.loads["a"].weighted_max_ema == 0.2  # the input is not mutated


@given(
    emas=st.dictionaries(st.sampled_from("abcdef"), st.floats(0, 2), min_size=1),
    picks_made=st.lists(st.sampled_from("abcdefg"), max_size=30),
    own=st.floats(0, 2),
    bundles=st.integers(0, 500),
)
def test_a_burst_only_ever_raises_the_loads_it_was_told_about(
    emas: dict[str, float], picks_made: list[str], own: float, bundles: int
) -> None:
    loads = {b: ld(b, e) for b, e in emas.items()} | {"me": ld("me", own)}
    burst = BurstPicks.for_drain(loads, "me", bundles)
    for p in picks_made:
        burst.record(p)
    raised = burst.context(ctx(loads)).loads
    assert raised.keys() == loads.keys()
    for b, data in raised.items():
        expected = loads[b].weighted_max_ema + picks_made.count(b) * burst.share
        assert data.weighted_max_ema == pytest.approx(expected)
        assert msgspec.structs.replace(data, weighted_max_ema=0) == msgspec.structs.replace(
            loads[b], weighted_max_ema=0
        )


# ------------------------------------------------------------------------------ concurrent drains


def test_headed_to_counts_what_the_channel_gives_each_broker() -> None:
    recs = [
        make(State.OWNED, dst="a", version=1, ts=0, writer="a"),
        make(State.ASSIGNING, dst="a", version=1, ts=0, writer="x"),
        make(State.RELEASING, src="b", dst="a", version=2, ts=0, writer="b"),  # on its way to a
        make(State.RELEASING, src="b", dst=None, version=2, ts=0, writer="b"),  # an unload: nobody's
        make(State.SPLITTING, src="c", dst="c", version=2, ts=0, writer="c", children={"x": None}),
        make(State.FREE, dst="a", src="b", version=3, ts=0, writer="a"),
        make(State.DELETED, src="c", version=3, ts=0, writer="c"),
    ]
    assert headed_to(recs) == {"a": 3, "c": 1}


def bundles_ld(bid: str, ema: float, bundles: int) -> BrokerLoadData:
    return msgspec.structs.replace(ld(bid, ema), bundles=bundles)


def test_a_second_drain_sees_the_first_drains_picks_through_the_channel() -> None:
    # Two brokers drain one after the other before anyone reports again. Each ledger alone sends most
    # of its bundles to the idle broker (the test above): together ~90, the rolling-restart pile.
    # Seeded with what the channel already sends each broker, the second drain sends it few.
    loads = {f"b{i}": bundles_ld(f"b{i}", 0.80, 50) for i in range(10)} | {"idle": bundles_ld("idle", 0.0, 0)}
    others = {b: info(b) for b in loads if b not in {"b0", "b1"}}
    c = ctx(loads, exclude=frozenset({"b0", "b1"}))
    headed = {b: d.bundles for b, d in loads.items()}
    assert per_bundle_load(loads) == pytest.approx(0.80 / 50)

    def drain(me: str, seed: int, seen: dict[str, int] | None) -> list[str | None]:
        burst = BurstPicks.for_drain(loads, me, 50, seen)
        rng = random.Random(seed)
        return [burst.select(f"{me}-{i}", others, c, rng).broker for i in range(50)]

    first = drain("b0", 1, dict(headed))
    moved = headed | {b: headed[b] + first.count(b) for b in others}
    moved["b0"] = 0
    blind = drain("b1", 2, None)
    seeded = drain("b1", 2, moved)
    assert first.count("idle") >= 30 and blind.count("idle") >= 30
    # idle ends with 45 + 10 bundles, the others 52-59. Blind, it would hold 91.
    assert seeded.count("idle") <= 15 < blind.count("idle")
    after = {b: moved[b] + seeded.count(b) for b in others}
    assert max(after.values()) - min(after.values()) <= 10  # random among the best: 52-59 here


@given(
    reported=st.dictionaries(
        st.sampled_from("abcdef"), st.tuples(st.floats(0, 2), st.integers(0, 200)), min_size=1
    ),
    headed=st.dictionaries(st.sampled_from("abcdefgme"), st.integers(0, 300)),
    own=st.tuples(st.floats(0, 2), st.integers(0, 200)),
    picks_made=st.lists(st.sampled_from("abcdef"), max_size=20),
)
def test_a_seeded_burst_moves_each_load_by_its_unreported_bundles(
    reported: dict[str, tuple[float, int]],
    headed: dict[str, int],
    own: tuple[float, int],
    picks_made: list[str],
) -> None:
    loads = {b: bundles_ld(b, e, n) for b, (e, n) in reported.items()} | {"me": bundles_ld("me", *own)}
    per = per_bundle_load(loads)
    burst = BurstPicks.for_drain(loads, "me", own[1], headed)
    seeded = burst.context(ctx(loads)).loads
    for p in picks_made:
        burst.record(p)
    raised = burst.context(ctx(loads)).loads
    assert raised.keys() == loads.keys()
    assert raised["me"] == loads["me"]  # the drained broker is never a destination
    for b, data in raised.items():
        if b == "me":
            continue
        expected = max(0.0, loads[b].weighted_max_ema + (headed.get(b, 0) - loads[b].bundles) * per)
        assert seeded[b].weighted_max_ema == pytest.approx(expected)
        # Every pick raises by exactly the share, even on a broker the channel says lost everything.
        after = expected + picks_made.count(b) * burst.share
        assert data.weighted_max_ema == pytest.approx(after)
        assert data.weighted_max_ema >= 0
    # The channel agreeing with every report changes nothing at all.
    agreed = BurstPicks.for_drain(loads, "me", own[1], {b: d.bundles for b, d in loads.items()})
    assert agreed.context(c := ctx(loads)) is c
