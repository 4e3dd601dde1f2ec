"""The PySpark pipeline on real Spark (local mode) against a real Apache Kafka (docs/pipeline.md).

* compaction of the live channel -- racing writers and poison on the real Kafka protocol -- equals the
  replay every node runs (``channel dump --no-snapshot``), and ``--publish`` writes a snapshot nodes
  bootstrap from to the same table;
* compaction of an export re-delivering offsets across byte ranges takes its second pass and still equals
  ``channel replay``, through the CLI, byte for byte;
* the Kafka source reads offset ranges and time-bounded ranges exactly, and Spark's connector reads the
  same ranges into the same rows (and the same ingested history);
* ingest is exactly once: reruns add only new records, and runs crashed after staging, after the commit
  and in the middle of moving files lose and duplicate nothing;
* a report from a recorded run of the local cluster shows what that cluster did.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tests.support.channel_race import run_writers
from tests.support.kafka import KafkaEnv
from tests.support.victims import agent_owning_most
from tests.support.waiting import wait_for
from trimtab.channel.client import ChannelClient
from trimtab.channel.records import State, encode, make
from trimtab.channel.replayfile import export_line, header_line, replay_lines, report_json, table_report
from trimtab.channel.table import TableView
from trimtab.cli.main import main
from trimtab.devkit.localcluster import LocalCluster, Node
from trimtab.pipeline import kafka_io
from trimtab.pipeline.compact import compact_kafka, publish_snapshot
from trimtab.pipeline.ingest import SimulatedCrash, ingest, read_table
from trimtab.pipeline.packing import dest_values
from trimtab.pipeline.report import write_report
from trimtab.pipeline.sources import kafka_frame, register, spark_connector_options

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _table_of(kafka: KafkaEnv, topic: str) -> TableView:
    """What a node computes: a full replay of everything the topic holds, in the order the reader gives."""
    view = TableView(kafka.transport.partitions(topic))
    view.apply_all(kafka.read_all(topic))
    return view


# ---------------------------------------------------------------------------------------------- compact


def test_compact_live_channel_equals_node_replay_and_publishes_a_snapshot(
    spark: Any, kafka: KafkaEnv
) -> None:
    writers, expected_skips = run_writers(
        kafka.bootstrap_servers, kafka.channel_topic, writers=3, bundles=8, rounds=4
    )
    for w in writers:
        w.close()
    node = _table_of(kafka, kafka.channel_topic)
    result = compact_kafka(spark, kafka.bootstrap_servers, kafka.channel_topic, tasks=3)
    assert report_json(result.report) == report_json(table_report(node))
    # The race produced what the test is about: rejected racers and skipped poison, not just a table.
    assert result.stats.rejected and result.stats.accepted > 0
    assert Counter(result.stats.skipped) == expected_skips

    sid, term = publish_snapshot(
        result,
        bootstrap_servers=kafka.bootstrap_servers,
        channel_topic=kafka.channel_topic,
        snapshot_topic=kafka.snapshot_topic,
        chunk_bundles=5,
    )
    assert term == 0  # no leader wrote a snapshot of this channel
    # A node bootstrapping now installs the pipeline's snapshot and replays an empty tail.
    client = ChannelClient(kafka.new_transport(), kafka.channel_topic, kafka.snapshot_topic)
    client.start()
    try:
        assert client.wait_ready(30)
        assert client.snapshot is not None and client.snapshot.manifest.id == sid
        assert client.snapshot.positions == result.positions
        assert client.table.as_dict() == node.as_dict()
    finally:
        client.stop()


def test_compact_export_with_offsets_re_delivered_across_ranges_via_cli(spark: Any, tmp_path: Path) -> None:
    """Two exports of one channel concatenated: the second repeats offsets the first applied. A node
    ignores the repeats; the pipeline sees them only in its spans, and folds again without them."""
    partitions = 2
    lines = [header_line("ch", partitions)]
    written: list[tuple[bytes, int, int]] = []
    offsets = [0] * partitions
    for i in range(12):
        key = f"t/ns/0x{i:08x}_0x{i + 1:08x}".encode()
        p = zlib.crc32(key) % partitions
        for rec in (
            make(State.ASSIGNING, version=1, ts=i, writer="w", dst="b1:1"),
            make(State.OWNED, version=2, ts=i, writer="b1:1", dst="b1:1"),
        ):
            lines.append(export_line(key, encode(rec), p, offsets[p]))
            written.append((key, p, offsets[p]))
            offsets[p] += 1
    # The repeat: the same offsets again with other records (another broker), as a later export holds them.
    for key, p, offset in written[:8]:
        rec = make(State.ASSIGNING, version=1, ts=99, writer="w", dst="b2:2")
        lines.append(export_line(key, encode(rec), p, offset))
    lines.append(b"not an export line\n")
    body = b"".join(lines)
    export = tmp_path / "channel.jsonl"
    export.write_bytes(body)
    expected = report_json(table_report(replay_lines(io.BytesIO(body))))
    out = tmp_path / "table.json"
    res = CliRunner().invoke(
        main,
        [
            "pipeline",
            "compact",
            "--input",
            str(export),
            "--output",
            str(out),
            "--tasks",
            "3",
            "--split-bytes",
            "600",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "second pass" in res.stderr  # the repeats were in other byte ranges than the offsets they repeat
    assert out.read_bytes() == expected
    doc = orjson.loads(out.read_bytes())
    assert set(doc) == {"table", "stats"} and doc["stats"]["skipped_by_reason"] == {"bad_line": 1}
    # And the same through `channel replay --json`, the command whose output it must equal.
    replay = CliRunner().invoke(main, ["channel", "replay", str(export), "--json"])
    assert replay.exit_code == 0 and replay.stdout_bytes == out.read_bytes()


def test_compact_bounds_fold_batches_only_while_it_runs(spark: Any, tmp_path: Path) -> None:
    """The fold's Arrow batch bound (compact.FOLD_BATCH_BYTES) is set for the compaction's own job, and
    the session's setting is as the caller left it afterwards -- set or not."""
    from trimtab.pipeline.compact import compact_export

    key = "spark.sql.execution.arrow.maxBytesPerBatch"
    lines = [header_line("ch", 1)]
    for i in range(40):
        rec = make(State.ASSIGNING, version=1, ts=i, writer="w", dst="b1:1")
        lines.append(export_line(f"t/ns/0x{i:08x}_0x{i + 1:08x}".encode(), encode(rec), 0, i))
    export = tmp_path / "channel.jsonl"
    export.write_bytes(b"".join(lines))
    expected = report_json(table_report(replay_lines(io.BytesIO(b"".join(lines)))))
    before = spark.conf.get(key, None)
    got = compact_export(spark, str(export), tasks=2, split_bytes=500)
    assert report_json(got.report) == expected
    assert spark.conf.get(key, None) == before
    spark.conf.set(key, "123456789")
    try:
        got = compact_export(spark, str(export), tasks=3, split_bytes=700)
        assert report_json(got.report) == expected
        assert spark.conf.get(key) == "123456789"
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


def test_dest_values_give_each_bucket_a_task_of_its_own(spark: Any) -> None:
    """Spark's own hash partitioning sends the packed rows of bucket i to fold task i: no two buckets
    share a task (which would leave another idle) for any task count."""
    from pyspark.sql.functions import spark_partition_id

    for tasks in (1, 2, 3, 8, 13):
        dests = dest_values(spark, tasks)
        assert len(set(dests)) == tasks
        rows = (
            spark.createDataFrame([(d,) for d in dests], "dest int")
            .repartition(tasks, "dest")
            .select("dest", spark_partition_id().alias("task"))
            .collect()
        )
        assert {r["dest"]: r["task"] for r in rows} == {d: i for i, d in enumerate(dests)}


def test_compact_cli_refuses_what_it_cannot_do() -> None:
    r = CliRunner().invoke(main, ["pipeline", "compact", "--input", __file__, "--publish"])
    assert r.exit_code == 2 and "--publish needs the live channel" in r.output
    r = CliRunner().invoke(main, ["pipeline", "compact", "--partitions", "3"])
    assert r.exit_code == 2 and "--partitions is for --input" in r.output


def test_pipeline_without_the_spark_extra_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pyspark" else real(name, *a)
    )
    r = CliRunner().invoke(main, ["pipeline", "compact", "--input", __file__])
    assert r.exit_code == 1 and "pip install 'trimtab[spark]'" in r.output


# ---------------------------------------------------------------------------------------------- source


def test_kafka_source_reads_offset_ranges_and_time_bounds(spark: Any, kafka: KafkaEnv) -> None:
    topic = kafka.topic("raw")
    sent = []
    for i in range(40):
        value = None if i % 13 == 0 else struct.pack(">I", i) + b"\xff\xfe poison"  # bytes as they are
        sent.append(kafka.transport.produce(topic, f"k{i}".encode(), value).result(10))
    register(spark)
    config = kafka_io.client_config(kafka.bootstrap_servers)
    bounds = kafka_io.resolve_bounds(config, topic)
    assert sum(e - s for s, e in bounds.values()) == 40
    # Several tasks per partition (maxRecordsPerPartition): every record once, exact bytes.
    df = kafka_frame(spark, kafka.bootstrap_servers, topic, bounds, max_records=3)
    rows = df.collect()
    assert df.rdd.getNumPartitions() > len(bounds)
    got = {(r["partition"], r["offset"]): (r["key"], r["value"]) for r in rows}
    assert len(rows) == len(got) == 40
    assert got == {(m.partition, m.offset): (m.key, m.value) for m in sent}
    assert all(r["topic"] == topic and r["timestamp"] > 0 for r in rows)
    # Bounded by time: records whose timestamp is in [start, end), whatever their offsets.
    stamps = sorted(r["timestamp"] for r in rows)
    cut, stop = stamps[len(stamps) // 3], stamps[2 * len(stamps) // 3]
    window = (
        spark.read.format("trimtab_kafka")
        .option("bootstrap.servers", kafka.bootstrap_servers)
        .option("topic", topic)
        .option("startingTimestamp", str(cut))
        .option("endingTimestamp", str(stop))
        .load()
        .collect()
    )
    inside = {(r["partition"], r["offset"]) for r in rows if cut <= r["timestamp"] < stop}
    assert inside and {(r["partition"], r["offset"]) for r in window} == inside
    # The official connector gets the same ranges (assign, start and exclusive end offsets).
    opts = spark_connector_options(kafka.bootstrap_servers, topic, bounds, {"security.protocol": "SSL"})
    assert orjson.loads(opts["endingOffsets"]) == {
        topic: {str(p): e for p, (s, e) in bounds.items() if e > s}
    }
    assert opts["kafka.security.protocol"] == "SSL" and opts["failOnDataLoss"] == "true"


def _sorted_rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in df.collect())


def test_both_readers_read_the_same_ranges_into_equal_tables(
    spark: Any, kafka: KafkaEnv, tmp_path: Path
) -> None:
    """The Python data source and Spark's connector (``--reader python|connector``) read the same offset
    ranges of a real Kafka into the same rows, and an ingest through each writes the same history."""
    topics = {t: kafka.topic(t) for t in ("channel", "broker_load", "top_bundles", "events")}
    _produce(kafka, topics, 12, 0)
    for i in range(8):  # bytes as they are: empty and binary keys, no value
        key = b"" if i % 3 == 0 else bytes([i, 0xFF])
        kafka.transport.produce(topics["channel"], key, None, partition=i % 4)
    kafka.transport.flush(10)
    register(spark)
    config = kafka_io.client_config(kafka.bootstrap_servers)
    bounds = kafka_io.resolve_bounds(config, topics["channel"])
    # Starts and ends inside partitions, and an empty range.
    cut = {p: (s + (e - s) // 3, e - (e - s) // 4) for p, (s, e) in bounds.items()}
    cut[min(cut)] = (cut[min(cut)][0], cut[min(cut)][0])
    for ranges in (bounds, cut):
        by = {
            reader: _sorted_rows(
                kafka_frame(spark, kafka.bootstrap_servers, topics["channel"], ranges, reader=reader)
            )
            for reader in ("python", "connector")
        }
        assert by["python"] == by["connector"]
        assert len(by["python"]) == sum(e - s for s, e in ranges.values()) > 0
    # An ingest through each reader: the same rows in every table, the same offsets committed.
    runs = {
        reader: ingest(
            spark, tmp_path / reader, bootstrap_servers=kafka.bootstrap_servers, topics=topics, reader=reader
        )
        for reader in ("python", "connector")
    }
    assert runs["python"].offsets == runs["connector"].offsets
    assert runs["python"].rows == runs["connector"].rows and runs["python"].rows["channel"] == 21
    for table in topics:
        py, conn = (read_table(spark, tmp_path / r, table) for r in ("python", "connector"))
        assert _sorted_rows(py) == _sorted_rows(conn), table


# ---------------------------------------------------------------------------------------------- ingest


def _produce(kafka: KafkaEnv, topics: dict[str, str], n: int, start: int) -> None:
    t = kafka.transport
    for i in range(start, start + n):
        bundle = f"t/ns/0x{i:08x}_0x{i + 1:08x}"
        t.produce(
            topics["channel"],
            bundle.encode(),
            encode(make(State.ASSIGNING, version=1, ts=i, writer="w", dst="b1:1")),
        )
        t.produce(
            topics["events"], b"shed", orjson.dumps({"schema": 1, "ts": i, "kind": "shed", "reason": "test"})
        )
    # Poison, kept and flagged with its reason rather than lost or fatal.
    t.produce(topics["channel"], b"t/ns/0x00000000_0x00000001", b'{"schema":1,"state":')
    t.produce(topics["events"], b"shed", b"\xef\xbb\xbf{}")
    t.produce(
        topics["broker_load"],
        f"b{start}".encode(),
        orjson.dumps({"broker": f"b{start}", "weighted_max_ema": 0.5}),
    )
    t.produce(topics["broker_load"], b"bx", b"[1, 2")
    t.flush(10)


def _history_ids(spark: Any, out: Path, table: str) -> list[tuple[int, int]]:
    return [
        (r["partition"], r["offset"])
        for r in read_table(spark, out, table).select("partition", "offset").collect()
    ]


def test_ingest_is_exactly_once_across_reruns_and_crashes(
    spark: Any, kafka: KafkaEnv, tmp_path: Path
) -> None:
    topics = {t: kafka.topic(t) for t in ("channel", "broker_load", "top_bundles", "events")}
    out = tmp_path / "history"
    _produce(kafka, topics, 30, 0)
    first = ingest(spark, out, bootstrap_servers=kafka.bootstrap_servers, topics=topics)
    assert first.rows == {"channel": 31, "broker_load": 2, "top_bundles": 0, "events": 31}
    assert first.skipped["channel"] == {"malformed": 1} and first.skipped["events"] == {"bom": 1}
    assert first.skipped["broker_load"] == {"malformed": 1}
    again = ingest(spark, out, bootstrap_servers=kafka.bootstrap_servers, topics=topics)
    assert again.rows == dict.fromkeys(topics, 0)

    # Crash a run at each step, with new records each time; the next run must make it whole.
    crashing = {"channel": topics["channel"], "events": topics["events"]}
    produced = 30
    for point in ("staged", "committed", "moving"):
        _produce(kafka, topics, 10, produced)
        produced += 10
        with pytest.raises(SimulatedCrash):
            ingest(spark, out, bootstrap_servers=kafka.bootstrap_servers, topics=crashing, crash_at=point)
    last = ingest(spark, out, bootstrap_servers=kafka.bootstrap_servers, topics=topics)
    assert last.recovered  # the run crashed while moving files left some to move
    for table in ("channel", "events", "broker_load"):
        ids = _history_ids(spark, out, table)
        everything = {(m.partition, m.offset) for m in kafka.read_all(topics[table])}
        assert sorted(ids) == sorted(everything), table  # every record exactly once: none lost, none twice
    # The rows are the records, decoded: the channel keeps the exact bytes for compaction.
    channel = read_table(spark, out, "channel")
    raw = {(m.partition, m.offset): m.value for m in kafka.read_all(topics["channel"])}
    for r in channel.select("partition", "offset", "value", "state", "skip_reason").collect():
        assert r["value"] == raw[(r["partition"], r["offset"])]
        assert (r["state"] == "assigning") == (r["skip_reason"] is None)
    assert channel.where("skip_reason = 'malformed'").count() == 4  # one per _produce call
    # Runs 1 and 2; run 3 crashed before its commit, so the next run was run 3 again (committed, crashed
    # before moving), then 4 (crashed mid-move), then 5, which finished 4's moves first.
    assert sorted(p.name for p in (out / "_manifests").iterdir()) == [f"{i:08d}.json" for i in range(1, 6)]
    assert not (out / "_staging").exists()


# ---------------------------------------------------------------------------------------------- report

CLUSTER = {
    "load": {"report_interval_s": 0.5, "report_max_interval_s": 2.0},
    "shedding": {
        "interval_s": 2.0,
        "hit_count_threshold": 1,
        "broker_cooldown_s": 1.0,
        "bundle_grace_s": 5.0,
    },
    "zookeeper": {"session_timeout_s": 4.0},
    "healing": {"safe_mode_settle_s": 1.0, "grace_s": 0.0},
    "channel": {"monitor_interval_s": 2.0, "snapshot_interval_s": 5.0},
}


def kill_and_heal(cluster: LocalCluster) -> Node:
    """Kill -9 the agent owning the most bundles (a failure the leader heals) and wait until every
    bundle is owned elsewhere; returns the victim."""
    victim = agent_owning_most(cluster)
    survivor = next(a for a in cluster.agents if a is not victim)
    cluster.kill(victim.name)
    victim.proc.wait(5)
    wait_for(
        lambda: all(
            rec["state"] == "owned" and rec["dst"] != victim.broker
            for rec in cluster.ownership(survivor).values()
        ),
        60,
        message="the killed broker's bundles owned elsewhere",
    )
    return victim


def test_report_from_a_recorded_local_cluster_run(spark: Any, tmp_path: Path) -> None:
    def owner_of(cluster: LocalCluster, bundle: str) -> str | None:
        rec = cluster.ownership(cluster.agents[0]).get(bundle)
        return rec["dst"] if rec is not None and rec["state"] == "owned" else None

    with LocalCluster(tmp_path / "cluster", brokers=3, controllers=1, settings=CLUSTER) as cluster:
        looked_up = {cluster.lookup(f"persistent://public/ns-{i % 4}/t{i}")["bundle"] for i in range(24)}
        bundle = sorted(looked_up)[0]
        owner = owner_of(cluster, bundle)
        other = next(a.broker for a in cluster.agents if a.broker != owner)
        r = cluster.post(
            cluster.controller_nodes[0], "/v1/admin/transfer", {"bundle": bundle, "broker": other}
        )
        assert r.status_code == 202, r.text
        wait_for(lambda: owner_of(cluster, bundle) == other, 30, message="transfer done")
        brokers = {a.broker for a in cluster.agents}
        victim = kill_and_heal(cluster)
        history = tmp_path / "history"
        res = CliRunner().invoke(
            main,
            ["pipeline", "ingest", "--out", str(history), "--config", str(cluster.config_path), "--quiet"],
        )
        assert res.exit_code == 0, res.output
    report = write_report(spark, history, tmp_path / "report", target_std=0.25, tasks=3)
    page = (tmp_path / "report" / "index.html").read_text()
    for png in report.plots:
        data = (tmp_path / "report" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, png
        assert f"src='{png}'" in page
    agg = tmp_path / "report" / "aggregates"
    loads = pq.read_table(agg / "broker_load.parquet").to_pandas()
    assert set(loads["broker"]) == brokers
    moves = pq.read_table(agg / "moves.parquet").to_pandas()
    by_reason = moves.groupby("reason")["moves"].sum().to_dict()
    assert by_reason.get("admin: transfer") == 1
    assert by_reason.get("healing", 0) >= 1
    healing = pq.read_table(agg / "healing.parquet").to_pandas()
    assert victim.broker in set(healing["broker"])
    latency = pq.read_table(agg / "assignment_latency.parquet").to_pandas()
    assert latency["assignments"].sum() >= len(looked_up) and (latency["p50_ms"] >= 0).all()
    assert report.figures["brokers"] == len(brokers)

    # The same recorded run, replayed through the simulator under a tiny grid: one Spark task per point.
    from trimtab.pipeline.common import Progress
    from trimtab.pipeline.sweep import expand, rank_key
    from trimtab.pipeline.tune import tune_job
    from trimtab.sim.scenario import load_scenario

    grid = {"shedding.interval_s": [5.0, 60.0], "shedding.hit_count_threshold": [1]}
    scenario_out = tmp_path / "replayed.yaml"
    tuned = tune_job(
        spark,
        Progress("tune", quiet=True),
        history=str(history),
        grid=grid,
        configs=expand(grid),
        bucket_s=2.0,
        policy="transfer",
        seed=1,
        top=5,
        target_std=0.25,
        current={"shedding": {"interval_s": 60.0, "hit_count_threshold": 3}},
        scenario_out=scenario_out,
    )
    assert tuned["simulations"] == 2 and len(tuned["ranked"]) == 2
    assert tuned["ranked"] == sorted(tuned["ranked"], key=rank_key)
    assert all(r["violations_total"] == 0 and "error" not in r for r in tuned["ranked"])
    assert tuned["recommended"]["config"] == tuned["ranked"][0]["config"]
    import tomllib

    assert tomllib.loads(tuned["recommended"]["toml"]).get("shedding", {}).get("hit_count_threshold") == 1
    replayed = load_scenario(scenario_out)
    assert tuned["scenario"]["brokers"] == len(replayed.broker_specs()) >= 2
    assert "public/ns-0" in {n.name for n in replayed.namespaces}


# ---------------------------------------------------------------------------------------------- bench


@pytest.mark.timeout(600)  # a JVM for the master, a Kafka, and a JVM for the readers' round
def test_bench_pipeline_smoke(tmp_path: Path) -> None:
    """`trimtab bench pipeline` end to end on a tiny log, one master and one round (a JVM each), and both
    Kafka readers: figures come only with Spark tables equal to the in-process replay's. (More rounds and
    their medians are the same loop; one round keeps the test command within its budget.)"""
    import subprocess
    import sys

    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trimtab.cli",
            *("bench", "pipeline", "--records", "4000", "--bundles", "500", "--masters", "local[1]"),
            *("--tasks", "2", "--rounds", "1", "--workdir", str(tmp_path / "w"), "--output", str(out)),
            *("--warmup-records", "1000"),
        ],
        capture_output=True,
        timeout=480,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    result = orjson.loads(out.read_bytes())
    assert result["equal_to_in_process"] is True and result["records"] == 4000
    one = result["spark"]["local[1]"]
    assert one["records_per_s"] > 0 and one["bundles"] > 0
    assert len(one["runs"]) == 1 and result["rounds"] == 1
    assert one["seconds"] == one["runs"][0]["seconds"]
    assert result["in_process_replay"]["records_per_s"] > 0
    # The JVM's own costs in the timed run, from its management beans: what a warm-up leaves to compile.
    assert result["warmup_records"] == 1000
    assert all(r["jvm_jit_compile_s"] >= 0 and r["jvm_gc_s"] >= 0 for r in one["runs"]), one["runs"]
    # Both Kafka readers on a real Kafka, each round in one JVM with their order swapped; figures come only
    # with both tables equal to the in-process replay of what was produced.
    from trimtab.pipeline.sources import DEFAULT_READER

    readers = result["readers"]
    assert readers["records"] == 4000 and readers["default"] == DEFAULT_READER
    assert readers["fastest"] in ("python", "connector")
    for name in ("python", "connector"):
        got = readers[name]
        assert got["compact_records_per_s"] > 0 and got["read_records_per_s"] > 0
        assert [r["position"] for r in got["runs"]] == ([1] if name == "python" else [2])
        assert (
            got["compact_seconds"]["min"] <= got["compact_seconds"]["median"] <= got["compact_seconds"]["max"]
        )
