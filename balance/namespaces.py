"""Which namespaces may exist, decided without I/O: name validation and the auto-create allow-list.

A lookup names a namespace (``persistent://tenant/ns/topic``) and, before this module existed, created it
in ZooKeeper whenever it did not exist yet: anyone who could reach an agent's public lookup endpoint
could create persistent znodes and grow the channel without bound (docs/security.md, "Namespaces and
lookup limits"). Pulsar never creates a namespace on a lookup -- an administrator creates it -- and the
default here is the same: ``namespace.auto_create`` is empty. Operators who want lookups to create
namespaces list the tenants or ``tenant/namespace`` globs that may be created.

Everything here is pure, so the agent (lookups), the controller (admin creation) and the property tests
run the same decisions.
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from trimtab.channel.records import IN_FLIGHT, Record, State
from trimtab.errors import BundleError

#: The longest tenant or namespace part (the channel's bundle-name grammar, channel/bundles.py).
PART_MAX = 128
#: The characters a part may hold; the first must be a letter or a digit (Pulsar's NamedEntity rules,
#: minus what would be ambiguous in a ZooKeeper path or a bundle name: no '/', no whitespace).
_PART_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=:-]*")
_PART_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.=:-")
# A pattern part: name characters and fnmatch's *, ?, [...] and [!...].
_PATTERN_PART_RE = re.compile(r"[A-Za-z0-9_.=:*?\[\]!-]{1,128}")


def check_part(what: str, part: str) -> str:
    """``part`` (a tenant or a namespace's local name) if it is valid, else :class:`BundleError` saying
    exactly what is wrong (empty, too long, which character) -- checked before anything reaches ZooKeeper."""
    if not part:
        raise BundleError(f"the {what} must not be empty")
    if len(part) > PART_MAX:
        raise BundleError(f"the {what} {part[:32]!r}... is {len(part)} characters long; at most {PART_MAX}")
    bad = next((c for c in part if c not in _PART_CHARS), None)
    if bad is not None:
        raise BundleError(
            f"the {what} {part!r} holds {bad!r}: use letters, digits and '_', '.', '=', ':', '-' only"
        )
    if not _PART_RE.fullmatch(part):
        raise BundleError(f"the {what} {part!r} must start with a letter or a digit")
    return part


def check_namespace(namespace: str) -> str:
    """``tenant/namespace`` if both parts are valid (see :func:`check_part`), else :class:`BundleError`."""
    tenant, sep, local = namespace.partition("/")
    if not sep:
        raise BundleError(f"invalid namespace {namespace[:300]!r}: expected tenant/namespace")
    check_part("tenant", tenant)
    check_part("namespace", local)
    return namespace


def check_pattern(pattern: str) -> str:
    """An allow-list entry: ``tenant-glob`` or ``tenant-glob/namespace-glob`` (fnmatch: ``*``, ``?``,
    ``[...]``), each part 1-128 of the name characters and the glob characters."""
    parts = pattern.split("/")
    if len(parts) > 2 or not all(_PATTERN_PART_RE.fullmatch(p) for p in parts):
        raise BundleError(
            f"invalid namespace pattern {pattern[:300]!r}: expected TENANT or TENANT/NAMESPACE, each a glob "
            "of letters, digits, '_', '.', '=', ':', '-' and '*', '?', '[...]' (e.g. 'public/*')"
        )
    return pattern


@dataclass(frozen=True)
class AutoCreatePolicy:
    """The namespaces a lookup may create (``namespace.auto_create``).

    Each pattern is a tenant glob (every namespace of the matching tenants) or a ``tenant/namespace``
    glob; the tenant and namespace parts are matched separately and case-sensitively, so ``*`` never
    crosses the ``/``. No pattern (the default) means no lookup creates anything: namespaces are made by
    an operator (``trimtab admin namespaces create``)."""

    patterns: tuple[str, ...] = ()

    @classmethod
    def of(cls, patterns: Iterable[str]) -> AutoCreatePolicy:
        """The policy of these patterns, each checked (:class:`BundleError` names a bad one)."""
        return cls(tuple(check_pattern(p) for p in patterns))

    def allows(self, namespace: str) -> bool:
        """Whether a lookup may create ``namespace``. A name that is not valid is never allowed."""
        try:
            check_namespace(namespace)
        except BundleError:
            return False
        tenant, _, local = namespace.partition("/")
        for p in self.patterns:
            t, sep, n = p.partition("/")
            if fnmatch.fnmatchcase(tenant, t) and (not sep or fnmatch.fnmatchcase(local, n)):
                return True
        return False

    def describe(self) -> str:
        """The policy in words, for messages."""
        if not self.patterns:
            return "namespace.auto_create is empty: lookups create no namespace"
        return f"namespace.auto_create allows {', '.join(self.patterns)}"


def not_found_message(namespace: str) -> str:
    """What a lookup of a topic in a namespace that does not exist (and may not be created) answers: which
    namespace, why it was not created, and how an operator creates it. The allow-list itself is not
    shown: the lookup is public, and the patterns say which tenants exist."""
    return (
        f"namespace {namespace} does not exist, and namespace.auto_create does not let lookups create it. "
        f"An operator creates it with `trimtab admin namespaces create {namespace}` "
        "(POST /v1/admin/namespaces on a controller), or allows it in namespace.auto_create "
        "(docs/security.md)"
    )


@dataclass(frozen=True)
class NamespaceBundles:
    """A namespace's bundles in the channel, as a deletion sees them: the ``Owned`` ones (with their
    records, to unload), and those in flight (an assignment, a move or a split under way: an unload needs
    an ``Owned`` record, so they are unloaded by the next delete, once they settle)."""

    owned: list[tuple[str, Record]] = field(default_factory=list)
    in_flight: dict[str, str] = field(default_factory=dict)  # bundle -> state

    @property
    def live(self) -> bool:
        """Whether the channel still gives the namespace a broker (owned or in flight)."""
        return bool(self.owned or self.in_flight)


def _namespace_of(bundle: str) -> str:
    return bundle.rsplit("/", 1)[0]


def bundles_of(items: Iterable[tuple[str, Record]], namespace: str) -> NamespaceBundles:
    """The bundles of ``namespace`` in a channel table's ``items()`` (Free and Deleted ones have no broker:
    left out)."""
    out = NamespaceBundles()
    for bundle, rec in items:
        if _namespace_of(bundle) != namespace:
            continue
        if rec.state is State.OWNED and rec.dst is not None:
            out.owned.append((bundle, rec))
        elif rec.state in IN_FLIGHT:
            out.in_flight[bundle] = rec.state.value
    out.owned.sort()
    return out


def owned_per_namespace(items: Iterable[tuple[str, Record]]) -> Counter[str]:
    """How many ``Owned`` bundles each namespace has in a channel table's ``items()``."""
    return Counter(_namespace_of(b) for b, rec in items if rec.state is State.OWNED)
