"""Maintenance rules (balance/maintenance.py) and what a maintenance operation does differently
(balance/operations.py): a budget per failure domain, a positive deadline, its moves first, failed with the
reason when moves are left at the deadline."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trimtab.balance import operations as ops
from trimtab.balance.maintenance import budget_refusal, deadline_refusal
from trimtab.channel.records import State, make

T0 = 1_800_000_000_000
DOMAINS = {"a:1": "rack-1", "b:1": "rack-1", "c:1": "rack-2", "d:1": None, "e:1": None}


def test_one_broker_per_failure_domain_by_default() -> None:
    assert budget_refusal("a:1", DOMAINS, [], 1) is None
    why = budget_refusal("b:1", DOMAINS, ["a:1"], 1)
    assert why is not None and "domain rack-1" in why and "a:1" in why and "maintenance_max_per_domain" in why
    assert budget_refusal("b:1", DOMAINS, ["a:1"], 2) is None
    assert budget_refusal("c:1", DOMAINS, ["a:1"], 1) is None  # another domain
    assert budget_refusal("e:1", DOMAINS, ["d:1"], 1) is None  # no domain: each its own


@given(st.lists(st.sampled_from(sorted(DOMAINS)), unique=True), st.integers(1, 3))
def test_the_budget_never_lets_a_domain_exceed_its_limit(order: list[str], limit: int) -> None:
    inside: list[str] = []
    for b in order:
        if budget_refusal(b, DOMAINS, inside, limit) is None:
            inside.append(b)
    for d in {v for v in DOMAINS.values() if v}:
        assert sum(1 for b in inside if DOMAINS[b] == d) <= limit


@pytest.mark.parametrize("deadline", [0, -5, float("nan")])
def test_a_deadline_must_be_positive(deadline: float) -> None:
    assert deadline_refusal(deadline) is not None
    assert deadline_refusal(0.5) is None


def bundle(i: int) -> str:
    return f"t/ns/0x{i:08x}_0x{i + 1:08x}"


def test_maintenance_moves_take_the_budget_first_and_fail_past_the_deadline() -> None:
    table = {bundle(i): make(State.OWNED, dst="a:1", version=1, ts=T0, writer="x") for i in range(6)}
    shed = ops.new("shed-1", ops.OpKind.SHED, [(bundle(i), "a:1", "b:1") for i in range(3)], reason="r",
                   requested_by="x", now_ms=T0)  # fmt: skip
    maint = ops.new("maint-1", ops.OpKind.MAINTENANCE, [(bundle(i), "a:1", "c:1") for i in range(3, 6)],
                    reason="r", requested_by="x", now_ms=T0 + 1, deadline_ms=T0 + 10_000)  # fmt: skip
    adv = ops.advance(
        [shed, maint], table.get, ops.Budget(cluster=2), writer="l", now_ms=T0, republish_after_ms=1
    )
    assert {b for b, _ in adv.publish} == {bundle(3), bundle(4)}  # the maintenance's, though created later
    late = ops.advance(
        adv.ops, table.get, ops.Budget(), writer="l", now_ms=T0 + 10_001, republish_after_ms=10**9
    )
    assert {b for b, _ in late.publish} == {bundle(0), bundle(1), bundle(2)}  # nothing more of the late one
    m = late.ops[1]
    assert m.state is ops.OpState.FAILED and m.state_reason == "deadline passed with 3 of 3 moves left"
    assert late.ops[0].state is ops.OpState.RUNNING  # the shedding operation has no deadline
