"""Operators' namespaces: list, create and delete them (docs/security.md, "Namespaces and lookup limits").

A namespace is a znode under ``admin/namespaces`` holding its bundle layout. Lookups create one only where
``namespace.auto_create`` allows (nothing by default, as in Pulsar); otherwise an operator creates it here.
Listing reads ZooKeeper (any controller); creating and deleting are the leader's (a follower answers 307).
Each refusal is a :class:`RequestError` saying why (or the store's ZooKeeper error, which the error
handler answers), each change a decision in the journal, each call counted in
``trimtab_admin_requests_total{op="namespace_create"|"namespace_delete"}``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trimtab.balance.namespaces import bundles_of, check_part, owned_per_namespace
from trimtab.channel.bundles import BundleLayout
from trimtab.channel.table import TableView
from trimtab.cluster.zk import NamespaceStore
from trimtab.controller.journal import DecisionJournal
from trimtab.controller.leadership import Leadership
from trimtab.controller.metrics import ControllerMetrics
from trimtab.controller.writes import ChannelWrites
from trimtab.errors import BundleError, NamespaceNotFound, RequestError, TrimtabError, ZooKeeperError

_JOURNAL_BUNDLES = 100  # bundles listed in one journal entry (the counts are always exact)


@dataclass(frozen=True)
class NamespaceInfo:
    """One namespace as listed: its bundle count (None: its znode does not decode) and how many of its
    bundles the channel says are owned."""

    namespace: str
    bundles: int | None
    owned: int


@dataclass(frozen=True)
class NamespaceCreated:
    """A namespace created (or, dry run, that would be): its bundles."""

    namespace: str
    bundles: list[str]
    dry_run: bool


@dataclass(frozen=True)
class NamespaceDeleted:
    """What deleting a namespace did (or, dry run, would do)."""

    namespace: str
    dry_run: bool
    existed: bool  # it had a znode (a second delete finds none, and only cleans up the channel)
    unloaded: list[str]  # bundles unloaded (dry run: that would be)
    in_flight: dict[str, str]  # bundle -> state: not unloadable now; delete again once they settle
    failed: dict[str, str] = field(default_factory=dict)  # bundle -> why its unload was not published


class NamespaceAdmin:
    """List, create and delete namespaces."""

    def __init__(
        self,
        store: NamespaceStore,
        leadership: Leadership,
        table: TableView,
        writes: ChannelWrites,
        journal: DecisionJournal,
        metrics: ControllerMetrics,
        *,
        default_bundles: int,
        max_bundles: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``default_bundles`` (``namespace.default_bundles``): a creation's bundles unless it says;
        ``max_bundles`` (``split.max_bundles_per_namespace``): the most it may ask for."""
        self.store = store
        self.leadership = leadership
        self.table = table
        self.writes = writes
        self.journal = journal
        self.metrics = metrics
        self.default_bundles = default_bundles
        self.max_bundles = max_bundles
        self.clock = clock

    # ZooKeeper is called off the event loop (asyncio.to_thread); the store raises trimtab's ZooKeeper errors
    # (cluster.zk's boundary), which every API answers the same way (cluster.http_errors.refusal_of).

    @staticmethod
    def _name(tenant: str, namespace: str) -> str:
        """``tenant/namespace``, both parts checked (400 saying what is wrong) before ZooKeeper is asked."""
        try:
            return f"{check_part('tenant', tenant)}/{check_part('namespace', namespace)}"
        except BundleError as e:
            raise RequestError(400, str(e)) from None

    def _count(self, op: str, result: str) -> None:
        self.metrics.admin.labels(op, result).inc()

    # ------------------------------------------------------------------ list
    async def namespaces(self) -> list[NamespaceInfo]:
        """Every namespace with a znode, sorted, with its bundle count and owned bundles."""

        def read_all() -> list[tuple[str, int | None]]:
            out: list[tuple[str, int | None]] = []
            for ns in self.store.names():
                try:
                    got = self.store.read(ns)
                except ZooKeeperError:
                    out.append((ns, None))  # listed all the same: an operator should see it
                    continue
                if got is not None:  # (deleted while we listed)
                    out.append((ns, len(got[0].boundaries) - 1))
            return out

        names = await asyncio.to_thread(read_all)
        owned = owned_per_namespace(self.table.items())
        return [NamespaceInfo(ns, n, owned.get(ns, 0)) for ns, n in names]

    # ------------------------------------------------------------------ create
    async def create(
        self, tenant: str, namespace: str, bundles: int | None = None, *, dry_run: bool = False
    ) -> NamespaceCreated:
        """Create ``tenant/namespace`` with ``bundles`` equal bundles (``namespace.default_bundles`` if
        None; at most ``split.max_bundles_per_namespace``): 409 if it exists. Its bundles are assigned by
        the first lookups of its topics, as any unowned bundle."""
        ns = f"{tenant}/{namespace}"
        try:
            if not dry_run:
                self.leadership.require_leader()
            ns = self._name(tenant, namespace)
            n = self.default_bundles if bundles is None else bundles
            if bundles is not None and not 1 <= bundles <= self.max_bundles:
                raise RequestError(
                    400,
                    f"bundles must be between 1 and {self.max_bundles} (split.max_bundles_per_namespace), "
                    f"not {bundles}",
                )
            if dry_run:
                created = not await asyncio.to_thread(self.store.exists, ns)
            else:
                created = await asyncio.to_thread(self.store.create, ns, n)
            if not created:
                raise RequestError(409, f"namespace {ns} exists already")
        except TrimtabError:  # a refusal, or ZooKeeper's (answered by the error handler)
            self._count("namespace_create", "refused")
            raise
        names = BundleLayout.default(ns, n).bundles
        if dry_run:
            self._count("namespace_create", "dry_run")
        else:
            self._count("namespace_create", "ok")
            self.journal.record("namespace_created", key=ns, namespace=ns, bundles=n)
        return NamespaceCreated(ns, names, dry_run)

    # ------------------------------------------------------------------ delete
    async def delete(self, tenant: str, namespace: str, *, dry_run: bool = False) -> NamespaceDeleted:
        """Delete ``tenant/namespace``: its znode, then every bundle the channel says it owns is unloaded.

        The order is what keeps a lookup from taking the namespace back while it is deleted:

        1. **The znode goes first.** From then on no agent can load the layout: a lookup of one of its topics
           answers 404 (unless ``namespace.auto_create`` allows the namespace: then the lookup creates it
           again, as it would any new one -- take it out of the allow-list first); agents that cached the
           layout drop it when ZooKeeper's watch reports the deletion (agent.lookup.LayoutCache); a split
           under way can no longer rewrite the layout and fails instead of re-creating it. Unloading first
           would be undone at once: until their cached layout expired, agents would assign each bundle
           again on the next lookup of one of its topics.
        2. **Then every Owned bundle is unloaded**, with the admin unload
           (:meth:`ChannelWrites.unload_owned`, ``Releasing`` with no destination): each owner fences it and
           frees it, and the next lookup of one of its topics finds no layout.
        3. **What was in flight is reported, not unloaded** (an unload needs an ``Owned`` record): an
           assignment that raced the deletion (a lookup that had read the layout before step 1, or an agent
           cut off from ZooKeeper, which keeps its cached layout until it reconnects), a transfer, a split.
           Deleting is idempotent for this: while the channel still gives a bundle of a namespace without a
           znode to a broker, a delete unloads what is owned again (404 only when neither the znode nor such
           a bundle is left), so running it again once they settled finishes the job.

        A dry run (any controller) checks the same and says what would be unloaded and what is in flight.
        Policies kept elsewhere (an anti-affinity group, an isolation policy naming it) are not touched."""
        ns = f"{tenant}/{namespace}"
        try:
            if not dry_run:
                self.leadership.require_leader()
            ns = self._name(tenant, namespace)
            # exists, not read: a znode that does not decode can be deleted too (and should be).
            existed = await asyncio.to_thread(self.store.exists, ns)
            if not existed and not bundles_of(self.table.items(), ns).live:
                raise NamespaceNotFound(
                    ns, f"namespace {ns} does not exist (and the channel gives none of its bundles a broker)"
                )
            if not dry_run and existed:
                await asyncio.to_thread(self.store.delete, ns)  # step 1
        except TrimtabError:  # a refusal, or ZooKeeper's (answered by the error handler)
            self._count("namespace_delete", "refused")
            raise
        found = bundles_of(self.table.items(), ns)  # after step 1: whatever a lookup assigned before it
        if dry_run:
            self._count("namespace_delete", "dry_run")
            return NamespaceDeleted(ns, True, existed, [b for b, _ in found.owned], found.in_flight)
        # Step 2 is the leader's alone too. Deposed meanwhile: the 307 sends the delete on to the new leader,
        # which finds no znode and unloads what is owned (a repeated delete, above).
        self.leadership.require_leader()
        unloaded, failed = await self.writes.unload_owned(
            found.owned, writer=self.leadership.writer(), now_ms=int(self.clock() * 1000)
        )
        self._count("namespace_delete", "ok")
        self.journal.record(
            "namespace_deleted",
            key=ns,
            namespace=ns,
            existed=existed,
            unloaded=len(unloaded),
            bundles=unloaded[:_JOURNAL_BUNDLES],
            in_flight=len(found.in_flight),
            failed=len(failed),
        )
        return NamespaceDeleted(ns, False, existed, unloaded, found.in_flight, failed)
