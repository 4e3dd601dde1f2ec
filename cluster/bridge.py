"""Handing events from a library thread to the asyncio loop, one wakeup per burst.

``loop.call_soon_threadsafe`` writes to the loop's self-pipe on every call. The channel follower applies
records in batches of thousands (a failover, a bootstrap tail), and one wakeup per record would cost more
than the records themselves. A :class:`LoopBridge` queues items and schedules a single drain for all
that arrived before the loop got to it; order is preserved.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class LoopBridge(Generic[T]):
    def __init__(self, loop: asyncio.AbstractEventLoop, handle: Callable[[T], None]) -> None:
        self._loop = loop
        self._handle = handle
        self._items: deque[T] = deque()
        self._scheduled = False
        self._lock = threading.Lock()

    def push(self, item: T) -> None:
        """Any thread. ``handle(item)`` runs on the loop, in push order."""
        with self._lock:
            self._items.append(item)
            if self._scheduled:
                return
            self._scheduled = True
        self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, deque()
            self._scheduled = False
        for item in items:
            self._handle(item)
