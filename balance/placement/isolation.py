"""Namespace isolation policies (Pulsar ``NamespaceIsolationPolicies`` with the ``min_available`` failover).

A policy maps namespace regexes to primary and secondary broker regexes. Placement asks one question per
namespace -- which live brokers may own its bundles -- so the answer depends only on the namespace and the
live broker set, and the caller (:class:`~trimtab.balance.placement.core.PlacementPolicy`) caches it per
namespace. Everything here compiles at construction: a policy that exists is a policy that can be applied.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from trimtab.balance.placement.model import PlacementConfigError, host_of


def compile_patterns(policy: str, field_name: str, patterns: Iterable[str]) -> tuple[re.Pattern[str], ...]:
    """Compile every regex of one field, naming the policy, field and index of the first that fails.

    Python ``re`` syntax (Pulsar uses Java's, which agrees on everything an operator normally writes);
    matching is always :meth:`re.Pattern.fullmatch`, like Java's ``String.matches``.
    """
    out = []
    for i, text in enumerate(patterns):
        if not isinstance(text, str):
            raise PlacementConfigError(f"isolation policy {policy!r}: {field_name}[{i}] must be a string")
        try:
            out.append(re.compile(text))
        except re.error as e:
            raise PlacementConfigError(
                f"isolation policy {policy!r}: {field_name}[{i}] {text!r} is not a valid regular expression: {e}"
            ) from None
    return tuple(out)


def _any_fullmatch(patterns: Sequence[re.Pattern[str]], text: str) -> bool:
    return any(p.fullmatch(text) is not None for p in patterns)


class PolicyFields(Protocol):
    """What every document describing an isolation policy carries (ZooKeeper's, the admin API's,
    ``trimtab placement solve``'s)."""

    @property
    def namespaces(self) -> Sequence[str]: ...
    @property
    def primary(self) -> Sequence[str]: ...
    @property
    def secondary(self) -> Sequence[str]: ...
    @property
    def min_limit(self) -> int: ...


@dataclass(frozen=True, kw_only=True)
class IsolationPolicy:
    """One named isolation policy; its regexes are compiled (and refused) here, once.

    ``namespaces`` and ``primary`` must be non-empty and ``secondary`` may be empty, as Pulsar's
    ``NamespaceIsolationDataImpl.validate`` demands: a policy that matches no namespace or names no primary
    broker is a mistake, not a configuration. ``min_limit`` is the ``min_available`` failover threshold:
    secondaries join the candidates while fewer than ``min_limit`` primaries are live.
    """

    name: str
    namespaces: tuple[str, ...]
    primary: tuple[str, ...]
    secondary: tuple[str, ...] = ()
    min_limit: int
    _ns: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)
    _primary: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)
    _secondary: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise PlacementConfigError("an isolation policy needs a non-empty name")
        for attr in ("namespaces", "primary", "secondary"):
            value = getattr(self, attr)
            if isinstance(value, str):  # a lone string would be iterated character by character
                raise PlacementConfigError(
                    f"isolation policy {self.name!r}: {attr} must be a list of regexes"
                )
            object.__setattr__(self, attr, tuple(value))
        if not self.namespaces:
            raise PlacementConfigError(f"isolation policy {self.name!r}: namespaces must not be empty")
        if not self.primary:
            raise PlacementConfigError(f"isolation policy {self.name!r}: primary must not be empty")
        if isinstance(self.min_limit, bool) or not isinstance(self.min_limit, int) or self.min_limit < 0:
            raise PlacementConfigError(f"isolation policy {self.name!r}: min_limit must be an integer >= 0")
        object.__setattr__(self, "_ns", compile_patterns(self.name, "namespaces", self.namespaces))
        object.__setattr__(self, "_primary", compile_patterns(self.name, "primary", self.primary))
        object.__setattr__(self, "_secondary", compile_patterns(self.name, "secondary", self.secondary))

    def applies_to(self, namespace: str) -> bool:
        """Whether one of the namespace regexes full-matches ``namespace``."""
        return _any_fullmatch(self._ns, namespace)

    @classmethod
    def of(cls, name: str, doc: PolicyFields) -> IsolationPolicy:
        """The policy ``doc`` describes -- a stored, requested or ``solve`` document -- checked here."""
        return cls(
            name=name,
            namespaces=tuple(doc.namespaces),
            primary=tuple(doc.primary),
            secondary=tuple(doc.secondary),
            min_limit=doc.min_limit,
        )

    def is_primary(self, broker_id: str) -> bool:
        """Whether the broker's host (not its port) full-matches a primary regex."""
        return _any_fullmatch(self._primary, host_of(broker_id))

    def is_secondary(self, broker_id: str) -> bool:
        """Whether the broker's host full-matches a secondary regex (a primary match takes precedence)."""
        return _any_fullmatch(self._secondary, host_of(broker_id))

    def candidates(self, broker_ids: Iterable[str]) -> list[str]:
        """Live primaries, plus live secondaries when fewer than ``min_limit`` primaries are live.

        The input order is kept. Brokers matching neither list never own this policy's namespaces.
        """
        ids = list(broker_ids)
        primaries = [b for b in ids if self.is_primary(b)]
        if len(primaries) >= self.min_limit:
            return primaries
        return [b for b in ids if self.is_primary(b) or self.is_secondary(b)]


def sorted_policies(policies: Iterable[IsolationPolicy]) -> tuple[IsolationPolicy, ...]:
    """Policies in name order, refusing two with one name: the order decides which policy a namespace
    matched by several gets (Pulsar's ``HashMap`` order is unspecified; ours is pinned)."""
    out = sorted(policies, key=lambda p: p.name)
    for a, b in itertools.pairwise(out):
        if a.name == b.name:
            raise PlacementConfigError(f"two isolation policies are named {a.name!r}")
    return tuple(out)


def policy_for(namespace: str, policies: Sequence[IsolationPolicy]) -> IsolationPolicy | None:
    """The first policy (``policies`` must be in name order) whose namespace regexes match, else None."""
    for p in policies:
        if p.applies_to(namespace):
            return p
    return None


def is_shared(broker_id: str, policies: Iterable[IsolationPolicy]) -> bool:
    """A broker is *shared* iff it is primary in no policy (a secondary-only broker is still shared).

    This follows the issue text and Pulsar's ``isSharedBroker``: being someone's fallback does not reserve
    a broker, only being someone's primary does.
    """
    return not any(p.is_primary(broker_id) for p in policies)


def isolation_candidates(
    namespace: str, broker_ids: Iterable[str], policies: Sequence[IsolationPolicy]
) -> list[str]:
    """The brokers that may own bundles of ``namespace`` under the isolation rules (input order kept).

    With a policy: its :meth:`IsolationPolicy.candidates`. Without one: the shared brokers only, so an
    unpoliced namespace never lands on a broker some policy reserved. May be empty.
    """
    ids = list(broker_ids)
    policy = policy_for(namespace, policies)
    if policy is not None:
        return policy.candidates(ids)
    return [b for b in ids if is_shared(b, policies)]
