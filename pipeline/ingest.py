"""``trimtab pipeline ingest``: the channel, broker-load, top-bundles and events topics -> a Parquet history.

Layout (``OUT`` is the history directory; docs/pipeline.md)::

    OUT/channel/date=2026-11-24/run-00000003-part-00000-....parquet     one table per topic, by UTC date
    OUT/broker_load/... OUT/top_bundles/... OUT/events/...
    OUT/_manifests/00000003.json   run 3: offsets read per topic and partition, its files, rows, gaps
    OUT/_staging/run-00000004/...  a run in progress (never read)
    OUT/_lock                      one ingest at a time

**Exactly once.** A run reads, per topic and partition, from where the last committed run stopped to the
high watermark seen at its start (explicit offset ranges, ``pipeline.kafka_io``); Spark writes the rows to
``_staging/run-N``; then the driver writes ``_manifests/N.json`` -- the offsets read and the files staged --
to a temporary name, fsyncs it and renames it into place: **that rename is the commit**. Only then are the
staged files moved into the tables. A crash before the commit leaves the history as it was (the next run
deletes the staging directory and reads the same offsets again); a crash after it leaves a manifest whose
files the next run (or any ``pipeline`` command, before it reads) finishes moving. So a rerun adds exactly
the records not yet committed, and no record is ever in the history twice or missing from it
(tests/integration/test_pipeline.py crashes runs at each step).

Records that retention deleted before a run read them cannot be read: the run starts at the first
retained offset and records the gap in its manifest (``gaps``), and says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from trimtab.pipeline import kafka_io
from trimtab.pipeline.common import PipelineError, Progress
from trimtab.pipeline.decode import SCHEMAS, decoder
from trimtab.pipeline.sources import kafka_frame, register

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TABLES = ("channel", "broker_load", "top_bundles", "events")
MANIFEST_FORMAT = "trimtab-history-manifest"
_MANIFEST = re.compile(r"(\d{8})\.json")
#: Where a test stops a run to prove crash-safety: after the staged write, after the commit, mid-move.
CRASH_POINTS = ("staged", "committed", "moving")


class SimulatedCrash(BaseException):  # not an error a caller should handle: a stand-in for kill -9
    """Raised at a crash point (tests only). A BaseException, so no ``except Exception`` cleans up after it."""


@dataclass
class RunResult:
    run: int
    rows: dict[str, int]
    offsets: dict[str, dict[int, tuple[int, int]]]
    gaps: dict[str, dict[int, tuple[int, int]]]
    skipped: dict[str, dict[str, int]]
    files: int
    recovered: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "rows": self.rows,
            "records_read": {t: sum(e - s for s, e in r.values()) for t, r in self.offsets.items()},
            "skipped_by_reason": self.skipped,
            "gaps": {t: {str(p): list(v) for p, v in g.items()} for t, g in self.gaps.items() if g},
            "files": self.files,
            "recovered": self.recovered,
        }


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class History:
    """The history directory: committed manifests, recovery, and the commit itself."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.manifests_dir = self.root / "_manifests"
        self.staging = self.root / "_staging"

    def table_dir(self, table: str) -> Path:
        return self.root / table

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "_lock", "a+b") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise PipelineError(f"another ingest is writing {self.root}") from None
            yield

    def manifests(self) -> list[dict[str, Any]]:
        """Every committed manifest, oldest first."""
        if not self.manifests_dir.is_dir():
            return []
        out = []
        for p in sorted(self.manifests_dir.iterdir()):
            if _MANIFEST.fullmatch(p.name):
                m = orjson.loads(p.read_bytes())
                if m.get("format") != MANIFEST_FORMAT:
                    raise PipelineError(f"{p} is not a history manifest")
                out.append(m)
        return out

    def recover(self, progress: Progress) -> list[str]:
        """Finish the moves of committed runs (a crash after a commit), then drop anything uncommitted.
        Idempotent; every command that reads the history runs it first."""
        done: list[str] = []
        for m in self.manifests():
            for f in m["files"]:
                final, staged = self.root / f["path"], self.root / f["staged"]
                if final.exists():
                    continue
                if not staged.exists():
                    raise PipelineError(
                        f"history damaged: {f['path']} of run {m['run']} is neither in place nor staged"
                    )
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staged, final)
                done.append(f["path"])
        if done:
            progress(f"recovered: moved {len(done)} committed files into place")
        if self.staging.exists():
            shutil.rmtree(self.staging)
        return done

    def next_run(self) -> int:
        ms = self.manifests()
        return (ms[-1]["run"] + 1) if ms else 1

    def positions(self) -> dict[str, tuple[str, dict[int, int]]]:
        """table -> (topic, partition -> next offset to read) after the last committed run."""
        out: dict[str, tuple[str, dict[int, int]]] = {}
        for m in self.manifests():
            for table, t in m["topics"].items():
                topic = t["topic"]
                before = out.get(table)
                pos = dict(before[1]) if before is not None and before[0] == topic else {}
                for p, (_, end) in t["partitions"].items():
                    pos[int(p)] = max(pos.get(int(p), 0), end)
                out[table] = (topic, pos)
        return out

    def commit(self, manifest: dict[str, Any]) -> Path:
        """Write the manifest of a run: a temporary file, fsync, rename (the commit), fsync the directory."""
        self.manifests_dir.mkdir(parents=True, exist_ok=True)
        final = self.manifests_dir / f"{manifest['run']:08d}.json"
        if final.exists():
            raise PipelineError(f"run {manifest['run']} is already committed ({final})")
        tmp = self.manifests_dir / f".{final.name}.tmp"
        with open(tmp, "wb") as f:
            f.write(orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(self.manifests_dir)
        return final


def _staged_files(stage: Path) -> list[Path]:
    return sorted(p for p in stage.rglob("*.parquet") if not p.name.startswith((".", "_")))


def _parquet_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return int(pq.read_metadata(path).num_rows)


def _skip_counts(paths: list[Path]) -> dict[str, int]:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    out: dict[str, int] = {}
    for p in paths:
        col = pq.read_table(p, columns=["skip_reason"]).column("skip_reason")
        for item in pc.value_counts(col.drop_null()).to_pylist():
            out[item["values"]] = out.get(item["values"], 0) + int(item["counts"])
    return out


@dataclass
class _Plan:
    run: int
    offsets: dict[str, dict[int, tuple[int, int]]] = field(default_factory=dict)
    gaps: dict[str, dict[int, tuple[int, int]]] = field(default_factory=dict)
    partitions: dict[str, int] = field(default_factory=dict)


def _plan(history: History, config: Mapping[str, Any], topics: Mapping[str, str], say: Progress) -> _Plan:
    """Per table and partition: from the last committed end (or the first retained offset) to the high
    watermark now; records retention deleted before they were read are a gap, said and recorded."""
    plan = _Plan(history.next_run())
    before = history.positions()
    for table, topic in topics.items():
        marks = kafka_io.watermarks(config, topic)
        plan.partitions[table] = len(marks)
        was = before.get(table)
        start = was[1] if was is not None and was[0] == topic else {}
        bounds: dict[int, tuple[int, int]] = {}
        for p, (lo, hi) in marks.items():
            want = start.get(p, 0)
            if want > hi:
                raise PipelineError(
                    f"{topic}[{p}] ends at {hi} but the history has read up to {want}: was the topic "
                    "re-created? Use a new history directory for a new topic."
                )
            first = max(want, lo)
            if first > want:
                plan.gaps.setdefault(table, {})[p] = (want, lo)
            bounds[p] = (first, hi)
        plan.offsets[table] = bounds
        if table in plan.gaps:
            say(f"warning: {topic}: retention deleted records before they were read {plan.gaps[table]}")
    return plan


def _stage(
    spark: SparkSession,
    plan: _Plan,
    stage: Path,
    *,
    bootstrap_servers: str,
    topics: Mapping[str, str],
    client_config: dict[str, str] | None,
    reader: str | None,
    max_records: int,
    say: Progress,
) -> None:
    """Read every planned range, decode it and write it under ``stage``, partitioned by UTC date."""
    from pyspark.sql import functions as sf
    from pyspark.sql.pandas.types import from_arrow_schema

    register(spark)
    for table, topic in topics.items():
        bounds = plan.offsets[table]
        n = sum(e - s for s, e in bounds.values())
        say(f"run {plan.run}: {table} <- {topic}: {n} new records")
        if n == 0:
            continue
        raw = kafka_frame(
            spark,
            bootstrap_servers,
            topic,
            bounds,
            client_config=client_config,
            reader=reader,
            max_records=max_records,
        )
        rows = raw.mapInArrow(decoder(table, plan.partitions[table]), from_arrow_schema(SCHEMAS[table]))
        dated = rows.withColumn("date", sf.to_date(sf.timestamp_millis(sf.col("timestamp"))))
        dated.write.partitionBy("date").parquet(str(stage / table))


def _manifest(
    history: History, plan: _Plan, stage: Path, topics: Mapping[str, str], bootstrap_servers: str
) -> dict[str, Any]:
    """The run's manifest: what it read (offsets, gaps), the files it staged and where they go, counts."""
    staged = _staged_files(stage) if stage.exists() else []
    files = []
    rows_by_table: dict[str, int] = dict.fromkeys(topics, 0)
    for path in staged:
        rel = path.relative_to(stage)
        table = rel.parts[0]
        final = Path(table, *rel.parts[1:-1], f"run-{plan.run:08d}-{rel.name}")
        rows = _parquet_rows(path)
        rows_by_table[table] += rows
        files.append({"path": str(final), "staged": str(path.relative_to(history.root)), "rows": rows})
    skipped = {
        table: _skip_counts([f for f in staged if f.relative_to(stage).parts[0] == table]) for table in topics
    }
    return {
        "format": MANIFEST_FORMAT,
        "version": 1,
        "run": plan.run,
        "committed_at": int(time.time() * 1000),
        "bootstrap_servers": bootstrap_servers,
        "topics": {
            t: {
                "topic": topics[t],
                "partitions": {str(p): [s, e] for p, (s, e) in sorted(plan.offsets[t].items())},
                "gaps": {str(p): list(g) for p, g in sorted(plan.gaps.get(t, {}).items())},
            }
            for t in topics
        },
        "rows": rows_by_table,
        "skipped_by_reason": skipped,
        "files": files,
    }


def ingest(
    spark: SparkSession,
    out: str | Path,
    *,
    bootstrap_servers: str,
    topics: Mapping[str, str],
    client_config: dict[str, str] | None = None,
    reader: str | None = None,
    max_records: int = 1_000_000,
    progress: Progress | None = None,
    crash_at: str | None = None,
) -> RunResult:
    """One incremental run (see the module docstring). ``topics``: table -> topic name (a table left out
    is not read). ``crash_at`` (tests): one of :data:`CRASH_POINTS`."""
    say = progress or Progress("ingest", quiet=True)
    history = History(out)
    unknown = set(topics) - set(TABLES)
    if unknown:
        raise PipelineError(f"unknown tables {sorted(unknown)}; the history has {', '.join(TABLES)}")
    if crash_at is not None and crash_at not in CRASH_POINTS:
        raise ValueError(crash_at)
    with history.locked():
        recovered = history.recover(say)
        config = kafka_io.client_config(bootstrap_servers, client_config)
        plan = _plan(history, config, topics, say)
        stage = history.staging / f"run-{plan.run:08d}"
        _stage(
            spark,
            plan,
            stage,
            bootstrap_servers=bootstrap_servers,
            topics=topics,
            client_config=client_config,
            reader=reader,
            max_records=max_records,
            say=say,
        )
        manifest = _manifest(history, plan, stage, topics, bootstrap_servers)
        if crash_at == "staged":
            raise SimulatedCrash(crash_at)
        history.commit(manifest)  # the commit point
        files = manifest["files"]
        say(f"run {plan.run} committed: {sum(manifest['rows'].values())} rows in {len(files)} files")
        if crash_at == "committed":
            raise SimulatedCrash(crash_at)
        for i, f in enumerate(files):
            if crash_at == "moving" and i == len(files) // 2:
                raise SimulatedCrash(crash_at)
            final = history.root / f["path"]
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(history.root / f["staged"], final)
        if history.staging.exists():
            shutil.rmtree(history.staging)
        return RunResult(
            plan.run,
            manifest["rows"],
            plan.offsets,
            plan.gaps,
            manifest["skipped_by_reason"],
            len(files),
            recovered,
        )


def read_table(spark: SparkSession, out: str | Path, table: str) -> Any:
    """A history table as a DataFrame (after finishing any committed run's moves), or an empty one."""
    history = History(out)
    try:
        with history.locked():
            history.recover(Progress("history", quiet=True))
    except PipelineError:
        pass  # an ingest is running: it recovers; committed files in place are readable meanwhile
    path = history.table_dir(table)
    if not path.is_dir() or not any(path.rglob("*.parquet")):
        from pyspark.sql import functions as sf

        empty = spark.createDataFrame(SCHEMAS[table].empty_table())
        return empty.withColumn("date", sf.lit(None).cast("date"))
    return spark.read.parquet(str(path))
