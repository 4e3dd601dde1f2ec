"""KafkaTransport, Follower and ChannelClient against the librdkafka mock cluster (the real Kafka protocol)."""

from __future__ import annotations

import random
import signal
import threading
import zlib
from typing import Any

import pytest

from tests.support.kafka import MOCK_PARTITIONS, KafkaEnv, by_partition, keys_per_partition
from tests.support.procs import Procs
from tests.support.waiting import wait_for
from trimtab.channel.bundles import BundleLayout
from trimtab.channel.client import ChannelClient
from trimtab.channel.records import Record, State, encode, make
from trimtab.channel.replayfile import table_report
from trimtab.channel.snapshot import (
    SNAPSHOT_PARTITION,
    SnapshotWriter,
    choose,
    read_snapshot_topic,
    snapshot_messages,
)
from trimtab.channel.stall import StallWatch
from trimtab.channel.table import partition_for, replay
from trimtab.channel.transport import Follower, Message
from trimtab.errors import SnapshotTopicError, TransportError

pytestmark = pytest.mark.integration


def produce_all(kafka: KafkaEnv, topic: str, items: list[tuple[bytes, bytes | None]]) -> list[Message]:
    futures = [kafka.transport.produce(topic, k, v) for k, v in items]
    return [f.result(15) for f in futures]


def partitioner_keys(count: int, seed: int = 7) -> list[bytes]:
    """Keys of every kind the channel and load topics use, and then some."""
    rng = random.Random(seed)
    keys = [b"", b"a", b"broker-1:8080", "tenant/ns-é/0x00000000_0xffffffff".encode()]
    for i in range(8):
        keys.extend(k.encode() for k in BundleLayout.default(f"tenant-{i}/ns{i}", 64).bundles)
    keys.extend(f"persistent://t/ns/topic-{i}".encode() for i in range(200))
    while len(keys) < count:
        keys.append(rng.randbytes(rng.randint(1, 64)))
    return keys


# ---------------------------------------------------------------------------------------------- producing


def test_consistent_partitioner_is_crc32_mod_partitions(kafka: KafkaEnv) -> None:
    """The table view skips records outside partition crc32(key) % n: the producer must agree, always."""
    topic = kafka.topic("partitioner")
    assert kafka.transport.partitions(topic) == MOCK_PARTITIONS
    keys = partitioner_keys(3000)
    written = produce_all(kafka, topic, [(k, b"v") for k in keys])

    mismatches = [
        (m.key, m.partition) for m in written if m.partition != zlib.crc32(m.key or b"") % MOCK_PARTITIONS
    ]
    assert not mismatches, (
        f"librdkafka's consistent partitioner disagrees with crc32 % n for {mismatches[:5]}"
    )
    assert all(m.partition == partition_for(m.key or b"", MOCK_PARTITIONS) for m in written)
    assert {m.partition for m in written} == set(range(MOCK_PARTITIONS))

    # And the records are where the producer said, for a reader too.
    read = kafka.read_all(topic)
    assert sorted((m.key, m.partition, m.offset) for m in read) == sorted(
        (m.key, m.partition, m.offset) for m in written
    )


def test_produce_consume_round_trip(kafka: KafkaEnv) -> None:
    topic = kafka.topic("roundtrip")
    items: list[tuple[bytes, bytes | None]] = [
        (f"k{i % 37}".encode(), f"value-{i}".encode()) for i in range(500)
    ]
    items += [(b"k1", None), (b"binary", bytes(range(256))), (b"big", b"x" * 200_000)]
    written = produce_all(kafka, topic, items)
    assert [(m.key, m.value) for m in written] == items

    read = kafka.read_all(topic)
    assert len(read) == len(items)
    for partition, msgs in by_partition(read):
        assert [m.offset for m in msgs] == list(range(len(msgs))), f"gap or reorder in partition {partition}"
    # Per key, values come back in the order they were written (one key, one partition).
    for key in {k for k, _ in items}:
        assert [m.value for m in read if m.key == key] == [v for k, v in items if k == key]


def test_send_reports_each_delivery_without_a_future(kafka: KafkaEnv) -> None:
    """``send`` (the failover's bulk path): one report per record -- None once written, in the key's
    partition like ``produce`` -- and a TransportError for a record the producer cannot take."""
    topic = kafka.topic("send")
    keys = partitioner_keys(200)
    reports: list[tuple[bytes, TransportError | None]] = []
    lock = threading.Lock()

    def report(key: bytes) -> Any:
        def done(err: TransportError | None) -> None:
            with lock:
                reports.append((key, err))

        return done

    for k in keys:
        kafka.transport.send(topic, k, b"v-" + k, report(k))
    too_big = b"x" * (4 << 20)  # over the producer's message.max.bytes
    kafka.transport.send(topic, b"big", too_big, report(b"big"))
    wait_for(lambda: len(reports) == len(keys) + 1, timeout=15, message="a report for every record")
    by_key = dict(reports)
    assert len(by_key) == len(reports), "exactly one report per record"
    assert all(by_key[k] is None for k in keys)
    assert isinstance(by_key[b"big"], TransportError) and topic in str(by_key[b"big"])
    got = {m.key: (m.partition, m.value) for m in kafka.read_all(topic)}
    assert got == {k: (zlib.crc32(k) % MOCK_PARTITIONS, b"v-" + k) for k in keys}


def test_a_delivery_report_that_raises_does_not_stop_the_others(kafka: KafkaEnv) -> None:
    """Reports run on the producer's delivery thread: one callback's exception must not end it, or every
    later record would go unacknowledged."""
    topic = kafka.topic("send-raises")
    got: list[TransportError | None] = []

    def broken(err: TransportError | None) -> None:
        raise RuntimeError("a caller's bug")

    for i in range(20):
        kafka.transport.send(topic, b"r%d" % i, b"x", broken)
    wait_for(lambda: kafka.transport.flush(5) == 0, timeout=15, message="the broken reports delivered")
    for i in range(20):
        kafka.transport.send(topic, b"k%d" % i, b"y", got.append)
    wait_for(lambda: len(got) == 20, timeout=15, message="every later record reported")
    assert got == [None] * 20


def test_a_produce_whose_waiter_gave_up_does_not_stop_the_others(kafka: KafkaEnv) -> None:
    """``asyncio.wait_for(asyncio.wrap_future(f), t)`` cancels ``f`` when it times out (the leader's writes
    do that); the record's delivery report still comes and must not end the delivery thread."""
    topic = kafka.topic("produce-cancelled")
    abandoned = [kafka.transport.produce(topic, b"a%d" % i, b"x") for i in range(20)]
    assert all(f.cancel() for f in abandoned)
    wait_for(lambda: kafka.transport.flush(5) == 0, timeout=15, message="the abandoned records delivered")
    later = [kafka.transport.produce(topic, b"k%d" % i, b"y") for i in range(20)]
    assert [f.result(15).key for f in later] == [b"k%d" % i for i in range(20)]


def test_watermarks_follow_the_writes(kafka: KafkaEnv) -> None:
    topic = kafka.topic("watermarks")
    assert [kafka.transport.watermarks(topic, p) for p in range(MOCK_PARTITIONS)] == [
        (0, 0)
    ] * MOCK_PARTITIONS
    written = produce_all(kafka, topic, [(f"w{i}".encode(), b"x") for i in range(101)])
    per_partition = {p: len(ms) for p, ms in by_partition(written)}
    for p in range(MOCK_PARTITIONS):
        assert kafka.transport.watermarks(topic, p) == (0, per_partition.get(p, 0))


def test_unknown_topic_is_auto_created_with_four_partitions(kafka: KafkaEnv) -> None:
    # A topic nobody made: the transport creates it through the admin API, with four partitions.
    assert kafka.transport.partitions(f"{kafka.prefix}-never-seen") == MOCK_PARTITIONS


# ---------------------------------------------------------------------------------------------- following


class Collector:
    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.at_ready: int | None = None
        self.lock = threading.Lock()

    def apply(self, msgs: list[Message]) -> None:
        with self.lock:
            self.messages.extend(msgs)

    def ready(self) -> None:
        self.at_ready = len(self.messages)

    def count(self) -> int:
        with self.lock:
            return len(self.messages)


def test_follower_is_ready_at_the_start_high_watermark_then_follows_the_tail(kafka: KafkaEnv) -> None:
    topic = kafka.topic("follow")
    backlog = produce_all(kafka, topic, [(f"b{i}".encode(), f"{i}".encode()) for i in range(1000)])
    highs = {p: kafka.transport.watermarks(topic, p)[1] for p in range(MOCK_PARTITIONS)}

    got = Collector()
    follower = Follower(kafka.transport, topic, got.apply, on_ready=got.ready, batch=64)
    follower.start()
    try:
        assert follower.wait_ready(15), f"not ready: {follower.error}"
        # Ready exactly when the backlog that existed at start was applied, not before and not later.
        assert got.at_ready == len(backlog)
        assert follower.highwater == highs
        assert follower.lag() == 0
        assert follower.history_gap is False

        tail = produce_all(kafka, topic, [(f"t{i}".encode(), f"tail{i}".encode()) for i in range(300)])
        wait_for(
            lambda: got.count() == len(backlog) + len(tail), 10, message="the follower receives the tail"
        )
        assert follower.records == len(backlog) + len(tail)
        for partition, msgs in by_partition(got.messages):
            assert [m.offset for m in msgs] == list(range(len(msgs))), f"partition {partition} out of order"
        assert {(m.key, m.value) for m in got.messages} == {(m.key, m.value) for m in backlog + tail}
        ends = {p: kafka.transport.watermarks(topic, p)[1] for p in range(MOCK_PARTITIONS)}
        wait_for(lambda: follower.positions == ends, 5, message="positions reach the end")
    finally:
        follower.stop()
    assert follower.error is None


def test_a_follower_whose_kafka_consumer_stops_fetching_reopens_it_and_reads_on(kafka: KafkaEnv) -> None:
    """librdkafka can stop fetching an assigned partition without a word (after every broker of a cluster
    restarted); here the consumer is paused, which looks the same from outside. The follower's stall watch
    (a 1 s interval instead of 10) reopens the reader at its positions: every record read, once, in order."""
    topic = kafka.topic("stall")
    backlog = produce_all(kafka, topic, [(f"b{i}".encode(), f"{i}".encode()) for i in range(50)])
    readers: list[Any] = []
    transport = kafka.transport

    class Kept:  # the transport, keeping the readers it opens
        def __getattr__(self, name: str) -> Any:
            return getattr(transport, name)

        def reader(self, topic: str, start: dict[int, int], *, low_latency: bool = True) -> Any:
            r = transport.reader(topic, start, low_latency=low_latency)
            readers.append(r)
            return r

    got = Collector()
    follower = Follower(Kept(), topic, got.apply, on_ready=got.ready)  # type: ignore[arg-type]
    follower._watch = StallWatch(1.0)
    follower.start()
    try:
        assert follower.wait_ready(15), f"not ready: {follower.error}"
        first = readers[0]
        first._c.pause(first._parts)
        tail = produce_all(kafka, topic, [(f"t{i}".encode(), f"tail{i}".encode()) for i in range(100)])
        wait_for(lambda: got.count() == len(backlog) + len(tail), 30, message="the tail read after the stall")
        assert follower.stalls == 1 and len(readers) == 2
        for partition, msgs in by_partition(got.messages):
            assert [m.offset for m in msgs] == list(range(len(msgs))), f"partition {partition} out of order"
    finally:
        follower.stop()
    assert follower.error is None


def test_follower_on_an_empty_topic_is_ready_at_once(kafka: KafkaEnv) -> None:
    got = Collector()
    follower = Follower(kafka.transport, kafka.topic("empty"), got.apply, on_ready=got.ready)
    follower.start()
    try:
        assert follower.wait_ready(10)
        assert got.at_ready == 0
        assert follower.positions == dict.fromkeys(range(MOCK_PARTITIONS), 0)
    finally:
        follower.stop()


def test_follower_from_given_positions_skips_what_came_before(kafka: KafkaEnv) -> None:
    topic = kafka.topic("positions")
    written = produce_all(kafka, topic, [(f"p{i}".encode(), b"x") for i in range(200)])
    start = {p: len(ms) // 2 for p, ms in by_partition(written)}
    got = Collector()
    follower = Follower(kafka.transport, topic, got.apply, start=start, on_ready=got.ready)
    follower.start()
    try:
        assert follower.wait_ready(10)
        expected = sorted((m.partition, m.offset) for m in written if m.offset >= start[m.partition])
        assert sorted((m.partition, m.offset) for m in got.messages) == expected
    finally:
        follower.stop()


def test_follower_refuses_positions_beyond_the_end(kafka: KafkaEnv) -> None:
    topic = kafka.topic("recreated")
    errors: list[BaseException] = []
    follower = Follower(kafka.transport, topic, lambda _m: None, start={0: 1_000_000}, on_error=errors.append)
    follower.start()
    try:
        wait_for(
            lambda: follower.error is not None, 10, message="the follower reports the impossible position"
        )
        assert isinstance(follower.error, TransportError)
        assert "re-created" in str(follower.error)
        assert errors == [follower.error]
        assert not follower.ready.is_set()
    finally:
        follower.stop()


# ---------------------------------------------------------------------------------------------- channel client


def channel_log(
    rng: random.Random, bundles: list[str], steps: int, ts0: int = 1
) -> list[tuple[bytes, bytes | None]]:
    """A plausible channel with accepted and rejected records: assign/own/unload cycles with racing
    duplicates, stale versions, tombstones and garbage, generated against a model of the resolved table."""
    state: dict[str, Record | None] = dict.fromkeys(bundles)
    out: list[tuple[bytes, bytes | None]] = []
    brokers = ["a", "b", "c"]
    for step in range(steps):
        b = rng.choice(bundles)
        cur = state[b]
        ts = ts0 + step
        w = rng.choice(brokers)
        if cur is None:
            nxt: Record | None = make(State.ASSIGNING, version=1, ts=ts, writer=w, dst=w)
        elif cur.state is State.ASSIGNING:
            nxt = make(State.OWNED, version=cur.version + 1, ts=ts, writer=w, dst=cur.dst, src=cur.src)
        elif cur.state is State.OWNED:
            nxt = make(State.RELEASING, version=cur.version + 1, ts=ts, writer=w, src=cur.dst)
        elif cur.state is State.RELEASING:
            nxt = make(State.FREE, version=cur.version + 1, ts=ts, writer=w, src=cur.src)
        else:  # FREE
            nxt = None
        out.append((b.encode(), encode(nxt)))
        state[b] = nxt
        if rng.random() < 0.3 and nxt is not None:
            # A racing writer with the same version (rejected everywhere).
            loser = make(
                nxt.state, version=nxt.version, ts=ts, writer="loser", dst=nxt.dst or "x", src=nxt.src
            )
            out.append((b.encode(), encode(loser)))
        if rng.random() < 0.05:
            out.append((b.encode(), b"{garbage"))
    return out


def test_channel_client_bootstrap_from_snapshot_plus_tail_equals_full_replay(kafka: KafkaEnv) -> None:
    rng = random.Random(3)
    bundles = BundleLayout.default("snap/ns", 24).bundles
    topic, snap_topic = kafka.channel_topic, kafka.snapshot_topic
    produce_all(kafka, topic, channel_log(rng, bundles, 600))

    # The "leader": a live view, snapshotted (small chunks, so a snapshot is several messages).
    leader = ChannelClient(kafka.transport, topic, snap_topic, use_snapshot=False)
    leader.start()
    try:
        assert leader.wait_ready(15)
        writer = SnapshotWriter(kafka.transport, snap_topic, topic, writer="leader", chunk_bundles=5)
        first = writer.write(*leader.table.snapshot(), MOCK_PARTITIONS, term=1)
        assert first.chunks >= 3
        assert first.positions == {p: kafka.transport.watermarks(topic, p)[1] for p in range(MOCK_PARTITIONS)}

        # More history after the first snapshot, a second snapshot (older chunks tombstoned), then a tail.
        produce_all(kafka, topic, channel_log(rng, bundles, 300, ts0=10_000))
        wait_for(
            lambda: leader.lag() == 0 and positions_at_end(kafka, leader), 10, message="leader catches up"
        )
        second = writer.write(*leader.table.snapshot(), MOCK_PARTITIONS, term=2)
        tail = channel_log(rng, bundles, 300, ts0=20_000)
        produce_all(kafka, topic, tail)
    finally:
        leader.stop()

    snap_msgs = kafka.read_all(snap_topic)
    newest = choose(((m.key, m.value) for m in snap_msgs), channel=topic)
    assert newest is not None and newest.manifest.id == writer.last_id == second.id
    # The cleaner does not run within this test (large segments): the first snapshot's chunks are still
    # there, next to their tombstones.
    assert any(m.value is None for m in snap_msgs)

    node = ChannelClient(kafka.transport, topic, snap_topic)
    node.start()
    try:
        assert node.wait_ready(15), f"not ready: {node.error}"
        full = replay(kafka.read_all(topic), partitions=MOCK_PARTITIONS)
        assert node.snapshot is not None and node.snapshot.manifest.id == second.id
        assert node.follower is not None and node.follower.records == len(tail)  # only the tail was read
        assert node.table.as_dict() == full.as_dict()
        assert node.table.positions == full.positions

        # Still equal while it follows live.
        more = channel_log(rng, bundles, 200, ts0=30_000)
        produce_all(kafka, topic, more)
        wait_for(lambda: positions_at_end(kafka, node), 10, message="the node applies the live tail")
        assert node.table.as_dict() == replay(kafka.read_all(topic), partitions=MOCK_PARTITIONS).as_dict()
    finally:
        node.stop()


def positions_at_end(kafka: KafkaEnv, client: ChannelClient) -> bool:
    follower = client.follower
    assert follower is not None
    ends = {p: kafka.transport.watermarks(client.topic, p)[1] for p in range(MOCK_PARTITIONS)}
    return all(follower.positions.get(p, 0) >= e for p, e in ends.items())


def test_channel_client_ignores_a_snapshot_past_the_end_of_the_channel(kafka: KafkaEnv) -> None:
    """A snapshot of a previous incarnation of the channel (positions past its end) must not be used."""
    topic, snap_topic = kafka.channel_topic, kafka.snapshot_topic
    name = BundleLayout.default("stale/ns", 4).bundles[0]
    produce_all(
        kafka, topic, [(name.encode(), encode(make(State.ASSIGNING, version=1, ts=1, writer="a", dst="a")))]
    )
    bogus = {name: make(State.OWNED, version=7, ts=1, writer="old", dst="old")}
    for key, value in snapshot_messages(
        "old-1",
        bogus,
        {p: 1_000 for p in range(MOCK_PARTITIONS)},
        channel=topic,
        partitions=MOCK_PARTITIONS,
        writer="old",
    ):
        kafka.transport.produce(snap_topic, key, value, partition=SNAPSHOT_PARTITION).result(10)
    assert choose(read_snapshot_topic(kafka.transport, snap_topic), channel=topic) is not None

    node = ChannelClient(kafka.transport, topic, snap_topic)
    node.start()
    try:
        assert node.wait_ready(15)
        assert node.snapshot is None
        rec = node.table.get(name)
        assert rec is not None and rec.state is State.ASSIGNING and rec.dst == "a"
    finally:
        node.stop()


def test_a_snapshot_topic_with_more_than_one_partition_is_refused_by_default(kafka: KafkaEnv) -> None:
    """A snapshot topic someone created with four partitions: a misconfigured cluster, refused at start."""
    four = kafka.topic("snapshot-of-four-partitions")
    node = ChannelClient(kafka.transport, kafka.channel_topic, four)
    with pytest.raises(SnapshotTopicError) as err:
        node.start()
    assert four in str(err.value) and "exactly 1" in str(err.value)
    assert not node.ready


def test_a_history_gap_over_kafka_is_detected_and_recovered_from_a_snapshot(
    kafka: KafkaEnv, procs: Procs
) -> None:
    """A node paused (SIGSTOP) while retention deletes records it has not read -- done here with Kafka's
    DeleteRecords, exactly what retention does to a partition's start, without waiting for the broker's
    five-minute retention check -- must not jump ahead when it resumes. It stops being ready, counts the gap, waits for
    a snapshot that covers the retained channel, and then rebuilds exactly the table of a node that never
    paused."""
    topic, snap_topic = kafka.channel_topic, kafka.snapshot_topic
    bundles = BundleLayout.default("gap/ns", 8).bundles
    rng = random.Random(11)
    produce_all(kafka, topic, channel_log(rng, bundles, 200))

    node = procs.python_module(
        "tests.support.channel_node",
        "--bootstrap-servers",
        kafka.bootstrap_servers,
        "--topic",
        topic,
        "--snapshot-topic",
        snap_topic,
        name="laggard",
    )

    def status() -> dict[str, Any]:
        lines = [e for e in node.json_lines() if e.get("event") == "status"]
        return lines[-1] if lines else {}

    healthy = ChannelClient(kafka.transport, topic, snap_topic)
    healthy.start()
    try:
        assert healthy.wait_ready(15)
        wait_for(lambda: status().get("ready"), 30, message=lambda: f"laggard ready\n{procs.report()}")
        node.signal_group(signal.SIGSTOP)
        # ~6 MiB of incompressible junk into every partition: retention drops what the laggard has not read.
        produce_all(kafka, topic, channel_log(rng, bundles, 50, ts0=5_000))
        # In rounds of ~0.8 MiB a partition, letting the healthy node catch up after each: it must stay
        # within retention however slow this machine is, while the paused laggard falls behind it.
        junk: list[tuple[bytes, bytes | None]] = []
        for _ in range(8):
            batch = [(k, rng.randbytes(100_000)) for k in keys_per_partition("junk") for _ in range(8)]
            produce_all(kafka, topic, batch)
            junk += batch
            wait_for(lambda: positions_at_end(kafka, healthy), 30, message="the healthy node keeps up")
        # Retention: every partition's start moves past what the paused laggard has read.
        cut = {p: kafka.transport.watermarks(topic, p)[1] for p in range(MOCK_PARTITIONS)}
        delete_records(kafka.bootstrap_servers, topic, cut)
        produce_all(kafka, topic, channel_log(rng, bundles, 100, ts0=9_000))
        lows = {p: kafka.transport.watermarks(topic, p)[0] for p in range(MOCK_PARTITIONS)}
        assert lows == cut, f"the records were not deleted: {lows} != {cut}"
        wait_for(lambda: positions_at_end(kafka, healthy), 30, message="the healthy node keeps up")
        node.signal_group(signal.SIGCONT)

        gapped = wait_for(
            lambda: (st := status()).get("gaps", 0) >= 1 and not st["ready"] and st,
            30,
            message=lambda: f"the laggard reports the gap: {status()}\n{procs.report()}",
        )
        assert "history gap" in gapped["reason"], gapped
        # And it stays not ready: no snapshot covers the retained channel yet.
        assert not status().get("ready")

        # The leader writes a snapshot; the laggard recovers from it and equals the healthy node.
        writer = SnapshotWriter(kafka.transport, snap_topic, topic, writer="leader")
        writer.write(*healthy.table.snapshot(), MOCK_PARTITIONS, term=1)
        ends = {str(p): kafka.transport.watermarks(topic, p)[1] for p in range(MOCK_PARTITIONS)}
        final = wait_for(
            lambda: (st := status()).get("ready") and st["positions"] == ends and st,
            30,
            message=lambda: f"the laggard recovers and catches up: {status()}\n{procs.report()}",
        )
        assert final["recoveries"] >= 1
        assert final["table"] == table_report(healthy.table)["table"]
        # The junk was skipped (its keys are not bundle names), counted, never fatal.
        assert healthy.table.stats.skipped["bad_key"] == len(junk)
    finally:
        node.signal_group(signal.SIGCONT)
        healthy.stop()


def delete_records(bootstrap: str, topic: str, before: dict[int, int]) -> None:
    """Delete every record of ``topic`` before ``before[partition]`` (the admin API's DeleteRecords)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_records([TopicPartition(topic, p, off) for p, off in before.items()])
    for f in futures.values():
        f.result(30)
