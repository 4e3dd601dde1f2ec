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

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from typing import Any

import structlog

from trimtab.balance.heal import (
    HealConfig,
    Override,
    due,
    in_flight_by_broker,
    mass_failure,
    needs_healing,
    overdue,
    plan_destinations,
    throttle,
)
from trimtab.balance.load import BrokerLoadData
from trimtab.channel.records import Record
from trimtab.channel.table import TableView
from trimtab.cluster.kvview import LatestValues
from trimtab.controller.dependents import DependentsIndex
from trimtab.controller.journal import DecisionJournal
from trimtab.controller.leadership import LeaderGates
from trimtab.controller.metrics import ControllerMetrics
from trimtab.controller.operations import HealPlan
from trimtab.controller.placement.destinations import Destinations
from trimtab.controller.stores import Chunk, FailedBroker, FailedBrokerStore, PlanStore
from trimtab.controller.writes import ChannelWrites

#: Makes (allowed, placed) for one round's new plans: see :meth:`Healer.round`.
PlanRules = Callable[[], tuple[Callable[[str], Collection[str]], Callable[[str, str], None]]]

log = structlog.get_logger("trimtab.healing")
#: The reasons of ``trimtab_healing_paused`` (every one is set on each round: 1 for the current one; ``held``:
#: an operator paused the healing of at least one failed broker, ``admin ops pause`` of its heal).
HEALING_PAUSE_REASONS = ("mass_failure", "disabled", "held")


class Healer:
    def __init__(
        self,
        failed_store: FailedBrokerStore,
        plans: PlanStore,
        cfg: HealConfig,
        *,
        chunk_size: int,
        writer: Callable[[], str],
        term: Callable[[], int],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.failed_store = failed_store
        self.plans = plans
        self.cfg = cfg
        self.chunk_size = chunk_size
        self._writer = writer
        self._term = term
        self._clock = clock
        self.failed: dict[str, FailedBroker] = {}
        self.paused_reason: str | None = None
        self.pending = 0
        # Failed brokers past healing.alert_after_s with bundles still to move -> how many (the alert).
        self.overdue: dict[str, int] = {}
        self.loaded = False
        # The persisted plans, as this leader last read or wrote them: it is their only writer while it
        # leads, so rounds need not read ZooKeeper again (load() re-reads them on every new leadership).
        self._chunks: dict[str, dict[int, Chunk]] = {}
        # Each failed broker's whole plan (chunks already satisfied included), followed as a ``heal``
        # operation; replaced whole, never changed in place (read on the loop while a round runs in a thread).
        self._plans: dict[str, HealPlan] = {}
        # Failed brokers skipped in the last round: an operator paused their healing.
        self.held: list[str] = []

    def load(self) -> None:
        """Read what a previous leader left (failed brokers); called when leadership starts."""
        self.failed = self.failed_store.read()
        self._chunks = {b: self.plans.read(b) for b in self.plans.brokers()}
        self._plans = {
            b: self._plan(b, [c.bundles for c in chunks.values()]) for b, chunks in self._chunks.items()
        }
        self.loaded = True

    def _plan(self, broker: str, chunks: list[dict[str, str | None]]) -> HealPlan:
        f = self.failed.get(broker)
        return HealPlan(f.first_failure if f is not None else 0, {b: d for c in chunks for b, d in c.items()})

    def _forget(self, broker: str) -> None:
        self.failed_store.clear(broker)
        self.plans.drop(broker)
        self._chunks.pop(broker, None)
        self._plans = {b: p for b, p in self._plans.items() if b != broker}

    def heal_plans(self) -> Mapping[str, HealPlan] | None:
        """Each failed broker's whole plan (the ``heal`` operations follow them); None until loaded."""
        return self._plans if self.loaded else None

    # ------------------------------------------------------------------ 1. bookkeeping (blocking)
    def bookkeeping(self, live: set[str], named: Collection[str], now_ms: int) -> list[tuple[str, str]]:
        """Record new failures, cancel returned brokers. ``named``: every broker some record depends on
        (:func:`~trimtab.balance.heal.named_brokers`). Returns [(event, broker)]."""
        events: list[tuple[str, str]] = []
        named = set(named)
        for b in sorted(named - live):
            if b not in self.failed and self.failed_store.record(b, now_ms, self._writer(), self._term()):
                events.append(("recorded", b))
        for b in sorted(set(self.failed) & live):
            self._forget(b)
            events.append(("cancelled", b))
        for b in sorted(set(self.failed) - named - live):
            # Nothing names it any more: healed (or it owned nothing). Forget it.
            self._forget(b)
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
        allowed: Callable[[str], Collection[str]] | None = None,
        plan_rules: PlanRules | None = None,
        emit: Callable[[list[Override]], None] | None = None,
        planned: Collection[str] = (),
        held: Collection[str] = (),
        in_flight: Counter[str] | None = None,
    ) -> tuple[list[Override], dict[str, Any]]:
        """The overrides to publish now. ``live`` maps live, non-draining broker -> load EMA; ``allowed``
        (the placement rules) restricts each bundle's destination, in new plans and persisted ones.
        ``plan_rules``, when given, makes the rules for new plans instead: called at most once per round
        (it may copy the placement index), its ``placed`` callback sees every pick of every plan of the
        round, so the plans of two dead brokers spread one anti-affinity group together. ``emit``, when
        given, receives each chunk's overrides as soon as they are decided (to publish them while the round
        goes on); they are returned all the same. ``held``: failed brokers whose healing an operator paused
        (their ``heal`` operation): skipped, listed in ``info["held"]``. ``items`` needs to hold only the
        records that depend on a failed broker; ``in_flight`` (bundles Assigning into each broker) is then
        given apart -- counted from ``items`` otherwise."""
        info: dict[str, Any] = {
            "failed": sorted(self.failed),
            "planned": sorted(set(self.failed) & set(planned)),
            "due": [],
            "deferred": 0,
        }
        self.paused_reason = None
        if self.cfg.grace_s < 0:
            self.paused_reason = "disabled"
        else:
            # Planned departures (maintenance, a drain) are not failures: they never trip the guard, so a
            # rolling upgrade is not mistaken for an outage. Their bundles are healed all the same.
            unplanned = [b for b in self.failed if b not in planned]
            guard = mass_failure(len(unplanned), len(live), self.cfg)
            if guard is not None:
                self.paused_reason = "mass_failure"
                info["guard"] = guard
        ripe = due({b: f.first_failure for b, f in self.failed.items()}, self.cfg, now_ms)
        info["due"] = ripe
        gone = frozenset(self.failed)
        needing = [(b, r) for b, r in items if needs_healing(r, gone)]
        self.pending = len(needing)
        first_failures = {b: f.first_failure for b, f in self.failed.items()}
        self.overdue = overdue(first_failures, (r for _, r in needing), self.cfg, now_ms)
        self.held = info["held"] = sorted(set(ripe) & set(held))
        if self.paused_reason is not None or not ripe:
            return [], info
        in_flight = in_flight if in_flight is not None else in_flight_by_broker(items)
        out: list[Override] = []
        rules: tuple[Callable[[str], Collection[str]] | None, Callable[[str, str], None] | None] | None = None
        for dead in ripe:
            if dead in held:
                continue
            chunks = self._chunks.get(dead) or {}
            fresh = False  # a plan made this round already obeys this round's rules
            if not chunks:
                mine = sorted(b for b, r in needing if needs_healing(r, frozenset({dead})))
                if not mine:
                    continue
                if rules is None:
                    rules = plan_rules() if plan_rules is not None else (allowed, None)
                dests = plan_destinations(mine, dict(live), dict(in_flight), *rules)
                parts = [mine[i : i + self.chunk_size] for i in range(0, len(mine), self.chunk_size)]
                whole = [{b: dests[b] for b in p} for p in parts]
                plan = self.plans.write_plan(dead, whole, self._term())
                chunks = self._chunks[dead] = plan
                self._plans = {**self._plans, dead: self._plan(dead, whole)}
                fresh = True
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
                    planned=chunk.bundles
                    if allowed is None or fresh
                    else _still_allowed(chunk.bundles, todo, allowed),
                    live=live,
                )
                if emit is not None:
                    emit(got)
                out.extend(got)
                info["deferred"] += deferred
        return out, info

    def status(self) -> dict[str, Any]:
        now = int(self._clock() * 1000)
        return {
            "failed": {
                b: {"first_failure": f.first_failure, "age_s": round((now - f.first_failure) / 1000, 1)}
                for b, f in sorted(self.failed.items())
            },
            "paused": self.paused_reason,
            "pending_bundles": self.pending,
            "held": list(self.held),
            "grace_s": self.cfg.grace_s,
            "overdue": dict(self.overdue),
            "alert_after_s": self.cfg.alert_after_s,
        }


def _still_allowed(
    planned: Mapping[str, str | None],
    todo: list[tuple[str, Record]],
    allowed: Callable[[str], Collection[str]],
) -> dict[str, str | None]:
    """The persisted plan of the bundles still ``todo``, minus destinations the placement rules no longer
    allow (a policy changed since the plan was written): those bundles are chosen again. Only the bundles
    still to move are checked -- a round runs after every burst of channel changes, and asking the rules
    about every planned bundle each time would cost a failover of 10 000 bundles about a second."""
    out: dict[str, str | None] = {}
    for b, _ in todo:
        d = planned.get(b)
        out[b] = d if d is not None and d in allowed(b) else None
    return out


class HealingJob:
    """Runs the :class:`Healer` on the leader: bookkeeping when membership changes (and every
    ``bookkeeping_every_s`` as a safety net -- not on every channel change, which in a failover arrives
    thousands at a time), then a round whose overrides are published after leadership is confirmed.
    Woken by membership and channel changes rather than a fixed interval, so healing starts at once."""

    name = "healing"

    def __init__(
        self,
        healer: Healer,
        table: TableView,
        leadership: LeaderGates,
        destinations: Destinations,
        loads: LatestValues[BrokerLoadData],
        writes: ChannelWrites,
        journal: DecisionJournal,
        metrics: ControllerMetrics,
        *,
        clock: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
        bookkeeping_every_s: float = 5.0,
        in_maintenance: Callable[[], Collection[str]] | None = None,
        held: Callable[[], Collection[str]] | None = None,
        config: Callable[[], HealConfig] | None = None,
        dependents: DependentsIndex | None = None,
    ) -> None:
        """``dependents``: who depends on whom in ``table``, kept as it changes (made here if not given).
        ``in_maintenance`` (blocking, read only while brokers are failed): brokers an operator took out
        on purpose, which with the brokers last seen draining never count towards the mass-failure guard.
        ``held()``: failed brokers whose healing an operator paused (``admin ops pause`` of their ``heal``
        operation). ``config()``: healing's settings in force, read at the start of every round (its
        throttles are live settings)."""
        self.healer = healer
        self.held = held
        self.config = config
        self.in_maintenance = in_maintenance
        self.seen_draining: set[str] = set()  # live brokers last seen draining (a departure then is planned)
        self.table = table
        self.dependents = dependents if dependents is not None else DependentsIndex(table)
        self.leadership = leadership
        self.destinations = destinations
        self.loads = loads
        self.writes = writes
        self.journal = journal
        self.metrics = metrics
        self.clock = clock
        self.mono = mono
        self.bookkeeping_every_s = bookkeeping_every_s
        self._membership_changed = True
        self._last_bookkeeping = -math.inf
        self._alerted: set[str] = set()  # failed brokers whose alert was logged (once each)

    def membership_changed(self) -> None:
        """Brokers came or went: look for failures in the next round."""
        self._membership_changed = True

    async def on_lead(self) -> None:
        """Read what a previous leader left (failed brokers, persisted plans); look for failures at once."""
        await asyncio.to_thread(self.healer.load)
        self._membership_changed = True

    @property
    def ready(self) -> bool:
        return self.healer.loaded

    async def run_once(self) -> list[Override]:
        """One round; returns the overrides it published (none in safe mode or while paused)."""
        if self.leadership.safe_mode() is not None:
            return []
        if self.config is not None:
            self.healer.cfg = self.config()
        now = int(self.clock() * 1000)
        live = self.destinations.live()
        for b, i in live.items():
            if i.draining:
                self.seen_draining.add(b)
            else:
                self.seen_draining.discard(b)
        # No copy of the table: who depends on whom is kept as it changes (controller/dependents.py).
        live_ids = set(live)
        if self._bookkeeping_due(live_ids):
            await self._bookkeeping(live_ids, now)
        if not self.healer.failed:
            self.metrics.failed_brokers.set(0)
            self.metrics.healing_pending.set(0)
            self.metrics.healing_overdue.set(0)
            self._alerted.clear()
            self.healer.held = []
            # Nothing to heal, so nothing is paused: a pause must not outlive the failures behind it
            # (TrimtabHealingPausedMassFailure would fire on after every broker came back).
            for reason in HEALING_PAUSE_REASONS:
                self.metrics.healing_paused.labels(reason).set(0)
            return []
        loads = self.loads.snapshot()
        candidates = {
            b: (loads[b].weighted_max_ema if b in loads else 0.5) for b, i in live.items() if not i.draining
        }
        planned = set(self.seen_draining) - set(live)
        if self.in_maintenance is not None:
            planned |= set(await asyncio.to_thread(self.in_maintenance))
        items = self.dependents.depending_on(self.healer.failed)
        in_flight = self.dependents.assigning()
        batch = self.writes.override_round()
        try:
            overrides, info = await asyncio.to_thread(
                self.healer.round,
                candidates,
                self.table.get,
                items,
                self.destinations.choose,
                now,
                self.destinations.allowed,
                self.destinations.plan_rules,
                batch.add,
                frozenset(planned),
                self.held() if self.held is not None else (),
                in_flight,
            )
        except Exception:
            await batch.finish()  # the chunks published before the failure are acknowledged and counted
            raise
        self._observe(info)
        if overrides:
            await self._report(overrides, await batch.finish(), info)
        return overrides

    def _bookkeeping_due(self, live: set[str]) -> bool:
        # A failed broker registered again is cancelled before this round can act on its failure, whether or
        # not the registry's change has reached this job yet (the cache changes on ZooKeeper's thread, the
        # job hears of it on the loop): a registered broker is never a failed one (Pulsar #23382).
        return (
            self._membership_changed
            or self.mono() - self._last_bookkeeping > self.bookkeeping_every_s
            or not live.isdisjoint(self.healer.failed)
        )

    async def _bookkeeping(self, live: set[str], now: int) -> None:
        """Due (:meth:`_bookkeeping_due`, asked once per round by the caller): record and forget failures."""
        self._membership_changed = False
        self._last_bookkeeping = self.mono()
        named = self.dependents.named()
        events = await asyncio.to_thread(self.healer.bookkeeping, live, named, now)
        for event, broker in events:
            self.metrics.broker_failures.labels(event).inc()
            level = log.warning if event == "recorded" else log.info
            level("broker_failure", change=event, broker=broker)
            self.journal.record(f"broker_{event}", key=broker, broker=broker)

    def _observe(self, info: dict[str, Any]) -> None:
        healer = self.healer
        self.metrics.failed_brokers.set(len(healer.failed))
        self.metrics.healing_pending.set(healer.pending)
        for reason in HEALING_PAUSE_REASONS:
            on = bool(healer.held) if reason == "held" else healer.paused_reason == reason
            self.metrics.healing_paused.labels(reason).set(1 if on else 0)
        if healer.paused_reason == "mass_failure" and healer.failed:
            log.error(
                "healing_paused",
                reason="mass_failure",
                detail=info.get("guard"),
                failed=sorted(healer.failed),
            )
        self._alert()

    def _alert(self) -> None:
        """The failed-broker alert: ``trimtab_healing_overdue_brokers`` (TrimtabBundlesStuckOnFailedBroker
        fires on it), and once per failed broker an error log line and an event naming it."""
        healer, now = self.healer, int(self.clock() * 1000)
        self.metrics.healing_overdue.set(len(healer.overdue))
        for broker, pending in healer.overdue.items():
            if broker in self._alerted:
                continue
            first = healer.failed[broker].first_failure if broker in healer.failed else now
            log.error(
                "broker_failure_alert",
                broker=broker,
                pending_bundles=pending,
                failed_for_s=round((now - first) / 1000, 1),
                alert_after_s=healer.cfg.alert_after_s,
                paused=healer.paused_reason,
            )
            self.journal.record(
                "broker_failure_alert",
                key=broker,
                broker=broker,
                pending_bundles=pending,
                paused=healer.paused_reason,
            )
        self._alerted = set(healer.overdue)

    async def _report(self, overrides: list[Override], n: int, info: dict[str, Any]) -> None:
        by_broker: dict[str, int] = {}
        for o in overrides:
            by_broker[o.broker or "?"] = by_broker.get(o.broker or "?", 0) + 1
        deferred = info.get("deferred", 0)
        log.info("healing_overrides", published=n, by_failed_broker=by_broker, deferred=deferred)
        self.journal.record("heal", key="heal", moved=n, by_failed_broker=by_broker, deferred=deferred)
