"""The chaos suite: a real local cluster, faults injected in a seeded order, and a verdict from the brokers'
own serving timelines (``trimtab chaos``; a short run is part of the test command).

The cluster (:class:`devkit.localcluster.LocalCluster`) runs every simulated broker as a process of its own
behind the webhook adapter (so a paused or killed agent leaves its broker running, as beside a real
broker) and a real Apache Kafka cluster (KRaft, :class:`devkit.kafka_server.KafkaCluster`; 3 brokers by
default, replication factor 3, min.insync.replicas 2), each broker a JVM process of its own that can be
paused, killed and restarted. A client thread keeps
looking up one topic of every bundle, as reconnecting clients would: a bundle that was given up gets
assigned again, and a bundle nobody serves any more shows up as lost.

Faults (one round applies each once, in a seeded order; the run repeats rounds until its duration is up):

==================  =====================================================================================
kill_agent          SIGKILL an agent (its broker keeps running), restart it on the same id after its
                    session expired
kill_leader         SIGKILL the leading controller, start a replacement
pause_agent         SIGSTOP an agent past its session timeout until its bundles are owned elsewhere
pause_broker        SIGSTOP a broker process for a lease and a half, then SIGCONT
zk_restart          stop the ZooKeeper server for a few seconds, start it again (same data)
kafka_pause         SIGSTOP every Kafka broker process at once for a few seconds, then SIGCONT (the whole
                    cluster frozen, as by a stalled host or VM)
kill_kafka_leader   SIGKILL the Kafka broker leading the most channel partitions (from the topic metadata);
                    start it again (same port, same log dirs) once the channel has new leaders, and wait
                    until every channel partition is in sync on every broker again
stop_kafka          stop the whole Kafka cluster for a few seconds, then start it again on the same ports
                    with the same log dirs
poison              hostile values on every topic trimtab reads
pause_leader_heal   SIGKILL an agent, and SIGSTOP the leader the moment it sees the agent gone (mid-
                    reassignment) past its own session timeout; SIGCONT; restart the agent
clock_skew          step the wall clocks of the leading controller and of an agent's machine (the agent
                    and its broker process) 30 s ahead for two sessions, then 30 s behind for two more,
                    then back (the monotonic clock untouched: leases and timeouts must not notice;
                    records stamped by a skewed writer must not confuse their readers)
kill_zk_leader      SIGKILL the ZooKeeper ensemble's leader (``zk_servers`` >= 3); start it again once the
                    others elected a new one
partition_zk_member cut one ensemble member off from the other members and from every client (each
                    member on a host of its own, :mod:`devkit.netns`) for a session timeout and a half;
                    heal, and wait until it follows again
==================  =====================================================================================

The ZooKeeper faults need an ensemble (``ChaosConfig.zk_servers``, ``trimtab chaos --zk-servers 3``);
with one server they are refused before the cluster starts. ``zk_restart`` stops and starts every member.

Network faults (``ChaosConfig.hosts``: every server, agent with its broker, and controller on a host of
its own, :mod:`devkit.netns`; Kafka on the network's gateway in the root namespace). A cut link loses
packets silently; every cut heals after a bounded time:

=======================  ================================================================================
partition_agent_zk       the agent owning most bundles reaches Kafka and its broker, not ZooKeeper, until
                         the leader gave all its bundles away (session timeout + 2 s to + 30 s)
partition_agent_kafka    that agent reaches ZooKeeper, not Kafka (nor the suite's clients), for a session
                         timeout and a half
partition_leader_zk      the leading controller cut off from ZooKeeper until another one leads (+ 2 s)
partition_leader_kafka   the leading controller cut off from Kafka (and the clients) for 1.5 sessions
partition_halves         the hosts split in two: Kafka, a majority of ZooKeeper, half the agents and a
                         controller on one side, the rest on the other, for a session timeout + 2 s
oneway_drop              what the agent owning most bundles sends to ZooKeeper is lost (what ZooKeeper
                         sends arrives) for a session timeout and a half
netem_delay              that agent's links to ZooKeeper and Kafka slow and lossy -- every packet either
                         way held 200 ms +- 100 ms or lost (5 %), netem's ``delay 200ms 100ms loss 5%``
                         (:mod:`devkit.netem`) -- for two session timeouts
=======================  ================================================================================

Afterwards the cluster settles (every node ready, every owned bundle served by its owner), the timelines
of every broker process are collected and :mod:`devkit.chaos.history` proves that no two brokers served a
bundle at once (fenced does not count) and measures every gap in service.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import random
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import structlog
from confluent_kafka import Producer

from trimtab.agent.adapters.simulated import LoadModel
from trimtab.channel.bundles import TopicName, parse_bundle, topic_hash
from trimtab.config.loader import load_settings
from trimtab.config.merge import deep_merge
from trimtab.config.settings import Settings
from trimtab.devkit.chaos.history import load_history, summarize, unserved_gaps
from trimtab.devkit.chaos.kafka_faults import (
    busiest_leader,
    channel_leaders,
    disagreement,
    fully_replicated,
    ownership_tables,
    real_kafka,
)
from trimtab.devkit.chaos.report import ChaosReport, Fault, unavailability_by_fault
from trimtab.devkit.localcluster import ClusterError, LocalCluster, Node
from trimtab.devkit.netem import Shape
from trimtab.devkit.netns import ROOT, Network, available
from trimtab.errors import BundleError

log = structlog.get_logger("trimtab.chaos")

FAULT_KINDS = (
    "kill_agent",
    "kill_leader",
    "pause_agent",
    "pause_broker",
    "zk_restart",
    "kafka_pause",
    "kill_kafka_leader",
    "stop_kafka",
    "poison",
    "pause_leader_heal",
)
#: Faults of a ZooKeeper ensemble (``zk_servers`` >= 3): not in the default set, which runs on one server.
ZK_FAULTS = ("kill_zk_leader", "partition_zk_member")
#: Faults between hosts of their own (``hosts``).
NET_FAULTS = (
    "partition_agent_zk",
    "partition_agent_kafka",
    "partition_leader_zk",
    "partition_leader_kafka",
    "partition_halves",
    "oneway_drop",
    "netem_delay",
)
#: Wall-clock steps (agents' machines and the leader): any cluster; not in the default set, whose short run
#: is in the test command's budget (a step back stalls an agent's signed calls for the size of the step).
CLOCK_FAULTS = ("clock_skew",)
ALL_FAULTS = FAULT_KINDS + ZK_FAULTS + NET_FAULTS + CLOCK_FAULTS
#: ``netem_delay``'s link: each packet either way held 200 ms +- 100 ms (uniform) or lost (5 %).
NETEM = Shape(delay_ms=200, jitter_ms=100, loss=0.05)

#: Timers of the chaos cluster: short sessions (so faults resolve quickly) and the local cluster's fast
#: balancing. Leases follow: session timeout - margin.
CHAOS_SETTINGS: dict[str, Any] = {
    "namespace": {"auto_create": ["chaos/*"]},  # its clients look up chaos/ns-*, created by lookups
    "zookeeper": {"session_timeout_s": 4.0},
    "healing": {"safe_mode_settle_s": 5.0},
    "channel": {"monitor_interval_s": 2.0},
}


@dataclass
class ChaosConfig:
    workdir: Path
    duration_s: float = 60.0  # of the fault phase; at least one full round runs
    rounds: int | None = None  # exactly this many rounds instead (duration_s is then ignored)
    brokers: int = 4
    controllers: int = 2
    namespaces: int = 6
    seed: int = 1
    faults: Sequence[str] = FAULT_KINDS
    quiet_s: float = 2.0  # between faults
    # After the faults, for every bundle to be served again: the slowest faults wait up to 60 s for their
    # own recovery (a new leader, replicas back in sync), and the bundles a partition released then need
    # the leader's monitor and the reconnecting clients.
    settle_s: float = 120.0
    kafka_brokers: int = 3  # of the real Kafka cluster (1: no replication, so kill_kafka_leader is an outage)
    kafka_outage_s: float = 5.0  # how long stop_kafka keeps Kafka down (its restart takes longer on 2 cores)
    zk_servers: int = 1  # 3: a ZooKeeper ensemble (the ZooKeeper faults need it)
    hosts: bool = False  # every node on a host of its own (the network faults need it)
    # False: agents vouch for leases whatever ZooKeeper says -- only for the checker's self-test
    agent_lease_check: bool = True
    settings: dict[str, Any] = field(default_factory=dict)


#: Clients reconnecting at once after their bundles lost their owner (a pool of lookups in parallel).
RECONNECT_CLIENTS = 16


class LookupClient:
    """Clients that keep reconnecting: topics looked up round-robin on every agent -- and, first, a topic of
    every bundle that has no owner right now, as the clients of a bundle closed by an unload reconnect at
    once (their connection closed). Without that second part, a bundle its owner let go (an agent giving up
    what it owned under a lost session) waited for the round-robin to come back to one of its topics: ten
    minutes with 20 000 topics, counted as a lost bundle by the checker."""

    def __init__(
        self,
        cluster: LocalCluster,
        topics: Sequence[str],
        ownership: Callable[[], Mapping[str, Mapping[str, Any]]] | None = None,
        refresh_s: float = 2.0,
    ) -> None:
        self.cluster = cluster
        self.topics = list(topics)
        self.ownership = ownership
        self.refresh_s = refresh_s
        by_ns: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for t in self.topics:
            by_ns[TopicName.parse(t).namespace].append((topic_hash(t), t))
        self._by_ns = {ns: sorted(v) for ns, v in by_ns.items()}
        self.ok = 0
        self.failed = 0
        self.reconnects = 0  # lookups of a bundle that had no owner
        self.cycles = 0  # times every topic was looked up
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-lookups", daemon=True)

    def topic_for(self, bundle: str) -> str | None:
        """One of our topics that hashes into ``bundle``, if any."""
        try:
            ns, rng = parse_bundle(bundle)
        except BundleError:
            return None
        hashes = self._by_ns.get(ns, [])
        i = bisect.bisect_left(hashes, (rng.lower, ""))
        return hashes[i][1] if i < len(hashes) and rng.contains(hashes[i][0]) else None

    def _unowned(self) -> list[str]:
        if self.ownership is None:
            return []
        try:
            records = self.ownership()
        except Exception:  # a fault is in progress: the round-robin goes on
            return []
        return [
            t for b, r in sorted(records.items()) if r.get("state") == "free" and (t := self.topic_for(b))
        ]

    def _reconnect(self, topics: list[str], agents: Sequence[Node]) -> None:
        """Look ``topics`` up concurrently (``RECONNECT_CLIENTS`` at a time), spread over the agents."""
        self._parallel(topics, agents)
        self.reconnects += len(topics)

    def _warm(self) -> None:
        """Every topic once, concurrently: clients connecting at start-up. One at a time, 20 000 topics took
        ten minutes at ~33 lookups a second -- longer than the warm-up allows."""
        while not self._stop.is_set() and not self.cluster.agents:
            self._stop.wait(0.2)
        if not self._stop.is_set():
            self._parallel(self.topics, self.cluster.agents)
            self.cycles += 1

    def _parallel(self, topics: list[str], agents: Sequence[Node]) -> None:
        """``topics`` looked up ``RECONNECT_CLIENTS`` at a time over one pool of kept-alive connections (a
        client per lookup cost more CPU than the lookup: 15 a second on this machine)."""
        limits = httpx.Limits(
            max_connections=RECONNECT_CLIENTS * 2, max_keepalive_connections=RECONNECT_CLIENTS * 2
        )

        def one(it: tuple[int, str]) -> bool:
            k, topic = it
            try:
                r = http.get(f"{agents[k % len(agents)].http}/v1/lookup", params={"topic": topic})
                return r.status_code == 200
            except httpx.HTTPError:
                return False

        with (
            httpx.Client(timeout=3, limits=limits) as http,
            ThreadPoolExecutor(RECONNECT_CLIENTS, thread_name_prefix="chaos-reconnect") as pool,
        ):
            for ok in pool.map(one, enumerate(topics)):
                if ok:
                    self.ok += 1
                else:
                    self.failed += 1

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        self._warm()
        i = 0
        urgent: list[str] = []
        next_refresh = 0.0
        with httpx.Client(timeout=3) as http:
            while not self._stop.is_set():
                agents = self.cluster.agents
                if not agents:
                    self._stop.wait(0.2)
                    continue
                now = time.monotonic()
                if now >= next_refresh:
                    urgent = self._unowned()
                    next_refresh = now + self.refresh_s
                node = agents[i % len(agents)]
                if urgent:
                    # The clients of every bundle that lost its owner reconnect at once, in parallel (one
                    # lookup at a time managed ~11 a second: 1 299 bundles released by a partition took minutes).
                    self._reconnect(urgent, agents)
                    urgent = []
                    continue
                topic = self.topics[i % len(self.topics)]
                if (i + 1) % len(self.topics) == 0:
                    self.cycles += 1
                i += 1
                try:
                    r = http.get(f"{node.http}/v1/lookup", params={"topic": topic})
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    self.ok += 1
                else:
                    self.failed += 1
                    self._stop.wait(0.05)


def _poison_values(bundles: Sequence[str]) -> list[tuple[bytes | None, bytes]]:
    """Values that must be skipped and counted by every reader (docs/protocol.md section 2.2)."""
    keys: list[bytes | None] = [b.encode() for b in bundles[:4]]
    keys += [b"\xff\xfe not a bundle", None]
    values = [
        b'{"schema":1,"state":"owned","dst":"br\xc3","src":null,"version":2,"force":false,"ts":1,"writer":"x"}',
        b'{"schema":1,"state":"owned","dst":"b","src":null,"version":1,"force":true,"ts":1e400,"writer":"x"}',
        b"[" * 5000 + b"]" * 5000,
        b'{"schema":99,"state":"owned"}',
        b"\x00\x01\x02 not json",
        b"",
        b'"\\ud800"',
        os.urandom(512),
    ]
    return [(k, v) for k in keys for v in values]


class ChaosRun:
    def __init__(self, cfg: ChaosConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.faults: list[Fault] = []
        self.t0 = time.monotonic()
        unknown = sorted(set(cfg.faults) - set(ALL_FAULTS))
        if unknown:
            raise ClusterError(f"unknown faults {unknown}: choose from {', '.join(ALL_FAULTS)}")
        zk_faults = sorted(set(cfg.faults) & set(ZK_FAULTS))
        if zk_faults and cfg.zk_servers < 3:
            raise ClusterError(
                f"these faults need a ZooKeeper ensemble (--zk-servers 3): {', '.join(zk_faults)}"
            )
        net_faults = sorted(set(cfg.faults) & set(NET_FAULTS))
        if net_faults and not cfg.hosts:
            raise ClusterError(f"these faults need hosts of their own (--hosts): {', '.join(net_faults)}")
        self.network: Network | None = None
        if cfg.hosts or "partition_zk_member" in cfg.faults:
            why = available()
            if why is not None:
                raise ClusterError(f"hosts of their own are not available here: {why}")
            self.network = Network.create()  # its guardian removes it even if this process is killed
        self.cluster = LocalCluster(
            cfg.workdir,
            brokers=cfg.brokers,
            controllers=cfg.controllers,
            settings=deep_merge(CHAOS_SETTINGS, cfg.settings),
            broker_processes=True,
            kafka_brokers=cfg.kafka_brokers,
            zk_servers=cfg.zk_servers,
            network=self.network,
            node_hosts=cfg.hosts,
            clock_skew="clock_skew" in cfg.faults,
            agent_lease_check=cfg.agent_lease_check,
        )
        self.s: Settings | None = None
        self.client: LookupClient | None = None
        self._restarts = 0

    # ------------------------------------------------------------------ helpers
    @property
    def settings(self) -> Settings:
        assert self.s is not None
        return self.s

    def _note(
        self, kind: str, target: str, detail: str | None = None, *, started: float | None = None
    ) -> None:
        """Record a fault; ``started`` (monotonic) when it is noted after it began."""
        at = time.monotonic() if started is None else started
        fault = Fault(round(at - self.t0, 3), kind, target, detail)
        self.faults.append(fault)
        log.info("fault", kind=kind, target=target, detail=detail, at_s=fault.at_s)

    def _session_s(self) -> float:
        return self.settings.zookeeper.session_timeout_s

    def _restart_agent(self, dead: Node) -> None:
        self._restarts += 1
        self.cluster.add_agent(name=f"{dead.name.split('~')[0]}~{self._restarts}", port=dead.port, wait=True)

    def _pause(self, node_pid: int, seconds: float) -> None:
        os.killpg(node_pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.killpg(node_pid, signal.SIGCONT)

    def _leader(self, timeout: float = 60.0) -> Node:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.cluster.leader()
            if leader is not None:
                return leader
            time.sleep(0.1)
        raise ClusterError("no leader")

    # ------------------------------------------------------------------ faults
    def _kill_agent(self, detail: str | None = None) -> Node:
        victim = self.rng.choice(self.cluster.agents)
        self.cluster.kill(victim.name)
        victim.proc.wait(10)
        self._note("kill_agent", str(victim.broker), detail)
        return victim

    def kill_agent(self) -> None:
        self._restart_agent(self._kill_agent())

    def kill_leader(self) -> None:
        leader = self._leader()
        self.cluster.kill(leader.name)
        leader.proc.wait(10)
        self._note("kill_leader", leader.name)
        self.cluster.add_controller(wait=True)
        self._leader()

    def pause_agent(self) -> None:
        """SIGSTOP the agent owning the most bundles until the leader has given every one of them to
        another broker (at least its session timeout + 2 s, at most + 30 s), then SIGCONT: the widest window
        in which its broker, unfenced by a frozen agent, could still be serving beside the new owners. A
        fixed pause raced the reassignment on a slow machine and sometimes ended before it."""
        leader, victim, mine = self._busiest_agent()
        start = time.monotonic()
        os.killpg(victim.pid, signal.SIGSTOP)
        try:
            self._until_moved_off(start, leader, victim, mine)
        finally:
            os.killpg(victim.pid, signal.SIGCONT)
        self._note(
            "pause_agent",
            str(victim.broker),
            f"SIGSTOP {time.monotonic() - start:.1f}s (session timeout {self._session_s():g}s,"
            f" {len(mine)} bundles reassigned meanwhile)",
            started=start,
        )
        self.cluster.wait_node(victim, 60)

    def _moved_off(self, leader: Node, broker: str, bundles: Sequence[str]) -> bool:
        """Every one of ``bundles`` owned by a broker other than ``broker`` (per the leader)."""
        try:
            own = self.cluster.ownership(leader)
        except (httpx.HTTPError, ClusterError):
            return False
        return all(own.get(b, {}).get("state") == "owned" and own[b].get("dst") != broker for b in bundles)

    def pause_broker(self) -> None:
        victim = self.rng.choice(self.cluster.broker_nodes)
        seconds = self.settings.lease_s() * 1.5
        self._note("pause_broker", str(victim.broker), f"SIGSTOP {seconds:g}s")
        self._pause(victim.pid, seconds)

    def zk_restart(self) -> None:
        seconds = 3.0
        self._note("zk_restart", "zookeeper", f"down {seconds:g}s")
        if self.cluster.zk_ensemble is not None:
            self.cluster.zk_ensemble.stop()
            time.sleep(seconds)  # the outage itself
            self.cluster.zk_ensemble.start()
        else:
            zk = self.cluster.zk
            assert zk is not None
            zk.stop()
            time.sleep(seconds)  # the outage itself
            zk.restart()
        self.cluster.wait_ready(90)

    def _zk_leader(self, timeout: float = 60.0) -> int:
        ensemble = self.cluster.zk_ensemble
        assert ensemble is not None
        found: list[int] = []

        def leads() -> bool:
            i = ensemble.leader()
            found[:] = [] if i is None else [i]
            return i is not None

        self._wait(leads, timeout, "a ZooKeeper leader")
        return found[0]

    def kill_zk_leader(self) -> None:
        ensemble = self.cluster.zk_ensemble
        assert ensemble is not None
        old = self._zk_leader()
        start = time.monotonic()
        ensemble.servers[old].kill()
        new = self._zk_leader(30)
        self._note(
            "kill_zk_leader",
            f"zk{old + 1}",
            f"SIGKILL; zk{new + 1} leads after {time.monotonic() - start:.1f}s",
            started=start,
        )
        ensemble.restart(old)
        self.cluster.wait_ready(90)

    def partition_zk_member(self) -> None:
        ensemble, net = self.cluster.zk_ensemble, self.network
        assert ensemble is not None and net is not None
        i = self.rng.randrange(len(ensemble.servers))
        member = f"zk{i + 1}"
        seconds = self._session_s() * 1.5
        was = ensemble.servers[i].mode()
        start = time.monotonic()
        net.isolate(member)
        try:
            time.sleep(seconds)  # the partition itself
        finally:
            net.heal()
        self._note("partition_zk_member", member, f"cut off {seconds:g}s (was {was})", started=start)
        self._wait(lambda: ensemble.servers[i].mode() in ("leader", "follower"), 60, f"{member} rejoining")
        self.cluster.wait_ready(90)

    def kafka_pause(self) -> None:
        """Every broker at once: one paused broker is only a slow follower or, past its session timeout, a
        leader failover (kill_kafka_leader covers that); the whole cluster frozen is what the clients of a
        stalled Kafka see, and what the mock's pause modelled before."""
        kafka = real_kafka(self.cluster)
        pids = [b.pid for b in kafka.brokers if b.pid is not None]
        seconds = 3.0
        self._note("kafka_pause", "kafka", f"SIGSTOP {len(pids)} brokers {seconds:g}s")
        for pid in pids:
            os.killpg(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)  # the fault itself
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGCONT)

    def kill_kafka_leader(self) -> None:
        kafka = real_kafka(self.cluster)
        topic = self.settings.kafka.channel_topic
        broker, partitions = busiest_leader(kafka, topic)
        start = time.monotonic()
        kafka.kill(broker)
        # Down until the channel has other leaders (the controller fences the dead broker after its session
        # timeout), or at most 30 s; then back on its port with its log dirs.
        if kafka.size > 1:
            self._wait(lambda: broker not in channel_leaders(kafka, topic), 30, "new channel leaders")
            after = f"new leaders after {time.monotonic() - start:.1f}s"
        else:
            after = "the only broker: Kafka is down until it is back"
        self._note(
            "kill_kafka_leader",
            f"kafka-{broker}",
            f"SIGKILL, leader of channel partitions {partitions}; {after}",
            started=start,
        )
        kafka.start_broker(broker)
        self._wait(lambda: fully_replicated(kafka, topic), 60, "channel replicas in sync")

    def stop_kafka(self) -> None:
        kafka = real_kafka(self.cluster)
        seconds = self.cfg.kafka_outage_s
        start = time.monotonic()
        kafka.close()
        time.sleep(seconds)  # the outage itself
        kafka.restart()
        self._note(
            "stop_kafka",
            "kafka",
            f"all {kafka.size} brokers down {time.monotonic() - start:.1f}s ({seconds:g}s + restart)",
            started=start,
        )
        self._wait(lambda: fully_replicated(kafka, self.settings.kafka.channel_topic), 60, "channel replicas")

    def clock_skew(self) -> None:
        leader = self._leader()
        agent = self.rng.choice(self.cluster.agents)
        hold = self._session_s() * 2
        clocks = (leader.name, str(agent.broker))  # an agent's machine: the agent and its broker
        start = time.monotonic()
        try:
            for offset in (30.0, -30.0):
                for clock in clocks:
                    self.cluster.skew(clock, offset)
                time.sleep(hold)  # the fault itself
        finally:
            for clock in clocks:
                self.cluster.skew(clock, 0.0)
        detail = f"+30 s then -30 s, {hold:g} s each, with {agent.broker}'s machine (agent and broker)"
        self._note("clock_skew", leader.name, detail, started=start)
        self._leader()

    # ------------------------------------------------------------------ network faults
    def _net(self) -> Network:
        assert self.network is not None
        return self.network

    def _zk_hosts(self) -> list[str]:
        return sorted(h for h in self._net().hosts if h.startswith("zk"))

    def _busiest_agent(self) -> tuple[Node, Node, list[str]]:
        """(the leader, the agent owning most bundles, those bundles)."""
        leader = self._leader()
        owned = self.cluster.ownership(leader)
        agents = self.cluster.agents
        counts = {n.name: sum(1 for r in owned.values() if r.get("dst") == str(n.broker)) for n in agents}
        victim = max(agents, key=lambda n: (counts[n.name], self.rng.random()))
        return leader, victim, [b for b, r in owned.items() if r.get("dst") == str(victim.broker)]

    def _partition(
        self,
        kind: str,
        target: str,
        pairs: Sequence[tuple[str, str]],
        what: str,
        hold: Callable[[float], None] | float,
        *,
        oneway: bool = False,
        shape: Shape | None = None,
    ) -> None:
        """Cut ``pairs`` (``oneway``: only what the first of each sends is lost; ``shape``: slowed and
        lossy rather than cut), hold the fault -- for ``hold`` seconds, or until ``hold(start)`` returns
        --, heal every link and note the fault."""
        net = self._net()
        start = time.monotonic()
        for a, b in pairs:
            if shape is None:
                net.cut(a, b, oneway=oneway)
            else:
                net.delay(
                    a,
                    b,
                    delay_ms=shape.delay_ms,
                    jitter_ms=shape.jitter_ms,
                    loss=shape.loss,
                    oneway=oneway,
                    seed=self.rng.randrange(2**16),
                )
        try:
            if callable(hold):
                hold(start)
            else:
                time.sleep(hold)  # the fault itself
        finally:
            net.heal()
        self._note(kind, target, f"{what} {time.monotonic() - start:.1f}s", started=start)

    def _until_moved_off(self, start: float, leader: Node, victim: Node, bundles: Sequence[str]) -> None:
        """Until the leader gave every one of ``bundles`` to another broker: at least the session timeout
        + 2 s, at most + 30 s (the widest window for the victim's broker to serve beside new owners)."""
        least, most = self._session_s() + 2, self._session_s() + 30
        while (elapsed := time.monotonic() - start) < most:
            if elapsed >= least and self._moved_off(leader, str(victim.broker), bundles):
                return
            time.sleep(0.2)

    def _agent_cut(self, kind: str, to: Sequence[str], what: str, *, oneway: bool = False) -> None:
        """The agent owning most bundles cut from ``to``: until the leader gave all its bundles away when
        it is cut from ZooKeeper both ways, else for a session timeout and a half."""
        leader, victim, mine = self._busiest_agent()
        assert victim.netns_host is not None
        hold: Callable[[float], None] | float = self._session_s() * 1.5
        if to == self._zk_hosts() and not oneway:
            hold = lambda start: self._until_moved_off(start, leader, victim, mine)  # noqa: E731
        pairs = [(victim.netns_host, t) for t in to]
        self._partition(kind, str(victim.broker), pairs, f"{what} ({len(mine)} bundles)", hold, oneway=oneway)
        self.cluster.wait_node(victim, 90)

    def partition_agent_zk(self) -> None:
        self._agent_cut("partition_agent_zk", self._zk_hosts(), "cut from ZooKeeper")

    def oneway_drop(self) -> None:
        self._agent_cut("oneway_drop", self._zk_hosts(), "its packets to ZooKeeper lost", oneway=True)

    def partition_agent_kafka(self) -> None:
        self._agent_cut("partition_agent_kafka", [ROOT], "cut from Kafka")

    def netem_delay(self) -> None:
        """The agent owning most bundles on a slow, lossy link to ZooKeeper and Kafka for two session
        timeouts: its session's pings and its lease renewals late or lost, its channel records slow. What
        it shows: a slow link is at worst a lost session (fenced before the leader gives bundles away),
        never two brokers serving."""
        _, victim, mine = self._busiest_agent()
        assert victim.netns_host is not None
        pairs = [(victim.netns_host, t) for t in [*self._zk_hosts(), ROOT]]
        what = f"200 ms +- 100 ms, 5 % loss to ZooKeeper and Kafka ({len(mine)} bundles) for"
        self._partition("netem_delay", str(victim.broker), pairs, what, self._session_s() * 2, shape=NETEM)
        self.cluster.wait_node(victim, 90)

    def _leader_cut(
        self, kind: str, to: Sequence[str], what: str, hold: Callable[[float], None] | float
    ) -> None:
        leader = self._leader()
        assert leader.netns_host is not None
        self._partition(kind, leader.name, [(leader.netns_host, t) for t in to], what, hold)
        self._leader()

    def partition_leader_zk(self) -> None:
        """Until another controller leads, and 2 s more: the old leader, cut off, past the takeover."""
        old = self._leader().name

        def taken_over(start: float) -> None:
            self._wait(lambda: (n := self.cluster.leader()) is not None and n.name != old, 60, "a new leader")
            time.sleep(2.0)

        self._leader_cut("partition_leader_zk", self._zk_hosts(), "cut from ZooKeeper", taken_over)

    def partition_leader_kafka(self) -> None:
        self._leader_cut("partition_leader_kafka", [ROOT], "cut from Kafka", self._session_s() * 1.5)

    def partition_halves(self) -> None:
        """Kafka (the root namespace), a majority of ZooKeeper, half the agents and the first controller
        on one side; the rest on the other."""
        net = self._net()
        zks = self._zk_hosts()
        agents = sorted(h for h in net.hosts if h.startswith("a"))
        controllers = sorted(h for h in net.hosts if h.startswith("c"))
        one = {ROOT, *zks[: len(zks) // 2 + 1], *agents[: (len(agents) + 1) // 2], *controllers[:1]}
        other = set(net.hosts) - one
        pairs = [(a, b) for a in sorted(one) for b in sorted(other)]
        self._partition(
            "partition_halves",
            "cluster",
            pairs,
            f"{sorted(one)} | {sorted(other)} for",
            self._session_s() + 2,
        )
        self.cluster.wait_ready(90)

    def poison(self) -> None:
        k = self.settings.kafka
        topics = [
            k.channel_topic,
            k.snapshot_topic,
            k.broker_load_topic,
            k.top_bundles_topic,
            k.events_topic,
            k.standby_topic,
        ]
        bundles = sorted(self.cluster.ownership(self._leader()))
        producer = Producer({"bootstrap.servers": self.cluster.bootstrap_servers, "log_level": 0})
        sent = 0
        for topic in topics:
            for key, value in _poison_values(bundles):
                producer.produce(topic, key=key, value=value)
                sent += 1
        producer.flush(10)
        self._note("poison", "every topic", f"{sent} values")

    def pause_leader_heal(self) -> None:
        leader = self._leader()
        victim = self._kill_agent("before pausing the leader mid-reassignment")
        deadline = time.monotonic() + self._session_s() * 3
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if victim.broker not in self.cluster.get(leader, "/v1/brokers").get("brokers", {}):
                    break
            time.sleep(0.02)
        seconds = self._session_s() + 2
        self._note("pause_leader_heal", leader.name, f"SIGSTOP {seconds:g}s as it reassigns {victim.broker}")
        self._pause(leader.pid, seconds)
        self._restart_agent(victim)
        self._leader()

    # ------------------------------------------------------------------ the run
    def _topics(self) -> list[str]:
        model = LoadModel(self.settings.sim)
        return [t.name for i in range(self.cfg.namespaces) for t in model.topics(f"chaos/ns-{i}")]

    def _settled(self) -> tuple[bool, str]:
        leader = self.cluster.leader()
        if leader is None:
            return False, "no leader"
        owned = {b: r for b, r in self.cluster.ownership(leader).items() if r["state"] == "owned"}
        states = self.cluster.broker_states()
        serving: dict[str, set[str]] = {}
        for broker, st in states.items():
            for b in st["serving"]:
                serving.setdefault(b, set()).add(broker)
        wrong = [b for b, r in owned.items() if serving.get(b) != {r["dst"]}]
        extra = [b for b in serving if b not in owned]
        if wrong or extra:
            # Name a few, with who owns and who serves them: the line a failed run ends with.
            shown = [
                f"{b} owned by {owned[b]['dst']}, served by {sorted(serving.get(b, ())) or 'nobody'}"
                for b in sorted(wrong)[:5]
            ]
            shown += [f"{b} unowned, served by {sorted(serving[b])}" for b in sorted(extra)[:5]]
            return (
                False,
                f"{len(wrong)} owned bundles not served by exactly their owner, {len(extra)} served unowned: "
                + "; ".join(shown),
            )
        # Every agent and the leader replay the same table (the channel's first-valid-transition rule).
        tables = ownership_tables(self.cluster)
        tables[leader.name] = self.cluster.ownership(leader)
        differ = disagreement(tables)
        if differ is not None:
            return False, f"the nodes' ownership tables differ: {differ}"
        return True, f"{len(owned)} bundles served by their owners; {len(tables)} nodes agree"

    def run(self) -> ChaosReport:
        cfg = self.cfg
        try:
            self.cluster.start()
            self.s = load_settings(self.cluster.config_path, environ=False)
            topics = self._topics()
            self.client = client = LookupClient(self.cluster, topics, ownership=self.cluster.ownership)
            client.start()
            # Warm: every topic looked up once (so every bundle the clients reach is assigned; the client
            # does that first, RECONNECT_CLIENTS at a time), then settled: allow ~20 ms per topic.
            self._wait(
                lambda: client.cycles >= 1 and self._settled()[0],
                max(120.0, len(topics) * 0.02),
                "warm-up",
            )
            log.info("chaos_warm", bundles=len(self.cluster.ownership()), topics=len(topics))
            # A fault that cannot be injected, or a cluster that does not settle, ends the run with a
            # report that says so (and does not pass): the history up to there is the evidence.
            problems: list[str] = []
            rounds = self._inject(problems)
            try:
                self._wait(lambda: self._settled()[0], cfg.settle_s, "settle")
            except (ClusterError, httpx.HTTPError, OSError) as e:
                problems.append(str(e))
                log.warning("chaos_unsettled", error=str(e))
            settled_at = time.monotonic()
            try:
                leader = self.cluster.leader()
                tracked = len(self.cluster.ownership(leader)) if leader is not None else None
            except (ClusterError, httpx.HTTPError, OSError) as e:
                tracked = None
                problems.append(f"the leader's ownership table could not be read: {e}")
            self.client.stop()
            timelines = self.cluster.timelines()
            history = load_history(timelines, observed_until_ns=time.monotonic_ns())
            summary = summarize(history, settle_ns=int(cfg.settle_s * 1e9))
            t0_ns = int(self.t0 * 1e9)
            gaps = [g for found in unserved_gaps(history).values() for g in found]
            report = ChaosReport(
                name="chaos",
                summary=summary,
                faults=self.faults,
                runs=rounds,
                seed=cfg.seed,
                duration_s=round(settled_at - self.t0, 1),
                params={
                    "brokers": cfg.brokers,
                    "controllers": cfg.controllers,
                    "namespaces": cfg.namespaces,
                    "session_timeout_s": self._session_s(),
                    "lease_s": self.settings.lease_s(),
                    "lease_margin_s": self.settings.broker.adapter.lease_margin_s,
                    "lookups_ok": self.client.ok,
                    "lookups_failed": self.client.failed,
                    "lookups_reconnecting": self.client.reconnects,
                    "t0_mono_ns": t0_ns,
                    "bundles_tracked": tracked,
                },
                by_fault=unavailability_by_fault(gaps, self.faults, t0_ns),
                problems=problems,
            )
            (cfg.workdir / "timelines.json").write_bytes(orjson.dumps(timelines))
            return report
        finally:
            if self.client is not None:
                self.client.stop()
            self.cluster.stop()
            if self.network is not None:
                self.network.close()

    def _inject(self, problems: list[str]) -> int:
        """The fault rounds, each kind once a round in a seeded order; returns how many rounds began. A fault
        that raises -- whatever it raises -- is recorded in ``problems`` and ends the faults, not the run."""
        cfg = self.cfg
        actions: dict[str, Callable[[], None]] = {kind: getattr(self, kind) for kind in cfg.faults}
        rounds = 0
        end = time.monotonic() + cfg.duration_s

        def more() -> bool:
            if cfg.rounds is not None:
                return rounds < cfg.rounds
            return rounds == 0 or time.monotonic() < end

        while more() and not problems:
            order = list(cfg.faults)
            self.rng.shuffle(order)
            for kind in order:
                try:
                    actions[kind]()
                except Exception as e:
                    problems.append(f"{kind} in round {rounds + 1}: {e}")
                    log.warning("chaos_fault_failed", fault=kind, round=rounds + 1, error=str(e))
                    break
                time.sleep(cfg.quiet_s)
            rounds += 1
        return rounds

    def _wait(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while True:  # asked at least once, also with no time left
            try:
                if cond():
                    return
            except (httpx.HTTPError, ClusterError) as e:
                last = str(e)
            if time.monotonic() >= deadline:
                break
            time.sleep(0.25)
        detail = last
        if what == "settle":
            try:
                detail = self._settled()[1]
            except (httpx.HTTPError, ClusterError, OSError) as e:  # a node that stopped answering
                detail = f"the cluster's state could not be read: {type(e).__name__}: {e}"
        raise ClusterError(f"chaos: {what} did not finish within {timeout:g}s ({detail})")


def run_chaos(cfg: ChaosConfig) -> ChaosReport:
    return ChaosRun(cfg).run()
