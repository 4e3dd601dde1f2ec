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

from collections.abc import Callable, Iterable, Mapping, Sequence
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
    live_load = dict(load)
    keys = spec.awareness
    distinct = {k: len({t[k] for t in tags.values() if k in t}) for k in keys}
    caps = forced_caps(spec, tags)
    no_entries: frozenset[tuple[str, str]] = frozenset()
    # each broker's (key, value) pairs for the awareness keys: "shares a value" becomes one set operation
    entries = {b: frozenset((k, t[k]) for k in keys if k in t) for b, t in tags.items()}

    def least_loaded(cands: Sequence[str], holders: list[str], used: set[tuple[str, str]]) -> str | None:
        # cands are in id order, so keeping the first of equal loads is "then the lowest id"
        best: str | None = None
        best_load = 0
        for b in cands:
            if b in holders:
                continue
            if used and not used.isdisjoint(entries.get(b, no_entries)):
                continue
            if caps and not forced_ok(b, holders, tags, caps):
                continue
            n = live_load.get(b, 0)
            if best is None or n < best_load:
                best, best_load = b, n
        return best

    def take(pick: str, picks: list[str], holders: list[str]) -> None:
        picks.append(pick)
        holders.append(pick)
        live_load[pick] = live_load.get(pick, 0) + 1

    result: dict[str, list[str]] = {}
    unfinished: list[tuple[str, list[str], list[str], int]] = []  # bundle, holders, candidates, missing
    for bundle in sorted(set(bundles)):
        owner = owner_of(bundle)
        picks: list[str] = []
        result[bundle] = picks
        if owner is None or spec.replicas == 0:
            continue
        cands = sorted({b for b in candidates_of(bundle) if b != owner})
        holders = [owner]
        if keep and owner not in tags:
            for b in keep.get(bundle, ()):
                if len(picks) < spec.replicas and b in tags and b in cands and b not in holders:
                    take(b, picks, holders)
        while len(picks) < spec.replicas:
            # a key with no more distinct values than copies already placed is dropped for this bundle
            active = {k for k in keys if distinct[k] > len(holders)}
            used = {e for h in holders for e in entries.get(h, no_entries) if e[0] in active}
            pick = least_loaded(cands, holders, used)
            if pick is None:
                break
            take(pick, picks, holders)
        if len(picks) < spec.replicas:
            unfinished.append((bundle, holders, cands, spec.replicas - len(picks)))

    # least preferred: after every bundle had its tag-aware turn, ignore tags (forced caps still hold)
    for bundle, holders, cands, missing in unfinished:
        picks = result[bundle]
        for _ in range(missing):
            pick = least_loaded(cands, holders, set())
            if pick is None:
                break  # held back: no broker may take another copy
            take(pick, picks, holders)
    return result
