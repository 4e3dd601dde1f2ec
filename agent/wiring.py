"""Builds the agent from its settings: the one place where its parts meet.

settings -> (HTTP socket, bound first: the broker id defaults to host:port) -> identity -> broker adapter
-> ZooKeeper session, broker registry, namespace store -> transport -> channel client, broker-load view,
events -> reconciler, lookups, load reporter, split scheduler, drainer -> HTTP app -> :class:`Agent`.

Nothing here connects anywhere: the daemon's lifecycle (:meth:`agent.daemon.Agent.run`) starts the parts
in the order that correctness needs. :func:`check` tells, before anything is bound or built, whether the
settings can run an agent at all; ``trimtab agent`` runs :class:`AgentProcess`.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from trimtab.agent.adapters import build_adapter, require_adapter_kind
from trimtab.agent.adapters.base import BrokerAdapter, RetryingAdapter
from trimtab.agent.adapters.simulated import SimulatedBroker
from trimtab.agent.api import AgentApi, SimControls, create_app
from trimtab.agent.daemon import Agent
from trimtab.agent.drain import Drainer
from trimtab.agent.identity import BrokerIdentity
from trimtab.agent.leases import LeaseGuard, LeaseRenewer
from trimtab.agent.lookup import IndexedAssignment, LayoutCache, LookupService, NamespaceLoader
from trimtab.agent.lookup_http import PATH as LOOKUP_PATH
from trimtab.agent.lookup_http import FastLookup
from trimtab.agent.merges import MergeScheduler
from trimtab.agent.metrics import AgentMetrics
from trimtab.agent.ownjobs import OwnerJobs
from trimtab.agent.prewarm import Prewarmer
from trimtab.agent.ratelimit import ClientRateLimiter
from trimtab.agent.reconciler import Reconciler
from trimtab.agent.reporter import HostSampler, LoadReporter
from trimtab.agent.splits import SplitScheduler
from trimtab.balance.assign import DEFAULT_FILTERS, AssignContext
from trimtab.balance.namespaces import AutoCreatePolicy
from trimtab.channel.bundles import BundleLayout
from trimtab.channel.client import ChannelClient
from trimtab.channel.records import Record
from trimtab.channel.table import TableView
from trimtab.channel.transport import Transport
from trimtab.cluster.auth import Authenticator
from trimtab.cluster.bridge import LoopBridge
from trimtab.cluster.http import HttpServer, bind
from trimtab.cluster.http_guard import Refusals
from trimtab.cluster.logs import bind as bind_log
from trimtab.cluster.metrics import new_registry
from trimtab.cluster.placement.standbys import prefer_standbys
from trimtab.cluster.replica import Replica
from trimtab.cluster.wiring import check_security
from trimtab.cluster.zk import BrokerRegistry, NamespaceStore, ZkSession
from trimtab.config.settings import Settings


def check(settings: Settings) -> None:
    """Raise :class:`trimtab.errors.ConfigError` if these settings cannot run an agent (before binding or
    connecting anything): an unset ``broker.adapter.kind``, or security settings that cannot be used
    (:func:`trimtab.cluster.wiring.check_security`)."""
    require_adapter_kind(settings)
    check_security(settings)


@dataclass(frozen=True)
class WiredAgent:
    """The agent and the parts it was built from (for the process, in-process tests and tools)."""

    agent: Agent
    http: HttpServer
    app: FastAPI
    identity: BrokerIdentity
    adapter: BrokerAdapter  # the retrying wrapper around the broker's adapter
    sim: SimulatedBroker | None  # the simulated broker, when that is the adapter
    channel: ChannelClient
    registry: BrokerRegistry
    reconciler: Reconciler
    lookups: LookupService
    reporter: LoadReporter
    splits: SplitScheduler
    drainer: Drainer
    metrics: AgentMetrics
    prom: CollectorRegistry

    async def run(self) -> int:
        return await self.agent.run(self.http)


def build(
    settings: Settings,
    *,
    sock: socket.socket | None = None,
    transport: Transport | None = None,
    adapter: BrokerAdapter | None = None,
    prom: CollectorRegistry | None = None,
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.time,
) -> WiredAgent:
    """Build an agent on the running event loop. Overrides are for tests and tools: ``sock`` an already
    bound HTTP socket, ``transport`` instead of Kafka, ``adapter`` instead of ``broker.adapter``."""
    s = settings
    loop = asyncio.get_running_loop()
    if adapter is None:
        check(s)
    sock = sock if sock is not None else bind(s.http.host, s.http.port)
    identity = BrokerIdentity.from_settings(s, int(sock.getsockname()[1]), started_at=clock())
    me = identity.id
    bind_log(broker=me, role="agent")
    prom = prom if prom is not None else new_registry()
    metrics = AgentMetrics.create(prom)
    auth = Authenticator.for_daemon(s.security, prom)
    rng = rng if rng is not None else random.Random()

    inner = adapter if adapter is not None else build_adapter(s, me)[0]
    sim = inner if isinstance(inner, SimulatedBroker) else None
    a = s.broker.adapter
    retrying = RetryingAdapter(
        inner,
        timeout_s=a.timeout_s,
        retries=a.retries,
        backoff_s=a.backoff_s,
        observe=metrics.observe_adapter,
    )

    def on_channel_ready(table: TableView) -> None:
        # On the follower thread, once the channel is caught up -- never before Agent.run started it, by
        # which time the reconciler and the lookups below exist.
        loop.call_soon_threadsafe(_channel_caught_up, reconciler, lookups, table)

    replica = Replica.build(
        s, me=me, role="agent", prom=prom, transport=transport, on_channel_ready=on_channel_ready
    )
    zk, registry, channel, loads, events = (
        replica.zk,
        replica.registry,
        replica.channel,
        replica.loads,
        replica.events,
    )
    transport = replica.transport
    namespaces = NamespaceStore(zk.client, replica.paths, s.namespace.default_bundles)
    # Among the brokers the rules allow, a bundle's warm standbys first (drain, and lookups of a bundle
    # freed by a failure): they take it over fastest.
    place = prefer_standbys(replica.standby_index.of, replica.placement.restrict)

    def assign_context(exclude: frozenset[str]) -> AssignContext:
        return AssignContext.from_settings(s, loads.snapshot(), int(clock() * 1000), exclude)

    def url_of(broker: str) -> str | None:
        info = registry.brokers.get(broker)
        return info.service_url if info is not None else None

    indexed = IndexedAssignment(
        s,
        loads.values,
        lambda: registry.brokers,
        # prefer_standbys narrows to a bundle's warm standbys: the index covers bundles that have none
        open_to_all=lambda bundle: (
            not replica.standby_index.of(bundle) and replica.placement.open_to_all(bundle)
        ),
        clock=clock,
    )
    loads.add_listener(indexed.changed)

    reporter = LoadReporter(
        me,
        retrying,
        transport,
        s,
        metrics,
        host=HostSampler(s),
        has_policies=replica.placement.has_policies,
        clock=clock,
    )
    leases, reconciler, renewer = _reconciliation(
        s, me, zk, channel, retrying, reporter, namespaces, url_of, metrics, clock
    )
    drainer = Drainer(
        identity,
        channel,
        reconciler,
        registry,
        assign_context=assign_context,
        placement=place,
        rng=rng,
        metrics=metrics,
        timeout_s=s.agent.drain_timeout_s,
        diff=s.assignment.average_usage_diff_threshold_pct / 100,
        clock=clock,
    )
    layouts = _layouts(s, namespaces)
    lookups = LookupService(
        me,
        channel,
        layouts,
        brokers=lambda: registry.brokers,
        brokers_trusted=lambda: zk.connected and registry.synced.is_set(),
        filters=DEFAULT_FILTERS,
        placement=place,
        timeout_s=s.channel.in_flight_timeout_s,
        assign_context=assign_context,
        diff=s.assignment.average_usage_diff_threshold_pct / 100,
        rng=rng,
        events=events,
        metrics=metrics,
        draining=lambda: drainer.draining,
        clock=clock,
        indexed=indexed,
    )
    own = OwnerJobs(
        me, channel, reporter, retrying, events, metrics, paused=lambda: drainer.draining, clock=clock
    )
    splits = SplitScheduler.from_settings(s, own, layouts=layouts)

    async def merge_layout(namespace: str) -> BundleLayout | None:
        got = await asyncio.to_thread(namespaces.read, namespace)
        return got[0].layout(namespace) if got is not None else None

    merges = MergeScheduler.from_settings(s, own, layouts=merge_layout)

    _route_events(loop, channel, layouts, reconciler, lookups, registry, zk, metrics)
    prewarmer = Prewarmer(me, retrying, replica.standby_index, drainer.owned, metrics)
    standby_wakeups: LoopBridge[None] = LoopBridge(loop, lambda _: prewarmer.changed())
    replica.standby_view.add_listener(lambda bundle, value: standby_wakeups.push(None))
    agent = Agent(
        identity,
        replica,
        adapter=retrying,
        prewarmer=prewarmer,
        reconciler=reconciler,
        reporter=reporter,
        splitter=splits,
        merger=merges,
        drainer=drainer,
        leases=leases,
        renewer=renewer,
        metrics=metrics,
        register_wait_s=s.zookeeper.session_timeout_s * 2 + 5,
    )
    api = AgentApi(
        node=agent,
        channel=channel,
        lookups=lookups,
        splits=splits,
        registry=registry,
        loads=loads,
        metrics=metrics,
        prom=prom,
        limiter=ClientRateLimiter(
            s.agent.lookup_rate_per_client,
            s.agent.lookup_burst_per_client,
            s.agent.lookup_rate_max_clients,
            monotonic=time.monotonic,
        ),
    )
    app = create_app(api, SimControls(sim, reporter.poke) if sim is not None else None, auth=auth)
    return WiredAgent(
        agent=agent,
        http=HttpServer(
            app,
            sock,
            s.http,
            refusals=Refusals.in_registry(prom),
            fast={("GET", LOOKUP_PATH): FastLookup(api)},
        ),
        app=app,
        identity=identity,
        adapter=retrying,
        sim=sim,
        channel=channel,
        registry=registry,
        reconciler=reconciler,
        lookups=lookups,
        reporter=reporter,
        splits=splits,
        drainer=drainer,
        metrics=metrics,
        prom=prom,
    )


def _layouts(s: Settings, namespaces: NamespaceStore) -> LayoutCache:
    """The lookups' namespace layouts: created only where ``namespace.auto_create`` allows (none by
    default, docs/security.md), and dropped as soon as ZooKeeper reports a namespace deleted -- so that an
    agent does not assign the bundles an operator's delete just unloaded (controller/namespace_admin.py)."""
    layouts = LayoutCache(
        NamespaceLoader(namespaces.load, AutoCreatePolicy.of(s.namespace.auto_create)), s.agent.lookup_cache_s
    )
    namespaces.on_deleted(layouts.invalidate)
    return layouts


def _reconciliation(
    s: Settings,
    me: str,
    zk: ZkSession,
    channel: ChannelClient,
    retrying: BrokerAdapter,
    reporter: LoadReporter,
    namespaces: NamespaceStore,
    url_of: Callable[[str], str | None],
    metrics: AgentMetrics,
    clock: Callable[[], float],
) -> tuple[LeaseGuard, Reconciler, LeaseRenewer]:
    """The reconciler and the broker leases it acquires under and renews (agent.leases)."""
    a = s.broker.adapter
    leases = LeaseGuard(zk, lease_s=s.lease_s(), margin_s=a.lease_margin_s, metrics=metrics, wall=clock)
    channel.table.add_listener(leases.in_flight.on_change)  # when this agent saw each in-flight record
    reconciler = Reconciler(
        me,
        channel,
        retrying,
        url_of=url_of,
        apply_split=namespaces.apply_split,
        apply_merge=namespaces.apply_merge,
        metrics=metrics,
        on_served_change=lambda bundle, serving: reporter.load_moved(),
        leases=leases,
        in_flight_timeout_s=s.channel.in_flight_timeout_s,
        clock=clock,
    )
    renewer = LeaseRenewer(
        me,
        leases,
        retrying,
        served=lambda: [*reconciler.served, *reconciler.acquiring],
        record=channel.table.get,
        is_stale=reconciler.stale.__contains__,
        lost=reconciler.lost,
        metrics=metrics,
        in_flight_timeout_s=s.channel.in_flight_timeout_s,
    )
    return leases, reconciler, renewer


def _channel_caught_up(reconciler: Reconciler, lookups: LookupService, table: TableView) -> None:
    """The table caught up (at start, or again after a re-bootstrap): on the loop."""
    reconciler.rescan(table)
    lookups.wake_all()  # waiters re-read the table they may have missed changes of


def _route_events(
    loop: asyncio.AbstractEventLoop,
    channel: ChannelClient,
    layouts: LayoutCache,
    reconciler: Reconciler,
    lookups: LookupService,
    registry: BrokerRegistry,
    zk: ZkSession,
    metrics: AgentMetrics,
) -> None:
    """Channel changes go to the lookups and the reconciler, on the loop in log order (the follower
    thread hands them over in bursts); broker membership changes wake waiting lookups."""

    def on_change(key: str, old: Record | None, new: Record | None, predates: bool) -> None:
        lookups.on_change(key)
        reconciler.on_change(key, old, new, predates)

    changes: LoopBridge[tuple[str, Record | None, Record | None, bool]] = LoopBridge(
        loop, lambda c: on_change(*c)
    )
    # Whether a record predates this broker's registration is known exactly only here, as it is applied.
    barrier, table = reconciler.barrier, channel.table
    table.add_listener(lambda key, old, new: changes.push((key, old, new, barrier.predates(table, key))))
    # On the follower thread, before anyone can see a split parent Deleted: its namespace's cached layout
    # is stale from here on.
    channel.table.add_listener(layouts.on_channel_change)
    registry.add_listener(lambda brokers: loop.call_soon_threadsafe(lookups.wake_all))
    zk.add_listener(lambda state: metrics.zk_connected.set(1 if state == "connected" else 0))


class AgentProcess:
    """What ``trimtab agent`` runs: build on the event loop, then the daemon's lifecycle."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def run(self) -> int:
        return await build(self.settings).run()
