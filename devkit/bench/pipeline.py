"""``trimtab bench pipeline``: channel compaction on Spark, ``local[1]`` vs ``local[2]``, beside the in-process
replay of the same data (docs/benchmarks.md).

The data: the channel benchmark's seeded generator (``bench.channel.generate_log``: assignments,
transfers, unloads, ~5 % racing writers that must be rejected, ~0.1 % garbage that must be skipped),
written once as a channel export -- the file ``trimtab channel replay`` and ``trimtab pipeline compact
--input`` both read -- and kept in the work directory for later runs (it is deterministic per seed).

The measurements, each from the same file:

* **in-process**: ``channel.replayfile.replay_lines`` -- what ``trimtab channel replay FILE`` does: parse
  every line, replay it through one ``TableView`` -- on one core, in this process;
* **Spark**, once per master, each in a fresh process (a JVM of its own; ``pipeline_worker``): a warm-up
  compaction of a small prefix (starts the Python workers), then ``pipeline.compact.compact_export`` of the
  whole file, timed from the job's start to the table and counts collected on the driver. Its
  ``{"table", "stats"}`` must equal the in-process replay's byte for byte, or no figure is reported.

**The Kafka readers** (``--reader python|connector``, docs/pipeline.md): the same generator's first
``kafka_records`` records (at most 1 000 000 by default) produced into a real one-node Apache Kafka
(``devkit.kafka_server``), then, once per round in a fresh JVM on the last master (``pipeline_worker``),
each reader warmed up and timed twice: reading every record of the topic (count and bytes of every value:
every record crosses into Spark) and ``compact_kafka`` of the topic, whose table must equal the in-process
replay of what was produced, for both readers, or no figure is reported. The readers run back to back in
one JVM, their order swapped every round. ``readers.fastest`` is the reader with the lower median compact
time; ``readers.default`` what ``pipeline.sources.DEFAULT_READER`` says.

records/s = records in the file / wall seconds. The scaling figure is local[2] / local[1]; its target is
1.7. The machine's cores are shared (see ``loadavg``); CPU seconds of each run's process tree are reported
beside the wall time.

``rounds`` > 1 measures every master once per round, the masters back to back within a round, and
reports each run, the medians, and the scaling of each round (local[2] over the local[1] run next to it):
on a shared VM the same work drifts by 10-20 % within minutes, and a median of adjacent pairs is what
such a machine can tell.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trimtab.devkit.bench.common import BenchError, Progress, environment, loadavg

TARGET_SCALING = 1.7
WARMUP_RECORDS = 20_000
KAFKA_RECORDS = 1_000_000
READERS = ("python", "connector")


def _export(path: Path, records: int, bundles: int, seed: int, progress: Progress) -> dict[str, Any]:
    """Write the seeded log as an export (unless it is there already); returns what the generator intended."""
    from trimtab.channel.replayfile import export_lines
    from trimtab.devkit.bench.channel import generate_log

    meta = path.with_suffix(".expected.json")
    if path.exists() and meta.exists():
        progress(f"reusing {path} ({path.stat().st_size / 1e9:.2f} GB)")
        expected: dict[str, Any] = json.loads(meta.read_text())
        return expected
    progress(f"generating {records} records over {bundles} bundles (seed {seed})")
    t0 = time.monotonic()
    log = generate_log(records, bundles, seed=seed)
    progress(f"generated in {time.monotonic() - t0:.1f} s; writing {path}")
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        for line in export_lines(
            ((m.key, m.value, m.partition, m.offset) for m in log.messages),
            topic="bench",
            partitions=log.partitions,
        ):
            f.write(line)
    os.replace(tmp, path)
    expected = {"stats": log.expected_stats(), "bundles_in_table": len(log.final)}
    meta.write_text(json.dumps(expected))
    del log
    gc.collect()
    return expected


def _digest(report_bytes: bytes) -> str:
    return hashlib.sha256(report_bytes).hexdigest()


def run(
    *,
    records: int,
    bundles: int,
    seed: int,
    masters: list[str],
    tasks: int,
    split_bytes: int,
    workdir: Path,
    driver_memory: str,
    progress: Progress,
    rounds: int = 1,
    warmup_records: int = WARMUP_RECORDS,
    kafka_records: int | None = None,
) -> dict[str, Any]:
    from trimtab.channel.replayfile import replay_lines, report_json, table_report

    load_start = loadavg()
    workdir.mkdir(parents=True, exist_ok=True)
    data = workdir / f"channel-{records}-{bundles}-{seed}.jsonl"
    expected = _export(data, records, bundles, seed, progress)
    lines = records + 1  # the header

    progress("in-process replay (one core)")
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    with open(data, "rb") as f:
        view = replay_lines(f)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    reference = report_json(table_report(view))
    stats = view.stats.as_dict()
    del view
    gc.collect()
    if stats != {k: expected["stats"][k] for k in ("accepted", "rejected", "skipped")}:
        raise BenchError(f"in-process replay gave {stats}, the generator intended {expected['stats']}")
    inproc = {"seconds": round(wall, 2), "cpu_seconds": round(cpu, 2), "records_per_s": round(records / wall)}
    progress(f"in-process: {inproc['records_per_s']} records/s ({wall:.1f} s)")

    warm = workdir / "warmup.jsonl"
    with open(data, "rb") as src, open(warm, "wb") as dst:
        for i, line in enumerate(src):
            if i > warmup_records:
                break
            dst.write(line)

    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in masters}
    for r in range(rounds):
        for master in masters:
            got = _spark_run(
                master, data, warm, reference, tasks, split_bytes, driver_memory, workdir, progress
            )
            got["records_per_s"] = round(records / got["seconds"])
            runs[master].append(got)
            progress(
                f"Spark {master} (round {r + 1}/{rounds}): {got['records_per_s']} records/s "
                f"({got['seconds']:.1f} s)"
            )
    spark: dict[str, Any] = {}
    for master, got_runs in runs.items():
        median = {
            k: statistics.median(g[k] for g in got_runs)
            for k in ("seconds", "records_per_s", "cpu_seconds_process_tree")
        }
        spark[master] = {**got_runs[0], **median, "runs": got_runs}
    warm.unlink(missing_ok=True)

    result: dict[str, Any] = {
        "benchmark": "pipeline compact",
        "records": records,
        "lines": lines,
        "bundles": bundles,
        "seed": seed,
        "file_bytes": data.stat().st_size,
        "tasks": tasks,
        "split_bytes": split_bytes,
        "rounds": rounds,
        "warmup_records": warmup_records,
        "in_process_replay": inproc,
        "spark": spark,
        "equal_to_in_process": True,
    }
    if "local[1]" in spark and "local[2]" in spark:
        per_round = [
            two["records_per_s"] / one["records_per_s"]
            for one, two in zip(runs["local[1]"], runs["local[2]"], strict=True)
        ]
        scaling = statistics.median(per_round)
        result["scaling_per_round"] = [round(x, 3) for x in per_round]
        result["scaling_local2_over_local1"] = round(scaling, 3)
        result["target_scaling"] = TARGET_SCALING
        result["meets_target"] = scaling >= TARGET_SCALING
    result["readers"] = _readers(
        min(records, kafka_records or KAFKA_RECORDS),
        bundles,
        seed,
        masters[-1],
        tasks,
        driver_memory,
        rounds,
        workdir,
        progress,
    )
    result["environment"] = environment(load_start, "pyspark", "pyarrow", "msgspec")
    return result


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


Produced = list[tuple[bytes | None, bytes | None, int, int]]


def _kafka_log(records: int, bundles: int, seed: int) -> tuple[Produced, int, bytes]:
    """The generator's log as (key, value, partition, Kafka offset) in produce order, its partition count,
    and the in-process replay's ``{"table", "stats"}`` of it: what compacting the topic must give."""
    from trimtab.channel.replayfile import report_json, table_report
    from trimtab.channel.table import TableView
    from trimtab.devkit.bench.channel import generate_log

    log = generate_log(records, min(bundles, max(1, records // 2)), seed=seed)
    ends = [0] * log.partitions
    produced: Produced = []
    for m in log.messages:
        produced.append((m.key, m.value, m.partition, ends[m.partition]))
        ends[m.partition] += 1
    view = TableView(log.partitions)
    view.apply_all(produced)
    return produced, log.partitions, report_json(table_report(view))


def _produce(bootstrap_servers: str, topic: str, produced: Produced) -> None:
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap_servers,
            "linger.ms": 20,
            "compression.type": "lz4",
            "enable.idempotence": True,
            "queue.buffering.max.messages": 500_000,
        }
    )
    for key, value, part, _ in produced:
        while True:
            try:
                p.produce(topic, value=value, key=key, partition=part)
                break
            except BufferError:
                p.poll(0.1)
    if p.flush(120) != 0:
        raise BenchError("producing the readers' topic did not finish")


def _readers(
    records: int,
    bundles: int,
    seed: int,
    master: str,
    tasks: int,
    driver_memory: str,
    rounds: int,
    workdir: Path,
    progress: Progress,
) -> dict[str, Any]:
    """Both Kafka readers on the same topic of a real Kafka (see the module docstring)."""
    import shutil

    from trimtab.devkit.kafka_server import KafkaCluster
    from trimtab.pipeline.common import PipelineError
    from trimtab.pipeline.session import connector_jars
    from trimtab.pipeline.sources import DEFAULT_READER

    try:
        connector_jars()
    except PipelineError as e:
        raise BenchError(str(e)) from None
    produced, partitions, reference = _kafka_log(records, bundles, seed)
    kdir = workdir / "kafka"
    shutil.rmtree(kdir, ignore_errors=True)
    topic = "bench-channel"
    progress(f"readers: starting a one-node Kafka, producing {records} records")
    with KafkaCluster(kdir, brokers=1) as cluster:
        cluster.create_topics([topic], partitions=partitions)
        _produce(cluster.bootstrap_servers, topic, produced)
        del produced
        runs: dict[str, list[dict[str, Any]]] = {r: [] for r in READERS}
        for r in range(rounds):
            order = list(READERS) if r % 2 == 0 else list(reversed(READERS))
            out, table = workdir / "readers.json", workdir / "readers-table"
            progress(f"readers (round {r + 1}/{rounds}, {master}): {', '.join(order)}")
            cmd = [
                sys.executable,
                "-m",
                "trimtab.devkit.bench.pipeline_worker",
                *("--master", master, "--bootstrap-servers", cluster.bootstrap_servers, "--topic", topic),
                *("--readers", ",".join(order), "--tasks", str(tasks), "--driver-memory", driver_memory),
                *("--result", str(out), "--table", str(table)),
            ]
            if subprocess.run(cmd, check=False).returncode != 0:
                raise BenchError(f"the readers' run on {master} failed")
            got = json.loads(out.read_text())
            for reader in READERS:
                done = Path(f"{table}.{reader}")
                if _digest(done.read_bytes()) != _digest(reference):
                    raise BenchError(
                        f"reader {reader} compacted a different table than the in-process replay"
                    )
                done.unlink()
                one = got["readers"][reader]
                if one["records"] != records:
                    raise BenchError(f"reader {reader} read {one['records']} records, not {records}")
                one["round"] = r + 1
                one["position"] = order.index(reader) + 1
                runs[reader].append(one)
    figures: dict[str, Any] = {}
    for reader, got_runs in runs.items():
        read_s = [g["read_seconds"] for g in got_runs]
        compact_s = [g["compact_seconds"] for g in got_runs]
        figures[reader] = {
            "read_seconds": _spread(read_s),
            "read_records_per_s": round(records / statistics.median(read_s)),
            "compact_seconds": _spread(compact_s),
            "compact_records_per_s": round(records / statistics.median(compact_s)),
            "runs": got_runs,
        }
    fastest = min(READERS, key=lambda r: figures[r]["compact_seconds"]["median"])
    return {
        "records": records,
        "master": master,
        "rounds": rounds,
        **figures,
        "fastest": fastest,
        "default": DEFAULT_READER,
        "default_is_fastest": fastest == DEFAULT_READER,
    }


def _spark_run(
    master: str,
    data: Path,
    warm: Path,
    reference: bytes,
    tasks: int,
    split_bytes: int,
    driver_memory: str,
    workdir: Path,
    progress: Progress,
) -> dict[str, Any]:
    """One compaction of ``data`` on ``master`` in a fresh process; its table must equal ``reference``."""
    name = master.replace("[", "-").replace("]", "")
    out = workdir / f"result-{name}.json"
    table = workdir / f"table-{name}.json"
    progress(f"Spark {master}: a fresh JVM, a warm-up, then the whole file")
    cmd = [
        sys.executable,
        "-m",
        "trimtab.devkit.bench.pipeline_worker",
        "--master",
        master,
        "--input",
        str(data),
        "--warmup",
        str(warm),
        "--tasks",
        str(tasks),
        "--split-bytes",
        str(split_bytes),
        "--driver-memory",
        driver_memory,
        "--result",
        str(out),
        "--table",
        str(table),
    ]
    proc = subprocess.run(cmd, check=False)
    if proc.returncode != 0:
        raise BenchError(f"the Spark run on {master} failed (exit {proc.returncode})")
    got: dict[str, Any] = json.loads(out.read_text())
    if _digest(table.read_bytes()) != _digest(reference):
        raise BenchError(f"Spark on {master} resolved a different table or counts than the in-process replay")
    table.unlink()
    return got
