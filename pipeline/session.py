"""The Spark session of a pipeline command: ``local[*]`` with no setup, or ``--master``/``--conf`` for a
cluster; and progress lines for long jobs.

Local mode needs only the ``spark`` extra and Java 17. Spark's Python workers must run *this* interpreter
(the one with trimtab, pyarrow and pandas installed): ``PYSPARK_PYTHON`` defaults to it. On a cluster the
executors need the same packages (``pip install 'trimtab[spark]'`` on every node, or an archive with
``--conf spark.archives=...``; docs/pipeline.md).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from trimtab.pipeline.common import PipelineError, Progress

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"

#: The official Spark Kafka connector (``--reader connector``): ``spark-sql-kafka-0-10_2.13`` at this
#: version, which devkit/spark/pom.xml pins (a test checks they agree) and scripts/setup.sh fetches from
#: Maven Central into :func:`connector_dir`. It should be the installed PySpark's version; Maven Central has
#: no Spark 4.3.0 artifact yet, so it is 4.2.0, the newest there (tests/integration/test_pipeline.py reads
#: the same ranges with both readers on a real Kafka and compares the tables).
CONNECTOR_VERSION = "4.2.0"
CONNECTOR_ARTIFACT = "spark-sql-kafka-0-10_2.13"
#: A directory of connector jars of your own (another version, a cluster's copy) instead of the cache.
CONNECTOR_ENV = "TRIMTAB_SPARK_KAFKA_JARS"


def connector_dir() -> Path:
    """Where the connector's jars are: ``$TRIMTAB_SPARK_KAFKA_JARS``, else the cache setup.sh fills."""
    own = os.environ.get(CONNECTOR_ENV)
    if own:
        return Path(own)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "trimtab" / f"spark-kafka-{CONNECTOR_VERSION}" / "jars"


def connector_jars() -> list[str]:
    """The connector's jars (it, spark-token-provider-kafka, kafka-clients, commons-pool2), or a
    :class:`PipelineError` of one line saying how to get them."""
    where = connector_dir()
    jars = sorted(str(p) for p in where.glob("*.jar")) if where.is_dir() else []
    if not any(Path(j).name.startswith(CONNECTOR_ARTIFACT) for j in jars):
        raise PipelineError(
            f"the Spark Kafka connector ({CONNECTOR_ARTIFACT}) is not in {where}: run `bash scripts/setup.sh` "
            f"to fetch it (or set {CONNECTOR_ENV}, or use --reader python)"
        )
    return jars


def with_connector(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` with the connector's jars added to ``spark.jars`` (for a session about to start: the
    driver and every executor get them)."""
    jars = connector_jars()
    have = [j for j in conf.get("spark.jars", "").split(",") if j]
    return {**conf, "spark.jars": ",".join(have + [j for j in jars if j not in have])}


def add_connector(spark: SparkSession) -> None:
    """Add the connector's jars to a session that is already running (a notebook, the tests' shared
    session): ``ADD JAR`` puts them on the executors' classpath and on this thread's class loader, which
    is where ``spark.read.format("kafka")`` looks the source up."""
    for jar in connector_jars():
        spark.sql(f"ADD JAR '{jar}'")


def session_conf(master: str, app: str, conf: Mapping[str, str]) -> dict[str, str]:
    """The configuration a command starts Spark with: the defaults below, then ``conf`` over them."""
    local = master.startswith("local")
    out = {
        "spark.master": master,
        "spark.app.name": app,
        "spark.ui.showConsoleProgress": "false",  # our own progress lines instead (watch_stages)
        "spark.sql.session.timeZone": "UTC",  # dates of the history are UTC dates
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.pyspark.python": os.environ.get("PYSPARK_PYTHON", sys.executable),
        "spark.python.worker.reuse": "true",
    }
    if local:
        out.update(
            {
                "spark.ui.enabled": "false",
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.sql.shuffle.partitions": str(max(4, 2 * (os.cpu_count() or 1))),
            }
        )
    out.update(conf)
    return out


@contextlib.contextmanager
def spark_session(
    app: str, *, master: str | None = None, conf: Mapping[str, str] | None = None, progress: Progress
) -> Iterator[SparkSession]:
    """The active session if there is one (a notebook, a test), else a new one, stopped at the end."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        if master is not None and active.sparkContext.master != master:
            progress(f"a Spark session is already active ({active.sparkContext.master}); using it")
        yield active
        return
    settings = session_conf(master or DEFAULT_MASTER, app, conf or {})
    os.environ.setdefault("PYSPARK_PYTHON", settings["spark.pyspark.python"])
    if settings["spark.master"].startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only, and no warning about it
    progress(f"starting Spark ({settings['spark.master']})")
    builder = SparkSession.builder
    for k, v in settings.items():
        builder = builder.config(k, v)
    try:
        spark = builder.getOrCreate()
    except Exception as e:  # no Java, a bad master URL, a port in use: say so, without a JVM trace
        raise PipelineError(
            f"cannot start Spark ({settings['spark.master']}): {str(e).splitlines()[0]}"
        ) from e
    spark.sparkContext.setLogLevel("WARN")
    try:
        yield spark
    finally:
        spark.stop()


@contextlib.contextmanager
def watch_stages(spark: SparkSession, progress: Progress, every: float = 5.0) -> Iterator[None]:
    """Print the running stages' task counts every ``every`` seconds while the block runs (when they moved)."""
    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()

    def run() -> None:
        last = ""
        while not stop.wait(every):
            parts = []
            for sid in sorted(tracker.getActiveStageIds()):
                info = tracker.getStageInfo(sid)
                if info is not None:
                    parts.append(f"stage {sid}: {info.numCompletedTasks}/{info.numTasks} tasks")
            line = ", ".join(parts)
            if line and line != last:
                progress(line)
                last = line

    t = threading.Thread(target=run, name="pipeline-progress", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(2.0)
