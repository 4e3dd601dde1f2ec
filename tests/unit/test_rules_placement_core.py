"""Placement rules of balance/placement/core.py that the other placement tests leave loose (docs/placement.md,
docs/testing.md): the PIP-7 switch is off by default, every refusal of a bad policy or a standby request
names what is wrong, per-namespace answers are computed once per namespace and once per isolation policy
(in any order of questions), a bundle never counts for its own group, the owner of a bundle is what the
index says, forced awareness reaches the standby rules, and ``candidate_set`` -- the set a healing plan
keeps its pool by -- is the candidates as a set, the same object while they stand and a new one (with the
new answer) as soon as the group's counts change, in a cache that starts over past 1025 sets."""

from __future__ import annotations

import pytest

from trimtab.balance.placement import (
    Broker,
    IsolationPolicy,
    Placement,
    PlacementConfigError,
    PlacementPolicy,
)


def gold() -> IsolationPolicy:
    """vip/.* on the primaries iso*; no secondaries."""
    return IsolationPolicy(name="gold", namespaces=("vip/.*",), primary=("iso\\d+",), min_limit=0)


def world(*, owned: dict[str, str] | None = None, domains: bool = False) -> Placement:
    """Brokers a:1 and b:1 in d1, c:1 in d2, iso1:1 reserved by gold; t/g and t/h in anti-affinity group
    'G' (t/h spelled 'g'); t/free in no group."""
    policy = PlacementPolicy(
        [Broker("a:1", "d1"), Broker("b:1", "d1"), Broker("c:1", "d2"), Broker("iso1:1")],
        failure_domains_enabled=domains,
        anti_affinity_groups={"t/g": "G", "t/h": "g"},
        isolation_policies=[gold()],
    )
    return Placement(policy, owned)


# --- PlacementPolicy ---------------------------------------------------------------------------------------


def test_failure_domains_are_off_unless_switched_on() -> None:
    """Rule: the PIP-7 domain step is off by default -- brokers' domains are then not read (domain_of is
    None) and a group's bundles spread per broker only; switched on, the emptiest domain wins first."""
    brokers = [Broker("a:1", "d1"), Broker("b:1", "d1"), Broker("c:1", "d2")]
    groups = {"t/g": "G"}
    default = PlacementPolicy(brokers, anti_affinity_groups=groups)
    assert default.failure_domains_enabled is False
    assert default.domain_of is None
    assert Placement(default, {"t/g/0": "a:1"}).candidates("t/g/1") == ["b:1", "c:1"]
    on = PlacementPolicy(brokers, failure_domains_enabled=True, anti_affinity_groups=groups)
    assert on.failure_domains_enabled is True
    assert on.domain_of == {"a:1": "d1", "b:1": "d1", "c:1": "d2"}
    assert Placement(on, {"t/g/0": "a:1"}).candidates("t/g/1") == ["c:1"]


def test_a_broker_listed_twice_is_refused_by_id() -> None:
    """Rule: two live brokers with one id are refused, with the message "broker '<id>' is listed twice"."""
    with pytest.raises(PlacementConfigError) as exc:
        PlacementPolicy([Broker("a:1"), Broker("b:1"), Broker("a:1", "d1")])
    assert str(exc.value) == "broker 'a:1' is listed twice"


def test_a_policy_filed_under_another_name_is_refused_and_a_mapping_is_applied() -> None:
    """Rule: policies given as {name: policy} must be filed under their own name -- else refused with
    "isolation policy '<name>' is filed under '<key>'" -- and, filed right, they apply as a list would."""
    with pytest.raises(PlacementConfigError) as exc:
        PlacementPolicy([Broker("a:1")], isolation_policies={"silver": gold()})
    assert str(exc.value) == "isolation policy 'gold' is filed under 'silver'"
    policy = PlacementPolicy([Broker("a:1"), Broker("iso1:1")], isolation_policies={"gold": gold()})
    assert policy.isolation_policies == (gold(),)
    assert policy.isolation_candidates("vip/app") == ("iso1:1",)
    assert policy.isolation_candidates("t/free") == ("a:1",)


def test_isolation_candidates_are_those_of_the_namespace_asked_about() -> None:
    """Rule: isolation_candidates(namespace) answers for that namespace: a policied one gets its policy's
    brokers, an unpoliced one the shared brokers only."""
    policy = world().policy
    assert policy.isolation_candidates("vip/app") == ("iso1:1",)
    assert policy.isolation_candidates("t/free") == ("a:1", "b:1", "c:1")


def test_a_policied_namespace_asked_after_an_unpoliced_one_gets_its_policys_brokers() -> None:
    """Rule: the per-policy memo is keyed by the policy: once the shared brokers were worked out for an
    unpoliced namespace, a namespace with a policy still gets its policy's brokers, and the reverse."""
    policy = world().policy
    assert policy.rules("t/free").candidates == ("a:1", "b:1", "c:1")
    assert policy.rules("vip/app").candidates == ("iso1:1",)
    assert policy.rules("t/other").candidates == ("a:1", "b:1", "c:1")
    assert policy.rules("vip/app").policy == "gold"
    assert policy.rules("t/other").policy is None


def test_a_namespaces_rules_are_worked_out_once() -> None:
    """Rule: the answer for a namespace is memoised -- the same NamespaceRules object at every question."""
    policy = world().policy
    for ns in ("t/g", "t/free", "vip/app"):
        first = policy.rules(ns)
        assert policy.rules(ns) is first
    assert policy.rules("t/g").group == "g"
    assert policy.rules("t/free").group is None


def test_namespaces_under_one_policy_share_its_candidates_and_layout() -> None:
    """Rule: candidates and their domain layout are built once per isolation policy (and once for the
    shared brokers): every namespace under it holds the very same tuple and layout."""
    policy = world(domains=True).policy
    vip_a, vip_b = policy.rules("vip/a"), policy.rules("vip/b")
    assert vip_a is not vip_b
    assert vip_a.candidates is vip_b.candidates
    assert vip_a.layout is vip_b.layout
    free, grouped = policy.rules("t/free"), policy.rules("t/g")
    assert free.candidates is grouped.candidates
    assert free.layout is grouped.layout
    assert free.candidates is not vip_a.candidates


# --- Placement: the ownership index ------------------------------------------------------------------------


def test_owner_is_the_broker_the_index_holds() -> None:
    """Rule: owner(bundle) is the broker recorded for that bundle, None for an unowned one, and follows
    set_owner."""
    p = world(owned={"t/free/0": "a:1", "t/free/1": "b:1"})
    assert p.owner("t/free/0") == "a:1"
    assert p.owner("t/free/1") == "b:1"
    assert p.owner("t/free/2") is None
    p.set_owner("t/free/0", "c:1")
    assert p.owner("t/free/0") == "c:1"
    p.set_owner("t/free/0", None)
    assert p.owner("t/free/0") is None


def test_group_counts_leave_out_the_bundle_itself() -> None:
    """Rule: group_counts(bundle) are the group's Owned bundles per broker with the bundle itself left out
    (a broker left at 0 is absent); {} when the group owns nothing yet, None without a group."""
    p = world()
    assert p.group_counts("t/g/0") == {}
    assert p.group_counts("t/free/0") is None
    p.set_owner("t/g/0", "a:1")
    p.set_owner("t/h/1", "a:1")
    p.set_owner("t/g/2", "b:1")
    assert p.group_counts("t/g/0") == {"a:1": 1, "b:1": 1}
    assert p.group_counts("t/h/1") == {"a:1": 1, "b:1": 1}
    assert p.group_counts("t/g/2") == {"a:1": 2}
    assert p.group_counts("t/g/9") == {"a:1": 2, "b:1": 1}


# --- Placement: standbys -----------------------------------------------------------------------------------


def test_standbys_without_a_spec_or_replicas_are_refused_with_the_reason() -> None:
    """Rule: standbys need a spec or a number of replicas; without either the refusal says exactly that."""
    with pytest.raises(PlacementConfigError) as exc:
        world().standbys(["t/free/0"])
    assert str(exc.value) == "standbys need a spec or a number of replicas"


def test_forced_awareness_reaches_the_standby_rules() -> None:
    """Rule: forced awareness values given to standbys count as values of their key: with zones x (live)
    and y (forced, no broker), 2 copies allow 1 per zone, so no standby may join the owner's zone x --
    without the forced value it may."""
    policy = PlacementPolicy([Broker("a:1", tags={"zone": "x"}), Broker("b:1", tags={"zone": "x"})])
    p = Placement(policy, {"t/free/0": "a:1"})
    assert p.standbys(["t/free/0"], replicas=1, awareness=["zone"]) == {"t/free/0": ["b:1"]}
    forced = p.standbys(["t/free/0"], replicas=1, awareness=["zone"], forced={"zone": ["x", "y"]})
    assert forced == {"t/free/0": []}
    forced = p.standbys(["t/free/0"], replicas=1, awareness=["zone"], forced={"zone": ["x"]})
    assert forced == {"t/free/0": ["b:1"]}


# --- Placement: candidate_set ------------------------------------------------------------------------------


def test_candidate_set_is_the_candidates_as_a_set() -> None:
    """Rule: candidate_set(bundle) holds exactly candidates(bundle): isolation for a bundle without a group
    (empty when isolation allows nobody), then the group's spread judged without the bundle itself."""
    p = world(owned={"t/g/0": "a:1"}, domains=True)
    assert p.candidate_set("t/free/0") == frozenset({"a:1", "b:1", "c:1"})
    assert p.candidate_set("vip/app/0") == frozenset({"iso1:1"})
    # t/g/0 is the group's only bundle: judged without it, every shared broker may hold it
    assert p.candidate_set("t/g/0") == frozenset({"a:1", "b:1", "c:1"})
    # another bundle of the group sees a:1's bundle: d1 holds 1, d2 none
    assert p.candidate_set("t/h/1") == frozenset({"c:1"})
    assert p.candidate_set("t/g/0") == frozenset(p.candidates("t/g/0"))
    lone = Placement(
        PlacementPolicy([Broker("iso1:1")], isolation_policies=[gold()], anti_affinity_groups={"t/g": "G"})
    )
    assert lone.candidate_set("t/g/0") == frozenset()
    assert lone.candidate_set("t/free/0") == frozenset()


def test_an_owned_bundle_is_judged_without_itself_even_after_an_unowned_one() -> None:
    """Rule: candidate_set answers for the bundle's own owner: an owned bundle of a group is judged as if
    it were gone, also when an unowned bundle of the group (which counts it) was asked about first."""
    p = world(owned={"t/g/0": "a:1"})
    assert p.candidate_set("t/g/1") == frozenset({"b:1", "c:1"})
    assert p.candidate_set("t/g/0") == frozenset({"a:1", "b:1", "c:1"})
    assert p.candidate_set("t/g/1") == frozenset({"b:1", "c:1"})


def test_candidate_set_follows_the_groups_counts() -> None:
    """Rule: once a bundle of the group is placed or moved, candidate_set answers with the new counts --
    also after a first answer given while the group owned nothing."""
    p = world()
    assert p.candidate_set("t/g/1") == frozenset({"a:1", "b:1", "c:1"})
    p.set_owner("t/g/0", "a:1")
    assert p.candidate_set("t/g/1") == frozenset({"b:1", "c:1"})
    p.set_owner("t/h/2", "b:1")
    assert p.candidate_set("t/g/1") == frozenset({"c:1"})
    p.set_owner("t/g/0", "c:1")
    assert p.candidate_set("t/g/1") == frozenset({"a:1"})


def test_candidate_set_is_one_object_while_the_candidates_stand() -> None:
    """Rule: every bundle with the same candidates gets the same set object -- every bundle of a namespace,
    every namespace of one policy, every bundle of a group with the same owner while the group's counts
    stand, whatever else was asked in between (candidates included) -- so a plan keeps its pool."""
    p = world(owned={"t/g/0": "a:1", "t/free/0": "b:1"})
    free = p.candidate_set("t/free/0")
    assert p.candidate_set("t/free/1") is free
    assert p.candidate_set("t/other/0") is free
    vip = p.candidate_set("vip/app/0")
    assert p.candidate_set("vip/other/0") is vip
    grouped = p.candidate_set("t/g/1")
    assert p.candidates("t/g/1") == ["b:1", "c:1"]
    assert p.candidates("t/h/2", "b:1") == ["c:1"]
    assert p.candidate_set("t/g/1") is grouped
    assert p.candidate_set("t/h/2") is grouped
    assert p.candidate_set("t/free/2") is free
    p.set_owner("t/free/1", "c:1")  # no group: the sets stand
    assert p.candidate_set("t/free/1") is free
    p.set_owner("t/g/3", "b:1")  # the group's counts change: a new set with the new answer
    moved = p.candidate_set("t/g/1")
    assert moved == frozenset({"c:1"})
    assert moved is not grouped
    assert p.candidate_set("t/g/1") is moved


def test_an_untouched_groups_candidate_set_is_one_object() -> None:
    """Rule: while a group owns nothing yet its candidate set is still one object for all its bundles."""
    p = world()
    first = p.candidate_set("t/g/0")
    assert first == frozenset({"a:1", "b:1", "c:1"})
    assert p.candidate_set("t/g/0") is first
    assert p.candidate_set("t/h/1") is first


def test_the_cache_of_sets_starts_over_past_1025_sets() -> None:
    """Rule: candidate_set keeps at most 1025 sets: a set stays the same object while 1024 others were
    built after it, and is rebuilt (equal, a new object) once one more was."""
    p = world()
    free = p.candidate_set("t/free/0")
    for i in range(1024):  # each change of the group's counts makes its candidates a new tuple: a new set
        p.set_owner("t/g/0", "a:1" if i % 2 == 0 else None)
        p.candidate_set("t/g/1")
    assert p.candidate_set("t/free/0") is free
    p.set_owner("t/g/0", "b:1")
    p.candidate_set("t/g/1")
    again = p.candidate_set("t/free/0")
    assert again == free
    assert again is not free
