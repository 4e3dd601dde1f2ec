"""``healing.alert_after_s``: a failed broker whose bundles are not all reassigned this long after its first
failure raises the failed-broker alert (Cruise Control's ``broker.failure.alert.threshold.ms``) -- the
``trimtab_healing_overdue_brokers`` gauge TrimtabBundlesStuckOnFailedBroker fires on, and once per broker
an error log line and an event. Pure rule (balance/heal.py ``overdue``) and the leader's job around it
(controller/healing.py), with in-memory stand-ins for ZooKeeper and the channel."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client import CollectorRegistry

from trimtab.balance.assign import BrokerInfo
from trimtab.balance.heal import HealConfig, overdue
from trimtab.channel.records import Record, State, make
from trimtab.config.settings import HealingSettings, Settings
from trimtab.controller.healing import Healer, HealingJob
from trimtab.controller.metrics import ControllerMetrics
from trimtab.controller.stores import FailedBroker

T0 = 1_000_000_000  # ms


def owned(dst: str, v: int = 1) -> Record:
    return make(State.OWNED, dst=dst, version=v, ts=0, writer=dst)


def test_overdue_counts_what_still_depends_on_a_broker_failed_long_enough() -> None:
    cfg = HealConfig(alert_after_s=600)
    failed = {"dead1": T0, "dead2": T0 + 300_000}
    needing = [owned("dead1"), owned("dead1"), owned("dead2")]
    needing.append(make(State.RELEASING, src="dead1", dst="dead2", version=2, ts=0, writer="x"))
    assert overdue(failed, needing, cfg, T0 + 599_999) == {}
    assert overdue(failed, needing, cfg, T0 + 600_000) == {"dead1": 3}
    assert overdue(failed, needing, cfg, T0 + 900_000) == {"dead1": 3, "dead2": 2}
    # a broker whose bundles all moved is not overdue, however long ago it failed
    assert overdue(failed, [owned("dead2")], cfg, T0 + 10_000_000) == {"dead2": 1}
    assert overdue(failed, needing, replace(cfg, alert_after_s=0), T0) == {"dead1": 3}


def test_the_delay_is_the_setting() -> None:
    cfg = HealConfig.from_settings(Settings(healing=HealingSettings(alert_after_s=42)))
    assert cfg.alert_after_s == 42
    assert overdue({"d": T0}, [owned("d")], cfg, T0 + 41_999) == {}
    assert overdue({"d": T0}, [owned("d")], cfg, T0 + 42_000) == {"d": 1}


class FailedStore:
    def __init__(self, failed: dict[str, FailedBroker]) -> None:
        self.failed = dict(failed)

    def read(self) -> dict[str, FailedBroker]:
        return dict(self.failed)

    def record(self, broker: str, when_ms: int, by: str, term: int) -> bool:
        if broker in self.failed:
            return False
        self.failed[broker] = FailedBroker(first_failure=when_ms, recorded_by=by, term=term)
        return True

    def clear(self, broker: str) -> None:
        self.failed.pop(broker, None)


class Plans:
    def brokers(self) -> list[str]:
        return []

    def drop(self, broker: str) -> None:
        pass


class Table:
    """Records changed in place, no listener told: never live, so the healing job's index scans it."""

    live = False
    generation = 0

    def __init__(self, records: dict[str, Record]) -> None:
        self.records = records

    def add_listener(self, fn: object) -> None:
        pass

    def get(self, bundle: str) -> Record | None:
        return self.records.get(bundle)

    def items(self) -> list[tuple[str, Record]]:
        return list(self.records.items())


class Leadership:
    def safe_mode(self) -> str | None:
        return None


@dataclass
class Destinations:
    brokers: list[str]

    def live(self) -> dict[str, BrokerInfo]:
        return {
            b: BrokerInfo(id=b, service_url=f"pulsar://{b}", http_url=f"http://{b}") for b in self.brokers
        }

    def choose(self, bundle: str, exclude: frozenset[str]) -> str | None:
        return None

    def allowed(self, bundle: str) -> frozenset[str]:
        return frozenset()

    plan_rules = None


class Loads:
    def snapshot(self) -> dict[str, Any]:
        return {}


class Batch:
    def add(self, overrides: list[Any]) -> None:
        pass

    async def finish(self) -> int:
        return 0


class Writes:
    def override_round(self) -> Batch:
        return Batch()


@dataclass
class Journal:
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def record(self, kind: str, **fields: Any) -> None:
        self.events.append((kind, fields))


class World:
    """``dead`` failed at T0 owning three bundles; healing is disabled (grace -1), so they stay put."""

    def __init__(self, alert_after_s: float, grace_s: float = -1) -> None:
        self.now = T0
        self.held: set[str] = set()
        self.prom = CollectorRegistry()
        self.metrics = ControllerMetrics.create(self.prom)
        self.journal = Journal()
        cfg = self.cfg = HealConfig(grace_s=grace_s, alert_after_s=alert_after_s)
        self.table = Table({f"t/ns/{i:#010x}_{i + 1:#010x}": owned("dead") for i in range(3)})
        self.table.records["t/ns/0x000000ff_0x00000100"] = owned("live")
        self.healer = Healer(
            FailedStore({"dead": FailedBroker(first_failure=T0)}),  # type: ignore[arg-type]
            Plans(),  # type: ignore[arg-type]
            cfg,
            chunk_size=100,
            writer=lambda: "leader",
            term=lambda: 1,
            clock=lambda: self.now / 1000,
        )
        self.healer.load()
        self.job = HealingJob(
            self.healer,
            self.table,  # type: ignore[arg-type]
            Leadership(),  # type: ignore[arg-type]
            Destinations(["live"]),  # type: ignore[arg-type]
            Loads(),  # type: ignore[arg-type]
            Writes(),  # type: ignore[arg-type]
            self.journal,  # type: ignore[arg-type]
            self.metrics,
            clock=lambda: self.now / 1000,
            held=lambda: self.held,
            config=lambda: self.cfg,
        )

    def round(self, at_s: float) -> None:
        self.now = T0 + int(at_s * 1000)
        asyncio.run(self.job.run_once())

    def gauge(self) -> float | None:
        return self.prom.get_sample_value("trimtab_healing_overdue_brokers")

    def alerts(self) -> list[dict[str, Any]]:
        return [f for kind, f in self.journal.events if kind == "broker_failure_alert"]


def test_the_leader_raises_the_alert_once_the_delay_passed() -> None:
    w = World(alert_after_s=600)
    w.round(at_s=599)
    assert w.gauge() == 0 and w.alerts() == []
    w.round(at_s=600)
    assert w.gauge() == 1
    assert w.alerts() == [{"key": "dead", "broker": "dead", "pending_bundles": 3, "paused": "disabled"}]
    assert w.healer.status()["overdue"] == {"dead": 3}
    w.round(at_s=700)
    assert w.gauge() == 1 and len(w.alerts()) == 1  # the event once, the gauge as long as it lasts


def test_the_alert_ends_when_the_bundles_moved() -> None:
    w = World(alert_after_s=60)
    w.round(at_s=61)
    assert w.gauge() == 1
    for b, r in list(w.table.records.items()):
        if r.dst == "dead":
            w.table.records[b] = owned("live", v=2)
    w.round(at_s=62)
    assert w.gauge() == 0


def test_a_held_heal_is_a_reason_in_the_paused_gauge_and_ends_with_the_hold() -> None:
    w = World(alert_after_s=600, grace_s=0)
    w.held = {"dead"}  # an operator paused the heal of "dead" (admin ops pause)
    w.round(at_s=1)
    paused = {
        r: w.prom.get_sample_value("trimtab_healing_paused", {"reason": r}) for r in ("held", "disabled")
    }
    assert paused == {"held": 1, "disabled": 0} and w.healer.status()["held"] == ["dead"]
    w.held = set()
    w.round(at_s=2)
    assert w.prom.get_sample_value("trimtab_healing_paused", {"reason": "held"}) == 0


def test_the_healing_job_reads_its_settings_in_force_every_round() -> None:
    """Its throttles are live settings: a change reaches the healer at the next round."""
    w = World(alert_after_s=600, grace_s=0)
    w.cfg = HealConfig(grace_s=0, alert_after_s=600, max_in_flight=1, max_in_flight_per_broker=1)
    w.round(at_s=1)
    assert (w.healer.cfg.max_in_flight, w.healer.cfg.max_in_flight_per_broker) == (1, 1)
