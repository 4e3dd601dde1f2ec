"""The controller's persisted state (:mod:`trimtab.controller.stores`) in memory: what the simulator gives the
healer instead of ZooKeeper, with the same contract -- a first failure is put-if-absent, a plan is written
whole and read back in chunk order, a satisfied chunk is deleted -- so a healer built on a fresh
:class:`Healer` over the same stores carries a plan on exactly as a new leader would."""

from __future__ import annotations

import time
from collections.abc import Callable

from trimtab.controller.stores import Chunk, FailedBroker


class MemoryFailedBrokers:
    def __init__(self) -> None:
        self.brokers: dict[str, FailedBroker] = {}

    def read(self) -> dict[str, FailedBroker]:
        return dict(self.brokers)

    def record(self, broker: str, when_ms: int, by: str, term: int) -> bool:
        if broker in self.brokers:
            return False
        self.brokers[broker] = FailedBroker(first_failure=when_ms, recorded_by=by, term=term)
        return True

    def clear(self, broker: str) -> None:
        self.brokers.pop(broker, None)


class MemoryReassignments:
    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.plans: dict[str, dict[int, Chunk]] = {}
        self.written = 0  # plans written (for tests and the simulator's report)

    def read(self, broker: str) -> dict[int, Chunk]:
        return dict(sorted(self.plans.get(broker, {}).items()))

    def brokers(self) -> list[str]:
        return sorted(self.plans)

    def write_plan(self, broker: str, chunks: list[dict[str, str | None]], term: int) -> dict[int, Chunk]:
        now = int(self.clock() * 1000)
        plan = {seq: Chunk(bundles=dict(b), created=now, term=term) for seq, b in enumerate(chunks)}
        self.plans[broker] = dict(plan)
        self.written += 1
        return plan

    def done(self, broker: str, seq: int) -> None:
        chunks = self.plans.get(broker)
        if chunks is not None:
            chunks.pop(seq, None)

    def drop(self, broker: str) -> None:
        self.plans.pop(broker, None)
