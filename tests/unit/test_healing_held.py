"""Healing seen and held as an operation (issue 32 point 1): the healer hands its whole plan to the
operations job (which follows it as a ``heal`` operation), even after chunks of it were satisfied, and a
failed broker whose heal an operator paused is skipped -- and healed once resumed."""

from __future__ import annotations

from trimtab.balance.heal import HealConfig, named_brokers
from trimtab.channel.records import Record, State, make
from trimtab.controller.healing import Healer
from trimtab.controller.memory_stores import MemoryFailedBrokers, MemoryReassignments

NOW = 1_800_000_000_000
CFG = HealConfig(grace_s=0)
DEAD, LIVE = "dead:1", "live:1"
LOADS = {LIVE: 0.1, "l2:1": 0.1, "l3:1": 0.1}  # 1 failed of 4: under the mass-failure guard


def bundle(i: int) -> str:
    return f"t/ns/0x{i:08x}_0x{i + 1:08x}"


def healer_with(n: int) -> tuple[Healer, dict[str, Record], MemoryFailedBrokers, MemoryReassignments]:
    table = {bundle(i): make(State.OWNED, dst=DEAD, version=1, ts=0, writer="x") for i in range(n)}
    failed, plans = MemoryFailedBrokers(), MemoryReassignments(clock=lambda: 0.0)
    h = Healer(
        failed, plans, CFG, chunk_size=2, writer=lambda: "leader", term=lambda: 1, clock=lambda: NOW / 1000
    )
    h.load()
    h.bookkeeping(set(LOADS), named_brokers(table.items()), NOW - 1000)
    return h, table, failed, plans


def test_a_held_broker_is_skipped_and_healed_once_released() -> None:
    h, table, _, _ = healer_with(3)
    assert h.heal_plans() == {}
    out, info = h.round(LOADS, table.get, list(table.items()), lambda b, ex: LIVE, NOW, held={DEAD})
    assert out == [] and info["held"] == [DEAD] and h.status()["held"] == [DEAD]
    out, info = h.round(LOADS, table.get, list(table.items()), lambda b, ex: LIVE, NOW)
    assert len(out) == 3 and info["held"] == []


def test_the_whole_plan_outlives_its_satisfied_chunks_and_a_new_leader_reads_what_is_left() -> None:
    h, table, failed, plans = healer_with(3)
    h.round(LOADS, table.get, list(table.items()), lambda b, ex: LIVE, NOW)
    whole = h.heal_plans()
    assert whole is not None and set(whole[DEAD].bundles) == {bundle(0), bundle(1), bundle(2)}
    assert whole[DEAD].first_failure_ms == NOW - 1000
    for b in list(table):  # the first chunk (two bundles) healed
        if b != bundle(2):
            table[b] = make(State.OWNED, dst=LIVE, src=DEAD, version=3, ts=0, writer="leader")
    h.round(LOADS, table.get, list(table.items()), lambda b, ex: LIVE, NOW)
    after = h.heal_plans()
    assert after is not None and set(after[DEAD].bundles) == set(whole[DEAD].bundles)
    fresh = Healer(
        failed, plans, CFG, chunk_size=2, writer=lambda: "l2", term=lambda: 2, clock=lambda: NOW / 1000
    )
    assert fresh.heal_plans() is None  # not loaded: the operations job must not read "no plans"
    fresh.load()
    left = fresh.heal_plans()
    assert left is not None and set(left[DEAD].bundles) == {bundle(2)}  # the stored heal op keeps the rest
    h.bookkeeping(set(LOADS) | {DEAD}, named_brokers(table.items()), NOW)  # DEAD came back
    assert h.heal_plans() == {}
