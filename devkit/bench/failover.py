"""The failover benchmark (docs/design.md sections 5.4 and 11): every bundle of a killed broker owned elsewhere
within detection time + 1 s for 10 000 bundles, never two owners.

A :class:`trimtab.devkit.localcluster.LocalCluster` -- real ZooKeeper, a real Apache Kafka (one KRaft broker),
``agents`` agents with simulated brokers and ``controllers`` controllers as separate processes -- with
``zookeeper.session_timeout_s`` as the detection time and ``healing.grace_s = 0``. Shedding and automatic
splits are off, so the only moves are healing's.

1. ``bundles`` bundles (the default layouts of ``bundles / per_namespace`` namespaces, which is also
   ``namespace.default_bundles``, so a later lookup finds the same bundles) are assigned to ONE broker, the
   victim, by writing ``Assigning{dst=victim, version=1}`` straight to the channel; the bench waits until
   its own channel replica (:class:`bench.common.ChannelWatch`) shows every one ``Owned`` by the victim and
   the victim's simulated broker serves them all.
2. ``kill -9`` of the victim's process group. From then on the bench records, on its own clock:
   the victim's ``brokers/<id>`` znode disappearing (a kazoo watch: the measured detection), the leader's
   ``admin/failed_brokers/<id>`` record appearing, the first forced override accepted, and -- from the
   writer timestamps of the ``Owned`` records -- when each bundle was owned again.
3. ``failover_s`` = kill -> the last of the victim's bundles ``Owned`` by a live broker. Target:
   ``<= detection_s + 1`` with ``detection_s`` = the configured session timeout.
4. Checks: every bundle ends ``Owned`` by a live broker in the bench's replica, the same in every
   surviving agent's table (``/v1/ownership?broker=``) and the leader's counts; each bundle was overridden
   exactly once after the kill (one accepted forced ``Assigning``, then ``Owned``); the survivors' simulated
   brokers acquired each bundle exactly once (timelines), never released one, and serve exactly the
   bundles the channel gives them. No process but the victim died.

The healing throttles (``healing.max_in_flight`` cluster-wide, ``healing.max_in_flight_per_broker``) bound
how many overrides are in flight: with the defaults (5 000 / 1 000) and 3 survivors at most 3 000 move at
once, so 10 000 bundles need several rounds. The run is repeated with raised throttles when the defaults
miss the target (``raised``), so both are visible.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import orjson
from kazoo.client import KazooClient

from trimtab.channel.bundles import BundleLayout
from trimtab.channel.kafka import KafkaTransport
from trimtab.channel.records import State, make
from trimtab.cluster.zk import ZkPaths
from trimtab.config.loader import load_settings
from trimtab.config.merge import deep_merge
from trimtab.config.settings import KafkaSettings, Settings
from trimtab.controller.stores import FailedBroker
from trimtab.devkit.bench.common import (
    BenchError,
    ChannelWatch,
    Progress,
    bench_workdir,
    environment,
    loadavg,
    percentile,
    progress_printer,
)
from trimtab.devkit.kafka_server import KafkaCluster
from trimtab.devkit.localcluster import LocalCluster, Node

SLACK_TARGET_S = 1.0
BENCH_PROCESS = "bench (replica)"
KAFKA_PROCESS = "kafka broker"  # a prefix: one entry per broker JVM, not trimtab's CPU
RAISED_THROTTLES = {"max_in_flight": 100_000, "max_in_flight_per_broker": 100_000}


def base_settings(session_timeout_s: float, per_namespace: int) -> dict[str, Any]:
    return {
        "zookeeper": {"session_timeout_s": session_timeout_s},
        # Its namespaces are created by lookups (namespace.auto_create: none by default).
        "namespace": {"default_bundles": per_namespace, "auto_create": ["bench-failover/*"]},
        "healing": {"grace_s": 0.0, "safe_mode_settle_s": 5.0},
        "shedding": {"enabled": False},
        "split": {"enabled": False},
    }


def bundle_names(bundles: int, per_namespace: int) -> list[str]:
    names: list[str] = []
    for i in range(math.ceil(bundles / per_namespace)):
        names.extend(BundleLayout.default(f"bench-failover/ns-{i}", per_namespace).bundles)
    return names[:bundles]


def _wait(cond: Any, timeout: float, what: str, progress: Progress, every: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    last = time.monotonic()
    while not cond():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
        if time.monotonic() - last > every:
            progress(f"still waiting for {what}...")
            last = time.monotonic()
        time.sleep(0.02)


def _healing_log(path: Path, since_wall: float) -> list[dict[str, Any]]:
    """The leader's ``healing_overrides`` lines after the kill: one per round that published something."""
    out: list[dict[str, Any]] = []
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return out
    for line in lines:
        if b"healing_overrides" not in line and b"broker_failure" not in line:
            continue
        try:
            e = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        ts = e.get("timestamp")
        if not ts:
            continue
        from datetime import datetime

        wall = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
        if wall < since_wall:
            continue
        out.append(
            {
                "t_s": round(wall - since_wall, 3),
                "event": e.get("event"),
                **{k: e[k] for k in ("published", "deferred", "change", "broker") if k in e},
            }
        )
    return out


def _cpu(nodes: Mapping[str, Any]) -> dict[str, float]:
    """CPU seconds (user + system) of each process so far, and of this one (the bench's replica)."""
    import psutil

    out: dict[str, float] = {}
    for name, n in nodes.items():
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(n.pid).cpu_times()
            out[name] = t.user + t.system
    me = os.times()
    out[BENCH_PROCESS] = me.user + me.system
    return out


def run_config(
    workdir: Path,
    overrides: Mapping[str, Any],
    *,
    bundles: int,
    per_namespace: int,
    agents: int,
    controllers: int,
    session_timeout_s: float,
    timeout_s: float,
    progress: Progress,
    standbys: int = 0,
) -> dict[str, Any]:
    """One run of steps 1-4 (module docstring) on a cluster of its own, with ``overrides`` over
    :func:`base_settings`: its figures, or :class:`BenchError` when a check fails. The cluster, the
    bench's channel replica and its ZooKeeper client are stopped however the run ends."""
    settings = deep_merge(base_settings(session_timeout_s, per_namespace), overrides)
    cluster = LocalCluster(
        workdir, brokers=agents, controllers=controllers, settings=settings, cluster_name="bench-failover"
    )
    progress(f"starting ZooKeeper, Kafka, {agents} agents and {controllers} controllers...")
    t_start = time.perf_counter()
    cluster.start()
    watch: ChannelWatch | None = None
    zk: KazooClient | None = None
    try:
        s = load_settings(cluster.config_path, environ=False)
        progress(f"cluster up in {time.perf_counter() - t_start:.1f} s")
        watch = _start_replica(cluster.bootstrap_servers, s.kafka)
        run = FailoverRun(cluster, watch, bundle_names(bundles, per_namespace), progress)
        setup_s, leader = run.give_the_victim_every_bundle(s.kafka)
        if standbys:
            run.wait_for_standbys()
        before_tl = cluster.timelines()
        zk = KazooClient(hosts=cluster.zk_hosts, timeout=10)
        zk.start(15)
        kill = run.kill_the_victim(zk, ZkPaths(s.zk_path), session_timeout_s + timeout_s)
        timings = channel_timings(
            watch.changes[kill.n_changes :], run.names, run.victim, run.survivors, kill.t_kill
        )
        gone = kill.zk.marks.get("broker_znode_gone")
        recorded = kill.zk.marks.get("failed_broker_recorded")
        if gone is None:
            raise BenchError("the victim's broker znode never disappeared")
        final, owners = run.check_every_view_agrees(leader)
        acquire_wall = run.check_survivor_brokers(final, before_tl, kill.t_kill)
        run.check_no_other_process_died()
        leader_view = run.leader_view(kill.t_kill)
    finally:
        stop_all(cluster, watch, zk)

    t_kill = kill.t_kill
    failover_s = timings.owned_ts[-1]
    target = session_timeout_s + SLACK_TARGET_S
    progress(
        f"failover {failover_s:.2f} s (target <= {target:.1f} s); znode gone after {gone - t_kill:.2f} s, "
        f"first override {timings.first_override[0] / 1000 - t_kill:.2f} s"
    )
    return {
        "failover_s": round(failover_s, 3),
        "failover_s_target": target,
        "detection_s": session_timeout_s,
        "detection_measured_s": round(gone - t_kill, 3),
        "failed_broker_recorded_s": round(recorded - t_kill, 3) if recorded else None,
        "first_override_s": round(timings.first_override[0] / 1000 - t_kill, 3),
        "failover_after_detection_s": round(failover_s - (gone - t_kill), 3),
        "meets_targets": {"failover_s": failover_s <= target},
        "settings": _settings_section(s, overrides, agents, controllers),
        "timeline_s": _timeline_section(kill, timings, gone, recorded),
        "healing": {
            "max_in_flight_observed": timings.max_in_flight,
            "max_in_flight_per_broker_observed": timings.max_per_dst,
            "overrides_accepted": sum(timings.overridden.values()),
            "final_owners": dict(owners),
            **_cpu_section(kill),
            "survivor_acquires": {
                b: {
                    "count": len(v),
                    "first_s": round(min(v), 3),
                    "last_s": round(max(v), 3),
                    "per_s": round(len(v) / max(1e-3, max(v) - min(v)), 1),
                }
                for b, v in sorted(acquire_wall.items())
            },
            **leader_view,
            "note": (
                "in flight = accepted forced Assigning not yet Owned, as the bench's replica saw them; "
                "leader_rounds = the leader's healing_overrides log lines after the kill (one per round "
                "that published), with published and deferred counts"
            ),
        },
        "setup_s": round(setup_s, 1),
        "bundles": len(run.names),
    }


def stop_all(cluster: LocalCluster, watch: ChannelWatch | None, zk: KazooClient | None) -> None:
    """The end of a run however it went: the bench's ZooKeeper client, its channel replica, the cluster."""
    if zk is not None:
        with contextlib.suppress(Exception):
            zk.stop()
            zk.close()
    if watch is not None:
        watch.stop()
    cluster.stop()


def _start_replica(bootstrap: str, k: KafkaSettings) -> ChannelWatch:
    """The bench's own channel replica, with the nodes' Kafka settings, caught up."""
    return ChannelWatch(
        bootstrap,
        k.channel_topic,
        fetch_wait_max_ms=k.fetch_wait_max_ms,
        linger_ms=k.linger_ms,
        client_config=dict(k.client_config),
    ).start()


class ZkMarks:
    """The kazoo watches on the victim's ``brokers/<id>`` znode and its ``admin/failed_brokers/<id>``
    record: when (wall-clock, on kazoo's thread) the znode disappeared -- the measured detection, with the
    CPU time of ``procs`` then -- and the leader recorded the failure. The znode only counts once
    :attr:`armed` is set, just before the kill."""

    def __init__(self, procs: Mapping[str, Any]) -> None:
        self.procs = procs
        self.armed = threading.Event()
        self.marks: dict[str, float] = {}  # broker_znode_gone, failed_broker_recorded -> time.time()
        self.first_failure_ms: list[int] = []  # the failed-broker record's first_failure
        self.cpu_at_detection: list[dict[str, float]] = []

    def broker_watch(self, data: bytes | None, stat: Any, event: Any = None) -> bool:
        if stat is None and self.armed.is_set():
            self.marks.setdefault("broker_znode_gone", time.time())
            self.cpu_at_detection.append(_cpu(self.procs))
            return False
        return True

    def failed_watch(self, data: bytes | None, stat: Any, event: Any = None) -> bool:
        if stat is not None and data:
            self.marks.setdefault("failed_broker_recorded", time.time())
            with contextlib.suppress(msgspec.DecodeError):
                self.first_failure_ms.append(msgspec.json.decode(data, type=FailedBroker).first_failure)
            return False
        return True


class MoveTracker:
    """A listener on the bench's channel replica that drops each bundle from :attr:`remaining` the moment
    a survivor owns it (on the replica's follower thread) and sets :attr:`done` when none remain, or as
    soon as one is left unowned. Event-driven, so waiting costs nothing while the cluster works: polling
    10 000 bundles every few ms would take a core the cluster needs on this box."""

    def __init__(self, names: list[str], survivors: set[str]) -> None:
        self.name_set = set(names)
        self.remaining = set(names)
        self.survivors = survivors
        self.unowned: list[str] = []
        self.done = threading.Event()

    def on_change(self, key: str, old: Any, new: Any) -> None:
        if key not in self.name_set:
            return
        if new is None or new.state is State.FREE:
            self.unowned.append(key)
            self.done.set()
        elif new.state is State.OWNED and new.dst in self.survivors and key in self.remaining:
            self.remaining.discard(key)
            if not self.remaining:
                self.done.set()


@dataclass
class KillObservation:
    """Step 2's measurements: wall-clock times (``time.time``), CPU seconds per process."""

    t_kill: float
    t_seen_all: float  # when the replica showed every bundle owned by a survivor
    n_changes: int  # the replica's changes before the kill; the failover's are the ones after
    zk: ZkMarks
    cpu0: dict[str, float]  # at the kill
    cpu1: dict[str, float]  # at t_seen_all
    cpu_heal: dict[str, float]  # from the znode's disappearance to t_seen_all; {} if it was not seen


class FailoverRun:
    """Steps 1, 2 and 4 of the module docstring on a started cluster, one method each; what they share --
    the cluster, the bench's channel replica, the victim (the first agent), its bundles -- lives here."""

    def __init__(self, cluster: LocalCluster, watch: ChannelWatch, names: list[str], progress: Progress):
        self.cluster = cluster
        self.watch = watch
        self.names = names
        self.name_set = set(names)
        self.progress = progress
        self.victim_node = cluster.agents[0]
        victim = self.victim_node.broker
        assert victim is not None
        self.victim = victim
        self.survivors = {n.broker for n in cluster.agents[1:] if n.broker is not None}

    # ---- 1. the victim owns every bundle

    def give_the_victim_every_bundle(self, k: KafkaSettings) -> tuple[float, Node]:
        """Assign every bundle to the victim through the channel, and wait until its broker serves them
        all and the leader counts them: the whole cluster has caught up, so the kill finds nothing in
        flight. Returns (seconds it took, the leader)."""
        names, victim = self.names, self.victim
        self.progress(f"assigning {len(names)} bundles to the victim {victim} through the channel...")
        t0 = time.perf_counter()
        self._write_assignments(k)
        _wait(
            lambda: self._owned_by_victim() == len(names),
            300,
            f"{len(names)} bundles Owned by the victim",
            self.progress,
        )
        victim_serving = len(self.cluster.get(self.victim_node, "/v1/sim/state")["serving"])
        if victim_serving != len(names):
            raise BenchError(f"the victim's broker serves {victim_serving} bundles, want {len(names)}")
        setup_s = time.perf_counter() - t0
        self.progress(f"the victim owns and serves all {len(names)} bundles ({setup_s:.1f} s)")
        leader = self.cluster.leader()
        if leader is None:
            raise BenchError("no leader")
        _wait(
            lambda: _leader_counts(self.cluster, leader).get(victim) == len(names),
            60,
            "the leader to see them",
            self.progress,
        )
        return setup_s, leader

    def wait_for_standbys(self) -> None:
        """With warm standbys on: wait until the survivors' brokers pre-warmed every bundle, so the kill
        measures a failover to warm standbys (the leader publishes them every standby_interval_s)."""
        wanted = set(self.names)

        def covered() -> int:
            warm: set[str] = set()
            for n in self.cluster.agents:
                if n.broker != self.victim:
                    warm.update(self.cluster.get(n, "/v1/sim/state").get("prewarmed", []))
            return len(warm & wanted)

        _wait(lambda: covered() == len(wanted), 120, "every bundle pre-warmed by a standby", self.progress)
        self.progress(f"every one of the {len(wanted)} bundles has a pre-warmed standby")

    def _write_assignments(self, k: KafkaSettings) -> None:
        """``Assigning{dst=victim, version=1}`` for every bundle, straight to the channel, all delivered."""
        writer = KafkaTransport(
            self.cluster.bootstrap_servers,
            client_config=dict(k.client_config),
            client_id="trimtab-bench-failover",
            linger_ms=k.linger_ms,
        )
        try:
            now = int(time.time() * 1000)
            futs = [
                writer.produce(
                    k.channel_topic,
                    b.encode(),
                    msgspec.json.encode(
                        make(State.ASSIGNING, dst=self.victim, version=1, ts=now, writer="bench")
                    ),
                )
                for b in self.names
            ]
            writer.flush(60)
            for f in futs:
                f.result(60)
        finally:
            writer.close()

    def _owned_by_victim(self) -> int:
        get = self.watch.table.get
        n = 0
        for b in self.names:
            r = get(b)
            if r is not None and r.state is State.OWNED and r.dst == self.victim:
                n += 1
        return n

    # ---- 2. kill -9 and watch

    def kill_the_victim(self, zk: KazooClient, paths: ZkPaths, wait_s: float) -> KillObservation:
        """``kill -9`` the victim's process group, then wait (at most ``wait_s`` after the kill) until a
        survivor owns every bundle; the kazoo watches time the detection and the failure record."""
        cluster, victim, victim_node = self.cluster, self.victim, self.victim_node
        if zk.exists(paths.broker(victim)) is None:
            raise BenchError("the victim's broker znode is missing before the kill")
        if zk.exists(f"{paths.failed_brokers}/{victim}") is not None:
            raise BenchError("the victim is already recorded as failed before the kill")
        procs: dict[str, Any] = {
            n.name: n for n in cluster.nodes.values() if n.alive() and n is not victim_node
        }
        if isinstance(cluster.kafka, KafkaCluster):
            procs.update({f"{KAFKA_PROCESS} {b.id}": b for b in cluster.kafka.brokers if b.pid})
        marks = ZkMarks(procs)
        zk.DataWatch(paths.broker(victim), marks.broker_watch)
        zk.DataWatch(f"{paths.failed_brokers}/{victim}", marks.failed_watch)
        n_changes = len(self.watch.changes)
        self.progress(f"kill -9 {victim_node.name} (pid {victim_node.pid})")
        cpu0 = _cpu(procs)
        marks.armed.set()
        t_kill = time.time()
        tracker = MoveTracker(self.names, self.survivors)
        self.watch.client.table.add_listener(tracker.on_change)
        cluster.kill(victim_node.name)
        self._wait_until_moved(tracker, time.monotonic() + wait_s)
        t_seen_all = time.time()
        cpu1 = _cpu(procs)
        at_detection = marks.cpu_at_detection
        cpu_heal = (
            {n: round(cpu1[n] - at_detection[0][n], 3) for n in cpu1 if n in at_detection[0]}
            if at_detection
            else {}
        )
        self.progress(
            f"all {len(self.names)} bundles owned again, seen {t_seen_all - t_kill:.2f} s after the kill"
        )
        time.sleep(0.5)  # let late duplicates (if any) land before the checks
        return KillObservation(t_kill, t_seen_all, n_changes, marks, cpu0, cpu1, cpu_heal)

    def _wait_until_moved(self, tracker: MoveTracker, deadline: float) -> None:
        names = self.names
        while not tracker.done.wait(5.0):
            if time.monotonic() > deadline:
                raise BenchError(
                    f"timed out: {len(tracker.remaining)} of {len(names)} bundles not owned by a survivor"
                )
            self.progress(
                f"still waiting: {len(tracker.remaining)} of {len(names)} bundles not yet owned by a survivor..."
            )
        if tracker.unowned:
            raise BenchError(
                f"healing left {tracker.unowned[0]} unowned (Free or tombstoned) instead of reassigning it"
            )

    # ---- 4. agreement and the brokers' own view

    def check_every_view_agrees(self, leader: Node) -> tuple[dict[str, Any], Counter[str]]:
        """Every bundle Owned by a survivor in the bench's replica, the same in each agent's table and in
        the leader's counts. Returns (bundle -> final record, survivor -> bundles it owns)."""
        cluster, names, name_set, survivors = self.cluster, self.names, self.name_set, self.survivors
        final = {b: self.watch.table.get(b) for b in names}
        owners = Counter(r.dst for r in final.values() if r is not None)
        if set(owners) - survivors or sum(owners.values()) != len(names):
            raise BenchError(f"final owners {dict(owners)} are not all survivors")
        for node in cluster.agents:
            got = cluster.get(node, "/v1/ownership", broker=node.broker)
            mine = {b for b in got["bundles"] if b in name_set}
            want = {b for b, r in final.items() if r is not None and r.dst == node.broker}
            if mine != want:
                raise BenchError(
                    f"{node.name}'s table gives it {len(mine)} of the bundles, the bench's {len(want)}"
                )
        counts = _leader_counts(cluster, leader)
        for b in survivors:
            if counts.get(b, 0) != owners.get(b, 0):
                raise BenchError(
                    f"the leader counts {counts.get(b)} bundles on {b}, the bench {owners.get(b, 0)}"
                )
        return final, owners

    def check_survivor_brokers(
        self, final: dict[str, Any], before_tl: dict[str, list[dict[str, Any]]], t_kill: float
    ) -> dict[str, list[float]]:
        """The survivors' simulated brokers acquired each bundle exactly once, its new owner did, none was
        released, and each is served by exactly its owner. Returns broker -> when it acquired each bundle
        (seconds after the kill, from its timeline)."""
        names = self.names
        acquired, acquired_by, acquire_wall, released = self._acquisitions_since(before_tl, t_kill)
        not_once = [b for b in names if acquired[b] != 1]
        if not_once:
            times = Counter(acquired[b] for b in not_once)
            raise BenchError(
                f"{len(not_once)} bundles not acquired exactly once by the survivors "
                f"({', '.join(f'{n} acquired {k} times' for k, n in sorted(times.items()))}; "
                f"{len(released)} fence/close/expire events), e.g. {not_once[:3]}"
            )
        if released:
            raise BenchError(f"survivors released bundles during failover: {released[:3]}")
        wrong = [b for b in names if acquired_by[b] != final[b].dst]
        if wrong:
            raise BenchError(
                f"{len(wrong)} bundles acquired by a broker that does not own them, e.g. {wrong[:3]}"
            )
        serving: Counter[str] = Counter()
        for node in self.cluster.agents:
            st = self.cluster.get(node, "/v1/sim/state")
            for b in st["serving"]:
                if b in self.name_set:
                    serving[b] += 1
                    if final[b].dst != st["broker"]:
                        raise BenchError(f"{st['broker']} serves {b}, owned by {final[b].dst}")
        if any(serving[b] != 1 for b in names):
            raise BenchError("a bundle is served by no survivor or by two")
        return acquire_wall

    def _acquisitions_since(
        self, before_tl: dict[str, list[dict[str, Any]]], t_kill: float
    ) -> tuple[Counter[str], dict[str, str], dict[str, list[float]], list[tuple[str, str, str]]]:
        """The brokers' timeline events since ``before_tl`` on the run's bundles: (acquisitions per bundle,
        who acquired each, broker -> acquire times after the kill, (broker, fence|close, bundle) events)."""
        acquired: Counter[str] = Counter()
        acquired_by: dict[str, str] = {}
        acquire_wall: dict[str, list[float]] = {}
        released: list[tuple[str, str, str]] = []
        for broker, tl in self.cluster.timelines().items():
            old = len(before_tl.get(broker, []))
            for e in tl[old:]:
                if e["bundle"] not in self.name_set:
                    continue
                if e["op"] == "acquire":
                    acquired[e["bundle"]] += 1
                    acquired_by[e["bundle"]] = broker
                    acquire_wall.setdefault(broker, []).append(e["wall_ms"] / 1000 - t_kill)
                elif e["op"] in ("fence", "close", "expire"):
                    released.append((broker, e["op"], e["bundle"]))
        return acquired, acquired_by, acquire_wall, released

    def check_no_other_process_died(self) -> None:
        dead = [
            n.name for n in self.cluster.nodes.values() if not n.alive() and n.name != self.victim_node.name
        ]
        if dead:
            raise BenchError(f"processes died during the run: {dead}")

    def leader_view(self, t_kill: float) -> dict[str, Any]:
        """The report's view of the current leader and the nodes, read while the cluster still runs."""
        cluster = self.cluster
        leader_now = cluster.leader()
        healing = cluster.get(leader_now, "/v1/healing") if leader_now else None
        rounds = _healing_log(leader_now.log, t_kill) if leader_now else []
        stats = self.watch.table.stats.detail()
        return {
            "leader_node": leader_now.name if leader_now else None,
            "survivor_nodes": {n.name: n.broker for n in cluster.agents},
            "leader_rounds": rounds,
            "leader_status": healing,
            "channel_replica_stats": stats,
        }


def _leader_counts(cluster: LocalCluster, leader: Node) -> dict[str, int]:
    """Bundles per broker, as the leader counts them."""
    st = cluster.get(leader, "/v1/status")
    return {b: v["bundles"] for b, v in st["brokers"].items()}


# ---- 3. timings from the channel


@dataclass
class OverrideTally:
    """The replica's accepted changes after the kill, tallied one at a time (:meth:`add`). Each of the
    run's bundles should get one forced ``Assigning`` off the victim to a survivor, then ``Owned``;
    anything else is a sequence error."""

    name_set: set[str]
    victim: str
    survivors: set[str]
    overridden: Counter[str] = field(default_factory=Counter)
    owned_at: dict[str, tuple[int, float]] = field(default_factory=dict)  # bundle -> (Owned ts ms, seen s)
    first_override: tuple[int, float] | None = None
    in_flight: int = 0
    max_in_flight: int = 0
    per_dst: Counter[str] = field(default_factory=Counter)
    max_per_dst: int = 0
    sequence_errors: list[str] = field(default_factory=list)

    def add(self, key: str, rec: Any, seen: float) -> None:
        if key not in self.name_set or rec is None:
            if key in self.name_set:
                self.sequence_errors.append(f"{key} tombstoned")
            return
        if rec.state is State.ASSIGNING:
            if not rec.force or rec.src != self.victim or rec.dst not in self.survivors:
                self.sequence_errors.append(f"{key}: unexpected {rec}")
            self.overridden[key] += 1
            if self.first_override is None:
                self.first_override = (rec.ts, seen)
            self.in_flight += 1
            self.per_dst[rec.dst or ""] += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.max_per_dst = max(self.max_per_dst, self.per_dst[rec.dst or ""])
        elif rec.state is State.OWNED:
            if key in self.owned_at:
                self.sequence_errors.append(f"{key} Owned twice after the kill")
            self.owned_at[key] = (rec.ts, seen)
            self.in_flight -= 1
            self.per_dst[rec.dst or ""] -= 1
        else:
            self.sequence_errors.append(f"{key}: unexpected {rec.state.value}")


@dataclass
class ChannelTimings:
    """Step 3: the failover as the channel recorded it, checked (see :func:`channel_timings`)."""

    overridden: Counter[str]  # bundle -> accepted forced overrides (1 each)
    first_override: tuple[int, float]  # (writer ts ms, seen at wall s)
    owned_ts: list[float]  # when each bundle was Owned again, s after the kill, writer clocks, sorted
    owned_seen: list[float]  # the same, when the replica applied it
    max_in_flight: int
    max_per_dst: int


def channel_timings(
    changes: list[tuple[str, Any, float]], names: list[str], victim: str, survivors: set[str], t_kill: float
) -> ChannelTimings:
    """Tally the replica's ``changes`` since the kill; every bundle must have been overridden exactly once
    and Owned again, with no other transition."""
    tally = OverrideTally(set(names), victim, survivors)
    for key, rec, seen in changes:
        tally.add(key, rec, seen)
    errors, overridden, owned_at = tally.sequence_errors, tally.overridden, tally.owned_at
    if errors:
        raise BenchError(f"{len(errors)} unexpected transitions, e.g. {errors[:3]}")
    twice = [b for b, n in overridden.items() if n != 1]
    if twice or len(overridden) != len(names):
        raise BenchError(
            f"overrides: {len(overridden)} bundles overridden, {len(twice)} not exactly once (e.g. {twice[:3]})"
        )
    if len(owned_at) != len(names):
        raise BenchError(f"{len(names) - len(owned_at)} bundles were never seen Owned again")
    assert tally.first_override is not None
    return ChannelTimings(
        overridden=overridden,
        first_override=tally.first_override,
        owned_ts=sorted(ts / 1000 - t_kill for ts, _ in owned_at.values()),
        owned_seen=sorted(seen - t_kill for _, seen in owned_at.values()),
        max_in_flight=tally.max_in_flight,
        max_per_dst=tally.max_per_dst,
    )


# ---- the report


def _settings_section(
    s: Settings, overrides: Mapping[str, Any], agents: int, controllers: int
) -> dict[str, Any]:
    h = s.healing
    return {
        "zookeeper.session_timeout_s": s.zookeeper.session_timeout_s,
        "healing.grace_s": h.grace_s,
        "healing.max_in_flight": h.max_in_flight,
        "healing.max_in_flight_per_broker": h.max_in_flight_per_broker,
        "healing.chunk_size": h.chunk_size,
        "healing.safe_mode_settle_s": h.safe_mode_settle_s,
        "namespace.default_bundles": s.namespace.default_bundles,
        "kafka.fetch_wait_max_ms": s.kafka.fetch_wait_max_ms,
        "kafka.linger_ms": s.kafka.linger_ms,
        "shedding.enabled": s.shedding.enabled,
        "split.enabled": s.split.enabled,
        "overrides": dict(overrides),
        "agents": agents,
        "controllers": controllers,
    }


def _timeline_section(
    kill: KillObservation, timings: ChannelTimings, gone: float, recorded: float | None
) -> dict[str, Any]:
    t_kill, first_override, first_failure_ms = kill.t_kill, timings.first_override, kill.zk.first_failure_ms
    owned_ts = timings.owned_ts
    return {
        "broker_znode_gone": round(gone - t_kill, 3),
        "failed_broker_recorded": round(recorded - t_kill, 3) if recorded else None,
        "failed_broker_first_failure": round(first_failure_ms[0] / 1000 - t_kill, 3)
        if first_failure_ms
        else None,
        "first_override_written": round(first_override[0] / 1000 - t_kill, 3),
        "first_override_seen": round(first_override[1] - t_kill, 3),
        "owned_again_p50": round(percentile(owned_ts, 50), 3),
        "owned_again_p90": round(percentile(owned_ts, 90), 3),
        "owned_again_last_written": round(owned_ts[-1], 3),
        "owned_again_last_seen": round(timings.owned_seen[-1], 3),
        "all_seen_by_polling": round(kill.t_seen_all - t_kill, 3),
        "clock": (
            "seconds after the kill; *_written from the records' writer timestamps (ms), *_seen when the "
            "bench's channel replica applied them, znode/failed-record times from kazoo watches here"
        ),
    }


def _cpu_section(kill: KillObservation) -> dict[str, Any]:
    cpu0, cpu1, cpu_heal = kill.cpu0, kill.cpu1, kill.cpu_heal
    ours = {n: v for n, v in cpu_heal.items() if n != BENCH_PROCESS and not n.startswith(KAFKA_PROCESS)}
    trimtab_cpu = sum(ours.values())
    return {
        "cpu_s_kill_to_all_owned": {name: round(cpu1[name] - cpu0[name], 3) for name in cpu1 if name in cpu0},
        "cpu_s_detection_to_all_owned": cpu_heal,
        "cpu_s_detection_to_all_owned_trimtab": round(trimtab_cpu, 3) if cpu_heal else None,
        "cpu_bound_floor_s": round(trimtab_cpu / (os.cpu_count() or 1), 3) if cpu_heal else None,
        "cpu_parallel_floor_s": round(max(ours.values()), 3) if ours else None,
        "cpu_note": (
            "CPU seconds each process used from the kill (or from the znode's disappearance: the healing "
            "work) until the bench saw every bundle owned again "
            f"({kill.t_seen_all - kill.t_kill:.2f} s of wall time after the kill, {os.cpu_count()} CPUs on the "
            "machine); cpu_bound_floor_s = the agents' and controllers' healing CPU spread perfectly over "
            "every CPU: the least failover_after_detection_s could be on this machine with nothing else "
            "running (the bench process and the Kafka brokers not counted); cpu_parallel_floor_s = "
            "the busiest single process's healing CPU: the floor with a core per process, as in a real "
            "deployment where every agent runs beside its own broker"
        ),
    }


# Taking over a bundle costs the simulated broker this much cold, and this much when it pre-warmed it.
COLD_ACQUIRE_MS = 20.0
WARM_ACQUIRE_MS = 1.0


def _warm_vs_cold(
    base: Path, extra: Mapping[str, Any], kw: Mapping[str, Any], replicas: int, progress: Progress
) -> dict[str, Any]:
    """The same failover twice with a broker model where taking over costs COLD_ACQUIRE_MS, or
    WARM_ACQUIRE_MS for a pre-warmed bundle: without standbys, then with ``replicas`` warm standbys."""
    model = deep_merge(
        dict(extra),
        {"sim": {"acquire_delay_ms": COLD_ACQUIRE_MS, "warm_acquire_delay_ms": WARM_ACQUIRE_MS}},
    )
    progress(f"cold: no standbys, {COLD_ACQUIRE_MS:g} ms per acquire...")
    cold = run_config(base / "cold", model, **kw, progress=progress)
    progress(f"warm: {replicas} standby per bundle, {WARM_ACQUIRE_MS:g} ms per pre-warmed acquire...")
    warm_settings = deep_merge(
        model, {"placement": {"standby_replicas": replicas, "standby_interval_s": 1.0}}
    )
    warm = run_config(base / "warm", warm_settings, **kw, progress=progress, standbys=replicas)
    keys = (*HEADLINE, "meets_targets")
    return {
        "replicas": replicas,
        "acquire_delay_ms": {"cold": COLD_ACQUIRE_MS, "pre_warmed": WARM_ACQUIRE_MS},
        "cold": {k: cold[k] for k in keys},
        "warm": {k: warm[k] for k in keys},
        "failover_after_detection_s": {
            "cold": cold["failover_after_detection_s"],
            "warm": warm["failover_after_detection_s"],
        },
    }


HEADLINE = (
    "failover_s",
    "failover_s_target",
    "detection_s",
    "detection_measured_s",
    "failed_broker_recorded_s",
    "first_override_s",
    "failover_after_detection_s",
)


def run(
    *,
    bundles: int = 10_000,
    per_namespace: int = 1000,
    agents: int = 4,
    controllers: int = 2,
    session_timeout_s: float = 4.0,
    raised: str = "auto",
    timeout_s: float = 180.0,
    settings: Mapping[str, Any] | None = None,
    workdir: Path | None = None,
    keep_workdir: bool = False,
    progress: Progress | None = None,
    standbys: int = 0,
) -> dict[str, Any]:
    """The whole benchmark; returns its JSON-ready result. Raises BenchError when a check fails.

    ``raised``: ``auto`` repeats the run with raised throttles if the defaults miss the target, ``always``
    repeats it anyway, ``never`` does not.
    """
    if agents < 3:
        raise ValueError("need at least 3 agents (the victim and 2 survivors; the mass-failure guard)")
    if raised not in ("auto", "always", "never"):
        raise ValueError("raised must be auto, always or never")
    progress = progress or progress_printer("failover")
    load_start = loadavg()
    kw: dict[str, Any] = {
        "bundles": bundles,
        "per_namespace": per_namespace,
        "agents": agents,
        "controllers": controllers,
        "session_timeout_s": session_timeout_s,
        "timeout_s": timeout_s,
    }
    with bench_workdir(workdir, "trimtab-bench-failover-", progress, keep=keep_workdir) as base:
        extra = dict(settings or {})
        main = run_config(base / "default", extra, **kw, progress=progress)
        alt = None
        if raised == "always" or (raised == "auto" and not main["meets_targets"]["failover_s"]):
            progress(f"repeating with raised throttles {RAISED_THROTTLES}...")
            raised_settings = deep_merge(extra, {"healing": RAISED_THROTTLES})
            alt = run_config(base / "raised", raised_settings, **kw, progress=progress)
        warm_vs_cold = _warm_vs_cold(base, extra, kw, standbys, progress) if standbys else None
    out: dict[str, Any] = {"bench": "failover"}
    out.update({k: main[k] for k in HEADLINE})
    out["meets_targets"] = main["meets_targets"]
    out["bundles"] = main["bundles"]
    out["settings"] = main["settings"]
    out["timeline_s"] = main["timeline_s"]
    out["healing"] = main["healing"]
    out["setup_s"] = main["setup_s"]
    out["raised_throttles"] = (
        {k: alt[k] for k in (*HEADLINE, "meets_targets", "settings", "timeline_s", "healing")}
        if alt
        else None
    )
    out["raised_throttles_run"] = {
        "auto": "only when the default throttles miss the target",
        "always": "always",
        "never": "never",
    }[raised]
    out["standbys"] = warm_vs_cold
    out["checks"] = {
        "every_bundle_owned_by_a_survivor_in_the_bench_replica": True,
        "every_survivor_agent_table_agrees": True,
        "leader_counts_agree": True,
        "each_bundle_overridden_exactly_once": True,
        "each_bundle_acquired_exactly_once_by_its_new_owner": True,
        "no_survivor_released_a_bundle": True,
        "each_bundle_served_by_exactly_one_survivor": True,
        "no_other_process_died": True,
        "note": "any failed check aborts the bench with a non-zero exit before this JSON is printed",
    }
    out["env"] = environment(load_start, "confluent-kafka", "kazoo", "msgspec")
    return out
