"""The daemons' log lines during a simulation: dropped, except those that say a daemon's code failed --
``job_failed`` (a job's run raised), ``reconcile_crashed`` (a reconciler's plan raised) -- which go to
stderr with their tracebacks and are counted (a run in which any happened fails). The jobs log every cycle,
as they should in a daemon; a simulation of a hundred brokers for an hour would print millions of lines,
and ``trimtab sim --json`` owns stdout."""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Iterator, MutableMapping
from typing import Any

import structlog

FAILURES = frozenset({"job_failed", "reconcile_crashed"})


@contextlib.contextmanager
def quiet_daemons() -> Iterator[Counter[str]]:
    """structlog configured as above for the duration, then as it was; yields the count of each failure."""
    seen: Counter[str] = Counter()

    def failures_only(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        name = event.get("event")
        if name not in FAILURES:
            raise structlog.DropEvent
        seen[name] += 1
        return event

    old = structlog.get_config()
    structlog.configure(
        processors=[failures_only, structlog.processors.format_exc_info, structlog.dev.ConsoleRenderer()],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
    try:
        yield seen
    finally:
        structlog.configure(**old)
