"""The shedding settings Pulsar defines and trimtab's pure shedders honour (docs/configuration.md):

* ``shedding.lower_boundary_enabled`` -- ThresholdShedder's ``lowerBoundarySheddingEnabled``
  (``ThresholdShedder.tryLowerBoundaryShedding``);
* ``shedding.shed_bundles_with_policies`` -- ``loadBalancerSheddingBundlesWithPoliciesEnabled``
  (``TransferShedder.isLoadBalancerSheddingBundlesWithPoliciesEnabled``), for both shedders and both plans;
* ``shedding.unload_timeout_s`` -- ``namespaceBundleUnloadingTimeoutMs`` as ``UnloadScheduler`` waits with it
  (:func:`~trimtab.balance.shed.settle_moves`; the job around it is tests/unit/test_shedding_job.py's).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.support.shed_world import ShedWorld
from trimtab.balance.load import BrokerLoadData, BundleStats
from trimtab.balance.placement import Broker, IsolationPolicy, PlacementPolicy
from trimtab.balance.shed import (
    ShedConfig,
    ShedResult,
    ShedState,
    settle_moves,
    threshold_shedder,
    track_move,
    transfer_shedder,
)
from trimtab.channel.records import Record, State, make
from trimtab.config.settings import Settings, SheddingSettings

NOW = 10_000_000_000
MB = 1024 * 1024
TCFG = ShedConfig(threshold=0.10, min_unload_throughput=10 * MB)
LOWER = replace(TCFG, lower_boundary=True)


class World(ShedWorld):
    def add(self, b: str, load: float, bundles: list[float], *, ns: str | None = None) -> World:
        """Broker ``b`` at ``load`` with top bundles ``<ns or b>/<i>`` of these bytes/s."""
        report = BrokerLoadData(
            broker=b, weighted_max_ema=load, msg_throughput_in=sum(bundles), updated_at=NOW - 1000
        )
        self.put(
            report, [BundleStats(bundle=f"{ns or b}/{i}", msg_throughput_in=x) for i, x in enumerate(bundles)]
        )
        return self


def pip220_new_broker() -> World:
    """PIP-220's case ThresholdShedder misses: five brokers at 50% and a new one at 0%. The average is
    41.7%, so nobody reaches 51.7% (avg + 10%) and the new broker stays idle -- unless lower-boundary
    shedding is on (0% < 31.7%, avg - 10%)."""
    w = World()
    for i in range(5):
        w.add(f"b{i}", 0.5, [100 * MB, 100 * MB, 100 * MB, 100 * MB])
    return w.add("b5", 0.0, [])


def test_settings_reach_the_shedders() -> None:
    s = Settings(
        shedding=SheddingSettings(
            lower_boundary_enabled=True, shed_bundles_with_policies=True, unload_timeout_s=7
        )
    )
    cfg = ShedConfig.from_settings(s)
    assert (cfg.lower_boundary, cfg.shed_bundles_with_policies, cfg.unload_timeout_s) == (True, True, 7)
    cfg = ShedConfig.from_settings(Settings())
    assert (cfg.lower_boundary, cfg.shed_bundles_with_policies, cfg.unload_timeout_s) == (False, False, 60)


# ------------------------------------------------------------------------- lower-boundary shedding


def test_lower_boundary_sheds_toward_an_idle_broker_only_when_on() -> None:
    off = pip220_new_broker().run(threshold_shedder, None, TCFG, NOW)
    assert (off.result, off.decisions) == ("skip", [])
    on = pip220_new_broker().run(threshold_shedder, None, LOWER, NOW)
    assert on.result == "success" and on.reason == "underloaded"
    # the most loaded broker (a tie at 50%: b0 by name) sheds threshold x 50% = 5% of its 400 MB/s = 20 MB/s:
    # its heaviest bundle (100 MB/s) already covers it, and it goes to the idle broker
    assert [(u.bundle, u.src, u.dst, u.reason) for u in on.decisions] == [("b0/0", "b0", "b5", "underloaded")]


def test_lower_boundary_needs_a_broker_below_the_line() -> None:
    w = World()
    for i in range(4):
        w.add(f"b{i}", 0.5, [50 * MB, 50 * MB])
    w.add("b4", 0.45, [50 * MB, 50 * MB])  # avg .49: .45 is not below .39
    res = w.run(threshold_shedder, None, LOWER, NOW)
    assert res.decisions == []


def test_lower_boundary_keeps_the_minimum_throughput() -> None:
    res = pip220_new_broker().run(threshold_shedder, None, replace(LOWER, min_unload_throughput=25 * MB), NOW)
    assert res.decisions == [] and ("b0", "below_min_throughput") in res.skipped_bundles


def test_lower_boundary_only_when_nothing_else_shed() -> None:
    w = pip220_new_broker().add("hot", 0.95, [100 * MB, 100 * MB])  # avg .49: .95 >= .59, the plain rule
    res = w.run(threshold_shedder, None, LOWER, NOW)
    assert {u.reason for u in res.decisions} == {"overloaded"} and {u.src for u in res.decisions} == {"hot"}


def test_lower_boundary_passes_over_single_bundle_and_cooling_brokers() -> None:
    # b1 .. b5 at 50% (b1 with a single bundle), b6 idle: avg 41.7%, nobody at 51.7%, b6 below 31.7%
    w = World().add("b1", 0.5, [400 * MB])
    for b in ("b2", "b3", "b4", "b5"):
        w.add(b, 0.5, [200 * MB, 200 * MB])
    w.add("b6", 0.0, [])
    res = w.run(threshold_shedder, None, LOWER, NOW)
    assert {u.src for u in res.decisions} == {"b2"}  # b1 has a single bundle; the tie goes by name
    res = w.run(threshold_shedder, ShedState(recent_brokers={"b2": NOW - 5000}), LOWER, NOW)
    assert {u.src for u in res.decisions} == {"b3"}  # b2 is cooling down


# ------------------------------------------------------------------------ bundles with policies


def policy_world() -> World:
    """hot's bundles are in namespace t/iso (an isolation policy) but one, t/free/0; cold takes load."""
    w = World().add("cold", 0.1, [10 * MB], ns="t/other")
    w.add("hot", 0.9, [300 * MB, 200 * MB, 100 * MB], ns="t/iso")
    w.put(
        BrokerLoadData(broker="hot", weighted_max_ema=0.9, msg_throughput_in=650 * MB, updated_at=NOW - 1000),
        [*w.top["hot"].bundles, BundleStats(bundle="t/free/0", msg_throughput_in=50 * MB)],
    )
    return w


def has_policies(bundle: str) -> bool:
    return bundle.startswith("t/iso/")


@pytest.mark.parametrize(
    ("fn", "cfg"),
    [
        (transfer_shedder, ShedConfig(hit_count_threshold=0)),
        (transfer_shedder, ShedConfig(hit_count_threshold=0, plan="half_gap")),
        (threshold_shedder, replace(TCFG, min_unload_throughput=0)),
    ],
)
def test_bundles_with_policies_move_only_when_allowed(fn: object, cfg: ShedConfig) -> None:
    def run(c: ShedConfig) -> ShedResult:
        return policy_world().run(fn, None, c, NOW, None, has_policies=has_policies)  # type: ignore[arg-type]

    res = run(cfg)
    assert {u.bundle for u in res.decisions} <= {"t/free/0"}
    assert any(why == "has_policies" for _, why in res.skipped_bundles)
    res = run(replace(cfg, shed_bundles_with_policies=True))
    assert any(u.bundle.startswith("t/iso/") for u in res.decisions)
    assert not any(why == "has_policies" for _, why in res.skipped_bundles)


def test_placement_knows_which_namespaces_have_policies() -> None:
    policy = PlacementPolicy(
        [Broker("b1:1"), Broker("b2:1")],
        anti_affinity_groups={"t/grouped": "G"},
        isolation_policies=[
            IsolationPolicy(name="p", namespaces=("t/iso.*",), primary=("b1",), secondary=(), min_limit=1)
        ],
    )
    assert policy.has_policies("t/iso-1") and policy.has_policies("t/grouped")
    assert not policy.has_policies("t/plain")


# --------------------------------------------------------------------------------- unload timeout


def releasing(version: int) -> Record:
    return make(State.RELEASING, src="hot", dst="cold", version=version, ts=0, writer="leader")


def test_settle_waits_then_counts_completed_and_timed_out_moves() -> None:
    cfg = ShedConfig(unload_timeout_s=60)
    st = ShedState(recent_bundles={"a": NOW, "b": NOW}, recent_brokers={"hot": NOW, "warm": NOW})
    track_move(st, "a", "hot", 5, NOW)
    track_move(st, "b", "warm", 3, NOW)
    table: dict[str, Record | None] = {"a": releasing(5), "b": releasing(3)}
    out = settle_moves(st, table.get, cfg, NOW + 30_000)
    assert [m.bundle for m in out.pending] == ["a", "b"] and st.moves.keys() == {"a", "b"}
    table["a"] = make(State.OWNED, dst="cold", src="hot", version=7, ts=0, writer="cold")  # done
    out = settle_moves(st, table.get, cfg, NOW + 59_999)
    assert [m.bundle for m in out.pending] == ["b"]  # the batch waits for its last move
    out = settle_moves(st, table.get, cfg, NOW + 60_000)
    assert ([m.bundle for m in out.completed], [m.bundle for m in out.timed_out]) == (["a"], ["b"])
    assert not st.moves
    # a completed move is remembered as moved; a timed-out one is not, nor is its source's cool-down
    assert st.recent_bundles == {"a": NOW} and st.recent_brokers == {"hot": NOW}


def test_settle_keeps_a_source_s_cool_down_when_another_of_its_moves_completed() -> None:
    st = ShedState(recent_bundles={"a": NOW, "b": NOW}, recent_brokers={"hot": NOW})
    track_move(st, "a", "hot", 5, NOW)
    track_move(st, "b", "hot", 5, NOW)
    table = {"a": make(State.FREE, src="hot", version=6, ts=0, writer="hot"), "b": releasing(5)}
    out = settle_moves(st, table.get, ShedConfig(unload_timeout_s=1), NOW + 1000)
    assert [m.bundle for m in out.timed_out] == ["b"]
    assert st.recent_brokers == {"hot": NOW} and st.recent_bundles == {"a": NOW}


@pytest.mark.parametrize(
    ("rec", "done"),
    [
        (None, True),  # tombstoned
        (make(State.FREE, src="hot", version=6, ts=0, writer="hot"), True),  # unloaded
        (make(State.ASSIGNING, dst="cold", src="hot", version=6, ts=0, writer="hot"), False),  # still moving
        (make(State.OWNED, dst="cold", src="hot", version=7, ts=0, writer="cold"), True),  # transferred
        (make(State.OWNED, dst="hot", version=5, ts=0, writer="hot"), False),  # our Releasing not seen yet
    ],
)
def test_a_move_is_done_once_the_bundle_left_the_in_flight_states(rec: Record | None, done: bool) -> None:
    st = ShedState()
    track_move(st, "a", "hot", 5, NOW)
    out = settle_moves(st, {"a": rec}.get, ShedConfig(), NOW + 1)
    assert (out.completed != []) is done and (out.pending != []) is (not done)
