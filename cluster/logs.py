"""structlog configuration shared by every trimtab process.

JSON lines by default, one event name per line (``event``), with the process's identity bound once
(``broker``, ``role``, ``term``...). Libraries that use stdlib logging (kazoo, uvicorn) are routed through
the same renderer so an operator greps one format.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
import time
from collections.abc import Callable
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
    # Tracebacks as plain text, never with local variables: rich's (structlog's console default) prints
    # every frame's locals, and a frame holding a key or a token would write it into the log.
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json_logs
        else structlog.dev.ConsoleRenderer(
            colors=sys.stderr.isatty(), exception_formatter=structlog.dev.plain_traceback
        )
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
        # Not cached: a logger first used before this ran (while settings load, or in a test before it)
        # would keep the configuration of that moment for good -- structlog's default dev format on a
        # daemon's JSON stream. Logging is not on a hot path; a lookup per call costs ~1 us.
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    _IDENTITY.clear()
    bind(**bound)

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,  # uvicorn's and kazoo's tracebacks: plain text
                renderer,
            ],
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


class RefusalLog:
    """Refusals logged without flooding the log and without dropping any: the first ``burst`` of each
    reason per ``interval_s`` are logged one by one; the rest are counted and logged as one
    ``<event>_summary`` line (counts per reason, the busiest client addresses) when the interval ends.
    The clock is injected; :meth:`flush` emits a pending summary (the event loop schedules it)."""

    def __init__(
        self,
        event: str,
        *,
        burst: int = 20,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        schedule: Callable[[float, Callable[[], None]], None] | None = None,
        emit: Callable[..., None] | None = None,
    ) -> None:
        self.event = event
        self.burst = burst
        self.interval_s = interval_s
        self._clock = clock
        self._schedule = schedule if schedule is not None else _call_later
        self._emit = emit if emit is not None else structlog.get_logger("trimtab.http").warning
        self._window_start = -math.inf
        self._logged: dict[str, int] = {}
        self._suppressed: dict[str, int] = {}
        self._clients: dict[str, int] = {}
        self._flush_pending = False
        self.total = 0

    def __call__(self, reason: str, **fields: Any) -> None:
        self.total += 1
        now = self._clock()
        if now - self._window_start >= self.interval_s:
            self.flush()
            self._window_start = now
            self._logged.clear()
        n = self._logged.get(reason, 0)
        if n < self.burst:
            self._logged[reason] = n + 1
            self._emit(self.event, reason=reason, **fields)
            return
        self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
        client = str(fields.get("client"))
        if client in self._clients or len(self._clients) < 1000:
            self._clients[client] = self._clients.get(client, 0) + 1
        if not self._flush_pending:
            self._flush_pending = True
            self._schedule(max(0.0, self._window_start + self.interval_s - now), self.flush)

    def flush(self) -> None:
        """Log the summary of the refusals not logged one by one since the last summary, if any."""
        self._flush_pending = False
        if not self._suppressed:
            return
        top = sorted(self._clients.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
        self._emit(
            self.event + "_summary",
            not_logged_individually=dict(self._suppressed),
            top_clients=dict(top),
            window_s=self.interval_s,
        )
        self._suppressed.clear()
        self._clients.clear()


def _call_later(delay: float, fn: Callable[[], None]) -> None:
    # No running loop (a synchronous caller): the next refusal after the window flushes the summary.
    with contextlib.suppress(RuntimeError):
        asyncio.get_running_loop().call_later(delay, fn)
