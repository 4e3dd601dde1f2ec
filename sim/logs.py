"""The daemons' log lines during a simulation: dropped, except ``job_failed`` (to stderr, with its
traceback). The jobs log every cycle, as they should in a daemon; a simulation of a hundred brokers for an
hour would print millions of lines, and ``trimtab sim --json`` owns stdout."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, MutableMapping
from typing import Any

import structlog


def _failures_only(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    if event.get("event") != "job_failed":
        raise structlog.DropEvent
    return event


@contextlib.contextmanager
def quiet_daemons() -> Iterator[None]:
    """structlog configured as above for the duration, then as it was."""
    old = structlog.get_config()
    structlog.configure(
        processors=[_failures_only, structlog.processors.format_exc_info, structlog.dev.ConsoleRenderer()],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
    try:
        yield
    finally:
        structlog.configure(**old)
