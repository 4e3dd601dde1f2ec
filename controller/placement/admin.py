"""Operators' placement policies (docs/placement.md, docs/design.md section 6): failure domains, namespace
anti-affinity groups and namespace isolation policies, kept in ZooKeeper by
:class:`~trimtab.cluster.placement.store.PlacementStore` and applied without restarts (every node watches
the znodes; this module only writes them).

Reads are answered by any controller straight from ZooKeeper; writes are the leader's. Every write is one
versioned read-modify-write of one znode, so a concurrent change is retried, never lost, and a znode this
controller cannot decode is reported (500, naming the path) and left as it is.

An isolation policy change also moves the bundles it affects, as Pulsar does (``unload_scope``, see
:func:`unload_patterns`): each ``Owned`` bundle of an affected namespace gets a ``Releasing`` record with no
destination -- an unload -- and the next lookup places it again under the new policy.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, TypeVar, cast, get_args

import msgspec

from trimtab.balance.placement import IsolationPolicy, PlacementConfigError, group_key, namespace_of
from trimtab.channel.bundles import validate_namespace
from trimtab.channel.records import Record, State
from trimtab.channel.table import TableView
from trimtab.cluster.placement.store import (
    AntiAffinityGroups,
    FailureDomain,
    FailureDomains,
    IsolationPolicies,
    IsolationPolicyDoc,
    PlacementStore,
)
from trimtab.cluster.zk import BrokerRegistry
from trimtab.controller.journal import DecisionJournal
from trimtab.controller.leadership import Leadership
from trimtab.controller.metrics import ControllerMetrics
from trimtab.controller.writes import ChannelWrites
from trimtab.errors import BundleError, RequestError, TrimtabError

UnloadScope = Literal["changed", "all_matching", "none"]
UNLOAD_SCOPES: tuple[str, ...] = get_args(UnloadScope)

NAME_MAX = 64
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
_BROKER_MAX = 255
_BROKER_RE = re.compile(r"[^\s/]+")  # a broker id is one path segment of ZooKeeper's broker registry
# ``GET /v1/isolation-policies/brokers`` is the per-broker view: a policy by that name could not be read.
RESERVED_POLICY_NAMES = frozenset({"brokers"})
_JOURNAL_BUNDLES = 100  # bundles listed in one journal entry (the count is always exact)

S = TypeVar("S", bound=msgspec.Struct)


def check_name(what: str, name: str) -> str:
    """A failure domain, anti-affinity group or isolation policy name: 1-64 of ``[A-Za-z0-9_.-]``."""
    if not name:
        raise RequestError(400, f"the {what} name must not be empty")
    if len(name) > NAME_MAX:
        raise RequestError(
            400, f"the {what} name {name[:NAME_MAX]!r}... is longer than {NAME_MAX} characters"
        )
    if not _NAME_RE.fullmatch(name):
        raise RequestError(400, f"invalid {what} name {name!r}: use letters, digits, '_', '.' and '-' only")
    return name


def check_namespace(tenant: str, namespace: str) -> str:
    try:
        return validate_namespace(f"{tenant}/{namespace}")
    except BundleError as e:
        raise RequestError(400, str(e)) from None


def check_brokers(brokers: Iterable[str]) -> list[str]:
    """Broker ids as the registry names them (``host:port``), sorted and without duplicates."""
    out = set()
    for i, b in enumerate(brokers):
        if not b or len(b) > _BROKER_MAX or not _BROKER_RE.fullmatch(b):
            raise RequestError(
                400,
                f"brokers[{i}] {b[:_BROKER_MAX]!r} is not a broker id (1-{_BROKER_MAX} characters, "
                "no spaces or '/'; the id the broker registers with, usually host:port)",
            )
        out.add(b)
    return sorted(out)


def build_policy(name: str, doc: IsolationPolicyDoc) -> IsolationPolicy:
    """The placement core's policy for ``doc``: every regex compiled, the lists checked (400 if not)."""
    try:
        return IsolationPolicy.of(name, doc)
    except PlacementConfigError as e:
        raise RequestError(400, str(e)) from None


def unload_patterns(
    old: IsolationPolicyDoc | None, new: IsolationPolicyDoc | None, scope: UnloadScope
) -> set[str]:
    """The namespace regexes whose namespaces a policy change moves (Pulsar's ``unload_scope``).

    ``none``: nothing. ``all_matching``, or whenever the primary brokers changed (every namespace of the
    policy may now belong elsewhere): the old and the new namespace regexes. ``changed`` (the default):
    only the regexes added or removed -- the namespaces that joined or left the policy. Creating a policy
    compares against nothing and deleting one against nothing, so both move every namespace it matches.
    """
    if scope == "none":
        return set()
    before = set(old.namespaces) if old else set()
    after = set(new.namespaces) if new else set()
    primary_changed = (set(old.primary) if old else set()) != (set(new.primary) if new else set())
    if scope == "all_matching" or primary_changed:
        return before | after
    return before ^ after


def _compile_lenient(patterns: Iterable[str]) -> list[re.Pattern[str]]:
    """Compile what compiles: a stored regex that does not (written around the API) matches nothing."""
    out = []
    for p in sorted(patterns):
        try:
            out.append(re.compile(p))
        except re.error:
            continue
    return out


def owned_bundles_matching(
    items: Iterable[tuple[str, Record]], patterns: Iterable[str]
) -> dict[str, list[tuple[str, Record]]]:
    """Namespace -> its ``Owned`` bundles (with their records), for namespaces a regex full-matches."""
    compiled = _compile_lenient(patterns)
    if not compiled:
        return {}
    matches: dict[str, bool] = {}
    out: dict[str, list[tuple[str, Record]]] = {}
    for bundle, rec in items:
        if rec.state is not State.OWNED or rec.dst is None:
            continue
        ns = namespace_of(bundle)
        hit = matches.get(ns)
        if hit is None:
            hit = matches[ns] = any(p.fullmatch(ns) is not None for p in compiled)
        if hit:
            out.setdefault(ns, []).append((bundle, rec))
    return {ns: sorted(out[ns]) for ns in sorted(out)}


@dataclass(frozen=True)
class BrokerIsolation:
    """One live broker as the isolation policies see it."""

    broker: str
    primary_in: list[str]
    secondary_in: list[str]
    shared: bool


@dataclass(frozen=True)
class PolicyChange:
    """What setting or deleting an isolation policy did (or, dry run, would do)."""

    policy: str
    unload_scope: UnloadScope
    dry_run: bool
    previous: IsolationPolicyDoc | None
    current: IsolationPolicyDoc | None
    namespaces: list[str]
    unloaded: list[str]
    failed: dict[str, str] = field(default_factory=dict)


class PlacementAdmin:
    """The placement policies' admin operations; each refusal is a :class:`RequestError` saying why, or a
    :class:`~trimtab.errors.ZooKeeperError` from the store (the error handler gives it its status)."""

    def __init__(
        self,
        store: PlacementStore,
        leadership: Leadership,
        table: TableView,
        registry: BrokerRegistry,
        writes: ChannelWrites,
        journal: DecisionJournal,
        metrics: ControllerMetrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.leadership = leadership
        self.table = table
        self.registry = registry
        self.writes = writes
        self.journal = journal
        self.metrics = metrics
        self.clock = clock

    # ------------------------------------------------------------------ ZooKeeper, off the event loop
    # The store raises trimtab's ZooKeeper errors (cluster.zk's boundary), which every API answers the same
    # way (cluster.http_errors.refusal_of): unavailable or contended, a retryable 503; a znode it cannot
    # decode, a 500 naming it -- the store never overwrites what it cannot read.
    async def _read(self, kind: str, t: type[S]) -> S:
        doc, _ = await asyncio.to_thread(self.store.read, kind)
        return cast(S, doc)

    async def _update(self, kind: str, t: type[S], change: Callable[[S], S]) -> S:
        new = await asyncio.to_thread(self.store.update, kind, lambda d: change(cast(S, d)))
        return cast(S, new)

    def _count(self, op: str, result: str) -> None:
        self.metrics.admin.labels(op, result).inc()

    # ------------------------------------------------------------------ failure domains
    async def domains(self) -> dict[str, FailureDomain]:
        return dict(sorted((await self._read("domains", FailureDomains)).domains.items()))

    async def domain(self, name: str) -> FailureDomain:
        check_name("failure domain", name)
        got = (await self._read("domains", FailureDomains)).domains.get(name)
        if got is None:
            raise RequestError(404, f"no failure domain named {name!r}")
        return got

    async def set_domain(self, name: str, brokers: Iterable[str]) -> FailureDomain:
        """Create or replace a domain. A broker may be in one domain only (409 naming it and the domain)."""
        try:
            self.leadership.require_leader()
            check_name("failure domain", name)
            ids = check_brokers(brokers)
            dom = FailureDomain(brokers=ids)

            def change(doc: FailureDomains) -> FailureDomains:
                clashes = []
                for other, d in sorted(doc.domains.items()):
                    if other != name and (shared := sorted(set(d.brokers) & set(ids))):
                        clashes.append(f"{', '.join(shared)} already in failure domain {other!r}")
                if clashes:
                    raise RequestError(
                        409,
                        f"broker {'; '.join(clashes)}: a broker belongs to one failure domain only "
                        "(remove it there first)",
                    )
                return FailureDomains(domains=dict(sorted({**doc.domains, name: dom}.items())))

            await self._update("domains", FailureDomains, change)
        except TrimtabError:  # a refusal, or ZooKeeper's (answered by the error handler)
            self._count("failure_domain", "refused")
            raise
        self._count("failure_domain", "ok")
        self.journal.record("failure_domain_set", key=name, domain=name, brokers=ids)
        return dom

    async def delete_domain(self, name: str) -> FailureDomain:
        removed: list[FailureDomain] = []
        try:
            self.leadership.require_leader()
            check_name("failure domain", name)

            def change(doc: FailureDomains) -> FailureDomains:
                if name not in doc.domains:
                    raise RequestError(404, f"no failure domain named {name!r}")
                removed[:] = [doc.domains[name]]
                return FailureDomains(domains={k: v for k, v in doc.domains.items() if k != name})

            await self._update("domains", FailureDomains, change)
        except TrimtabError:  # a refusal, or ZooKeeper's (answered by the error handler)
            self._count("failure_domain", "refused")
            raise
        self._count("failure_domain", "ok")
        self.journal.record("failure_domain_deleted", key=name, domain=name, brokers=removed[0].brokers)
        return removed[0]

    # ------------------------------------------------------------------ anti-affinity groups
    async def anti_affinity(self, tenant: str, namespace: str) -> str | None:
        ns = check_namespace(tenant, namespace)
        return (await self._read("groups", AntiAffinityGroups)).groups.get(ns)

    async def set_anti_affinity(self, tenant: str, namespace: str, group: str | None) -> str | None:
        """Put ``namespace`` in ``group`` (case kept, compared case-insensitively); a blank group clears."""
        clear = group is None or not group.strip()
        ns = f"{tenant}/{namespace}"
        try:
            self.leadership.require_leader()
            ns = check_namespace(tenant, namespace)
            if not clear:
                check_name("anti-affinity group", cast(str, group))

            def change(doc: AntiAffinityGroups) -> AntiAffinityGroups:
                groups = {k: v for k, v in doc.groups.items() if k != ns}
                if not clear:
                    groups[ns] = cast(str, group)
                return AntiAffinityGroups(groups=dict(sorted(groups.items())))

            await self._update("groups", AntiAffinityGroups, change)
        except TrimtabError:  # a refusal, or ZooKeeper's (answered by the error handler)
            self._count("anti_affinity", "refused")
            raise
        self._count("anti_affinity", "ok")
        if clear:
            self.journal.record("anti_affinity_cleared", key=ns, namespace=ns)
            return None
        self.journal.record("anti_affinity_set", key=ns, namespace=ns, group=group)
        return group

    async def clear_anti_affinity(self, tenant: str, namespace: str) -> str:
        """Take ``namespace`` out of its group (404 if it has none); returns the group it was in."""
        ns = f"{tenant}/{namespace}"
        was: list[str] = []
        try:
            self.leadership.require_leader()
            ns = check_namespace(tenant, namespace)

            def change(doc: AntiAffinityGroups) -> AntiAffinityGroups:
                if ns not in doc.groups:
                    raise RequestError(404, f"namespace {ns} is in no anti-affinity group")
                was[:] = [doc.groups[ns]]
                return AntiAffinityGroups(groups={k: v for k, v in doc.groups.items() if k != ns})

            await self._update("groups", AntiAffinityGroups, change)
        except TrimtabError:  # a refusal, or ZooKeeper's (answered by the error handler)
            self._count("anti_affinity", "refused")
            raise
        self._count("anti_affinity", "ok")
        self.journal.record("anti_affinity_cleared", key=ns, namespace=ns, group=was[0])
        return was[0]

    async def group_members(self, group: str) -> list[str]:
        """The namespaces in ``group``, compared case-insensitively (as placement compares them)."""
        check_name("anti-affinity group", group)
        key = group_key(group)
        doc = await self._read("groups", AntiAffinityGroups)
        return sorted(ns for ns, g in doc.groups.items() if group_key(g) == key)

    # ------------------------------------------------------------------ isolation policies
    async def policies(self) -> dict[str, IsolationPolicyDoc]:
        return dict(sorted((await self._read("isolation", IsolationPolicies)).policies.items()))

    async def policy(self, name: str) -> IsolationPolicyDoc:
        check_name("isolation policy", name)
        got = (await self._read("isolation", IsolationPolicies)).policies.get(name)
        if got is None:
            raise RequestError(404, f"no isolation policy named {name!r}")
        return got

    async def set_policy(
        self, name: str, doc: IsolationPolicyDoc, scope: UnloadScope = "changed", *, dry_run: bool = False
    ) -> PolicyChange:
        """Create or replace a policy, then unload the bundles the change affects (see
        :func:`unload_patterns`). A dry run reads, decides and reports, and writes nothing."""
        return await self._change_policy(name, doc, scope, dry_run)

    async def delete_policy(
        self, name: str, scope: UnloadScope = "changed", *, dry_run: bool = False
    ) -> PolicyChange:
        """Delete a policy (404 if there is none); its namespaces are unloaded unless ``scope`` is none."""
        return await self._change_policy(name, None, scope, dry_run)

    async def _change_policy(
        self, name: str, new: IsolationPolicyDoc | None, scope: UnloadScope, dry_run: bool
    ) -> PolicyChange:
        old: list[IsolationPolicyDoc | None] = [None]
        try:
            if scope not in UNLOAD_SCOPES:
                raise RequestError(
                    400, f"unload_scope must be one of {', '.join(UNLOAD_SCOPES)}, not {scope!r}"
                )
            if not dry_run:
                self.leadership.require_leader()
            check_name("isolation policy", name)
            if name in RESERVED_POLICY_NAMES:
                raise RequestError(
                    400, f"{name!r} is reserved (GET /v1/isolation-policies/{name} is the broker view)"
                )
            if new is not None:
                build_policy(name, new)

            def change(doc: IsolationPolicies) -> IsolationPolicies:
                old[0] = doc.policies.get(name)
                if new is None and old[0] is None:
                    raise RequestError(404, f"no isolation policy named {name!r}")
                policies = {k: v for k, v in doc.policies.items() if k != name}
                if new is not None:
                    policies[name] = new
                return IsolationPolicies(policies=dict(sorted(policies.items())))

            if dry_run:
                change(await self._read("isolation", IsolationPolicies))
            else:
                await self._update("isolation", IsolationPolicies, change)
        except TrimtabError:  # a refusal, or ZooKeeper's (answered by the error handler)
            self._count("isolation_policy", "refused")
            raise

        affected = owned_bundles_matching(self.table.items(), unload_patterns(old[0], new, scope))
        result = PolicyChange(
            policy=name,
            unload_scope=scope,
            dry_run=dry_run,
            previous=old[0],
            current=new,
            namespaces=list(affected),
            unloaded=[b for bundles in affected.values() for b, _ in bundles],
        )
        if dry_run:
            self._count("isolation_policy", "dry_run")
            return result

        unloaded, failed = await self._unload([rb for bundles in affected.values() for rb in bundles])
        self._count("isolation_policy", "ok")
        self.journal.record(
            "isolation_policy_set" if new is not None else "isolation_policy_deleted",
            key=name,
            policy=name,
            unload_scope=scope,
            namespaces=result.namespaces[:_JOURNAL_BUNDLES],
            unloaded=len(unloaded),
            bundles=unloaded[:_JOURNAL_BUNDLES],
            failed=len(failed),
        )
        return PolicyChange(
            policy=name,
            unload_scope=scope,
            dry_run=False,
            previous=old[0],
            current=new,
            namespaces=result.namespaces,
            unloaded=unloaded,
            failed=failed,
        )

    async def _unload(self, bundles: list[tuple[str, Record]]) -> tuple[list[str], dict[str, str]]:
        """Unload each bundle still owned as it was when chosen (:meth:`ChannelWrites.unload_owned`, the
        one bulk unload); a bundle that moved meanwhile is left alone (it is being placed already)."""
        if not bundles:
            return [], {}
        self.leadership.require_leader()  # the policy is stored; the moves are the leader's alone
        return await self.writes.unload_owned(
            bundles, writer=self.leadership.writer(), now_ms=int(self.clock() * 1000)
        )

    async def broker_isolation(self) -> list[BrokerIsolation]:
        """Every live broker: the policies it is primary in, secondary in, and whether it is shared."""
        doc = await self._read("isolation", IsolationPolicies)
        built = []
        for name, p in sorted(doc.policies.items()):
            try:
                built.append(build_policy(name, p))
            except RequestError as e:  # stored around the API: the znode, not the request, is wrong
                path = self.store.paths["isolation"]
                raise RequestError(
                    500, f"{path}: {e}; repair the policy (PUT it again) or delete it"
                ) from None
        out = []
        for b in sorted(self.registry.brokers):
            primary = [p.name for p in built if p.is_primary(b)]
            secondary = [p.name for p in built if not p.is_primary(b) and p.is_secondary(b)]
            out.append(
                BrokerIsolation(broker=b, primary_in=primary, secondary_in=secondary, shared=not primary)
            )
        return out

    async def broker(self, broker: str) -> BrokerIsolation:
        if broker not in self.registry.brokers:
            raise RequestError(404, f"{broker} is not a live broker")
        for view in await self.broker_isolation():
            if view.broker == broker:
                return view
        raise RequestError(404, f"{broker} is not a live broker")  # left while we read ZooKeeper
