"""Builds a controller from settings: every collaborator once, each passed to what uses it. The daemon
(:mod:`trimtab.controller.daemon`) and the HTTP API (:mod:`trimtab.controller.api`) know nothing of each
other; this module is the one place that knows both."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from trimtab.balance.heal import HealConfig
from trimtab.balance.placement import StandbySpec
from trimtab.balance.shed import ShedConfig
from trimtab.channel.snapshot import SnapshotWriter
from trimtab.channel.transport import Transport
from trimtab.cluster.auth import Authenticator
from trimtab.cluster.http import HttpServer, PeerHttp, bind
from trimtab.cluster.http_guard import Refusals
from trimtab.cluster.liveness import Liveness
from trimtab.cluster.logs import bind as bind_log
from trimtab.cluster.metrics import new_registry
from trimtab.cluster.placement.store import PlacementStore
from trimtab.cluster.replica import Replica
from trimtab.cluster.wiring import check_security
from trimtab.cluster.zk import NamespaceStore
from trimtab.config.settings import Settings
from trimtab.controller.admin import Admin, plan_drain
from trimtab.controller.api import ControllerApi, create_app
from trimtab.controller.daemon import Controller
from trimtab.controller.election import LeaderElection
from trimtab.controller.healing import Healer, HealingJob
from trimtab.controller.journal import DecisionJournal
from trimtab.controller.leadership import Leadership
from trimtab.controller.live_settings import LiveSettings
from trimtab.controller.maintenance_store import ZkMaintenance
from trimtab.controller.metrics import ControllerMetrics
from trimtab.controller.monitor import MonitorJob
from trimtab.controller.namespace_admin import NamespaceAdmin
from trimtab.controller.operation_store import ZkOperations
from trimtab.controller.operations import OperationsJob
from trimtab.controller.placement.admin import PlacementAdmin
from trimtab.controller.placement.destinations import Destinations
from trimtab.controller.placement.standbys import StandbyJob
from trimtab.controller.shedding import SheddingJob
from trimtab.controller.snapshots import SnapshotJob
from trimtab.controller.status import StatusReport
from trimtab.controller.stores import FailedBrokers, Reassignments, Switches
from trimtab.controller.writes import ChannelWrites


def check(s: Settings) -> None:
    """Raise :class:`trimtab.errors.ConfigError` if these settings cannot run a controller (before binding
    or connecting anything): security settings that cannot be used
    (:func:`trimtab.cluster.wiring.check_security`)."""
    check_security(s)


def build_controller(
    s: Settings,
    *,
    transport: Transport | None = None,
    prom: CollectorRegistry | None = None,
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.time,
) -> Controller:
    """The controller for ``s``: binds its HTTP port (so a port of 0 becomes real and names the
    controller), creates the clients, the jobs and the API. Nothing connects until ``run()``."""
    check(s)
    sock = bind(s.http.host, s.http.port)
    port = int(sock.getsockname()[1])
    http_url = s.http_url(port)  # https:// when the controller serves TLS
    me = s.controller.id or f"{s.advertised_host()}:{port}"
    bind_log(controller=me, role="controller")
    prom = prom or new_registry()
    metrics = ControllerMetrics.create(prom)
    auth = Authenticator.for_daemon(s.security, prom)

    replica = Replica.build(s, me=me, role="controller", prom=prom, transport=transport, top_bundles=True)
    paths, zk, registry, channel, loads = (
        replica.paths,
        replica.zk,
        replica.registry,
        replica.channel,
        replica.loads,
    )
    top, placement, standby_index, events = (
        replica.top,
        replica.placement,
        replica.standby_index,
        replica.events,
    )
    assert top is not None
    transport = replica.transport
    k = s.kafka
    election = LeaderElection(zk, paths, me, http_url)
    leadership = Leadership(election, zk, registry, channel, me=me, settle_s=s.healing.safe_mode_settle_s)
    writes = ChannelWrites(channel, leadership, metrics)
    journal = DecisionJournal(events, clock=clock)
    destinations = Destinations(
        s, registry, loads, placement, standby_index, rng=rng or random.Random(), clock=clock
    )
    heal_cfg = HealConfig.from_settings(s)
    healer = Healer(
        FailedBrokers(zk.client, paths),
        Reassignments(zk.client, paths, clock=clock),
        heal_cfg,
        chunk_size=s.healing.chunk_size,
        writer=leadership.writer,
        term=leadership.term,
        clock=clock,
    )
    snapshots = SnapshotJob(
        channel,
        SnapshotWriter(
            transport,
            k.snapshot_topic,
            k.channel_topic,
            writer=me,
            chunk_bundles=s.channel.snapshot_chunk_bundles,
        ),
        leadership,
        metrics,
        transport=transport,
        topic=k.snapshot_topic,
    )
    table = channel.table
    monitor = MonitorJob(table, leadership, destinations, writes, journal, metrics, heal_cfg, clock=clock)
    maintenance = ZkMaintenance(zk.client, paths)
    p = s.placement
    standbys = StandbyJob(
        placement,
        standby_index,
        transport,
        k.standby_topic,
        leadership,
        metrics,
        StandbySpec(
            p.standby_replicas,
            tuple(p.awareness_tags),
            {key: frozenset(values) for key, values in p.forced_awareness.items()},
        ),
        view_ready=lambda: replica.standby_view.ready,
    )
    placement.add_owner_listener(standbys.owner_changed)  # under the placement index's lock
    switch_store = Switches(zk.client, paths)
    live = LiveSettings(s, zk.client, paths, clock=clock)
    operations = OperationsJob(
        live.operations,
        ZkOperations(zk.client, paths),
        table,
        leadership,
        writes,
        journal,
        metrics,
        clock=clock,
        planner=lambda broker, bundles: plan_drain(destinations, broker, bundles),
        usable=lambda broker: (i := registry.brokers.get(broker)) is not None and not i.draining,
        heal_plans=healer.heal_plans,
        registered=lambda broker: broker in registry.brokers,
    )
    healing = HealingJob(
        healer,
        table,
        leadership,
        destinations,
        loads,
        writes,
        journal,
        metrics,
        clock=clock,
        in_maintenance=lambda: list(maintenance.read()),
        held=operations.held_heals,
        config=live.heal_config,
    )
    shedding = SheddingJob(
        s.shedding,
        table,
        leadership,
        destinations,
        loads,
        top,
        journal,
        metrics,
        ShedConfig.from_settings(s),
        clock=clock,
        operations=operations,
    )
    admin = Admin(
        table,
        leadership,
        registry,
        writes,
        journal,
        metrics,
        switch_store,
        shedding,
        placement,
        clock=clock,
        peers=PeerHttp.from_settings(s.http, auth.own_token),
        operations=operations,
        destinations=destinations,
        maintenance=maintenance,
        operation_settings=live.operations,
    )
    liveness = Liveness()
    status = StatusReport(
        leadership,
        channel,
        registry,
        loads,
        shedding,
        healer,
        journal,
        s.shedding,
        operations,
        placement,
        clock=clock,
    )
    placement_admin = PlacementAdmin(
        PlacementStore(zk.client, paths), leadership, table, registry, writes, journal, metrics, clock=clock
    )
    namespace_admin = NamespaceAdmin(
        NamespaceStore(zk.client, paths, s.namespace.default_bundles),
        leadership,
        table,
        writes,
        journal,
        metrics,
        default_bundles=s.namespace.default_bundles,
        max_bundles=s.split.max_bundles_per_namespace,
        clock=clock,
    )
    api = ControllerApi(
        leadership,
        channel,
        registry,
        loads,
        admin,
        healer,
        status,
        liveness,
        prom,
        placement_admin,
        namespace_admin,
        operations,
        live,
    )
    return Controller(
        s,
        replica,
        leadership=leadership,
        http=HttpServer(create_app(api, auth=auth), sock, s.http, refusals=Refusals.in_registry(prom)),
        snapshots=snapshots,
        monitor=monitor,
        healing=healing,
        shedding=shedding,
        standbys=standbys,
        operations=operations,
        live=live,
        switch_store=switch_store,
        metrics=metrics,
        liveness=liveness,
    )


class ControllerProcess:
    """What ``trimtab controller`` runs: the controller built and run inside one event loop."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def run(self) -> int:
        return await build_controller(self.settings).run()
