"""Compaction for real: Apache Kafka's log cleaner runs under the compacted topics while trimtab uses them.

Every Kafka the suite used before was the librdkafka mock, which never compacts; the session's real Kafka
does not either within a test (large segments, a 15 s cleaner backoff). These tests start a private
one-node Kafka whose cleaner looks for work every 100 ms and create their compacted topics with
``segment.ms`` of a few ms to 100 ms, ``min.cleanable.dirty.ratio`` 0.01, ``min.compaction.lag.ms`` 0 and
``delete.retention.ms`` of 100-200 ms (tests/support/compaction.py). Kafka cleans only closed segments and a
segment closes when a record arrives after ``segment.ms``; here records keep arriving the way they do in
production (live brokers report, the leader writes its next snapshot), and the tests re-read the topics
until the cleaner has done its work, under a deadline -- never a blind sleep.

1. A broker that leaves tombstones its load report (agent.reporter ``LoadReporter.tombstone``, on the
   agent's graceful stop): once the cleaner has run past ``delete.retention.ms``, a fresh reader of the
   broker-load and top-bundles topics sees no record at all of that broker, and the live brokers' latest
   reports are all still there.
2. The snapshot topic is cleaned while nodes bootstrap from it and the leader goes on writing newer
   snapshots (back to back, with channel history in between and new leaders of later terms): nodes start
   as the topic grows under each write, and every one must turn ready -- retrying whatever failed -- with,
   at that moment (``on_ready``), exactly the table a full replay of the channel gives up to the positions
   it covers: never a mix of two snapshots, never a snapshot with chunks missing, never a failure it does
   not retry out of. Retention deletes the channel before the previous snapshot after each write, so a
   node that finds no usable snapshot cannot fall back to a full replay: it meets a history gap and must
   recover. The class of bug of Apache Pulsar #19490 and #20110: compaction racing a reader of the
   compacted topic. The snapshot topic's segments are tiny (``internal.segment.bytes``), so the cleaner
   swaps a cleaned log in a few segments at a time and a reader can meet a half-cleaned log.
3. A node started after the cleaner has compacted the snapshot topic (old snapshots, and their tombstones,
   gone) bootstraps from the newest snapshot and the channel after it and reaches the table of a node that
   replayed the whole channel (never compacted: cleanup.policy=delete) from offset zero.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Iterator

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from tests.support.compaction import (
    CHANNEL_PARTITIONS,
    Bootstrapped,
    BootstrappingNode,
    ChannelArchive,
    ChannelHistory,
    CompactingKafka,
    bootstrap_during,
    cleaner_passes,
    full_replay,
    high_watermarks,
    leader_snapshot_job,
    mismatch,
    read_log,
    replay_up_to,
    snapshot_topic_state,
    start_compacting_cluster,
    write_snapshot,
    write_until_compacted,
)
from tests.support.waiting import wait_for
from trimtab.agent.adapters.simulated import SimulatedBroker
from trimtab.agent.metrics import AgentMetrics
from trimtab.agent.reporter import HostSampler, LoadReporter
from trimtab.balance.load import BrokerLoadData, TopBundles
from trimtab.channel.bundles import BundleLayout
from trimtab.channel.client import ChannelClient
from trimtab.channel.records import Record
from trimtab.channel.snapshot import choose, read_snapshot_topic
from trimtab.channel.table import partition_for
from trimtab.cluster.kvview import KeyValueView
from trimtab.config.settings import Settings
from trimtab.controller.snapshots import SnapshotJob
from trimtab.devkit.kafka_server import KafkaCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BROKERS = ["10.0.0.1:6650", "10.0.0.2:6650", "10.0.0.3:6650"]


@pytest.fixture(scope="module")
def compacting_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    cluster = start_compacting_cluster(tmp_path_factory.mktemp("kafka-compacting"))
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def ck(compacting_cluster: KafkaCluster, request: pytest.FixtureRequest) -> Iterator[CompactingKafka]:
    slug = "".join(ch if ch.isalnum() else "-" for ch in request.node.name)[:30].strip("-")
    env = CompactingKafka(compacting_cluster, f"c-{slug}-{uuid.uuid4().hex[:8]}")
    try:
        yield env
    finally:
        env.close()


def normal_positions(positions: dict[int, int]) -> dict[int, int]:
    return {p: o for p, o in positions.items() if o > 0}


# ---------------------------------------------------------------------------------------------- 1. load reports
def brokers_sharing_a_partition(partitions: int) -> tuple[str, list[str]]:
    """A leaving broker and two live ones, the first of which reports to the same partition as the leaving
    one (its reports are what close that partition's segments after the tombstone), the other elsewhere."""
    ids = [f"10.1.0.{i}:6650" for i in range(1, 200)]
    leaving = ids[0]
    home = partition_for(leaving.encode(), partitions)
    same = next(b for b in ids[1:] if partition_for(b.encode(), partitions) == home)
    other = next(b for b in ids[1:] if partition_for(b.encode(), partitions) != home)
    return leaving, [same, other]


def test_a_leaving_brokers_load_report_is_compacted_away(ck: CompactingKafka) -> None:
    load_topic = ck.compacted_topic("broker-load", 4, segment_ms=50, delete_retention_ms=200)
    top_topic = ck.compacted_topic("top-bundles", 4, segment_ms=50, delete_retention_ms=200)
    settings = Settings.model_validate(
        {
            "kafka": {
                "bootstrap_servers": ck.cluster.bootstrap_servers,
                "broker_load_topic": load_topic,
                "top_bundles_topic": top_topic,
            }
        }
    )
    leaving, live = brokers_sharing_a_partition(4)
    reporters = {
        b: LoadReporter(
            b,
            SimulatedBroker(b, settings.sim),
            ck.transport(f"agent-{b}"),
            settings,
            AgentMetrics.create(CollectorRegistry()),
            host=HostSampler(settings),
        )
        for b in [leaving, *live]
    }

    def report(broker: str) -> None:
        r = reporters[broker]
        r.load_moved()  # publish now (a bundle moved), whatever the thresholds say
        asyncio.run(r.report_once())

    for _ in range(3):
        for b in reporters:
            report(b)
    # The agent's graceful stop (agent.daemon Agent._shutdown): tombstone both reports.
    asyncio.run(reporters[leaving].tombstone())

    reader = ck.transport("reader")
    topics = (load_topic, top_topic)
    key = leaving.encode()
    for topic in topics:
        # Its last record is the tombstone (unless the cleaner was quicker still and removed them all).
        mine = [m for m in read_log(reader, topic) if m.key == key]
        assert not mine or mine[-1].value is None, f"{topic}: the leaving broker's last record: {mine[-1]}"

    def compacted() -> dict[str, list[tuple[bytes | None, bytes | None]]]:
        # The live brokers go on reporting: each report closes the segment before it, so the cleaner
        # gets to the tombstone, marks it, and removes it on a pass after delete.retention.ms.
        for b in live:
            report(b)
        logs = {t: [(m.key, m.value) for m in read_log(reader, t)] for t in topics}
        return {} if any(k == key for log in logs.values() for k, _ in log) else logs

    t0 = time.monotonic()
    logs = wait_for(
        compacted,
        timeout=30.0,
        interval=0.05,
        message=lambda: f"no record of {leaving} left in {topics}",
    )
    waited = time.monotonic() - t0
    written = {t: sum(high_watermarks(reader, t).values()) for t in topics}
    for topic, log in logs.items():
        assert {k for k, _ in log} == {b.encode() for b in live}, (topic, log)
        assert len(log) < written[topic] / 2, f"{topic}: the cleaner kept {len(log)} of {written[topic]}"

    # A fresh reader of each topic (the view agents and controllers keep) has every live broker's latest
    # report and nothing of the leaving one.
    loads = KeyValueView(ck.transport("fresh-loads"), load_topic, BrokerLoadData)
    tops = KeyValueView(ck.transport("fresh-tops"), top_topic, TopBundles)
    for view in (loads, tops):
        view.start()
    try:
        wait_for(lambda: loads.ready and tops.ready, 20.0, message="the fresh views caught up")
        assert loads.snapshot() == {b: reporters[b].published for b in live}
        assert sorted(tops.snapshot()) == sorted(live)
        assert all(t.broker == b for b, t in tops.snapshot().items())
        assert not loads.skipped and not tops.skipped
    finally:
        loads.stop()
        tops.stop()
    # The last raw record of each live broker decodes to the report it published last.
    last = dict(logs[load_topic])
    for b in live:
        value = last[b.encode()]
        assert value is not None
        assert msgspec.json.decode(value, type=BrokerLoadData) == reporters[b].published
    print(f"leaving broker's reports gone {waited:.1f}s after its tombstone")


# ---------------------------------------------------------------------------------------------- 2. the race
ROUNDS = 6
RACE_BUNDLES = 160
RACE_CHUNK_BUNDLES = 2  # ~80 chunks a snapshot, over many tiny segments
WRITES_PER_ROUND = 3
NODES_PER_ROUND = 6
NEW_LEADER_EVERY = 3


def bootstrap_failures(results: list[Bootstrapped], archive: ChannelArchive) -> list[str]:
    """Each node must have turned ready (retrying whatever failed) with, at that moment, exactly the table a
    full replay of the channel gives up to the positions it covered."""
    archive.catch_up()
    failures: list[str] = []
    for res in results:
        if res.error is not None or not res.ready:
            failures.append(f"{res.name}: error={res.error!r} ready={res.ready} ({res.reason})")
            continue
        want = replay_up_to(archive.messages, res.positions, CHANNEL_PARTITIONS).as_dict()
        if res.table != want:
            failures.append(
                f"{res.name} (snapshot {res.snapshot_id}, recoveries {res.recoveries}): "
                f"{mismatch(res.table, want)}"
            )
    return failures


def race_summary(
    results: list[Bootstrapped], writes: int, terms: int, passes: int, retained: int, end: int
) -> str:
    from_snapshot = [r for r in results if r.snapshot_id is not None]
    return (
        f"{len(results)} bootstraps during {writes} snapshot writes ({terms} terms): "
        f"{len(from_snapshot)} from a snapshot ({len({r.snapshot_id for r in from_snapshot})} different ones), "
        f"{len(results) - len(from_snapshot)} by full replay; history gaps met: {sum(r.gaps for r in results)}, "
        f"recoveries: {sum(r.recoveries for r in results)}; "
        f"cleaner passes over the snapshot topic: {passes}; it retains {retained} of {end} records"
    )


def test_snapshot_compaction_races_bootstrapping_nodes_and_newer_snapshots(ck: CompactingKafka) -> None:
    channel = ck.channel_topic()
    snaps = ck.compacted_topic("snapshot", 1, segment_ms=1, delete_retention_ms=100, segment_bytes=8192)
    bundles = BundleLayout.default("compact/race", RACE_BUNDLES).bundles
    leader_t = ck.transport("leader")
    leader = ChannelClient(leader_t, channel, snaps, retry_s=0.1, max_retry_s=0.5)
    leader.start()
    try:
        assert leader.wait_ready(20), leader.health()
        history = ChannelHistory(leader, bundles, BROKERS, seed=20110)
        history.round()
        term = 1
        job = leader_snapshot_job(
            leader_t, leader, snaps, term=term, me="c1", chunk_bundles=RACE_CHUNK_BUNDLES
        )
        covered = [leader.table.snapshot()[1]]
        written = [write_snapshot(job)]
        archive = ChannelArchive(ck.transport("archive"), channel)

        def leader_at_work(job: SnapshotJob) -> None:
            # What a leader does while nodes start: the channel moves on, and it writes a snapshot each
            # interval (here back to back: every write closes the segments of the one before, so the
            # cleaner removes the older snapshot while nodes may be reading it). Retention deletes the
            # channel before the previous snapshot: a node that finds no usable snapshot meets a history
            # gap, and must retry until it finds one.
            for _ in range(WRITES_PER_ROUND):
                history.round(share=0.25)
                positions = leader.table.snapshot()[1]  # what the write covers: nothing else writes
                written.append(write_snapshot(job))
                archive.retain_from(covered[-1])
                covered.append(positions)

        nodes_t = ck.transport("nodes")
        passes_before = cleaner_passes(ck.cluster, snaps)
        results: list[Bootstrapped] = []
        for rnd in range(ROUNDS):
            if rnd % NEW_LEADER_EVERY == NEW_LEADER_EVERY - 1:
                term += 1  # a new leader: it reads the snapshot topic (on_lead) before its first write
                job = leader_snapshot_job(
                    leader_t, leader, snaps, term=term, me=f"c{term}", chunk_bundles=RACE_CHUNK_BUNDLES
                )
            now = bootstrap_during(
                functools.partial(leader_at_work, job),
                nodes_t,
                channel,
                snaps,
                nodes=NODES_PER_ROUND,
                prefix=f"r{rnd}",
            )
            results += now
            failures = bootstrap_failures(now, archive)
            assert not failures, "\n".join([f"round {rnd}:", *failures])
        passes = cleaner_passes(ck.cluster, snaps) - passes_before
        state = snapshot_topic_state(nodes_t, snaps)
        snap_end = sum(high_watermarks(nodes_t, snaps).values())
        assert (
            leader.table.as_dict()
            == replay_up_to(archive.messages, archive.positions, CHANNEL_PARTITIONS).as_dict()
        )
    finally:
        leader.stop()

    summary = race_summary(results, len(written), term, passes, state.records, snap_end)
    from_snapshot = [r for r in results if r.snapshot_id is not None]
    print(summary)
    # The race really ran: the cleaner worked through the snapshot topic while the leader wrote and nodes
    # read it, and nodes did bootstrap from snapshots (most of them), not only by replay.
    assert passes >= ROUNDS * WRITES_PER_ROUND // 2, summary
    assert state.records < snap_end / 3, summary
    assert len(from_snapshot) >= len(results) // 2, summary


# ---------------------------------------------------------------------------------------------- 3. after
AFTER_BUNDLES = 120


def start_fresh_and_replaying_nodes(
    ck: CompactingKafka, channel: str, snaps: str
) -> tuple[Bootstrapped, ChannelClient, tuple[dict[str, Record], dict[int, int]]]:
    """A node that starts now (snapshot + tail) and one that replays the whole channel from offset zero,
    side by side: how the first one's bootstrap ended, the second one, and the second one's table."""
    fresh = BootstrappingNode("fresh", ck.transport("fresh"), channel, snaps)
    fresh.start()
    replayer = ChannelClient(ck.transport("replayer"), channel, snaps, use_snapshot=False)
    replayer.start()
    try:
        assert replayer.wait_ready(20), replayer.health()
        fresh.join(30)
        res = fresh.result
        assert res is not None and res.error is None and res.ready, res
        return res, replayer, replayer.table.snapshot()
    finally:
        replayer.stop()


def test_a_node_started_after_compaction_equals_a_full_replay(ck: CompactingKafka) -> None:
    channel = ck.channel_topic()
    snaps = ck.compacted_topic("snapshot", 1, segment_ms=20, delete_retention_ms=100)
    bundles = BundleLayout.default("compact/after", AFTER_BUNDLES).bundles
    leader_t = ck.transport("leader")
    reader = ck.transport("reader")
    leader = ChannelClient(leader_t, channel, snaps)
    leader.start()
    try:
        assert leader.wait_ready(20), leader.health()
        history = ChannelHistory(leader, bundles, BROKERS, seed=19490)
        job = leader_snapshot_job(leader_t, leader, snaps, term=1, me="c1", chunk_bundles=8)
        written: list[str] = []
        for rnd in range(6):
            history.round(share=0.7)
            if rnd == 3:  # a new leader, whose first snapshot tombstones the old term's manifest
                job = leader_snapshot_job(leader_t, leader, snaps, term=2, me="c2", chunk_bundles=8)
            written.append(write_snapshot(job))

        # The leader goes on writing a snapshot every interval until the cleaner has removed every earlier
        # snapshot -- tombstones included -- and term 1's manifest.
        t0 = time.monotonic()
        written += write_until_compacted(job, reader, snaps, gone=list(written), timeout=30.0)
        waited = time.monotonic() - t0
        after = snapshot_topic_state(reader, snaps)
        total = sum(high_watermarks(reader, snaps).values())
        assert after.records < total / 2, f"the cleaner kept {after.records} of {total} records"
        # What a node will find there is the newest snapshot, complete.
        newest = choose(read_snapshot_topic(reader, snaps), channel=channel, partitions=CHANNEL_PARTITIONS)
        assert newest is not None and newest.manifest.id == written[-1]

        # More history after the last snapshot: the tail a bootstrapping node must replay.
        history.round(share=0.7)
        history.round(share=0.7)
        wait_for(
            lambda: (
                normal_positions(leader.table.positions) == normal_positions(high_watermarks(reader, channel))
            ),
            10.0,
            message="the leader caught up",
        )

        res, replayer, full = start_fresh_and_replaying_nodes(ck, channel, snaps)
        ref = full_replay(reader, channel)
    finally:
        leader.stop()

    assert res.snapshot_id == written[-1], (
        f"bootstrapped from {res.snapshot_id}, not the newest {written[-1]}"
    )
    assert res.recoveries == 0 and res.gaps == 0
    assert replayer.snapshot is None and normal_positions(full[1]) == normal_positions(ref.positions)
    assert full[0] == ref.as_dict(), mismatch(full[0], ref.as_dict())
    assert res.table == full[0], mismatch(res.table, full[0])
    assert normal_positions(res.positions) == normal_positions(full[1])
    # The tail after the snapshot was real history, with transitions accepted and rejected.
    assert newest.positions != res.positions
    assert ref.stats.accepted > AFTER_BUNDLES and sum(ref.stats.rejected.values()) > 0
    print(
        f"snapshot topic compacted in {waited:.1f}s to {after.records} of {total} records; "
        f"node ready in {res.seconds:.2f}s from snapshot {res.snapshot_id} + tail, "
        f"{len(res.table)} bundles"
    )
