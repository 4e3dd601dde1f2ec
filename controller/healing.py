"""Self-healing execution (KIP-46 + Pulsar's orphan cleanup), leader only.

Each round:

1. **Bookkeeping** -- a broker that is not registered but still named by the channel gets a persisted
   first-failure record (put-if-absent: a failover keeps the original time); a failed broker that came
   back is cancelled. Brokers that own nothing are never "failed" (Cruise Control's rule).
2. **Guard** -- too many failed brokers at once pauses healing and raises an alert (metric + event).
3. **Plan** -- for a failed broker past its grace with no persisted plan, the bundles to move are split
   into chunks with planned destinations and written to ZooKeeper in one transaction.
4. **Execute** -- chunk by chunk, in order, bundles that still need healing get a forced override toward
   their planned destination (re-chosen if that broker died too), within the in-flight throttles. A chunk
   whose bundles are all satisfied is deleted. A new leader reads the same chunks and carries on; bundles
   already moved (or moving) are skipped, so nothing is reassigned twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from trimtab.balance.heal import (
    HealConfig,
    Override,
    dependents,
    due,
    in_flight_by_broker,
    mass_failure,
    needs_healing,
    plan_destinations,
    throttle,
)
from trimtab.channel.records import Record
from trimtab.controller.stores import Chunk, FailedBroker, FailedBrokers, Reassignments

log = structlog.get_logger("trimtab.healing")


class Healer:
    def __init__(
        self,
        failed_store: FailedBrokers,
        plans: Reassignments,
        cfg: HealConfig,
        *,
        chunk_size: int,
        writer: Callable[[], str],
        term: Callable[[], int],
    ) -> None:
        self.failed_store = failed_store
        self.plans = plans
        self.cfg = cfg
        self.chunk_size = chunk_size
        self._writer = writer
        self._term = term
        self.failed: dict[str, FailedBroker] = {}
        self.paused_reason: str | None = None
        self.pending = 0
        self.loaded = False
        # The persisted plans, as this leader last read or wrote them: it is their only writer while it
        # leads, so rounds need not read ZooKeeper again (load() re-reads them on every new leadership).
        self._chunks: dict[str, dict[int, Chunk]] = {}

    def load(self) -> None:
        """Read what a previous leader left (failed brokers); called when leadership starts."""
        self.failed = self.failed_store.read()
        self._chunks = {b: self.plans.read(b) for b in self.plans.brokers()}
        self.loaded = True

    # ------------------------------------------------------------------ 1. bookkeeping (blocking)
    def bookkeeping(
        self, live: set[str], items: list[tuple[str, Record]], now_ms: int
    ) -> list[tuple[str, str]]:
        """Record new failures, cancel returned brokers. Returns [(event, broker)]."""
        events: list[tuple[str, str]] = []
        named: set[str] = set()
        for _, r in items:
            named |= dependents(r)
        for b in sorted(named - live):
            if b not in self.failed and self.failed_store.record(b, now_ms, self._writer(), self._term()):
                events.append(("recorded", b))
        for b in sorted(set(self.failed) & live):
            self.failed_store.clear(b)
            self.plans.drop(b)
            self._chunks.pop(b, None)
            events.append(("cancelled", b))
        for b in sorted(set(self.failed) - named - live):
            # Nothing names it any more: healed (or it owned nothing). Forget it.
            self.failed_store.clear(b)
            self.plans.drop(b)
            self._chunks.pop(b, None)
            events.append(("healed", b))
        if events:
            self.failed = self.failed_store.read()
        return events

    # ------------------------------------------------------------------ 2-4. one round (blocking)
    def round(
        self,
        live: Mapping[str, float],
        table_get: Callable[[str], Record | None],
        items: list[tuple[str, Record]],
        choose: Callable[[str, frozenset[str]], str | None],
        now_ms: int,
    ) -> tuple[list[Override], dict[str, Any]]:
        """The overrides to publish now. ``live`` maps live, non-draining broker -> load EMA."""
        info: dict[str, Any] = {"failed": sorted(self.failed), "due": [], "deferred": 0}
        self.paused_reason = None
        if self.cfg.grace_s < 0:
            self.paused_reason = "disabled"
        else:
            guard = mass_failure(len(self.failed), len(live), self.cfg)
            if guard is not None:
                self.paused_reason = "mass_failure"
                info["guard"] = guard
        ripe = due({b: f.first_failure for b, f in self.failed.items()}, self.cfg, now_ms)
        info["due"] = ripe
        gone = frozenset(self.failed)
        needing = [(b, r) for b, r in items if needs_healing(r, gone)]
        self.pending = len(needing)
        if self.paused_reason is not None or not ripe:
            return [], info
        in_flight = in_flight_by_broker(items)
        out: list[Override] = []
        for dead in ripe:
            chunks = self._chunks.get(dead) or {}
            if not chunks:
                mine = sorted(b for b, r in needing if needs_healing(r, frozenset({dead})))
                if not mine:
                    continue
                dests = plan_destinations(mine, dict(live), dict(in_flight))
                parts = [mine[i : i + self.chunk_size] for i in range(0, len(mine), self.chunk_size)]
                self.plans.write_plan(dead, [{b: dests[b] for b in p} for p in parts], self._term())
                chunks = self._chunks[dead] = self.plans.read(dead)
            for seq, chunk in list(chunks.items()):
                todo = [
                    (b, cur)
                    for b in chunk.bundles
                    if (cur := table_get(b)) is not None and needs_healing(cur, gone)
                ]
                if not todo:
                    self.plans.done(dead, seq)  # satisfied (moved, or moving): a new leader skips it too
                    del chunks[seq]
                    continue
                got, deferred = throttle(
                    todo,
                    gone,
                    choose,
                    in_flight,
                    self.cfg,
                    now_ms,
                    self._writer(),
                    "failed_broker",
                    dead,
                    planned=chunk.bundles,
                    live=live,
                )
                out.extend(got)
                info["deferred"] += deferred
        return out, info

    def status(self) -> dict[str, Any]:
        now = int(time.time() * 1000)
        return {
            "failed": {
                b: {"first_failure": f.first_failure, "age_s": round((now - f.first_failure) / 1000, 1)}
                for b, f in sorted(self.failed.items())
            },
            "paused": self.paused_reason,
            "pending_bundles": self.pending,
            "grace_s": self.cfg.grace_s,
        }
