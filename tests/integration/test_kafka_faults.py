"""Kafka faults on a real 3-broker Apache Kafka cluster (KRaft, replication factor 3, min.insync.replicas 2)
under a real local cluster (ZooKeeper, agents and controllers as processes).

1. The Kafka broker leading the channel's partitions is killed (SIGKILL) while clients storm the agents with
   lookups of new topics and while the leader reassigns the bundles of an agent that was killed a moment
   before: no acknowledged transition is lost (every lookup answered 200 is borne out by the final table),
   no bundle is ever served by two brokers, every agent ends with the same table, and new topics are
   answered again within :data:`LEADER_KILL_BOUND_S` of the kill (measured: docs/reliability.md).
2. The whole Kafka cluster is stopped for 30 s and started again on the same ports and log dirs: meanwhile
   owned bundles keep being served and looked up (leases hang on ZooKeeper, not Kafka), new topics are
   refused as retryable, no trimtab process exits; afterwards new topics are answered again and the nodes
   agree.

One module-scoped cluster (the Kafka start alone is ~10 s on 2 cores); the tests use their own namespaces.
The figures are printed (``pytest -s``) with the prefix ``kafka-faults:``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.waiting import wait_for
from trimtab.config.loader import load_settings
from trimtab.devkit.chaos.history import check_single_owner
from trimtab.devkit.chaos.kafka_faults import (
    Answer,
    LookupStorm,
    busiest_leader,
    channel_leaders,
    disagreement,
    fully_replicated,
    lookup,
    lost_acknowledgements,
    owned_by_dead,
    owner_of,
    ownership_tables,
    real_kafka,
    why_stalled,
)
from trimtab.devkit.localcluster import LocalCluster, Node

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SESSION_TIMEOUT_S = 4.0
IN_FLIGHT_TIMEOUT_S = 10.0
SETTINGS: dict[str, Any] = {
    "zookeeper": {"session_timeout_s": SESSION_TIMEOUT_S},  # leases of 2 s (margin 2 s)
    "channel": {"in_flight_timeout_s": IN_FLIGHT_TIMEOUT_S, "monitor_interval_s": 2.0},
    "healing": {"safe_mode_settle_s": 5.0},
    # Owners change only through the faults here: every answered owner must still be the owner afterwards
    # unless the failover moved it (a later version).
    "shedding": {"enabled": False},
    "split": {"enabled": False},
}
#: From the SIGKILL of the channel's leading Kafka broker to the first answered lookup of a new topic sent
#: after it. Measured 7-13 s on the 2-core VM (docs/reliability.md): the controller fences a broker after
#: broker.session.timeout.ms = 6 s, then librdkafka finds the new leaders.
LEADER_KILL_BOUND_S = 30.0
OUTAGE_S = 30.0
#: From the end of Kafka's restart (every broker serving again) to the first answered lookup of a new topic.
RECOVERY_BOUND_S = 30.0
#: Repeat the leader kill to measure its gap over several runs (TRIMTAB_KAFKA_FAULT_RUNS=3); CI runs it once.
RUNS = int(os.environ.get("TRIMTAB_KAFKA_FAULT_RUNS", "1"))


def _figure(text: str) -> None:
    print(f"kafka-faults: {text}", flush=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(
        Path(tmp_path_factory.mktemp("kafka-faults")),
        brokers=3,
        controllers=2,
        settings=SETTINGS,
        kafka_brokers=3,
    )
    c.start(timeout=180)
    try:
        yield c
    finally:
        c.stop()


def _leader(cluster: LocalCluster) -> Node:
    node = wait_for(cluster.leader, 60, message="a leading controller")
    assert node is not None
    return node


def _agreed_table(cluster: LocalCluster, dead: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Wait until every live agent and the leader have the same table, with nothing in flight and nothing
    owned by a broker in ``dead``; return it."""
    state: dict[str, Any] = {}

    def settled() -> bool:
        tables = ownership_tables(cluster)
        tables["leader"] = cluster.ownership(_leader(cluster))
        state["why"] = disagreement(tables)
        if state["why"] is not None:  # who is behind, and why: each agent's channel as it reports it
            state["channels"] = {a.name: cluster.get(a, "/v1/status")["channel"] for a in cluster.agents}
        table = tables["leader"]
        moving = [b for b, r in table.items() if r["state"] not in ("owned", "free", "deleted")]
        stranded = [b for b, r in table.items() if owner_of(r) in dead]
        state.update(table=table, moving=moving[:3], stranded=stranded[:3])
        return state["why"] is None and not moving and not stranded

    wait_for(
        settled,
        90,
        interval=0.2,
        message=lambda: f"agents agree and settle: {state}",
        ignore=(httpx.HTTPError,),
    )
    return dict(state["table"])


def _timelines(cluster: LocalCluster, agents: list[Node] | None = None) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for a in agents or cluster.agents:
        st = cluster.get(a, "/v1/sim/state")
        out[st["broker"]] = st["timeline"]
    return out


def _served_by(cluster: LocalCluster) -> dict[str, set[str]]:
    serving: dict[str, set[str]] = {}
    for broker, st in cluster.broker_states().items():
        for b in st["serving"]:
            serving.setdefault(b, set()).add(broker)
    return serving


def _look_up_all(cluster: LocalCluster, topics: list[str]) -> list[Answer]:
    answers = []
    with httpx.Client(timeout=IN_FLIGHT_TIMEOUT_S + 5) as http:
        for i, topic in enumerate(topics):
            a = lookup(http, cluster.agents[i % len(cluster.agents)], topic)
            assert a.status == 200, a
            answers.append(a)
    return answers


def test_kill_the_channel_leader_during_a_lookup_storm_and_a_failover(cluster: LocalCluster) -> None:
    kafka = real_kafka(cluster)
    topic = load_settings(cluster.config_path, environ=False).kafka.channel_topic
    before = _look_up_all(cluster, [f"persistent://kf/base-{i}/t-0" for i in range(6)])
    table = _agreed_table(cluster)
    counts = {a.name: sum(1 for r in table.values() if owner_of(r) == a.broker) for a in cluster.agents}
    victim = max(cluster.agents, key=lambda a: counts[a.name])
    assert victim.broker is not None and counts[victim.name] > 0, counts
    answers: list[Answer] = list(before)
    gaps: list[float] = []
    with LookupStorm(cluster, tenant="kf", prefix="storm", threads=8, avoid={victim.name}) as storm:
        wait_for(lambda: len(storm.ok()) >= 20, 60, message="the storm's lookups are answered")
        # A failed agent: the leader reassigns its bundles once its ZooKeeper session expired.
        victim_timeline = _timelines(cluster, [victim])
        cluster.kill(victim.name)
        victim.proc.wait(10)
        victim_dead_ns = time.monotonic_ns()
        leader = _leader(cluster)
        wait_for(
            lambda: victim.broker not in cluster.get(leader, "/v1/brokers")["brokers"],
            SESSION_TIMEOUT_S * 5,
            interval=0.05,
            message="the leader sees the killed agent gone",
            ignore=(httpx.HTTPError,),
        )
        for run in range(RUNS):
            # ... and, as it starts reassigning (the first run), the channel's Kafka leader dies.
            broker, partitions = busiest_leader(kafka, topic)
            killed_at = time.monotonic()
            kafka.kill(broker)
            wait_for(
                lambda t=killed_at: storm.count_ok_sent_after(t) >= 10,  # type: ignore[misc]
                LEADER_KILL_BOUND_S + 30,
                interval=0.1,
                message=f"new topics answered after Kafka broker {broker} was killed",
            )
            first = storm.first_ok_sent_after(killed_at)
            assert first is not None
            gap = first.done - killed_at
            gaps.append(gap)
            new_leaders = channel_leaders(kafka, topic)
            _figure(
                f"run {run + 1}: killed Kafka broker {broker} (leader of channel partitions {partitions}); "
                f"first new topic answered {gap:.2f}s later; leaders now {new_leaders}"
            )
            assert broker not in new_leaders
            if run + 1 < RUNS:  # back to 3 for the next run; after the last, the next test restarts Kafka
                kafka.start_broker(broker)
                wait_for(lambda: fully_replicated(kafka, topic), 60, interval=0.2, message="replicas in sync")
        answers += storm.snapshot()
    statuses: dict[int, int] = {}
    for a in answers:
        statuses[a.status] = statuses.get(a.status, 0) + 1
    _figure(f"storm lookups by status {statuses}; gaps {[round(g, 2) for g in gaps]}")

    final = _agreed_table(cluster, dead=frozenset({victim.broker}))
    assert not owned_by_dead(final, [a.broker for a in cluster.agents if a.broker]), final
    lost = lost_acknowledgements(answers, final)
    assert not lost, lost[:10]
    assert statuses.get(200, 0) >= 30, statuses
    # Never two brokers serving one bundle: the survivors' timelines and the victim's up to its death.
    timelines = _timelines(cluster)
    for name, events in victim_timeline.items():
        timelines.setdefault(name, []).extend(events)
    check_single_owner(timelines, ended_at={victim.broker: victim_dead_ns})

    # Every bundle answered is served by exactly its owner once things settled.
    def served_right() -> bool:
        serving = _served_by(cluster)
        return all(serving.get(b) == {owner_of(r)} for b, r in final.items() if r["state"] == "owned")

    wait_for(served_right, 30, interval=0.2, message="every owned bundle served by its owner alone")
    assert max(gaps) < LEADER_KILL_BOUND_S, gaps


class _OutageProbe:
    """What clients and brokers see while Kafka is down: lookups of topics whose bundles are owned (each
    must be answered by its owner), the brokers' serving state (every owned bundle served by exactly its
    owner), trimtab's processes (none may exit) and, on a thread of its own, lookups of new topics (none
    may be answered while Kafka is down: an assignment needs the channel)."""

    def __init__(self, cluster: LocalCluster, held: list[Answer], table: dict[str, Any]) -> None:
        self.cluster = cluster
        self.held = held
        self.table = table
        self.processes = {n.name: n for n in cluster.nodes.values() if n.alive()}
        self.held_ok = self.rounds = 0
        self.bad: list[str] = []
        self.new_topics: list[Answer] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._new_topics, daemon=True)

    def _new_topics(self) -> None:
        i = 0
        with httpx.Client(timeout=IN_FLIGHT_TIMEOUT_S + 5) as http:
            while not self._stop.is_set():
                agent = self.cluster.agents[i % len(self.cluster.agents)]
                self.new_topics.append(lookup(http, agent, f"persistent://kf/dark-{i}/t-0"))
                i += 1

    def exited(self) -> list[str]:
        return [name for name, n in self.processes.items() if not n.alive()]

    def run(self, until: float) -> None:
        """Probe until ``until`` (monotonic): the outage is the scenario, this only watches it."""
        self._thread.start()
        with httpx.Client(timeout=5) as http:
            while time.monotonic() < until:
                self.rounds += 1
                agents = self.cluster.agents
                for i, a in enumerate(self.held):
                    got = lookup(http, agents[(i + self.rounds) % len(agents)], a.topic)
                    if got.status == 200 and got.owner == a.owner:
                        self.held_ok += 1
                    else:
                        self.bad.append(f"{a.topic} (owner {a.owner}): {got}")
                serving = _served_by(self.cluster)
                wrong = [
                    b
                    for b, r in self.table.items()
                    if r["state"] == "owned" and serving.get(b) != {owner_of(r)}
                ]
                if wrong:
                    self.bad.append(f"not served by exactly their owner: {wrong[:3]}")
                assert not self.exited(), f"trimtab processes exited while Kafka was down: {self.exited()}"
                self._stop.wait(0.5)  # pacing the probes through the outage

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(IN_FLIGHT_TIMEOUT_S + 10)


def test_the_whole_kafka_cluster_stopped_for_30s(cluster: LocalCluster) -> None:
    kafka = real_kafka(cluster)
    topic = load_settings(cluster.config_path, environ=False).kafka.channel_topic
    held = _look_up_all(cluster, [f"persistent://kf/held-{i}/t-0" for i in range(8)])
    probe = _OutageProbe(cluster, held, _agreed_table(cluster))
    leader = _leader(cluster)

    bootstrap = kafka.bootstrap_servers
    data_dirs = sorted(str(p) for p in kafka.workdir.glob(f"node-*/data/{topic}-*"))
    assert data_dirs
    stopped_at = time.monotonic()
    kafka.close()
    closed_in = time.monotonic() - stopped_at
    probe.run(until=stopped_at + OUTAGE_S)
    restart_began = time.monotonic()
    kafka.restart()
    restarted = time.monotonic()
    probe.stop()
    # The same cluster: the ports the agents know, the log dirs with the channel's partitions.
    assert kafka.bootstrap_servers == bootstrap
    assert all(b.pid is not None for b in kafka.brokers)
    assert sorted(str(p) for p in kafka.workdir.glob(f"node-*/data/{topic}-*")) == data_dirs
    early = [a for a in probe.new_topics if a.status == 200 and a.done < restart_began]
    refused = sorted({a.status for a in probe.new_topics if a.done < restart_began})
    _figure(
        f"Kafka closed in {closed_in:.1f}s, down {restart_began - stopped_at:.1f}s, restart took "
        f"{restarted - restart_began:.1f}s; held lookups {probe.held_ok} ok / {len(probe.bad)} not in "
        f"{probe.rounds} rounds; new topics during the outage: statuses {refused} in "
        f"{len(probe.new_topics)} tries"
    )
    reasons = sorted({(a.error or "")[:120] for a in probe.new_topics if a.status != 200})
    _figure(f"why new topics were refused meanwhile: {reasons[:5]}")
    assert not probe.bad, probe.bad[:10]
    assert probe.held_ok >= len(held) * 10, probe.held_ok
    assert not early, early[:3]
    assert leader.alive()

    with LookupStorm(cluster, tenant="kf", prefix="after", threads=4, timeout=5.0) as storm:
        wait_for(
            lambda: len(storm.ok()) >= 10,
            RECOVERY_BOUND_S + 30,
            interval=0.1,
            message=lambda: (
                f"new topics answered after the restart: {why_stalled(cluster, kafka, topic, storm)}"
            ),
        )
        first = storm.first_ok_sent_after(restarted)
        answers = storm.snapshot()
    assert first is not None
    recovery = first.done - restarted
    _figure(
        f"first new topic answered {recovery:.2f}s after the restart finished "
        f"({first.done - stopped_at:.1f}s after the stop)"
    )
    wait_for(lambda: fully_replicated(kafka, topic), 60, interval=0.2, message="replicas in sync")
    final = _agreed_table(cluster)
    answered = [*held, *answers, *(a for a in probe.new_topics if a.status == 200)]
    lost = lost_acknowledgements(answered, final)
    assert not lost, lost[:10]
    assert not probe.exited(), f"trimtab processes exited: {probe.exited()}"
    leaders = [n.name for n in cluster.controller_nodes if cluster.get(n, "/v1/leader").get("is_leader")]
    assert len(leaders) == 1, leaders
    check_single_owner(_timelines(cluster))
    assert recovery < RECOVERY_BOUND_S, recovery
