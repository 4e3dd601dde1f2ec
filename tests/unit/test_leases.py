"""Broker leases: which bundles an agent may vouch for (a pure rule), how the simulated broker keeps them
(it stops serving at the deadline without being told, and refuses late requests), what a hostile renew
answer can do (nothing). The signatures of webhook calls are tested in tests/unit/test_signing.py."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.waiting import wait_for
from trimtab.agent.adapters.base import Lease, not_serving_from
from trimtab.agent.adapters.simulated import SimulatedBroker
from trimtab.agent.leases import lease_bound
from trimtab.channel.records import State, make
from trimtab.config.settings import Settings
from trimtab.errors import AdapterError, LeaseRefused

ME, OTHER = "me:1", "b:2"
B1 = "t/ns/0x00000000_0x80000000"
B2 = "t/ns/0x80000000_0xffffffff"
NOW_MS = 1_700_000_000_000


def lease(seconds: float, apply_within_s: float = 60.0) -> Lease:
    return Lease(seconds, int((time.time() + apply_within_s) * 1000))


def bound(
    state: State, *, dst: str | None = None, src: str | None = None, age_s: float = 0, stale: bool = False
):  # type: ignore[no-untyped-def]
    rec = make(state, dst=dst, src=src, version=3, ts=NOW_MS - int(age_s * 1000), writer="x")
    return lease_bound(ME, rec, now_ms=NOW_MS, in_flight_timeout_s=30, margin_s=2, stale=stale)


# ------------------------------------------------------------------------------------------ the rule


def test_owned_by_me_is_vouched_for_without_a_record_bound() -> None:
    assert bound(State.OWNED, dst=ME) == math.inf


def test_in_flight_towards_me_only_until_the_leader_may_force_it_onward() -> None:
    assert bound(State.ASSIGNING, dst=ME, age_s=10) == pytest.approx(18.0)  # 30 - 10 - 2
    assert bound(State.ASSIGNING, dst=ME, age_s=29) == pytest.approx(-1.0)  # too old: no lease
    assert bound(State.SPLITTING, src=ME, age_s=5) == pytest.approx(23.0)


@pytest.mark.parametrize(
    ("state", "dst", "src"),
    [
        (State.OWNED, OTHER, None),
        (State.RELEASING, OTHER, ME),  # our transfer out: we fence, never renew
        (State.RELEASING, None, ME),
        (State.ASSIGNING, OTHER, ME),
        (State.FREE, None, ME),
        (State.DELETED, None, ME),
    ],
)
def test_records_that_do_not_make_me_the_server_are_not_vouched_for(
    state: State, dst: str | None, src: str | None
) -> None:
    assert bound(state, dst=dst, src=src) is None


def test_stale_or_missing_records_are_never_vouched_for() -> None:
    assert bound(State.OWNED, dst=ME, stale=True) is None
    assert lease_bound(ME, None, now_ms=NOW_MS, in_flight_timeout_s=30, margin_s=2, stale=False) is None


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(list(State)),
    st.sampled_from([ME, OTHER, None]),
    st.sampled_from([ME, OTHER, None]),
    st.integers(0, 120_000),
    st.floats(1, 120),
    st.floats(0.5, 10),
)
def test_a_lease_never_outlives_the_monitors_timeout(
    state: State, dst: str | None, src: str | None, age_ms: int, timeout: float, margin: float
) -> None:
    """Whatever the record, a lease granted now ends at least ``margin`` before the leader's monitor may
    force that record onward (its age passes the in-flight timeout)."""
    rec = make(state, dst=dst, src=src, version=2, ts=NOW_MS - age_ms, writer="x")
    got = lease_bound(ME, rec, now_ms=NOW_MS, in_flight_timeout_s=timeout, margin_s=margin, stale=False)
    if got is None or got == math.inf:
        assert got is None or (state is State.OWNED and dst == ME)
        return
    assert state.in_flight
    assert age_ms / 1000 + got + margin == pytest.approx(timeout)


# ------------------------------------------------------------------------------------------ the simulated broker


def broker() -> SimulatedBroker:
    return SimulatedBroker("sim", Settings().sim)


def test_a_lease_runs_out_without_the_broker_being_told() -> None:
    b = broker()
    asyncio.run(b.acquire(B1, lease(0.3)))
    asyncio.run(b.acquire(B2, lease(60)))
    acquired = b.timeline[0].mono_ns
    wait_for(lambda: B1 not in b.snapshot()["serving"], 10, message="the lease of B1 ran out")  # type: ignore[operator]
    st = b.snapshot()
    assert st["serving"] == [B2]
    expire = [e for e in st["timeline"] if e["op"] == "expire"]  # type: ignore[union-attr]
    assert [e["bundle"] for e in expire] == [B1]
    # Stamped at the deadline itself (receipt + lease), not when somebody looked.
    assert 0.29e9 <= expire[0]["mono_ns"] - acquired < 0.35e9  # receipt is just before the acquire event


def test_renewal_extends_only_what_is_served_and_names_the_rest() -> None:
    b = broker()
    asyncio.run(b.acquire(B1, lease(0.4)))
    missing = asyncio.run(b.renew([B1, B2], lease(60)))
    assert missing == [B2]
    assert b.snapshot()["leases"][B1] > 50  # type: ignore[index]


def test_a_late_request_is_refused_and_grants_nothing() -> None:
    b = broker()
    with pytest.raises(LeaseRefused, match="after its apply_by_ms"):
        asyncio.run(b.acquire(B1, lease(60, apply_within_s=-1)))
    assert b.snapshot()["serving"] == []
    asyncio.run(b.acquire(B1, lease(0.5)))
    with pytest.raises(LeaseRefused):
        asyncio.run(b.renew([B1], lease(60, apply_within_s=-1)))
    assert b.snapshot()["leases"][B1] <= 0.5  # type: ignore[index]


def test_fenced_bundles_are_closed_when_their_lease_ends_and_split_children_inherit_it() -> None:
    b = broker()
    asyncio.run(b.acquire(B1, lease(0.3)))
    asyncio.run(b.fence(B1))
    wait_for(lambda: B1 not in b.snapshot()["fenced"], 10, message="the fenced bundle expired")  # type: ignore[operator]
    assert [e.op for e in b.timeline] == ["acquire", "fence", "expire"]

    b = broker()
    asyncio.run(b.acquire(B1, lease(45)))
    kids = ["t/ns/0x00000000_0x40000000", "t/ns/0x40000000_0x80000000"]
    asyncio.run(b.split(B1, kids))
    leases = b.snapshot()["leases"]
    assert set(leases) == set(kids) and all(40 < v <= 45 for v in leases.values())  # type: ignore[union-attr]


def test_an_acquire_that_outlasts_its_lease_serves_nothing() -> None:
    s = Settings().sim.model_copy(update={"acquire_delay_ms": 300.0})
    b = SimulatedBroker("slow", s)
    with pytest.raises(LeaseRefused, match="ran out while"):
        asyncio.run(b.acquire(B1, lease(0.1)))
    assert b.snapshot()["serving"] == []


# ------------------------------------------------------------------------------------------ hostile answers


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.none(),
        st.integers(),
        st.text(),
        st.lists(st.text()),
        st.dictionaries(st.text(), st.one_of(st.none(), st.integers(), st.lists(st.text()))),
        st.fixed_dictionaries({"not_serving": st.lists(st.sampled_from([B1, B2, "x", ""]))}),
    ),
    st.lists(st.sampled_from([B1, B2]), unique=True),
)
def test_a_renew_answer_can_only_name_bundles_that_were_asked_about(answer: object, asked: list[str]) -> None:
    try:
        got = not_serving_from(answer, asked)
    except AdapterError:
        return
    assert set(got) <= set(asked) and len(got) == len(set(got))
