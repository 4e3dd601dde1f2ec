"""Pulsar's own TransferShedder tests, ported: ``shedding.plan = half_gap`` is Pulsar's TransferShedder.

Source: apache/pulsar ``pulsar-broker/src/test/java/org/apache/pulsar/broker/loadbalance/extensions/
scheduler/TransferShedderTest.java``. Each test below names the Java test it ports and builds the same
cluster: a broker's report is Pulsar's ``getCpuLoad`` (CPU usage as the weighted max EMA, 1 byte/s in, the
sum of its top bundles' throughput out, that total as its throughput EMA) and its top-k report Pulsar's
``getTopBundlesLoad`` (bundles ``<namespace>/0x00000000_0x0FFFFFFF`` and ``<namespace>/0x0FFFFFFF_0xFFFFFFFF``
carrying the given bytes/s out). The hit count threshold is 0, as in the Java fixture.

Where trimtab answers differently on purpose, the test says so:

* the skip reasons are trimtab's names (``no_brokers``, ``no_bundles``, ``no_load_data``, ``balanced`` for
  Pulsar's ``HitCount`` after a cycle whose trigger does not hold, ``stale_load_data`` for ``CoolDown``);
* reports older than the TTL are left out of the population (so all of them outdated is ``no_brokers``);
* ties in load are broken by broker name (Pulsar's order is its hash map's), so the outlier tests name one
  destination where Pulsar's accept any of the tied brokers;
* the I/O failure test (``testGetAvailableBrokersFailed``) belongs to the controller, not the pure shedder,
  and the ``LoadStats`` unit tests are ported through the cycle's avg and std.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import pytest

from tests.support.shed_world import ShedWorld
from trimtab.balance.load import BrokerLoadData, BundleStats
from trimtab.balance.shed import (
    ShedConfig,
    ShedResult,
    ShedState,
    movable,
    transfer_shedder,
)

NOW = 10_000_000_000
CFG = ShedConfig(hit_count_threshold=0, plan="half_gap")
SETUP_AVG = 0.36400000000000005
SETUP_STD = 0.3982762860126121
LO, HI = "0x00000000_0x0FFFFFFF", "0x0FFFFFFF_0xFFFFFFFF"
D1, D2 = f"my-tenant/my-namespaceD/{LO}", f"my-tenant/my-namespaceD/{HI}"
E1, E2 = f"my-tenant/my-namespaceE/{LO}", f"my-tenant/my-namespaceE/{HI}"
C1 = f"my-tenant/my-namespaceC/{LO}"
FIVE = ("0x00000000_0x1FFFFFFF", "0x1FFFFFFF_0x2FFFFFFF", "0x2FFFFFFF_0x3FFFFFFF", "0x3FFFFFFF_0x4FFFFFFF")
FIVE += ("0x4FFFFFFF_0x5FFFFFFF",)


def broker(i: int | str) -> str:
    return f"broker{i}:8080"


class Cluster(ShedWorld):
    def add(self, b: str, cpu: float, namespace: str, outs: Sequence[float]) -> Cluster:
        """``getCpuLoad(cpu, b)`` with ``getTopBundlesLoad(namespace, *outs)``."""
        ranges = (LO, HI) if len(outs) <= 2 else FIVE
        stats = [
            BundleStats(bundle=f"{namespace}/{r}", msg_throughput_out=x)
            for r, x in zip(ranges, outs, strict=False)
        ]
        self.put(report(b, cpu, sum(outs)), stats)
        return self

    def set_top(self, b: str, namespace: str, outs: Sequence[float]) -> None:
        """A new top-k report for ``b`` (``topBundlesLoadDataStore.pushAsync``), its load report unchanged."""
        ranges = (LO, HI) if len(outs) <= 2 else FIVE
        stats = [
            BundleStats(bundle=f"{namespace}/{r}", msg_throughput_out=x)
            for r, x in zip(ranges, outs, strict=False)
        ]
        self.put(self.loads[b], stats)

    def set_cpu(self, b: str, cpu: float) -> None:
        """A new load report for ``b`` computed from its current top-k report (``getCpuLoad``)."""
        self.loads[b] = report(b, cpu, sum(s.throughput for s in self.top[b].bundles))

    def shed(
        self,
        cfg: ShedConfig = CFG,
        state: ShedState | None = None,
        transferable: Callable[[str, str, str | None], bool] | None = None,
        has_policies: Callable[[str], bool] | None = None,
    ) -> ShedResult:
        if has_policies is None:
            return self.run(transfer_shedder, state, cfg, NOW, transferable)
        return self.run(transfer_shedder, state, cfg, NOW, transferable, has_policies=has_policies)


def report(b: str, cpu: float, out: float, updated_at: int = NOW - 1000) -> BrokerLoadData:
    return BrokerLoadData(
        broker=b,
        weighted_max_ema=cpu / 100,
        msg_throughput_in=1,
        msg_throughput_out=out,
        msg_throughput_ema=1 + out,
        updated_at=updated_at,
    )


def setup() -> Cluster:
    """``setupContext()``: five brokers at 2, 4, 6, 80 and 90% CPU, two bundles each."""
    c = Cluster()
    c.add(broker(1), 2, "my-tenant/my-namespaceA", [1_000_000, 2_000_000])
    c.add(broker(2), 4, "my-tenant/my-namespaceB", [1_000_000, 3_000_000])
    c.add(broker(3), 6, "my-tenant/my-namespaceC", [2_000_000, 4_000_000])
    c.add(broker(4), 80, "my-tenant/my-namespaceD", [2_000_000, 6_000_000])
    c.add(broker(5), 90, "my-tenant/my-namespaceE", [2_000_000, 7_000_000])
    return c


def moves(res: ShedResult) -> set[tuple[str, str, str | None, str]]:
    """The decisions as Pulsar's test compares them: a set of (src, bundle, dst, reason)."""
    return {(u.src, u.bundle, u.dst, u.reason) for u in res.decisions}


def stats_ok(res: ShedResult, avg: float = SETUP_AVG, std: float = SETUP_STD, rel: float = 1e-9) -> None:
    assert res.avg == pytest.approx(avg, rel=rel) and res.std == pytest.approx(std, rel=rel)


def test_empty_broker_load_data() -> None:  # testEmptyBrokerLoadData
    assert Cluster().shed().reason == "no_brokers"


def test_no_owner_load_data() -> None:  # testNoOwnerLoadData
    c = setup()
    c.owners.clear()  # the channel says nobody owns the reported bundles
    res = c.shed()
    assert (res.result, res.reason, res.decisions) == ("skip", "no_bundles", [])
    stats_ok(res)


def test_empty_top_bundles_load_data() -> None:  # testEmptyTopBundlesLoadData
    c = setup()
    c.top.clear()
    res = c.shed()
    assert (res.result, res.reason) == ("skip", "no_load_data")
    stats_ok(res)


def test_out_dated_load_data() -> None:  # testOutDatedLoadData
    c = setup()
    assert len(c.shed().decisions) == 2
    for b in list(c.loads):
        c.loads[b] = report(b, c.loads[b].weighted_max_ema * 100, c.loads[b].msg_throughput_out, updated_at=0)
    res = c.shed()
    assert res.decisions == [] and res.reason == "no_brokers"  # Pulsar: Skip/OutDatedData


def test_recently_unloaded_brokers() -> None:  # testRecentlyUnloadedBrokers
    c = setup()
    old = NOW - 1800 * 1001  # long before the cool-down: forgotten
    res = c.shed(state=ShedState(recent_brokers={broker(1): old}))
    assert moves(res) == {
        (broker(5), E1, broker(1), "overloaded"),
        (broker(4), D1, broker(2), "overloaded"),
    }
    stats_ok(res)
    # Unloaded now, its report older than the move: the cycle waits (Pulsar: Skip/CoolDown).
    res = c.shed(state=ShedState(recent_brokers={broker(1): NOW}))
    assert (res.decisions, res.reason) == ([], "stale_load_data")


def test_recently_unloaded_bundles() -> None:  # testRecentlyUnloadedBundles
    c = setup()
    st = ShedState(recent_bundles={b: NOW for b in (E1, E2, D1, D2)})
    res = c.shed(state=st)
    assert moves(res) == {(broker(3), C1, broker(1), "overloaded")}
    stats_ok(res)


def isolation(primary: dict[str, str]) -> Callable[[str, str, str | None], bool]:
    """The broker filter pipeline with Pulsar's isolation filter, as ``isTransferable`` runs it: a namespace in
    ``primary`` may only be on that broker; a transfer needs its destination among the candidates, an
    unload some candidate besides the source."""
    everyone = {broker(i) for i in range(1, 6)}

    def ok(bundle: str, src: str, dst: str | None) -> bool:
        ns = bundle.rsplit("/", 1)[0]
        candidates = {primary[ns]} if ns in primary else everyone
        return dst in candidates if dst is not None else bool(candidates - {src})

    return ok


def test_bundles_with_isolation_policies() -> None:  # testBundlesWithIsolationPolicies
    c = setup()
    iso = isolation({"my-tenant/my-namespaceE": broker(5)})

    def has_policies(bundle: str) -> bool:
        return bundle.startswith("my-tenant/my-namespaceE/")

    with_policies = replace(CFG, shed_bundles_with_policies=True)
    res = c.shed(with_policies, transferable=iso, has_policies=has_policies)
    assert moves(res) == {(broker(4), D1, broker(1), "overloaded")}
    stats_ok(res)
    res = c.shed(replace(with_policies, transfer=False), transferable=iso, has_policies=has_policies)
    assert moves(res) == {(broker(4), D1, None, "overloaded")}
    stats_ok(res)
    # Shedding bundles with policies off, and every namespace with an isolation policy: nothing moves.
    for cfg in (CFG, replace(CFG, transfer=False)):
        res = c.shed(cfg, transferable=iso, has_policies=lambda bundle: True)
        assert (res.decisions, res.reason) == ([], "no_bundles")
        assert (E1, "has_policies") in res.skipped_bundles
        stats_ok(res)


def test_bundles_with_anti_affinity_group() -> None:  # testBundlesWithAntiAffinityGroup
    c = setup()
    with_policies = replace(CFG, shed_bundles_with_policies=True)
    res = c.shed(with_policies, transferable=lambda b, s, d: False, has_policies=lambda b: True)
    assert (res.decisions, res.reason) == ([], "no_bundles")
    stats_ok(res)
    res = c.shed(with_policies, transferable=lambda b, s, d: b == E1, has_policies=lambda b: True)
    assert moves(res) == {(broker(5), E1, broker(1), "overloaded")}
    stats_ok(res)


def test_filter_has_exception() -> None:  # testFilterHasException: a failing filter refuses the move
    res = setup().shed(transferable=lambda b, s, d: False)
    assert (res.decisions, res.reason) == ([], "no_bundles")
    stats_ok(res)


@pytest.mark.parametrize(
    ("isolation_policy", "anti_affinity", "enabled", "expected"),
    [
        (True, True, True, True),
        (True, True, False, False),
        (True, False, True, True),
        (True, False, False, False),
        (False, True, True, True),
        (False, True, False, False),
        (False, False, True, True),
        (False, False, False, True),
    ],
)
def test_is_load_balancer_shedding_bundles_with_policies_enabled(
    isolation_policy: bool, anti_affinity: bool, enabled: bool, expected: bool
) -> None:  # testIsLoadBalancerSheddingBundlesWithPoliciesEnabled
    guard = movable(
        replace(CFG, shed_bundles_with_policies=enabled),
        lambda b, s, d: True,
        lambda bundle: isolation_policy or anti_affinity,
    )
    assert (guard("t/ns/0x0_0x1", "a", "b") is None) is expected


def test_target_std() -> None:  # testTargetStd
    c = Cluster()
    c.add(broker(1), 10, "my-tenant/my-namespaceA", [30, 30])
    c.add(broker(2), 20, "my-tenant/my-namespaceB", [40, 40])
    c.add(broker(3), 30, "my-tenant/my-namespaceC", [50, 50])
    res = c.shed()
    assert (res.decisions, res.reason) == ([], "balanced")  # Pulsar: Skip/HitCount
    stats_ok(res, 0.2000000063578288, 0.08164966587949089, rel=1e-7)  # Pulsar's usages are floats


def test_single_top_bundles_load_data() -> None:  # testSingleTopBundlesLoadData
    c = setup()
    for i, (ns, out) in enumerate(zip("ABCDE", (1, 2, 6, 10, 70), strict=True), start=1):
        c.set_top(broker(i), f"my-tenant/my-namespace{ns}", [out])
    res = c.shed()
    assert (res.decisions, res.reason) == ([], "no_bundles")
    stats_ok(res)


def test_bundle_throughput_larger_than_offload_threshold() -> (
    None
):  # testBundleThroughputLargerThanOffloadThreshold
    c = setup()
    c.set_top(broker(4), "my-tenant/my-namespaceD", [1_000_000_000, 1_000_000_000])
    c.set_top(broker(5), "my-tenant/my-namespaceE", [1_000_000_000, 1_000_000_000])
    res = c.shed()
    assert moves(res) == {(broker(3), C1, broker(1), "overloaded")}
    stats_ok(res)


def test_zero_bundle_throughput() -> None:  # testZeroBundleThroughput
    c = setup()
    for b, top in list(c.top.items()):
        c.set_top(b, top.bundles[0].bundle.rsplit("/", 1)[0], [0, 0])
    res = c.shed()
    assert (res.decisions, res.reason) == ([], "no_bundles")
    stats_ok(res)


def test_target_std_after_transfer() -> None:  # testTargetStdAfterTransfer
    c = setup()
    c.set_cpu(broker(4), 55)
    c.set_cpu(broker(5), 65)
    res = c.shed()
    assert moves(res) == {(broker(5), E1, broker(1), "overloaded")}
    stats_ok(res, 0.26400000000000007, 0.27644891028904417)


def test_unload_bundles_greater_than_target_throughput() -> (
    None
):  # testUnloadBundlesGreaterThanTargetThroughput
    # broker2 (1000%) sheds 1e8, then 1.8e8; 2.2e8 would overshoot its 4.95e8 budget, so broker1's four
    # lightest bundles (1e6 .. 4e6) go back to broker2 and 2.2e8 goes; 2.5e8 then overshoots with nothing
    # left to swap: the pair ends.
    c = Cluster()
    c.add(broker(1), 10, "my-tenant/my-namespaceA", [1e6, 2e6, 3e6, 4e6, 5e6])
    c.add(broker(2), 1000, "my-tenant/my-namespaceB", [1e8, 1.8e8, 2.2e8, 2.5e8, 2.5e8])
    res = c.shed()
    a, b = "my-tenant/my-namespaceA", "my-tenant/my-namespaceB"
    assert moves(res) == {
        (broker(2), f"{b}/{FIVE[0]}", broker(1), "overloaded"),
        (broker(2), f"{b}/{FIVE[1]}", broker(1), "overloaded"),
        (broker(2), f"{b}/{FIVE[2]}", broker(1), "overloaded"),
        (broker(1), f"{a}/{FIVE[0]}", broker(2), "overloaded"),
        (broker(1), f"{a}/{FIVE[1]}", broker(2), "overloaded"),
        (broker(1), f"{a}/{FIVE[2]}", broker(2), "overloaded"),
        (broker(1), f"{a}/{FIVE[3]}", broker(2), "overloaded"),
    }
    stats_ok(res, 5.05, 4.95)


def test_skip_bundles_greater_than_target_throughput_after_split() -> None:
    # testSkipBundlesGreaterThanTargetThroughputAfterSplit: no swap keeps both brokers below broker2's
    # throughput, so nothing moves.
    c = Cluster()
    c.add(broker(1), 50, "my-tenant/my-namespaceA", [1, 500_000_000])
    c.add(broker(2), 100, "my-tenant/my-namespaceB", [500_000_000, 500_000_000])
    res = c.shed(replace(CFG, target_std=0.20))
    assert (res.decisions, res.reason) == ([], "no_bundles")


def test_unload_bundles_less_than_target_throughput_after_split() -> None:
    # testUnloadBundlesLessThanTargetThroughputAfterSplit
    c = Cluster()
    c.add(broker(1), 10, "my-tenant/my-namespaceA", [1e6, 2e6, 3e6, 4e6, 5e6])
    c.add(broker(2), 1000, "my-tenant/my-namespaceB", [490_000_000, 510_000_000])
    res = c.shed()
    assert moves(res) == {(broker(2), f"my-tenant/my-namespaceB/{LO}", broker(1), "overloaded")}
    stats_ok(res, 5.05, 4.95)


def test_unload_bundles_greater_than_target_throughput_after_split() -> None:
    # testUnloadBundlesGreaterThanTargetThroughputAfterSplit: a 5e6 bundle overshoots the 2.6e6 budget; one
    # of broker1's 2.4e6 bundles swapped back evens the pair exactly.
    c = Cluster()
    c.add(broker(1), 48, "my-tenant/my-namespaceA", [2_400_000, 2_400_000])
    c.add(broker(2), 100, "my-tenant/my-namespaceB", [5_000_000, 5_000_000])
    res = c.shed()
    assert sorted((u.src, u.dst) for u in res.decisions) == [(broker(1), broker(2)), (broker(2), broker(1))]
    assert {u.reason for u in res.decisions} == {"overloaded"}
    stats_ok(res, 0.74, 0.26)


def test_min_broker_with_low_traffic() -> None:  # testMinBrokerWithLowTraffic
    c = setup()
    c.loads[broker(2)] = replace_ema(report(broker(2), 4, 4_000_000), 10)
    c.set_cpu(broker(4), 55)
    c.set_cpu(broker(5), 65)
    res = c.shed()
    assert moves(res) == {
        (broker(5), E1, broker(1), "overloaded"),
        (broker(4), D1, broker(2), "underloaded"),
    }
    stats_ok(res, 0.26400000000000007, 0.27644891028904417)


def test_min_broker_with_lower_load_than_avg() -> None:  # testMinBrokerWithLowerLoadThanAvg
    c = setup()
    c.set_cpu(broker(2), 3)
    c.set_cpu(broker(4), 55)
    c.set_cpu(broker(5), 65)
    res = c.shed()
    assert moves(res) == {
        (broker(5), E1, broker(1), "overloaded"),
        (broker(4), D1, broker(2), "underloaded"),
    }
    stats_ok(res, 0.262, 0.2780935094532054)


def test_max_number_of_transfers_per_shedder_cycle() -> None:  # testMaxNumberOfTransfersPerShedderCycle
    res = setup().shed(replace(CFG, max_broker_pairs=10))
    assert moves(res) == {
        (broker(5), E1, broker(1), "overloaded"),
        (broker(4), D1, broker(2), "overloaded"),
    }
    stats_ok(res)


def test_load_balancer_shedding_condition_hit_count_threshold() -> None:
    # testLoadBalancerSheddingConditionHitCountThreshold
    c, st, cfg = setup(), ShedState(), replace(CFG, hit_count_threshold=3)
    for i in range(3):
        res = c.shed(cfg, st)
        assert (res.decisions, res.reason, res.hit_count) == ([], "hit_count", i + 1)
        stats_ok(res)
    res = c.shed(cfg, st)
    assert moves(res) == {
        (broker(5), E1, broker(1), "overloaded"),
        (broker(4), D1, broker(2), "overloaded"),
    }


def test_remaining_top_bundles() -> None:  # testRemainingTopBundles
    c = setup()
    c.set_top(broker(5), "my-tenant/my-namespaceE", [2_000_000, 3_000_000])
    res = c.shed()
    assert moves(res) == {
        (broker(5), E1, broker(1), "overloaded"),
        (broker(4), D1, broker(2), "overloaded"),
    }
    stats_ok(res)


def test_load_more_than_100() -> None:  # testLoadMoreThan100
    c = setup()
    c.set_cpu(broker(4), 200)
    c.set_cpu(broker(5), 1000)
    res = c.shed()
    assert moves(res) == {
        (broker(5), E1, broker(1), "overloaded"),
        (broker(4), D1, broker(2), "overloaded"),
    }
    stats_ok(res, 2.4240000000000004, 3.8633332758124816)


def test_overload_outlier() -> None:  # testOverloadOutlier
    # 99 brokers at 1% and one at 100%: the std (.0985) is below the target, but the least loaded broker
    # carries less than 12.5% of the most loaded one's throughput. One move; the next least loaded broker is
    # then judged against the broker now most loaded (another 1% one), and is not under-loaded.
    c = Cluster()
    for i in range(99):
        c.add(broker(i), 1, f"my-tenant/my-namespace{i}", [300_000, 700_000])
    c.add(broker(99), 100, "my-tenant/my-namespace99", [30_000_000, 70_000_000])
    res = c.shed()
    # Pulsar accepts broker52 or broker83 (its hash order); trimtab breaks the tie by name.
    assert moves(res) == {(broker(99), f"my-tenant/my-namespace99/{LO}", broker(0), "underloaded")}
    stats_ok(res, 0.019900000000000008, 0.09850375627355534)


def test_underload_outlier() -> None:  # testUnderloadOutlier
    c = Cluster()
    for i in range(98):
        c.add(broker(i), 98, f"my-tenant/my-namespace{i}", [30_000_000, 70_000_000])
    c.add(broker(98), 99, "my-tenant/my-namespace98", [30_000_000, 70_000_000])
    c.add(broker(99), 1, "my-tenant/my-namespace99", [300_000, 700_000])
    res = c.shed()
    assert moves(res) == {(broker(98), f"my-tenant/my-namespace98/{LO}", broker(99), "underloaded")}
    stats_ok(res, 0.9704000000000005, 0.09652895938523735)


@pytest.mark.parametrize(
    ("loads", "avg", "std"),
    [
        ([1] + [100] * 16, 0.9417647058823528, 0.23294117647058868),  # testHighVarianceLoadStats
        (list(range(390, 400)), 3.9449999999999994, 0.028722813232795824),  # testLowVarianceLoadStats
    ],
)
def test_load_stats(loads: list[int], avg: float, std: float) -> None:
    c = Cluster()
    for i, load in enumerate(loads):
        c.add(broker(i), load, f"my-tenant/my-namespace{i}", [1, 1])
    stats_ok(c.shed(), avg, std)


# ------------------------------------------------------------------ beyond Pulsar's own tests


def test_under_loaded_is_judged_against_the_current_most_loaded_broker() -> None:
    """After ``hot`` shed to ``lo1``, ``lo2`` (50 bytes/s EMA) is under-loaded next to the cluster's
    maximum (``hot``, 1000: 50 < 125) but not next to the broker now most loaded (``mid``, 300: 50 >=
    37.5), and the std is within the target: the cycle ends with one move. Judged against the cluster's
    maximum, ``mid`` would shed to ``lo2`` too."""
    c = Cluster()
    c.put(
        BrokerLoadData(broker="lo1", weighted_max_ema=0.30, msg_throughput_ema=50, updated_at=NOW - 1000), []
    )
    c.put(
        BrokerLoadData(broker="lo2", weighted_max_ema=0.35, msg_throughput_ema=50, updated_at=NOW - 1000), []
    )
    c.put(
        BrokerLoadData(
            broker="mid",
            weighted_max_ema=0.40,
            msg_throughput_in=300,
            msg_throughput_ema=300,
            updated_at=NOW - 1000,
        ),
        [BundleStats(bundle=f"mid/{i}", msg_throughput_in=x) for i, x in enumerate((10, 10, 280))],
    )
    c.put(
        BrokerLoadData(
            broker="hot",
            weighted_max_ema=0.80,
            msg_throughput_in=1000,
            msg_throughput_ema=1000,
            updated_at=NOW - 1000,
        ),
        [BundleStats(bundle=f"hot/{i}", msg_throughput_in=250) for i in range(4)],
    )
    res = c.shed()
    assert res.std < CFG.target_std and res.reason == "underloaded"
    assert [(u.bundle, u.src, u.dst) for u in res.decisions] == [("hot/0", "hot", "lo1")]


def swap_world(cold_bundles: Sequence[float] = (345,)) -> Cluster:
    """hot (100%, 1000 bytes/s, five bundles of 200) and cold (0%, 480 bytes/s): hot's budget is
    1000 x (1 - 0) / 2 = 500 -- 200 + 200, then a third 200 overshoots."""
    c = Cluster()
    c.put(
        BrokerLoadData(broker="cold", weighted_max_ema=0.0, msg_throughput_in=480, updated_at=NOW - 1000),
        [BundleStats(bundle=f"cold/{i}", msg_throughput_in=x) for i, x in enumerate(cold_bundles)],
    )
    c.put(
        BrokerLoadData(broker="hot", weighted_max_ema=1.0, msg_throughput_in=1000, updated_at=NOW - 1000),
        [BundleStats(bundle=f"hot/{i}", msg_throughput_in=200) for i in range(5)],
    )
    return c


SWAPPED = [
    ("hot/0", "hot", "cold"),
    ("hot/1", "hot", "cold"),
    ("cold/0", "cold", "hot"),
    ("hot/2", "hot", "cold"),
    ("hot/3", "hot", "cold"),
]
NOT_SWAPPED = [("hot/0", "hot", "cold"), ("hot/1", "hot", "cold")]


def test_swapped_bundles_count_as_gained_outside_debug_mode() -> None:
    """Pulsar adds a swap's throughput to the traffic gained only in debug mode (``trafficMarkedToGain``
    sits inside ``if (debugMode)``); trimtab always counts it. cold's 345 swapped back leaves cold
    (480 + 600 - 345 = 735) below hot (1000 - 600 + 345 = 745 < 750), so the third 200 goes. Net of the
    swap a fourth fits (600 - 345 + 200 = 455 <= 500) -- which, with the swap not counted, would overshoot
    (800) and end the pair."""
    res = swap_world().shed()
    assert [(u.bundle, u.src, u.dst) for u in res.decisions] == SWAPPED


def test_a_swapped_bundle_keeps_the_destination_below_the_source_s_throughput() -> None:
    """cold's 50 would leave cold at 1080 - 50 = 1030, above hot's 1000 bytes/s: passed over. Taken, it
    would spoil the swap (50 + 345 leaves hot at 795, not below 750) and end the pair at two moves."""
    res = swap_world([50, 345]).shed()
    assert [(u.bundle, u.src, u.dst) for u in res.decisions] == [
        ("hot/0", "hot", "cold"),
        ("hot/1", "hot", "cold"),
        ("cold/1", "cold", "hot"),
        ("hot/2", "hot", "cold"),
        ("hot/3", "hot", "cold"),
    ]


def test_swaps_obey_the_rules_of_every_move() -> None:
    """trimtab's additions to Pulsar's swap: the bundle sent back must be owned by the destination per the
    channel, out of its grace period and movable, and the source must be able to take load."""
    c = swap_world()
    c.owners["cold/0"] = "elsewhere"
    assert [(u.bundle, u.src, u.dst) for u in c.shed().decisions] == NOT_SWAPPED
    res = swap_world().shed(state=ShedState(recent_bundles={"cold/0": NOW - 1000}))
    assert [(u.bundle, u.src, u.dst) for u in res.decisions] == NOT_SWAPPED
    res = swap_world().shed(transferable=lambda b, s, d: b != "cold/0")
    assert [(u.bundle, u.src, u.dst) for u in res.decisions] == NOT_SWAPPED
    c = swap_world()
    c.brokers["hot"] = False  # draining: it sheds, but takes nothing back
    assert [(u.bundle, u.src, u.dst) for u in c.shed().decisions] == NOT_SWAPPED
    # plain unloads (transfers off): no destination to swap with
    res = swap_world().shed(replace(CFG, transfer=False))
    assert [(u.bundle, u.src, u.dst) for u in res.decisions] == [
        ("hot/0", "hot", None),
        ("hot/1", "hot", None),
    ]


def replace_ema(d: BrokerLoadData, ema: float) -> BrokerLoadData:
    import msgspec

    return msgspec.structs.replace(d, msg_throughput_ema=ema)


def test_a_pair_of_equally_loaded_brokers_moves_nothing() -> None:
    """trimtab's addition (found by the property test): once the projected std still exceeds the target
    but the brokers left between the ends are equally loaded, there is no gap to halve -- Pulsar's budget
    is zero, and a swap would only trade bundles between equals. The cycle stops there."""
    c = Cluster()
    c.add(broker(0), 0, "ns0", [1_000, 1_000])
    c.add(broker(1), 50, "ns1", [1, 5])  # lo of the second pair: a swap of its 1 B/s bundle would fit
    c.add(broker(2), 50, "ns2", [10, 20])
    c.add(broker(3), 100, "ns3", [100, 10_000])  # sheds 100 B/s: the std stays above the target
    res = c.shed(replace(CFG, max_broker_pairs=5))
    assert res.std > CFG.target_std
    assert {(u.src, u.dst) for u in res.decisions} == {(broker(3), broker(0))}
