"""structlog configuration shared by every trimtab process.

JSON lines by default, one event name per line (``event``), with the process's identity bound once
(``broker``, ``role``, ``term``...). Libraries that use stdlib logging (kazoo, uvicorn) are routed through
the same renderer so an operator greps one format.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

# Identity of this process (broker id, role, leader term): added to every line from every thread.
# structlog's contextvars do not cross into kazoo's, librdkafka's or the follower's threads.
_IDENTITY: dict[str, Any] = {}


def _add_identity(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    for k, v in _IDENTITY.items():
        event.setdefault(k, v)
    return event


_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(level: str = "info", json_logs: bool = True, **bound: Any) -> None:
    lvl = _LEVELS.get(level, logging.INFO)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        _add_identity,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json_logs
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.clear_contextvars()
    _IDENTITY.clear()
    bind(**bound)

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(lvl, logging.INFO))
    for noisy in ("kazoo", "uvicorn.access", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def bind(**kv: Any) -> None:
    """Bind identity (broker id, role, leader term...) to every later log line of this process, whatever
    thread writes it. A value of None removes the key."""
    for k, v in kv.items():
        if v is None:
            _IDENTITY.pop(k, None)
        else:
            _IDENTITY[k] = v


class SkipLog:
    """Logs skipped channel records: the first five of each reason, then every thousandth (the metric
    counts all of them), each with its partition and offset so an operator can fetch the bytes."""

    def __init__(self, event: str = "channel_record_skipped") -> None:
        self.event = event
        self.seen: dict[str, int] = {}
        self._log = structlog.get_logger("trimtab.channel")

    def __call__(self, key: str | None, partition: int | None, offset: int | None, reason: str) -> None:
        n = self.seen.get(reason, 0) + 1
        self.seen[reason] = n
        if n <= 5 or n % 1000 == 0:
            self._log.warning(
                self.event,
                key=None if key is None else key[:200],
                partition=partition,
                offset=offset,
                reason=reason,
                seen=n,
            )
