"""Planned departures are not failures (issue 32 point 4): brokers that left through maintenance or a
drain never count towards the mass-failure guard -- a rolling upgrade is not an outage -- while unplanned
departures still do; the bundles of both are healed."""

from __future__ import annotations

from trimtab.balance.heal import HealConfig, named_brokers
from trimtab.channel.records import State, make
from trimtab.controller.healing import Healer
from trimtab.controller.memory_stores import MemoryFailedBrokers, MemoryReassignments

NOW = 1_800_000_000_000
CFG = HealConfig(grace_s=0, mass_failure_max_brokers=10, mass_failure_max_fraction=0.4)


def bundle(i: int) -> str:
    return f"t/ns/0x{i:08x}_0x{i + 1:08x}"


def round_with(planned: set[str], live_n: int = 4) -> tuple[str | None, int]:
    """Three brokers gone beside ``live_n`` live ones (with 4: 43 % > 40 %), each owning two bundles; the
    guard's verdict and how many overrides the round published."""
    gone = ["g1:1", "g2:1", "g3:1"]
    items = [(bundle(i), make(State.OWNED, dst=gone[i % 3], version=1, ts=0, writer="x")) for i in range(6)]
    table = dict(items)
    healer = Healer(
        MemoryFailedBrokers(), MemoryReassignments(clock=lambda: 0.0), CFG, chunk_size=10,
        writer=lambda: "leader", term=lambda: 1, clock=lambda: NOW / 1000,
    )  # fmt: skip
    healer.load()
    live = {f"l{i}:1": 0.2 for i in range(live_n)}
    healer.bookkeeping(set(live), named_brokers(items), NOW - 1000)
    out, _info = healer.round(live, table.get, items, lambda b, ex: "l0:1", NOW, planned=planned)
    return healer.paused_reason, len(out)


def test_an_outage_trips_the_guard() -> None:
    assert round_with(set()) == ("mass_failure", 0)


def test_a_rolling_upgrade_does_not_and_its_bundles_are_healed() -> None:
    assert round_with({"g1:1", "g2:1"}) == (None, 6)


def test_unplanned_departures_beside_planned_ones_still_count() -> None:
    assert round_with({"g1:1"}, live_n=2)[0] == "mass_failure"  # 2 unplanned of 4: 50 %
    assert round_with({"g1:1", "g2:1"}, live_n=2) == (None, 6)  # 1 of 3
