"""What every pipeline job shares: the error type, progress lines on stderr, and the check that PySpark is
installed (it is an optional extra: ``pip install 'trimtab[spark]'``)."""

from __future__ import annotations

import importlib.util
import sys
import time

from trimtab.errors import TrimtabError

SPARK_MISSING = (
    "the pipeline runs on Spark and needs the 'spark' extra: pip install 'trimtab[spark]' "
    "(PySpark, pyarrow, pandas, matplotlib; ./scripts/setup.sh installs it in .venv) and Java 17"
)


class PipelineError(TrimtabError):
    """A pipeline job cannot go on; the message says why (and what to do)."""


def spark_missing() -> str | None:
    """None when the spark extra is importable; else the message to show."""
    for module in ("pyspark", "pyarrow", "pandas"):
        if importlib.util.find_spec(module) is None:
            return f"{SPARK_MISSING} (missing: {module})"
    return None


class Progress:
    """Progress lines on stderr (stdout carries a command's result): ``[pipeline ingest 12:00:01] ...``."""

    def __init__(self, job: str, *, quiet: bool = False) -> None:
        self.job = job
        self.quiet = quiet
        self.started = time.monotonic()

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            elapsed = time.monotonic() - self.started
            print(
                f"[pipeline {self.job} {time.strftime('%H:%M:%S')} +{elapsed:.1f}s] {msg}",
                file=sys.stderr,
                flush=True,
            )
