"""Capturing structlog events in a test whatever an earlier test configured.

``structlog.testing.capture_logs`` swaps the processors only: if an earlier test in the same worker ran
``cluster.logs.configure`` at level warning, the filtering wrapper it installed still drops every info
event before the capture sees it -- the test then passes or fails by the order pytest-xdist gave it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import structlog


@contextmanager
def capture_logs() -> Iterator[list[dict[str, Any]]]:
    """Every event at every level, as ``structlog.testing.capture_logs`` gives them; the configuration is
    restored afterwards."""
    saved = structlog.get_config()
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG), cache_logger_on_first_use=False
    )
    try:
        with structlog.testing.capture_logs() as logs:
            yield logs
    finally:
        structlog.configure(**saved)
