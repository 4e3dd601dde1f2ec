"""Where the leader sends a bundle it moves (healing, stuck monitor): the same broker selection as a
lookup's assignment (the placement rules, filters, then the least loaded with a random tie-break), over
the live brokers and their latest load reports."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from trimtab.balance.assign import DEFAULT_FILTERS, AssignContext, BrokerInfo, select_broker
from trimtab.balance.load import BrokerLoadData
from trimtab.cluster.kvview import LatestValues
from trimtab.cluster.placement.standbys import StandbyIndex, prefer_standby_set, prefer_standbys
from trimtab.cluster.placement.view import LivePlacement
from trimtab.cluster.zk import LiveBrokers
from trimtab.config.settings import Settings


class Destinations:
    def __init__(
        self,
        settings: Settings,
        registry: LiveBrokers,
        loads: LatestValues[BrokerLoadData],
        placement: LivePlacement,
        standbys: StandbyIndex,
        *,
        rng: random.Random,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.loads = loads
        self.placement = placement
        self.standbys = standbys
        # Among the brokers the rules allow, a bundle's warm standbys first: they take it over fastest.
        self.rule = prefer_standbys(standbys.of, placement.restrict)
        self.allowed = prefer_standby_set(standbys.of, placement.allowed)
        self.rng = rng
        self.clock = clock
        self.diff = settings.assignment.average_usage_diff_threshold_pct / 100

    def plan_rules(self) -> tuple[Callable[[str], frozenset[str]], Callable[[str, str], None]]:
        """``allowed`` and ``placed`` for one healing plan (:func:`~trimtab.balance.heal.plan_destinations`):
        the same preference as :attr:`allowed`, over a private copy of the placement index that records
        each planned pick -- so two orphans of one anti-affinity group do not both go to the broker that
        had the fewest of the group when the plan began."""
        copy = self.placement.planning()

        def rules(bundle: str) -> frozenset[str]:
            return copy.candidate_set(bundle)

        return prefer_standby_set(self.standbys.of, rules), copy.set_owner

    def live(self) -> dict[str, BrokerInfo]:
        """A copy of the registered brokers (the registry's cache changes under ZooKeeper's thread)."""
        return dict(self.registry.brokers)

    def context(self, exclude: frozenset[str] = frozenset()) -> AssignContext:
        return AssignContext.from_settings(
            self.settings, self.loads.snapshot(), int(self.clock() * 1000), exclude
        )

    def choose(self, bundle: str, exclude: frozenset[str]) -> str | None:
        """A destination for ``bundle`` among live brokers not in ``exclude``; None if there is none."""
        sel = select_broker(
            bundle,
            self.live(),
            self.context(exclude),
            self.rng,
            filters=DEFAULT_FILTERS,
            diff=self.diff,
            placement=self.rule,
        )
        return sel.broker
