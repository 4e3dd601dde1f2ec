"""Spark Python data sources (Spark 4): Kafka offset ranges over confluent-kafka, and channel exports.

``trimtab_kafka`` reads a topic's offset ranges in parallel, one Spark partition per range:

    spark.read.format("trimtab_kafka")
        .option("bootstrap.servers", "host:9092").option("topic", "trimtab-channel")
        .option("ranges", '[[0, 0, 1500], [1, 0, 1720]]')     # [partition, start, end) ... or:
        .option("startingTimestamp", "1732406400000")          # / endingTimestamp (ms): records in
                                                               # [start, end) by their timestamps
        .option("maxRecordsPerPartition", "500000")            # cut long ranges into more tasks
        .option("kafka.security.protocol", "SASL_SSL")         # kafka.* -> the librdkafka client
        .load()   # topic, partition, offset, timestamp (ms), key, value

It needs nothing but pip packages (confluent-kafka, pyarrow) on the workers. The pipeline's jobs always
pass explicit ``ranges`` they planned on the driver (``pipeline.kafka_io``), so they know exactly what
they read; without ``ranges`` the source reads from ``startingOffsets`` (JSON, per partition) or the low
watermarks to the high watermarks. Time bounds are a filter on every record's timestamp (exact whatever
order producers' clocks wrote them in; the librdkafka mock cannot look offsets up by time either).

``trimtab_channel_export`` reads a channel export (docs/protocol.md section 8) in byte ranges, exactly as
``trimtab channel replay`` reads it (``pipeline.exportfile``).

Both are registered by :func:`register`; a worker imports this module to run them, so trimtab must be
installed where the executors run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from trimtab.pipeline import kafka_io
from trimtab.pipeline.common import PipelineError
from trimtab.pipeline.exportfile import Columns, find_header, plan_splits, read_split, read_split_buckets
from trimtab.pipeline.packing import MESSAGE_SCHEMA, PACKED_SCHEMA, messages_batch, pack_columns

KAFKA_SCHEMA = "topic string, partition int, offset long, timestamp long, key binary, value binary"
_KAFKA_ARROW = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
    ]
)
DEFAULT_MAX_RECORDS = 1_000_000
DEFAULT_SPLIT_BYTES = 64 << 20
#: Packed rows per Arrow batch an export reader hands Spark (a few MB: ``exportfile.BLOB_BYTES`` each).
PACKED_ROWS_PER_BATCH = 16


def kafka_client_options(options: Mapping[str, str]) -> dict[str, str]:
    """The ``kafka.*`` options, without the prefix: librdkafka settings (TLS, SASL...)."""
    return {
        k[len("kafka.") :]: v
        for k, v in options.items()
        if k.startswith("kafka.") and k != "kafka.bootstrap.servers"
    }


class _RangePartition(InputPartition):
    def __init__(self, r: kafka_io.OffsetRange) -> None:
        super().__init__((r.topic, r.partition, r.start, r.end))
        self.range = r


class KafkaReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options
        servers = options.get("bootstrap.servers") or options.get("kafka.bootstrap.servers")
        topic = options.get("topic")
        if not servers or not topic:
            raise ValueError("trimtab_kafka needs the options bootstrap.servers and topic")
        self.topic = topic
        self.config = kafka_io.client_config(servers, kafka_client_options(options))

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.options
        max_records = int(opts.get("maxRecordsPerPartition", DEFAULT_MAX_RECORDS))
        if "ranges" in opts:
            bounds = {int(p): (int(s), int(e)) for p, s, e in json.loads(opts["ranges"])}
        else:
            start = opts.get("startingOffsets")
            bounds = kafka_io.resolve_bounds(
                self.config,
                self.topic,
                start={int(p): int(o) for p, o in json.loads(start).items()} if start else None,
            )
        ranges = kafka_io.split_ranges(self.topic, bounds, max_records)
        return [_RangePartition(r) for r in ranges] or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        r = getattr(partition, "range", None)
        if r is None:
            return
        topic = r.topic
        start_ts, end_ts = self.options.get("startingTimestamp"), self.options.get("endingTimestamp")
        for got in kafka_io.read_range(self.config, r):
            rows = kafka_io.in_time(got, int(start_ts) if start_ts else None, int(end_ts) if end_ts else None)
            n = len(rows)
            if not n:
                continue
            parts, offsets, stamps, keys, values = zip(*rows, strict=True)
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array([topic] * n, pa.string()),
                    pa.array(parts, pa.int32()),
                    pa.array(offsets, pa.int64()),
                    pa.array(stamps, pa.int64()),
                    pa.array(keys, pa.binary()),
                    pa.array(values, pa.binary()),
                ],
                schema=_KAFKA_ARROW,
            )


class KafkaSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "trimtab_kafka"

    def schema(self) -> str:
        return KAFKA_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaReader(self.options)  # case-insensitive keys, as Spark's own sources


def parse_dests(options: Mapping[str, str]) -> list[int] | None:
    """The ``dests`` option of the export source: comma-separated ints, one per fold task
    (``pipeline.packing.dest_values``). With it the source reads packed rows (``PACKED_SCHEMA``), without
    it one row per message (``MESSAGE_SCHEMA``)."""
    raw = options.get("dests")
    if raw is None or raw == "":
        return None
    try:
        dests = [int(v) for v in raw.split(",")]
    except ValueError:
        raise ValueError(f"trimtab_channel_export: dests must be comma-separated ints, not {raw!r}") from None
    return dests


class _SplitPartition(InputPartition):
    def __init__(self, index: int, start: int, end: int) -> None:
        super().__init__((index, start, end))
        self.index, self.start, self.end = index, start, end


class ExportReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        path = options.get("path")
        if not path:
            raise ValueError("trimtab_channel_export needs the option path")
        self.path = path
        self.split_bytes = int(options.get("splitBytes", DEFAULT_SPLIT_BYTES))
        self.min_splits = int(options.get("minSplits", 1))
        pos = options.get("headerPos")
        self.header_pos: int | None
        if pos is None:
            header = find_header(path)
            self.header_pos = header.pos if header is not None else None
        else:
            self.header_pos = int(pos) if pos != "" else None
        self.dests = parse_dests(options)

    def partitions(self) -> Sequence[InputPartition]:
        import os

        size = os.path.getsize(self.path)
        splits = plan_splits(size, split_bytes=self.split_bytes, min_splits=self.min_splits)
        return [_SplitPartition(i, s, e) for i, (s, e) in enumerate(splits)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _SplitPartition)
        dests = self.dests
        if dests is None:
            for columns in read_split(
                self.path, partition.start, partition.end, partition.index, self.header_pos
            ):
                yield messages_batch(columns)
            return
        blobs = read_split_buckets(
            self.path, partition.start, partition.end, partition.index, self.header_pos, len(dests)
        )
        pending: list[tuple[int, Columns]] = []
        for bucket, columns in blobs:
            pending.append((dests[bucket], columns))
            if len(pending) >= PACKED_ROWS_PER_BATCH:
                yield pack_columns(pending)
                pending = []
        if pending:
            yield pack_columns(pending)


class ExportSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "trimtab_channel_export"

    def schema(self) -> str:
        return MESSAGE_SCHEMA if parse_dests(self.options) is None else PACKED_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return ExportReader(self.options)


def register(spark: SparkSession) -> None:
    spark.dataSource.register(KafkaSource)
    spark.dataSource.register(ExportSource)


#: The two ways of reading Kafka offset ranges into a DataFrame: ``python`` (``trimtab_kafka`` above,
#: confluent-kafka in Spark's Python workers) and ``connector`` (Spark's official spark-sql-kafka, in the
#: JVM). Both give the same rows for the same ranges (tests/integration/test_pipeline.py).
READERS = ("python", "connector")
#: The reader every command uses unless told otherwise (``--reader``), chosen by `trimtab bench pipeline`
#: (docs/pipeline.md has the figures): compacting 1 M records took the same time with either reader (the
#: Python fold dominates), so the one with no jar, no version skew and the daemons' TLS/SASL settings.
DEFAULT_READER = "python"


def reader_name(name: str | None) -> str:
    """A reader's name (``spark``, the connector's earlier name, is accepted), ``None`` -> the default."""
    if name is None:
        return DEFAULT_READER
    name = "connector" if name == "spark" else name
    if name not in READERS:
        raise PipelineError(f"unknown Kafka reader {name!r}: choose from {', '.join(READERS)}")
    return name


def kafka_frame(
    spark: SparkSession,
    bootstrap_servers: str,
    topic: str,
    bounds: dict[int, tuple[int, int]],
    *,
    client_config: dict[str, str] | None = None,
    reader: str | None = None,
    max_records: int = DEFAULT_MAX_RECORDS,
) -> Any:
    """The records of ``topic`` in ``bounds`` (partition -> [start, end)) as a DataFrame with the columns
    topic, partition, offset, timestamp (ms), key, value -- through ``reader`` (:data:`READERS`; default
    :data:`DEFAULT_READER`)."""
    if reader_name(reader) == "connector":
        return spark_connector_frame(spark, bootstrap_servers, topic, bounds, client_config or {})
    frame = (
        spark.read.format("trimtab_kafka")
        .option("bootstrap.servers", bootstrap_servers)
        .option("topic", topic)
        .option("ranges", json.dumps([[p, s, e] for p, (s, e) in sorted(bounds.items())]))
        .option("maxRecordsPerPartition", str(max_records))
    )
    for k, v in (client_config or {}).items():
        frame = frame.option(f"kafka.{k}", v)
    return frame.load()


def spark_connector_options(
    bootstrap_servers: str, topic: str, bounds: dict[int, tuple[int, int]], client_config: dict[str, str]
) -> dict[str, str]:
    """Options of the official connector (spark-sql-kafka) for the same ranges: ``assign`` the partitions
    with records, from their starts to their (exclusive) ends. ``client_config`` holds librdkafka settings;
    the ones the Java client spells the same way (``security.protocol``, ``sasl.mechanism``,
    ``ssl.truststore.location``...) pass through as ``kafka.*``."""
    parts = {str(p): (s, e) for p, (s, e) in sorted(bounds.items()) if e > s}
    return {
        "kafka.bootstrap.servers": bootstrap_servers,
        "assign": json.dumps({topic: [int(p) for p in parts]}),
        "startingOffsets": json.dumps({topic: {p: s for p, (s, _) in parts.items()}}),
        "endingOffsets": json.dumps({topic: {p: e for p, (_, e) in parts.items()}}),
        "failOnDataLoss": "true",
        "includeHeaders": "false",
        **{f"kafka.{k}": v for k, v in client_config.items()},
    }


#: librdkafka settings the Java client spells differently (TLS files, SASL credentials): given to the
#: connector they would be ignored and it would fail to connect, so it refuses them instead.
LIBRDKAFKA_ONLY = frozenset(
    {
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.key.password",
        "ssl.ca.pem",
        "ssl.certificate.pem",
        "ssl.key.pem",
        "sasl.username",
        "sasl.password",
        "sasl.oauthbearer.config",
    }
)


def _missing_kafka_source(e: Exception) -> bool:
    text = str(e)
    return "DATA_SOURCE_NOT_FOUND" in text or "Failed to find data source: kafka" in text


def spark_connector_frame(
    spark: SparkSession,
    bootstrap_servers: str,
    topic: str,
    bounds: dict[int, tuple[int, int]],
    client_config: dict[str, str],
) -> Any:
    """The ranges through Spark's connector. A session started by a pipeline command has its jars
    (``session.with_connector``); one that was already running gets them added here."""
    from pyspark.sql import functions as sf

    from trimtab.pipeline.session import add_connector

    foreign = sorted(LIBRDKAFKA_ONLY & set(client_config))
    if foreign:
        raise PipelineError(
            f"the connector's Java Kafka client does not take the librdkafka settings {', '.join(foreign)} "
            "(kafka.client_config): use --reader python"
        )
    opts = spark_connector_options(bootstrap_servers, topic, bounds, client_config)
    if not any(e > s for s, e in bounds.values()):
        return spark.createDataFrame([], KAFKA_SCHEMA)
    try:
        df = spark.read.format("kafka").options(**opts).load()
    except Exception as e:  # AnalysisException DATA_SOURCE_NOT_FOUND: the jars are not on the classpath
        if not _missing_kafka_source(e):
            raise
        add_connector(spark)  # a PipelineError naming scripts/setup.sh when the jars are not there
        try:
            df = spark.read.format("kafka").options(**opts).load()
        except Exception as again:
            if _missing_kafka_source(again):
                raise PipelineError(
                    "Spark cannot load the Kafka connector even with its jars added: start the session with "
                    "--conf spark.jars=<the jars of `bash scripts/setup.sh`>"
                ) from None
            raise
    return df.select(
        sf.col("topic"),
        sf.col("partition").cast("int"),
        sf.col("offset").cast("long"),
        sf.unix_millis(sf.col("timestamp")).alias("timestamp"),
        sf.col("key"),
        sf.col("value"),
    )
