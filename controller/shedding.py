"""Shedding, leader only: one cycle of TransferShedder or ThresholdShedder, and what every cycle leaves
behind -- a metric, a log line and an event, whether it decided moves or skipped."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog

from trimtab.balance.load import BrokerLoadData, TopBundles
from trimtab.balance.operations import OpKind
from trimtab.balance.shed import (
    ShedConfig,
    Shedder,
    ShedResult,
    ShedState,
    settle_moves,
    threshold_shedder,
    track_move,
    transfer_shedder,
)
from trimtab.channel.records import State
from trimtab.channel.table import TableView
from trimtab.cluster.kvview import LatestValues
from trimtab.config.settings import SheddingSettings
from trimtab.controller.journal import DecisionJournal
from trimtab.controller.leadership import LeaderGates
from trimtab.controller.metrics import ControllerMetrics
from trimtab.controller.operations import OperationsJob
from trimtab.controller.placement.destinations import Destinations
from trimtab.controller.stores import ControllerSwitches
from trimtab.errors import RequestError

log = structlog.get_logger("trimtab.controller")


def observe_shed_cycle(metrics: ControllerMetrics, res: ShedResult, seconds: float) -> None:
    """Metrics for one shedding cycle, whatever its outcome."""
    metrics.shed_seconds.observe(seconds)
    metrics.shed_cycles.labels(res.result, res.reason).inc()
    if res.loads:
        metrics.load_avg.set(res.avg)
        metrics.load_std.set(res.std)
        for b, v in res.loads.items():
            metrics.broker_load.labels(b).set(v)
        for b in metrics.load_brokers - res.loads.keys():
            metrics.broker_load.remove(b)
        metrics.load_brokers = set(res.loads)


def shed_event(res: ShedResult) -> dict[str, Any]:
    """The events-topic record of one shedding cycle: the decision or skip and the load behind it."""
    return {
        "key": "shed",
        "result": res.result,
        "reason": res.reason,
        "avg": round(res.avg, 4),
        "std": round(res.std, 4),
        "loads": {b: round(v, 4) for b, v in res.loads.items()},
        "moves": [
            {
                "bundle": u.bundle,
                "src": u.src,
                "dst": u.dst,
                "throughput": round(u.throughput),
                "reason": u.reason,
            }
            for u in res.decisions
        ],
        "skipped": res.skipped_bundles[:20],
    }


class SheddingJob:
    """One shedding cycle per ``shedding.interval_s``: decide with the configured shedder over the live
    brokers' load reports and top bundles, confirm leadership, publish a ``Releasing`` per decision that
    still matches the table. Skips (disabled or paused, safe mode, fewer than two brokers) are counted.

    Like Pulsar's ``UnloadScheduler``, a cycle does not start while the moves of the last one are still in
    flight, for up to ``shedding.unload_timeout_s`` (reason ``unloads_in_flight``): deciding again from load
    reports that do not show those moves yet would move more than needed. A move not done by then is counted
    as ``timed_out`` (``trimtab_shedding_moves_total``), logged (``unload_timed_out``) and not remembered as
    moved (:func:`~trimtab.balance.shed.settle_moves`).

    ``shedder`` replaces the strategy ``settings.strategy`` names (the simulator runs Pulsar's legacy
    shedders through this same job, so a comparison differs in the shedder only)."""

    name = "shedding"

    def __init__(
        self,
        settings: SheddingSettings,
        table: TableView,
        leadership: LeaderGates,
        destinations: Destinations,
        loads: LatestValues[BrokerLoadData],
        top: LatestValues[TopBundles],
        journal: DecisionJournal,
        metrics: ControllerMetrics,
        cfg: ShedConfig,
        *,
        clock: Callable[[], float] = time.time,
        perf: Callable[[], float] = time.perf_counter,
        shedder: Shedder | None = None,
        operations: OperationsJob,
    ) -> None:
        """``operations``: the leader's operations -- each cycle's moves are an operation (``shed``), stored
        before its records are published, listed by ``admin ops``, and proposed again by the next leader if
        this one dies before Kafka acknowledged them."""
        self.settings = settings
        self.operations = operations
        self.table = table
        self.leadership = leadership
        self.destinations = destinations
        self.loads = loads
        self.top = top
        self.journal = journal
        self.metrics = metrics
        self.cfg = cfg
        self.clock = clock
        self.perf = perf
        self.shedder: Shedder = shedder or (
            transfer_shedder if settings.strategy == "transfer" else threshold_shedder
        )
        self.switches = ControllerSwitches()
        self.state = ShedState()
        self.last: ShedResult | None = None

    def reset(self) -> None:
        """A new term starts from a clean hit count and cooldowns (the pause switch is read separately,
        from ZooKeeper, where the admin API persisted it)."""
        self.state = ShedState()

    def skip_reason(self, live: int) -> str | None:
        if not self.settings.enabled or self.switches.shedding_paused:
            return "paused"
        if self.leadership.safe_mode() is not None:
            return "safe_mode"
        if live < 2:
            return "no_brokers"
        return None

    async def run_once(self) -> ShedResult | None:
        """One cycle; the decision (possibly empty), or None when the cycle was skipped."""
        live = self.destinations.live()
        self.settle()
        skip = self.skip_reason(len(live))
        if skip is None and self.state.moves:
            skip = "unloads_in_flight"
        if skip is None and not self.operations.loaded:
            skip = "operations_not_loaded"  # a new leader still reading them: its moves could not be stored
        if skip is not None:
            self.metrics.shed_cycles.labels("skip", skip).inc()
            return None
        # The shedder's memory as it was: restored if the moves it decided cannot be started, so that
        # bundles and brokers do not sit out a grace period or cool-down for moves that never happened.
        memory = (dict(self.state.recent_bundles), dict(self.state.recent_brokers), self.state.hit_count)
        res = self.decide({b: not i.draining for b, i in live.items()})
        published = await self._publish(res)
        if published is None:
            self.state.recent_bundles, self.state.recent_brokers, self.state.hit_count = memory
            published = 0
        log.info(
            "shedding_cycle",
            result=res.result,
            reason=res.reason,
            avg=round(res.avg, 4),
            std=round(res.std, 4),
            hit_count=res.hit_count,
            decisions=len(res.decisions),
            published=published,
        )
        self.journal.record("shed", **shed_event(res))
        return res

    def settle(self) -> None:
        """Count how the last cycle's moves ended, once they all have (Pulsar's ``UnloadManager`` outcome)."""
        now = int(self.clock() * 1000)
        out = settle_moves(self.state, self.table.get, self.cfg, now)
        if out.completed:
            self.metrics.shed_moves.labels("completed").inc(len(out.completed))
        if not out.timed_out:
            return
        self.metrics.shed_moves.labels("timed_out").inc(len(out.timed_out))
        for m in out.timed_out:
            rec = self.table.get(m.bundle)
            log.warning(
                "unload_timed_out",
                bundle=m.bundle,
                src=m.src,
                state=rec.state.value if rec is not None else None,
                waited_s=round((now - m.at_ms) / 1000, 1),
                timeout_s=self.cfg.unload_timeout_s,
            )
        self.journal.record(
            "shed_timed_out",
            key="shed",
            bundles=[m.bundle for m in out.timed_out][:20],
            timed_out=len(out.timed_out),
        )

    def decide(self, brokers: dict[str, bool]) -> ShedResult:
        """The shedder's decision over ``brokers`` (id -> may receive load), with its metrics."""
        table = self.table

        def owner(bundle: str) -> str | None:
            r = table.get(bundle)
            return r.dst if r is not None and r.state is State.OWNED else None

        t0 = self.perf()
        res = self.shedder(
            brokers,
            self.loads.snapshot(),
            self.top.snapshot(),
            owner,
            self.state,
            self.cfg,
            int(self.clock() * 1000),
            transferable=self.destinations.placement.may_move,
            has_policies=self.destinations.placement.has_policies,
        )
        self.last = res
        observe_shed_cycle(self.metrics, res, self.perf() - t0)
        return res

    async def _publish(self, res: ShedResult) -> int | None:
        """The decisions started as one ``shed`` operation; how many moves were published, or None when the
        operation could not be started (not confirmed as leader, operations not read)."""
        if not res.decisions:
            return 0
        now = int(self.clock() * 1000)
        reasons = {u.bundle: u.reason for u in res.decisions}
        try:
            _, done = await self.operations.start_moves(
                OpKind.SHED,
                [(u.bundle, u.src, u.dst) for u in res.decisions],
                reason=f"shedding ({res.reason}): std {res.std:.4f}, hit count {res.hit_count}",
                requested_by="shedder",
            )
        except RequestError as e:  # not confirmed, or the operations not read yet: the next cycle
            log.warning("shedding_not_started", error=str(e))
            res.decisions = []
            return None
        for bundle, rec in done:
            assert rec.src is not None
            track_move(self.state, bundle, rec.src, rec.version, now)
            self.metrics.unloads.labels("transfer" if rec.dst else "unload", reasons[bundle]).inc()
        return len(done)
