"""What the leader decided, for people: the last decisions in memory (``/v1/status``) and every one on
the events topic (the pipeline's history)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from trimtab.cluster.events import EventPublisher


class DecisionJournal:
    def __init__(
        self, events: EventPublisher, *, clock: Callable[[], float] = time.time, keep: int = 50
    ) -> None:
        self.events = events
        self.clock = clock
        self._recent: deque[dict[str, Any]] = deque(maxlen=keep)

    def record(self, kind: str, **fields: Any) -> None:
        self._recent.appendleft({"ts": int(self.clock() * 1000), "kind": kind, **fields})
        self.events.publish(kind, **fields)

    def recent(self, n: int = 20) -> list[dict[str, Any]]:
        """The ``n`` latest decisions, newest first."""
        return list(self._recent)[:n]
