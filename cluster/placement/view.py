"""The placement rules as they stand right now (docs/placement.md), for every decision that places a
bundle: a lookup's assignment, drain, healing and the monitor's destinations, the shedder's move guard and
an operator's transfer.

Three inputs change independently, each on its own thread: the policies (ZooKeeper znodes, through
:class:`~trimtab.cluster.placement.store.PlacementWatch`), the live brokers (the registry) and who owns
what (the channel table). The policy is rebuilt lazily -- on the first question after brokers or policies
changed -- and the ownership index is kept current record by record, so a question costs a dictionary
lookup or two, not a scan of 100 000 bundles.

A broker's failure domain is the ZooKeeper domain that lists it (the admin API); a broker in no domain
falls back to the ``broker.failure_domain`` it registered with. Draining brokers are not candidates.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import structlog

from trimtab.balance.assign import BrokerInfo
from trimtab.balance.placement import (
    Broker,
    IsolationPolicy,
    Placement,
    PlacementPolicy,
    namespace_of,
)
from trimtab.channel.records import Record, State
from trimtab.cluster.placement.store import PlacementDocs
from trimtab.errors import TrimtabError

log = structlog.get_logger("trimtab.placement")


def build_policy(
    docs: PlacementDocs, brokers: Mapping[str, BrokerInfo], *, failure_domains_enabled: bool
) -> PlacementPolicy:
    """The pure policy for these documents over the live, non-draining ``brokers``."""
    domain_of: dict[str, str] = {}
    for name, domain in sorted(docs.domains.domains.items()):
        for b in domain.brokers:
            domain_of.setdefault(b, name)  # the admin API refuses a broker in two domains; first wins
    live = [
        Broker(b, domain_of.get(b, info.failure_domain), info.tags)
        for b, info in sorted(brokers.items())
        if not info.draining
    ]
    policies = []
    for name, p in sorted(docs.isolation.policies.items()):
        try:
            policies.append(IsolationPolicy.of(name, p))
        except (TrimtabError, ValueError) as e:  # written by hand past the admin API: skip, say so
            log.warning("isolation_policy_invalid", policy=name, error=str(e), action="ignored")
    return PlacementPolicy(
        live,
        failure_domains_enabled=failure_domains_enabled,
        anti_affinity_groups=docs.groups.groups,
        isolation_policies=policies,
    )


class OwnedTable(Protocol):
    """What the view reads of the channel table (:class:`~trimtab.channel.table.TableView`)."""

    def get(self, bundle: str) -> Record | None: ...

    def owned(self) -> Iterable[tuple[str, str]]: ...


def _owned_dst(rec: Record | None) -> str | None:
    return rec.dst if rec is not None and rec.state is State.OWNED else None


class LivePlacement:
    """Thread-safe placement answers over the current policies, brokers and ownership.

    Ownership is read from the channel table itself, not copied: at a million bundles a copy is ~40 MB on
    every node, and a node that never asks a question the rules decide (an agent with no isolation policy
    and no anti-affinity group) never builds the index that needs one.
    """

    def __init__(
        self,
        brokers: Callable[[], Mapping[str, BrokerInfo]],
        *,
        failure_domains_enabled: bool,
        table: OwnedTable,
    ) -> None:
        self._brokers = brokers
        self.failure_domains_enabled = failure_domains_enabled
        self._table = table
        self._lock = threading.Lock()
        self._docs = PlacementDocs()
        self._owned_total = 0
        self._placement: Placement | None = None  # None: rebuild on the next question
        self.rebuilds = 0
        # one more at each change of policies or brokers (the rules) and each whole new ownership index (a
        # table replaced whole): not at each ownership change, which listeners hear one by one
        self.generation = 0
        self._owner_listeners: list[Callable[[str, str | None, str | None], None]] = []

    # ------------------------------------------------------------------ inputs (any thread)
    def policies_changed(self, docs: PlacementDocs) -> None:
        with self._lock:
            self._docs = docs
            self._placement = None
            self.generation += 1

    def brokers_changed(self, _brokers: object = None) -> None:
        with self._lock:
            self._placement = None
            self.generation += 1

    def add_owner_listener(self, fn: Callable[[str, str | None, str | None], None]) -> None:
        """``fn(bundle, owner before, owner now)`` at each change of an ``Owned`` owner, called under this
        index's lock: a :meth:`planning` copy holds every change heard before it and none heard after."""
        self._owner_listeners.append(fn)

    def record_changed(self, bundle: str, old: Record | None, new: Record | None) -> None:
        """A channel listener, called after the table applied the record: keep the ``Owned`` count and a
        built index current. (A build that scanned the table just before this call already holds the
        change: setting an owner twice is a no-op.)"""
        before, owner = _owned_dst(old), _owned_dst(new)
        if owner == before:
            return
        with self._lock:
            self._owned_total += (owner is not None) - (before is not None)
            if self._placement is not None:
                self._placement.set_owner(bundle, owner)
            for fn in self._owner_listeners:
                fn(bundle, before, owner)

    def load_table(self) -> None:
        """The table turned live or was replaced whole (listeners heard nothing of it): start over. Called
        on the thread that feeds the table, so no record is applied meanwhile."""
        total = sum(1 for _ in self._table.owned())
        with self._lock:
            self._owned_total = total
            self._placement = None
            self.generation += 1

    # ------------------------------------------------------------------ questions (any thread)
    def _current(self) -> Placement:
        p = self._placement
        if p is None:
            policy = build_policy(
                self._docs, self._brokers(), failure_domains_enabled=self.failure_domains_enabled
            )
            p = self._placement = Placement(policy, dict(self._table.owned()))
            self.rebuilds += 1
        return p

    def candidates(self, bundle: str, owner: str | None = None) -> list[str]:
        with self._lock:
            return self._current().candidates(bundle, owner)

    def owner(self, bundle: str) -> str | None:
        """The bundle's owner by the channel (``Owned`` records only)."""
        return _owned_dst(self._table.get(bundle))

    def owned_total(self) -> int:
        """How many bundles are ``Owned``."""
        with self._lock:
            return self._owned_total

    def standby_rules(self) -> tuple[Callable[[str], frozenset[str]], Mapping[str, Mapping[str, str]]]:
        """What a standby repair reads, as the rules stand: each bundle's isolation candidates as a set
        (anti-affinity does not apply to a standby, which owns nothing; one set per namespace rule) and
        every live broker's tags."""
        with self._lock:
            policy = self._current().policy
        sets: dict[int, tuple[tuple[str, ...], frozenset[str]]] = {}

        def candidates(bundle: str) -> frozenset[str]:
            cands = policy.rules(namespace_of(bundle)).candidates
            got = sets.get(id(cands))
            if got is None or got[0] is not cands:
                got = sets[id(cands)] = (cands, frozenset(cands))
            return got[1]

        return candidates, policy.tags

    def open_to_all(self, bundle: str) -> bool:
        """Whether the rules allow ``bundle`` every live broker: no isolation policy at all (a namespace
        without one gets the brokers no policy claims) and no anti-affinity group for its namespace. Then
        load alone decides its assignment (the agent's assignment index); a policy that is on file but
        invalid counts as one, so this errs towards the full rules."""
        docs = self._docs  # replaced whole on a change: one read is a consistent view
        return not docs.isolation.policies and namespace_of(bundle) not in docs.groups.groups

    def allowed(self, bundle: str) -> frozenset[str]:
        """The brokers placement allows for ``bundle``, as a set (for membership tests)."""
        return frozenset(self.candidates(bundle))

    def restrict(self, bundle: str, brokers: dict[str, BrokerInfo]) -> dict[str, BrokerInfo]:
        """The brokers of ``brokers`` that placement allows for ``bundle`` (a hard filter: may be empty)."""
        allowed = self.allowed(bundle)
        return {k: v for k, v in brokers.items() if k in allowed}

    def may_unload(self, bundle: str) -> bool:
        with self._lock:
            return self._current().may_unload(bundle)

    def may_transfer(self, bundle: str, to: str) -> bool:
        with self._lock:
            return self._current().may_transfer(bundle, to)

    def may_move(self, bundle: str, src: str, dst: str | None) -> bool:
        """The shedder's guard: an unload (``dst`` None) or a transfer that keeps the rules."""
        return self.may_unload(bundle) if dst is None else self.may_transfer(bundle, dst)

    def has_policies(self, bundle: str) -> bool:
        """Whether ``bundle``'s namespace has an isolation policy or an anti-affinity group (the shedder's
        ``shedding.shed_bundles_with_policies`` guard)."""
        with self._lock:
            return self._current().policy.has_policies(namespace_of(bundle))

    def planning(self) -> Placement:
        """A private copy of the index to plan many placements on: ``set_owner`` each planned one and the
        next question counts it (a healing plan spreads an anti-affinity group instead of stacking it on
        the broker that was emptiest before the plan). O(bundles) to build; the lock is held for the copy
        only."""
        with self._lock:
            p = self._current()
            return Placement(p.policy, dict(p.owned))

    def explain(self, bundle: str) -> str:
        """Why ``bundle`` has the candidates it has, for refusals and dry runs."""
        with self._lock:
            ns = namespace_of(bundle)
            rules = self._current().policy.rules(ns)
        iso = f"isolation policy {rules.policy!r}" if rules.policy else "no isolation policy (shared brokers)"
        group = f"anti-affinity group {rules.group!r}" if rules.group else "no anti-affinity group"
        return f"namespace {ns}: {iso}, {len(rules.candidates)} live candidates; {group}"
