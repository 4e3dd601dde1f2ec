"""A clock a test sets by hand: pass it where the code takes ``mono=`` or ``clock=``; read from any thread."""

from __future__ import annotations

import threading


class ManualClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self.now

    def advance(self, s: float) -> None:
        with self._lock:
            self.now += s
