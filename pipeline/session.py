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
from typing import TYPE_CHECKING

from trimtab.pipeline.common import PipelineError, Progress

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"


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
