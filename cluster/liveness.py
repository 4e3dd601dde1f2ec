"""What a daemon's probes read: whether it finished starting, and when its event loop last ticked (a loop
that stopped ticking is wedged, and ``/healthz`` says so)."""

from __future__ import annotations

import time
from collections.abc import Callable


class Liveness:
    def __init__(self, mono: Callable[[], float] = time.monotonic) -> None:
        self.mono = mono
        self.ready = False
        self.last_tick = mono()

    def tick(self) -> None:
        self.last_tick = self.mono()

    def tick_age(self) -> float:
        """Seconds since the loop last ticked."""
        return self.mono() - self.last_tick
