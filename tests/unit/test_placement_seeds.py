"""The worked examples of the seeds as tests: PIP-7 (seed 000) and KIP-708 with its Elasticsearch survey (seed
001), plus the Javadoc example the digest (../shared/reference/placement.md 1.5) reproduces."""

from __future__ import annotations

from collections import Counter

import pytest

from trimtab.balance.placement import Broker, Placement, PlacementPolicy, StandbySpec

# ------------------------------------------------------------------------------------------------ PIP-7

PIP7_BROKERS = [
    Broker("b1:8080", "Domain-1"),
    Broker("b2:8080", "Domain-1"),
    Broker("b3:8080", "Domain-2"),
    Broker("b4:8080", "Domain-2"),
]
PIP7_NAMESPACES = [f"my-tenant/ns{i}" for i in range(1, 5)]


def pip7_policy() -> PlacementPolicy:
    return PlacementPolicy(
        PIP7_BROKERS,
        failure_domains_enabled=True,
        anti_affinity_groups={ns: "my-group" for ns in PIP7_NAMESPACES},
    )


def bundle_of(ns: str) -> str:
    return f"{ns}/0x00000000_0xffffffff"


def all_outcomes(placement: Placement, namespaces: list[str]) -> list[dict[str, str]]:
    """Every final ownership the load-based choice could produce: it may pick *any* candidate each time."""
    if not namespaces:
        return [dict(placement.owned)]
    first, rest = namespaces[0], namespaces[1:]
    out = []
    for broker in placement.candidates(bundle_of(first)):
        placement.set_owner(bundle_of(first), broker)
        out.extend(all_outcomes(placement, rest))
        placement.set_owner(bundle_of(first), None)
    return out


def test_pip7_figure_1_two_domains_per_domain_two_namespaces_per_broker_one() -> None:
    """'domain-1 and domain-2 owns 2 namespaces each and all 4 brokers owns 1 namespace each' -- whatever
    the load-based choice among the candidates, in any order of arrival."""
    domain = {b.id: b.domain for b in PIP7_BROKERS}
    outcomes = all_outcomes(Placement(pip7_policy()), PIP7_NAMESPACES)
    outcomes += all_outcomes(Placement(pip7_policy()), PIP7_NAMESPACES[::-1])
    assert outcomes
    for owned in outcomes:
        assert Counter(domain[b] for b in owned.values()) == {"Domain-1": 2, "Domain-2": 2}
        assert Counter(owned.values()) == {b.id: 1 for b in PIP7_BROKERS}


def test_pip7_second_namespace_goes_to_the_other_domain() -> None:
    placement = Placement(pip7_policy(), {bundle_of("my-tenant/ns1"): "b1:8080"})
    assert placement.candidates(bundle_of("my-tenant/ns2")) == ["b3:8080", "b4:8080"]


def test_pip7_more_namespaces_than_domains_spread_evenly() -> None:
    """'if there are more anti-affinity namespaces than failure domains then, load-balancer distributes
    namespaces evenly across all the domains and also every domain should distribute namespaces evenly
    across all the brokers under that domain.'"""
    namespaces = [f"my-tenant/ns{i}" for i in range(1, 9)]
    policy = PlacementPolicy(
        PIP7_BROKERS, failure_domains_enabled=True, anti_affinity_groups=dict.fromkeys(namespaces, "g")
    )
    placement = Placement(policy)
    for ns in namespaces:
        placement.set_owner(bundle_of(ns), placement.candidates(bundle_of(ns))[-1])
    assert Counter(placement.owned.values()) == {b.id: 2 for b in PIP7_BROKERS}


def test_pip7_shedding_does_not_unload_when_no_other_broker_is_eligible() -> None:
    """'Load-balancer's load-shedding task should not unload the namespace if none of the candidate-broker
    other than current broker is eligible'."""
    owned = {bundle_of(ns): b.id for ns, b in zip(PIP7_NAMESPACES, PIP7_BROKERS, strict=True)}
    placement = Placement(pip7_policy(), owned)
    for bundle, owner in owned.items():
        assert not placement.may_unload(bundle)
        assert not any(placement.may_transfer(bundle, b.id) for b in PIP7_BROKERS if b.id != owner)
    # pile two of them on b1: both b1 bundles may now leave, but only to the empty broker b2 of Domain-1
    placement.set_owner(bundle_of("my-tenant/ns2"), "b1:8080")
    assert placement.may_unload(bundle_of("my-tenant/ns2"))
    assert [b.id for b in PIP7_BROKERS if placement.may_transfer(bundle_of("my-tenant/ns2"), b.id)] == [
        "b2:8080"
    ]


def test_pip7_javadoc_domain_example() -> None:
    """Domains d1{b1:2, b2:1}, d2{b3:2, b4:1}, d3{b5:2, b6:2}: d3 is dropped (4 > 3), then {b2, b4}."""
    brokers = [Broker(f"b{i}:1", f"d{(i + 1) // 2}") for i in range(1, 7)]
    held = {"b1:1": 2, "b2:1": 1, "b3:1": 2, "b4:1": 1, "b5:1": 2, "b6:1": 2}
    owned = {f"t/ns{n}/0x{k:08x}_0x{k + 1:08x}": b for n, (b, c) in enumerate(held.items()) for k in range(c)}
    groups = {f"t/ns{n}": "G" for n in range(7)}
    placement = Placement(
        PlacementPolicy(brokers, failure_domains_enabled=True, anti_affinity_groups=groups), owned
    )
    assert placement.candidates("t/ns6/0x00000000_0xffffffff") == ["b2:1", "b4:1"]


# ------------------------------------------------------------------------------------------------ KIP-708


def kip708_nodes(clusters: int, zones: int = 3) -> list[Broker]:
    """Node-1.. in the KIP's order: cluster by cluster, zones eu-central-1a.. within each."""
    nodes = []
    for c in range(clusters):
        for z in range(zones):
            n = c * zones + z + 1
            nodes.append(
                Broker(
                    f"Node-{n}", tags={"cluster": f"K8s_Cluster{c + 1}", "zone": f"eu-central-1{'abc'[z]}"}
                )
            )
    return nodes


TASK = "app/store/0x00000000_0xffffffff"  # stateful task 0_0
SPEC = StandbySpec(2, ("zone", "cluster"))  # standby.task.assignment.awareness: zone,cluster; 2 standbys


def standbys_of(nodes: list[Broker], owned: dict[str, str]) -> list[str]:
    placement = Placement(PlacementPolicy(nodes), {TASK: "Node-1", **owned})
    return placement.standbys([TASK], SPEC)[TASK]


def distinct_values(nodes: list[Broker]) -> dict[str, int]:
    return {k: len({n.tags[k] for n in nodes}) for k in ("zone", "cluster")}


def test_kip708_absolute_preferred_nine_nodes() -> None:
    """Three clusters x three zones: every copy has its own zone and its own cluster."""
    nodes = kip708_nodes(3)
    # the KIP's formula [1]: num.standby.replicas <= min(distinct values) - 1
    assert SPEC.replicas <= min(distinct_values(nodes).values()) - 1
    picks = standbys_of(nodes, {})
    assert picks == ["Node-5", "Node-9"]
    tags = {n.id: n.tags for n in nodes}
    copies = ["Node-1", *picks]
    for key in ("zone", "cluster"):
        assert len({tags[c][key] for c in copies}) == 3


def test_kip708_partially_preferred_six_nodes() -> None:
    """Two clusters x three zones: the 1st standby differs on both tags; then the cluster dimension (2 values,
    2 copies) is exhausted, and the 2nd standby only needs a new zone: 'Node-5, LL([Node-3, Node-6])'."""
    nodes = kip708_nodes(2)
    dv = distinct_values(nodes)
    assert SPEC.replicas > min(dv.values()) - 1  # formula [1] fails: not absolute
    assert SPEC.replicas <= max(dv.values()) - 1  # formula [2] holds: partially preferred
    assert standbys_of(nodes, {}) == ["Node-5", "Node-3"]  # LL tie -> lowest id
    # LL really is "least loaded": load Node-3 and the 2nd standby is Node-6
    assert standbys_of(nodes, {"app/x/0x00000000_0xffffffff": "Node-3"}) == ["Node-5", "Node-6"]
    # the KIP's alternative: Node-6 first, then LL([Node-2, Node-5])
    assert standbys_of(nodes, {"app/x/0x00000000_0xffffffff": "Node-5"}) == ["Node-6", "Node-2"]
    owned_two = {
        "app/x/0x00000000_0xffffffff": "Node-5",
        "app/y/0x00000000_0x7fffffff": "Node-2",
        "app/y/0x7fffffff_0xffffffff": "Node-2",
    }
    assert standbys_of(nodes, owned_two) == ["Node-6", "Node-5"]


def test_kip708_least_preferred_four_nodes() -> None:
    """Two clusters x two zones: 'Node-4 (different cluster, different zone), LL([Node-2, Node-3])'."""
    nodes = [
        Broker("Node-1", tags={"cluster": "K8s_Cluster1", "zone": "eu-central-1a"}),
        Broker("Node-2", tags={"cluster": "K8s_Cluster1", "zone": "eu-central-1b"}),
        Broker("Node-3", tags={"cluster": "K8s_Cluster2", "zone": "eu-central-1a"}),
        Broker("Node-4", tags={"cluster": "K8s_Cluster2", "zone": "eu-central-1b"}),
    ]
    assert SPEC.replicas > max(distinct_values(nodes).values()) - 1  # neither formula holds
    assert standbys_of(nodes, {}) == ["Node-4", "Node-2"]
    assert standbys_of(nodes, {"app/x/0x00000000_0xffffffff": "Node-2"}) == ["Node-4", "Node-3"]


@pytest.mark.parametrize("live_zone2", [False, True])
def test_elasticsearch_forced_awareness_example(live_zone2: bool) -> None:
    """'if we start two nodes with node.attr.zone set to zone1 and create an index with five shards and one
    replica, Elasticsearch creates the index and allocates the five primary shards but no replicas. Replicas
    are only allocated once nodes with node.attr.zone set to zone2 is available.'"""
    nodes = [Broker("n1", tags={"zone": "zone1"}), Broker("n2", tags={"zone": "zone1"})]
    if live_zone2:
        nodes.append(Broker("n3", tags={"zone": "zone2"}))
    shards = [f"index/shard/0x{i:08x}_0x{i + 1:08x}" for i in range(5)]
    owned = {s: ("n1", "n2")[i % 2] for i, s in enumerate(shards)}
    spec = StandbySpec(1, ("zone",), {"zone": frozenset({"zone1", "zone2"})})
    got = Placement(PlacementPolicy(nodes), owned).standbys(shards, spec)
    assert got == {s: (["n3"] if live_zone2 else []) for s in shards}
