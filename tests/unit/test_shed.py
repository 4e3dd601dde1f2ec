"""Load shedding decisions (docs/design.md 5.2; digest pulsar_elb.md 4.2 TransferShedder, 4.4 ThresholdShedder)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace

import pytest

from tests.support.shed_world import WORLD_NOW, EmaWorld
from trimtab.balance.load import BrokerLoadData
from trimtab.balance.shed import (
    ShedConfig,
    ShedResult,
    ShedState,
    Unload,
    threshold_shedder,
    transfer_shedder,
)

NOW = WORLD_NOW
CFG = ShedConfig(hit_count_threshold=0)  # act on the first triggered cycle
HALF = ShedConfig(hit_count_threshold=0, plan="half_gap")  # Pulsar's pairs


class World(EmaWorld):
    def shed(
        self,
        state: ShedState | None = None,
        cfg: ShedConfig = CFG,
        now: int = NOW,
        transferable: Callable[[str, str, str | None], bool] | None = None,
        fn: Callable[..., ShedResult] = transfer_shedder,
    ) -> ShedResult:
        return self.run(fn, state, cfg, now, transferable)


def moved(res: ShedResult) -> list[tuple[str, str, str | None]]:
    return [(u.bundle, u.src, u.dst) for u in res.decisions]


def two_brokers() -> World:
    """A clear imbalance: std .4 > .25; hot has four bundles."""
    return World().add("cold", 0.1, [10]).add("hot", 0.9, [400, 300, 200, 100])


# -------------------------------------------------------------------------------------- skip reasons


def test_no_brokers() -> None:
    assert World().shed().reason == "no_brokers"
    assert World().add("a", 0.9, [5, 5]).shed().reason == "no_brokers"
    # an outdated report does not count: one broker left
    w = World().add("a", 0.9, [5, 5]).add("b", 0.0, updated_at=NOW - 1_800_001)
    res = w.shed()
    assert (res.result, res.reason, res.decisions) == ("skip", "no_brokers", [])


def test_no_load_data_when_a_live_broker_has_not_reported() -> None:
    w = two_brokers()
    w.brokers["new"] = True  # registered, no report yet: balancing blind is not allowed
    st = ShedState(hit_count=2)
    res = w.shed(st)
    assert (res.result, res.reason, res.decisions) == ("skip", "no_load_data", [])
    assert st.hit_count == 2  # a skipped cycle neither counts nor resets


def test_outdated_reports_are_left_out_of_the_population() -> None:
    w = two_brokers().add("old", 0.0, [1, 1], updated_at=NOW - 1_800_001)
    res = w.shed()
    assert set(res.loads) == {"cold", "hot"}
    assert all(u.dst != "old" for u in res.decisions)
    assert res.result == "success"


def test_balanced_resets_the_hit_count() -> None:
    w = World().add("a", 0.5, [10, 10]).add("b", 0.55, [10, 10]).add("c", 0.45, [10, 10])
    st = ShedState(hit_count=7)
    res = w.shed(st, ShedConfig())
    assert (res.result, res.reason, res.decisions) == ("skip", "balanced", [])
    assert st.hit_count == 0 and res.hit_count == 0
    assert res.avg == pytest.approx(0.5)
    assert res.loads == {"a": 0.5, "b": 0.55, "c": 0.45}


def test_hit_count_must_be_exceeded() -> None:
    w = two_brokers()
    st = ShedState()
    cfg = ShedConfig(hit_count_threshold=3)
    for n in (1, 2, 3):
        res = w.shed(st, cfg)
        assert (res.result, res.reason, res.hit_count, res.decisions) == ("skip", "hit_count", n, [])
        assert st.hit_count == n
    res = w.shed(st, cfg)  # held for more than 3 cycles
    assert res.result == "success" and res.decisions
    assert st.hit_count == 0 and res.hit_count == 0  # reset on success


def test_hit_count_restarts_after_a_balanced_cycle() -> None:
    hot, calm = two_brokers(), World().add("a", 0.5, [1, 1]).add("b", 0.5, [1, 1])
    st = ShedState()
    cfg = ShedConfig(hit_count_threshold=2)
    assert hot.shed(st, cfg).reason == "hit_count"
    assert hot.shed(st, cfg).reason == "hit_count"
    assert calm.shed(st, cfg).reason == "balanced"
    assert hot.shed(st, cfg).reason == "hit_count"  # counting again from 1
    assert st.hit_count == 1


def test_sole_bundle_is_not_moved() -> None:
    w = World().add("cold", 0.1, [10]).add("hot", 0.9, [1000])
    res = w.shed()
    assert (res.result, res.reason, res.decisions) == ("skip", "no_bundles", [])
    assert ("hot/0", "sole_bundle") in res.skipped_bundles


def test_missing_top_bundles_report() -> None:
    w = two_brokers()
    del w.top["hot"]
    res = w.shed()
    assert (res.result, res.reason) == ("skip", "no_load_data")


def test_hot_broker_without_throughput() -> None:
    w = World().add("cold", 0.1, [10]).add("hot", 0.9, [10, 10], tput=0.0, tput_ema=50)
    res = w.shed()
    assert res.decisions == [] and res.reason == "no_load_data"


# -------------------------------------------------------------------------------------------- trigger


def test_trigger_std_above_target() -> None:
    w = World().add("a", 0.2, [10, 10], tput_ema=300).add("b", 0.8, [100, 100, 100])  # std .3, max < .85
    res = w.shed()
    assert res.std == pytest.approx(0.3)
    assert res.result == "success" and res.reason == "overloaded"
    w = World().add("a", 0.3, [10, 10], tput_ema=300).add("b", 0.7, [100, 100, 100])  # std .2: no trigger
    assert w.shed().reason == "balanced"


def underloaded_by_load() -> World:
    # avg .2275, std ~.126 < .25, max .3 < .85; a (.01) < avg * .125 = .028; throughput EMAs all equal
    w = World().add("a", 0.01, [100], tput_ema=300)
    for b in ("b", "c", "d"):
        w.add(b, 0.30, [100, 100, 100], tput_ema=300)
    return w


def test_trigger_underloaded_by_load() -> None:
    res = underloaded_by_load().shed()
    assert res.std < 0.25
    assert res.result == "success" and res.reason == "underloaded"
    assert {u.dst for u in res.decisions} == {"a"}
    w = underloaded_by_load()
    w.loads["a"] = replace_load(w.loads["a"], weighted_max_ema=0.05)  # above avg * .125 now
    assert w.shed().reason == "balanced"


def replace_load(d: BrokerLoadData, **kw: float) -> BrokerLoadData:
    import msgspec

    return msgspec.structs.replace(d, **kw)


def underloaded_by_throughput() -> World:
    # loads close together (no std or load trigger) but the least loaded broker carries almost no traffic
    w = World().add("a", 0.40, [10], tput_ema=10)
    w.add("b", 0.50, [30] * 20, tput_ema=600).add("c", 0.50, [30] * 20, tput_ema=600)
    return w


def test_trigger_underloaded_by_throughput_ema() -> None:
    res = underloaded_by_throughput().shed()
    assert res.std < 0.25
    assert res.result == "success" and res.reason == "underloaded"
    assert {u.dst for u in res.decisions} == {"a"}
    w = underloaded_by_throughput()
    w.loads["a"] = replace_load(w.loads["a"], msg_throughput_ema=76)  # >= 600 * .125 = 75
    assert w.shed().reason == "balanced"


def overloaded_max() -> World:
    # eight brokers at .5 and one at .9: std ~.126, .9 > .85 and > avg (.544) + .25
    w = World()
    for i in range(8):
        w.add(f"n{i}", 0.5, [50, 50], tput_ema=100)
    return w.add("hot", 0.9, [60, 50, 40, 30], tput_ema=180)


def test_trigger_overloaded_max() -> None:
    res = overloaded_max().shed()
    assert res.std < 0.25
    assert res.result == "success" and res.reason == "overloaded"
    assert {u.src for u in res.decisions} == {"hot"}
    w = overloaded_max()
    w.loads["hot"] = replace_load(w.loads["hot"], weighted_max_ema=0.84)  # not over 85%
    assert w.shed().reason == "balanced"
    # over 85% but within avg + target of the others
    w = World().add("x", 0.70, [10, 10], tput_ema=100).add("y", 0.90, [10, 10], tput_ema=100)
    assert w.shed().reason == "balanced"


# ---------------------------------------------------------------------------------------------- moves


def test_half_gap_plan_reads_the_report_lightest_first_and_stops_at_the_first_overshoot() -> None:
    # Pulsar's TransferShedder: gap (.9 - .1) / 2 = .4 of load = 650 * .4 / .9 = 288.9 bytes/s of budget.
    # Lightest first: 50, then 100 (150); 200 would make 350 > 288.9 and cold's only bundle (10) cannot be
    # swapped back to make it fit, so the pair stops there -- 300 is never looked at.
    w = World().add("cold", 0.1, [10]).add("hot", 0.9, [300, 200, 100, 50])
    res = w.shed(cfg=HALF)
    assert moved(res) == [("hot/3", "hot", "cold"), ("hot/2", "hot", "cold")]
    assert sum(u.throughput for u in res.decisions) <= 650 * (0.9 - 0.1) / 2 / 0.9
    assert ("hot/1", "overshoot") in res.skipped_bundles
    assert ("hot/0", "overshoot") not in res.skipped_bundles  # the first overshoot ends the pair
    u = res.decisions[0]
    assert (u.reason, u.src_load, u.dst_load, u.throughput) == ("overloaded", 0.9, 0.1, 50)
    # two brokers: the budget is T * (L_max - L_min) / 2 / L_max = 1000 * .4 / .9 = 444: 100 + 200, then 300
    # overshoots
    res = two_brokers().shed(cfg=HALF)
    assert moved(res) == [("hot/3", "hot", "cold"), ("hot/2", "hot", "cold")]


def test_to_target_plan_stops_as_soon_as_the_trigger_no_longer_holds() -> None:
    # std .4 > .25. Each bundle is worth .9 / 650 of load per byte/s. The heaviest that fits half the gap
    # (.4 -> 288.9 bytes/s) is 200 (.277): .623 vs .377, std .123 <= .25 -- one move, where the half-gap
    # plan moves 200 + 50.
    w = World().add("cold", 0.1, [10]).add("hot", 0.9, [300, 200, 100, 50])
    res = w.shed()
    assert moved(res) == [("hot/1", "hot", "cold")]
    u = res.decisions[0]
    assert (u.reason, u.src_load, u.dst_load, u.throughput) == ("overloaded", 0.9, 0.1, 200)


def test_to_target_plan_spreads_a_source_over_destinations_and_stops_at_the_target() -> None:
    # Two hot brokers (.8, ten bundles of 100 each) and three empty ones: std .39. Each move goes to the
    # least loaded broker at that moment, so the empty ones fill in turn; a hot broker never receives.
    w = World()
    for b in ("new1", "new2", "new3"):
        w.add(b, 0.0, [1])
    w.add("hot1", 0.8, [100] * 10).add("hot2", 0.8, [100] * 10)
    res = w.shed(cfg=ShedConfig(hit_count_threshold=0, max_broker_pairs=2))
    srcs = {u.src for u in res.decisions}
    dsts = [u.dst for u in res.decisions]
    assert srcs == {"hot1", "hot2"} and set(dsts) == {"new1", "new2", "new3"}
    assert not srcs & set(dsts)
    # Projected after the moves: every move was .08; std must be at or below the target, and one move fewer
    # would not have been (the cycle stops at the first move that meets it).
    load = {"new1": 0.0, "new2": 0.0, "new3": 0.0, "hot1": 0.8, "hot2": 0.8}

    def std() -> float:
        avg = sum(load.values()) / len(load)
        return (sum((v - avg) ** 2 for v in load.values()) / len(load)) ** 0.5

    for i, u in enumerate(res.decisions):
        assert std() > 0.25, f"move {i} was not needed"
        load[u.src] -= 0.08
        assert u.dst is not None
        load[u.dst] += 0.08
    assert std() <= 0.25
    assert len(res.decisions) == 5


def test_to_target_plan_takes_the_source_that_helps_most() -> None:
    # std .34 > .25 (nobody overloaded). a (.84, 900 bytes/s) has only bundles of 10 (.009 of load each);
    # b (.8, 1000 bytes/s) has one of 300 (.24, within half its gap to c, .35). Moving d across a gap g
    # lowers the variance by 2d(g - d)/n: b's .24 x .46 beats a's .009 x .73, and b/0 alone brings the std
    # to .21 <= .25 -- while always taking from the most loaded broker would move a's small bundles one by one.
    w = World().add("c", 0.1, [1]).add("a", 0.84, [10] * 9, tput=900).add("b", 0.8, [300, 100], tput=1000)
    res = w.shed()
    assert moved(res) == [("b/0", "b", "c")]


def test_always_leaves_one_bundle_on_the_source() -> None:
    w = World().add("cold", 0.0, [1]).add("hot", 1.0, [1, 1, 1], tput=100)  # budget 50: everything fits
    res = w.shed()
    assert moved(res) == [("hot/0", "hot", "cold"), ("hot/1", "hot", "cold")]
    w = World().add("cold", 0.0, [1]).add("hot", 1.0, [1, 1], tput=100)
    assert len(w.shed().decisions) == 1


def test_bundles_not_owned_by_the_source_are_skipped() -> None:
    w = two_brokers()
    w.owners["hot/0"] = "cold"  # moved away since the report
    del w.owners["hot/3"]  # unowned now
    res = w.shed()
    assert "hot/0" not in {u.bundle for u in res.decisions}
    assert "hot/3" not in {u.bundle for u in res.decisions}
    assert ("hot/0", "not_owner") in res.skipped_bundles
    assert res.decisions  # hot/1 or hot/2 still move
    res = w.shed(cfg=HALF)  # the pair plan reads the whole report
    assert ("hot/3", "not_owner") in res.skipped_bundles
    assert "hot/3" not in {u.bundle for u in res.decisions}


def test_recently_moved_bundles_wait_out_the_grace_period() -> None:
    w = two_brokers()
    st = ShedState(recent_bundles={"hot/0": NOW - 60_000})
    res = w.shed(st)
    assert "hot/0" not in {u.bundle for u in res.decisions}
    assert ("hot/0", "grace_period") in res.skipped_bundles
    # after the grace the entry expires and the bundle may move again
    st = ShedState(recent_bundles={"hot/0": NOW - 1_800_001, "other": NOW - 1000})
    res = w.shed(st)
    assert "hot/0" in {u.bundle for u in res.decisions}
    assert "other" in st.recent_bundles


def test_non_transferable_bundles_are_skipped() -> None:
    seen: list[tuple[str, str, str | None]] = []

    def transferable(bundle: str, src: str, dst: str | None) -> bool:
        seen.append((bundle, src, dst))
        return bundle != "hot/0"

    res = two_brokers().shed(transferable=transferable)
    assert "hot/0" not in {u.bundle for u in res.decisions}
    assert ("hot/0", "not_transferable") in res.skipped_bundles
    assert ("hot/0", "hot", "cold") in seen  # asked with the planned destination


def test_zero_throughput_bundles_are_not_moved() -> None:
    w = World().add("cold", 0.0, [1]).add("hot", 1.0, [0, 30, 50, 0, 0], tput=1000)
    assert {u.bundle for u in w.shed().decisions} == {"hot/1", "hot/2"}


def test_transfer_or_unload_by_config() -> None:
    assert {u.dst for u in two_brokers().shed().decisions} == {"cold"}
    res = two_brokers().shed(cfg=replace(CFG, transfer=False))
    assert res.decisions and {u.dst for u in res.decisions} == {None}
    assert {u.dst_load for u in res.decisions} == {0.1}  # still paired for the budget


def test_at_most_max_broker_pairs() -> None:
    w = World()
    for i in range(4):
        w.add(f"cold{i}", 0.0 + i / 100, [1], tput_ema=1)
        w.add(f"hot{i}", 1.0 - i / 100, [100, 100, 100], tput_ema=300)
    res = w.shed(cfg=replace(CFG, max_broker_pairs=2))
    assert {u.src for u in res.decisions} == {"hot0", "hot1"}  # the most loaded first
    assert {u.dst for u in res.decisions} == {"cold0", "cold1"}  # paired with the least loaded
    assert {(u.src, u.dst) for u in res.decisions} == {("hot0", "cold0"), ("hot1", "cold1")}
    res = w.shed(cfg=replace(CFG, max_broker_pairs=3))
    assert len({u.src for u in res.decisions}) == 3


def test_statistics_are_recomputed_after_each_pair() -> None:
    # std .355 at first; after hot -> cold moves half the gap, std is ~.04 and nothing triggers any more
    w = World().add("cold", 0.0, [1], tput=0.0, tput_ema=0.0)
    w.add("mid_lo", 0.45, [10] * 5, tput_ema=450).add("mid_hi", 0.55, [10] * 5, tput_ema=550)
    w.add("hot", 1.0, [500, 250, 250], tput_ema=1000)
    res = w.shed()
    assert moved(res) == [("hot/0", "hot", "cold")]
    assert sum(u.throughput for u in res.decisions) == 500


def test_draining_brokers_take_no_load() -> None:
    w = two_brokers().add("drain", 0.0, [1], live=False)
    res = w.shed()
    assert res.decisions and {u.dst for u in res.decisions} == {"cold"}
    # a draining broker may still shed
    w = World().add("cold", 0.1, [10]).add("hot", 0.9, [400, 300, 200, 100], live=False)
    assert {u.src for u in w.shed().decisions} == {"hot"}


def test_state_updates_on_success() -> None:
    st = ShedState(hit_count=5)
    res = two_brokers().shed(st)
    assert res.result == "success"
    assert st.hit_count == 0
    assert st.recent_bundles == {u.bundle: NOW for u in res.decisions}
    assert st.recent_brokers == {"hot": NOW}
    # the very next cycle sees hot cooling down: nothing moves twice
    res2 = two_brokers().shed(st, now=NOW + 1000)
    assert res2.decisions == []


# ------------------------------------------------------------------------------------------ cool-down


def test_cooling_source_sits_the_cycle_out() -> None:
    w = two_brokers()  # hot reported (NOW - 1 s) after its move (NOW - 60 s)
    st = ShedState(recent_brokers={"hot": NOW - 60_000})
    res = w.shed(st)
    assert (res.result, res.reason, res.decisions) == ("skip", "cool_down", [])
    assert st.recent_brokers == {"hot": NOW - 60_000}


def test_cooling_destination_is_skipped_for_the_next_one() -> None:
    w = two_brokers().add("colder", 0.05, [5])
    st = ShedState(recent_brokers={"colder": NOW - 60_000})
    res = w.shed(st)
    assert res.decisions and {u.dst for u in res.decisions} == {"cold"}


def test_cycle_waits_for_a_report_after_the_move() -> None:
    w = two_brokers()
    w.loads["hot"] = replace_load(w.loads["hot"], updated_at=NOW - 70_000)  # before the move
    st = ShedState(recent_brokers={"hot": NOW - 60_000}, hit_count=2)
    res = w.shed(st)
    assert (res.result, res.reason, res.decisions) == ("skip", "stale_load_data", [])
    assert st.hit_count == 2


def test_cool_down_is_measured_in_time() -> None:
    w = two_brokers()
    w.loads["hot"] = replace_load(w.loads["hot"], updated_at=NOW - 200_000)  # not reported since the move
    st = ShedState(recent_brokers={"hot": NOW - 180_000})  # but the cool-down is over
    res = w.shed(st)
    assert res.result == "success"
    assert st.recent_brokers == {"hot": NOW}  # the old entry was forgotten, then the new move recorded


def test_expired_cool_down_is_forgotten_even_without_decisions() -> None:
    w = World().add("a", 0.5, [1, 1]).add("b", 0.5, [1, 1])
    st = ShedState(recent_brokers={"a": NOW - 181_000})
    w.shed(st)
    assert st.recent_brokers == {}


# ------------------------------------------------------------------------------------ ThresholdShedder

TCFG = ShedConfig(threshold=0.10, min_unload_throughput=10.0)


def threshold_world() -> World:
    # avg .5: only hot (.9 >= .6) sheds; warm (.55) does not
    w = World().add("hot", 0.9, [60, 20, 10, 10]).add("warm", 0.55, [30, 30])
    return w.add("cool", 0.35, [30, 20]).add("cold", 0.2, [10, 10])


def test_threshold_only_brokers_above_avg_plus_threshold_shed() -> None:
    res = threshold_world().shed(cfg=TCFG, fn=threshold_shedder)
    assert res.result == "success" and res.reason == "overloaded"
    assert {u.src for u in res.decisions} == {"hot"}
    assert {u.dst for u in res.decisions} == {"cold"}  # transfer to the least loaded


def test_threshold_offload_fraction() -> None:
    # offload (.9 - .5 - .1 + .05) * 100 = 35: largest first until the budget is reached
    res = threshold_world().shed(cfg=TCFG, fn=threshold_shedder)
    assert [u.bundle for u in res.decisions] == ["hot/0"]  # 60 >= 35 at once
    w = World().add("hot", 0.9, [20, 10, 10, 10, 10, 10, 10, 10, 10]).add("warm", 0.55, [5, 5])
    w.add("cool", 0.35, [5, 5]).add("cold", 0.2, [5, 5])
    res = w.shed(cfg=TCFG, fn=threshold_shedder)
    budget = (0.9 - 0.5 - 0.1 + 0.05) * 100
    marked = [u.throughput for u in res.decisions]
    assert marked == [20, 10, 10]  # stops once 40 >= 35
    assert sum(marked[:-1]) < budget <= sum(marked)


def test_threshold_at_the_line_sheds() -> None:
    # exact binary fractions: avg .25, threshold .25 -> .5 >= .5
    w = World().add("a", 0.5, [50, 50]).add("b", 0.25, [5, 5]).add("c", 0.25, [5, 5]).add("d", 0.0, [1])
    res = w.shed(cfg=ShedConfig(threshold=0.25, min_unload_throughput=1.0), fn=threshold_shedder)
    assert {u.src for u in res.decisions} == {"a"}


def test_threshold_min_unload_throughput() -> None:
    res = threshold_world().shed(cfg=replace(TCFG, min_unload_throughput=36.0), fn=threshold_shedder)
    assert (res.result, res.decisions) == ("skip", [])
    assert ("hot", "below_min_throughput") in res.skipped_bundles


def test_threshold_never_the_last_bundle() -> None:
    w = World().add("hot", 1.0, [100, 100]).add("a", 0.1, [1, 1]).add("b", 0.1, [1, 1])
    res = w.shed(cfg=TCFG, fn=threshold_shedder)
    assert len(res.decisions) == 1
    w = World().add("hot", 1.0, [200]).add("a", 0.1, [1, 1]).add("b", 0.1, [1, 1])
    res = w.shed(cfg=TCFG, fn=threshold_shedder)
    assert res.decisions == [] and ("hot", "no_bundles") in res.skipped_bundles


def test_threshold_unload_mode_and_unusable_destinations() -> None:
    res = threshold_world().shed(cfg=replace(TCFG, transfer=False), fn=threshold_shedder)
    assert res.decisions and {u.dst for u in res.decisions} == {None}
    w = threshold_world()
    w.brokers["cold"] = False  # draining: the next least loaded takes it
    res = w.shed(cfg=TCFG, fn=threshold_shedder)
    assert res.decisions and {u.dst for u in res.decisions} == {"cool"}
    w = threshold_world()
    for other in ("warm", "cool", "cold"):
        w.brokers[other] = False  # nobody can take load: plain unloads
    res = w.shed(cfg=TCFG, fn=threshold_shedder)
    assert res.decisions and {u.dst for u in res.decisions} == {None}


def test_threshold_spreads_one_cycle_over_destinations_by_projected_load() -> None:
    """Every hot broker's bundles do not all go to the one coldest broker: each transfer counts against its
    destination (the simulator showed a scale-out piling 149 % onto one new broker otherwise)."""
    w = World().add("h1", 0.9, [50, 40, 10]).add("h2", 0.9, [50, 40, 10])
    w.add("c1", 0.1, [10, 10]).add("c2", 0.1, [10, 10])
    res = w.shed(cfg=TCFG, fn=threshold_shedder)
    assert len(res.decisions) == 2
    assert {u.dst for u in res.decisions} == {"c1", "c2"}


def test_threshold_skips_grace_not_owned_and_cooling() -> None:
    w = threshold_world()
    st = ShedState(recent_bundles={"hot/0": NOW - 1000})
    w.owners["hot/1"] = "warm"
    res = w.shed(st, cfg=TCFG, fn=threshold_shedder)
    assert [u.bundle for u in res.decisions] == ["hot/2", "hot/3"]  # 10 + 10 < 35, then out of bundles
    st = ShedState(recent_brokers={"hot": NOW - 5000})
    res = threshold_world().shed(st, cfg=TCFG, fn=threshold_shedder)
    assert res.decisions == [] and ("hot", "cool_down") in res.skipped_bundles


def test_threshold_records_moves() -> None:
    st = ShedState()
    res = threshold_world().shed(st, cfg=TCFG, fn=threshold_shedder)
    assert st.recent_bundles == {u.bundle: NOW for u in res.decisions}
    assert st.recent_brokers == {"hot": NOW}


def test_threshold_skip_reasons() -> None:
    assert World().shed(cfg=TCFG, fn=threshold_shedder).reason == "no_brokers"
    w = threshold_world()
    w.brokers["ghost"] = True
    assert w.shed(cfg=TCFG, fn=threshold_shedder).reason == "no_load_data"


def test_shedders_are_pure_given_a_state_copy() -> None:
    for fn, cfg in ((transfer_shedder, CFG), (threshold_shedder, TCFG)):
        w = threshold_world()
        st = ShedState(recent_bundles={"hot/3": NOW - 5}, recent_brokers={"cool": NOW - 5000})
        a = w.shed(copy.deepcopy(st), cfg, fn=fn)
        b = w.shed(copy.deepcopy(st), cfg, fn=fn)
        assert a == b
        assert isinstance(a.decisions[0], Unload)
