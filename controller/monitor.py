"""The monitor, leader only: in-flight states stuck past their timeout on live brokers are forced onward,
and Free/Deleted entries past their retention are tombstoned (balance/heal.py ``monitor`` decides).
Bundles of failed brokers are healing's, with its grace; the monitor handles live brokers only."""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from trimtab.balance.heal import HealConfig, Override, monitor
from trimtab.channel.inflight import InFlightClock
from trimtab.channel.table import TableView
from trimtab.controller.journal import DecisionJournal
from trimtab.controller.leadership import LeaderGates
from trimtab.controller.metrics import ControllerMetrics
from trimtab.controller.placement.destinations import Destinations
from trimtab.controller.writes import ChannelWrites

log = structlog.get_logger("trimtab.controller")


class MonitorJob:
    name = "monitor"

    def __init__(
        self,
        table: TableView,
        leadership: LeaderGates,
        destinations: Destinations,
        writes: ChannelWrites,
        journal: DecisionJournal,
        metrics: ControllerMetrics,
        cfg: HealConfig,
        *,
        clock: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        """``mono``: the clock on which this node times how long ago it saw each in-flight record (see
        :func:`~trimtab.balance.heal.monitor`); the job listens to ``table`` for that."""
        self.table = table
        self.in_flight = InFlightClock(mono)
        table.add_listener(self.in_flight.on_change)
        self.leadership = leadership
        self.destinations = destinations
        self.writes = writes
        self.journal = journal
        self.metrics = metrics
        self.cfg = cfg
        self.clock = clock

    async def run_once(self) -> list[Override]:
        """One pass; returns the overrides it published (none in safe mode)."""
        if self.leadership.safe_mode() is not None:
            self.metrics.monitor_runs.labels("safe_mode").inc()
            return []
        decisions = monitor(
            self.table.items(),
            frozenset(self.destinations.live()),
            self.destinations.choose,
            self.cfg,
            int(self.clock() * 1000),
            self.leadership.writer(),
            self.in_flight.age_s,
        )
        if decisions:
            published = await self.writes.overrides(decisions)
            for o in decisions:
                log.info("monitor_override", bundle=o.bundle, reason=o.reason, broker=o.broker, dst=o.dst)
            if published < len(decisions):
                # Leadership not confirmed (the round was skipped whole), or records not acknowledged (each
                # logged as override_failed): decided again by the next pass. Said, so that a monitor that
                # decides and never writes is visible (a CI run once left stuck bundles for 90 s unexplained).
                log.warning("monitor_overrides_unpublished", decided=len(decisions), published=published)
            self.journal.record(
                "monitor",
                key="monitor",
                stuck=sum(1 for o in decisions if o.reason == "stuck"),
                tombstones=sum(1 for o in decisions if o.reason == "tombstone"),
                published=published,
            )
        self.metrics.monitor_runs.labels("ok").inc()
        return decisions
