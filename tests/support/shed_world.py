"""The inputs every shedder takes (live brokers, load reports, top bundles, owners), built up broker by
broker in unit tests: the common part of the worlds of tests/unit/test_shed.py and test_legacy_shedders.py,
which differ only in how a broker's load report is made -- and :class:`EmaWorld`, the report by EMA and
throughput that tests/unit/test_shed.py and test_rules_shed.py both build."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from trimtab.balance.load import BrokerLoadData, BundleStats, TopBundles
from trimtab.balance.shed import ShedConfig, ShedResult, ShedState


@dataclass
class ShedWorld:
    brokers: dict[str, bool] = field(default_factory=dict)
    loads: dict[str, BrokerLoadData] = field(default_factory=dict)
    top: dict[str, TopBundles] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)

    def put(self, load: BrokerLoadData, stats: Sequence[BundleStats], *, live: bool = True) -> None:
        """Broker ``load.broker`` with its report and top bundles, each owned by it."""
        b = load.broker
        self.brokers[b] = live
        self.loads[b] = load
        if stats:
            self.top[b] = TopBundles(broker=b, bundles=list(stats))
        for s in stats:
            self.owners[s.bundle] = b

    def owner(self, bundle: str) -> str | None:
        return self.owners.get(bundle)

    def run(
        self,
        fn: Callable[..., ShedResult],
        state: ShedState | None,
        cfg: ShedConfig,
        now: int,
        transferable: Callable[[str, str, str | None], bool] | None = None,
        **kw: Any,
    ) -> ShedResult:
        """One cycle of ``fn`` over this world (``transferable`` left at the shedder's default if None)."""
        args = (self.brokers, self.loads, self.top, self.owner, state or ShedState(), cfg, now)
        return fn(*args, **kw) if transferable is None else fn(*args, transferable, **kw)


#: The clock of the worlds' cycles: a report is 1 s old unless a test says otherwise.
WORLD_NOW = 10_000_000_000


class EmaWorld(ShedWorld):
    def add(
        self,
        b: str,
        load: float,
        bundles: Sequence[float] = (),
        *,
        tput: float | None = None,
        tput_ema: float | None = None,
        live: bool = True,
        updated_at: int = WORLD_NOW - 1000,
    ) -> Self:
        """Broker ``b`` at EMA ``load`` with top bundles ``b/0``, ``b/1``, ... of these bytes/s (its
        throughput their sum, or ``tput``)."""
        t = float(sum(bundles)) if tput is None else tput
        report = BrokerLoadData(
            broker=b,
            weighted_max_ema=load,
            msg_throughput_in=t,
            msg_throughput_ema=t if tput_ema is None else tput_ema,
            updated_at=updated_at,
        )
        stats = [BundleStats(bundle=f"{b}/{i}", msg_throughput_in=x) for i, x in enumerate(bundles)]
        self.put(report, stats, live=live)
        return self
