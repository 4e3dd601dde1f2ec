"""Placement rules one by one (docs/placement.md; digest placement.md sections 1.3-1.6, 2.2 and 5)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from trimtab.balance.placement import (
    DEFAULT_DOMAIN,
    Broker,
    IsolationPolicy,
    Placement,
    PlacementConfigError,
    PlacementPolicy,
    StandbySpec,
    anti_affinity_filter,
    group_key,
    host_of,
    is_shared,
    isolation_candidates,
    namespace_of,
    place_standbys,
    policy_for,
    sorted_policies,
)
from trimtab.errors import ConfigError


def bundle(ns: str, i: int = 0) -> str:
    return f"{ns}/0x{i:08x}_0x{i + 1:08x}"


def brokers(*ids: str) -> list[Broker]:
    return [Broker(b) for b in ids]


def iso(
    name: str,
    namespaces: Sequence[str],
    primary: Sequence[str],
    secondary: Sequence[str] = (),
    min_limit: int = 1,
) -> IsolationPolicy:
    return IsolationPolicy(
        name=name,
        namespaces=tuple(namespaces),
        primary=tuple(primary),
        secondary=tuple(secondary),
        min_limit=min_limit,
    )


# ------------------------------------------------------------------------------------------------ names


@pytest.mark.parametrize(
    ("broker_id", "host"),
    [("h1:8080", "h1"), ("[::1]:8080", "[::1]"), ("a:b:c", "a:b"), ("plain", "plain"), ("h:", "h")],
)
def test_host_is_the_text_before_the_last_colon(broker_id: str, host: str) -> None:
    assert host_of(broker_id) == host


@pytest.mark.parametrize(
    ("name", "ns"),
    [("t/ns/0x00000000_0x40000000", "t/ns"), ("a/b/c/0x0_0x1", "a/b/c"), ("noslash", "noslash")],
)
def test_namespace_is_the_bundle_minus_its_last_segment(name: str, ns: str) -> None:
    assert namespace_of(name) == ns


def test_a_broker_needs_an_id_and_its_tags_are_frozen() -> None:
    with pytest.raises(PlacementConfigError):
        Broker("")
    tags = {"zone": "a"}
    b = Broker("b:1", tags=tags)
    tags["zone"] = "b"
    assert b.tags["zone"] == "a"
    with pytest.raises(TypeError):
        b.tags["zone"] = "c"  # type: ignore[index]


# ------------------------------------------------------------------------------------------------ isolation


@pytest.mark.parametrize("field", ["namespaces", "primary", "secondary"])
def test_an_invalid_regex_is_refused_when_the_policy_is_built(field: str) -> None:
    kw = {"namespaces": ["t/.*"], "primary": ["h.*"], "secondary": ["s.*"]}
    kw[field] = ["ok", "(unclosed"]
    with pytest.raises(PlacementConfigError) as e:
        iso("pol", kw["namespaces"], kw["primary"], kw["secondary"])
    msg = str(e.value)
    assert "'pol'" in msg and f"{field}[1]" in msg and "(unclosed" in msg
    assert isinstance(e.value, ConfigError) and isinstance(e.value, ValueError)


@pytest.mark.parametrize(
    "kw",
    [
        {"namespaces": (), "primary": ("h",), "min_limit": 1},
        {"namespaces": ("t/.*",), "primary": (), "min_limit": 1},
        {"namespaces": ("t/.*",), "primary": ("h",), "min_limit": -1},
        {"namespaces": ("t/.*",), "primary": ("h",), "min_limit": True},
        {"namespaces": "t/.*", "primary": ("h",), "min_limit": 1},
    ],
)
def test_a_policy_without_namespaces_or_primaries_or_a_sane_limit_is_refused(kw: dict[str, object]) -> None:
    with pytest.raises(PlacementConfigError):
        IsolationPolicy(name="p", **kw)  # type: ignore[arg-type]


def test_two_policies_with_one_name_are_refused() -> None:
    with pytest.raises(PlacementConfigError):
        sorted_policies([iso("p", ["a"], ["h"]), iso("p", ["b"], ["h"])])
    with pytest.raises(PlacementConfigError):
        PlacementPolicy([], isolation_policies={"q": iso("p", ["a"], ["h"])})


def test_namespace_regexes_full_match() -> None:
    p = iso("p", ["t/a"], ["h"])
    assert p.applies_to("t/a")
    assert not p.applies_to("t/ab") and not p.applies_to("xt/a")


def test_broker_regexes_full_match_the_host_not_the_port() -> None:
    p = iso("p", ["t/.*"], ["h1"], ["h2.*"])
    assert p.is_primary("h1:8080") and not p.is_primary("h11:8080")
    assert not iso("p", ["t/.*"], ["h1:8080"]).is_primary("h1:8080")
    assert p.is_secondary("h22:1")


def test_the_first_matching_policy_in_name_order_wins() -> None:
    pols = sorted_policies([iso("b", ["t/.*"], ["hb"]), iso("a", ["t/x"], ["ha"]), iso("c", ["t/x"], ["hc"])])
    assert policy_for("t/x", pols).name == "a"  # type: ignore[union-attr]
    assert policy_for("t/y", pols).name == "b"  # type: ignore[union-attr]
    assert policy_for("u/y", pols) is None
    ids = ["ha:1", "hb:1", "hc:1", "s:1"]
    assert isolation_candidates("t/x", ids, pols) == ["ha:1"]
    placement = Placement(PlacementPolicy(brokers(*ids), isolation_policies=pols))
    assert placement.candidates(bundle("t/x")) == ["ha:1"]
    assert placement.candidates(bundle("t/y")) == ["hb:1"]


def test_primaries_only_while_enough_are_live() -> None:
    pol = iso("p", ["t/.*"], ["p[0-9]"], ["s[0-9]"], min_limit=2)
    assert pol.candidates(["p1:1", "p2:1", "s1:1", "x:1"]) == ["p1:1", "p2:1"]
    assert pol.candidates(["p1:1", "s1:1", "s2:1", "x:1"]) == ["p1:1", "s1:1", "s2:1"]
    assert pol.candidates(["x:1", "s1:1"]) == ["s1:1"]
    assert iso("p", ["t/.*"], ["p1"], ["s1"], min_limit=0).candidates(["s1:1"]) == []
    # a broker matching both lists is a primary
    both = iso("p", ["t/.*"], ["b.*"], ["b.*"], min_limit=5)
    assert both.candidates(["b1:1", "c:1"]) == ["b1:1"]


def test_an_unpoliced_namespace_gets_only_shared_brokers() -> None:
    pols = sorted_policies([iso("p", ["t/iso"], ["p1"], ["s1"])])
    ids = ["p1:1", "s1:1", "x:1"]
    assert not is_shared("p1:1", pols)
    assert is_shared("s1:1", pols)  # secondary somewhere is still shared
    assert isolation_candidates("t/other", ids, pols) == ["s1:1", "x:1"]
    assert isolation_candidates("t/other", ids, ()) == ids  # no policy at all: every broker


def test_isolation_may_leave_nobody() -> None:
    placement = Placement(
        PlacementPolicy(brokers("x:1"), isolation_policies=[iso("p", ["t/.*"], ["p1"], min_limit=1)]),
        {bundle("t/a"): "x:1"},
    )
    assert placement.candidates(bundle("t/a")) == []
    assert not placement.may_unload(bundle("t/a"))


# ------------------------------------------------------------------------------------------------ anti-affinity


def test_groups_compare_case_insensitively_and_blank_is_none() -> None:
    assert group_key("Group") == group_key("gROUP") == "group"
    assert group_key("") is None and group_key("  ") is None and group_key(None) is None


def test_the_broker_step_keeps_the_fewest_group_bundles() -> None:
    owned = {bundle("t/a"): "b1:1", bundle("t/b"): "b1:1", bundle("t/c"): "b2:1", bundle("t/z"): "b3:1"}
    policy = PlacementPolicy(
        brokers("b1:1", "b2:1", "b3:1"), anti_affinity_groups={"t/a": "G", "t/b": "g", "t/c": "G", "t/d": "G"}
    )
    placement = Placement(policy, owned)
    # t/z is in no group: b3 holds nothing of G
    assert placement.candidates(bundle("t/d")) == ["b3:1"]
    assert placement.group_counts(bundle("t/d")) == {"b1:1": 2, "b2:1": 1}
    assert placement.group_counts(bundle("t/z")) is None
    # a namespace without a group is not filtered
    assert placement.candidates(bundle("t/z", 1)) == ["b1:1", "b2:1", "b3:1"]


def test_a_blank_group_is_no_group() -> None:
    policy = PlacementPolicy(brokers("b1:1", "b2:1"), anti_affinity_groups={"t/a": " ", "t/b": " "})
    placement = Placement(policy, {bundle("t/a"): "b1:1"})
    assert placement.candidates(bundle("t/b")) == ["b1:1", "b2:1"]


def test_the_bundle_itself_never_counts() -> None:
    policy = PlacementPolicy(brokers("b1:1", "b2:1"), anti_affinity_groups={"t/a": "G", "t/b": "G"})
    placement = Placement(policy, {bundle("t/a"): "b1:1", bundle("t/b"): "b2:1"})
    # each bundle sees only the other one
    assert placement.candidates(bundle("t/a")) == ["b1:1"]
    assert placement.candidates(bundle("t/b")) == ["b2:1"]
    assert placement.candidates(bundle("t/a", 7)) == ["b1:1", "b2:1"]


def test_javadoc_domain_example() -> None:
    counts = {"b1": 2, "b2": 1, "b3": 2, "b4": 1, "b5": 2, "b6": 2}
    domains = {"b1": "d1", "b2": "d1", "b3": "d2", "b4": "d2", "b5": "d3", "b6": "d3"}
    assert anti_affinity_filter(list(counts), counts, domains) == ["b2", "b4"]
    # without the domain step only the broker minimum matters
    assert anti_affinity_filter(list(counts), counts, None) == ["b2", "b4"]
    assert anti_affinity_filter(["b5", "b6"], counts, domains) == ["b5", "b6"]
    assert anti_affinity_filter([], counts, domains) == []


def test_the_domain_step_prefers_the_emptier_domain_over_the_emptier_broker() -> None:
    counts = {"a1": 1, "a2": 1, "b1": 0, "b2": 3}
    domains: dict[str, str | None] = {"a1": "A", "a2": "A", "b1": "B", "b2": "B"}
    assert anti_affinity_filter(list(counts), counts, domains) == ["a1", "a2"]
    assert anti_affinity_filter(list(counts), counts, None) == ["b1"]


def test_domainless_brokers_form_the_default_domain() -> None:
    counts = {"a": 1, "x": 1, "y": 1}
    assert anti_affinity_filter(["a", "x", "y"], counts, {"a": "A", "x": None}) == ["a"]  # default holds 2
    assert anti_affinity_filter(["a", "x", "y"], counts, {"a": DEFAULT_DOMAIN}) == ["a", "x", "y"]


def _domain_world(enabled: bool, with_domains: bool = True) -> Placement:
    bs = [
        Broker("a1:1", "A" if with_domains else None),
        Broker("a2:1", "A" if with_domains else None),
        Broker("b1:1", "B" if with_domains else None),
        Broker("b2:1", "B" if with_domains else None),
    ]
    groups = {f"t/{i}": "G" for i in range(6)}
    policy = PlacementPolicy(bs, failure_domains_enabled=enabled, anti_affinity_groups=groups)
    # domain A holds three of G, all on a2; domain B holds two, one per broker; a1 holds none
    owned = {bundle("t/0"): "a2:1", bundle("t/1"): "a2:1", bundle("t/2"): "a2:1"}
    return Placement(policy, owned | {bundle("t/3"): "b1:1", bundle("t/5"): "b2:1"})


def test_failure_domains_apply_only_when_enabled_and_someone_is_in_a_domain() -> None:
    assert _domain_world(True).candidates(bundle("t/4")) == ["b1:1", "b2:1"]  # B (2) beats A (3)
    assert _domain_world(False).candidates(bundle("t/4")) == ["a1:1"]  # brokers only
    no_domains = _domain_world(True, with_domains=False)
    assert no_domains.policy.domain_of is None
    assert no_domains.candidates(bundle("t/4")) == ["a1:1"]
    on = _domain_world(True)
    on.set_owner(bundle("t/0"), "b1:1")  # A 2, B 3 now
    assert on.candidates(bundle("t/4")) == ["a1:1"]
    on.set_owner(bundle("t/1"), "b2:1")  # A 1 (a2), B 4
    assert on.candidates(bundle("t/4")) == ["a1:1"]
    on.set_owner(bundle("t/4"), "a1:1")  # the bundle itself never counts: a1 still 0
    assert on.candidates(bundle("t/4")) == ["a1:1"]
    assert not on.may_unload(bundle("t/4"))


def test_domain_totals_count_candidates_only() -> None:
    bs = [Broker("a1:1", "A"), Broker("iso:1", "A"), Broker("b1:1", "B")]
    policy = PlacementPolicy(
        bs,
        failure_domains_enabled=True,
        anti_affinity_groups={"t/x": "G", "t/y": "G"},
        isolation_policies=[iso("other", ["u/.*"], ["iso"], min_limit=1)],
    )
    # iso:1 holds three of G but is not a candidate for t/y (primary of another policy): A counts 0
    owned = {bundle("t/x", i): "iso:1" for i in range(3)} | {bundle("t/x", 9): "b1:1"}
    assert Placement(policy, owned).candidates(bundle("t/y")) == ["a1:1"]


# ------------------------------------------------------------------------------------------------ moves


def test_may_unload_only_when_another_candidate_exists() -> None:
    policy = PlacementPolicy(brokers("b1:1", "b2:1", "b3:1"), anti_affinity_groups={"t/a": "G", "t/b": "G"})
    p = Placement(policy, {bundle("t/a"): "b1:1", bundle("t/b"): "b2:1", bundle("t/a", 1): "b3:1"})
    # without itself, b1 holds 0 of G; b2 and b3 hold 1: only b1 qualifies, which is the owner
    assert not p.may_unload(bundle("t/a"))
    assert not p.may_transfer(bundle("t/a"), "b2:1")
    assert not p.may_transfer(bundle("t/a"), "b1:1")
    p.set_owner(bundle("t/b"), "b3:1")  # now b3 holds 2, b2 0
    assert p.may_unload(bundle("t/a"))
    assert p.may_transfer(bundle("t/a"), "b2:1")
    assert not p.may_transfer(bundle("t/a"), "b3:1")
    assert p.candidates(bundle("t/a"), "b1:1") == ["b2:1"]


def test_an_unowned_bundle_neither_unloads_nor_transfers() -> None:
    p = Placement(PlacementPolicy(brokers("b1:1", "b2:1")))
    assert p.candidates(bundle("t/a")) == ["b1:1", "b2:1"]
    assert not p.may_unload(bundle("t/a"))
    assert not p.may_transfer(bundle("t/a"), "b1:1")


def test_moves_respect_isolation() -> None:
    policy = PlacementPolicy(
        brokers("p1:1", "p2:1", "x:1"), isolation_policies=[iso("p", ["t/.*"], ["p[0-9]"], min_limit=1)]
    )
    p = Placement(policy, {bundle("t/a"): "p1:1", bundle("u/a"): "x:1"})
    assert p.may_transfer(bundle("t/a"), "p2:1")
    assert not p.may_transfer(bundle("t/a"), "x:1")
    assert not p.may_unload(bundle("u/a"))  # x is the only shared broker
    assert not p.may_transfer(bundle("t/a"), "nobody:1")


# ------------------------------------------------------------------------------------------------ ownership index


def test_the_index_follows_set_owner_and_invalidates_its_memo() -> None:
    groups = {"t/a": "G", "t/b": "G"}
    policy = PlacementPolicy(brokers("b1:1", "b2:1"), anti_affinity_groups=groups)
    p = Placement(policy)
    assert p.candidates(bundle("t/b")) == ["b1:1", "b2:1"]
    p.set_owner(bundle("t/a"), "b1:1")
    assert p.candidates(bundle("t/b")) == ["b2:1"]
    p.set_owner(bundle("t/a"), "b2:1")
    assert p.candidates(bundle("t/b")) == ["b1:1"]
    assert p.owned_count("b2:1") == 1 and p.owned_count("b1:1") == 0
    p.set_owner(bundle("t/a"), None)
    assert p.candidates(bundle("t/b")) == ["b1:1", "b2:1"]
    assert p.owner(bundle("t/a")) is None and dict(p.owned) == {}
    p.set_owner(bundle("t/a"), None)  # idempotent


def test_candidates_are_sorted_and_fresh_lists() -> None:
    p = Placement(PlacementPolicy(brokers("z:1", "a:1", "m:1")))
    got = p.candidates(bundle("t/a"))
    assert got == ["a:1", "m:1", "z:1"]
    got.clear()
    assert p.candidates(bundle("t/a")) == ["a:1", "m:1", "z:1"]


def test_duplicate_brokers_are_refused() -> None:
    with pytest.raises(PlacementConfigError):
        PlacementPolicy(brokers("a:1", "a:1"))


# ------------------------------------------------------------------------------------------------ standbys


def zoned(*spec: str) -> list[Broker]:
    """'id=zone,rack' -> Broker with tags zone/rack ('-' for a missing tag)."""
    out = []
    for s in spec:
        bid, _, tags = s.partition("=")
        zone, _, rack = tags.partition(",")
        t = {}
        if zone and zone != "-":
            t["zone"] = zone
        if rack and rack != "-":
            t["rack"] = rack
        out.append(Broker(bid, tags=t))
    return out


def test_standby_spec_is_checked() -> None:
    for bad in (-1, True, 1.5):
        with pytest.raises(PlacementConfigError):
            StandbySpec(bad)  # type: ignore[arg-type]
    with pytest.raises(PlacementConfigError):
        StandbySpec(1, "zone")  # type: ignore[arg-type]
    with pytest.raises(PlacementConfigError):
        StandbySpec(1, ("",))
    with pytest.raises(PlacementConfigError):
        StandbySpec(1, (), {"zone": "ab"})  # type: ignore[dict-item]
    s = StandbySpec(2, ("zone", "rack", "zone"), {"zone": frozenset({"a"})})
    assert s.awareness == ("zone", "rack") and s.copies == 3
    with pytest.raises(PlacementConfigError):
        Placement(PlacementPolicy([])).standbys([])


def test_no_replicas_or_no_owner_means_no_standbys() -> None:
    p = Placement(PlacementPolicy(zoned("a=z1", "b=z2")), {bundle("t/a"): "a"})
    assert p.standbys([bundle("t/a"), bundle("t/b")], replicas=0) == {bundle("t/a"): [], bundle("t/b"): []}
    assert p.standbys([bundle("t/b")], replicas=2) == {bundle("t/b"): []}


def test_standbys_avoid_the_owners_and_each_others_values() -> None:
    bs = zoned("a=z1,r1", "b=z1,r2", "c=z2,r1", "d=z2,r2", "e=z3,r3", "f=z3,r1")
    p = Placement(PlacementPolicy(bs), {bundle("t/a"): "a"})
    # zone and rack both active (3 values each > 1 copy): d (z2,r2) is the first free of a's values
    assert p.standbys([bundle("t/a")], replicas=2, awareness=["zone", "rack"]) == {bundle("t/a"): ["d", "e"]}
    # only rack: b is the first broker off r1
    assert p.standbys([bundle("t/a")], replicas=1, awareness=["rack"]) == {bundle("t/a"): ["b"]}
    # tags not configured are ignored
    assert p.standbys([bundle("t/a")], replicas=2, awareness=[]) == {bundle("t/a"): ["b", "c"]}


def test_a_broker_lacking_a_key_is_never_excluded_by_it() -> None:
    bs = zoned("a=z1", "b=z1", "c=-", "d=z2")
    p = Placement(PlacementPolicy(bs), {bundle("t/a"): "a", bundle("t/b"): "c"})
    # zone has 2 values > 1 copy: b shares z1; c (no zone) is fine and loads tie with d? c owns one, d none
    assert p.standbys([bundle("t/a")], replicas=1, awareness=["zone"]) == {bundle("t/a"): ["d"]}
    p.set_owner(bundle("t/c"), "d")
    p.set_owner(bundle("t/d"), "d")
    assert p.standbys([bundle("t/a")], replicas=1, awareness=["zone"]) == {bundle("t/a"): ["c"]}
    # an owner lacking the key adds no constraint: b (z1, no bundles) is fine
    assert p.standbys([bundle("t/b")], replicas=1, awareness=["zone"]) == {bundle("t/b"): ["b"]}


def test_an_exhausted_dimension_is_dropped_for_the_rest_of_the_bundle() -> None:
    # zone has 2 values: after 2 copies it no longer constrains; rack (3 values) still does
    bs = zoned("a=z1,r1", "b=z2,r2", "c=z1,r2", "d=z1,r3", "e=z2,r1")
    p = Placement(PlacementPolicy(bs), {bundle("t/a"): "a"})
    assert p.standbys([bundle("t/a")], replicas=2, awareness=["zone", "rack"]) == {bundle("t/a"): ["b", "d"]}


def test_ties_go_to_the_fewest_bundles_then_the_lowest_id_and_loads_are_live() -> None:
    bs = zoned("a=z1", "b=z2", "c=z2", "d=z2")
    owned = {bundle("t/x", i): "a" for i in range(3)} | {bundle("t/o"): "b"}
    p = Placement(PlacementPolicy(bs), owned)
    got = p.standbys([bundle("t/x", 2), bundle("t/x", 0), bundle("t/x", 1)], replicas=1, awareness=["zone"])
    # in name order: c (no bundles, lower id than d), then d (none), then b, c, d all hold one -> b
    assert list(got) == [bundle("t/x", 0), bundle("t/x", 1), bundle("t/x", 2)]
    assert got == {bundle("t/x", 0): ["c"], bundle("t/x", 1): ["d"], bundle("t/x", 2): ["b"]}


def test_a_dead_owners_bundles_keep_the_standbys_that_prewarmed_them() -> None:
    # Two zones of two; a group of four bundles, one per broker; then zone z1 dies. Recomputed, b2's standby
    # would move from d2 to d1 (z1's zone no longer counts and d1 is lowest of equal loads), stacking both
    # orphans on d1 -- and on a broker that never pre-warmed b2. Kept, each orphan stays with its warm one.
    owned = {bundle("t/g", 0): "a1", bundle("t/g", 1): "d1", bundle("t/g", 2): "a2", bundle("t/g", 3): "d2"}
    before = Placement(PlacementPolicy(zoned("a1=z1", "a2=z1", "d1=z2", "d2=z2")), owned)
    published = before.standbys(owned, replicas=1, awareness=["zone"])
    assert published[bundle("t/g", 0)] == ["d1"] and published[bundle("t/g", 2)] == ["d2"]
    after = Placement(PlacementPolicy(zoned("d1=z2", "d2=z2")), owned)
    assert after.standbys(owned, replicas=1, awareness=["zone"])[bundle("t/g", 2)] == ["d1"]
    kept = after.standbys(owned, replicas=1, awareness=["zone"], keep=published)
    assert kept[bundle("t/g", 0)] == ["d1"] and kept[bundle("t/g", 2)] == ["d2"]
    # a live owner's bundle is recomputed as usual; a kept standby that died is replaced
    assert kept[bundle("t/g", 1)] == after.standbys(owned, replicas=1, awareness=["zone"])[bundle("t/g", 1)]
    gone = Placement(PlacementPolicy(zoned("d1=z2")), owned)
    assert gone.standbys(owned, replicas=1, awareness=["zone"], keep=published)[bundle("t/g", 2)] == ["d1"]


def test_standbys_respect_isolation() -> None:
    pol = iso("p", ["t/.*"], ["p[0-9]"], min_limit=1)
    bs = [
        Broker("p1:1", tags={"zone": "a"}),
        Broker("p2:1", tags={"zone": "a"}),
        Broker("x:1", tags={"zone": "b"}),
    ]
    p = Placement(PlacementPolicy(bs, isolation_policies=[pol]), {bundle("t/a"): "p1:1"})
    # x is the only broker in another zone but may not own t/a: least preferred p2
    assert p.standbys([bundle("t/a")], replicas=2, awareness=["zone"]) == {bundle("t/a"): ["p2:1"]}


def test_least_preferred_standbys_are_placed_after_every_bundle() -> None:
    tags = {"A": {"zone": "a"}, "B": {"zone": "b"}, "C": {"zone": "a"}, "D": {"zone": "c"}}
    owners = {"t/n/0": "A", "t/n/1": "B"}
    got = place_standbys(
        ["t/n/1", "t/n/0"],
        owner_of=owners.get,
        candidates_of=lambda b: ["A", "C"],
        tags=tags,
        load={"A": 1, "B": 1},
        spec=StandbySpec(1, ("zone",)),
    )
    # t/n/0 has no tag-eligible broker (C shares A's zone): it waits; t/n/1 takes C (A owns one)
    assert got == {"t/n/0": ["C"], "t/n/1": ["C"]}


def test_forced_awareness_holds_standbys_back() -> None:
    bs = zoned("a=zone1", "b=zone1")
    owned = {bundle("t/a", i): "a" for i in range(5)}
    p = Placement(PlacementPolicy(bs), owned)
    spec = StandbySpec(1, ("zone",), {"zone": frozenset({"zone1", "zone2"})})
    assert all(v == [] for v in p.standbys(owned, spec).values())
    # without forcing, the replica doubles up in zone1 (least preferred)
    assert all(v == ["b"] for v in p.standbys(owned, StandbySpec(1, ("zone",))).values())
    # a zone2 broker arrives: every standby goes there
    p2 = Placement(PlacementPolicy([*bs, *zoned("c=zone2")]), owned)
    assert all(v == ["c"] for v in p2.standbys(owned, spec).values())


@pytest.mark.parametrize(
    ("zones", "replicas", "expected_max"),
    [(["a", "b"], 1, 1), (["a", "b", "c"], 1, 1), (["a", "b"], 2, 2), (["a", "b", "c"], 3, 2)],
)
def test_forced_cap_is_ceil_copies_over_values(zones: list[str], replicas: int, expected_max: int) -> None:
    bs = [Broker(f"{z}{i}", tags={"zone": z}) for z in zones for i in range(4)]
    p = Placement(PlacementPolicy(bs), {bundle("t/a"): bs[0].id})
    spec = StandbySpec(replicas, (), {"zone": frozenset()})
    got = p.standbys([bundle("t/a")], spec)[bundle("t/a")]
    assert len(got) == replicas
    per_zone: dict[str, int] = {}
    for b in [bs[0].id, *got]:
        per_zone[b[0]] = per_zone.get(b[0], 0) + 1
    assert max(per_zone.values()) == expected_max


def test_forced_keys_exclude_brokers_lacking_them_even_in_the_fallback() -> None:
    bs = zoned("a=z1", "b=-", "c=-")
    p = Placement(PlacementPolicy(bs), {bundle("t/a"): "a"})
    spec = StandbySpec(2, ("zone",), {"zone": frozenset()})
    assert p.standbys([bundle("t/a")], spec) == {bundle("t/a"): []}
    assert p.standbys([bundle("t/a")], StandbySpec(2, ("zone",))) == {bundle("t/a"): ["b", "c"]}


def test_forced_key_with_no_value_anywhere_places_nothing() -> None:
    p = Placement(PlacementPolicy(zoned("a=z1", "b=z2")), {bundle("t/a"): "a"})
    assert p.standbys([bundle("t/a")], StandbySpec(1, (), {"rack": frozenset()})) == {bundle("t/a"): []}


def test_the_owner_is_never_a_standby_and_a_broker_holds_one_copy() -> None:
    p = Placement(PlacementPolicy(zoned("a=z1", "b=z2")), {bundle("t/a"): "a"})
    assert p.standbys([bundle("t/a")] * 3, replicas=5, awareness=["zone"]) == {bundle("t/a"): ["b"]}
