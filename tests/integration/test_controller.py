"""Process-level tests of the leader-elected controller (issue "The leader-elected controller", section 8).

Real components only (docs/design.md sections 9 and 10): a real ZooKeeper server, the real Kafka protocol
against the librdkafka mock cluster this process owns, and agents (each beside its built-in simulated
broker) and controllers running as real ``trimtab`` processes (:class:`trimtab.devkit.localcluster.LocalCluster`).
Timers are fast (:data:`FAST`); tests synchronise only by waiting for conditions with deadlines.

Three clusters, one per test class, each torn down when its class is done (so at most one runs at a time
on a 2-core machine):

* :class:`TestBalancing` -- 3 agents, 2 controllers, a skewed synthetic load: shedding, snapshots, the
  admin API (the last test kills the leader).
* :class:`TestFailover` -- 4 agents, 2 controllers, 384 bundles, tight healing throttles: an agent killed
  with SIGKILL, then another one killed and the *leader* killed in the middle of the reassignment.
* :class:`TestZooKeeper` -- 3 agents, 2 controllers, a 15 s healing grace, ZooKeeper on a fixed port: a
  broker that returns within the grace; then (with two fresh controllers: no grace, an 8 s settle period)
  a ZooKeeper outage with an agent killed during it.

The safety property is checked on the simulated brokers' own acquire/fence/close timelines (one monotonic
clock for every process on the machine, :func:`tests.support.timeline.check_single_owner`): no bundle is
ever served by two brokers at overlapping times. "What the controller wrote" is checked by replaying the
channel topic in this process (:class:`channel.table.TableView`, accepted transitions only).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import orjson
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.retry import KazooRetry
from prometheus_client.parser import text_string_to_metric_families

from tests.support.procs import Procs
from tests.support.timeline import check_single_owner
from tests.support.topics import topic_in
from tests.support.victims import agent_owning_most
from tests.support.waiting import wait_for
from trimtab.channel.bundles import BundleLayout, parse_bundle
from trimtab.channel.client import ChannelClient
from trimtab.channel.kafka import KafkaTransport
from trimtab.channel.records import Record, State
from trimtab.channel.replayfile import table_report
from trimtab.channel.snapshot import Manifest, read_all
from trimtab.channel.table import TableView, replay
from trimtab.channel.transport import Message
from trimtab.cluster.zk import ZkPaths
from trimtab.config.loader import load_settings
from trimtab.config.settings import Settings
from trimtab.devkit.localcluster import ClusterError, LocalCluster, Node
from trimtab.devkit.zkserver import free_port

pytestmark = pytest.mark.integration

# The timers of the issue: seconds instead of minutes.
FAST: dict[str, Any] = {
    "load": {"report_interval_s": 0.5, "report_max_interval_s": 5},
    "zookeeper": {"session_timeout_s": 3},
    "shedding": {"interval_s": 1, "hit_count_threshold": 1, "broker_cooldown_s": 2, "bundle_grace_s": 10},
    "channel": {"monitor_interval_s": 1, "snapshot_interval_s": 2, "in_flight_timeout_s": 5},
    "healing": {"safe_mode_settle_s": 3},
}
SESSION_TIMEOUT = 3.0  # FAST["zookeeper"]["session_timeout_s"]


def merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


# ---------------------------------------------------------------------------------------------- helpers


def namespace_of(bundle: str) -> str:
    return bundle.rsplit("/", 1)[0]


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (dict(s.labels), float(s.value))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    ]


def acquisitions(timeline: list[dict[str, Any]], bundle: str, after_ns: int) -> int:
    return sum(
        1 for e in timeline if e["op"] == "acquire" and e["bundle"] == bundle and e["mono_ns"] > after_ns
    )


def served_again(timeline: list[dict[str, Any]], bundle: str, after_ns: int) -> int:
    """How many times the broker stopped serving ``bundle`` after ``after_ns`` (its lease expired, or its
    agent fenced or closed it, e.g. on losing its ZooKeeper session under load): each one lets the same
    broker acquire the bundle once more, which is recovery, not a second reassignment."""
    return sum(
        1
        for e in timeline
        if e["op"] in ("expire", "fence", "close") and e["bundle"] == bundle and e["mono_ns"] > after_ns
    )


def events_of(
    timelines: dict[str, list[dict[str, Any]]], bundle: str, after_ns: int
) -> list[tuple[str, str]]:
    return [
        (broker, e["op"])
        for broker, tl in timelines.items()
        for e in sorted(tl, key=lambda e: e["mono_ns"])
        if e["bundle"] == bundle and e["mono_ns"] > after_ns
    ]


@dataclass
class Accepted:
    key: str
    old: Record | None
    new: Record | None
    partition: int
    offset: int


@dataclass
class Harness:
    """One LocalCluster plus the test's own clients (ZooKeeper, Kafka) and what it remembers."""

    cluster: LocalCluster
    settings: Settings
    zk: KazooClient
    paths: ZkPaths
    transport: KafkaTransport
    bundles: list[str] = field(default_factory=list)
    # Brokers killed so far: broker -> (timeline captured just before the kill, death time, monotonic ns).
    dead: dict[str, tuple[list[dict[str, Any]], int]] = field(default_factory=dict)

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def start(
        cls,
        workdir: Path,
        *,
        brokers: int,
        controllers: int,
        settings: Mapping[str, Any],
        zk_port: int = 0,
    ) -> Harness:
        cluster = LocalCluster(
            workdir, brokers=brokers, controllers=controllers, settings=settings, zk_port=zk_port
        )
        cluster.start(timeout=120)
        zk: KazooClient | None = None
        try:
            s = load_settings(cluster.config_path, environ=False)
            zk = KazooClient(
                hosts=cluster.zk_hosts,
                timeout=10,
                connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=1.5, max_delay=0.5),
            )
            zk.start(timeout=15)
            transport = KafkaTransport(cluster.bootstrap_servers, client_id="test-controller")
            return cls(cluster, s, zk, ZkPaths(s.zk_path), transport)
        except BaseException:
            if zk is not None:
                zk.stop()
                zk.close()
            cluster.stop()
            raise

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.zk.stop()
            self.zk.close()
        with contextlib.suppress(Exception):
            self.transport.close()
        self.cluster.stop()

    # ------------------------------------------------------------------ nodes and HTTP
    def leader(self, timeout: float = 30.0) -> Node:
        return wait_for(self.cluster.leader, timeout, interval=0.1, message="a controller leads")

    def status(self, node: Node | None = None) -> dict[str, Any]:
        return dict(self.cluster.get(node or self.leader(), "/v1/status"))

    def metrics(self, node: Node) -> str:
        r = httpx.get(f"{node.http}/metrics", timeout=10)
        r.raise_for_status()
        return r.text

    def metric(self, node: Node, name: str, **labels: str) -> float:
        return sum(
            v
            for lbl, v in metric_samples(self.metrics(node), name)
            if all(lbl.get(k) == x for k, x in labels.items())
        )

    def records(self, via: Node | None = None) -> dict[str, dict[str, Any]]:
        return self.cluster.ownership(via or self.leader())

    def owners(self, via: Node | None = None) -> dict[str, str | None]:
        """bundle -> owner (None unless Owned)."""
        return {b: r["dst"] if r["state"] == "owned" else None for b, r in self.records(via).items()}

    def owned_by(self, broker: str, via: Node | None = None) -> list[str]:
        return sorted(b for b, o in self.owners(via).items() if o == broker)

    def view(self, via: Node) -> dict[str, tuple[str, str | None]]:
        return {b: (r["state"], r["dst"]) for b, r in self.cluster.ownership(via).items()}

    def agent(self, broker: str) -> Node:
        return self.cluster.by_broker(broker)

    def live_brokers(self) -> list[str]:
        return sorted(n.broker for n in self.cluster.agents if n.broker)

    def lookup(self, topic: str, via: Node | None = None, timeout: float = 60.0) -> dict[str, Any]:
        return wait_for(
            lambda: self.cluster.lookup(topic, via),
            timeout,
            interval=0.2,
            message=f"lookup of {topic}",
            ignore=(ClusterError, httpx.HTTPError),
        )

    def assign(self, namespaces: list[str], per_namespace: int) -> None:
        """Give every bundle of ``namespaces`` an owner by looking up one topic in each."""
        self.bundles = [b for ns in namespaces for b in BundleLayout.default(ns, per_namespace).bundles]
        with ThreadPoolExecutor(24) as pool:
            list(pool.map(lambda b: self.lookup(topic_in(b)), self.bundles))
        wait_for(
            lambda: (o := self.owners()) and all(o.get(b) for b in self.bundles),
            60,
            interval=0.2,
            message="every bundle owned in the leader's view",
        )

    def set_paused(self, paused: bool) -> None:
        r = self.cluster.post(self.leader(), "/v1/admin/shedding", {"paused": paused, "by": "test"})
        assert r.status_code == 200, r.text
        assert r.json()["shedding_paused"] is paused

    def hold_shedding(self) -> Node:
        """Pause shedding, so only the test moves bundles (what it reads stays true while it acts), and
        return the leader."""
        self.set_paused(True)
        return self.leader()

    def follower(self, leader: Node) -> Node:
        """A controller that is not ``leader``."""
        return next(n for n in self.cluster.controller_nodes if n is not leader)

    def owned_bundles(self, via: Node | None = None) -> list[str]:
        """The test's bundles that have an owner, sorted: tests pick theirs by position."""
        owners = self.owners(via)
        return sorted(b for b in self.bundles if owners.get(b))

    def timelines(self) -> dict[str, list[dict[str, Any]]]:
        """Every simulated broker's timeline: live ones now, killed ones as captured before the kill."""
        out = {b: tl for b, (tl, _) in self.dead.items()}
        out.update(self.cluster.timelines())
        return out

    def check_single_owner(self) -> None:
        check_single_owner(self.timelines(), {b: t for b, (_, t) in self.dead.items()})

    def sigkill_agent(self, node: Node) -> int:
        """Capture the broker's timeline, SIGKILL the agent (its simulated broker dies with it), and
        return the death time (monotonic ns, after the process is gone)."""
        assert node.broker is not None
        timeline = self.cluster.get(node, "/v1/sim/state")["timeline"]
        self.cluster.kill(node.name, signal.SIGKILL)
        node.proc.wait(10)
        died = time.monotonic_ns()
        self.dead[node.broker] = (timeline, died)
        return died

    def sigkill(self, node: Node) -> None:
        self.cluster.kill(node.name, signal.SIGKILL)
        node.proc.wait(10)

    # ------------------------------------------------------------------ ZooKeeper
    def failed_record(self, broker: str) -> dict[str, Any] | None:
        try:
            data, _ = self.zk.get(f"{self.paths.failed_brokers}/{broker}")
        except NoNodeError:
            return None
        return dict(orjson.loads(data))

    def plan_chunks(self, broker: str) -> list[str]:
        try:
            return list(self.zk.get_children(f"{self.paths.reassignments}/{broker}"))
        except NoNodeError:
            return []

    # ------------------------------------------------------------------ Kafka
    @property
    def channel_topic(self) -> str:
        return self.settings.kafka.channel_topic

    def watermarks(self) -> dict[int, int]:
        n = self.transport.partitions(self.channel_topic)
        return {p: self.transport.watermarks(self.channel_topic, p)[1] for p in range(n)}

    def channel_messages(self) -> list[Message]:
        return list(read_all(self.transport, self.channel_topic))

    def accepted(self, messages: list[Message] | None = None) -> list[Accepted]:
        """Replay the channel in this process and return every accepted transition, in log order."""
        msgs = self.channel_messages() if messages is None else messages
        view = TableView(partitions=self.transport.partitions(self.channel_topic))
        view.set_live()
        out: list[Accepted] = []
        cur: list[tuple[int, int]] = [(0, 0)]
        view.add_listener(lambda k, old, new: out.append(Accepted(k, old, new, *cur[0])))
        for m in msgs:
            cur[0] = (m.partition, m.offset)
            view.apply(m.key, m.value, m.partition, m.offset)
        return out

    def events(self, kind: str) -> list[dict[str, Any]]:
        out = []
        for m in read_all(self.transport, self.settings.kafka.events_topic):
            with contextlib.suppress(orjson.JSONDecodeError):
                e = orjson.loads(m.value or b"{}")
                if e.get("kind") == kind:
                    out.append(e)
        return sorted(out, key=lambda e: e["ts"])

    def describe(self) -> str:
        """The leader's view, for failure messages (never waits for a leader)."""
        try:
            leader = self.cluster.leader()
            st = self.status(leader) if leader is not None else {"controller": "no leader"}
            brief = {k: st.get(k) for k in ("controller", "term", "safe_mode", "brokers", "load", "healing")}
        except Exception as e:
            brief = {"status": repr(e)}
        return f"{orjson.dumps(brief).decode()} (logs: {self.cluster.workdir / 'logs'})"


def forced_off(history: list[Accepted], broker: str) -> list[Accepted]:
    """Accepted forced records that take a bundle off ``broker`` (its src is the broker)."""
    return [a for a in history if a.new is not None and a.new.force and a.new.src == broker]


class ForcedWatch:
    """A live channel follower in the test process that counts accepted forced overrides off one broker
    (to kill the leader while a reassignment is under way)."""

    def __init__(self, h: Harness, broker: str) -> None:
        self.broker = broker
        self.bundles: set[str] = set()
        self._lock = threading.Lock()
        self.transport = KafkaTransport(h.cluster.bootstrap_servers, client_id="test-forced-watch")
        self.client = ChannelClient(self.transport, h.channel_topic, None, use_snapshot=False)
        self.client.table.add_listener(self._on)

    def _on(self, key: str, old: Record | None, new: Record | None) -> None:
        if new is not None and new.force and new.src == self.broker:
            with self._lock:
                self.bundles.add(key)

    def count(self) -> int:
        with self._lock:
            return len(self.bundles)

    def __enter__(self) -> ForcedWatch:
        try:
            self.client.start()
            assert self.client.wait_ready(30), f"test channel follower not ready: {self.client.error}"
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.stop()
        self.transport.close()


# ================================================================================================ balancing

HOT = ["public/ns-0", "public/ns-1"]
BALANCE_NAMESPACES = [f"public/ns-{i}" for i in range(6)]
BALANCE_SETTINGS = merge(
    FAST,
    {
        # 6 namespaces x 4 bundles; the two hot ones carry 4x the load. Piled on one broker that reads about
        # [0.96, 0.14, 0.14] (std ~0.39 > 0.25); spread out, every broker is near 0.41.
        "sim": {"msg_rate_per_topic": 40.0, "namespace_scale": dict.fromkeys(HOT, 4.0)},
        "namespace": {"default_bundles": 4},
    },
)


@pytest.fixture(scope="class")
def balance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    h = Harness.start(tmp_path_factory.mktemp("balance"), brokers=3, controllers=2, settings=BALANCE_SETTINGS)
    try:
        h.assign(BALANCE_NAMESPACES, 4)
        yield h
    finally:
        h.close()


@pytest.mark.slow
class TestBalancing:
    def test_skewed_load_is_shed_until_the_std_is_below_target(self, balance: Harness) -> None:
        h, c = balance, balance.cluster
        target = h.settings.shedding.target_std
        leader = h.leader()
        hot_broker = c.agents[0].broker
        assert hot_broker is not None
        # Hold the shedder while the skew is built, so the skew is observable before it is undone.
        h.set_paused(True)
        hot_bundles = [b for b in h.bundles if namespace_of(b) in HOT]
        for b, owner in h.owners().items():
            if b in hot_bundles and owner != hot_broker:
                r = c.post(leader, "/v1/admin/transfer", {"bundle": b, "broker": hot_broker})
                assert r.status_code == 202, r.text
        wait_for(
            lambda: (o := h.owners()) and all(o.get(b) == hot_broker for b in hot_bundles),
            30,
            interval=0.1,
            message="the hot namespaces' bundles all on one broker",
        )

        def skew_reported() -> dict[str, Any] | None:
            # The loads reported since the transfers: the hot broker the most loaded, std above target.
            st = h.status(leader)
            loads = {b: v["load"] or 0.0 for b, v in st["brokers"].items()}
            top = max(loads, key=lambda b: loads[b])
            return st if top == hot_broker and st["load"]["std"] > target else None

        skewed = wait_for(
            skew_reported,
            30,
            interval=0.2,
            message=lambda: f"load std above {target}, the hot broker the most loaded: {h.describe()}",
        )

        def shed_moves_published() -> float:
            return sum(
                v
                for lbl, v in metric_samples(h.metrics(leader), "trimtab_unloads_total")
                if lbl.get("reason") != "admin"
            )

        before = shed_moves_published()
        resumed_ms = int(time.time() * 1000)
        h.set_paused(False)
        final = wait_for(
            lambda: (st := h.status(leader))["load"]["std"] < target and st,
            90,
            interval=0.2,
            message=lambda: f"load std below {target}: {h.describe()}",
        )
        assert final["term"] == skewed["term"], "the leader changed during the test"

        # The shedder (not an operator) moved bundles: metric, events and channel agree.
        published = shed_moves_published() - before
        assert published >= 1

        def moves() -> list[dict[str, Any]]:
            return [
                {**m, "ts": e["ts"]}
                for e in h.events("shed")
                if e["ts"] >= resumed_ms
                for m in e.get("moves", [])
            ]

        shed = wait_for(
            lambda: (ms := moves()) and len(ms) >= published and ms,
            15,
            message="every shedding move has its event",
        )
        assert {m["reason"] for m in shed} <= {"overloaded", "underloaded"}
        assert any(m["src"] == hot_broker for m in shed), shed
        assert all(m["dst"] and m["dst"] != m["src"] for m in shed), shed

        def moved_bundles_owned_by_their_destination() -> bool:
            last = {m["bundle"]: m for m in moves()}
            owners = h.owners(leader)
            return all(owners.get(b) == m["dst"] for b, m in last.items())

        wait_for(
            moved_bundles_owned_by_their_destination,
            30,
            interval=0.2,
            message="every bundle the shedder moved is Owned by its destination",
        )
        # In the channel: the moves are the leader's Releasing transfers, accepted.
        history = h.accepted()
        shed_releases = {
            a.key
            for a in history
            if a.new is not None
            and a.new.state is State.RELEASING
            and a.new.dst is not None
            and a.new.writer.startswith("controller:")
            and a.new.ts >= resumed_ms
        }
        assert {m["bundle"] for m in shed} <= shed_releases
        h.check_single_owner()

    def test_snapshot_plus_tail_equals_a_full_replay(self, balance: Harness, procs: Procs) -> None:
        h = balance
        leader = h.leader()
        wait_for(
            lambda: h.metric(leader, "trimtab_snapshots_total", result="written") > 0,
            30,
            interval=0.2,
            message="the leader wrote a snapshot",
        )
        cfg = str(h.cluster.config_path)

        def dumps() -> tuple[dict[str, Any], dict[str, Any], list[Message]] | None:
            before = h.watermarks()
            snap = procs.run_trimtab("channel", "dump", "--json", "--config", cfg, timeout=90).check().json()
            full = (
                procs.run_trimtab("channel", "dump", "--json", "--no-snapshot", "--config", cfg, timeout=90)
                .check()
                .json()
            )
            messages = h.channel_messages()
            # Only comparable if the channel did not move between the two reads.
            return (snap, full, messages) if h.watermarks() == before else None

        snap, full, messages = wait_for(dumps, 150, interval=0.5, message="two dumps of a quiet channel")
        assert "snapshot" not in full
        sid = snap.get("snapshot")
        assert isinstance(sid, str) and sid, snap.keys()
        assert snap["table"] == full["table"]
        assert len(snap["table"]) >= len(h.bundles)
        # ...and both equal this process's own full replay of the same log.
        n = h.transport.partitions(h.channel_topic)
        ours = orjson.loads(orjson.dumps(table_report(replay(messages, partitions=n))))
        assert full["table"] == ours["table"]
        # The snapshot really was used: only the tail after it was replayed.
        assert snap["stats"]["accepted"] < full["stats"]["accepted"]
        # The id names a manifest the leader wrote.
        manifests = [
            msgspec.json.decode(m.value, type=Manifest)
            for m in read_all(h.transport, h.settings.kafka.snapshot_topic)
            if m.key is not None and m.key.startswith(b"manifest") and m.value is not None
        ]
        mine = [m for m in manifests if m.id == sid]
        assert mine, f"snapshot {sid} not among the manifests {[m.id for m in manifests][-5:]}"
        assert mine[0].writer == h.cluster.get(leader, "/v1/leader")["me"]
        assert mine[0].channel == h.channel_topic

    # ---- the admin API. Each test holds the shedder first (so only the test moves bundles) and picks its
    # own bundle among the owned ones; the last one kills the leader.

    def test_leader_and_follower_agree_on_the_leader(self, balance: Harness) -> None:
        h, c = balance, balance.cluster
        leader = h.leader()
        leader_info = c.get(leader, "/v1/leader")
        assert leader_info["is_leader"] is True and leader_info["safe_mode"] is None
        term = leader_info["leader"]["term"]
        assert leader_info["leader"]["id"] == leader_info["me"]
        follower_info = c.get(h.follower(leader), "/v1/leader")
        assert follower_info["is_leader"] is False
        assert follower_info["leader"]["id"] == leader_info["me"] and follower_info["leader"]["term"] == term

    def test_admin_write_to_a_follower_is_redirected_to_the_leader(self, balance: Harness) -> None:
        h, c = balance, balance.cluster
        leader = h.leader()
        follower = h.follower(leader)
        # Redirected with 307, so the method and body are kept.
        r = httpx.post(
            f"{follower.http}/v1/admin/shedding",
            json={"paused": True, "by": "test"},
            headers=c.auth_headers(),
            follow_redirects=False,
        )
        assert r.status_code == 307, r.text
        assert r.headers["location"] == f"{leader.http}/v1/admin/shedding"
        r = c.post(follower, "/v1/admin/shedding", {"paused": True, "by": "test"})
        assert r.status_code == 200 and r.json()["shedding_paused"] is True
        assert h.status(leader)["shedding"]["paused"] is True
        data, _ = h.zk.get(h.paths.controller_state)
        assert orjson.loads(data)["shedding_paused"] is True

    def test_admin_lists_the_brokers_with_their_load(self, balance: Harness) -> None:
        h, c = balance, balance.cluster
        leader = h.leader()
        brokers = c.get(leader, "/v1/brokers")["brokers"]
        assert sorted(brokers) == h.live_brokers()
        for b, info in brokers.items():
            assert info["info"]["id"] == b
            assert info["load"] is not None and info["load"]["broker"] == b

    def test_admin_lists_ownership_whole_and_filtered(self, balance: Harness) -> None:
        h, c = balance, balance.cluster
        leader = h.hold_shedding()
        everything = c.get(leader, "/v1/ownership")
        assert everything["count"] == len(everything["bundles"]) >= len(h.bundles)
        owners = h.owners(leader)
        for b in h.live_brokers():
            mine = c.get(leader, "/v1/ownership", broker=b)["bundles"]
            assert sorted(mine) == sorted(k for k, o in owners.items() if o == b)
        ns2 = c.get(leader, "/v1/ownership", namespace="public/ns-2")["bundles"]
        assert ns2 and all(namespace_of(k) == "public/ns-2" for k in ns2)

    def test_admin_transfer_moves_a_bundle_to_another_broker(self, balance: Harness) -> None:
        h, c = balance, balance.cluster
        leader = h.hold_shedding()
        bundle = h.owned_bundles(leader)[0]
        src = h.owners(leader)[bundle]
        assert src is not None
        dst = next(b for b in h.live_brokers() if b != src)
        r = c.post(leader, "/v1/admin/transfer", {"bundle": bundle, "broker": dst})
        assert r.status_code == 202, r.text
        assert r.json()["record"]["state"] == "releasing" and r.json()["record"]["dst"] == dst
        wait_for(lambda: h.owners(leader).get(bundle) == dst, 20, interval=0.1, message=f"{bundle} on {dst}")
        wait_for(
            lambda: (
                bundle in c.get(h.agent(dst), "/v1/sim/state")["serving"]
                and bundle not in c.get(h.agent(src), "/v1/sim/state")["serving"]
            ),
            20,
            interval=0.1,
            message="the destination broker serves it and the source does not",
        )

    def test_admin_transfer_refuses_bad_requests(self, balance: Harness) -> None:
        h, c = balance, balance.cluster
        leader = h.hold_shedding()
        bundle = h.owned_bundles(leader)[0]
        owner = h.owners(leader)[bundle]
        # To its current owner: 400; to a broker that does not exist: 400; an unknown bundle: 404.
        r = c.post(leader, "/v1/admin/transfer", {"bundle": bundle, "broker": owner})
        assert r.status_code == 400 and "already owned" in r.json()["error"]
        r = c.post(leader, "/v1/admin/transfer", {"bundle": bundle, "broker": "127.0.0.1:1"})
        assert r.status_code == 400, r.text
        r = c.post(
            leader, "/v1/admin/transfer", {"bundle": "nobody/here/0x00000000_0xffffffff", "broker": owner}
        )
        assert r.status_code == 404, r.text
        r = c.post(leader, "/v1/admin/transfer", {"bundle": "not a bundle", "broker": owner})
        assert r.status_code == 400, r.text

    def test_admin_unload_frees_a_bundle_and_a_lookup_assigns_it_again(self, balance: Harness) -> None:
        h, c = balance, balance.cluster
        leader = h.hold_shedding()
        victim = h.owned_bundles(leader)[1]  # not the one the transfer test moved
        was = h.owners(leader)[victim]
        assert was is not None
        r = c.post(leader, "/v1/admin/unload", {"bundle": victim})
        assert r.status_code == 202, r.text
        wait_for(
            lambda: h.records(leader).get(victim, {}).get("state") == "free",
            20,
            interval=0.1,
            message=f"{victim} Free after the unload",
        )
        assert victim not in c.get(h.agent(was), "/v1/sim/state")["serving"]
        got = h.lookup(topic_in(victim))
        assert got["bundle"] == victim and got["how"] == "assigned"
        wait_for(
            lambda: h.owners(leader).get(victim) == got["owner"],
            20,
            interval=0.1,
            message=f"{victim} Owned again after the lookup",
        )

    def test_admin_split_is_forwarded_to_the_owner_and_its_children_stay_there(
        self, balance: Harness
    ) -> None:
        h, c = balance, balance.cluster
        leader = h.hold_shedding()
        parent = h.owned_bundles(leader)[2]  # neither the transferred nor the unloaded one
        owner = h.owners(leader)[parent]
        r = c.post(leader, "/v1/admin/split", {"bundle": parent})
        assert r.status_code == 202, r.text
        body = r.json()
        assert body["bundle"] == parent and body["reason"] == "admin" and len(body["children"]) == 2
        children = body["children"]
        # The parent stays Deleted (until the tombstone delay) so an outdated layout cannot re-assign it.
        wait_for(
            lambda: (
                (r := h.records(leader))
                and all(r.get(k, {}).get("state") == "owned" and r[k]["dst"] == owner for k in children)
                and r.get(parent, {"state": "deleted"})["state"] == "deleted"
            ),
            20,
            interval=0.1,
            message=f"{parent} split into {children} on {owner}",
        )
        _, rng = parse_bundle(parent)
        kids = sorted(parse_bundle(k)[1] for k in children)
        assert (kids[0].lower, kids[0].upper, kids[1].upper) == (rng.lower, kids[1].lower, rng.upper)
        # A topic of the old range now lives in a child, owned by the same broker, from any agent -- once
        # that agent has read the split from the channel (each replays it on its own; until then it may
        # still answer the parent and its owner, the same broker).
        probe = topic_in(parent, prefix="after-split")
        for node in c.agents:
            wait_for(
                lambda node=node: h.records(node).get(parent, {"state": "deleted"})["state"] == "deleted",
                20,
                interval=0.05,
                message=f"{node.name} has read the split of {parent}",
            )
            got = h.lookup(probe, via=node)
            assert got["bundle"] in children and got["owner"] == owner, got
        assert h.owners(leader).get(parent) is None
        # The leader recorded the split as an operation (issue 32), followed to its end; it refuses to
        # cancel it, with the reason.
        split_op = wait_for(
            lambda: next(
                (
                    d
                    for o in c.get(leader, "/v1/admin/ops")
                    if o["kind"] == "split"
                    and (d := c.get(leader, f"/v1/admin/ops/{o['id']}"))["target"] == parent
                    and d["state"] == "done"
                ),
                None,
            ),
            20,
            interval=0.2,
            message=lambda: f"a done split operation of {parent}: {c.get(leader, '/v1/admin/ops')}",
        )
        assert split_op["progress"] == {"done": 1, "total": 1} and split_op["outcomes"] == {"split": 1}
        r = c.post(leader, f"/v1/admin/ops/{split_op['id']}/cancel", {})
        assert r.status_code == 409 and "one channel transition" in r.text, r.text
        # Splitting something nobody owns is refused by the controller.
        r = c.post(leader, "/v1/admin/split", {"bundle": parent})
        assert r.status_code == 409, r.text

    def test_shedding_pause_survives_a_leader_change_and_resumes_on_the_new_leader(
        self, balance: Harness
    ) -> None:
        # Kills the leader: the last test of the class.
        h, c = balance, balance.cluster
        leader = h.hold_shedding()
        term = c.get(leader, "/v1/leader")["leader"]["term"]
        h.sigkill(leader)
        new = wait_for(
            lambda: (n := c.leader()) is not None and n is not leader and n,
            SESSION_TIMEOUT + 30,
            interval=0.1,
            message="a new leader after the old one was killed",
        )
        info = c.get(new, "/v1/leader")
        assert info["leader"]["term"] > term

        def cycles(**labels: str) -> float:
            return h.metric(new, "trimtab_shedding_cycles_total", **labels)

        # The new leader reads the persisted switch when it takes over: it shows shedding paused and has
        # skipped every cycle it ran so far as paused.
        wait_for(
            lambda: h.status(new)["shedding"]["paused"] is True and cycles() >= 1,
            15,
            interval=0.1,
            message="the new leader has shedding paused and has run a cycle",
        )

        def paused() -> float:
            return cycles(result="skip", reason="paused")

        # Every cycle it ran so far was skipped as paused (two scrapes: retried if a cycle ran between them).
        wait_for(
            lambda: paused() >= 1 and paused() == cycles(),
            15,
            interval=0.1,
            message="every cycle of the new leader skipped as paused",
        )
        r = c.post(new, "/v1/admin/shedding", {"paused": False, "by": "test"})
        assert r.status_code == 200 and r.json()["shedding_paused"] is False
        assert h.status(new)["shedding"]["paused"] is False
        data, _ = h.zk.get(h.paths.controller_state)
        assert orjson.loads(data)["shedding_paused"] is False
        wait_for(
            lambda: cycles() - paused() >= 1,
            15,
            interval=0.2,
            message="the new leader runs shedding cycles again (not skipped as paused) after the resume",
        )
        # Nothing the admin tests did put a bundle on two brokers at once.
        h.check_single_owner()


# ================================================================================================ failover

FAILOVER_NAMESPACES = [f"public/fo-{i}" for i in range(6)]
FAILOVER_BUNDLES = 64
FAILOVER_SETTINGS = merge(
    FAST,
    {
        "namespace": {"default_bundles": FAILOVER_BUNDLES},
        # Tight throttles: a failed broker's ~100 bundles move in several rounds of at most 20.
        "healing": {"grace_s": 2, "max_in_flight": 20, "max_in_flight_per_broker": 10, "chunk_size": 25},
        # A broker takes a moment to take a bundle over, so a reassignment takes a few seconds.
        "sim": {"acquire_delay_ms": 300.0},
        # Healing only: no load-driven moves muddying who moved what.
        "shedding": {"enabled": False},
        "channel": {"in_flight_timeout_s": 10},
    },
)


@pytest.fixture(scope="class")
def failover(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    h = Harness.start(
        tmp_path_factory.mktemp("failover"), brokers=4, controllers=2, settings=FAILOVER_SETTINGS
    )
    try:
        h.assign(FAILOVER_NAMESPACES, FAILOVER_BUNDLES)
        yield h
    finally:
        h.close()


@pytest.mark.slow
class TestFailover:
    def test_killed_agent_bundles_are_owned_elsewhere_never_by_two(self, failover: Harness) -> None:
        h, c = failover, failover.cluster
        leader = h.leader()
        node = c.agents[-1]
        victim = node.broker
        assert victim is not None
        mine = h.owned_by(victim, leader)
        assert len(mine) >= 20, mine
        recorded = h.metric(leader, "trimtab_broker_failures_total", event="recorded")
        healed = h.metric(leader, "trimtab_broker_failures_total", event="healed")

        h.sigkill_agent(node)
        # The broker's znode outlives it by the session timeout; then the leader records the failure.
        record = wait_for(
            lambda: victim in c.get(leader, "/v1/healing")["failed"] and h.failed_record(victim),
            SESSION_TIMEOUT + 15,
            interval=0.05,
            message=lambda: f"failed-broker record of {victim}: {h.describe()}",
        )
        assert record["first_failure"] > 0

        live = set(h.live_brokers())

        def healed_elsewhere() -> bool:
            owners = h.owners(leader)
            return all(owners.get(b) in live for b in mine)

        wait_for(
            healed_elsewhere,
            60,
            interval=0.2,
            message=lambda: f"every bundle of {victim} owned by a live broker: {h.describe()}",
        )

        # Every agent's view agrees with the leader's.
        def views_agree() -> bool:
            ref = h.view(leader)
            return all(h.view(n) == ref for n in c.agents)

        wait_for(views_agree, 20, interval=0.2, message="every agent's ownership view equals the leader's")
        # The record clears once nothing names the broker any more.
        wait_for(
            lambda: h.failed_record(victim) is None and victim not in c.get(leader, "/v1/healing")["failed"],
            20,
            interval=0.1,
            message=f"failed-broker record of {victim} cleared after healing",
        )
        assert h.metric(leader, "trimtab_broker_failures_total", event="recorded") == recorded + 1
        assert h.metric(leader, "trimtab_broker_failures_total", event="healed") == healed + 1
        assert_one_heal_done(h, leader, victim, len(mine))
        # Exactly one forced override per bundle moved it; nothing else was forced.
        per_bundle = Counter(a.key for a in forced_off(h.accepted(), victim))
        assert set(per_bundle) == set(mine) and set(per_bundle.values()) == {1}, per_bundle
        h.check_single_owner()

    def test_leader_killed_mid_reassignment_new_leader_finishes_without_duplicates(
        self, failover: Harness
    ) -> None:
        h, c = failover, failover.cluster
        leader = h.leader()
        old = c.get(leader, "/v1/leader")
        old_term, old_id = old["leader"]["term"], old["me"]
        old_writer = f"controller:{old_id}:t{old_term}"
        node = agent_owning_most(c, leader)
        victim = node.broker
        assert victim is not None
        survivors = [n for n in c.agents if n is not node]
        mine = h.owned_by(victim, leader)
        max_in_flight = h.settings.healing.max_in_flight
        assert len(mine) > 3 * max_in_flight, f"{victim} owns only {len(mine)} bundles"

        new, died = kill_the_leader_mid_reassignment(h, leader, node, survivors, len(mine), old_writer)
        info = c.get(new, "/v1/leader")
        assert info["me"] != old_id and info["leader"]["term"] > old_term
        new_writer = f"controller:{info['me']}:t{info['leader']['term']}"
        plan_terms = wait_reassigned_noting_plan_terms(h, new, victim, mine, {n.broker for n in survivors})
        assert plan_terms == {old_term}, plan_terms
        # Without duplicates: exactly one accepted forced override off the victim per bundle, the old
        # leader's for some and the new leader's for the rest.
        forced = forced_off(h.accepted(), victim)
        per_bundle = Counter(a.key for a in forced)
        dupes = {b: n for b, n in per_bundle.items() if n != 1}
        assert not dupes, f"bundles overridden more than once: {dupes}"
        assert set(per_bundle) == set(mine), set(mine) ^ set(per_bundle)
        writers = Counter(a.new.writer for a in forced if a.new is not None)
        assert writers[old_writer] >= 1 and writers[new_writer] >= 1, writers
        assert set(writers) == {old_writer, new_writer}, writers
        # Each bundle was acquired after the kill by its new owner and by nobody else: once, or once more
        # each time that owner stopped serving it on its own (a lease run out under load, a fence on a lost
        # ZooKeeper session) -- that is the agent recovering its own bundle, not a second reassignment.
        timelines = h.cluster.timelines()
        final = h.owners(new)
        for b in mine:
            got = {broker: acquisitions(tl, b, died) for broker, tl in timelines.items()}
            again = served_again(timelines[final[b]], b, died)
            assert got[final[b]] == 1 + again and sum(got.values()) == got[final[b]], (
                b,
                got,
                events_of(timelines, b, died),
            )
        h.check_single_owner()
        # The finished plan and the failure record are gone.
        wait_for(
            lambda: not h.plan_chunks(victim) and h.failed_record(victim) is None,
            20,
            interval=0.1,
            message=f"plan and failure record of {victim} cleared",
        )
        # One heal operation, whichever leader recorded it (its id is made from the broker and its first
        # failure): done. Its total is the plan as the leader that recorded it held it.
        assert_one_heal_done(h, new, victim, None)


def assert_one_heal_done(h: Harness, leader: Node, victim: str, total: int | None) -> None:
    """The healing of ``victim`` is one ``heal`` operation in ``leader``'s list, done, every move ended."""
    c = h.cluster

    def heals() -> list[dict[str, Any]]:
        shown = [
            c.get(leader, f"/v1/admin/ops/{o['id']}")
            for o in c.get(leader, "/v1/admin/ops")
            if o["kind"] == "heal"
        ]
        return [d for d in shown if d["target"] == victim]

    wait_for(
        lambda: (got := heals()) and got[0]["state"] == "done",
        20,
        interval=0.2,
        message=lambda: f"the heal operation of {victim} done: {heals()}",
    )
    (op,) = heals()
    assert op["progress"]["done"] == op["progress"]["total"] > 0, op["progress"]
    if total is not None:
        assert op["progress"]["total"] == total, op["progress"]
    assert op["requested_by"] == "healing" and victim in op["reason"]


def set_acquire_latency(h: Harness, nodes: list[Node], seconds: float) -> None:
    """Make the simulated brokers of ``nodes`` take ``seconds`` longer to take a bundle over.

    (The fault API sets latency together with failing the next N calls of an operation; prewarm is never
    called here -- no standbys -- so the injected failure is a no-op.)"""
    for n in nodes:
        r = h.cluster.post(n, "/v1/sim/faults", {"op": "prewarm", "times": 1, "latency_s": seconds})
        assert r.status_code == 200, r.text


def kill_the_leader_mid_reassignment(
    h: Harness, leader: Node, node: Node, survivors: list[Node], owned: int, old_writer: str
) -> tuple[Node, int]:
    """SIGKILL the agent ``node`` (which owns ``owned`` bundles), then ``leader`` the moment it has
    persisted a plan for them and its first overrides are accepted; return (the new leader, when the agent
    died, monotonic ns).

    The survivors' brokers take longer to take a bundle over than a leader takes to fail over, so the old
    leader's overrides are still in flight (Assigning) when the new leader takes over: the case where a
    leader that misread them would reassign bundles twice. Checked here, as the premise of the test."""
    c, victim = h.cluster, node.broker
    assert victim is not None
    set_acquire_latency(h, survivors, SESSION_TIMEOUT + 3)
    try:
        with ForcedWatch(h, victim) as watch:
            died = h.sigkill_agent(node)
            # Wait for the persisted plan and the first overrides, then kill the leader at once.
            plan = wait_for(
                lambda: watch.count() >= 1 and h.plan_chunks(victim),
                SESSION_TIMEOUT + 20,
                interval=0.01,
                message=lambda: f"a persisted plan for {victim} and its first overrides: {h.describe()}",
            )
            h.sigkill(leader)
            moved_before_kill = watch.count()
        assert len(plan) >= 2, plan  # several chunks of chunk_size
        assert moved_before_kill < owned, "the reassignment finished before the leader was killed"

        new = wait_for(
            lambda: (n := c.leader()) is not None and n is not leader and n,
            SESSION_TIMEOUT + 30,
            interval=0.05,
            message="a new leader",
        )
        in_flight = [
            b
            for b, r in h.records(new).items()
            if r["state"] == "assigning" and r["src"] == victim and r["writer"] == old_writer
        ]
        assert in_flight, "no override of the old leader was still in flight at the takeover"
    finally:
        set_acquire_latency(h, survivors, 0)
    return new, died


def wait_reassigned_noting_plan_terms(
    h: Harness, leader: Node, victim: str, bundles: list[str], live: set[str | None]
) -> set[int]:
    """Wait until every one of ``bundles`` is owned by a ``live`` broker in ``leader``'s view; return the
    terms of the plan chunks for ``victim`` seen meanwhile (the plan being worked through)."""
    plan_terms: set[int] = set()

    def all_owned_by_live() -> bool:
        for seq in h.plan_chunks(victim):
            with contextlib.suppress(NoNodeError):
                data, _ = h.zk.get(f"{h.paths.reassignments}/{victim}/{seq}")
                plan_terms.add(orjson.loads(data)["term"])
        o = h.owners(leader)
        return all(o.get(b) in live for b in bundles)

    wait_for(
        all_owned_by_live,
        90,
        interval=0.2,
        message=lambda: f"every bundle of {victim} owned by a live broker: {h.describe()}",
    )
    return plan_terms


# ================================================================================================ ZooKeeper

ZK_NAMESPACES = [f"public/zk-{i}" for i in range(4)]
ZK_GRACE = 15.0
OUTAGE_SETTLE = 8.0
ZK_SETTINGS = merge(
    FAST,
    {"healing": {"grace_s": ZK_GRACE}, "shedding": {"enabled": False}, "namespace": {"default_bundles": 4}},
)


@pytest.fixture(scope="class")
def zkc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    # A fixed ZooKeeper port, so a stopped server comes back where every client looks for it.
    h = Harness.start(
        tmp_path_factory.mktemp("zookeeper"),
        brokers=3,
        controllers=2,
        settings=ZK_SETTINGS,
        zk_port=free_port(),
    )
    try:
        h.assign(ZK_NAMESPACES, 4)
        yield h
    finally:
        h.close()


@pytest.mark.slow
class TestZooKeeper:
    def test_broker_back_within_grace_is_not_healed_and_gives_up_what_it_held(self, zkc: Harness) -> None:
        h, c = zkc, zkc.cluster
        leader = h.leader()
        node = c.agents[0]
        broker = node.broker
        assert broker is not None
        before = {b: r for b, r in h.records(leader).items() if r["state"] == "owned" and r["dst"] == broker}
        assert before, "the broker owns nothing"
        cancelled = h.metric(leader, "trimtab_broker_failures_total", event="cancelled")
        mark = h.watermarks()

        # Freeze the agent (and its broker) long enough for its ZooKeeper session to expire.
        c.kill(node.name, signal.SIGSTOP)
        try:
            wait_for(
                lambda: broker in c.get(leader, "/v1/healing")["failed"] and h.failed_record(broker),
                SESSION_TIMEOUT + 15,
                interval=0.05,
                message=lambda: f"failed-broker record of {broker}: {h.describe()}",
            )
            assert broker not in c.get(leader, "/v1/brokers")["brokers"]
        finally:
            c.kill(node.name, signal.SIGCONT)
        back = time.monotonic()
        wait_for(
            lambda: (
                h.failed_record(broker) is None
                and h.metric(leader, "trimtab_broker_failures_total", event="cancelled") == cancelled + 1
            ),
            ZK_GRACE,
            interval=0.05,
            message=lambda: f"the failure of {broker} cancelled: {h.describe()}",
        )
        assert time.monotonic() - back < ZK_GRACE
        assert broker in c.get(leader, "/v1/brokers")["brokers"]
        assert broker not in c.get(leader, "/v1/healing")["failed"]
        # Healing did not touch its bundles: no override, nothing written by a controller. But the agent
        # lost its session while frozen, so it cannot vouch for leases it held then: it fenced everything
        # and gave its bundles up itself (unloads, reassigned on the next lookup) -- balance.roles, stale.
        wait_for(
            lambda: all((r := h.records(leader).get(b)) is None or r["state"] == "free" for b in before),
            20,
            interval=0.1,
            message=lambda: f"{broker} gave up what it held before its session was lost: {h.describe()}",
        )
        since = [a for a in h.accepted() if a.offset >= mark.get(a.partition, 0) and a.key in before]
        assert not [a for a in since if a.new is not None and (a.new.force or a.new.writer != broker)], since
        assert {a.key for a in since if a.new is not None and a.new.state is State.RELEASING} == set(before)
        assert set(c.get(node, "/v1/sim/state")["serving"]).isdisjoint(before)
        h.check_single_owner()
        # Clients come back: the freed bundles are assigned again (the least loaded broker -- this one,
        # which holds nothing now -- takes most of them), for the tests that follow.
        for b in before:
            assert h.lookup(topic_in(b, prefix="back"))["owner"] is not None

    def test_zookeeper_outage_is_harmless_and_the_cluster_recovers(self, zkc: Harness) -> None:
        h, c = zkc, zkc.cluster
        assert c.zk is not None
        # Controllers for this test: no healing grace and a settle period longer than a session timeout,
        # so a leader that skipped the settle period would reassign the killed broker's bundles visibly
        # early (its znode vanishes one session timeout after ZooKeeper is back).
        leader = replace_controllers(
            h, ["--set", "healing.grace_s=0", "--set", f"healing.safe_mode_settle_s={OUTAGE_SETTLE}"]
        )
        scene = OutageScene.prepare(h, leader)

        # ---- ZooKeeper down, and an agent killed while it is.
        down_at = time.monotonic()
        c.zk.stop()
        h.sigkill_agent(scene.node)
        wait_for(
            lambda: controllers_hold_back(c, leader),
            10,
            interval=0.1,
            message="the leader paused by the ZooKeeper outage, the follower following",
        )
        # The outage lasts well past the session timeout, and is checked all along.
        lookups = 0
        while time.monotonic() - down_at < SESSION_TIMEOUT * 2 + 1:
            assert controllers_hold_back(c, leader)
            scene.check_nothing_moved(h, lookups)
            lookups += 1
        assert lookups >= 3
        # Admin writes are refused as retryable while nobody can lead (a follower may send them to the
        # paused leader first), never redirected in a loop.
        for ctl in c.controller_nodes:
            r = httpx.post(
                f"{ctl.http}/v1/admin/shedding", json={"paused": True}, headers=c.auth_headers(), timeout=10
            )
            if r.status_code == 307:  # followed by hand: httpx drops the token when the port changes
                r = httpx.post(
                    r.headers["location"], json={"paused": True}, headers=c.auth_headers(), timeout=10
                )
            assert r.status_code == 503, (ctl.name, r.status_code, r.text)

        # ---- ZooKeeper back (same port, same data).
        # Nobody can reconnect before the server starts: a lower bound on every reconnect.
        back_ms = int(time.time() * 1000)
        c.zk.start()
        settling = wait_recovered(h, scene.survivors)
        assert settling, "no controller reported the settle period after ZooKeeper came back"
        # The survivors' sessions outlived the outage: they serve what they own again, on fresh leases.
        wait_for(
            lambda: all(
                set(c.get(n, "/v1/sim/state")["serving"]) >= scene.serving[n.broker] for n in scene.survivors
            ),
            30,
            interval=0.2,
            message="the survivors serve their bundles again after ZooKeeper came back",
        )
        assert int(time.time() * 1000) - back_ms >= OUTAGE_SETTLE * 1000
        leader = h.leader()
        live = {n.broker for n in scene.survivors}
        wait_for(
            lambda: (o := h.owners(leader)) and all(o.get(b) in live for b in scene.mine),
            SESSION_TIMEOUT + OUTAGE_SETTLE + 40,
            interval=0.2,
            message=lambda: f"the killed broker's bundles reassigned after recovery: {h.describe()}",
        )
        forced = forced_off(h.accepted(), scene.victim)
        assert Counter(a.key for a in forced) == Counter(scene.mine)
        earliest = min(a.new.ts for a in forced if a.new is not None)
        assert earliest >= back_ms + OUTAGE_SETTLE * 1000, (
            f"a bundle was reassigned {(earliest - back_ms) / 1000:.1f}s after ZooKeeper came back, "
            f"within the {OUTAGE_SETTLE}s settle period"
        )
        # Survivors kept their own bundles all along.
        after = h.owners(leader)
        for n in scene.survivors:
            assert set(scene.theirs[n.broker]) <= set(c.get(n, "/v1/sim/state")["serving"])
            assert all(after[b] == n.broker for b in scene.theirs[n.broker])
        h.check_single_owner()


def replace_controllers(h: Harness, args: list[str]) -> Node:
    """Start two controllers with the extra command-line ``args``, stop the old ones (cleanly), and return
    the new leader: one of the fresh two."""
    c = h.cluster
    old_controllers = list(c.controller_nodes)
    fresh = [c.add_controller(args=args) for _ in range(2)]
    for n in old_controllers:
        assert c.terminate(n.name, timeout=30) == 0
    leader = wait_for(
        lambda: (n := c.leader()) in fresh and n,
        SESSION_TIMEOUT + 30,
        interval=0.1,
        message="one of the new controllers leads",
    )
    assert isinstance(leader, Node)
    return leader


def controllers_hold_back(c: LocalCluster, leader: Node) -> bool:
    """No controller leads: ``leader`` is paused by ZooKeeper (it keeps its term), the others just follow.
    Asserts that none claims to lead; False while the leader has not noticed the outage yet."""
    infos = {n.name: c.get(n, "/v1/leader") for n in c.controller_nodes}
    assert all(i["is_leader"] is False for i in infos.values()), infos
    return infos[leader.name]["safe_mode"] == "zookeeper_suspended" and all(
        i["safe_mode"] == "not_leader" for k, i in infos.items() if k != leader.name
    )


@dataclass
class OutageScene:
    """The cluster as the ZooKeeper outage finds it: the agent to kill during it (the broker owning the
    most), the survivors with their bundles and what their brokers serve, a probe topic per survivor
    bundle (looked up through every survivor, so each knows every namespace's layout), and the channel's
    end offsets, after which nothing destructive may be written."""

    node: Node
    victim: str
    survivors: list[Node]
    owners: dict[str, str | None]
    mine: list[str]  # the victim's bundles
    theirs: dict[str | None, list[str]]  # survivor broker -> its bundles
    probes: dict[str, str]  # survivor bundle -> a topic in it
    serving: dict[str | None, set[str]]  # survivor broker -> the bundles its broker serves
    mark: dict[int, int]

    @classmethod
    def prepare(cls, h: Harness, leader: Node) -> OutageScene:
        c = h.cluster
        brokers = h.live_brokers()
        owners = h.owners(leader)
        # Every broker owns a bundle (what the outage must leave where it is). Which broker the earlier
        # tests' re-lookups chose is a draw among the least loaded: a broker that drew none is given one.
        for empty in [b for b in brokers if b not in owners.values()]:
            fullest = max(brokers, key=lambda b: (sum(1 for o in owners.values() if o == b), b))
            bundle = sorted(k for k, o in owners.items() if o == fullest)[0]
            r = c.post(leader, "/v1/admin/transfer", {"bundle": bundle, "broker": empty})
            assert r.status_code == 202, r.text
            wait_for(
                lambda bundle=bundle, empty=empty: h.owners(leader).get(bundle) == empty,
                20,
                interval=0.1,
                message=f"{bundle} on {empty}",
            )
            owners = h.owners(leader)
        node = h.agent(max(brokers, key=lambda b: (sum(1 for o in owners.values() if o == b), b)))
        victim = node.broker
        assert victim is not None
        survivors = [n for n in c.agents if n is not node]
        mine = sorted(b for b, o in owners.items() if o == victim)
        theirs = {n.broker: sorted(b for b, o in owners.items() if o == n.broker) for n in survivors}
        assert mine and all(theirs.values())
        probes = {b: topic_in(b, prefix="outage") for bs in theirs.values() for b in bs}
        for n in survivors:
            for b, t in probes.items():
                assert h.lookup(t, via=n)["owner"] == owners[b]
        serving = {n.broker: set(c.get(n, "/v1/sim/state")["serving"]) for n in survivors}
        assert all(set(theirs[b]) <= serving[b] for b in serving)
        return cls(node, victim, survivors, owners, mine, theirs, probes, serving, h.watermarks())

    def check_nothing_moved(self, h: Harness, round_: int) -> None:
        """During the outage: brokers keep serving what they own, lookups of owned bundles still answer
        (spread over the survivors, shifted each ``round_``), and nothing destructive is in the channel --
        no override, unload or tombstone, nothing written by a controller."""
        c, survivors = h.cluster, self.survivors
        for n in survivors:
            # Nothing new is served; what was served stops at its leases' end, since no agent can vouch for
            # a lease without a confirmed ZooKeeper session (docs/reliability.md: never two servers was
            # chosen over serving through a ZooKeeper outage).
            assert set(c.get(n, "/v1/sim/state")["serving"]) <= self.serving[n.broker]
        for i, (b, t) in enumerate(self.probes.items()):
            got = c.lookup(t, via=survivors[(round_ + i) % len(survivors)])
            assert (got["bundle"], got["owner"]) == (b, self.owners[b]), got
        bad = [
            (a.key, a.new)
            for a in h.accepted()
            if a.offset >= self.mark.get(a.partition, 0)
            and (
                a.new is None
                or a.new.force
                or a.new.state in (State.RELEASING, State.FREE)
                or a.new.writer.startswith("controller:")
            )
        ]
        assert not bad, bad


def wait_recovered(h: Harness, survivors: list[Node]) -> list[str]:
    """After ZooKeeper is back: wait until a leader is out of safe mode and lists every survivor; return
    the settle-period safe modes the controllers reported meanwhile."""
    c = h.cluster
    settling: list[str] = []

    def recovered() -> bool:
        for n in c.controller_nodes:
            with contextlib.suppress(httpx.HTTPError):
                sm = c.get(n, "/v1/leader")["safe_mode"]
                if sm and sm.startswith("settling"):
                    settling.append(sm)
        ldr = c.leader()
        if ldr is None:
            return False
        listed = set(c.get(ldr, "/v1/brokers")["brokers"])
        return c.get(ldr, "/v1/leader")["safe_mode"] is None and {n.broker for n in survivors} <= listed

    wait_for(
        recovered,
        SESSION_TIMEOUT + OUTAGE_SETTLE + 30,
        interval=0.05,
        message=lambda: f"agents registered, a leader out of safe mode: {h.describe()}",
    )
    return settling
