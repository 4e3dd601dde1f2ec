"""Real Kafka log compaction for the tests (tests/integration/test_compaction.py).

The session's Kafka (``kafka_cluster``) never compacts within a test: its cleaner backs off 15 s between
idle checks and its topics have large segments. :func:`start_compacting_cluster` starts a private one-node
cluster whose cleaner looks for work every 100 ms (``log.cleaner.backoff.ms``); :func:`compacted_config`
is the topic configuration that makes every closed segment cleanable at once (``min.cleanable.dirty.ratio``
0.01, ``min.compaction.lag.ms`` 0) and removes tombstones soon after the pass that first saw them
(``delete.retention.ms``). Kafka only cleans closed segments, and a segment closes when a record arrives
after ``segment.ms``: the tests keep appending (live brokers report, the leader writes snapshots) and
re-read the topic until the cleaner has done its work, under a deadline.

Everything that writes or reads here is product code: the agent's :class:`agent.reporter.LoadReporter`,
the controller's :class:`controller.snapshots.SnapshotJob` with its :class:`channel.snapshot.SnapshotWriter`,
:class:`channel.client.ChannelClient` for every node, :func:`channel.snapshot.read_all` for raw reads and
:func:`channel.table.replay` as the reference. Two stand-ins: :class:`FixedLeadership`, a leader of a given
term without a ZooKeeper election (all the snapshot job asks of its leadership), and
:meth:`ChannelArchive.retain_from`, which does to the channel what time or size retention would, at a moment
the test chooses, through the admin API's DeleteRecords (the low watermark moves; nothing else changes).
"""

from __future__ import annotations

import asyncio
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry

from tests.support.channel_race import NOTHING, propose
from tests.support.waiting import wait_for
from trimtab.channel.client import ChannelClient
from trimtab.channel.kafka import KafkaTransport
from trimtab.channel.records import Record
from trimtab.channel.snapshot import (
    CHUNK_PREFIX,
    MANIFEST_PREFIX,
    SnapshotWriter,
    manifest_key,
    read_all,
    read_snapshot_topic,
    snapshot_order,
)
from trimtab.channel.table import TableView, replay
from trimtab.channel.transport import Message
from trimtab.controller.leadership import Leadership
from trimtab.controller.metrics import ControllerMetrics
from trimtab.controller.snapshots import SnapshotJob
from trimtab.devkit.kafka_server import KafkaCluster

#: Broker settings of the compacting cluster: a cleaner that looks for dirty logs every 100 ms (Kafka's
#: default is 15 s) and is never throttled.
CLEANER_BROKER_CONFIG: dict[str, object] = {
    "log.cleaner.backoff.ms": 100,
    "log.cleaner.threads": 1,
    "log.cleaner.io.max.bytes.per.second": 1e12,
}
CHANNEL_PARTITIONS = 4


def compacted_config(
    *, segment_ms: int = 100, delete_retention_ms: int = 200, segment_bytes: int | None = None
) -> dict[str, str]:
    """A compacted topic whose closed segments are cleaned at once and whose tombstones go soon after.

    ``segment_bytes`` sets Kafka's ``internal.segment.bytes`` (``segment.bytes`` may not be under 1 MiB):
    the cleaner groups segments up to that size and swaps each group in on its own, so a reader can meet a
    log that is cleaned in one part and not yet in the next -- what a big log looks like to a reader while
    the cleaner works through it."""
    config = {
        "cleanup.policy": "compact",
        "segment.ms": str(segment_ms),
        "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "0",
        "delete.retention.ms": str(delete_retention_ms),
    }
    if segment_bytes is not None:
        config["internal.segment.bytes"] = str(segment_bytes)
    return config


def start_compacting_cluster(workdir: Path) -> KafkaCluster:
    return KafkaCluster(workdir, brokers=1, extra_config=CLEANER_BROKER_CONFIG).start()


@dataclass
class CompactingKafka:
    """Topics and transports of one test on the compacting cluster (names unique to the test)."""

    cluster: KafkaCluster
    prefix: str
    _transports: list[KafkaTransport] = field(default_factory=list)

    def channel_topic(self, name: str = "channel") -> str:
        """A channel as trimtab makes it: never compacted (``cleanup.policy=delete``), four partitions."""
        topic = f"{self.prefix}-{name}"
        self.cluster.create_topics(
            [topic], partitions=CHANNEL_PARTITIONS, config={"cleanup.policy": "delete"}
        )
        return topic

    def compacted_topic(
        self,
        name: str,
        partitions: int,
        *,
        segment_ms: int = 100,
        delete_retention_ms: int = 200,
        segment_bytes: int | None = None,
    ) -> str:
        topic = f"{self.prefix}-{name}"
        config = compacted_config(
            segment_ms=segment_ms, delete_retention_ms=delete_retention_ms, segment_bytes=segment_bytes
        )
        self.cluster.create_topics([topic], partitions=partitions, config=config)
        return topic

    def transport(self, client_id: str) -> KafkaTransport:
        """A transport of its own (producer, consumers: another node); closed at teardown."""
        t = KafkaTransport(self.cluster.bootstrap_servers, client_id=f"{self.prefix}-{client_id}")
        self._transports.append(t)
        return t

    def close(self) -> None:
        for t in self._transports:
            t.close()
        self._transports.clear()  # and let their clients go now, before the cluster does


# ---------------------------------------------------------------------------------------------- reading
def read_log(transport: KafkaTransport, topic: str) -> list[Message]:
    """Every retained record of ``topic`` (all partitions) up to the high watermarks seen now."""
    return list(read_all(transport, topic, 30.0))


def high_watermarks(transport: KafkaTransport, topic: str) -> dict[int, int]:
    return {p: transport.watermarks(topic, p)[1] for p in range(transport.partitions(topic))}


def full_replay(transport: KafkaTransport, channel: str) -> TableView:
    """The reference every node must equal: the whole channel replayed from offset zero."""
    return replay(read_log(transport, channel), partitions=transport.partitions(channel))


_CLEANED = re.compile(r"cleaned log (\S+)-\d+ ")


def cleaner_passes(cluster: KafkaCluster, topic: str) -> int:
    """How many times the broker's log cleaner has cleaned ``topic`` so far (from the broker's log)."""
    text = cluster.log_path(1).read_text(errors="replace")
    return sum(1 for m in _CLEANED.finditer(text) if m.group(1) == topic)


@dataclass(frozen=True)
class SnapshotTopicState:
    """What a raw read of the snapshot topic holds."""

    records: int
    chunk_ids: frozenset[str]  # snapshot ids of chunk records with a value
    tombstoned_ids: frozenset[str]  # snapshot ids of chunk tombstones still retained
    manifests: frozenset[bytes]  # manifest keys with a value
    manifest_tombstones: int

    @classmethod
    def of(cls, messages: Iterable[tuple[bytes | None, bytes | None]]) -> SnapshotTopicState:
        n = 0
        chunks: set[str] = set()
        dead: set[str] = set()
        manifests: set[bytes] = set()
        manifest_tombstones = 0
        for key, value in messages:
            n += 1
            if key is None:
                continue
            if key.startswith(CHUNK_PREFIX):
                sid = key[len(CHUNK_PREFIX) :].partition(b"/")[0].decode()
                (chunks if value is not None else dead).add(sid)
            elif key.startswith(MANIFEST_PREFIX):
                if value is None:
                    manifest_tombstones += 1
                else:
                    manifests.add(key)
        return cls(n, frozenset(chunks), frozenset(dead), frozenset(manifests), manifest_tombstones)

    @property
    def ids(self) -> list[str]:
        """Every snapshot id the topic still names, oldest first."""
        return sorted(self.chunk_ids | self.tombstoned_ids, key=lambda s: snapshot_order(s) or (-1, -1))


def snapshot_topic_state(transport: KafkaTransport, topic: str) -> SnapshotTopicState:
    return SnapshotTopicState.of(read_snapshot_topic(transport, topic))


class ChannelArchive:
    """Every record the channel ever held, read (with the product's reader) before retention deletes it:
    the reference a node's table is checked against once the channel's beginning is gone."""

    def __init__(self, transport: KafkaTransport, topic: str) -> None:
        self.transport = transport
        self.topic = topic
        self.messages: list[Message] = []
        self.positions = dict.fromkeys(range(transport.partitions(topic)), 0)
        self.deleted_before = dict(self.positions)

    def catch_up(self, timeout: float = 30.0) -> None:
        highs = high_watermarks(self.transport, self.topic)
        if all(self.positions[p] >= h for p, h in highs.items()):
            return
        reader = self.transport.reader(self.topic, dict(self.positions))
        deadline = time.monotonic() + timeout
        try:
            pos = dict(self.positions)
            while any(pos[p] < h for p, h in highs.items()):
                if time.monotonic() > deadline:
                    raise AssertionError(f"reading {self.topic} to {highs} took over {timeout}s (at {pos})")
                self.messages += [m for m in reader.poll(10_000, 0.1) if m.offset < highs[m.partition]]
                pos.update(reader.positions())
        finally:
            reader.close()
        self.positions = highs

    def retain_from(self, positions: dict[int, int]) -> None:
        """What time or size retention does to the channel: delete every record before ``positions`` (once
        this archive holds them), so a node must bootstrap from a snapshot at or after them."""
        self.catch_up()
        todo = [TopicPartition(self.topic, p, o) for p, o in positions.items() if o > self.deleted_before[p]]
        if not todo:
            return
        admin = AdminClient({"bootstrap.servers": self.transport.bootstrap_servers})
        for fut in admin.delete_records(todo, request_timeout=30, operation_timeout=30).values():
            fut.result(30)
        self.deleted_before.update((tp.partition, tp.offset) for tp in todo)


# ---------------------------------------------------------------------------------------------- writing
class ChannelHistory:
    """Channel history from one node's view: each round proposes a next transition for every bundle (valid
    moves mostly, and deliberately stale, gapped and mismatched ones: tests.support.channel_race), publishes
    them through the node's ChannelClient and waits until its table has applied every one."""

    def __init__(
        self, client: ChannelClient, bundles: Sequence[str], brokers: Sequence[str], seed: int
    ) -> None:
        self.client = client
        self.bundles = list(bundles)
        self.brokers = list(brokers)
        self.rng = random.Random(seed)
        self.published = 0

    def round(self, share: float = 1.0, timeout: float = 20.0) -> int:
        """Publish one proposal for a ``share`` of the bundles; returns how many records were written."""
        futures: list[Future[Message]] = []
        for bundle in self.rng.sample(self.bundles, k=max(1, int(len(self.bundles) * share))):
            me = self.rng.choice(self.brokers)
            prop = propose(
                bundle, self.client.table.get(bundle), me, self.brokers, self.rng, splittable=False
            )
            if prop is NOTHING:
                continue
            assert prop is None or isinstance(prop, Record)
            futures.append(self.client.publish(bundle, prop))
        written = [f.result(timeout) for f in futures]
        want: dict[int, int] = {}
        for m in written:
            want[m.partition] = max(want.get(m.partition, 0), m.offset + 1)
        table = self.client.table
        wait_for(
            lambda: all(table.positions.get(p, 0) >= o for p, o in want.items()),
            timeout,
            message=lambda: (
                f"{self.client.topic}: the writer's own view applies {want} (at {table.positions})"
            ),
        )
        self.published += len(written)
        return len(written)


class FixedLeadership(Leadership):
    """The leader of ``term``, without ZooKeeper: what :class:`SnapshotJob` asks of its leadership (whether
    it leads, and the term) and nothing else. Deliberately does not run Leadership's constructor."""

    def __init__(self, term: int) -> None:
        self._term = term

    def term(self) -> int:
        return self._term

    @property
    def is_leader(self) -> bool:
        return True


def leader_snapshot_job(
    transport: KafkaTransport,
    channel: ChannelClient,
    snapshot_topic: str,
    *,
    term: int,
    me: str,
    chunk_bundles: int,
) -> SnapshotJob:
    """The controller's snapshot job for a new leader of ``term``, as controller/wiring.py builds it, after
    its ``on_lead`` (it reads the snapshot topic to learn the keys it will collect)."""
    writer = SnapshotWriter(
        transport,
        snapshot_topic,
        channel.topic,
        writer=f"controller:{me}:t{term}",
        chunk_bundles=chunk_bundles,
    )
    job = SnapshotJob(
        channel,
        writer,
        FixedLeadership(term),
        ControllerMetrics.create(CollectorRegistry()),
        transport=transport,
        topic=snapshot_topic,
    )
    asyncio.run(job.on_lead())
    return job


def write_snapshot(job: SnapshotJob) -> str:
    """One ``run_once`` of the job (what the controller does every snapshot interval); the new snapshot id."""
    if not asyncio.run(job.run_once()):
        raise AssertionError(f"the snapshot job did not write (ready={job.channel.ready})")
    assert job.writer.last_id is not None
    return job.writer.last_id


# ---------------------------------------------------------------------------------------------- nodes
@dataclass
class Bootstrapped:
    """How one node's bootstrap ended."""

    name: str
    ready: bool
    error: BaseException | None
    reason: str
    snapshot_id: str | None
    recoveries: int
    gaps: int
    table: dict[str, Record]
    positions: dict[int, int]
    seconds: float


class BootstrappingNode(threading.Thread):
    """A node that starts now: a ChannelClient bootstraps (newest usable snapshot + the channel after it)
    on this thread, which waits until it is ready, records how it went and stops it. The table is taken at
    the exact moment the node turned ready (``on_ready``, on the follower's thread), with the positions it
    covers: the channel may go on growing after that."""

    def __init__(
        self,
        name: str,
        transport: KafkaTransport,
        channel_topic: str,
        snapshot_topic: str,
        *,
        timeout: float = 20.0,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.client = ChannelClient(
            transport,
            channel_topic,
            snapshot_topic,
            on_ready=self._on_ready,
            retry_s=0.1,
            max_retry_s=0.5,
        )
        self.timeout = timeout
        self.at_ready: tuple[dict[str, Record], dict[int, int]] | None = None
        self.result: Bootstrapped | None = None

    def _on_ready(self, table: TableView) -> None:
        if self.at_ready is None:
            self.at_ready = table.snapshot()

    def run(self) -> None:
        c = self.client
        t0 = time.monotonic()
        error: BaseException | None = None
        ready = False
        try:
            c.start()
            ready = c.wait_ready(self.timeout)
        except BaseException as e:  # reported in the result: start() must raise nothing here
            error = e
        finally:
            c.stop()
        states, positions = self.at_ready or ({}, {})
        self.result = Bootstrapped(
            name=self.name,
            ready=ready,
            error=error,
            reason=c.health()[1],
            snapshot_id=c.snapshot.manifest.id if c.snapshot is not None else None,
            recoveries=c.recoveries,
            gaps=c.gaps,
            table=states,
            positions=positions,
            seconds=time.monotonic() - t0,
        )


def mismatch(got: dict[str, Record], want: dict[str, Record]) -> str:
    """A short description of how two tables differ (for assertion messages)."""
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    changed = sorted(k for k in set(got) & set(want) if got[k] != want[k])
    out = Counter({"missing": len(missing), "extra": len(extra), "different": len(changed)})
    sample = [(k, got.get(k), want.get(k)) for k in (missing + extra + changed)[:3]]
    return f"{dict(out)}; e.g. (bundle, node, reference): {sample}"


def bootstrap_during(
    work: Callable[[], object],
    transport: KafkaTransport,
    channel_topic: str,
    snapshot_topic: str,
    *,
    nodes: int,
    prefix: str,
    timeout: float = 40.0,
) -> list[Bootstrapped]:
    """Run ``work`` (the leader at work: channel history and snapshot writes) on a thread while nodes
    bootstrap: one starts with it, more start each time the snapshot topic has grown (up to ``nodes - 1``
    in all), and one more after it. Returns how every node's bootstrap ended."""
    failed: list[BaseException] = []

    done = threading.Event()

    def run() -> None:
        try:
            work()
        except BaseException as e:  # raised below, on the test's thread
            failed.append(e)
        finally:
            done.set()

    def node() -> None:
        n = BootstrappingNode(f"{prefix}-n{len(started)}", transport, channel_topic, snapshot_topic)
        started.append(n)
        n.start()

    leader = threading.Thread(target=run, name=f"{prefix}-leader", daemon=True)
    started: list[BootstrappingNode] = []
    node()
    leader.start()
    seen = high_watermarks(transport, snapshot_topic)
    while not done.wait(0.005) and len(started) < nodes - 1:  # poll the topic's growth until done
        now = high_watermarks(transport, snapshot_topic)
        if now != seen:
            seen = now
            node()
    leader.join(timeout)
    if failed or leader.is_alive():
        raise AssertionError(f"the leader's work failed or hangs: {failed}")
    node()
    results: list[Bootstrapped] = []
    for n in started:
        n.join(timeout)
        if n.result is None:
            raise AssertionError(f"{n.name} did not finish bootstrapping within {timeout}s")
        results.append(n.result)
    return results


def replay_up_to(messages: Sequence[Message], positions: dict[int, int], partitions: int) -> TableView:
    """The full replay of the channel's first records, up to ``positions`` (exclusive) in each partition."""
    return replay((m for m in messages if m.offset < positions.get(m.partition, 0)), partitions=partitions)


def write_until_compacted(
    job: SnapshotJob, transport: KafkaTransport, snapshot_topic: str, gone: Sequence[str], timeout: float
) -> list[str]:
    """Let the leader go on writing a snapshot every interval (each write closes the segments before it)
    until the cleaner has removed every record of the snapshots ``gone`` -- their tombstones included --
    and every manifest but the leader's own term's, tombstones included. Returns the ids written."""
    channel = job.writer.channel
    mine = manifest_key(channel, job.leadership.term())
    written: list[str] = []

    def compacted() -> bool:
        written.append(write_snapshot(job))
        st = snapshot_topic_state(transport, snapshot_topic)
        return not set(gone) & set(st.ids) and st.manifests == {mine} and st.manifest_tombstones == 0

    wait_for(
        compacted,
        timeout,
        interval=0.05,
        message=lambda: (
            f"snapshots {list(gone)} and older terms' manifests compacted away "
            f"(the topic holds {snapshot_topic_state(transport, snapshot_topic)})"
        ),
    )
    return written
