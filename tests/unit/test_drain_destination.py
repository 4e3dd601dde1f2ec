"""The drain chooses destinations by the same load margin as lookups (``assignment.
average_usage_diff_threshold_pct``): a drain that used a fixed margin would place bundles by another rule
than the lookups that place them otherwise, and the setting would change only half of the decisions."""

from __future__ import annotations

import random
from typing import Any, cast

from prometheus_client import CollectorRegistry

from trimtab.agent.drain import Drainer
from trimtab.agent.metrics import AgentMetrics
from trimtab.balance.assign import AssignContext, BrokerInfo
from trimtab.balance.load import BrokerLoadData

NOW = 1_700_000_000_000
# avg 0.40: with a 10 % margin a (0.10) and b (0.30, exactly on the line) are both preferred; with 25 %
# only a is.
LOADS = {
    b: BrokerLoadData(broker=b, weighted_max_ema=e, updated_at=NOW)
    for b, e in (("a", 0.10), ("b", 0.30), ("c", 0.80))
}


class _Registry:
    def __init__(self) -> None:
        self.brokers = {
            b: BrokerInfo(id=b, service_url=f"svc://{b}", http_url=f"http://{b}") for b in ("me", *LOADS)
        }


def drainer(diff: float, seed: int) -> Drainer:
    identity = cast(Any, type("Identity", (), {"id": "me"})())
    return Drainer(
        identity,
        cast(Any, None),
        cast(Any, None),
        cast(Any, _Registry()),
        assign_context=lambda exclude: AssignContext(loads=LOADS, now_ms=NOW, exclude=exclude),
        placement=lambda _bundle, candidates: candidates,
        rng=random.Random(seed),
        metrics=AgentMetrics.create(CollectorRegistry()),
        timeout_s=10,
        diff=diff,
    )


def destinations(diff: float) -> set[str | None]:
    return {drainer(diff, seed).destination("public/ns/0x00000000_0x40000000").broker for seed in range(40)}


def test_the_default_margin_prefers_every_broker_within_ten_percent_of_the_average() -> None:
    assert destinations(0.10) == {"a", "b"}


def test_a_wider_margin_set_in_the_settings_narrows_the_drain_s_choice() -> None:
    assert destinations(0.25) == {"a"}


def test_a_margin_nobody_meets_falls_back_to_every_live_broker_but_the_drained_one() -> None:
    assert destinations(0.50) == {"a", "b", "c"}
