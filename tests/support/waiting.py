"""Waiting on conditions with deadlines: the only way tests synchronise with threads and processes.

A bare ``time.sleep(0.5)`` either wastes time or is too short on a loaded 2-core CI machine; polling a
predicate until a deadline is both fast when things are fast and patient when they are slow.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT = 10.0


def wait_for(
    predicate: Callable[[], T],
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = 0.02,
    message: str | Callable[[], str] | None = None,
    *,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``predicate`` until it returns something truthy and return that value.

    Raises ``AssertionError`` after ``timeout`` seconds, with ``message`` (a string, or a callable for a
    description computed at failure time, e.g. the current state) and the last value or exception seen.
    Exceptions listed in ``ignore`` count as "not yet"; any other exception propagates at once.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = predicate()
        except ignore as e:
            last = e
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            what = message() if callable(message) else message
            what = what or f"condition {getattr(predicate, '__name__', predicate)!r}"
            raise AssertionError(f"timed out after {timeout}s waiting for: {what} (last result: {last!r})")
        time.sleep(interval)
