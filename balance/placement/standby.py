"""Tag-aware warm standbys (KIP-708's ``ClientTagAwareStandbyTaskAssignor``) with Elasticsearch's forced
awareness as a hard cap.

Why each rule exists:

* A standby must survive what takes its owner down, so it avoids every tag value (zone, cluster, ...)
  already used by the owner or an earlier standby of the same bundle.
* With fewer distinct values than copies some sharing is unavoidable; rather than giving up, the key is
  dropped for the rest of that bundle (KIP-708's "partially preferred"), keeping the others enforced.
* Standbys no broker can take under the tag rules are placed last, ignoring tags ("least preferred"), so
  tag-perfect placements of other bundles get the least-loaded brokers first.
* Forced awareness is a *cap*, never relaxed: when a zone is down, doubling standbys up in the surviving
  zone would overload it on failover, so they are held back until the zone returns.

Everything is deterministic: bundles in name order, ties to the fewest (owned + standby) bundles, then the
lowest id; loads are live, so a standby given now weighs on every later pick.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from trimtab.balance.placement.model import PlacementConfigError


@dataclass(frozen=True)
class StandbySpec:
    """How many standbys each bundle gets, the ordered awareness keys, and the forced values per key.

    Built (and checked) once per configuration: awareness keys are de-duplicated keeping their order,
    forced values become sets. ``copies`` counts the owner too, as Elasticsearch's ``shardCount`` does.
    """

    replicas: int
    awareness: tuple[str, ...] = ()
    forced: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 0:
            raise PlacementConfigError("standby replicas must be an integer >= 0")
        if isinstance(self.awareness, str):
            raise PlacementConfigError("standby awareness must be a list of tag keys")
        keys = tuple(dict.fromkeys(self.awareness))
        if any(not isinstance(k, str) or not k for k in keys):
            raise PlacementConfigError("standby awareness keys must be non-empty strings")
        forced: dict[str, frozenset[str]] = {}
        for k, values in dict(self.forced).items():
            if not isinstance(k, str) or not k or isinstance(values, str):
                raise PlacementConfigError("forced awareness maps a non-empty tag key to a list of values")
            forced[k] = frozenset(values)
        object.__setattr__(self, "awareness", keys)
        object.__setattr__(self, "forced", MappingProxyType(forced))

    @property
    def copies(self) -> int:
        """Owner plus standbys: the number Elasticsearch divides among a key's values."""
        return self.replicas + 1


def forced_caps(spec: StandbySpec, tags: Mapping[str, Mapping[str, str]]) -> dict[str, int]:
    """Per forced key, the most copies one value may hold: ceil(copies / |live values | forced values| (a set union)).

    Forced values no live broker carries still count -- that is what holds copies back while a zone is
    down. A key with no value at all gets 0: no broker carries it, so nothing may be placed anyway.
    """
    caps = {}
    for key, forced_values in spec.forced.items():
        values = {t[key] for t in tags.values() if key in t} | forced_values
        caps[key] = -(-spec.copies // len(values)) if values else 0
    return caps


def forced_ok(
    broker: str, holders: Sequence[str], tags: Mapping[str, Mapping[str, str]], caps: Mapping[str, int]
) -> bool:
    """Whether one more copy on ``broker`` keeps every forced key within its cap.

    A broker lacking a forced key never receives a copy (Elasticsearch: nodes without the attribute get no
    shards).
    """
    mine = tags.get(broker, {})
    for key, cap in caps.items():
        value = mine.get(key)
        if value is None:
            return False
        held = sum(1 for h in holders if tags.get(h, {}).get(key) == value)
        if held + 1 > cap:
            return False
    return True


def place_standbys(
    bundles: Iterable[str],
    *,
    owner_of: Callable[[str], str | None],
    candidates_of: Callable[[str], Sequence[str]],
    tags: Mapping[str, Mapping[str, str]],
    load: Mapping[str, int],
    spec: StandbySpec,
    keep: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, list[str]]:
    """Standbys for each bundle (name order in the result), each list in pick order.

    ``owner_of`` gives a bundle's owner (None: unowned, which gets no standbys -- there is nothing to
    shadow). ``candidates_of`` gives the brokers that could take the bundle over (the isolation
    candidates); the owner is never among the picks and a broker holds at most one copy. ``tags`` holds
    every live broker's tags (distinct-value counts and forced caps are taken over all of them, as
    KIP-708 and Elasticsearch do). ``load`` is each broker's owned bundles; standbys given here add to it.

    ``keep`` holds the standbys last published, by bundle. A bundle whose owner is no longer live keeps
    those of them that still are (and are still candidates), in their order: they are the brokers that
    pre-warmed it, and healing is about to hand it to one of them. Recomputed instead, with the dead
    owner's zone no longer counting and the loads shifted, a set can land on a broker that never warmed
    the bundle -- or stack two orphans on one survivor that their standbys had spread.
    """
    sets: dict[int, tuple[Sequence[str], frozenset[str]]] = {}

    def candidate_set(bundle: str) -> frozenset[str]:
        cands = candidates_of(bundle)  # often the same tuple for a whole namespace: one set per tuple
        got = sets.get(id(cands))
        if got is None or got[0] is not cands:
            got = sets[id(cands)] = (cands, frozenset(cands))
        return got[1]

    kept = keep or {}
    return _place(
        bundles,
        lambda b: kept.get(b, ()),
        owner_of=owner_of,
        candidates_of=candidate_set,
        picker=_Picker(StandbyRules(spec, tags), StandbyLoads(load, tags)),
        sticky=False,
    )


class StandbyLoads:
    """Each live broker's owned plus standby bundles, kept in ``(count, id)`` order -- the order standbys
    are picked in (fewest first, then the lowest id) -- as counts change, so that a pick looks at the first
    few brokers instead of every one (a repair of one bundle at 10 000 brokers). Brokers not given as live
    are not counted and never picked."""

    def __init__(self, counts: Mapping[str, int], live: Iterable[str]) -> None:
        self._count = {b: counts.get(b, 0) for b in live}
        self._order = sorted((n, b) for b, n in self._count.items())

    def get(self, broker: str) -> int:
        return self._count.get(broker, 0)

    def add(self, broker: str | None, delta: int) -> None:
        n = self._count.get(broker) if broker is not None else None
        if n is None or broker is None or not delta:
            return
        order = self._order
        del order[bisect_left(order, (n, broker))]
        insort(order, (n + delta, broker))
        self._count[broker] = n + delta

    def ordered(self) -> Iterator[str]:
        """Live brokers, fewest bundles first (ties by id). Do not :meth:`add` while iterating."""
        return (b for _, b in self._order)


class StandbyRules:
    """A :class:`StandbySpec` over the live brokers' tags, summed up once (distinct values per awareness
    key, forced caps) -- O(brokers) -- so that repairing one bundle does not pay it again. Build one per
    change of brokers or policies."""

    def __init__(self, spec: StandbySpec, tags: Mapping[str, Mapping[str, str]]) -> None:
        self.spec, self.tags = spec, tags
        self.keys = spec.awareness
        self.distinct = {k: len({t[k] for t in tags.values() if k in t}) for k in self.keys}
        self.caps = forced_caps(spec, tags)
        self.entries: dict[str, frozenset[tuple[str, str]]] = {}


class _Picker:
    """The rules of :func:`repair_standbys` over one set of tags and loads."""

    def __init__(self, rules: StandbyRules, loads: StandbyLoads) -> None:
        self.spec, self.tags, self.loads = rules.spec, rules.tags, loads
        self.keys, self.distinct, self.caps = rules.keys, rules.distinct, rules.caps
        self._entries = rules.entries

    def entries_of(self, b: str) -> frozenset[tuple[str, str]]:
        got = self._entries.get(b)
        if got is None:
            t = self.tags.get(b, {})
            got = self._entries[b] = frozenset((k, t[k]) for k in self.keys if k in t)
        return got

    def used_by(self, holders: list[str]) -> set[tuple[str, str]]:
        # a key with no more distinct values than copies already placed is dropped for this bundle
        active = {k for k in self.keys if self.distinct[k] > len(holders)}
        return {e for h in holders for e in self.entries_of(h) if e[0] in active}

    def allowed(self, b: str, cands: Collection[str], holders: list[str], used: set[tuple[str, str]]) -> bool:
        return (
            b in self.tags
            and b in cands
            and b not in holders
            and (not used or used.isdisjoint(self.entries_of(b)))
            and (not self.caps or forced_ok(b, holders, self.tags, self.caps))
        )

    def take(self, b: str, picks: list[str], holders: list[str]) -> None:
        picks.append(b)
        holders.append(b)
        self.loads.add(b, 1)

    def fill(self, picks: list[str], holders: list[str], cands: Collection[str], *, tag_aware: bool) -> None:
        """Least loaded first (ties to the lowest id): the first allowed broker in load order."""
        while len(picks) < self.spec.replicas:
            used = self.used_by(holders) if tag_aware else set()
            pick = next((b for b in self.loads.ordered() if self.allowed(b, cands, holders, used)), None)
            if pick is None:
                return  # after the tags: held back, no broker may take another copy
            self.take(pick, picks, holders)

    def keep(self, old: list[str], picks: list[str], holders: list[str], cands: Collection[str]) -> list[str]:
        """Take back the old standbys still right; returns those only the tags refused (taken back first
        if the bundle is still short after every bundle's tag-aware turn)."""
        refused: list[str] = []
        gone = holders[0] not in self.tags  # a dead owner's standbys pre-warmed it: kept whatever the tags
        for b in old:
            if len(picks) >= self.spec.replicas:
                break
            if gone:
                if b in self.tags and b in cands and b not in holders:
                    self.take(b, picks, holders)
            elif self.allowed(b, cands, holders, self.used_by(holders)):
                self.take(b, picks, holders)
            elif self.allowed(b, cands, holders, set()):
                refused.append(b)
        return refused


def repair_standbys(
    bundles: Iterable[str],
    current: Callable[[str], Sequence[str]],
    *,
    owner_of: Callable[[str], str | None],
    candidates_of: Callable[[str], Collection[str]],
    rules: StandbyRules,
    loads: StandbyLoads,
) -> dict[str, list[str]]:
    """The standby sets of ``bundles`` brought up to date, keeping what is still right: the sets of a
    bundle whose owner changed, of one new or gone, after a standby left -- without recomputing the others.

    A bundle keeps each standby of ``current`` (in order) that is still live, a candidate, not its owner
    and within the rules given the copies before it (tag awareness, forced caps) -- a dead owner's standbys
    are kept whatever the tags, as :func:`place_standbys` keeps them: healing is about to hand the bundle to
    one of them -- and fills the rest as
    :func:`place_standbys` does: least loaded by ``loads`` (owned + standbys, its own old standbys no
    longer counted), tag-aware first; after every bundle had that turn, the ones still short take back a
    standby they had that only the tags refused, then any broker the forced caps allow ("least preferred").
    With no current sets and ``loads`` the owned counts, the result is :func:`place_standbys`'. ``loads`` is
    updated with every change; the result holds every bundle given (an empty list: none needed)."""
    return _place(
        bundles,
        current,
        owner_of=owner_of,
        candidates_of=candidates_of,
        picker=_Picker(rules, loads),
        sticky=True,
    )


def _place(
    bundles: Iterable[str],
    current: Callable[[str], Sequence[str]],
    *,
    owner_of: Callable[[str], str | None],
    candidates_of: Callable[[str], Collection[str]],
    picker: _Picker,
    sticky: bool,
) -> dict[str, list[str]]:
    """:func:`repair_standbys` (``sticky``: every current set counts and keeps what is still right) and
    :func:`place_standbys` (not: only a dead owner's standbys are kept, and nothing counts until taken)."""
    p, loads, tags = picker, picker.loads, picker.tags
    spec = p.spec
    result: dict[str, list[str]] = {}
    unfinished: list[tuple[str, list[str], Collection[str], list[str]]] = []
    for bundle in sorted(set(bundles)):
        owner = owner_of(bundle)
        old = list(current(bundle))
        if sticky:
            for b in old:
                loads.add(b, -1)
        elif owner in tags:
            old = []
        picks: list[str] = []
        result[bundle] = picks
        if owner is None or spec.replicas == 0:
            continue
        cands = candidates_of(bundle)
        holders = [owner]
        refused = p.keep(old, picks, holders, cands)
        p.fill(picks, holders, cands, tag_aware=True)
        if len(picks) < spec.replicas:
            unfinished.append((bundle, holders, cands, refused))
    for bundle, holders, cands, refused in unfinished:
        picks = result[bundle]
        for b in refused:
            if len(picks) < spec.replicas and p.allowed(b, cands, holders, set()):
                p.take(b, picks, holders)
        p.fill(picks, holders, cands, tag_aware=False)
    return result
