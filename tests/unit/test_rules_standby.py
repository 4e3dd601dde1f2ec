"""Standby rules of balance/placement/standby.py that the other placement tests leave loose
(docs/placement.md "Standbys", docs/testing.md): every refusal of a bad StandbySpec names what is wrong and
forced values become read-only sets; a forced key nobody carries caps at 0, an unknown broker never passes
forced awareness and a dead holder holds no value; ``keep`` only matters for a dead owner, whose standbys
are kept whatever the tags but only while live, candidates and single; a repair keeps a standby the rules
still allow even when it is not the least loaded, replaces one the tags now refuse, takes a refused one back
(before any less loaded broker) only after every bundle's tag-aware turn and never beyond the replicas;
the loads count live brokers only; and the candidates of a sequence, and a broker's tag entries, are read
once."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType

import pytest

from trimtab.balance.placement.model import PlacementConfigError
from trimtab.balance.placement.standby import (
    StandbyLoads,
    StandbyRules,
    StandbySpec,
    forced_caps,
    forced_ok,
    place_standbys,
    repair_standbys,
)

ZONE = ("zone",)


def zones(**z: str) -> dict[str, dict[str, str]]:
    """broker=zone -> the tags map of live brokers."""
    return {b: {"zone": v} for b, v in z.items()}


def repair(
    owner: str,
    current: Sequence[str],
    *,
    tags: Mapping[str, Mapping[str, str]],
    counts: Mapping[str, int],
    spec: StandbySpec,
    cands: Sequence[str] | None = None,
) -> tuple[list[str], StandbyLoads]:
    """repair_standbys of the one bundle 't/n/0' owned by ``owner`` with ``current`` standbys; ``counts``
    are owned plus standby bundles (the current set included); candidates: every live broker by default."""
    loads = StandbyLoads(counts, tags)
    got = repair_standbys(
        ["t/n/0"],
        lambda b: current,
        owner_of=lambda b: owner,
        candidates_of=lambda b: frozenset(tags if cands is None else cands),
        rules=StandbyRules(spec, tags),
        loads=loads,
    )
    return got["t/n/0"], loads


# --- StandbySpec -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1,), "standby replicas must be an integer >= 0"),
        ((1, "zone"), "standby awareness must be a list of tag keys"),
        ((1, ("zone", "")), "standby awareness keys must be non-empty strings"),
        ((1, (), {"": frozenset({"a"})}), "forced awareness maps a non-empty tag key to a list of values"),
        ((1, (), {5: frozenset({"a"})}), "forced awareness maps a non-empty tag key to a list of values"),
        ((1, (), {"zone": "ab"}), "forced awareness maps a non-empty tag key to a list of values"),
    ],
)
def test_a_bad_spec_is_refused_with_what_is_wrong(args: tuple[object, ...], message: str) -> None:
    """Rule: StandbySpec refuses a negative count, awareness given as one string, an empty awareness key,
    and a forced key that is empty or not a string or whose values are one string -- each with its own
    message."""
    with pytest.raises(PlacementConfigError) as exc:
        StandbySpec(*args)  # type: ignore[arg-type]
    assert str(exc.value) == message


def test_forced_values_become_a_read_only_map_of_sets() -> None:
    """Rule: the forced values given as any collection are kept as frozensets in a read-only mapping (the
    caller's dict is not shared)."""
    given: dict[str, list[str]] = {"zone": ["a", "b", "a"]}
    spec = StandbySpec(1, (), given)  # type: ignore[arg-type]
    assert isinstance(spec.forced, MappingProxyType)
    assert dict(spec.forced) == {"zone": frozenset({"a", "b"})}
    given["zone"].append("c")
    assert dict(spec.forced) == {"zone": frozenset({"a", "b"})}


# --- forced awareness -------------------------------------------------------------------------------------


def test_a_forced_key_no_broker_carries_and_no_value_is_forced_caps_at_zero() -> None:
    """Rule: the cap of a forced key is ceil(copies / |values|) over the live and forced values, and 0 when
    there is no value at all."""
    tags = {"a": {"zone": "z1"}, "b": {"zone": "z2"}}
    spec = StandbySpec(2, (), {"zone": frozenset({"z3"}), "rack": frozenset()})
    assert forced_caps(spec, tags) == {"zone": 1, "rack": 0}
    assert forced_caps(StandbySpec(3, (), {"zone": frozenset()}), tags) == {"zone": 2}


def test_an_unknown_broker_never_passes_forced_awareness_and_an_unknown_holder_holds_nothing() -> None:
    """Rule: a broker without tags lacks every forced key (refused); a holder without tags (a dead owner)
    holds no value, so it counts against no cap."""
    tags = {"a": {"zone": "z1"}, "b": {"zone": "z1"}}
    assert forced_ok("gone", [], tags, {"zone": 1}) is False
    assert forced_ok("gone", [], tags, {}) is True
    assert forced_ok("a", ["dead"], tags, {"zone": 1}) is True
    assert forced_ok("a", ["dead", "b"], tags, {"zone": 1}) is False
    assert forced_ok("a", ["dead", "b"], tags, {"zone": 2}) is True


def test_a_dead_owner_counts_against_no_forced_cap() -> None:
    """Rule: the bundle of a dead owner (no tags) gets standbys under forced awareness as if only the live
    copies held values: cap ceil(2 / 2) = 1 per zone, the first pick is the least loaded, lowest id."""
    tags = zones(b="z1", x="z2")
    got = place_standbys(
        ["t/n/0"],
        owner_of=lambda b: "dead",
        candidates_of=lambda b: ("b", "x"),
        tags=tags,
        load={},
        spec=StandbySpec(1, ZONE, {"zone": frozenset({"z1", "z2"})}),
    )
    assert got == {"t/n/0": ["b"]}


# --- place_standbys: keep ---------------------------------------------------------------------------------


def test_keep_is_ignored_for_a_live_owner() -> None:
    """Rule: place_standbys recomputes the standbys of a bundle whose owner is live, whatever ``keep``
    holds (and the kept brokers' loads are not lowered): o (z1) -> b, the least loaded other zone, not the
    kept c."""
    tags = zones(o="z1", b="z2", c="z3")
    got = place_standbys(
        ["t/n/0"],
        owner_of=lambda b: "o",
        candidates_of=lambda b: ("b", "c"),
        tags=tags,
        load={"b": 1, "c": 1},
        spec=StandbySpec(1, ZONE),
        keep={"t/n/0": ["c"]},
    )
    assert got == {"t/n/0": ["b"]}


def test_a_dead_owners_standbys_are_kept_whatever_the_tags() -> None:
    """Rule: a dead owner's kept standbys stay in their order even when they share a zone (x and y, both
    z1, while z2 and z3 are free) -- the tags would refuse y."""
    tags = zones(b="z2", c="z3", x="z1", y="z1")
    got = place_standbys(
        ["t/n/0"],
        owner_of=lambda b: "dead",
        candidates_of=lambda b: ("b", "c", "x", "y"),
        tags=tags,
        load={"x": 1, "y": 1},
        spec=StandbySpec(2, ZONE),
        keep={"t/n/0": ["x", "y"]},
    )
    assert got == {"t/n/0": ["x", "y"]}


def test_a_dead_owner_keeps_only_live_candidates_once_and_no_more_than_the_replicas() -> None:
    """Rule: of a dead owner's kept standbys, one that is live but no longer a candidate (n) is dropped, a
    repeated one is kept once, and once the replicas are reached the rest are dropped (z)."""
    tags = zones(b="z1", n="z2", x="z3", z="z4")
    got = place_standbys(
        ["t/n/0", "t/n/1"],
        owner_of=lambda b: "dead",
        candidates_of=lambda b: ("b", "x", "z"),
        tags=tags,
        load={"b": 5, "x": 0, "z": 0},
        spec=StandbySpec(2, ()),
        keep={"t/n/0": ["n", "x", "x"], "t/n/1": ["x", "b", "z"]},
    )
    # t/n/0: x kept, then the least loaded other candidate (z: 0 < b: 5)
    assert got == {"t/n/0": ["x", "z"], "t/n/1": ["x", "b"]}


# --- place_standbys: the candidate sets -----------------------------------------------------------------


class CountingCandidates(Sequence[str]):
    """A candidates sequence that counts how often it is iterated."""

    def __init__(self, *ids: str) -> None:
        self._ids = ids
        self.iterations = 0

    def __getitem__(self, i: int) -> str:  # type: ignore[override]
        return self._ids[i]

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[str]:
        self.iterations += 1
        return iter(self._ids)

    def __contains__(self, b: object) -> bool:
        raise AssertionError("candidates are looked up in their set, never in the sequence")


def test_the_candidates_of_one_sequence_are_made_a_set_once() -> None:
    """Rule: place_standbys turns each candidates sequence into a set once, however many bundles share it
    (a namespace's tuple), and each distinct sequence into its own set."""
    shared, other = CountingCandidates("b", "c"), CountingCandidates("c")
    cands = {"t/n/0": shared, "t/n/1": shared, "t/n/2": shared, "t/m/0": other}
    got = place_standbys(
        cands,
        owner_of=lambda b: "o",
        candidates_of=lambda b: cands[b],
        tags=zones(o="z1", b="z2", c="z3"),
        load={},
        spec=StandbySpec(1, ZONE),
    )
    assert got == {"t/m/0": ["c"], "t/n/0": ["b"], "t/n/1": ["b"], "t/n/2": ["c"]}
    assert (shared.iterations, other.iterations) == (1, 1)


# --- StandbyLoads -----------------------------------------------------------------------------------------


def test_loads_count_live_brokers_only() -> None:
    """Rule: StandbyLoads counts the live brokers (0 when not given a count), orders them fewest first then
    by id, and ignores a broker that is not live, None and a change of 0."""
    loads = StandbyLoads({"a": 2, "b": 1, "x": 9}, ["a", "b", "c"])
    assert [loads.get(b) for b in ("a", "b", "c", "x", "nobody")] == [2, 1, 0, 0, 0]
    assert list(loads.ordered()) == ["c", "b", "a"]
    loads.add("x", 1)
    loads.add("nobody", -1)
    loads.add(None, 1)
    loads.add("a", 0)
    assert [loads.get(b) for b in ("a", "b", "c", "x")] == [2, 1, 0, 0]
    assert list(loads.ordered()) == ["c", "b", "a"]
    loads.add("a", -2)
    loads.add("c", 1)
    assert list(loads.ordered()) == ["a", "b", "c"]
    assert [loads.get(b) for b in ("a", "b", "c")] == [0, 1, 1]


# --- StandbyRules -----------------------------------------------------------------------------------------


class CountingTags(Mapping[str, str]):
    """One broker's tags, counting the values read."""

    def __init__(self, **tags: str) -> None:
        self._tags = tags
        self.reads = 0

    def __getitem__(self, key: str) -> str:
        self.reads += 1
        return self._tags[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tags)

    def __len__(self) -> int:
        return len(self._tags)

    def __contains__(self, key: object) -> bool:
        return key in self._tags


def test_rules_read_each_brokers_tags_once_across_repairs() -> None:
    """Rule: StandbyRules reads each live broker's awareness values once for the distinct counts and once
    for its entries, however many picks and repairs use them."""
    tags = {"o": CountingTags(zone="z1"), "b": CountingTags(zone="z2"), "c": CountingTags(zone="z3")}
    rules = StandbyRules(StandbySpec(2, ZONE), tags)
    loads = StandbyLoads({"o": 2}, tags)
    for _ in range(2):
        got = repair_standbys(
            ["t/n/0", "t/n/1"],
            lambda b: (),
            owner_of=lambda b: "o",
            candidates_of=lambda b: frozenset(tags),
            rules=rules,
            loads=loads,
        )
        assert got == {"t/n/0": ["b", "c"], "t/n/1": ["b", "c"]}
    assert {b: t.reads for b, t in tags.items()} == {"o": 2, "b": 2, "c": 2}


# --- repair_standbys --------------------------------------------------------------------------------------


def test_a_repair_keeps_a_standby_still_allowed_even_if_not_the_least_loaded() -> None:
    """Rule: a repair keeps a current standby the rules still allow (c, z2) although another broker of an
    allowed zone has fewer bundles and a lower id (b, z2: 0 against c's 0 once c's own standby is not
    counted; b would win the tie)."""
    tags = zones(o="z1", b="z2", c="z2")
    got, loads = repair("o", ["c"], tags=tags, counts={"o": 1, "c": 1}, spec=StandbySpec(1, ZONE))
    assert got == ["c"]
    assert [loads.get(b) for b in ("o", "b", "c")] == [1, 0, 1]


def test_a_repair_replaces_a_standby_the_tags_now_refuse() -> None:
    """Rule: a live owner's current standby in the owner's zone (x, z1) is replaced by a broker of another
    zone (y, z2) when one may take it, even a more loaded one."""
    tags = zones(o="z1", x="z1", y="z2")
    got, loads = repair("o", ["x"], tags=tags, counts={"o": 1, "x": 1, "y": 3}, spec=StandbySpec(1, ZONE))
    assert got == ["y"]
    assert [loads.get(b) for b in ("x", "y")] == [0, 4]


def test_a_standby_only_the_tags_refuse_is_taken_back_before_a_less_loaded_broker() -> None:
    """Rule: when no broker of another zone may take the bundle (z is not a candidate), after every bundle's
    tag-aware turn a current standby only the tags refused (x) is taken back, before the least loaded
    broker (w: 0 against x's 4)."""
    tags = zones(o="z1", x="z1", w="z1", z="z2")
    got, loads = repair(
        "o", ["x"], tags=tags, counts={"o": 1, "x": 5}, spec=StandbySpec(1, ZONE), cands=("x", "w")
    )
    assert got == ["x"]
    assert [loads.get(b) for b in ("x", "w")] == [5, 0]


def test_refused_standbys_are_taken_back_up_to_the_replicas_only() -> None:
    """Rule: of three current standbys only the tags refuse, the first two are taken back for two replicas,
    in their order; the third is dropped."""
    tags = zones(o="z1", x="z1", y="z1", w="z1", z="z2")
    got, loads = repair(
        "o",
        ["x", "y", "w"],
        tags=tags,
        counts={"x": 1, "y": 1, "w": 1},
        spec=StandbySpec(2, ZONE),
        cands=("x", "y", "w"),
    )
    assert got == ["x", "y"]
    assert [loads.get(b) for b in ("x", "y", "w")] == [1, 1, 0]


def test_a_repair_keeps_no_more_current_standbys_than_the_replicas() -> None:
    """Rule: with fewer replicas than current standbys (replicas lowered), the first ones in order are
    kept and the rest dropped."""
    tags = zones(o="z1", b="z2", c="z3")
    got, loads = repair("o", ["c", "b"], tags=tags, counts={"b": 1, "c": 1}, spec=StandbySpec(1, ZONE))
    assert got == ["c"]
    assert [loads.get(b) for b in ("b", "c")] == [0, 1]
