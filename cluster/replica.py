"""What every trimtab daemon keeps a live copy of, built, started and stopped in one place.

An agent and a controller both follow the cluster: a ZooKeeper session and the broker registry on it, the
placement policies (ZooKeeper) and the ownership they constrain (the channel), the channel replica, the
brokers' load reports and the leader's warm-standby sets (Kafka views), and an events publisher. A
controller also follows the top-bundles reports. :class:`Replica` builds those parts once, wires them to
each other (the placement view hears the registry and the channel; the standby index hears its view), and
starts them in the order correctness needs: the session first, then what reads ZooKeeper, then the topic
check (a node that cannot rely on its topics stops there, naming them), then the Kafka readers -- and
:meth:`caught_up` says when the node may serve. The daemons add their own jobs around it.

Why one builder: the agent's and the controller's wiring repeated these ~20 steps in two shapes, and their
start-up and shutdown orders had begun to drift apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from prometheus_client import CollectorRegistry

from trimtab.balance.load import BrokerLoadData, TopBundles
from trimtab.channel.client import ChannelClient
from trimtab.channel.table import TableView
from trimtab.channel.transport import Transport
from trimtab.cluster.events import EventPublisher
from trimtab.cluster.kvview import KeyValueView
from trimtab.cluster.logs import SkipLog
from trimtab.cluster.memory import release_free_memory
from trimtab.cluster.metrics import ChannelCollector, KeyValueCollector
from trimtab.cluster.placement.standbys import StandbyIndex, StandbySet
from trimtab.cluster.placement.store import PlacementWatch
from trimtab.cluster.placement.view import LivePlacement
from trimtab.cluster.wiring import kafka_clients, zk_session
from trimtab.cluster.zk import BrokerRegistry, ZkPaths, ZkSession
from trimtab.config.settings import Settings
from trimtab.errors import StartupError

#: How often a node reads the channel's end offsets (its lag: docs/operations.md, TrimtabChannelStuck).
CHANNEL_ENDS_EVERY_S = 10.0


log = structlog.get_logger("trimtab.replica")


@dataclass
class Replica:
    paths: ZkPaths
    zk: ZkSession
    registry: BrokerRegistry
    transport: Transport
    prepare_topics: Callable[[], None]
    channel: ChannelClient
    loads: KeyValueView[BrokerLoadData]
    top: KeyValueView[TopBundles] | None  # the controller's (the shedder reads the top bundles)
    events: EventPublisher
    placement: LivePlacement
    placement_watch: PlacementWatch
    standby_index: StandbyIndex
    standby_view: KeyValueView[StandbySet]

    @classmethod
    def build(
        cls,
        s: Settings,
        *,
        me: str,
        role: str,
        prom: CollectorRegistry,
        transport: Transport | None = None,
        on_channel_ready: Callable[[TableView], None] | None = None,
        top_bundles: bool = False,
    ) -> Replica:
        """The parts for node ``me`` of ``role`` (agent, controller), nothing connected yet. ``transport``
        instead of Kafka (tests, tools: then no topic check); ``on_channel_ready`` is called on the
        follower thread each time the channel catches up (at start, after a re-bootstrap), after the
        placement view has loaded the table."""
        k = s.kafka
        paths = ZkPaths(s.zk_path)
        zk = zk_session(s)
        registry = BrokerRegistry(zk, paths)
        transport, prepare_topics = kafka_clients(s, f"trimtab-{role}-{me}", transport)

        def channel_ready(table: TableView) -> None:
            placement.load_table()
            if on_channel_ready is not None:
                on_channel_ready(table)
            # What the bootstrap freed goes back to the system (cluster/memory.py: it took an agent tracking a
            # million bundles from 1 157 to 485 MiB resident, before the packed table), once the indexes above
            # are built.
            released = release_free_memory()
            if released is not None:
                log.info(
                    "memory_released",
                    rss_before_mb=round(released.rss_before / 2**20, 1),
                    rss_after_mb=round(released.rss_after / 2**20, 1),
                    ms=round(released.seconds * 1000, 1),
                )

        channel = ChannelClient(
            transport,
            k.channel_topic,
            k.snapshot_topic,
            on_skip=SkipLog(),
            on_ready=channel_ready,
            ends_every_s=CHANNEL_ENDS_EVERY_S,
        )
        placement = LivePlacement(
            lambda: registry.brokers,
            failure_domains_enabled=s.placement.failure_domains_enabled,
            table=channel.table,
        )
        registry.add_listener(placement.brokers_changed)
        channel.table.add_listener(placement.record_changed)  # on the follower thread; thread-safe
        loads: KeyValueView[BrokerLoadData] = KeyValueView(transport, k.broker_load_topic, BrokerLoadData)
        top = KeyValueView(transport, k.top_bundles_topic, TopBundles) if top_bundles else None
        standby_index = StandbyIndex()
        standby_view: KeyValueView[StandbySet] = KeyValueView(transport, k.standby_topic, StandbySet)
        standby_view.add_listener(standby_index.changed)
        replica = cls(
            paths=paths,
            zk=zk,
            registry=registry,
            transport=transport,
            prepare_topics=prepare_topics,
            channel=channel,
            loads=loads,
            top=top,
            events=EventPublisher(transport, k.events_topic, source=me, role=role),
            placement=placement,
            placement_watch=PlacementWatch(zk.client, paths, placement.policies_changed),
            standby_index=standby_index,
            standby_view=standby_view,
        )
        prom.register(ChannelCollector(lambda: channel))
        prom.register(KeyValueCollector(replica.views))
        return replica

    def views(
        self,
    ) -> list[KeyValueView[BrokerLoadData] | KeyValueView[TopBundles] | KeyValueView[StandbySet]]:
        """The Kafka views this node follows besides the channel."""
        return [v for v in (self.loads, self.top, self.standby_view) if v is not None]

    async def start(self, *, on_session: Callable[[], None] = lambda: None) -> None:
        """Connect, in order: the ZooKeeper session (then ``on_session``: e.g. the agent checks its
        leases fit the granted timeout), the registry and the placement policies, the topic check, the
        channel and the views. Standby sets are advice: nothing waits for them."""
        await asyncio.to_thread(self.zk.start)
        on_session()
        await asyncio.to_thread(self.registry.start)
        await asyncio.to_thread(self.placement_watch.start)
        # Every topic exists and can be relied on (cluster/topics.py), or start-up ends here, naming it.
        await asyncio.to_thread(self.prepare_topics)
        await asyncio.to_thread(self.channel.start)
        self.loads.start()
        if self.top is not None:
            self.top.start()
        self.standby_view.start()

    def ready(self) -> bool:
        """The channel and the views a decision needs have caught up."""
        return self.channel.ready and self.loads.ready and (self.top is None or self.top.ready)

    async def caught_up(
        self,
        stop: asyncio.Event,
        timeout_s: float | None = None,
        *,
        mono: Callable[[], float] = time.monotonic,
    ) -> bool:
        """Wait until :meth:`ready`; False if ``stop`` was set first. :class:`StartupError` after
        ``timeout_s`` (None: no limit), saying what the channel is doing."""
        deadline = None if timeout_s is None else mono() + timeout_s
        while not self.ready():
            if stop.is_set():
                return False
            if deadline is not None and mono() > deadline:
                raise StartupError(
                    f"channel or load view did not catch up within {timeout_s:g}s "
                    f"(channel: {self.channel.health()[1]})"
                )
            await asyncio.sleep(0.02)  # the replicas catch up on their own threads: no event to await
        return True

    async def stop_following(self) -> None:
        """Stop the registry watch and every reader, then flush what this node produced (bounded)."""
        with contextlib.suppress(Exception):
            self.registry.stop()
        self.channel.stop()
        for view in self.views():
            with contextlib.suppress(Exception):
                view.stop()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.transport.flush, 5.0)

    async def close(self) -> None:
        """Last of all: end the ZooKeeper session (its ephemeral nodes go with it) and the Kafka clients."""
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.zk.stop)
        with contextlib.suppress(Exception):
            self.transport.close()
