"""The agent decides through the assignment index only when load alone decides (agent/lookup.py
``IndexedAssignment``): placement must allow every live broker -- no isolation policy anywhere, no
anti-affinity group for the namespace, no warm standby for the bundle -- and then the pick is the filter
chain's, from the same random state."""

from __future__ import annotations

import random

from tests.support.owned_table import OwnedRecords
from trimtab.agent.lookup import IndexedAssignment
from trimtab.balance.assign import AssignContext, BrokerInfo, select_broker
from trimtab.balance.load import BrokerLoadData
from trimtab.cluster.placement.store import (
    AntiAffinityGroups,
    IsolationPolicies,
    IsolationPolicyDoc,
    PlacementDocs,
)
from trimtab.cluster.placement.view import LivePlacement
from trimtab.config.settings import Settings

NOW_S = 1_000.0
IDS = [f"b{i}:80" for i in range(5)]
BROKERS = {b: BrokerInfo(id=b, service_url=f"svc://{b}", http_url=f"http://{b}") for b in IDS}


def placement(docs: PlacementDocs | None = None) -> LivePlacement:
    p = LivePlacement(lambda: BROKERS, failure_domains_enabled=False, table=OwnedRecords())
    if docs is not None:
        p.policies_changed(docs)
    return p


def test_open_to_all_only_without_isolation_policies_or_a_group_for_the_namespace() -> None:
    assert placement().open_to_all("t/ns/0x00_0x10")
    grouped = placement(PlacementDocs(groups=AntiAffinityGroups(groups={"t/ns": "g"})))
    assert not grouped.open_to_all("t/ns/0x00_0x10")
    assert grouped.open_to_all("t/other/0x00_0x10")
    isolated = placement(
        PlacementDocs(
            isolation=IsolationPolicies(
                policies={"p": IsolationPolicyDoc(namespaces=["t/x.*"], primary=["b0.*"])}
            )
        )
    )
    # a namespace without a policy is still narrowed: it may not use the brokers a policy claims
    assert not isolated.open_to_all("t/ns/0x00_0x10")


def indexed(open_to_all: bool) -> tuple[IndexedAssignment, dict[str, BrokerLoadData]]:
    loads = {
        b: BrokerLoadData(broker=b, weighted_max_ema=0.1 * i, updated_at=int(NOW_S * 1000))
        for i, b in enumerate(IDS)
    }
    ia = IndexedAssignment(
        Settings(), loads, lambda: BROKERS, open_to_all=lambda _: open_to_all, clock=lambda: NOW_S
    )
    return ia, loads


def test_the_index_answers_as_the_filter_chain_and_follows_reports() -> None:
    ia, loads = indexed(True)
    s = Settings()
    for seed in range(30):
        if seed == 15:  # the least loaded broker reports a high load: the pick must follow it
            loads[IDS[0]] = BrokerLoadData(broker=IDS[0], weighted_max_ema=0.9, updated_at=int(NOW_S * 1000))
            ia.changed(IDS[0], loads[IDS[0]])
        ctx = AssignContext.from_settings(s, loads, int(NOW_S * 1000), frozenset({IDS[1]}))
        want = select_broker("t/ns/0x00_0x10", BROKERS, ctx, random.Random(seed), diff=0.1)
        got = ia.select("t/ns/0x00_0x10", frozenset({IDS[1]}), random.Random(seed), 0.1)
        assert got is not None and got.broker == want.broker
        assert got.broker not in ({IDS[1], IDS[0]} if seed >= 15 else {IDS[1]})


def test_a_bundle_placement_narrows_is_left_to_the_filter_chain() -> None:
    ia, _ = indexed(False)
    rng = random.Random(1)
    before = rng.getstate()
    assert ia.select("t/ns/0x00_0x10", frozenset(), rng, 0.1) is None
    assert rng.getstate() == before
