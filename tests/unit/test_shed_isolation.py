"""``shedding.isolate_hot_bundles`` (issue 32 point 6): a hot topic cut out into a bundle of its own
(split.hot_topic_share) gets a broker to itself -- the transfer shedder moves the other bundles off that
broker and moves nothing onto it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.shed_world import ShedWorld
from trimtab.balance.load import BrokerLoadData, BundleStats
from trimtab.balance.shed import (
    ShedConfig,
    ShedResult,
    ShedState,
    isolated,
    isolating_brokers,
    transfer_shedder,
)

NOW = 10_000_000_000
ON = ShedConfig(hit_count_threshold=0, isolate_hot_bundles=True)
HOT = "t/hot/0x40000000_0x40000001"  # one hash wide: a cut-out hot topic


def bundle(i: int) -> str:
    return f"t/ns/0x{i * 0x100:08x}_0x{(i + 1) * 0x100:08x}"


class World(ShedWorld):
    def loads_of(self) -> dict[str, float]:
        return {b: d.weighted_max_ema for b, d in self.loads.items()}

    def tput_of(self) -> dict[str, float]:
        return {b: d.throughput for b, d in self.loads.items()}


def world(spec: dict[str, tuple[float, list[tuple[str, float]]]]) -> World:
    w = World()
    for b, (load, bundles) in spec.items():
        t = sum(x for _, x in bundles) or 1.0
        report = BrokerLoadData(
            broker=b, weighted_max_ema=load, msg_throughput_in=t, msg_throughput_ema=t, updated_at=NOW - 1000
        )
        w.put(report, [BundleStats(bundle=n, msg_throughput_in=x) for n, x in bundles])
    return w


def shed(w: World, cfg: ShedConfig = ON, state: ShedState | None = None) -> ShedResult:
    return w.run(transfer_shedder, state, cfg, NOW)


def test_one_hash_wide_bundles_are_isolated() -> None:
    assert isolated(HOT)
    assert not isolated(bundle(1)) and not isolated("not a bundle") and not isolated("t/x/0x0_0x2")


def test_the_other_bundles_leave_the_hot_topics_broker_for_the_least_loaded() -> None:
    w = world({
        "a": (0.7, [(HOT, 600.0), (bundle(1), 50.0), (bundle(2), 30.0)]),
        "b": (0.3, [(bundle(3), 300.0)]),
        "c": (0.2, [(bundle(4), 200.0)]),
    })  # fmt: skip
    res = shed(w)
    assert {(u.bundle, u.src, u.reason) for u in res.decisions} == {
        (bundle(1), "a", "isolate_hot_bundle"),
        (bundle(2), "a", "isolate_hot_bundle"),
    }
    # Heaviest first, each to the least loaded broker as projected: c, then c again (0.2 + 0.05 < 0.3).
    assert [u.dst for u in res.decisions] == ["c", "c"]
    # Balanced by the std target (.2), yet moved: isolation does not wait for an imbalance.
    assert res.result == "success" and res.reason == "isolate_hot_bundle"
    # Off (the default): the same world is balanced, nothing moves.
    assert shed(w, ShedConfig(hit_count_threshold=0)).decisions == []


def test_grace_period_and_ownership_are_honoured_and_the_hot_bundle_stays() -> None:
    w = world(
        {"a": (0.7, [(HOT, 600.0), (bundle(1), 50.0), (bundle(2), 30.0)]), "b": (0.2, [(bundle(3), 1.0)])}
    )
    w.owners[bundle(2)] = "b"  # the channel says it moved already
    state = ShedState(recent_bundles={bundle(1): NOW - 1000})
    res = shed(w, state=state)
    assert res.decisions == []
    assert (bundle(1), "grace_period") in res.skipped_bundles
    assert (bundle(2), "not_owner") in res.skipped_bundles


def test_nothing_moves_onto_a_broker_that_isolates_a_hot_topic() -> None:
    # a holds a hot bundle alone and is the least loaded: the overloaded c sheds to b, never to a.
    w = world({
        "a": (0.3, [(HOT, 100.0)]),
        "b": (0.35, [(bundle(1), 300.0)]),
        "c": (0.95, [(bundle(2), 500.0), (bundle(3), 400.0), (bundle(4), 50.0)]),
    })  # fmt: skip
    res = shed(w)
    assert res.decisions and all(u.dst != "a" for u in res.decisions)
    assert any(u.dst == "a" for u in shed(w, ShedConfig(hit_count_threshold=0)).decisions)


def test_a_cut_out_topic_that_cooled_down_gives_its_broker_back() -> None:
    """Review finding: a one-hash bundle kept its broker to itself forever, whatever its load."""
    w = world({
        "a": (0.5, [(HOT, 5.0), (bundle(1), 400.0), (bundle(2), 300.0)]),
        "b": (0.4, [(bundle(3), 300.0)]),
        "c": (0.45, [(bundle(4), 300.0)]),
    })  # fmt: skip
    assert isolating_brokers(w.loads_of(), w.tput_of(), w.top, w.owner) == set()
    assert shed(w).decisions == []  # balanced, and nothing to isolate


def test_isolation_does_not_overload_the_destination() -> None:
    w = world({
        "a": (0.8, [(HOT, 600.0), (bundle(1), 200.0)]),
        "b": (0.84, [(bundle(2), 300.0), (bundle(3), 300.0)]),
    })  # fmt: skip
    res = shed(w)
    assert (bundle(1), "no_headroom") in res.skipped_bundles
    assert all(u.reason != "isolate_hot_bundle" for u in res.decisions)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_isolation_never_moves_a_hot_bundle_or_onto_its_broker(data: st.DataObject) -> None:
    names = [f"b{i}" for i in range(data.draw(st.integers(2, 5)))]
    spec: dict[str, tuple[float, list[tuple[str, float]]]] = {}
    k = 0
    for b in names:
        bundles: list[tuple[str, float]] = []
        if data.draw(st.booleans()):
            h = 0x10000000 * (len(spec) + 1)
            bundles.append((f"t/hot/0x{h:08x}_0x{h + 1:08x}", data.draw(st.floats(1, 1000))))
        for _ in range(data.draw(st.integers(0, 4))):
            k += 1
            bundles.append((bundle(k), data.draw(st.floats(0, 500))))
        spec[b] = (data.draw(st.floats(0, 1.2)), bundles)
    w = world(spec)
    hosts = isolating_brokers(w.loads_of(), w.tput_of(), w.top, w.owner)
    res = shed(w)
    for u in res.decisions:
        assert not (isolated(u.bundle) and u.src in hosts)  # a hot cut-out topic keeps its broker
        assert u.dst not in hosts
        if u.reason == "isolate_hot_bundle":
            assert u.src in hosts
            assert u.dst_load is not None and u.dst_load <= ON.overload_threshold
    assert len({u.bundle for u in res.decisions}) == len(res.decisions)  # no bundle moved twice


def test_an_overloaded_broker_keeps_its_hot_bundle_even_when_nothing_else_can_move() -> None:
    """Found by the property test above: b4's other bundle could not be moved away without overloading b3
    (no_headroom), and the overload shedding that followed moved b4's hot cut-out topic itself to b3 -- its
    overload moved with it. It stays, with the reason."""
    hot = "t/hot/0x50000000_0x50000001"
    w = world(
        {
            "b0": (1.0, []),
            "b1": (0.5, []),
            "b2": (0.5, []),
            "b3": (0.25, []),
            "b4": (1.0, [(hot, 4.0), (bundle(1), 7.0)]),
        }
    )
    assert isolating_brokers(w.loads_of(), w.tput_of(), w.top, w.owner) == {"b4"}
    res = shed(w)
    assert all(u.bundle != hot for u in res.decisions), res.decisions
    assert (hot, "isolated_hot") in res.skipped_bundles
