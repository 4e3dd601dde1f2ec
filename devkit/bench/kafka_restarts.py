"""``trimtab bench kafka-restarts``: do channel followers read again after every broker of a Kafka cluster
restarted?

librdkafka can stop fetching an assigned partition without a word -- here after a whole-cluster restart,
one follower of six never read again (channel/stall.py). This bench starts a real Kafka cluster, a topic
laid out like the channel (4 partitions, replicated on every broker, ``min.insync.replicas`` 2), a producer
writing a record every 20 ms and ``followers`` followers -- the production :class:`Follower`, each with a
transport of its own, as on separate nodes -- and then, ``cycles`` times: stops the whole cluster, keeps it
down for 5, 15 or 30 s (seeded; ``outages_s``), starts it again, and measures how long each follower takes to reach the
ends the brokers report once a write after the restart was acknowledged. Its verdict: every follower
caught up in every cycle (``followers_stuck`` 0), with the stalls the watch cured counted.
"""

from __future__ import annotations

import random
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from trimtab.channel.kafka import KafkaTransport
from trimtab.channel.transport import Follower, Message
from trimtab.devkit.bench.common import environment, loadavg
from trimtab.devkit.kafka_server import KafkaCluster
from trimtab.errors import TransportError

TOPIC = "restarts"
PARTITIONS = 4
_QUIET: dict[str, Any] = {"log_level": 0}
OUTAGES_S = (5.0, 15.0, 30.0)


def _ends(transport: KafkaTransport, deadline_s: float) -> tuple[dict[int, int] | None, str | None]:
    """The partitions' ends as the brokers report them, retried until ``deadline_s`` from now; or None and
    the last error."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return {p: transport.watermarks(TOPIC, p, timeout_s=5.0)[1] for p in range(PARTITIONS)}, None
        except TransportError as e:
            if time.monotonic() >= deadline:
                return None, str(e)
            time.sleep(0.5)  # the cluster is electing leaders: nothing to wait on but time


class _Rig:
    """The cluster, the writer and the followers of one run."""

    def __init__(self, base: Path, brokers: int, followers: int) -> None:
        self.kafka = KafkaCluster(base / "kafka", brokers)
        self.brokers = brokers
        self.n = followers
        self.followers: list[Follower] = []
        self.transports: list[KafkaTransport] = []
        self.acked = 0
        self._stop = threading.Event()

    def start(self) -> None:
        boot = self.kafka.start().bootstrap_servers
        admin = AdminClient({"bootstrap.servers": boot, **_QUIET})
        isr = str(min(2, self.brokers))
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, self.brokers, config={"min.insync.replicas": isr})])[
            TOPIC
        ].result()
        self.ends = self._transport(boot, "bench-ends")
        self.producer = self._transport(boot, "bench-writer")
        for i in range(self.n):
            f = Follower(
                self._transport(boot, f"bench-follower-{i}"),
                TOPIC,
                _ignore,
                start=dict.fromkeys(range(PARTITIONS), 0),
                name=f"f{i}",
            )
            f.start()
            self.followers.append(f)
        for f in self.followers:
            if not f.wait_ready(60):
                raise RuntimeError(f"follower {f.name} not ready: {f.error!r}")
        threading.Thread(target=self._write, name="bench-writer", daemon=True).start()

    def _transport(self, boot: str, client_id: str) -> KafkaTransport:
        t = KafkaTransport(boot, client_id=client_id, client_config=_QUIET)
        self.transports.append(t)
        return t

    def _acknowledged(self, err: TransportError | None) -> None:
        if err is None:
            self.acked += 1

    def _write(self) -> None:
        while not self._stop.is_set():
            self.producer.send(TOPIC, uuid.uuid4().bytes, b"x" * 50, self._acknowledged)
            self._stop.wait(0.02)  # the writer's pace: 50 records a second

    def cycle(self, c: int, outage: float, catch_up_s: float) -> dict[str, Any]:
        self.kafka.close()
        time.sleep(outage)  # the outage is the scenario
        t0 = time.monotonic()
        self.kafka.restart()
        restarted = time.monotonic()
        before = self.acked
        while self.acked == before and time.monotonic() - restarted < catch_up_s:
            time.sleep(0.05)  # polling the writer's acknowledgements
        ends, ends_error = _ends(self.ends, catch_up_s)
        caught: dict[str, float] = {}
        deadline = time.monotonic() + catch_up_s
        while ends is not None and len(caught) < self.n and time.monotonic() < deadline:
            for f in self.followers:
                if f.name not in caught and all(f.positions.get(p, 0) >= e for p, e in ends.items()):
                    caught[f.name] = round(time.monotonic() - restarted, 2)
            time.sleep(0.05)  # polling the followers' positions
        return {
            "cycle": c,
            "outage_s": outage,
            "restart_s": round(restarted - t0, 1),
            "ends_read": ends is not None,
            "ends_error": ends_error,
            "caught_up_s": caught,
            "stuck": sorted(f.name for f in self.followers if f.name not in caught),
            "stalls": {f.name: f.stalls for f in self.followers},
        }

    def close(self) -> None:
        self._stop.set()
        for f in self.followers:
            f.stop()
        for t in self.transports:
            t.close()
        self.kafka.close()


def _ignore(_msgs: list[Message]) -> None:
    """The followers' apply: only their positions are measured."""


def run(
    *,
    cycles: int = 8,
    followers: int = 6,
    brokers: int = 3,
    seed: int = 1,
    catch_up_s: float = 60.0,
    outages_s: tuple[float, ...] = OUTAGES_S,
    workdir: Path | None = None,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    rng = random.Random(seed)
    load_start = loadavg()
    rig = _Rig(workdir or Path(tempfile.mkdtemp(prefix="trimtab-kafka-restarts-")), brokers, followers)
    try:
        rig.start()
        rows: list[dict[str, Any]] = []
        for c in range(cycles):
            time.sleep(rng.uniform(1.0, 5.0))  # writing before the stop
            row = rig.cycle(c, rng.choice(outages_s), catch_up_s)
            rows.append(row)
            progress(f"cycle {c}: {row}")
        catch_ups = [s for r in rows for s in r["caught_up_s"].values()]
        return {
            "bench": "kafka-restarts",
            "kafka": "Apache Kafka (trimtab.devkit.kafka_server)",
            "brokers": brokers,
            "followers": followers,
            "cycles": cycles,
            "seed": seed,
            "followers_stuck": sum(len(r["stuck"]) for r in rows),
            "ends_unreadable_cycles": sum(1 for r in rows if not r["ends_read"]),
            "stalls_cured": sum(f.stalls for f in rig.followers),
            "metadata_clients_replaced": sum(t.meta_rebuilds for t in rig.transports),
            "catch_up_s_max": max(catch_ups, default=None),
            "records_acknowledged": rig.acked,
            "rounds": rows,
            "targets": {"followers_stuck": 0, "ends_unreadable_cycles": 0},
            "env": environment(load_start, "confluent-kafka"),
            "checks": {
                "every_follower_caught_up_every_cycle": all(not r["stuck"] for r in rows),
                "no_follower_failed": all(f.error is None and f.running for f in rig.followers),
            },
        }
    finally:
        rig.close()
