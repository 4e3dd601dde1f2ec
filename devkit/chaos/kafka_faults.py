"""Kafka faults against a local cluster's real Apache Kafka, and what is checked around them.

Shared by the chaos suite (:mod:`.runner`: ``kafka_pause``, ``kill_kafka_leader``, ``stop_kafka``) and
tests/integration/test_kafka_faults.py:

* :func:`channel_leaders` -- which Kafka broker leads which partitions of the channel topic, from the
  metadata a confluent_kafka ``AdminClient`` gets (``list_topics``);
* :func:`fully_replicated` -- every partition of a topic led and in sync on every broker again (after a
  broker came back), so that the next fault starts from a whole cluster;
* :class:`LookupStorm` -- many concurrent lookups of *new* topics (one new namespace each, so every answer
  is a fresh assignment written to the channel) through the agents' HTTP API, every answer kept with its
  send and answer times;
* :func:`channel_ends` and :func:`why_stalled` -- what a test prints when the cluster did not recover in
  time: where every agent's replay stands against the channel's ends, and what the storm was answered;
* :func:`ownership_tables`, :func:`disagreement` and :func:`lost_acknowledgements` -- the verdict: every
  agent replays the same table, and every lookup answered 200 is still in it (a later version may have
  moved the bundle on; the same version must name the same owner).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from trimtab.devkit.kafka_server import KafkaCluster
from trimtab.devkit.localcluster import LocalCluster, Node

_QUIET: dict[str, Any] = {"log_level": 0, "error_cb": lambda err: None}


def real_kafka(cluster: LocalCluster) -> KafkaCluster:
    """The local cluster's :class:`KafkaCluster` (started: the faults act on its broker processes)."""
    kafka = cluster.kafka
    if kafka is None:
        raise TypeError("the local cluster has no Kafka: start() it first")
    return kafka


def _metadata(kafka: KafkaCluster, topic: str, timeout: float) -> Any:
    admin = AdminClient({**kafka.client_config(), **_QUIET})
    md = admin.list_topics(topic, timeout=timeout)
    t = md.topics.get(topic)
    if t is None or t.error is not None or not t.partitions:
        raise RuntimeError(f"no metadata for {topic}: {t.error if t is not None else 'unknown topic'}")
    return t


def channel_leaders(kafka: KafkaCluster, topic: str, timeout: float = 10.0) -> dict[int, list[int]]:
    """Kafka broker id -> the partitions of ``topic`` it leads (partitions without a leader left out)."""
    out: dict[int, list[int]] = {}
    for p, meta in sorted(_metadata(kafka, topic, timeout).partitions.items()):
        if meta.leader >= 0:
            out.setdefault(int(meta.leader), []).append(int(p))
    return out


def busiest_leader(kafka: KafkaCluster, topic: str) -> tuple[int, list[int]]:
    """The broker leading the most partitions of ``topic`` (ties: the lowest id), with those partitions."""
    leaders = channel_leaders(kafka, topic)
    if not leaders:
        raise RuntimeError(f"no partition of {topic} has a leader")
    broker = max(sorted(leaders), key=lambda b: len(leaders[b]))
    return broker, leaders[broker]


def fully_replicated(kafka: KafkaCluster, topic: str) -> bool:
    """Every partition of ``topic`` has a live leader and every broker of the cluster in its ISR."""
    everyone = {b.id for b in kafka.brokers}
    running = {b.id for b in kafka.brokers if b.pid is not None}
    try:
        t = _metadata(kafka, topic, 5.0)
    except Exception:  # a cluster still electing: not yet
        return False
    return all(m.leader in running and set(m.isrs) >= everyone for m in t.partitions.values())


# ---------------------------------------------------------------------------------------------- lookups
@dataclass(frozen=True, slots=True)
class Answer:
    """One lookup: ``sent``/``done`` in ``time.monotonic()``; ``status`` 0 when no HTTP answer came (the
    client's timeout, a refused connection)."""

    topic: str
    via: str
    sent: float
    done: float
    status: int
    bundle: str | None = None
    owner: str | None = None
    version: int | None = None
    how: str | None = None
    error: str | None = None  # the error body's message, when one came


def lookup(http: httpx.Client, node: Node, topic: str) -> Answer:
    sent = time.monotonic()
    try:
        r = http.get(f"{node.http}/v1/lookup", params={"topic": topic})
    except httpx.HTTPError as e:
        return Answer(topic, node.name, sent, time.monotonic(), 0, error=type(e).__name__)
    done = time.monotonic()
    if r.status_code != 200:
        return Answer(topic, node.name, sent, done, r.status_code, error=r.text[:300])
    body = r.json()
    return Answer(
        topic, node.name, sent, done, 200, body["bundle"], body["owner"], int(body["version"]), body["how"]
    )


class LookupStorm:
    """``threads`` clients, each looking up topic after topic, every one in a namespace of its own
    (``<tenant>/<prefix>-<n>``): each answer is an assignment the channel had to take. Lookups go round-robin
    to the live agents not in ``avoid``; a client gives up on a lookup after ``timeout`` s and sends the next.
    """

    def __init__(
        self,
        cluster: LocalCluster,
        *,
        tenant: str,
        prefix: str,
        threads: int = 8,
        timeout: float = 3.0,
        avoid: Iterable[str] = (),
    ) -> None:
        self.cluster = cluster
        self.tenant = tenant
        self.prefix = prefix
        self.timeout = timeout
        self.avoid = set(avoid)
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, name=f"storm-{i}", daemon=True) for i in range(threads)
        ]

    def __enter__(self) -> LookupStorm:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout + 5)

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout) as http:
            while not self._stop.is_set():
                agents = [a for a in self.cluster.agents if a.name not in self.avoid]
                if not agents:
                    self._stop.wait(0.1)
                    continue
                n = next(self._seq)
                topic = f"persistent://{self.tenant}/{self.prefix}-{n}/t-0"
                answer = lookup(http, agents[n % len(agents)], topic)
                with self._lock:
                    self.answers.append(answer)
                if answer.status != 200:
                    self._stop.wait(0.05)  # a refused lookup: a client backs off a little

    def snapshot(self) -> list[Answer]:
        with self._lock:
            return list(self.answers)

    def ok(self) -> list[Answer]:
        return [a for a in self.snapshot() if a.status == 200]

    def first_ok_sent_after(self, t: float) -> Answer | None:
        """The earliest-answered successful lookup that was sent at or after ``t`` (a new topic's first
        answer after a fault)."""
        later = [a for a in self.ok() if a.sent >= t]
        return min(later, key=lambda a: a.done, default=None)

    def count_ok_sent_after(self, t: float) -> int:
        return sum(1 for a in self.ok() if a.sent >= t)


def channel_ends(kafka: KafkaCluster, topic: str, timeout: float = 5.0) -> dict[int, int]:
    """Partition -> high watermark of ``topic``, read from the brokers now (a fresh client of its own)."""
    c = Consumer({**kafka.client_config(), **_QUIET, "group.id": "trimtab-test-ends"})
    try:
        parts = sorted(_metadata(kafka, topic, timeout).partitions)
        return {
            int(p): int(c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout, cached=False)[1])
            for p in parts
        }
    finally:
        c.close()


def why_stalled(
    cluster: LocalCluster, kafka: KafkaCluster, topic: str, storm: LookupStorm | None = None
) -> str:
    """Why a recovery a test waited for did not come: the storm's answers by status (and a few of its
    refusals), the channel's ends, and each agent's replay (ready, positions, last record, recoveries,
    last error) from its ``/v1/status`` -- so that a failure in CI says which side stalled."""
    parts: list[str] = []
    if storm is not None:
        answers = storm.snapshot()
        statuses = dict(Counter(a.status for a in answers))
        errors = sorted({(a.error or "")[:160] for a in answers if a.status != 200})[:4]
        parts.append(f"storm answers by status {statuses}, refusals {errors}")
    try:
        parts.append(f"channel ends {channel_ends(kafka, topic)}")
    except Exception as e:  # a diagnosis never raises: say what could not be read
        parts.append(f"channel ends unreadable ({e!r})")
    for a in cluster.agents:
        try:
            ch = cluster.get(a, "/v1/status")["channel"]
            keys = ("ready", "reason", "lag", "positions", "last_record_s_ago", "recoveries", "last_error")
            parts.append(f"{a.name} { ({k: ch.get(k) for k in keys}) }")
        except Exception as e:
            parts.append(f"{a.name} status unreadable ({e!r})")
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------------- verdict
def ownership_tables(cluster: LocalCluster, agents: Sequence[Node] | None = None) -> dict[str, Any]:
    """Agent name -> its ``/v1/ownership`` table (bundle -> record), from every live agent."""
    return {a.name: cluster.get(a, "/v1/ownership")["bundles"] for a in (agents or cluster.agents)}


def disagreement(tables: Mapping[str, Mapping[str, Any]]) -> str | None:
    """None when every table is the same; otherwise what differs (a few bundles, by agent)."""
    if len(tables) < 2:
        return None
    names = sorted(tables)
    ref = tables[names[0]]
    for name in names[1:]:
        other = tables[name]
        if other == ref:
            continue
        keys = sorted(set(ref) | set(other))
        diff = [k for k in keys if ref.get(k) != other.get(k)]
        sample = {k: (ref.get(k), other.get(k)) for k in diff[:3]}
        return f"{names[0]} and {name} differ on {len(diff)} bundle(s), e.g. {sample}"
    return None


def owner_of(record: Mapping[str, Any]) -> str | None:
    """The broker a record makes responsible for the bundle (owned: dst; splitting, merging: src), else
    None."""
    state = record.get("state")
    if state == "owned":
        return record.get("dst")
    if state in ("splitting", "merging"):
        return record.get("src")
    return None


def owned_by_dead(table: Mapping[str, Mapping[str, Any]], live_brokers: Iterable[str]) -> list[str]:
    """Bundles the table gives to a broker that is not live (an owner nobody can serve for)."""
    live = set(live_brokers)
    return [b for b, r in table.items() if (o := owner_of(r)) is not None and o not in live]


def lost_acknowledgements(answers: Iterable[Answer], table: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Lookups answered 200 that the table no longer bears out: the bundle missing, at an older version, or
    at the answered version with another owner. (A later version -- the bundle moved on, e.g. away from a
    failed broker -- is fine: the transition was kept and superseded.)"""
    lost = []
    for a in answers:
        if a.status != 200 or a.bundle is None or a.version is None:
            continue
        rec = table.get(a.bundle)
        if rec is None:
            lost.append(f"{a.topic}: {a.bundle} v{a.version} -> {a.owner} answered, absent from the table")
            continue
        version = int(rec.get("version", -1))
        if version < a.version or (version == a.version and owner_of(rec) != a.owner):
            lost.append(f"{a.topic}: {a.bundle} v{a.version} -> {a.owner} answered, the table has {rec}")
    return lost


def gap_figures(gaps: Sequence[float]) -> str:
    """``min / median / max`` of some seconds, for logs and docs."""
    if not gaps:
        return "none"
    s = sorted(gaps)
    return f"{s[0]:.1f} / {s[len(s) // 2]:.1f} / {s[-1]:.1f} s (n={len(s)})"
