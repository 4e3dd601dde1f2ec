"""``trimtab pipeline ...``: the Spark jobs (docs/pipeline.md).

Registered in ``trimtab.cli`` with ``main.add_command(pipeline)``. This module imports only click and the
settings at import time: PySpark is an optional extra, checked when a command runs (a clear message, not
a traceback, where it is missing).

Every command takes ``--master`` (default ``local[*]``) and repeated ``--conf key=value`` for Spark, and
prints progress lines on stderr and its result (JSON) on stdout.

The what-if sweep ``pipeline tune`` (issue 12, point 5) plugs in here: a command defined in
``trimtab.pipeline.tune`` with ``@spark_options`` and :func:`run_job`, added with
``pipeline.add_command(tune)`` at the bottom of this module.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from trimtab.cli.common import config_option, set_option, settings_from, write_atomically
from trimtab.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from trimtab.config.settings import Settings
    from trimtab.pipeline.common import Progress

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def _parse_conf(items: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected key=value, got {item!r}", param_hint="--conf")
        out[key.strip()] = value
    return out


def spark_options(fn: F) -> F:
    """``--master``, ``--conf``, ``--config``, ``--set`` and ``--quiet``: what every pipeline command takes."""
    for opt in reversed(
        [
            click.option(
                "--master",
                default=None,
                help="Spark master URL (default local[*]: every core of this machine).",
            ),
            click.option(
                "--conf",
                "confs",
                multiple=True,
                metavar="KEY=VALUE",
                help="A Spark setting, passed through (repeatable), e.g. --conf spark.executor.memory=4g.",
            ),
            config_option,
            set_option,
            click.option("--quiet", is_flag=True, help="No progress lines on stderr."),
        ]
    ):
        fn = opt(fn)
    return fn


def client_config(s: Settings) -> dict[str, str]:
    """The librdkafka settings every trimtab Kafka client gets (TLS, SASL; docs/security.md)."""
    from trimtab.cluster.wiring import kafka_client_config

    try:
        return kafka_client_config(s)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None


def run_job(
    job: str,
    master: str | None,
    confs: tuple[str, ...],
    quiet: bool,
    body: Callable[[SparkSession, Progress], T],
    *,
    reads_kafka: bool = False,
    reader: str | None = None,
) -> T:
    """Check the spark extra, start (or reuse) the session, watch its stages, run ``body``; a
    :class:`PipelineError` becomes a clean exit with its message. A job reading Kafka names its
    ``reader`` (``reads_kafka``; None: the default reader): the connector's jars then go on the new
    session's classpath."""
    from trimtab.pipeline.common import spark_missing

    missing = spark_missing()
    if missing is not None:
        raise click.ClickException(missing)
    from trimtab.pipeline.common import PipelineError, Progress
    from trimtab.pipeline.session import spark_session, watch_stages, with_connector
    from trimtab.pipeline.sources import reader_name

    progress = Progress(job, quiet=quiet)
    conf = _parse_conf(confs)
    try:
        if reads_kafka and reader_name(reader) == "connector":
            conf = with_connector(conf)
        with (
            spark_session(f"trimtab-pipeline-{job}", master=master, conf=conf, progress=progress) as spark,
            watch_stages(spark, progress),
        ):
            return body(spark, progress)
    except PipelineError as e:
        raise click.ClickException(str(e)) from None


def _emit(obj: Any) -> None:
    from trimtab.channel.replayfile import report_json

    sys.stdout.buffer.write(report_json(obj))
    sys.stdout.flush()


@click.group()
def pipeline() -> None:
    """Spark jobs over the cluster's topics (docs/pipeline.md): a Parquet history, channel compaction at
    scale, reports with plots. Needs the spark extra: pip install 'trimtab[spark]'."""


_READERS = click.Choice(["python", "connector", "spark"])
_READER_HELP = (
    "Kafka reader: 'python' (the built-in Spark Python data source over confluent-kafka) or 'connector' "
    "(Spark's official spark-sql-kafka connector; scripts/setup.sh fetches its jars). Default: "
    "trimtab.pipeline.sources.DEFAULT_READER, chosen by `trimtab bench pipeline` (docs/pipeline.md). "
    "--kafka-source and 'spark' are the earlier names."
)


def _reader_option(fn: F) -> F:
    return click.option(
        "--reader", "--kafka-source", "reader", type=_READERS, default=None, help=_READER_HELP
    )(fn)


@pipeline.command("ingest")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), help="History directory.")
@click.option("--bootstrap-servers", default=None, help="Kafka bootstrap servers (kafka.bootstrap_servers).")
@click.option(
    "--tables",
    default="channel,broker_load,top_bundles,events",
    show_default=True,
    help="Which topics to read (their names come from the kafka.*_topic settings).",
)
@_reader_option
@click.option(
    "--max-records-per-task",
    type=click.IntRange(min=1),
    default=1_000_000,
    show_default=True,
    help="Cut long offset ranges into Spark tasks of at most this many records.",
)
@spark_options
def ingest_cmd(
    out: str,
    bootstrap_servers: str | None,
    tables: str,
    reader: str | None,
    max_records_per_task: int,
    master: str | None,
    confs: tuple[str, ...],
    config_file: str | None,
    sets: tuple[str, ...],
    quiet: bool,
) -> None:
    """Append what the topics hold beyond the last run to a Parquet history partitioned by date. Exactly
    once: the offsets read are committed with the data, so a rerun adds only new records and a crash
    mid-run neither loses nor duplicates rows. Prints the run's summary as JSON."""
    s = settings_from(config_file, sets, **{"kafka.bootstrap_servers": bootstrap_servers})
    k = s.kafka
    names = {
        "channel": k.channel_topic,
        "broker_load": k.broker_load_topic,
        "top_bundles": k.top_bundles_topic,
        "events": k.events_topic,
    }
    wanted = [t.strip() for t in tables.split(",") if t.strip()]
    unknown = sorted(set(wanted) - set(names))
    if unknown or not wanted:
        raise click.BadParameter(f"choose from {', '.join(names)}", param_hint="--tables")
    cfg = client_config(s)

    def body(spark: SparkSession, progress: Progress) -> dict[str, Any]:
        from trimtab.pipeline.ingest import ingest

        r = ingest(
            spark,
            out,
            bootstrap_servers=k.bootstrap_servers,
            topics={t: names[t] for t in wanted},
            client_config=cfg,
            reader=reader,
            max_records=max_records_per_task,
            progress=progress,
        )
        return r.summary()

    _emit(run_job("ingest", master, confs, quiet, body, reads_kafka=True, reader=reader))


@pipeline.command("compact")
@click.option(
    "--input",
    "input_file",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="A channel export (what `trimtab channel dump --export` writes; JSON lines, value_b64 included) "
    "instead of the live channel.",
)
@click.option("--bootstrap-servers", default=None, help="The live channel's Kafka (kafka.bootstrap_servers).")
@click.option("--topic", default=None, help="Channel topic (kafka.channel_topic).")
@click.option(
    "--output",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write {table, stats} here, in exactly the shape of `trimtab channel replay --json` "
    "(default: stdout, unless --publish).",
)
@click.option("--publish", is_flag=True, help="Publish the table as a snapshot to the snapshot topic.")
@click.option(
    "--term",
    type=click.IntRange(min=0),
    default=None,
    help="Leader term of the published snapshot (default: the highest term among the channel's snapshots, so "
    "nodes bootstrap from this one until the leader writes a newer one).",
)
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=None,
    help="With --input: the channel's partition count for the home-partition rule (default: the export header's).",
)
@_reader_option
@click.option(
    "--tasks",
    type=click.IntRange(min=1),
    default=None,
    help="Fold tasks (default: spark.sql.shuffle.partitions).",
)
@click.option(
    "--split-bytes",
    type=click.IntRange(min=1),
    default=64 << 20,
    show_default=True,
    help="With --input: bytes of the export each reading task takes.",
)
@spark_options
def compact_cmd(
    input_file: str | None,
    bootstrap_servers: str | None,
    topic: str | None,
    output: str | None,
    publish: bool,
    term: int | None,
    partitions: int | None,
    reader: str | None,
    tasks: int | None,
    split_bytes: int,
    master: str | None,
    confs: tuple[str, ...],
    config_file: str | None,
    sets: tuple[str, ...],
    quiet: bool,
) -> None:
    """Resolve the channel at scale: records grouped by bundle, in log order, folded with the replay every
    node runs. The table equals what `trimtab channel replay` (for an export) or `trimtab channel dump
    --no-snapshot` (for the live channel) computes, byte for byte."""
    if input_file is not None and (bootstrap_servers is not None or topic is not None):
        raise click.UsageError(
            "--input reads an export; --bootstrap-servers/--topic read the live channel: not both"
        )
    if publish and input_file is not None:
        raise click.UsageError(
            "--publish needs the live channel: a snapshot names the channel positions it covers, which an "
            "export cannot vouch for"
        )
    if partitions is not None and input_file is None:
        raise click.UsageError("--partitions is for --input (the live channel's partition count is known)")
    s = settings_from(
        config_file, sets, **{"kafka.bootstrap_servers": bootstrap_servers, "kafka.channel_topic": topic}
    )
    cfg = client_config(s) if input_file is None else {}

    def body(spark: SparkSession, progress: Progress) -> Any:
        from trimtab.pipeline.compact import compact_export, compact_kafka, publish_snapshot

        if input_file is not None:
            r = compact_export(
                spark,
                input_file,
                partitions=partitions,
                tasks=tasks,
                split_bytes=split_bytes,
                progress=progress,
            )
        else:
            r = compact_kafka(
                spark,
                s.kafka.bootstrap_servers,
                s.kafka.channel_topic,
                client_config=cfg,
                reader=reader,
                tasks=tasks,
                progress=progress,
            )
        stats = r.report["stats"]
        progress(
            f"{len(r.table)} bundles from {r.records} messages: accepted {stats['accepted']}, rejected "
            f"{stats['rejected']}, skipped {stats['skipped']}" + (" (two passes)" if r.passes > 1 else "")
        )
        if publish:
            sid, used = publish_snapshot(
                r,
                bootstrap_servers=s.kafka.bootstrap_servers,
                channel_topic=s.kafka.channel_topic,
                snapshot_topic=s.kafka.snapshot_topic,
                client_config=cfg,
                term=term,
                chunk_bundles=s.channel.snapshot_chunk_bundles,
            )
            progress(f"published snapshot {sid} (term {used}) to {s.kafka.snapshot_topic}")
            published.update(
                snapshot=sid,
                term=used,
                topic=s.kafka.snapshot_topic,
                bundles=len(r.table),
                positions={str(p): o for p, o in sorted(r.positions.items())},
            )
        return r.report

    published: dict[str, Any] = {}
    result = run_job("compact", master, confs, quiet, body, reads_kafka=input_file is None, reader=reader)
    from trimtab.channel.replayfile import report_json

    if output is not None:
        data = report_json(result)
        write_atomically(Path(output), lambda f: f.write(data))
    if publish and output is None:
        _emit({"published": published})  # the table went to the snapshot topic; say which snapshot
    elif output is None:
        _emit(result)


@pipeline.command("report")
@click.option(
    "--history", required=True, type=click.Path(file_okay=False, exists=True), help="History (ingest --out)."
)
@click.option(
    "--out", "out", required=True, type=click.Path(file_okay=False), help="Report directory (index.html)."
)
@click.option(
    "--target-std", type=float, default=None, help="Load std target line (default shedding.target_std)."
)
@click.option(
    "--bucket",
    "bucket_s",
    type=click.IntRange(min=1),
    default=None,
    help="Seconds per time bucket (default: automatic).",
)
@click.option(
    "--top", type=click.IntRange(min=1), default=20, show_default=True, help="Hottest bundles shown."
)
@spark_options
def report_cmd(
    history: str,
    out: str,
    target_std: float | None,
    bucket_s: int | None,
    top: int,
    master: str | None,
    confs: tuple[str, ...],
    config_file: str | None,
    sets: tuple[str, ...],
    quiet: bool,
) -> None:
    """An HTML report with plots from the history: load per broker over time, load std against the target,
    moves per hour by reason, healing timelines, hottest bundles, assignment latency; the aggregates behind
    them as Parquet. Prints the headline figures as JSON."""
    s = settings_from(config_file, sets)
    target = target_std if target_std is not None else s.shedding.target_std

    def body(spark: SparkSession, progress: Progress) -> dict[str, Any]:
        from trimtab.pipeline.report import write_report
        from trimtab.pipeline.session import session_conf

        tasks = int(
            spark.conf.get("spark.sql.shuffle.partitions")
            or session_conf("local", "", {}).get("spark.sql.shuffle.partitions", "4")
        )
        r = write_report(
            spark,
            history,
            out,
            target_std=target,
            load_ttl_s=s.load.ttl_s,
            bucket_s=bucket_s,
            top=top,
            tasks=tasks,
            progress=progress,
        )
        return {
            "report": str(r.out / "index.html"),
            "plots": r.plots,
            "aggregates": r.aggregates,
            **r.figures,
        }

    _emit(run_job("report", master, confs, quiet, body))


# ``pipeline tune`` (the what-if sweep through the simulator, pipeline/tune.py) registers here.
@pipeline.command("tune")
@click.option(
    "--history", required=True, type=click.Path(file_okay=False, exists=True), help="History (ingest --out)."
)
@click.option(
    "--grid",
    "grid_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="YAML/JSON mapping of section.field to a list of values (default: a 32-point shedding/split sweep).",
)
@click.option(
    "--bucket",
    "bucket_s",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    help="Seconds per history bucket (the replay's load steps).",
)
@click.option(
    "--policy",
    default="transfer",
    show_default=True,
    type=click.Choice(["transfer", "threshold"]),
    help="The shedder to tune.",
)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option(
    "--top", type=click.IntRange(min=1), default=10, show_default=True, help="Ranked results shown."
)
@click.option(
    "--scenario-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the replayed scenario (to rerun with `trimtab sim`).",
)
@spark_options
def tune_cmd(
    history: str,
    grid_file: Path | None,
    bucket_s: float,
    policy: str,
    seed: int,
    top: int,
    scenario_out: Path | None,
    master: str | None,
    confs: tuple[str, ...],
    config_file: str | None,
    sets: tuple[str, ...],
    quiet: bool,
) -> None:
    """Replay the recorded history through the simulator under a grid of settings (one Spark task per
    simulation, pipeline/tune.py); print the ranking and a recommended config snippet as JSON."""
    from trimtab.pipeline.sweep import DEFAULT_GRID, expand, read_grid

    s = settings_from(config_file, sets)
    try:
        grid = read_grid(grid_file) if grid_file else DEFAULT_GRID
        configs = expand(grid)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None

    def body(spark: SparkSession, progress: Progress) -> dict[str, Any]:
        from trimtab.pipeline.tune import tune_job

        return tune_job(
            spark,
            progress,
            history=history,
            grid=grid,
            configs=configs,
            bucket_s=bucket_s,
            policy=policy,
            seed=seed,
            top=top,
            target_std=s.shedding.target_std,
            current=s.model_dump(mode="json"),
            scenario_out=scenario_out,
        )

    _emit(run_job("tune", master, confs, quiet, body))
