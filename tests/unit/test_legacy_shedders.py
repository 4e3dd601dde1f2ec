"""Pulsar's modular-load-manager shedders (sim/legacy.py; digest pulsar_elb.md 4.4), hand-computed cases.

Every case builds real :class:`BrokerLoadData` reports from cpu / memory / bandwidth usages through
:func:`with_ema` (the reporter's derivation), so the shedders read ``max_resource_usage`` and
``weighted_max`` as they would in the simulator. Throughputs are in MiB/s (``M``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec
import pytest

from tests.support.shed_world import ShedWorld
from trimtab.balance.load import BrokerLoadData, BundleStats, Usage, Weights, with_ema
from trimtab.balance.shed import ShedConfig, ShedResult, ShedState, transfer_shedder
from trimtab.sim.legacy import (
    LegacyConfig,
    legacy_threshold_shedder,
    overload_shedder,
    uniform_load_shedder,
)

M = 1024 * 1024
NOW = 10_000_000_000
MINUTE = 60_000
CFG = ShedConfig()  # trimtab's defaults: 30 min grace, 30 min report TTL

Shedder = Callable[..., ShedResult]


class World(ShedWorld):
    def add(
        self,
        b: str,
        cpu: float,
        tputs: Sequence[float] = (),
        *,
        rates: Sequence[float] | None = None,
        tput: float | None = None,
        rate: float | None = None,
        n_bundles: int | None = None,
        memory: float = 0.0,
        bw_out: float = 0.0,
        updated_at: int = NOW - 1000,
    ) -> World:
        """Broker ``b`` at ``cpu`` % with top bundles ``b/0``, ``b/1``, ... of throughputs ``tputs`` (bytes/s)
        and message rates ``rates``; its totals default to the sums, its bundle count to their number."""
        rs = list(rates) if rates is not None else [0.0] * len(tputs)
        stats = [
            BundleStats(bundle=f"{b}/{i}", msg_throughput_in=t, msg_rate_in=r)
            for i, (t, r) in enumerate(zip(tputs, rs, strict=True))
        ]
        sample = BrokerLoadData(
            broker=b,
            cpu=Usage(cpu, 100.0),
            memory=Usage(memory, 100.0),
            bandwidth_out=Usage(bw_out, 100.0),
            msg_throughput_in=sum(tputs) if tput is None else tput,
            msg_rate_in=sum(rs) if rate is None else rate,
            bundles=len(stats) if n_bundles is None else n_bundles,
            updated_at=updated_at,
        )
        self.put(with_ema(sample, None, Weights(), 0.9), stats)
        return self

    def shed(
        self,
        fn: Shedder,
        state: ShedState | None = None,
        *,
        now: int = NOW,
        cfg: ShedConfig = CFG,
        legacy: LegacyConfig | None = None,
        transferable: Callable[[str, str, str | None], bool] | None = None,
    ) -> ShedResult:
        kw = {} if legacy is None else {"legacy": legacy}
        return self.run(fn, state, cfg, now, transferable, **kw)


def bundles(res: ShedResult) -> list[str]:
    assert all(u.dst is None for u in res.decisions)  # legacy shedders only unload
    return [u.bundle for u in res.decisions]


LEGACY = [overload_shedder, legacy_threshold_shedder, uniform_load_shedder]


# ------------------------------------------------------------------------------------------------ common


@pytest.mark.parametrize("fn", LEGACY)
def test_nothing_with_at_most_one_live_broker(fn: Shedder) -> None:
    assert World().shed(fn).reason == "no_brokers"
    # doLoadShedding: "Only 1 broker available: no load shedding will be performed"
    res = World().add("a", 99, [10 * M, 10 * M]).shed(fn)
    assert (res.result, res.reason, res.decisions) == ("skip", "no_brokers", [])


@pytest.mark.parametrize("fn", LEGACY)
def test_no_load_data_and_outdated_reports(fn: Shedder) -> None:
    w = World()
    w.brokers = {"a": True, "b": True}
    assert w.shed(fn).reason == "no_load_data"
    # a report older than the TTL (1800 s) is left out: only "b" counts, alone it is balanced
    w = World().add("a", 99, [90 * M, 10 * M], rates=[9000, 10], updated_at=NOW - 1_800_001).add("b", 10)
    res = w.shed(fn)
    assert res.decisions == [] and set(res.loads) == {"b"}


@pytest.mark.parametrize("fn", LEGACY)
def test_a_live_broker_without_a_report_does_not_stop_the_cycle(fn: Shedder) -> None:
    # Unlike TransferShedder, the modular load manager sheds over the brokers it has data for.
    w = World().add("a", 99, [60 * M, 60 * M, 60 * M], rates=[6000, 1500, 1500]).add("b", 1, [M], rates=[10])
    w.brokers["new"] = True
    assert w.shed(fn).result == "success"


def test_positional_call_like_trimtabs_shedders() -> None:
    # sim/policies.py calls every shedder with the 8 positional arguments of transfer_shedder.
    w = World().add("a", 95, [40 * M, 30 * M]).add("b", 10, [M])
    res = overload_shedder(w.brokers, w.loads, w.top, w.owner, ShedState(), CFG, NOW, lambda *_: True)
    assert bundles(res) == ["a/0"]


# ------------------------------------------------------------------------------------------ OverloadShedder


def test_overload_sheds_the_largest_bundle_at_least_one() -> None:
    # a: max usage 95% >= 85%: offload (.95 - .85 + .05) x 100 MiB/s = 15 MiB/s; its largest bundle (40)
    # already covers it. b at 50% is ignored.
    w = World().add("a", 95, [40 * M, 30 * M, 20 * M, 10 * M]).add("b", 50, [10 * M, 10 * M])
    st = ShedState()
    res = w.shed(overload_shedder, st)
    assert bundles(res) == ["a/0"]
    u = res.decisions[0]
    assert (u.src, u.reason, u.throughput) == ("a", "overloaded", 40 * M)
    assert u.src_load == pytest.approx(0.95)
    assert (res.result, res.reason) == ("success", "overloaded")
    # remembered like trimtab's shedders do: grace period for the bundle, the broker's last shed
    assert st.recent_bundles == {"a/0": NOW} and st.recent_brokers == {"a": NOW}


def test_overload_marks_bundles_until_the_budget_is_reached() -> None:
    # 97%: offload (.97 - .85 + .05) x 10 MiB/s = 1.7 MiB/s from ten 1 MiB/s bundles:
    # a/0 (marked 1 < 1.7), a/1 (marked 2 >= 1.7: stop)
    w = World().add("a", 97, [M] * 10).add("b", 10, [M])
    assert bundles(w.shed(overload_shedder)) == ["a/0", "a/1"]


def test_overload_offloads_down_to_5_percent_under_the_threshold() -> None:
    # 90%: offload (.90 - .85 + .05) x 100 MiB/s = 10 MiB/s: a/0 (6 < 10), a/1 (10.5 >= 10: stop)
    w = World().add("a", 90, [6 * M, 4.5 * M, 4 * M, 3 * M], tput=100 * M).add("b", 10, [M])
    assert bundles(w.shed(overload_shedder)) == ["a/0", "a/1"]


def test_overload_threshold_is_inclusive_and_underloaded_brokers_are_ignored() -> None:
    # exactly 85%: offload (.85 - .85 + .05) x 10 = .5 MiB/s -> one bundle; 84.9% and an idle broker: nothing
    w = World().add("a", 85, [5 * M, 5 * M]).add("b", 84.9, [5 * M, 5 * M]).add("c", 0)
    assert bundles(w.shed(overload_shedder)) == ["a/0"]
    w = World().add("b", 84.9, [5 * M, 5 * M]).add("c", 0)
    res = w.shed(overload_shedder)
    assert (res.result, res.reason, res.decisions) == ("skip", "balanced", [])


def test_overload_uses_the_unweighted_max_over_cpu_and_bandwidth_not_memory() -> None:
    # memory 99% does not count (getMaxResourceUsage); bandwidth out 90% does
    w = World().add("a", 50, [5 * M, 5 * M], memory=99).add("b", 10, [M])
    assert w.shed(overload_shedder).reason == "balanced"
    w = World().add("a", 50, [5 * M, 5 * M], bw_out=90).add("b", 10, [M])
    assert bundles(w.shed(overload_shedder)) == ["a/0"]


def test_overload_sole_bundle_is_not_shed() -> None:
    w = World().add("a", 99, [100 * M]).add("b", 10, [M])
    res = w.shed(overload_shedder)
    assert (res.result, res.reason, res.decisions) == ("skip", "no_bundles", [])
    assert ("a/0", "sole_bundle") in res.skipped_bundles


def test_overload_skips_grace_period_foreign_and_refused_bundles() -> None:
    # budget 15 MiB/s; a/0 moved a minute ago (grace), the channel says a/1 is b's, a/2 may not move:
    # a/3 (10 < 15) is taken, then nothing is left
    w = World().add("a", 95, [40 * M, 30 * M, 20 * M, 10 * M]).add("b", 50, [10 * M, 10 * M])
    w.owners["a/1"] = "b"
    st = ShedState(recent_bundles={"a/0": NOW - MINUTE})
    res = w.shed(overload_shedder, st, transferable=lambda bundle, src, dst: bundle != "a/2")
    assert bundles(res) == ["a/3"]
    assert {("a/0", "grace_period"), ("a/1", "not_owner"), ("a/2", "not_transferable")} <= set(
        res.skipped_bundles
    )
    # the grace period (30 min) is over: a/0 is eligible again and forgotten by the state
    st = ShedState(recent_bundles={"a/0": NOW - 1_800_001})
    assert bundles(w.shed(overload_shedder, st)) == ["a/0"]
    assert st.recent_bundles == {"a/0": NOW}


def test_overload_always_leaves_the_broker_a_bundle() -> None:
    # 100%: offload .2 x 100 MiB/s = 20 MiB/s but the report only shows two 1 MiB/s bundles and the broker
    # has two: Pulsar would unload both (marked 1, then 2 < 20); trimtab's rule keeps one.
    w = World().add("a", 100, [M, M], tput=100 * M).add("b", 10, [M])
    assert bundles(w.shed(overload_shedder)) == ["a/0"]
    # ... unless its report says it has more (idle or beyond the top k): then both may go
    w = World().add("a", 100, [M, M], tput=100 * M, n_bundles=3).add("b", 10, [M])
    assert bundles(w.shed(overload_shedder)) == ["a/0", "a/1"]


def test_overload_counts_bundles_by_the_channel_not_a_stale_report() -> None:
    # a's reports still list three bundles, but two have moved to b since: it has one left and keeps it
    w = World().add("a", 99, [50 * M, 30 * M, 20 * M]).add("b", 10, [M])
    w.owners.update({"a/1": "b", "a/2": "b"})
    res = w.shed(overload_shedder)
    assert (res.result, res.reason, res.decisions) == ("skip", "no_bundles", [])


# ------------------------------------------------------------------------------------- ThresholdShedder


def test_threshold_sheds_above_avg_plus_threshold() -> None:
    # usages [90, 30, 30]%: first cycle, EMA = usage; avg 50%, a: 90 >= 50 + 10.
    # offload (.90 - .50 - .10 + .05) x 100 MiB/s = 35 MiB/s >= 10 MiB/s:
    # a/0 (30 < 35), a/1 (35.5 >= 35: stop)
    w = (
        World()
        .add("a", 90, [30 * M, 5.5 * M, 5 * M, 4 * M], tput=100 * M)
        .add("b", 30, [10 * M, 10 * M])
        .add("c", 30, [10 * M, 10 * M])
    )
    st = ShedState()
    res = w.shed(legacy_threshold_shedder, st)
    assert bundles(res) == ["a/0", "a/1"]
    assert res.avg == pytest.approx(0.5)
    assert st.usage_ema == pytest.approx({"a": 0.9, "b": 0.3, "c": 0.3})
    assert res.decisions[0].src_load == pytest.approx(0.9)


def test_threshold_uses_its_own_ema_kept_across_cycles() -> None:
    # Three brokers at 50%, then a jumps to 100%. The shedder's EMA (history .9) of a:
    #   cycle 1: .5 (first sample)   2: .9*.5 + .1*1 = .55   3: .595   4: .6355   5: .67195
    # b and c stay at .5, so avg = (ema_a + 1) / 3 and a sheds once ema_a >= avg + .1, i.e. ema_a >= .65:
    #   cycle 4: avg .545167, needs .645167 > .6355 -> nothing
    #   cycle 5: avg .557317, needs .657317 <= .67195 -> offload (.67195 - .557317 - .1 + .05) x 200 MiB/s
    #            = 12.93 MiB/s >= 10: a/0 (80 MiB/s, at least one)
    st = ShedState()
    expected = [0.5, 0.55, 0.595, 0.6355, 0.67195]
    for cycle, ema_a in enumerate(expected, start=1):
        now = NOW + cycle * MINUTE
        w = (
            World()
            .add("a", 50 if cycle == 1 else 100, [80 * M, 60 * M, 40 * M, 20 * M], updated_at=now - 1000)
            .add("b", 50, [50 * M, 50 * M], updated_at=now - 1000)
            .add("c", 50, [50 * M, 50 * M], updated_at=now - 1000)
        )
        res = w.shed(legacy_threshold_shedder, st, now=now)
        assert st.usage_ema["a"] == pytest.approx(ema_a)
        assert st.usage_ema["b"] == pytest.approx(0.5)
        assert res.avg == pytest.approx((ema_a + 1.0) / 3)
        if cycle < 5:
            assert (res.result, res.reason, res.decisions) == ("skip", "balanced", [])
    assert bundles(res) == ["a/0"]
    assert res.decisions[0].src_load == pytest.approx(0.67195)


def test_threshold_minimum_throughput() -> None:
    # [90, 30, 30]% but a moves only 20 MiB/s: .35 x 20 = 7 MiB/s < 10 MiB/s -> nothing
    w = World().add("a", 90, [10 * M, 10 * M]).add("b", 30, [M, M]).add("c", 30, [M, M])
    res = w.shed(legacy_threshold_shedder)
    assert (res.result, res.reason, res.decisions) == ("skip", "below_min_throughput", [])
    assert ("a", "below_min_throughput") in res.skipped_bundles
    # with a 5 MiB/s minimum it sheds a/0 (10 MiB/s covers the 7)
    res = w.shed(legacy_threshold_shedder, legacy=LegacyConfig(min_throughput=5 * M))
    assert bundles(res) == ["a/0"]


def test_threshold_usage_above_100_percent_uses_the_signals_within_their_limits() -> None:
    # cpu 150% (a misconfigured limit): recomputed from the signals <= 100%: bandwidth out 40%
    w = World().add("a", 150, [M, M], bw_out=40).add("b", 20, [M, M])
    st = ShedState()
    w.shed(legacy_threshold_shedder, st)
    assert st.usage_ema == pytest.approx({"a": 0.4, "b": 0.2})


def test_threshold_nothing_when_the_average_is_zero() -> None:
    w = World().add("a", 0, [M, M]).add("b", 0, [M])
    res = w.shed(legacy_threshold_shedder)
    assert (res.result, res.reason, res.decisions) == ("skip", "no_load", [])


def pip220_small() -> World:
    """PIP-220's first case: usages [12, 2, 1, 1]%, throughput proportional (100 MiB/s per 1%)."""
    return (
        World()
        .add("a", 12, [400 * M, 300 * M, 300 * M, 200 * M])
        .add("b", 2, [200 * M])
        .add("c", 1, [100 * M])
        .add("d", 1, [100 * M])
    )


def pip220_new_broker() -> World:
    """PIP-220's second case: five brokers at 50% and a new one at 0% (400 MiB/s per loaded broker)."""
    w = World()
    for i in range(5):
        w.add(f"b{i}", 50, [100 * M] * 4)
    return w.add("b5", 0)


def run_cycles(
    make: Callable[[], World],
    fn: Shedder,
    n: int,
    legacy: LegacyConfig | None = None,
    cfg: ShedConfig = CFG,
) -> list[ShedResult]:
    """``n`` shedding cycles a minute apart over the same usages, with fresh reports each time."""
    st = ShedState()
    out = []
    for k in range(n):
        w = make()
        now = NOW + k * MINUTE
        w.loads = {b: msgspec.structs.replace(d, updated_at=now - 1000) for b, d in w.loads.items()}
        out.append(w.shed(fn, st, now=now, cfg=cfg, legacy=legacy))
    return out


def test_pip220_threshold_shedder_does_not_shed_12_2_1_1() -> None:
    # avg (12 + 2 + 1 + 1) / 4 = 4%; a needs >= 4 + 10 = 14% > 12%: never, however long we wait
    # (constant usages keep the EMA constant); lower-boundary shedding does not help either: nobody is
    # below 4 - 10 = -6%.
    for legacy in (LegacyConfig(), LegacyConfig(lower_boundary_shedding=True)):
        for res in run_cycles(pip220_small, legacy_threshold_shedder, 10, legacy=legacy):
            assert (res.result, res.reason, res.decisions) == ("skip", "balanced", [])
            assert res.avg == pytest.approx(0.04)
    # the harness can shed: with a 5% threshold, a (12 >= 4 + 5) offloads (.12 - .04 - .05 + .05) x 1200
    # = 96 MiB/s: a/0
    [res] = run_cycles(pip220_small, legacy_threshold_shedder, 1, legacy=LegacyConfig(threshold=0.05))
    assert bundles(res) == ["a/0"]


def test_pip220_threshold_shedder_does_not_shed_50x5_0() -> None:
    # avg 250 / 6 = 41.67%; the loaded brokers need >= 51.67% > 50%: the new broker stays idle
    for res in run_cycles(pip220_new_broker, legacy_threshold_shedder, 10):
        assert (res.result, res.reason, res.decisions) == ("skip", "balanced", [])
        assert res.avg == pytest.approx(250 / 6 / 100)


def test_pip220_lower_boundary_shedding_catches_the_idle_broker() -> None:
    # lowerBoundarySheddingEnabled: b5 (0%) < 41.67 - 10 = 31.67%, so the most loaded broker with more than
    # one bundle (b0..b4 tie at 50%: b0 by name) sheds .10 x .5 x 400 MiB/s = 20 MiB/s >= 10: b0/0
    [res] = run_cycles(
        pip220_new_broker, legacy_threshold_shedder, 1, legacy=LegacyConfig(lower_boundary_shedding=True)
    )
    assert bundles(res) == ["b0/0"]
    assert (res.result, res.reason) == ("success", "underloaded")
    # the 20 MiB/s is checked against the minimum: 18 MiB/s lets it through, 21 MiB/s does not
    for minimum, shed in ((18 * M, True), (21 * M, False)):
        legacy = LegacyConfig(lower_boundary_shedding=True, min_throughput=minimum)
        [res] = run_cycles(pip220_new_broker, legacy_threshold_shedder, 1, legacy=legacy)
        assert bool(res.decisions) is shed


def test_pip220_transfer_shedder_sheds_12_2_1_1_after_its_hit_count() -> None:
    # std is only 1.2% (< 25%) but c's throughput EMA (100 MiB/s) < 1200 x .125 = 150: under-loaded.
    # Hit count 3: cycles 1-3 wait, cycle 4 pairs a with c and moves about half the gap:
    # (.12 - .01) / 2 = .055 -> 1200 x .055 / .12 = 550 MiB/s: a/0 (400); 300 and 200 would overshoot
    results = run_cycles(pip220_small, transfer_shedder, 4)
    assert [r.reason for r in results[:3]] == ["hit_count"] * 3
    assert results[3].result == "success" and results[3].reason == "underloaded"
    assert ("a/0", "a", "c") in [(u.bundle, u.src, u.dst) for u in results[3].decisions]


def test_pip220_transfer_shedder_fills_the_new_broker_after_its_hit_count() -> None:
    # std 18.6% (< 25%) but b5 (0) < avg x .125: under-loaded. Cycle 4 acts.
    # Planned to the target (the default): one bundle (100 MiB/s of b0, the first of the tied sources) lifts
    # b5 to .125 >= avg x .125 = .052, and the trigger no longer holds.
    results = run_cycles(pip220_new_broker, transfer_shedder, 4)
    assert [r.reason for r in results[:3]] == ["hit_count"] * 3
    last = results[3]
    assert (last.result, last.reason) == ("success", "underloaded")
    assert [(u.bundle, u.dst) for u in last.decisions] == [("b0/0", "b5")]
    # Pulsar's half-gap pairs: b4 (last by name among the 50% ones) with b5: half the gap (.25) ->
    # 400 x .25 / .5 = 200 MiB/s: b4/0 and b4/1 go to b5
    last = run_cycles(pip220_new_broker, transfer_shedder, 4, cfg=ShedConfig(plan="half_gap"))[3]
    assert (last.result, last.reason) == ("success", "underloaded")
    assert [(u.bundle, u.dst) for u in last.decisions] == [("b4/0", "b5"), ("b4/1", "b5")]


# ------------------------------------------------------------------------------------ UniformLoadShedder


def test_uniform_by_message_rate_takes_the_bundles_that_fit() -> None:
    # rates a 10000, b 4000, c 6000 msg/s: (10000 - 4000) x 100 / 4000 = 150% > 50%.
    # need (int)(6000 x .2) = 1200 >= 1000. a's bundles by rate: 5000, 2500 do not fit; 1000 fits
    # (1200 left -> 200); 800 and 700 do not.
    w = (
        World()
        .add("a", 50, [M] * 5, rates=[5000, 2500, 1000, 800, 700])
        .add("b", 50, [M] * 4, rates=[1000] * 4)
        .add("c", 50, [M] * 4, rates=[1500] * 4)
    )
    res = w.shed(uniform_load_shedder)
    assert bundles(res) == ["a/2"]
    assert res.decisions[0].src_load == 10000  # the figure it compared: msg/s
    assert res.loads == {"a": 10000, "b": 4000, "c": 6000}


def test_uniform_by_throughput_when_rates_are_even() -> None:
    # rates even (1000 each: 0%); throughputs 50 vs 10 MiB/s: 5 > 4.
    # need (int)(40 MiB x .2) = 8 MiB/s >= 1 MiB/s. a's bundles: 20, 15 do not fit; 6 fits (-> 2 left);
    # 2 fits (-> 0); 1 does not.
    w = (
        World()
        .add("a", 50, [20 * M, 15 * M, 6 * M, 2 * M, 1 * M], rates=[200] * 5, tput=50 * M)
        .add("b", 50, [5 * M, 5 * M], rates=[500, 500])
    )
    assert bundles(w.shed(uniform_load_shedder)) == ["a/2", "a/3"]
    # maxUnloadBundleNumPerShedding = 1
    assert bundles(w.shed(uniform_load_shedder, legacy=LegacyConfig(max_unload_bundles=1))) == ["a/2"]


def test_uniform_remainder_shrinks_by_the_truncated_rate() -> None:
    # need (int)(6000 x .2) = 1200; 1000.9 fits and the remainder drops by (int)1000.9 = 1000 (Java's
    # MutableInt.add of a double), to 200, so 199.5 fits too (it would not against 1200 - 1000.9 = 199.1)
    w = (
        World()
        .add("a", 50, [M] * 4, rates=[5000, 3799.6, 1000.9, 199.5], rate=10000)
        .add("b", 50, [M] * 4, rates=[1000] * 4)
    )
    assert bundles(w.shed(uniform_load_shedder)) == ["a/2", "a/3"]


def test_uniform_minimum_amounts() -> None:
    # rates 1500 vs 800: 87.5% > 50% but (int)(700 x .2) = 140 < 1000 msg/s
    w = World().add("a", 50, [M, M], rates=[750, 750]).add("b", 50, [M, M], rates=[400, 400])
    res = w.shed(uniform_load_shedder)
    assert (res.result, res.reason, res.decisions) == ("skip", "below_min_unload", [])


def test_uniform_balanced() -> None:
    # rates 1400 vs 1000: 40% <= 50%; throughputs 14 vs 10 MiB/s: 1.4 <= 4
    w = World().add("a", 50, [7 * M, 7 * M], rates=[700, 700]).add("b", 50, [5 * M, 5 * M], rates=[500, 500])
    res = w.shed(uniform_load_shedder)
    assert (res.result, res.reason, res.decisions) == ("skip", "balanced", [])


def test_uniform_an_idle_broker_counts_as_one() -> None:
    # b has no traffic: its rate counts as 1. need (int)((6000 - 1) x .2) = 1199: a's 3000 and 1500 do not
    # fit, 1000 does (-> 199), 500 does not.
    w = World().add("a", 50, [M] * 4, rates=[3000, 1500, 1000, 500]).add("b", 0)
    assert bundles(w.shed(uniform_load_shedder)) == ["a/2"]
    # exactly 1, and the amount truncated like Java's (int): a at 5005.75 msg/s -> (int)(5004.75 x .2) =
    # (int)1000.95 = 1000, so a 1001 msg/s bundle does not fit; at 5006.25 -> (int)1001.05 = 1001, it does
    w = World().add("a", 50, [M] * 3, rates=[3000, 1001, 1004.75]).add("b", 0)
    res = w.shed(uniform_load_shedder)
    assert (res.result, res.reason, res.decisions) == ("skip", "no_bundles", [])
    w = World().add("a", 50, [M] * 3, rates=[3000, 1001, 1005.25]).add("b", 0)
    assert bundles(w.shed(uniform_load_shedder)) == ["a/1"]


def test_uniform_leaves_a_bundle_and_skips_sole_bundle_brokers() -> None:
    # need (int)(11999 x .2) = 2399: both of a's bundles fit (1200, then 1100 <= 1199) -- Pulsar would empty
    # the broker; trimtab's rule keeps one
    w = World().add("a", 50, [M, M], rates=[1200, 1100], rate=12000).add("b", 0)
    assert bundles(w.shed(uniform_load_shedder)) == ["a/0"]
    w = World().add("a", 50, [M], rates=[12000]).add("b", 0)
    res = w.shed(uniform_load_shedder)
    assert (res.result, res.reason, res.decisions) == ("skip", "no_bundles", [])
    assert ("a/0", "sole_bundle") in res.skipped_bundles


def test_uniform_respects_grace_period_and_ownership() -> None:
    # as in the rate case, but a/2 moved recently and a/4 (700) is now owned elsewhere:
    # 5000, 2500 no; 1000 grace; 800 fits (1200 -> 400); 700 not owned
    w = (
        World()
        .add("a", 50, [M] * 5, rates=[5000, 2500, 1000, 800, 700])
        .add("b", 50, [M] * 4, rates=[1000] * 4)
        .add("c", 50, [M] * 4, rates=[1500] * 4)
    )
    w.owners["a/4"] = "c"
    res = w.shed(uniform_load_shedder, ShedState(recent_bundles={"a/2": NOW - MINUTE}))
    assert bundles(res) == ["a/3"]
