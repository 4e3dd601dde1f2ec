"""The placement objects the daemons hold: a :class:`PlacementPolicy` (brokers, domains, groups, isolation
policies -- rebuilt when any of them changes) and a :class:`Placement` (that policy plus an ownership
index, updated one bundle at a time as the channel moves).

Why two objects: the policy changes on admin actions and membership changes, ownership changes on every
assignment. Keeping ownership in an incrementally maintained index (per group, per broker counts) makes
every question O(candidates) at worst, and the per-(isolation policy, group, owner) memo -- invalidated by
a per-group version -- makes a pass over 100 000 bundles mostly dictionary lookups.

Nothing here does I/O or reads a clock; every answer is a function of the inputs, in sorted broker order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from trimtab.balance.placement.affinity import CandidateLayout, group_key
from trimtab.balance.placement.isolation import IsolationPolicy, policy_for, sorted_policies
from trimtab.balance.placement.model import Broker, PlacementConfigError, namespace_of
from trimtab.balance.placement.standby import StandbySpec, place_standbys

_NO_COUNTS: Mapping[str, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class NamespaceRules:
    """What the policy says about one namespace: its isolation policy (None: shared brokers only), the
    brokers isolation allows (sorted) and their layout by domain, and its anti-affinity group key (None: no
    group)."""

    policy: str | None
    candidates: tuple[str, ...]
    layout: CandidateLayout
    group: str | None


class PlacementPolicy:
    """The static half of placement, built once per change of brokers or policies.

    * ``brokers``: every live broker (with its domain and tags); ids must be unique.
    * ``failure_domains_enabled``: the PIP-7 switch; the domain step also needs at least one live broker
      in a domain.
    * ``anti_affinity_groups``: ``{namespace: group}``; blank groups mean none, groups compare
      case-insensitively.
    * ``isolation_policies``: policies (or ``{name: policy}``), applied in name order.

    Per-namespace answers are memoised: the memo grows with the number of distinct namespaces asked about,
    and dies with the policy.
    """

    def __init__(
        self,
        brokers: Iterable[Broker],
        *,
        failure_domains_enabled: bool = False,
        anti_affinity_groups: Mapping[str, str] | None = None,
        isolation_policies: Iterable[IsolationPolicy] | Mapping[str, IsolationPolicy] = (),
    ) -> None:
        by_id: dict[str, Broker] = {}
        for b in brokers:
            if b.id in by_id:
                raise PlacementConfigError(f"broker {b.id!r} is listed twice")
            by_id[b.id] = b
        self._brokers = MappingProxyType(dict(sorted(by_id.items())))
        self.broker_ids: tuple[str, ...] = tuple(self._brokers)
        self.failure_domains_enabled = bool(failure_domains_enabled)
        # domains count only when switched on and somebody is in one (Pulsar: an empty domain map skips the step)
        self._domain_of: Mapping[str, str | None] | None = None
        if self.failure_domains_enabled and any(b.domain for b in by_id.values()):
            self._domain_of = MappingProxyType({b.id: b.domain or None for b in by_id.values()})
        self._groups = {
            ns: key for ns, g in (anti_affinity_groups or {}).items() if (key := group_key(g)) is not None
        }
        if isinstance(isolation_policies, Mapping):
            for name, p in isolation_policies.items():
                if name != p.name:
                    raise PlacementConfigError(f"isolation policy {p.name!r} is filed under {name!r}")
            isolation_policies = isolation_policies.values()
        self.isolation_policies: tuple[IsolationPolicy, ...] = sorted_policies(isolation_policies)
        self._tags = MappingProxyType({b.id: b.tags for b in by_id.values()})
        self._by_policy: dict[str | None, tuple[tuple[str, ...], CandidateLayout]] = {}
        self._namespaces: dict[str, NamespaceRules] = {}

    @property
    def brokers(self) -> Mapping[str, Broker]:
        """Live brokers by id, in id order."""
        return self._brokers

    @property
    def tags(self) -> Mapping[str, Mapping[str, str]]:
        """Each live broker's tags, by id."""
        return self._tags

    @property
    def domain_of(self) -> Mapping[str, str | None] | None:
        """Each broker's domain, or None while the domain step is off."""
        return self._domain_of

    def group_of(self, namespace: str) -> str | None:
        """The namespace's anti-affinity group key (case-folded), or None."""
        return self._groups.get(namespace)

    def rules(self, namespace: str) -> NamespaceRules:
        """The memoised isolation candidates and group of ``namespace``."""
        rules = self._namespaces.get(namespace)
        if rules is None:
            policy = policy_for(namespace, self.isolation_policies)
            name = None if policy is None else policy.name
            known = self._by_policy.get(name)
            if known is None:
                if policy is not None:
                    cands = tuple(policy.candidates(self.broker_ids))
                else:
                    shared = (
                        b
                        for b in self.broker_ids
                        if not any(p.is_primary(b) for p in self.isolation_policies)
                    )
                    cands = tuple(shared)
                known = (cands, CandidateLayout(cands, self._domain_of))
                self._by_policy[name] = known
            rules = NamespaceRules(name, known[0], known[1], self._groups.get(namespace))
            self._namespaces[namespace] = rules
        return rules

    def isolation_candidates(self, namespace: str) -> tuple[str, ...]:
        """The brokers isolation allows for ``namespace``, sorted (may be empty)."""
        return self.rules(namespace).candidates

    def has_policies(self, namespace: str) -> bool:
        """Whether ``namespace`` has an isolation policy or an anti-affinity group: the bundles the shedder
        leaves alone unless ``shedding.shed_bundles_with_policies`` (Pulsar's
        ``isLoadBalancerSheddingBundlesWithPoliciesEnabled``)."""
        rules = self.rules(namespace)
        return rules.policy is not None or rules.group is not None


class Placement:
    """A policy plus who owns what (``Owned`` bundles only), answering the placement questions.

    ``owned`` is ``{bundle: broker}``; owners need not be live (a failed broker's bundles still count for
    their group until they move). Keep it current with :meth:`set_owner`.
    """

    def __init__(self, policy: PlacementPolicy, owned: Mapping[str, str] | None = None) -> None:
        self.policy = policy
        self._owners: dict[str, str] = {}
        self._totals: dict[str, int] = {}  # broker -> owned bundles
        self._group_counts: dict[str, dict[str, int]] = {}  # group -> broker -> owned bundles of the group
        self._group_version: dict[str, int] = {}
        self._memo: dict[tuple[str | None, str, str | None], tuple[int, tuple[str, ...]]] = {}
        self._sets: dict[int, tuple[tuple[str, ...], frozenset[str]]] = {}  # see candidate_set
        for bundle, broker in (owned or {}).items():
            self.set_owner(bundle, broker)

    # ------------------------------------------------------------------ ownership index
    def owner(self, bundle: str) -> str | None:
        """The broker owning ``bundle``, or None."""
        return self._owners.get(bundle)

    @property
    def owned(self) -> Mapping[str, str]:
        """The ownership index, read-only."""
        return MappingProxyType(self._owners)

    def owned_count(self, broker: str) -> int:
        """How many bundles ``broker`` owns."""
        return self._totals.get(broker, 0)

    def set_owner(self, bundle: str, broker: str | None) -> None:
        """Record that ``bundle`` is now ``Owned`` by ``broker`` (None: owned by nobody). O(1)."""
        old = self._owners.get(bundle)
        if old == broker:
            return
        group = self.policy.group_of(namespace_of(bundle))
        counts = None if group is None else self._group_counts.setdefault(group, {})
        if old is not None:
            del self._owners[bundle]
            self._dec(self._totals, old)
            if counts is not None:
                self._dec(counts, old)
        if broker is not None:
            self._owners[bundle] = broker
            self._totals[broker] = self._totals.get(broker, 0) + 1
            if counts is not None:
                counts[broker] = counts.get(broker, 0) + 1
        if group is not None:
            self._group_version[group] = self._group_version.get(group, 0) + 1

    @staticmethod
    def _dec(counts: dict[str, int], broker: str) -> None:
        n = counts[broker] - 1
        if n:
            counts[broker] = n
        else:
            del counts[broker]

    # ------------------------------------------------------------------ questions
    def group_counts(self, bundle: str) -> Mapping[str, int] | None:
        """Per broker, the bundles of ``bundle``'s anti-affinity group in ``Owned`` -- ``bundle`` itself
        excluded -- or None when its namespace has no group."""
        group = self.policy.group_of(namespace_of(bundle))
        if group is None:
            return None
        counts = dict(self._group_counts.get(group, {}))
        current = self._owners.get(bundle)
        if current is not None:
            self._dec(counts, current)
        return counts

    def candidates(self, bundle: str, owner: str | None = None) -> list[str]:
        """The brokers that may own ``bundle`` (sorted): isolation first, then anti-affinity.

        ``owner``, when given, is removed from the answer: pass the current owner to ask where the bundle
        may *move*. The bundle itself never counts for its group, so its current owner is judged as if the
        bundle were already gone -- which is what makes a move unable to worsen the spread. May be empty.
        """
        rules = self.policy.rules(namespace_of(bundle))
        cands = rules.candidates
        group = rules.group
        if group is not None and cands:
            current = self._owners.get(bundle)
            key = (rules.policy, group, current)
            version = self._group_version.get(group, 0)
            hit = self._memo.get(key)
            if hit is not None and hit[0] == version:
                cands = hit[1]
            else:
                counts = self._group_counts.get(group, _NO_COUNTS)
                cands = rules.layout.filter(counts, current if current in counts else None)
                self._memo[key] = (version, cands)
        if owner is not None:
            return [b for b in cands if b != owner]
        return list(cands)

    def candidate_set(self, bundle: str) -> frozenset[str]:
        """:meth:`candidates` as a set -- the same object for every bundle with the same candidates (the
        memoised tuple of its namespace's rules, or of its anti-affinity group's counts as they stand), so
        that a plan over 100 000 bundles builds one set per namespace, not one per bundle (a healing plan
        keeps its pool while the set is the same: balance/heal.py ``plan_destinations``)."""
        rules = self.policy.rules(namespace_of(bundle))
        cands = rules.candidates
        if rules.group is not None and cands:
            current = self._owners.get(bundle)
            hit = self._memo.get((rules.policy, rules.group, current))
            if hit is None or hit[0] != self._group_version.get(rules.group, 0):
                self.candidates(bundle)  # memoises the group's filter
                hit = self._memo.get((rules.policy, rules.group, current))
            if hit is None:
                return frozenset(self.candidates(bundle))
            cands = hit[1]
        got = self._sets.get(id(cands))
        if got is None or got[0] is not cands:
            if len(self._sets) > 1024:
                self._sets.clear()  # group counts change as a plan places bundles: old tuples are dropped
            got = self._sets[id(cands)] = (cands, frozenset(cands))
        return got[1]

    def may_unload(self, bundle: str) -> bool:
        """Whether the shedder may unload ``bundle``: it is owned, and some broker other than its owner is
        a candidate. An unowned bundle has nothing to unload."""
        owner = self._owners.get(bundle)
        return owner is not None and bool(self.candidates(bundle, owner))

    def may_transfer(self, bundle: str, to: str) -> bool:
        """Whether ``bundle`` may be transferred to ``to``: it is owned, and ``to`` is among the candidates
        minus the current owner (so never to the owner itself)."""
        owner = self._owners.get(bundle)
        return owner is not None and to != owner and to in self.candidates(bundle, owner)

    def standbys(
        self,
        bundles: Iterable[str],
        spec: StandbySpec | None = None,
        *,
        replicas: int | None = None,
        awareness: Sequence[str] = (),
        forced: Mapping[str, Iterable[str]] | None = None,
        keep: Mapping[str, Sequence[str]] | None = None,
    ) -> dict[str, list[str]]:
        """Warm standbys for ``bundles`` (see :mod:`~trimtab.balance.placement.standby`).

        Give a prebuilt ``spec``, or ``replicas``/``awareness``/``forced``. Standbys come from the bundle's
        isolation candidates (a standby is a broker that could take the bundle over), never the owner;
        anti-affinity does not apply (a standby owns nothing). Loads are the owned counts of this index.
        ``keep``: the standbys last published, kept for bundles whose owner has gone (see
        :func:`~trimtab.balance.placement.standby.place_standbys`).
        """
        if spec is None:
            if replicas is None:
                raise PlacementConfigError("standbys need a spec or a number of replicas")
            spec = StandbySpec(
                replicas,
                tuple(awareness),
                {k: frozenset(v) for k, v in (forced or {}).items()},
            )
        return place_standbys(
            bundles,
            owner_of=self._owners.get,
            candidates_of=lambda b: self.policy.rules(namespace_of(b)).candidates,
            tags=self.policy.tags,
            load=self._totals,
            spec=spec,
            keep=keep,
        )
