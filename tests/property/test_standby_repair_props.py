"""Standby sets repaired bundle by bundle (balance/placement/standby.py ``repair_standbys``):

* from nothing, the repair of every bundle is the full computation (``place_standbys``) -- the same sets,
  dead owners' kept standbys included -- so a leader that starts over and one that repairs agree;
* a repair keeps every standby that is still right, and only ever moves the bundles it is given;
* the rules hold after any history of ownership changes: never the owner, only candidates, no broker
  twice, never more than the replicas, forced caps respected;
* the load order it picks by is the counts it was given plus every change it made.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from trimtab.balance.placement.standby import (
    StandbyLoads,
    StandbyRules,
    StandbySpec,
    forced_caps,
    place_standbys,
    repair_standbys,
)

BROKERS = [f"b{i}" for i in range(7)]
ZONES = ["z1", "z2", "z3"]
BUNDLES = [f"t/ns{i % 2}/0x{i:02x}_0x{i + 1:02x}" for i in range(14)]


@st.composite
def clusters(draw: Any) -> dict[str, Any]:
    live = draw(st.lists(st.sampled_from(BROKERS), min_size=1, unique=True))
    tags = {b: {"zone": draw(st.sampled_from(ZONES))} for b in live}
    if draw(st.booleans()):
        for b in live:
            if draw(st.booleans()):
                tags[b]["rack"] = draw(st.sampled_from(["r1", "r2"]))
    owners = {
        b: draw(st.one_of(st.none(), st.sampled_from(BROKERS)))
        for b in draw(st.lists(st.sampled_from(BUNDLES)))
    }
    restricted = {ns: frozenset(draw(st.lists(st.sampled_from(live)))) for ns in ("t/ns0", "t/ns1")}
    open_ns = draw(st.sampled_from(["t/ns0", "t/ns1", None]))
    forced = (
        {"zone": frozenset(draw(st.lists(st.sampled_from(ZONES), min_size=1)))} if draw(st.booleans()) else {}
    )
    spec = StandbySpec(
        draw(st.integers(0, 3)), tuple(draw(st.lists(st.sampled_from(["zone", "rack"]), unique=True))), forced
    )
    return {
        "live": live,
        "tags": tags,
        "owners": owners,
        "cands": {ns: frozenset(live) if ns == open_ns else c for ns, c in restricted.items()},
        "spec": spec,
    }


def ns_of(bundle: str) -> str:
    return bundle.rsplit("/", 1)[0]


def owned_counts(owners: dict[str, str | None]) -> Counter[str]:
    return Counter(o for o in owners.values() if o is not None)


@settings(max_examples=300, deadline=None)
@given(clusters(), st.data())
def test_from_nothing_a_repair_is_the_full_computation(c: dict[str, Any], data: Any) -> None:
    owners, cands, tags = c["owners"], c["cands"], c["tags"]
    owned = owned_counts(owners)
    want = place_standbys(
        owners,
        owner_of=owners.get,
        candidates_of=lambda b: sorted(cands[ns_of(b)]),
        tags=tags,
        load=owned,
        spec=c["spec"],
    )
    kw: dict[str, Any] = {"owner_of": owners.get, "rules": StandbyRules(c["spec"], tags)}
    loads = StandbyLoads(owned, c["live"])
    got = repair_standbys(owners, lambda b: (), candidates_of=lambda b: cands[ns_of(b)], loads=loads, **kw)
    assert got == want
    assert [loads.get(b) for b in c["live"]] == [
        owned[b] + sum(b in ms for ms in got.values()) for b in c["live"]
    ]
    # A dead owner's standbys pre-warmed its bundle: those still live and candidates stay, in their order,
    # whatever the tags (healing is about to hand the bundle to one of them), as place_standbys keeps them.
    current = {
        b: data.draw(st.lists(st.sampled_from(BROKERS), max_size=3, unique=True))
        for b, o in owners.items()
        if o is not None and o not in tags
    }
    counts = owned + Counter(m for ms in current.values() for m in ms)
    got = repair_standbys(
        owners,
        lambda b: current.get(b, ()),
        candidates_of=lambda b: cands[ns_of(b)],
        loads=StandbyLoads(counts, c["live"]),
        **kw,
    )
    for bundle, old in current.items():
        still = [m for m in old if m in tags and m in cands[ns_of(bundle)]][: c["spec"].replicas]
        assert got[bundle][: len(still)] == still


def check_rules(c: dict[str, Any], owners: dict[str, str | None], sets: dict[str, list[str]]) -> None:
    tags, spec = c["tags"], c["spec"]
    caps = forced_caps(spec, tags)
    for bundle, picks in sets.items():
        owner = owners.get(bundle)
        assert len(picks) <= spec.replicas and len(set(picks)) == len(picks)
        if owner is None:
            assert picks == []
            continue
        assert owner not in picks
        assert set(picks) <= c["cands"][ns_of(bundle)] and set(picks) <= set(tags)
        for key, cap in caps.items():
            held = Counter(tags[h].get(key) for h in [owner, *picks] if h in tags)
            assert all(n <= cap for v, n in held.items() if v is not None)


@settings(max_examples=300, deadline=None)
@given(
    clusters(),
    st.lists(
        st.tuples(st.sampled_from(BUNDLES), st.one_of(st.none(), st.sampled_from(BROKERS))), max_size=12
    ),
)
def test_repairs_keep_what_is_right_and_touch_only_the_bundles_given(
    c: dict[str, Any], moves: list[tuple[str, str | None]]
) -> None:
    owners: dict[str, str | None] = dict(c["owners"])
    live = [b for b in c["live"]]
    loads = StandbyLoads(owned_counts(owners), live)
    kw: dict[str, Any] = {
        "owner_of": owners.get,
        "candidates_of": lambda b: c["cands"][ns_of(b)],
        "rules": StandbyRules(c["spec"], c["tags"]),
        "loads": loads,
    }
    sets = repair_standbys(owners, lambda b: (), **kw)
    check_rules(c, owners, sets)
    for bundle, owner in moves:
        old_owner = owners.get(bundle)
        owners[bundle] = owner
        loads.add(old_owner, -1)
        loads.add(owner, 1)
        before = dict(sets)
        got = repair_standbys([bundle], lambda b: sets.get(b, ()), **kw)
        assert set(got) == {bundle}
        sets.update(got)
        check_rules(c, owners, sets)
        # still-right standbys stay: a standby that is not the new owner and broke no rule before keeps
        # its place unless the new owner's tags now clash with it
        if owner is not None and owner in c["tags"] and not c["spec"].awareness and not c["spec"].forced:
            kept = [b for b in before.get(bundle, []) if b != owner][: c["spec"].replicas]
            assert got[bundle][: len(kept)] == kept
        assert {b: s for b, s in sets.items() if b != bundle} == {
            b: s for b, s in before.items() if b != bundle
        }
    want = owned_counts(owners)
    assert [loads.get(b) for b in live] == [want[b] + sum(b in ms for ms in sets.values()) for b in live]


def test_a_dead_owners_standbys_stay_even_when_they_share_a_zone() -> None:
    """Two standbys in one zone pre-warmed a bundle whose owner died: both stay, although a fresh pick
    would spread them over zones -- moving one now would hand healing a broker that never warmed it."""
    tags = {"b1": {"zone": "z1"}, "b2": {"zone": "z1"}, "b3": {"zone": "z2"}, "b4": {"zone": "z3"}}
    got = repair_standbys(
        ["t/ns0/0x00_0x01"],
        lambda b: ["b1", "b2"],
        owner_of=lambda b: "b0",  # not live
        candidates_of=lambda b: frozenset(tags),
        rules=StandbyRules(StandbySpec(2, ("zone",)), tags),
        loads=StandbyLoads({"b1": 1, "b2": 1}, tags),
    )
    assert got == {"t/ns0/0x00_0x01": ["b1", "b2"]}
