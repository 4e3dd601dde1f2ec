"""Properties of the placement core (docs/placement.md) over random clusters, checked rule by rule against a
brute-force reference written here from the spec -- plain loops over the whole ownership map, no caches, no
shared code with trimtab.balance.placement beyond the data types."""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trimtab.balance.placement import (
    Broker,
    CandidateLayout,
    IsolationPolicy,
    Placement,
    PlacementPolicy,
    StandbySpec,
    anti_affinity_filter,
)

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

BROKER_IDS = ["h1:80", "h2:80", "h3:81", "x1:80", "x2:80", "iso1:80", "iso1:81", "solo"]
DEAD = "dead:1"  # owns bundles but is not live
NAMESPACES = ["t/a", "t/b", "u/c", "u/d", "v/e"]
NS_REGEXES = [r"t/.*", r"u/c", r"t/a", r".*/d", r"nomatch", r"[tu]/[a-c]"]
BROKER_REGEXES = [r"h[12]", r"x.*", r"iso1", r"h3", r"solo", r"h.", r"nobody"]
GROUPS = ["G", "g", "H", " ", ""]
KEYS = ["zone", "rack", "cluster"]
VALUES = {"zone": ["a", "b", "c"], "rack": ["r1", "r2"], "cluster": ["k1", "k2", "k3", "k4"]}


@dataclass
class World:
    brokers: list[Broker]
    fd: bool
    groups: dict[str, str]
    policies: list[IsolationPolicy]
    owned: dict[str, str]

    def placement(self) -> Placement:
        return Placement(
            PlacementPolicy(
                self.brokers,
                failure_domains_enabled=self.fd,
                anti_affinity_groups=self.groups,
                isolation_policies=self.policies,
            ),
            self.owned,
        )


def bundle_names(ns: str) -> list[str]:
    return [f"{ns}/0x{i:08x}_0x{i + 1:08x}" for i in range(3)]


ALL_BUNDLES = [b for ns in NAMESPACES for b in bundle_names(ns)]


@st.composite
def brokers_st(draw: Any) -> list[Broker]:
    ids = draw(st.lists(st.sampled_from(BROKER_IDS), unique=True, max_size=len(BROKER_IDS)))
    out = []
    for bid in ids:
        tags = {}
        for k in KEYS:
            v = draw(st.sampled_from([None, *VALUES[k]]))
            if v is not None:
                tags[k] = v
        out.append(Broker(bid, draw(st.sampled_from([None, "d1", "d2", "default"])), tags))
    return out


@st.composite
def policies_st(draw: Any) -> list[IsolationPolicy]:
    names = draw(st.lists(st.sampled_from(["p1", "p2", "p3"]), unique=True, max_size=3))
    return [
        IsolationPolicy(
            name=n,
            namespaces=tuple(draw(st.lists(st.sampled_from(NS_REGEXES), min_size=1, max_size=2))),
            primary=tuple(draw(st.lists(st.sampled_from(BROKER_REGEXES), min_size=1, max_size=2))),
            secondary=tuple(draw(st.lists(st.sampled_from(BROKER_REGEXES), max_size=2))),
            min_limit=draw(st.integers(0, 3)),
        )
        for n in names
    ]


@st.composite
def worlds(draw: Any, *, with_groups: bool = True, with_policies: bool = True) -> World:
    brokers = draw(brokers_st())
    owners = [b.id for b in brokers] + [DEAD]
    groups = (
        draw(st.dictionaries(st.sampled_from(NAMESPACES), st.sampled_from(GROUPS), max_size=len(NAMESPACES)))
        if with_groups
        else {}
    )
    policies = draw(policies_st()) if with_policies else []
    owned = draw(st.dictionaries(st.sampled_from(ALL_BUNDLES), st.sampled_from(owners), max_size=12))
    return World(brokers, draw(st.booleans()), groups, policies, owned)


# ------------------------------------------------------------------------------------------------ reference


def ref_namespace(bundle: str) -> str:
    return bundle.rsplit("/", 1)[0]


def ref_host(broker_id: str) -> str:
    return broker_id.rsplit(":", 1)[0] if ":" in broker_id else broker_id


def ref_isolation(w: World, ns: str) -> set[str]:
    ids = [b.id for b in w.brokers]

    def matches(patterns: tuple[str, ...], text: str) -> bool:
        return any(re.fullmatch(p, text) for p in patterns)

    chosen = None
    for p in sorted(w.policies, key=lambda p: p.name):
        if matches(p.namespaces, ns):
            chosen = p
            break
    if chosen is None:
        return {b for b in ids if not any(matches(p.primary, ref_host(b)) for p in w.policies)}
    prim = {b for b in ids if matches(chosen.primary, ref_host(b))}
    sec = {b for b in ids if b not in prim and matches(chosen.secondary, ref_host(b))}
    return prim | sec if len(prim) < chosen.min_limit else prim


def ref_group(w: World, ns: str) -> str | None:
    g = w.groups.get(ns)
    return None if g is None or g.strip() == "" else g.lower()


def ref_counts(w: World, bundle: str) -> dict[str, int] | None:
    g = ref_group(w, ref_namespace(bundle))
    if g is None:
        return None
    return dict(Counter(o for b, o in w.owned.items() if b != bundle and ref_group(w, ref_namespace(b)) == g))


def ref_domain_step_on(w: World) -> bool:
    return w.fd and any(b.domain for b in w.brokers)


def ref_anti_affinity(w: World, bundle: str, cands: set[str]) -> set[str]:
    counts = ref_counts(w, bundle)
    if counts is None or not cands:
        return set(cands)
    kept = set(cands)
    if ref_domain_step_on(w):
        dom = {b.id: b.domain or "default" for b in w.brokers}
        totals = Counter({dom[b]: 0 for b in kept})
        for b in kept:
            totals[dom[b]] += counts.get(b, 0)
        kept = {b for b in kept if totals[dom[b]] == min(totals.values())}
    least = min(counts.get(b, 0) for b in kept)
    return {b for b in kept if counts.get(b, 0) == least}


def ref_candidates(w: World, bundle: str) -> set[str]:
    return ref_anti_affinity(w, bundle, ref_isolation(w, ref_namespace(bundle)))


# ------------------------------------------------------------------------------------------------ candidates


@SETTINGS
@given(worlds(with_groups=False))
def test_isolation_alone_matches_the_reference(w: World) -> None:
    p = w.placement()
    for b in ALL_BUNDLES:
        got = p.candidates(b)
        assert got == sorted(got)
        assert set(got) == ref_isolation(w, ref_namespace(b))


@SETTINGS
@given(worlds(with_policies=False))
def test_anti_affinity_alone_matches_the_reference(w: World) -> None:
    p = w.placement()
    every = {b.id for b in w.brokers}
    for b in ALL_BUNDLES:
        got = set(p.candidates(b))
        assert got == ref_anti_affinity(w, b, every)
        # and directly: never a broker holding more of the group than another survivor of its domain step
        counts = ref_counts(w, b)
        if counts is not None and got:
            assert len({counts.get(x, 0) for x in got}) == 1
            assert bool(got) == bool(every)


@SETTINGS
@given(worlds())
def test_candidates_match_the_reference(w: World) -> None:
    p = w.placement()
    for b in ALL_BUNDLES:
        got = set(p.candidates(b))
        assert got == ref_candidates(w, b)
        assert got <= ref_isolation(w, ref_namespace(b))
        # anti-affinity narrows, never empties
        assert bool(got) == bool(ref_isolation(w, ref_namespace(b)))


@SETTINGS
@given(
    st.lists(st.sampled_from(BROKER_IDS), unique=True),
    st.dictionaries(st.sampled_from(BROKER_IDS), st.integers(0, 4)),
    st.one_of(
        st.none(),
        st.dictionaries(st.sampled_from(BROKER_IDS), st.sampled_from([None, "d1", "d2", "default"])),
    ),
    st.sampled_from([None, *BROKER_IDS]),
)
def test_the_fast_layout_agrees_with_the_plain_filter(
    cands: list[str], counts: dict[str, int], domains: dict[str, str | None] | None, minus: str | None
) -> None:
    if minus is not None:
        counts[minus] = counts.get(minus, 0) + 1  # the bundle's own owner always holds it
    plain_counts = dict(counts)
    if minus is not None:
        plain_counts[minus] -= 1
    expected = sorted(anti_affinity_filter(sorted(cands), plain_counts, domains))
    assert list(CandidateLayout(cands, domains).filter(counts, minus)) == expected


@SETTINGS
@given(worlds())
def test_move_guards_match_the_reference_and_never_worsen_the_spread(w: World) -> None:
    p = w.placement()
    ids = [b.id for b in w.brokers] + [DEAD]
    for b in ALL_BUNDLES:
        owner = w.owned.get(b)
        full = ref_candidates(w, b)
        allowed = full - {owner} if owner is not None else set()
        assert p.may_unload(b) == bool(allowed)
        for to in ids:
            assert p.may_transfer(b, to) == (to in allowed)
        counts = ref_counts(w, b)
        if owner in full and counts is not None:
            # the owner is itself a survivor: any destination ties with it, so the group spread cannot worsen
            for to in allowed:
                assert counts.get(to, 0) == counts.get(owner, 0)


@SETTINGS
@given(
    worlds(),
    st.lists(
        st.tuples(st.sampled_from(ALL_BUNDLES), st.sampled_from([*BROKER_IDS, DEAD, None])), max_size=15
    ),
)
def test_the_incremental_index_agrees_with_a_fresh_one(w: World, moves: list[tuple[str, str | None]]) -> None:
    p = w.placement()
    for bundle, broker in moves:
        # ask first (fills the memo), then move, then compare everything with a placement built from scratch
        p.candidates(bundle)
        p.set_owner(bundle, broker)
        if broker is None:
            w.owned.pop(bundle, None)
        else:
            w.owned[bundle] = broker
        fresh = w.placement()
        for b in ALL_BUNDLES:
            assert p.candidates(b) == fresh.candidates(b)
            # the set a healing plan asks for: the same answer, shared between bundles that have it
            assert p.candidate_set(b) == frozenset(fresh.candidates(b)) == fresh.candidate_set(b)
        assert dict(p.owned) == w.owned


@SETTINGS
@given(worlds(), st.randoms(use_true_random=False))
def test_answers_do_not_depend_on_input_order(w: World, rnd: random.Random) -> None:
    p = w.placement()
    shuffled = World(
        rnd.sample(w.brokers, len(w.brokers)),
        w.fd,
        dict(rnd.sample(list(w.groups.items()), len(w.groups))),
        rnd.sample(w.policies, len(w.policies)),
        dict(rnd.sample(list(w.owned.items()), len(w.owned))),
    )
    q = shuffled.placement()
    spec = StandbySpec(2, ("zone", "rack"), {})
    for b in ALL_BUNDLES:
        assert p.candidates(b) == q.candidates(b)
        assert p.may_unload(b) == q.may_unload(b)
    bundles = rnd.sample(ALL_BUNDLES, len(ALL_BUNDLES))
    assert p.standbys(ALL_BUNDLES, spec) == q.standbys(bundles, spec)


# ------------------------------------------------------------------------------------------------ standbys

specs = st.builds(
    lambda r, aw, forced: StandbySpec(r, tuple(aw), forced),
    st.integers(0, 4),
    st.lists(st.sampled_from(KEYS), max_size=3),
    st.dictionaries(
        st.sampled_from(KEYS),
        st.frozensets(st.sampled_from(["a", "b", "c", "d", "r1", "r3", "k9"])),
        max_size=2,
    ),
)


def ref_standbys(
    w: World, bundles: list[str], spec: StandbySpec, keep: dict[str, list[str]] | None = None
) -> dict[str, list[str]]:
    """The spec, literally, with lists and loops."""
    tags = {b.id: dict(b.tags) for b in w.brokers}
    load = Counter(w.owned.values())
    keys = list(dict.fromkeys(spec.awareness))
    distinct = {k: len({t[k] for t in tags.values() if k in t}) for k in keys}
    caps = {}
    for k, vals in spec.forced.items():
        values = {t[k] for t in tags.values() if k in t} | set(vals)
        caps[k] = math.ceil(spec.copies / len(values)) if values else 0

    def forced_fine(b: str, holders: list[str]) -> bool:
        for k, cap in caps.items():
            if k not in tags[b]:
                return False
            if sum(1 for h in holders if tags.get(h, {}).get(k) == tags[b][k]) + 1 > cap:
                return False
        return True

    def shares(b: str, holders: list[str]) -> bool:
        for k in keys:
            if distinct[k] <= len(holders) or k not in tags[b]:
                continue
            if any(tags.get(h, {}).get(k) == tags[b][k] for h in holders):
                return True
        return False

    out: dict[str, list[str]] = {}
    later = []
    for bundle in sorted(set(bundles)):
        owner = w.owned.get(bundle)
        out[bundle] = []
        if owner is None or spec.replicas == 0:
            continue
        cands = sorted(ref_isolation(w, ref_namespace(bundle)) - {owner})
        holders = [owner]
        if owner not in tags:  # a dead owner's bundle keeps its live published standbys first
            for b in (keep or {}).get(bundle, []):
                if len(out[bundle]) < spec.replicas and b in cands and b not in holders:
                    out[bundle].append(b)
                    holders.append(b)
                    load[b] += 1
        while len(out[bundle]) < spec.replicas:
            ok = [b for b in cands if b not in holders and not shares(b, holders) and forced_fine(b, holders)]
            if not ok:
                later.append((bundle, cands, holders))
                break
            pick = min(ok, key=lambda b: (load[b], b))
            out[bundle].append(pick)
            holders.append(pick)
            load[pick] += 1
    for bundle, cands, holders in later:
        while len(out[bundle]) < spec.replicas:
            ok = [b for b in cands if b not in holders and forced_fine(b, holders)]
            if not ok:
                break
            pick = min(ok, key=lambda b: (load[b], b))
            out[bundle].append(pick)
            holders.append(pick)
            load[pick] += 1
    return out


@SETTINGS
@given(worlds(), specs, st.lists(st.sampled_from(ALL_BUNDLES), max_size=10))
def test_standbys_match_the_reference(w: World, spec: StandbySpec, bundles: list[str]) -> None:
    assert w.placement().standbys(bundles, spec) == ref_standbys(w, bundles, spec)


@SETTINGS
@given(
    worlds(),
    specs,
    st.dictionaries(
        st.sampled_from(ALL_BUNDLES), st.lists(st.sampled_from([*BROKER_IDS, DEAD]), max_size=4), max_size=12
    ),
)
def test_a_dead_owners_bundles_keep_their_published_standbys(
    w: World, spec: StandbySpec, keep: dict[str, list[str]]
) -> None:
    got = w.placement().standbys(ALL_BUNDLES, spec, keep=keep)
    assert got == ref_standbys(w, ALL_BUNDLES, spec, keep)
    live = {b.id for b in w.brokers}
    for bundle, picks in got.items():
        owner = w.owned.get(bundle)
        if owner is not None and owner not in live:
            # every published standby still live and allowed stays, in its order, ahead of any new one
            iso = ref_isolation(w, ref_namespace(bundle))
            kept = list(dict.fromkeys(b for b in keep.get(bundle, []) if b in iso))[: spec.replicas]
            assert picks[: len(kept)] == kept
    # a world where every owner is live ignores keep altogether
    alive = World(w.brokers, w.fd, w.groups, w.policies, {k: v for k, v in w.owned.items() if v in live})
    assert alive.placement().standbys(ALL_BUNDLES, spec, keep=keep) == alive.placement().standbys(
        ALL_BUNDLES, spec
    )


@SETTINGS
@given(worlds(), specs)
def test_standby_invariants(w: World, spec: StandbySpec) -> None:
    """Each rule checked on its own, without replaying the algorithm."""
    got = w.placement().standbys(ALL_BUNDLES, spec)
    assert list(got) == sorted(ALL_BUNDLES)
    tags = {b.id: dict(b.tags) for b in w.brokers}
    keys = list(spec.awareness)
    distinct = {k: len({t[k] for t in tags.values() if k in t}) for k in keys}
    for bundle, picks in got.items():
        owner = w.owned.get(bundle)
        if owner is None:
            assert picks == []
            continue
        iso = ref_isolation(w, ref_namespace(bundle))
        assert len(picks) <= spec.replicas
        assert len(set(picks)) == len(picks) and owner not in picks and set(picks) <= iso
        holders = [owner, *picks]

        # forced awareness: every standby carries each forced key; no value holds more than its cap
        for k, forced_values in spec.forced.items():
            values = {t[k] for t in tags.values() if k in t} | forced_values
            cap = math.ceil(spec.copies / len(values)) if values else 0
            assert all(k in tags[s] for s in picks)
            per_value = Counter(tags[h][k] for h in holders if k in tags.get(h, {}))
            assert all(n <= max(cap, 1) for n in per_value.values())

        def eligible(b: str, before: list[str], with_tags: bool, iso: set[str] = iso) -> bool:
            if b in before or b not in iso:
                return False
            for k, forced_values in spec.forced.items():
                values = {t[k] for t in tags.values() if k in t} | forced_values
                cap = math.ceil(spec.copies / len(values)) if values else 0
                if k not in tags[b] or sum(tags.get(h, {}).get(k) == tags[b][k] for h in before) + 1 > cap:
                    return False
            if with_tags:
                for k in keys:
                    live = distinct[k] > len(before)
                    if live and k in tags[b] and any(tags.get(h, {}).get(k) == tags[b][k] for h in before):
                        return False
            return True

        # tags: the first standby sharing a live dimension's value marks the start of the least-preferred
        # fallback, which only happens when no broker could be picked under the tag rules at that point
        for j, s in enumerate(picks):
            if not eligible(s, holders[: j + 1], with_tags=True):
                assert not any(eligible(b, holders[: j + 1], with_tags=True) for b in tags)
                break
        # held back only when nobody may take another copy at all
        if len(picks) < spec.replicas:
            assert not any(eligible(b, holders, with_tags=False) for b in tags)


@SETTINGS
@given(st.integers(1, 3), st.integers(0, 2), st.integers(1, 3), st.integers(0, 40))
def test_enough_values_means_no_shared_value(zones: int, replicas: int, racks_extra: int, seed: int) -> None:
    """With more distinct values than copies in every dimension, no two copies share a value."""
    zones_n = replicas + zones  # > replicas + 1 - 1: enough zones
    racks_n = replicas + racks_extra
    rnd = random.Random(seed)
    brokers = [
        Broker(f"b{z}{r}:1", tags={"zone": f"z{z}", "rack": f"r{(z + r) % racks_n}"})
        for z in range(zones_n)
        for r in range(racks_n)
    ]
    owned = {b: rnd.choice(brokers).id for b in ALL_BUNDLES}
    got = Placement(PlacementPolicy(brokers), owned).standbys(
        ALL_BUNDLES, StandbySpec(replicas, ("zone", "rack"))
    )
    tags = {b.id: b.tags for b in brokers}
    for bundle, picks in got.items():
        assert len(picks) == replicas
        copies = [owned[bundle], *picks]
        for k in ("zone", "rack"):
            assert len({tags[c][k] for c in copies}) == len(copies)
