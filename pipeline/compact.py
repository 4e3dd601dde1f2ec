"""``trimtab pipeline compact``: resolve the channel at scale with the nodes' own replay.

Plan (docs/pipeline.md): read the channel -- a live topic through the Kafka source, or an export file in
byte ranges -- as messages; hash-partition them by key (every message of a bundle lands in one task);
sort each task's messages by their place in the log; fold each task with :func:`pipeline.fold.fold`,
which is ``channel.table.TableView`` -- the replay every node runs, with ``channel.resolve.resolve`` --
over that task's bundles; collect the tasks' tables and counts on the driver. Why that is exactly a
node's table, and the second pass an export may need, is in ``pipeline.fold``.

The result is ``{"table", "stats"}`` in the shape and bytes of ``trimtab channel replay --json``, or a
snapshot published with the leader's snapshot writer (``channel.snapshot.SnapshotWriter``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import pyarrow as pa

from trimtab.channel.records import Record, encode
from trimtab.channel.table import ReplayStats
from trimtab.pipeline import kafka_io
from trimtab.pipeline.common import PipelineError, Progress
from trimtab.pipeline.exportfile import find_header
from trimtab.pipeline.fold import Covered, Partial, fold, report, two_pass
from trimtab.pipeline.packing import dest_values, pack_frame, unpack
from trimtab.pipeline.sources import DEFAULT_SPLIT_BYTES, kafka_frame, register

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: What a fold task returns: one row per resolved bundle ("r": name, data = the record's bytes), per
#: count ("a" accepted; "j"/"s" rejected/skipped with the reason in name) and per offset span ("m": name
#: "split:partition", n..n2).
FOLD_SCHEMA = "kind string, name string, n long, n2 long, data binary"
_FOLD_ARROW = pa.schema(
    [
        ("kind", pa.string()),
        ("name", pa.string()),
        ("n", pa.int64()),
        ("n2", pa.int64()),
        ("data", pa.binary()),
    ]
)
_record_decoder = msgspec.json.Decoder(Record)


@dataclass
class CompactResult:
    report: dict[str, Any]  # {"table", "stats"}: channel replay --json
    table: dict[str, Record]
    stats: ReplayStats
    records: int  # messages read (lines, for an export)
    passes: int = 1
    partitions: int | None = None  # the channel's partition count (home-partition rule), if known
    positions: dict[int, int] = field(default_factory=dict)  # the live channel: next offset not covered
    low_watermarks: dict[int, int] = field(default_factory=dict)


def partial_batch(part: Partial) -> pa.RecordBatch:
    kinds: list[str] = []
    names: list[str] = []
    ns: list[int] = []
    n2s: list[int | None] = []
    datas: list[bytes | None] = []

    def row(kind: str, name: str, n: int, n2: int | None = None, data: bytes | None = None) -> None:
        kinds.append(kind)
        names.append(name)
        ns.append(n)
        n2s.append(n2)
        datas.append(data)

    for bundle, rec in part.table.items():
        row("r", bundle, 0, None, encode(rec))
    row("a", "", part.stats.accepted)
    for reason, n in part.stats.rejected.items():
        row("j", str(reason), n)
    for reason, n in part.stats.skipped.items():
        row("s", reason, n)
    for (split, p), (lo, hi) in part.spans.items():
        row("m", f"{split}:{p}", lo, hi)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(kinds, pa.string()),
            pa.array(names, pa.string()),
            pa.array(ns, pa.int64()),
            pa.array(n2s, pa.int64()),
            pa.array(datas, pa.binary()),
        ],
        schema=_FOLD_ARROW,
    )


def partial_from_table(t: Any) -> Partial:
    """The merged result of every fold task (a pyarrow Table of FOLD_SCHEMA rows)."""
    out = Partial()
    cols = t.to_pydict()
    for kind, name, n, n2, data in zip(
        cols["kind"], cols["name"], cols["n"], cols["n2"], cols["data"], strict=True
    ):
        if kind == "r":
            if name in out.table:
                raise PipelineError(f"bundle {name!r} was folded by two tasks: the partitioning is broken")
            out.table[name] = _record_decoder.decode(data)
        elif kind == "a":
            out.stats.accepted += n
        elif kind == "j":
            out.stats.rejected[name] += n
        elif kind == "s":
            out.stats.skipped[name] += n
        elif kind == "m":
            split, _, p = name.partition(":")
            k = (int(split), int(p))
            old = out.spans.get(k)
            out.spans[k] = (n, n2) if old is None else (min(old[0], n), max(old[1], n2))
    return out


def fold_tasks(
    partitions: int | None, covered: Covered | None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function each fold task runs (mapInArrow): its packed messages, in log order (``pipeline.packing``),
    through one TableView."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield partial_batch(fold(unpack(batches), partitions, covered))

    return run


#: Bytes of packed rows per Arrow batch the JVM hands a fold task. Spark's own bound is 10 000 rows a
#: batch, which for packed rows (``packing``: up to 256 KiB each) would be a whole task's input -- gigabytes
#: of a large channel -- in one buffer, grown by doubling in fresh memory: on a 10 M-record compaction the
#: JVM spent ~4 CPU-seconds in the kernel zeroing those pages. A few MB a batch bounds the memory and ends
#: that.
FOLD_BATCH_BYTES = 4 << 20
_MAX_BYTES_PER_BATCH = "spark.sql.execution.arrow.maxBytesPerBatch"


@contextlib.contextmanager
def _session_setting(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    """``key`` set to ``value`` in the session while the block runs, then as it was."""
    old = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if old is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, old)


def fold_frame(packed: DataFrame, partitions: int | None, covered: Covered | None, tasks: int) -> Partial:
    """Run the fold over a DataFrame of packed messages (``packing.PACKED_SCHEMA``, its ``dest`` values
    from ``packing.dest_values(spark, tasks)``) and merge the tasks' results on the driver."""
    out = (
        packed.repartition(tasks, "dest")
        .sortWithinPartitions("first")
        .mapInArrow(fold_tasks(partitions, covered), FOLD_SCHEMA)
    )
    with _session_setting(packed.sparkSession, _MAX_BYTES_PER_BATCH, str(FOLD_BATCH_BYTES)):
        table = out.toArrow()
    return partial_from_table(table)


def default_tasks(spark: SparkSession) -> int:
    return int(spark.conf.get("spark.sql.shuffle.partitions") or 4)


def compact_export(
    spark: SparkSession,
    path: str,
    *,
    partitions: int | None = None,
    split_bytes: int = DEFAULT_SPLIT_BYTES,
    min_splits: int | None = None,
    tasks: int | None = None,
    progress: Progress | None = None,
) -> CompactResult:
    """Resolve a channel export (the file ``trimtab channel replay FILE`` reads) on Spark."""
    say = progress or Progress("compact", quiet=True)
    if not os.path.isfile(path):
        raise PipelineError(f"{path}: no such file")
    register(spark)
    header = find_header(path)
    parts = partitions if partitions is not None else (header.partitions if header is not None else None)
    n_tasks = tasks or default_tasks(spark)
    messages = (
        spark.read.format("trimtab_channel_export")
        .option("path", os.path.abspath(path))
        .option("headerPos", "" if header is None else str(header.pos))
        .option("splitBytes", str(split_bytes))
        .option("minSplits", str(min_splits or spark.sparkContext.defaultParallelism))
        .option("dests", ",".join(map(str, dest_values(spark, n_tasks))))
        .load()
    )
    say(f"folding {path} ({os.path.getsize(path)} bytes) in {n_tasks} tasks")

    def run(covered: Covered | None) -> Partial:
        if covered:
            say(f"offsets re-delivered across file ranges: second pass ({len(covered)} ranges)")
        return fold_frame(messages, parts, covered, n_tasks)

    result, passes = two_pass(run)
    extra = {"bad_line": 1} if header is not None and header.problem is not None else {}
    rep = report(result.table, result.stats, extra)
    stats = rep["stats"]
    lines = stats["accepted"] + stats["rejected"] + stats["skipped"]
    return CompactResult(rep, result.table, result.stats, lines, passes, parts)


def compact_kafka(
    spark: SparkSession,
    bootstrap_servers: str,
    topic: str,
    *,
    client_config: dict[str, str] | None = None,
    reader: str | None = None,
    tasks: int | None = None,
    max_records: int = 1_000_000,
    progress: Progress | None = None,
) -> CompactResult:
    """Resolve the live channel from its low watermarks to the high watermarks seen now (what a full
    replay reads, as ``trimtab channel dump --no-snapshot``)."""
    say = progress or Progress("compact", quiet=True)
    register(spark)
    config = kafka_io.client_config(bootstrap_servers, client_config)
    marks = kafka_io.watermarks(config, topic)
    bounds = {p: (lo, hi) for p, (lo, hi) in marks.items()}
    lows = {p: lo for p, (lo, _) in marks.items() if lo > 0}
    if lows:
        say(
            f"warning: retention deleted the start of {topic} (first retained offsets {lows}): the table "
            "covers the retained records only, as `channel dump --no-snapshot` does"
        )
    total = sum(e - s for s, e in bounds.values())
    n_tasks = tasks or default_tasks(spark)
    say(f"folding {total} records of {topic} ({len(bounds)} partitions) in {n_tasks} tasks")
    from pyspark.sql import functions as sf

    raw = kafka_frame(
        spark,
        bootstrap_servers,
        topic,
        bounds,
        client_config=client_config,
        reader=reader,
        max_records=max_records,
    )
    messages = raw.select(
        sf.col("key"),
        sf.col("value"),
        sf.col("partition"),
        sf.lit(None).cast("long").alias("offset"),  # Kafka never re-delivers within one read
        sf.col("offset").alias("order"),
        sf.lit(0).alias("split"),
        sf.lit(False).alias("bad"),
    )
    result = fold_frame(pack_frame(messages, dest_values(spark, n_tasks)), len(bounds), None, n_tasks)
    rep = report(result.table, result.stats)
    return CompactResult(
        rep,
        result.table,
        result.stats,
        total,
        1,
        len(bounds),
        {p: e for p, (_, e) in bounds.items()},
        {p: lo for p, (lo, _) in marks.items()},
    )


def current_term(messages: list[tuple[bytes | None, bytes | None]], channel: str) -> int:
    """The highest leader term among the snapshot topic's manifests of ``channel`` (0 when none)."""
    from trimtab.channel.snapshot import MANIFEST_PREFIX, decode_manifest
    from trimtab.channel.values import Refused

    prefix = MANIFEST_PREFIX + channel.encode() + b"/"
    term = 0
    for key, value in messages:
        if key is not None and value is not None and key.startswith(prefix):
            m = decode_manifest(value)
            if not isinstance(m, Refused) and m.channel == channel:
                term = max(term, m.term)
    return term


def publish_snapshot(
    result: CompactResult,
    *,
    bootstrap_servers: str,
    channel_topic: str,
    snapshot_topic: str,
    client_config: dict[str, str] | None = None,
    term: int | None = None,
    chunk_bundles: int = 2000,
    writer: str = "trimtab-pipeline",
) -> tuple[str, int]:
    """Publish the resolved live channel as a snapshot, with the leader's own writer (chunks, durable,
    then the manifest; docs/protocol.md section 5). Returns (snapshot id, term).

    ``term`` None: the highest term of the channel's manifests already there, so this snapshot -- later
    in the topic -- is the one nodes bootstrap from next (until the leader writes a newer one). The
    writer learns no other keys, so it collects nothing of anyone else's; the leader's next snapshot
    collects this one's chunks.
    """
    from trimtab.channel.kafka import KafkaTransport
    from trimtab.channel.snapshot import SnapshotWriter, check_snapshot_topic, read_snapshot_topic

    if result.partitions is None or not result.positions:
        raise PipelineError("only a table resolved from the live channel can be published (its positions)")
    transport = KafkaTransport(bootstrap_servers, client_config=client_config, client_id="trimtab-pipeline")
    try:
        check_snapshot_topic(transport, snapshot_topic)
        if term is None:
            term = current_term(read_snapshot_topic(transport, snapshot_topic), channel_topic)
        w = SnapshotWriter(
            transport, snapshot_topic, channel_topic, writer=writer, chunk_bundles=chunk_bundles
        )
        manifest = w.write(dict(result.table), dict(result.positions), result.partitions, term)
        return manifest.id, term
    finally:
        transport.close()
