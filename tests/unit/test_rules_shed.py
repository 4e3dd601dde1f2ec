"""The shedders' rules one at a time, each at its boundary (balance/shed.py; docs/testing.md: mutation testing).

Every test names the rule it pins. Where a rule compares, the test sits at equality (``std > target``,
``load > overload``, the stale report ``updated_at <= moved_at``, the cool-down ``<``), so that a changed
operator fails it; where a rule takes the destination into account (the transfer guard), the guard here
refuses by destination, so that a guard asked about an unload instead lets a forbidden move through.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields, replace

import pytest

from tests.support.shed_world import WORLD_NOW, EmaWorld
from trimtab.balance.load import BrokerLoadData, BundleStats
from trimtab.balance.shed import (
    Settled,
    ShedConfig,
    ShedResult,
    ShedState,
    settle_moves,
    threshold_shedder,
    track_move,
    transfer_shedder,
)
from trimtab.channel.records import Record, State, make
from trimtab.config.settings import LoadSettings, Settings, SheddingSettings

NOW = WORLD_NOW
CFG = ShedConfig(hit_count_threshold=0)  # act on the first triggered cycle
HALF = replace(CFG, plan="half_gap")
PLANS = pytest.mark.parametrize("cfg", [CFG, HALF], ids=["to_target", "half_gap"])
Guard = Callable[[str, str, str | None], bool]


class World(EmaWorld):
    def shed(
        self,
        cfg: ShedConfig = CFG,
        state: ShedState | None = None,
        transferable: Guard | None = None,
        fn: Callable[..., ShedResult] = transfer_shedder,
    ) -> ShedResult:
        return self.run(fn, state, cfg, NOW, transferable)


def moves(res: ShedResult) -> list[tuple[str, str, str | None]]:
    return [(u.bundle, u.src, u.dst) for u in res.decisions]


# ------------------------------------------------------------------------------------ configuration


def test_from_settings_maps_every_field_and_converts_percentages_to_fractions() -> None:
    """Rule: ``ShedConfig.from_settings`` carries every shedding setting over, and the two percentages
    (``overload_threshold_pct``, ``threshold_pct``) become fractions (85 -> 0.85): a ``* 100`` would switch
    the overload trigger and ThresholdShedder off."""
    s = Settings(
        shedding=SheddingSettings(
            target_std=0.3,
            hit_count_threshold=7,
            overload_threshold_pct=70.0,
            max_broker_pairs=9,
            bundle_grace_s=11.0,
            broker_cooldown_s=13.0,
            transfer_enabled=False,
            plan="half_gap",
            threshold_pct=20.0,
            min_unload_throughput_bytes=17.0,
            lower_boundary_enabled=True,
            shed_bundles_with_policies=True,
            unload_timeout_s=19.0,
            isolate_hot_bundles=True,
        ),
        load=LoadSettings(ttl_s=2000.0, report_max_interval_s=60.0),
    )
    cfg = ShedConfig.from_settings(s)
    assert cfg == ShedConfig(
        target_std=0.3,
        hit_count_threshold=7,
        overload_threshold=0.7,
        max_broker_pairs=9,
        bundle_grace_s=11.0,
        broker_cooldown_s=13.0,
        transfer=False,
        plan="half_gap",
        load_ttl_s=2000.0,
        threshold=0.2,
        min_unload_throughput=17.0,
        lower_boundary=True,
        shed_bundles_with_policies=True,
        unload_timeout_s=19.0,
        isolate_hot_bundles=True,
    )
    # No field of the config is left at its default by the mapping above (each one was checked).
    assert all(getattr(cfg, f.name) != f.default for f in fields(ShedConfig))


def test_default_settings_give_the_default_config() -> None:
    """Rule: the settings' defaults and ``ShedConfig``'s defaults are the same numbers (Pulsar's: std 0.25,
    hit count 3, overload 85 %, 3 pairs, grace 30 min, cool-down 3 min, threshold 10 %, 10 MiB minimum)."""
    assert ShedConfig.from_settings(Settings()) == ShedConfig()
    assert ShedConfig() == ShedConfig(
        target_std=0.25,
        hit_count_threshold=3,
        overload_threshold=0.85,
        max_broker_pairs=3,
        bundle_grace_s=1800.0,
        broker_cooldown_s=180.0,
        transfer=True,
        plan="to_target",
        load_ttl_s=1800.0,
        threshold=0.10,
        min_unload_throughput=10 * 1024 * 1024,
        lower_boundary=False,
        shed_bundles_with_policies=False,
        unload_timeout_s=60.0,
        isolate_hot_bundles=False,
    )


# ------------------------------------------------------------------------------------ the population


@pytest.mark.parametrize("fn", [transfer_shedder, threshold_shedder])
def test_an_outdated_report_leaves_out_only_its_own_broker(fn: Callable[..., ShedResult]) -> None:
    """Rule: a broker whose report is older than the TTL is left out of the population, and only it: the
    brokers sorted after it still count (``continue``, not ``break``)."""
    w = World().add("a-old", 0.0, [5, 5], updated_at=NOW - 1_800_001)
    w.add("b", 0.1, [10]).add("c", 0.9, [400, 300, 200, 100])
    res = w.shed(fn=fn)
    assert set(res.loads) == {"b", "c"}


def test_a_report_exactly_ttl_old_is_fresh() -> None:
    """Rule: a report is fresh while its age is at most the TTL (``<=``)."""
    w = World().add("a", 0.1, [10], updated_at=NOW - 1_800_000).add("b", 0.9, [400, 300, 200, 100])
    assert set(w.shed().loads) == {"a", "b"}


def cooling_world(moved_at: int, updated_at: int) -> tuple[World, ShedState]:
    w = World().add("cold", 0.1, [10]).add("hot", 0.9, [400, 300, 200, 100])
    w.add("mid", 0.5, [50, 50], updated_at=updated_at)
    return w, ShedState(recent_brokers={"mid": moved_at})


def test_a_report_taken_at_the_moment_of_the_move_is_stale() -> None:
    """Rule: a broker in its cool-down whose report was taken at or before its last move (``updated_at <=
    moved_at``) holds the whole cycle back (``stale_load_data``); one taken after it does not."""
    w, st = cooling_world(moved_at=NOW - 5000, updated_at=NOW - 5000)
    assert w.shed(state=st).reason == "stale_load_data"
    w, st = cooling_world(moved_at=NOW - 5000, updated_at=NOW - 4999)
    res = w.shed(state=st)
    assert res.result == "success"
    assert all("mid" not in (u.src, u.dst) for u in res.decisions)  # cooling: sits the cycle out


def test_the_cool_down_ends_exactly_after_broker_cooldown_s() -> None:
    """Rule: a broker cools down while less than ``broker_cooldown_s`` passed since its move (``<``); at
    exactly that age it is forgotten and takes part again (its report may then predate the move)."""
    cooldown_ms = int(CFG.broker_cooldown_s * 1000)
    w, st = cooling_world(moved_at=NOW - cooldown_ms, updated_at=NOW - cooldown_ms - 1)
    res = w.shed(state=st)
    assert res.reason != "stale_load_data"
    assert "mid" not in st.recent_brokers
    w, st = cooling_world(moved_at=NOW - cooldown_ms + 1, updated_at=NOW - cooldown_ms - 1)
    assert w.shed(state=st).reason == "stale_load_data"
    assert "mid" in st.recent_brokers


def test_bundle_grace_ends_strictly_after_bundle_grace_s() -> None:
    """Rule: a moved bundle is remembered while at most ``bundle_grace_s`` passed (``now - t > grace``
    forgets it)."""
    grace_ms = int(CFG.bundle_grace_s * 1000)
    w = World().add("a", 0.5, [10, 10]).add("b", 0.5, [10, 10])
    st = ShedState(recent_bundles={"x": NOW - grace_ms, "y": NOW - grace_ms - 1})
    w.shed(state=st)
    assert st.recent_bundles == {"x": NOW - grace_ms}


# ------------------------------------------------------------------------------------ the trigger


def even(load_a: float, load_b: float) -> World:
    """Two brokers, equal throughput EMAs (no under-load by traffic), three bundles each."""
    return World().add("a", load_a, [30, 30, 30]).add("b", load_b, [30, 30, 30])


@PLANS
def test_std_equal_to_the_target_does_not_trigger(cfg: ShedConfig) -> None:
    """Rule: the spread triggers a cycle only when ``std > target_std``, strictly: loads .25/.75 have std
    exactly .25 (no broker under- or overloaded), which is balanced; a hair more is not."""
    res = even(0.25, 0.75).shed(cfg)
    assert res.std == 0.25
    assert (res.result, res.reason) == ("skip", "balanced")
    res = even(0.25, 0.7500001).shed(cfg)
    assert res.result == "success"


@PLANS
def test_load_equal_to_the_overload_threshold_is_not_overloaded(cfg: ShedConfig) -> None:
    """Rule: the most loaded broker is overloaded only when ``load > overload_threshold`` (and above
    ``avg + target_std``), strictly: at exactly 85 % nothing triggers."""

    def world(top: float) -> World:
        w = World().add("hot", top, [40, 30, 20, 10])
        for b in ("a", "b", "c", "d"):
            w.add(b, 0.5, [25, 25, 25, 25])
        return w

    res = world(0.85).shed(cfg)
    assert res.std <= cfg.target_std and (res.result, res.reason) == ("skip", "balanced")
    res = world(0.8500001).shed(cfg)
    assert (res.result, res.reason) == ("success", "overloaded")
    assert {u.src for u in res.decisions} == {"hot"}


@PLANS
def test_overloaded_needs_to_be_above_avg_plus_target(cfg: ShedConfig) -> None:
    """Rule: over the overload threshold is not enough: the broker must also be above ``avg + target_std``
    (strictly), or every broker of an evenly hot cluster would shed."""
    w = World()
    for b in ("a", "b", "c"):
        w.add(b, 0.9, [30, 30, 30])
    assert w.shed(cfg).reason == "balanced"
    # avg + target = .65 + .25 = .9: exactly on the line is not above it.
    w = World().add("hot", 0.9, [40, 30, 20, 10]).add("a", 0.525, [25] * 4).add("b", 0.525, [25] * 4)
    w.add("c", 0.65, [25] * 4)
    res = w.shed(cfg)
    assert res.avg == pytest.approx(0.65) and res.std < cfg.target_std
    assert res.reason == "balanced"


def underload_world(lo: float, lo_ema: float = 90.0) -> World:
    """``lo`` and four brokers sharing the rest of an average of exactly .5 (dyadic fractions: exact)."""
    w = World().add("lo", lo, [30, 30, 30], tput_ema=lo_ema)
    for b in ("a", "b", "c", "d"):
        w.add(b, (2.5 - lo) / 4, [10] * 9)
    return w


# target .5: m = min(.5, .25) = .25, so the line is avg x m = .125 (by load) or 90 x .25 = 22.5 (by EMA).
UNDER = replace(CFG, target_std=0.5, overload_threshold=1.0)


@pytest.mark.parametrize("cfg", [UNDER, replace(UNDER, plan="half_gap")], ids=["to_target", "half_gap"])
def test_underloaded_by_load_is_strict(cfg: ShedConfig) -> None:
    """Rule: the least loaded broker is under-loaded when ``load < avg x m`` with ``m = min(.5,
    target_std / 2)``, strictly: at exactly ``avg x m`` it is not."""
    res = underload_world(0.0625).shed(cfg)
    assert res.avg == 0.5 and res.std < 0.5
    assert (res.result, res.reason) == ("success", "underloaded")
    assert {u.dst for u in res.decisions} == {"lo"}
    res = underload_world(0.125).shed(cfg)
    assert res.avg == 0.5 and res.std < 0.5
    assert res.reason == "balanced"


@pytest.mark.parametrize("cfg", [UNDER, replace(UNDER, plan="half_gap")], ids=["to_target", "half_gap"])
def test_underloaded_by_throughput_is_strict(cfg: ShedConfig) -> None:
    """Rule: the least loaded broker is also under-loaded when its throughput EMA is below ``m`` times the
    largest one, strictly: at exactly ``m x max`` it is not."""
    res = underload_world(0.25, lo_ema=22.0).shed(cfg)
    assert (res.result, res.reason) == ("success", "underloaded")
    assert underload_world(0.25, lo_ema=22.5).shed(cfg).reason == "balanced"


# ------------------------------------------------------------------------------------ the transfer guard


def refuse_destination(dst: str) -> Guard:
    """A placement rule that may refuse by destination: nothing may move *to* ``dst`` (an isolation
    policy, an anti-affinity group), while an unload (no destination) is allowed."""

    def transferable(bundle: str, src: str, to: str | None) -> bool:
        return to != dst

    return transferable


@PLANS
def test_the_transfer_guard_is_asked_about_the_destination(cfg: ShedConfig) -> None:
    """Rule: every transfer is checked with its destination (``transferable(bundle, src, dst)``), so a
    rule that refuses that destination keeps the bundle where it is -- a move checked as an unload (dst
    None) would break isolation or anti-affinity."""
    w = World().add("cold", 0.1, [10, 10]).add("hot", 0.9, [400, 300, 200, 100])
    res = w.shed(cfg, transferable=refuse_destination("cold"))
    assert res.decisions == []
    assert ("hot/0", "not_transferable") in res.skipped_bundles or any(
        why == "not_transferable" for _, why in res.skipped_bundles
    )
    res = w.shed(cfg, transferable=refuse_destination("elsewhere"))
    assert res.decisions and all(u.dst == "cold" for u in res.decisions)


def test_threshold_shedder_asks_the_guard_about_the_destination() -> None:
    """Rule: ThresholdShedder's transfers are guarded with their destination too."""
    mb = 1024 * 1024
    w = World().add("cold", 0.1, [mb]).add("hot", 0.9, [40 * mb, 30 * mb, 20 * mb, 10 * mb])
    res = w.shed(ShedConfig(), transferable=refuse_destination("cold"), fn=threshold_shedder)
    assert res.decisions == []
    assert any(why == "not_transferable" for _, why in res.skipped_bundles)
    res = w.shed(ShedConfig(), transferable=refuse_destination("elsewhere"), fn=threshold_shedder)
    assert res.decisions and all(u.dst == "cold" for u in res.decisions)


def test_an_unload_is_guarded_without_a_destination() -> None:
    """Rule: with transfers off the shedder unloads (dst None) and asks the guard about exactly that."""
    asked: list[str | None] = []

    def transferable(bundle: str, src: str, dst: str | None) -> bool:
        asked.append(dst)
        return True

    w = World().add("cold", 0.1, [10, 10]).add("hot", 0.9, [400, 300, 200, 100])
    res = w.shed(replace(CFG, transfer=False), transferable=transferable)
    assert res.decisions and all(u.dst is None for u in res.decisions)
    assert asked and set(asked) == {None}
    asked.clear()
    res = w.shed(CFG, transferable=transferable)
    assert asked and set(asked) == {"cold"}


# ------------------------------------------------------------------------------------ hot-bundle isolation

ISO = replace(CFG, isolate_hot_bundles=True)
HOT = "t/hot/0x40000000_0x40000001"  # one hash wide: a cut-out hot topic
HOT2 = "t/hot/0x50000000_0x50000001"


def rng(i: int) -> str:
    return f"t/ns/0x{i * 0x100:08x}_0x{(i + 1) * 0x100:08x}"


def iso_world(
    spec: dict[str, tuple[float, list[tuple[str, float]]]], tput: dict[str, float] | None = None
) -> World:
    """Brokers at a load with named bundles of these bytes/s (the report's throughput their sum, or
    ``tput``)."""
    w = World()
    for b, (load, bundles) in spec.items():
        t = (tput or {}).get(b, float(sum(x for _, x in bundles)))
        report = BrokerLoadData(
            broker=b, weighted_max_ema=load, msg_throughput_in=t, msg_throughput_ema=t, updated_at=NOW - 1000
        )
        w.put(report, [BundleStats(bundle=n, msg_throughput_in=x) for n, x in bundles])
    return w


def test_a_hot_topic_is_one_carrying_at_least_half_an_average_broker() -> None:
    """Rule: a one-hash bundle makes its broker an isolating one when its share of the broker's load is
    at least half the average broker load (``>=``): exactly half counts, a little less does not."""
    # a: .5 load over 100 B/s; HOT carries 50 -> .25 = avg (.5) / 2.
    at = iso_world({"a": (0.5, [(HOT, 50.0), (rng(1), 50.0)]), "b": (0.5, [(rng(2), 10.0)])})
    res = at.shed(replace(ISO, overload_threshold=0.75))
    assert [(u.bundle, u.src, u.dst, u.reason) for u in res.decisions] == [
        (rng(1), "a", "b", "isolate_hot_bundle")
    ]
    below = iso_world({"a": (0.5, [(HOT, 49.0), (rng(1), 51.0)]), "b": (0.5, [(rng(2), 10.0)])})
    assert below.shed(replace(ISO, overload_threshold=1.0)).decisions == []


def test_isolation_may_fill_a_destination_up_to_the_overload_threshold() -> None:
    """Rule: isolation refuses a move that takes the destination *past* ``overload_threshold``
    (``no_headroom``); exactly up to it is allowed (.5 + .25 = .75)."""
    w = iso_world({"a": (0.5, [(HOT, 50.0), (rng(1), 50.0)]), "b": (0.5, [(rng(2), 10.0)])})
    res = w.shed(replace(ISO, overload_threshold=0.75))
    assert [(u.bundle, u.throughput, u.src_load, u.dst_load) for u in res.decisions] == [
        (rng(1), 50.0, 0.5, 0.5)
    ]
    res = w.shed(replace(ISO, overload_threshold=0.7499))
    assert res.decisions == [] and (rng(1), "no_headroom") in res.skipped_bundles


def test_isolation_moves_the_heaviest_bundles_first_each_to_the_least_loaded_as_projected() -> None:
    """Rule: the other bundles of an isolating broker leave heaviest first, each to the least loaded
    destination *as projected* after the moves before it (a destination's projection grows by what it
    received)."""
    w = iso_world({
        "a": (0.8, [(HOT, 600.0), (rng(1), 200.0), (rng(2), 150.0), (rng(3), 50.0)]),
        "b": (0.3, [(rng(4), 300.0)]),
        "c": (0.2, [(rng(5), 200.0)]),
    })  # fmt: skip
    res = w.shed(ISO)
    # shares of .8 over 1000 B/s: 200 -> .16, 150 -> .12, 50 -> .04. c .2 -> .36; b .3 -> .42; c .36 -> .40.
    assert [(u.bundle, u.dst) for u in res.decisions] == [(rng(1), "c"), (rng(2), "b"), (rng(3), "c")]
    assert [u.dst_load for u in res.decisions] == pytest.approx([0.2, 0.3, 0.36])
    assert all(u.src_load == 0.8 and u.reason == "isolate_hot_bundle" for u in res.decisions)


def test_isolation_starts_with_the_most_loaded_isolating_broker_within_max_broker_pairs() -> None:
    """Rule: isolating brokers are served most loaded first, at most ``max_broker_pairs`` of them a cycle."""
    w = iso_world({
        "a": (0.6, [(HOT, 600.0), (rng(1), 100.0)]),
        "z": (0.7, [(HOT2, 700.0), (rng(2), 100.0)]),
        "c": (0.1, [(rng(3), 10.0)]),
    })  # fmt: skip
    res = w.shed(replace(ISO, max_broker_pairs=1))
    assert [(u.bundle, u.src) for u in res.decisions] == [(rng(2), "z")]


def test_isolation_passes_over_bundles_without_traffic_and_goes_on_after_a_skip() -> None:
    """Rule: isolation moves only bundles with traffic (a bundle of 1 B/s is traffic, 0 is not), and a
    bundle it must leave (here in its grace period) does not stop it from moving the next
    (``continue``)."""
    w = iso_world({
        "a": (0.8, [(HOT, 600.0), (rng(1), 150.0), (rng(2), 1.0), (rng(3), 0.0)]),
        "b": (0.1, [(rng(4), 10.0)]),
    })  # fmt: skip
    res = w.shed(ISO, state=ShedState(recent_bundles={rng(1): NOW - 1}))
    assert [(u.bundle, u.reason) for u in res.decisions] == [(rng(2), "isolate_hot_bundle")]
    assert (rng(1), "grace_period") in res.skipped_bundles


def test_a_bundle_listed_twice_is_isolated_once() -> None:
    """Rule: a bundle a report lists twice moves once."""
    w = iso_world(
        {"a": (0.8, [(HOT, 600.0), (rng(1), 100.0), (rng(1), 100.0)]), "b": (0.1, [(rng(4), 10.0)])}
    )
    assert [u.bundle for u in w.shed(ISO).decisions] == [rng(1)]


@pytest.mark.parametrize("transfer", [True, False])
def test_isolation_asks_the_guard_about_the_destination_or_an_unload(transfer: bool) -> None:
    """Rule: an isolation move is guarded with its destination, or with None when transfers are off (then
    the decision is an unload, dst None)."""
    asked: list[str | None] = []

    def transferable(bundle: str, src: str, dst: str | None) -> bool:
        asked.append(dst)
        return dst != "c"

    w = iso_world({"a": (0.8, [(HOT, 600.0), (rng(1), 100.0)]), "c": (0.1, [(rng(4), 10.0)])})
    res = w.shed(replace(ISO, transfer=transfer), transferable=transferable)
    if transfer:
        assert asked and set(asked) == {"c"}
        assert res.decisions == [] and (rng(1), "not_transferable") in res.skipped_bundles
    else:
        assert asked and set(asked) == {None}
        assert [(u.bundle, u.dst) for u in res.decisions] == [(rng(1), None)]


def test_a_broker_reporting_no_throughput_isolates_nothing() -> None:
    """Rule: a broker that reports no throughput cannot be shown to carry a hot topic, and a broker of a
    report that is not in the population (no fresh load) is passed over, not the end of the search."""
    from trimtab.balance.shed import isolating_brokers

    top = {
        "gone": iso_world({"gone": (0.5, [(HOT2, 10.0), (rng(2), 1.0)])}).top["gone"],
        "a": iso_world({"a": (0.0, [(HOT, 10.0), (rng(1), 1.0)])}).top["a"],
    }
    owners = {HOT: "a", rng(1): "a", HOT2: "gone", rng(2): "gone"}
    assert isolating_brokers({"a": 0.0, "b": 0.0}, {"a": 0.0, "b": 0.0}, top, owners.get) == set()
    assert isolating_brokers({"a": 0.5, "b": 0.5}, {"a": 11.0, "b": 5.0}, top, owners.get) == {"a"}


# ------------------------------------------------------------------------------------ waiting for the moves


def test_settling_nothing_returns_empty_lists() -> None:
    """Rule: with no move published, nothing is pending, completed or timed out (empty lists, which the
    caller iterates)."""
    assert settle_moves(ShedState(), lambda b: None, CFG, NOW) == Settled([], [], [])


def test_a_pending_batch_reports_only_what_is_pending() -> None:
    """Rule: while a move is in flight within the timeout, the batch is pending and none of it is settled
    yet (completed and timed out are empty)."""
    st = ShedState()
    track_move(st, "x", "hot", 5, NOW)
    releasing = make(State.RELEASING, src="hot", dst="cold", version=5, ts=0, writer="leader")
    table: dict[str, Record | None] = {"x": releasing}
    out = settle_moves(st, table.get, CFG, NOW + 1)
    assert (out.completed, out.timed_out) == ([], []) and [m.bundle for m in out.pending] == ["x"]


def test_a_timed_out_move_the_state_no_longer_remembers_is_settled_quietly() -> None:
    """Rule: a move that timed out is forgotten (its grace entry and its source's cool-down dropped) even
    when the state no longer holds them -- a new leader, or an expired grace period -- without failing."""
    st = ShedState()
    track_move(st, "x", "hot", 5, NOW)
    releasing = make(State.RELEASING, src="hot", dst="cold", version=5, ts=0, writer="leader")
    out = settle_moves(st, {"x": releasing}.get, replace(CFG, unload_timeout_s=1), NOW + 1000)
    assert [m.bundle for m in out.timed_out] == ["x"] and not st.moves


# ------------------------------------------------------------------------------------ to_target's projection


def test_a_destination_s_throughput_ema_is_projected_by_adding_what_it_received() -> None:
    """Rule: every move is projected before the next decision -- the destination's throughput EMA grows by
    the bundle's traffic (``+=``): a destination that received load is no longer idle, so the cycle stops
    once the spread meets the target instead of moving more to an "idle" broker."""
    # a: .9 over 100 B/s in ten bundles; lo: .3 with an EMA of 50. One move of 10 B/s (.09) -> .81/.39,
    # std .21 <= .25; lo's EMA 60 >= 90 x .125: balanced.
    w = World().add("a", 0.9, [10] * 10).add("lo", 0.3, [50])
    res = w.shed(CFG)
    assert [(u.src, u.dst) for u in res.decisions] == [("a", "lo")]


def test_a_broker_that_received_load_is_not_a_source_in_the_same_cycle() -> None:
    """Rule: within a cycle a broker is a source or a destination, never both: ``x`` received a bundle from
    ``hot`` and now looks more loaded than ``y``, yet it passes nothing on to ``y``."""
    w = World().add("hot", 0.8, [40, 10]).add("x", 0.05, [1, 1], tput_ema=300.0).add("y", 0.05, [80, 5])
    res = w.shed(replace(CFG, target_std=0.1, max_broker_pairs=2))
    assert moves(res) == [("hot/1", "hot", "x")]


# ------------------------------------------------------------------------------------ ThresholdShedder

TH = ShedConfig(threshold=0.125, min_unload_throughput=0.0)  # dyadic margin: the lines below are exact


def th(w: World, cfg: ShedConfig = TH, **kw: Guard | ShedState | None) -> ShedResult:
    return w.shed(cfg, fn=threshold_shedder, **kw)  # type: ignore[arg-type]


def test_threshold_skips_and_balanced_cycles_say_so() -> None:
    """Rule: a cycle without a population is a ``skip`` with its reason; one where nobody is above the
    line is a ``skip``, ``balanced``, with the statistics it was judged on."""
    res = th(World().add("a", 0.5, [10, 10]))
    assert (res.result, res.reason, res.decisions) == ("skip", "no_brokers", [])
    res = th(World().add("a", 0.5, [10, 10]).add("b", 0.3125, [10, 10]))  # line: .40625 + .125 > .5
    assert (res.result, res.reason, res.decisions) == ("skip", "balanced", [])
    assert (res.avg, res.std, res.loads) == (0.40625, 0.09375, {"a": 0.5, "b": 0.3125})


def test_threshold_a_cooling_broker_is_passed_over_not_the_end() -> None:
    """Rule: a broker above the line that is cooling down is skipped (``cool_down``) and the next one
    still sheds (``continue``)."""
    w = World().add("h1", 0.9, [40, 30, 20]).add("h2", 0.875, [40, 30, 20]).add("c", 0.0, [1, 1])
    res = th(w, state=ShedState(recent_brokers={"h1": NOW - 2000}))  # its report came after the move
    assert ("h1", "cool_down") in res.skipped_bundles
    assert res.decisions and {u.src for u in res.decisions} == {"h2"}


def test_threshold_lower_boundary_needs_a_broker_strictly_below_the_floor() -> None:
    """Rule: lower-boundary shedding starts only when some broker is *below* ``avg - threshold`` (a broker
    exactly on that floor is not)."""
    w = World().add("a", 0.5, [10, 10]).add("b", 0.5, [10, 10]).add("c", 0.125, [10, 10])  # floor .125
    res = th(w, replace(TH, lower_boundary=True, threshold=0.25))
    assert res.avg == 0.375 and res.decisions == []


def test_threshold_lower_boundary_sheds_only_from_brokers_above_the_floor() -> None:
    """Rule: the broker that sheds toward the idle one must be *above* the floor with two or more
    reported bundles: one exactly on the floor does not shed."""
    # avg .1875, floor .0625: z (0) is below it; a has a single bundle; f is exactly on the floor.
    w = World().add("a", 0.5, [10]).add("f", 0.0625, [10, 10]).add("z", 0.0, [1])
    res = th(w, replace(TH, lower_boundary=True))
    assert res.avg == 0.1875 and res.decisions == []


def test_threshold_lower_boundary_sheds_from_the_most_loaded_eligible_broker() -> None:
    """Rule: lower-boundary shedding takes from the *most* loaded broker above the floor (ties by name),
    whatever the brokers' names."""
    # avg .3: nobody above .55; floor .05, z below it; a, b and y may shed, b is the most loaded.
    w = World().add("a", 0.4, [10, 10]).add("b", 0.45, [10, 10]).add("y", 0.35, [10, 10]).add("z", 0.0, [1])
    res = th(w, replace(TH, lower_boundary=True, threshold=0.25))
    assert res.decisions and {(u.src, u.reason) for u in res.decisions} == {("b", "underloaded")}


def test_threshold_minimum_throughput_is_inclusive() -> None:
    """Rule: a broker sheds when its share to offload is at least ``min_unload_throughput`` (an offload of
    exactly the minimum happens; a smaller one is skipped as ``below_min_throughput``)."""
    w = World().add("hot", 0.875, [60, 40]).add("cold", 0.125, [1, 1])
    budget = (0.875 - 0.5 - 0.125 + 0.05) * 100  # usage - avg - threshold + 5 % of its 100 B/s
    res = th(w, replace(TH, min_unload_throughput=budget))
    assert [u.bundle for u in res.decisions] == ["hot/0"]
    res = th(w, replace(TH, min_unload_throughput=budget * 1.0001))
    assert res.decisions == [] and ("hot", "below_min_throughput") in res.skipped_bundles


def test_threshold_marks_bundles_until_the_budget_is_reached() -> None:
    """Rule: a hot broker's heaviest bundles are marked while less than its budget is marked: a first
    bundle of exactly the budget is all it sheds; a budget under one byte/s still sheds one bundle."""
    budget = (0.875 - 0.5 - 0.125 + 0.05) * 100
    w = World().add("hot", 0.875, [budget, 5, 5]).add("cold", 0.125, [1, 1])
    w.loads["hot"] = replace_tput(w.loads["hot"], 100.0)
    assert [u.bundle for u in th(w).decisions] == ["hot/0"]
    tiny = World().add("hot", 0.875, [0.5, 0.25, 0.25]).add("cold", 0.125, [1, 1])
    tiny.loads["hot"] = replace_tput(tiny.loads["hot"], 1.0)  # budget .3 B/s
    assert [u.bundle for u in th(tiny).decisions] == ["hot/0"]


def replace_tput(d: BrokerLoadData, t: float) -> BrokerLoadData:
    import msgspec

    return msgspec.structs.replace(d, msg_throughput_in=t, msg_throughput_ema=t)


def test_threshold_always_leaves_one_bundle_and_counts_each_move_once() -> None:
    """Rule: however large the budget, a hot broker keeps one bundle: of three, two move."""
    w = World().add("hot", 1.0, [40, 30, 20]).add("cold", 0.0, [1, 1])
    res = th(w, replace(TH, threshold=0.0))
    assert [u.bundle for u in res.decisions] == ["hot/0", "hot/1"]


def test_threshold_passes_over_bundles_without_traffic_and_goes_on_after_a_refusal() -> None:
    """Rule: bundles without traffic (0 B/s) are not moved, one of 1 B/s is; a bundle the guard refuses is
    skipped and the next one still moves (``continue``)."""
    w = World().add("hot", 1.0, [40, 30, 1, 0, 0]).add("cold", 0.0, [1, 1])

    def transferable(bundle: str, src: str, dst: str | None) -> bool:
        return bundle != "hot/0"

    res = th(w, replace(TH, threshold=0.0), transferable=transferable)
    assert [u.bundle for u in res.decisions] == ["hot/1", "hot/2"]
    assert ("hot/0", "not_transferable") in res.skipped_bundles


def test_threshold_asks_the_guard_about_bundle_source_and_destination() -> None:
    """Rule: the guard is asked about the move itself: the bundle, its source and its destination."""
    asked: list[tuple[str, str, str | None]] = []

    def transferable(bundle: str, src: str, dst: str | None) -> bool:
        asked.append((bundle, src, dst))
        return True

    w = World().add("hot", 0.875, [60, 40]).add("cold", 0.125, [1, 1])
    th(w, transferable=transferable)
    assert asked == [("hot/0", "hot", "cold")]


def test_threshold_projects_each_destination_by_adding_what_it_received() -> None:
    """Rule: each transfer adds its share of load to its destination's projection (``+=``), so one cycle
    spreads a hot broker's bundles over several destinations instead of piling them on the coldest."""
    # hot: 1.0 over 1 B/s; bundles .5, .25 B/s -> shares .5, .25. c1 .125 -> .625 after the first, so the
    # second goes to c2 (.5). Throughputs below 1 B/s are projected too.
    w = World().add("hot", 1.0, [0.5, 0.25, 0.25]).add("c1", 0.125, [1, 1]).add("c2", 0.5, [1, 1])
    res = th(w, replace(TH, threshold=0.0))
    assert [(u.bundle, u.dst) for u in res.decisions] == [("hot/0", "c1"), ("hot/1", "c2")]


def test_threshold_a_broker_as_loaded_as_the_source_is_never_its_destination() -> None:
    """Rule: a destination must be less loaded than the source (by load, not projection): two equally hot
    brokers never shed onto each other, even once the coldest one's projection passes them."""
    w = World().add("h1", 0.9, [100, 5, 5]).add("h2", 0.9, [100, 5, 5]).add("cold", 0.1, [1, 1])
    res = th(w, replace(TH, threshold=0.1))
    assert [(u.src, u.dst) for u in res.decisions] == [("h1", "cold"), ("h2", "cold")]


# ------------------------------------------------------------------------------------ to_target, step by step


def test_to_target_with_nowhere_to_move_says_why() -> None:
    """Rule: a triggered cycle that finds no destination (every other broker draining) ends with
    ``no_bundles``; one whose only source sits out its cool-down ends with ``cool_down``."""
    w = World().add("cold", 0.1, [10, 10], live=False).add("hot", 0.9, [400, 300, 200, 100], live=False)
    res = w.shed()
    assert (res.result, res.reason, res.decisions) == ("skip", "no_bundles", [])
    w = World().add("cold", 0.1, [10, 10]).add("hot", 0.9, [400, 300, 200, 100])
    res = w.shed(state=ShedState(recent_brokers={"hot": NOW - 2000}))
    assert (res.result, res.reason, res.decisions) == ("skip", "cool_down", [])


def test_to_target_without_a_gap_says_no_gap_unless_a_cooling_broker_is_above() -> None:
    """Rule: when the least loaded broker is under-loaded (by its traffic) but no source is more loaded
    than it, the cycle ends with ``no_gap`` -- or ``cool_down`` when a broker sitting out its cool-down is
    *more* loaded than it (one exactly as loaded is no gap either)."""

    def world(cooling_load: float) -> tuple[World, ShedState]:
        w = (
            World()
            .add("a", 0.5, [10, 10], tput_ema=1.0)
            .add("c", cooling_load, [10, 10])
            .add("y", 0.5, [10, 10])
        )
        return w, ShedState(recent_brokers={"c": NOW - 2000})

    w, st = world(0.5)
    assert w.shed(state=st).reason == "no_gap"
    w, st = world(0.625)
    assert w.shed(state=st).reason == "cool_down"


def test_to_target_a_source_with_an_empty_report_has_no_load_data() -> None:
    """Rule: a source that reports no bundles at all gives the cycle's reason ``no_load_data`` (nothing to
    size a move with), not ``no_bundles``."""
    from trimtab.balance.load import TopBundles

    w = World().add("cold", 0.1, [10, 10]).add("hot", 0.9, [10])
    w.top["hot"] = TopBundles(broker="hot", bundles=[])
    assert w.shed().reason == "no_load_data"


def test_to_target_reports_no_bundles_and_notes_each_skipped_bundle_once() -> None:
    """Rule: when every bundle of the source is in its grace period the cycle ends with ``no_bundles``,
    and a bundle passed over at several steps is listed once among the skipped."""
    w = World().add("a", 1.0, [32, 32, 32, 32]).add("b", 0.0, [1, 1]).add("c", 0.0625, [1, 1])
    st = ShedState(recent_bundles={"a/0": NOW - 1})
    res = w.shed(replace(CFG, target_std=0.01), state=st)
    assert len(res.decisions) >= 2
    assert res.skipped_bundles.count(("a/0", "grace_period")) == 1
    w = World().add("cold", 0.1, [10, 10]).add("hot", 0.9, [40, 30])
    res = w.shed(state=ShedState(recent_bundles={"hot/0": NOW - 1, "hot/1": NOW - 1}))
    assert (res.reason, res.decisions) == ("no_bundles", [])


def test_to_target_stops_once_the_spread_is_exactly_the_target() -> None:
    """Rule: the plan moves while ``std > target_std`` (or a broker is under- or overloaded): one move of
    .25 turns loads 1/0 into .75/.25, std exactly .25, and it stops there."""
    w = World().add("a", 1.0, [32, 32, 32, 32]).add("b", 0.0, [1, 1], tput_ema=64.0)
    res = w.shed()
    assert moves(res) == [("a/0", "a", "b")]


def test_to_target_converts_throughput_to_load_with_the_source_s_ema() -> None:
    """Rule: a move's share of load is its bytes/s times the source's load per byte/s of its throughput EMA
    (any EMA above 0, even under 1 B/s); the source's current throughput is used only when its EMA is 0."""
    # EMA .5 B/s for a load of .5: 1 load per B/s, so a bundle of .3 B/s would carry .3 -- over half the gap
    # (.25) -- and the .15 one goes. (By its current throughput, .75 B/s, the .3 would fit.)
    w = World().add("a", 0.5, [0.3, 0.3, 0.15], tput_ema=0.5).add("b", 0.0, [1, 1], tput_ema=8.0)
    res = w.shed(replace(CFG, target_std=0.2))
    assert moves(res) == [("a/2", "a", "b")]
    assert res.decisions[0].dst_load == 0.0
    # A source reporting 1 B/s is still a source.
    w = World().add("a", 0.5, [0.5, 0.25, 0.25]).add("b", 0.0, [1, 1], tput_ema=8.0)
    assert moves(w.shed(replace(CFG, target_std=0.2))) == [("a/0", "a", "b")]


# ------------------------------------------------------------------------------------ isolating brokers keep their hot bundle


def test_only_the_isolating_broker_keeps_its_one_hash_bundle() -> None:
    """Rule: with isolation on, a hot one-hash bundle stays on the broker that isolates it; a one-hash
    bundle elsewhere (its topic cooled down) moves like any other, and the placement guard is still asked
    about every move with its bundle and source."""
    cool = "t/cool/0x60000000_0x60000001"
    asked: list[tuple[str, str]] = []

    def transferable(bundle: str, src: str, dst: str | None) -> bool:
        asked.append((bundle, src))
        return True

    w = iso_world({
        "h": (0.5, [(HOT, 100.0)]),  # isolates HOT, nothing else to move
        "o": (1.0, [(cool, 30.0), (rng(1), 100.0), (rng(2), 100.0)]),  # only the cool one fits half the gap
        "z": (0.5, [(rng(3), 10.0)]),
    })  # fmt: skip
    res = w.shed(ISO, transferable=transferable)
    assert moves(res) == [(cool, "o", "z")]
    assert asked and all(w.owner(b) == s for b, s in asked)


def test_a_source_never_receives_even_once_it_is_the_least_loaded() -> None:
    """Rule: a broker that shed in this cycle is no destination for the rest of it, even when its load
    is now the lowest (``s2`` moves first, then is the least loaded while ``s1`` sheds to the others)."""
    w = World().add("s1", 2.0, [2] * 50).add("s2", 0.6, [5, 5]).add("d1", 0.0, [1, 1]).add("d2", 0.5, [1, 1])
    res = w.shed(CFG)
    assert moves(res)[0] == ("s2/0", "s2", "d1")
    assert len(res.decisions) > 2 and all(u.dst != "s2" for u in res.decisions)
    # as reported; s2 is the least loaded after its move
    assert min(res.loads, key=lambda b: res.loads[b]) == "d1"


@pytest.mark.parametrize(("plan", "why"), [("to_target", "no_bundles"), ("half_gap", "cool_down")])
def test_only_a_destination_strictly_under_the_line_is_under_loaded(plan: str, why: str) -> None:
    """Rule: a draining broker's under-load starts a cycle, but the least loaded broker that may receive
    is under-loaded only strictly below ``avg x m`` (by load) or ``max EMA x m`` (by traffic): exactly on
    the line it receives nothing (half_gap counts the draining broker it passed over as sitting out)."""
    # m = .25 (target .5); avg .5, so the line is .125; EMAs all 40, so the traffic line is 10.
    w = World().add("a", 0.0, [10, 10, 10, 10], live=False).add("b", 0.125, [10, 10, 10, 10])
    w.add("c", 0.9375, [10, 10, 10, 10]).add("d", 0.9375, [10, 10, 10, 10])
    res = w.shed(replace(CFG, target_std=0.5, plan=plan))
    assert res.std < 0.5 and (res.decisions, res.reason) == ([], why)
    w = World().add("a", 0.0, [10, 10, 10, 10], live=False).add("b", 0.25, [10, 10, 10, 10], tput_ema=10.0)
    w.add("c", 0.875, [10, 10, 10, 10]).add("d", 0.875, [10, 10, 10, 10])
    res = w.shed(replace(CFG, target_std=0.5, plan=plan))
    assert res.std < 0.5 and (res.decisions, res.reason) == ([], why)


def test_every_broker_cooling_down_is_a_cool_down() -> None:
    """Rule: a triggered cycle in which every broker sits out its cool-down (no source, no destination)
    ends with ``cool_down``."""
    w = World().add("cold", 0.1, [10, 10]).add("hot", 0.9, [400, 300, 200, 100])
    res = w.shed(state=ShedState(recent_brokers={"hot": NOW - 2000, "cold": NOW - 2000}))
    assert (res.result, res.reason, res.decisions) == ("skip", "cool_down", [])


@pytest.mark.parametrize("plan", ["to_target", "half_gap"])
def test_within_the_plan_overloaded_means_strictly_above_both_lines(plan: str) -> None:
    """Rule: inside the plan too, the most loaded broker is overloaded only when strictly above
    ``overload_threshold`` *and* strictly above ``avg + target_std``: a cycle started by a draining
    broker's under-load moves nothing when the top broker is exactly on either line."""
    # On the overload line: .85 (avg .3375 + .5 is below it).
    w = World().add("a", 0.0, [10, 10], live=False).add("b", 0.25, [10, 10]).add("c", 0.85, [10, 10, 10, 10])
    w.add("e", 0.25, [10, 10])
    res = w.shed(replace(CFG, target_std=0.5, plan=plan))
    assert res.std < 0.5 and res.decisions == []
    # On the avg + target line: .875 = .375 + .5 (over the overload threshold .75).
    w = World().add("a", 0.0, [10, 10], live=False).add("b", 0.25, [10, 10]).add("c", 0.875, [10, 10, 10, 10])
    res = w.shed(replace(CFG, target_std=0.5, overload_threshold=0.75, plan=plan))
    assert res.avg == 0.375 and res.std < 0.5 and res.decisions == []
    # A hair above both: it sheds.
    w.loads["c"] = replace_load(w.loads["c"], 0.8750001)
    assert w.shed(replace(CFG, target_std=0.5, overload_threshold=0.75, plan=plan)).decisions


def replace_load(d: BrokerLoadData, load: float) -> BrokerLoadData:
    import msgspec

    return msgspec.structs.replace(d, weighted_max_ema=load)


# ------------------------------------------------------------------------------------ half_gap (Pulsar's pairs)


def test_half_gap_max_broker_pairs_counts_from_zero() -> None:
    """Rule: at most ``max_broker_pairs`` pairs move something: with one allowed, exactly one pair does."""
    w = World().add("a", 0.0, [1, 1]).add("b", 0.05, [1, 1]).add("y", 0.9, [40, 30, 20, 10])
    w.add("z", 0.95, [40, 30, 20, 10])
    res = w.shed(replace(HALF, max_broker_pairs=1))
    assert {(u.src, u.dst) for u in res.decisions} == {("z", "a")}


def test_half_gap_equal_ends_stop_the_cycle_with_its_reason() -> None:
    """Rule: when the ends of the pairing are equally loaded there is no gap to halve: the cycle stops and
    says why (``no_bundles``: nothing moved, no broker sat out)."""
    w = World().add("a", 0.5, [10, 10], tput_ema=1.0).add("b", 0.5, [10, 10])
    res = w.shed(HALF)
    assert (res.result, res.reason, res.decisions) == ("skip", "no_bundles", [])


def test_half_gap_moves_bundles_of_one_byte_and_passes_over_silent_ones() -> None:
    """Rule: the source's bundles are read lightest first; a bundle without traffic is passed over
    (``continue``) and one of 1 B/s is moved."""
    w = World().add("cold", 0.0, [1, 1]).add("hot", 1.0, [0, 0, 1, 40, 40], tput=100.0)
    res = w.shed(HALF)
    assert [u.bundle for u in res.decisions][:1] == ["hot/2"]


def swap_world(cold: Sequence[float] = (345,)) -> World:
    """hot (100 %, 1000 B/s, five bundles of 200) and cold (0 %, 480 B/s): hot's budget is 500 -- two
    bundles, then a third overshoots unless cold sends one back (test_transfer_shedder_pulsar.py)."""
    return World().add("cold", 0.0, cold, tput=480.0).add("hot", 1.0, [200] * 5)


def test_a_swap_is_a_move_from_the_destination_with_its_loads() -> None:
    """Rule: a bundle swapped back is a decision from the destination to the source, carrying the
    destination's load as its source load and the source's as its destination load."""
    res = swap_world().shed(HALF)
    back = [u for u in res.decisions if u.src == "cold"]
    assert [(u.bundle, u.dst, u.throughput, u.src_load, u.dst_load) for u in back] == [
        ("cold/0", "hot", 345.0, 0.0, 1.0)
    ]


def test_a_swap_passes_over_bundles_it_may_not_send_back_and_tries_the_next() -> None:
    """Rule: the destination's bundles are read lightest first; one not owned by it, or refused by the
    guard, is passed over (``continue``) and the next may still be swapped back."""
    w = swap_world((5, 345))
    w.owners["cold/0"] = "elsewhere"
    assert ("cold/1", "cold", "hot") in moves(w.shed(HALF))
    res = swap_world((5, 345)).shed(HALF, transferable=lambda b, s, d: b != "cold/0")
    assert ("cold/1", "cold", "hot") in moves(res)


@pytest.mark.parametrize("refused", ["to hot", "from cold"])
def test_a_swap_asks_the_guard_with_its_own_source_and_destination(refused: str) -> None:
    """Rule: a swap is a move from the destination back to the source, and the guard is asked exactly
    that: a rule refusing moves *to* hot, or *from* cold, refuses the swap (hot's own moves to cold are
    not affected)."""

    def transferable(bundle: str, src: str, dst: str | None) -> bool:
        return dst != "hot" if refused == "to hot" else src != "cold"

    res = swap_world().shed(HALF, transferable=transferable)
    assert moves(res) == [("hot/0", "hot", "cold"), ("hot/1", "hot", "cold")]


@PLANS
def test_the_reason_is_the_first_trigger_that_holds(cfg: ShedConfig) -> None:
    """Rule: a move's reason is ``overloaded`` when the spread is strictly above the target, else
    ``underloaded`` when the least loaded broker is under the line: loads .5/0 have std exactly .25, so
    the reason is the under-load."""
    w = World().add("a", 0.5, [20, 32, 10, 20]).add("b", 0.0, [1, 1])
    res = w.shed(cfg)
    assert res.std == 0.25 and res.decisions
    assert {u.reason for u in res.decisions} == {"underloaded"} and res.reason == "underloaded"


def test_half_gap_counts_every_bundle_a_swap_sends_back() -> None:
    """Rule: everything a swap sends back counts as gained (both of cold's bundles here, 150 + 195), so
    the pair's next bundle fits its budget net of the swap: 600 - 345 + 200 <= 500."""
    res = swap_world((150, 195)).shed(HALF)
    assert moves(res) == [
        ("hot/0", "hot", "cold"),
        ("hot/1", "hot", "cold"),
        ("cold/0", "cold", "hot"),
        ("cold/1", "cold", "hot"),
        ("hot/2", "hot", "cold"),
        ("hot/3", "hot", "cold"),
    ]


def test_half_gap_swaps_back_bundles_of_one_byte_too() -> None:
    """Rule: a bundle of the destination with any traffic (1 B/s too) may be swapped back."""
    w = World().add("cold", 0.0, [1, 344], tput=100.0).add("hot", 1.0, [200] * 5)
    assert ("cold/0", "cold", "hot") in moves(w.shed(HALF))


def test_half_gap_projects_the_spread_with_the_net_of_each_pair() -> None:
    """Rule: after each pair the spread is projected with the pair's *net* move (what it sent less what
    the swap brought back): hot and cold end near the others, the spread is below the target, and the
    next pair (m2 -> m1) is not started."""
    w = swap_world().add("m1", 0.45, [1] * 30).add("m2", 0.55, [1] * 30)
    res = w.shed(HALF)
    assert {u.src for u in res.decisions} == {"hot", "cold"}


def test_half_gap_a_pair_that_moved_one_byte_is_a_pair() -> None:
    """Rule: a pair that moved anything (here a single bundle of 1 B/s: the source keeps its other one)
    counts as a pair, and the next source is paired with the next least loaded broker."""
    w = World().add("lo1", 0.0, [1, 1]).add("lo2", 0.1, [1, 1]).add("hi1", 1.0, [1, 1000])
    w.add("hi2", 0.9, [30, 20, 10])
    res = w.shed(HALF)
    assert ("hi1/0", "hi1", "lo1") in moves(res)
    assert {u.dst for u in res.decisions if u.src == "hi2"} == {"lo2"}


def test_a_second_swap_of_a_pair_counts_what_the_first_brought_back() -> None:
    """Rule: within a pair, each swap is sized with the traffic marked so far *net of what earlier swaps
    brought back*: hot's eight bundles of 100 go to cold with two swaps of 150 on the way."""
    w = World().add("cold", 0.0, [150, 150], tput=100.0).add("hot", 1.0, [100] * 8, tput=1000.0)
    assert moves(w.shed(HALF)) == [
        *[(f"hot/{i}", "hot", "cold") for i in range(5)],
        ("cold/0", "cold", "hot"),
        ("hot/5", "hot", "cold"),
        ("cold/1", "cold", "hot"),
        ("hot/6", "hot", "cold"),
    ]


def test_a_swap_must_leave_the_destination_strictly_below_the_source_s_throughput() -> None:
    """Rule: a bundle sent back must leave the destination *below* the source's throughput (1000 B/s):
    cold's 80 would leave it at exactly 1000 (480 + 400 + 200 - 80), so it is passed over and 345 goes."""
    res = swap_world((80, 345)).shed(HALF)
    back = [u.bundle for u in res.decisions if u.src == "cold"]
    assert back == ["cold/1"]


def test_load_share_is_zero_without_throughput() -> None:
    """Rule: the load a move of some bytes/s carries is its share of the broker's load, 0 when the broker
    reports no throughput."""
    from trimtab.balance.shed import load_share

    assert load_share(25.0, 0.5, 100.0) == 0.125
    assert load_share(25.0, 0.5, 0.0) == 0.0


def test_a_skipped_cycle_reports_the_unchanged_hit_count() -> None:
    """Rule: a cycle skipped before the trigger (no load data) neither counts nor resets the hit count,
    and says what it is."""
    w = World().add("cold", 0.1, [10]).add("hot", 0.9, [400, 300, 200, 100])
    w.brokers["new"] = True  # registered, no report yet
    res = w.shed(state=ShedState(hit_count=2))
    assert (res.reason, res.hit_count) == ("no_load_data", 2)


def test_an_isolation_cycle_remembers_its_moves_at_now() -> None:
    """Rule: the moves of an isolation cycle are remembered like any other: each bundle's grace period and
    its source's cool-down start now."""
    w = iso_world({"a": (0.8, [(HOT, 600.0), (rng(1), 100.0)]), "b": (0.1, [(rng(4), 10.0)])})
    st = ShedState()
    res = w.shed(ISO, state=st)
    assert [u.bundle for u in res.decisions] == [rng(1)]
    assert (st.recent_bundles, st.recent_brokers) == ({rng(1): NOW}, {"a": NOW})


def test_half_gap_a_source_without_figures_or_with_one_bundle_is_passed_over() -> None:
    """Rule: a source that reports no throughput (no figures to size the budget with) or a single bundle
    (the overload itself: it needs a split) is passed over, noted, and the next source is paired
    (``continue``)."""
    w = World().add("a", 0.0, [1, 1]).add("y", 0.8, [30, 20, 10]).add("z", 0.95, [500])
    res = w.shed(HALF)
    assert ("z/0", "sole_bundle") in res.skipped_bundles
    assert {u.src for u in res.decisions} == {"y"}
    w = World().add("a", 0.0, [1, 1]).add("y", 0.8, [30, 20, 10]).add("z", 0.95, [30, 20, 10], tput=0.0)
    res = w.shed(HALF)
    assert {u.src for u in res.decisions} == {"y"}


def test_half_gap_a_lone_source_without_throughput_has_no_load_data() -> None:
    """Rule: when the only source reports no throughput the cycle says ``no_load_data``; one reporting
    1 B/s is sized by it and sheds."""
    w = World().add("a", 0.0, [1, 1]).add("z", 0.95, [30, 20, 10], tput=0.0)
    assert w.shed(HALF).reason == "no_load_data"
    w = World().add("a", 0.0, [1, 1]).add("z", 0.95, [0.5, 0.25, 0.25], tput=1.0)
    assert w.shed(HALF).decisions


def test_to_target_takes_the_move_that_lowers_the_variance_most() -> None:
    """Rule: among the sources, the move chosen is the one that lowers the load variance most -- moving
    ``d`` across a gap ``g`` gains ``d (g - d)``: s1 moves .1 across 1 (.09), s2 .14 across .7 (.0784),
    so s1's goes first, though s2's is the larger share of its gap."""
    w = World().add("s1", 1.0, [90, 10]).add("s2", 0.7, [80, 20]).add("lo", 0.0, [1, 1])
    res = w.shed()
    assert moves(res)[0] == ("s1/1", "s1", "lo")


def test_to_target_tries_every_source_down_the_order() -> None:
    """Rule: the plan looks at every source by descending load, not only the most loaded ones: when the
    two heaviest have nothing that may move, the third's bundle goes."""
    w = World().add("a", 0.9, [30, 30, 30]).add("b", 0.8, [30, 30, 30]).add("c", 0.7, [30, 30, 30])
    w.add("lo", 0.0, [1, 1])
    st = ShedState(recent_bundles={f"{b}/{i}": NOW - 1 for b in "ab" for i in range(3)})
    res = w.shed(state=st)
    assert res.decisions and {u.src for u in res.decisions} == {"c"}


# ------------------------------------------------------------------------------------ half_gap: what a cycle says and counts


def test_half_gap_a_draining_destination_and_a_cooling_source_are_both_a_cool_down() -> None:
    """Rule: a cycle of half_gap that moved nothing because the brokers it paired sat out -- a draining
    destination passed over, then a source in its cool-down -- says ``cool_down``: each broker that sat
    out counts, the destination's and the source's alike."""
    w = World().add("a", 0.0, [10, 10], live=False).add("b", 0.125, [10, 10]).add("z", 1.0, [40, 30, 20])
    res = w.shed(HALF, state=ShedState(recent_brokers={"z": NOW - 2000}))
    assert (res.result, res.reason, res.decisions) == ("skip", "cool_down", [])


def test_half_gap_sole_bundles_and_pairs_that_moved_nothing_are_no_bundles() -> None:
    """Rule: a half_gap cycle that moved nothing says ``no_bundles`` when a source had nothing it could move
    -- a sole bundle, or bundles none of which went (here all in their grace period) -- even though a
    cooling broker sat out too: each such source counts, and it outweighs the cool-down."""
    w = World().add("a", 0.0, [1, 1]).add("x", 0.8, [30, 20, 10]).add("y", 0.9, [30, 20, 10])
    w.add("z", 1.0, [500])
    st = ShedState(recent_brokers={"x": NOW - 2000}, recent_bundles={f"y/{i}": NOW - 1 for i in range(3)})
    res = w.shed(HALF, state=st)
    assert (res.result, res.reason, res.decisions) == ("skip", "no_bundles", [])
    assert ("z/0", "sole_bundle") in res.skipped_bundles


def test_half_gap_projects_the_spread_from_the_loads_after_the_pair() -> None:
    """Rule: after a pair, the spread that decides the next pair is the std of the loads *as projected*:
    the source less and the destination plus the load the pair moved. From .25/.5/.75/1 (std .28), d sends
    .375 to a: the loads are .625/.5/.75/.625, std .088 -- under the target .125, b is not under-loaded
    nor c overloaded, so the next pair (c -> b) is not started."""
    w = World().add("a", 0.25).add("b", 0.5, [10, 10]).add("c", 0.75, [1] * 8)
    w.add("d", 1.0, [128, 128, 128, 640])  # its budget: 1024 x .75 / 2 = 384 B/s, .375 of its load
    res = w.shed(replace(HALF, target_std=0.125))
    assert moves(res) == [("d/0", "d", "a"), ("d/1", "d", "a"), ("d/2", "d", "a")]
    assert res.reason == "overloaded"


def test_half_gap_each_pair_takes_the_next_destination_up_to_max_broker_pairs() -> None:
    """Rule: each pair that moved something counts once towards ``max_broker_pairs`` and advances the
    destination to the next least loaded broker: with two pairs allowed and a draining broker at the bottom,
    z sheds to b, y to c, and x (a third pair) sheds nothing."""
    w = World().add("a", 0.0, [1, 1], live=False).add("b", 0.0, [1, 1]).add("c", 0.0, [1, 1])
    w.add("d", 0.0, [1, 1]).add("x", 0.8, [10] * 4).add("y", 0.9, [10] * 4).add("z", 1.0, [10] * 4)
    res = w.shed(replace(HALF, max_broker_pairs=2))
    assert {(u.src, u.dst) for u in res.decisions} == {("z", "b"), ("y", "c")}


# ------------------------------------------------------------------------------------ to_target: the order of the sources


def test_to_target_keeps_trying_sources_while_their_gap_could_beat_the_best_gain() -> None:
    """Rule: the plan stops trying sources only once the next one's gap ``g`` cannot beat the best gain so
    far (no move does better than ``g^2 / 4``) -- whatever that gain is, also above .25 (loads above
    100 %): s1 (200 %) can move only .25, a gain of .4375; s2 (187.5 %) moves .5, a gain of .6875, and goes
    first."""
    w = World().add("s1", 2.0, [80, 16, 16, 16]).add("s2", 1.875, [16, 16, 16, 12]).add("lo", 0.0, [1, 1])
    res = w.shed()
    assert moves(res)[0] == ("s2/0", "s2", "lo")


def test_to_target_a_source_down_to_the_least_loaded_does_not_end_the_step() -> None:
    """Rule: at each step the sources are tried by their load *now*, descending -- those that shed already
    by their projected load, merged with the others. a sheds .5 to d and is left at d's load (no gap); c,
    which still has one, is tried before a (by load, not by name) and sheds twice (two sources allowed:
    a and c)."""
    w = World().add("a", 1.0, [32, 16, 16]).add("c", 0.9, [8, 8, 56]).add("d", 0.0, [1, 1])
    res = w.shed(replace(CFG, target_std=0.0625, max_broker_pairs=2))
    assert moves(res) == [("a/0", "a", "d"), ("c/0", "c", "d"), ("c/1", "c", "d")]


def test_to_target_a_cooling_broker_below_the_most_loaded_is_no_source_either() -> None:
    """Rule: a broker in its cool-down is no source, wherever it is in the order: c (90 %, cooling) would
    lower the variance more than e (100 %, which can only move .125), but e's bundles are the ones that
    go."""
    w = World().add("e", 1.0, [48, 8, 8]).add("c", 0.9, [32, 32]).add("lo", 0.0, [1, 1])
    res = w.shed(state=ShedState(recent_brokers={"c": NOW - 2000}))
    assert moves(res)[0] == ("e/1", "e", "lo") and {u.src for u in res.decisions} == {"e"}


def test_to_target_the_overloaded_source_is_the_most_loaded_one_that_may_still_shed() -> None:
    """Rule: when only the overload holds (the spread within the target, the least loaded broker not
    under-loaded), the source is the most loaded broker that may still shed -- by name among those at the
    top load. d sheds .125 and then, tied with b at 87.5 %, has one bundle left (c sheds instead); at the
    third step (std .124) d is out of the running and b, above both lines (.625 and avg + target .85),
    sheds."""
    w = World().add("a", 0.375, [2, 16, 2], tput=64.0).add("b", 0.875, [2, 16], tput=64.0)
    w.add("c", 0.75, [32, 4, 8], tput=64.0).add("d", 1.0, [8, 8], tput=64.0)
    w.add("e", 0.625, [32, 16, 16], tput=64.0)
    res = w.shed(replace(CFG, target_std=0.125, overload_threshold=0.625, max_broker_pairs=4))
    assert moves(res) == [("d/0", "d", "a"), ("c/2", "c", "a"), ("b/0", "b", "a")]
    assert {u.reason for u in res.decisions} == {"overloaded"}
