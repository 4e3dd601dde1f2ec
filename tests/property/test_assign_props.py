"""Properties of broker selection (docs/design.md 5.1) over random broker sets, loads and exclusions."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from trimtab.balance.assign import AssignContext, BrokerInfo, least_resource_usage, select_broker
from trimtab.balance.load import BrokerLoadData

NOW = 50_000_000
TTL = 1800.0
IDS = [f"b{i}:80" for i in range(8)]
BUNDLE = "t/ns/0x00000000_0xffffffff"
SETTINGS = settings(max_examples=150, deadline=None)


@st.composite
def worlds(draw: Any) -> tuple[dict[str, BrokerInfo], AssignContext, float]:
    ids = draw(st.lists(st.sampled_from(IDS), unique=True, max_size=len(IDS)))
    brokers = {
        b: BrokerInfo(
            id=b,
            service_url=f"svc://{b}",
            http_url=f"http://{b}",
            version=draw(st.sampled_from(["1.0.0", "1.1.0", "2.0.0-rc1", "2.0.0"])),
            draining=draw(st.booleans()) and draw(st.booleans()),
        )
        for b in ids
    }
    loads: dict[str, BrokerLoadData] = {}
    # reports may also exist for brokers that are not registered (any more)
    for b in draw(st.lists(st.sampled_from(IDS), unique=True)):
        loads[b] = BrokerLoadData(
            broker=b,
            weighted_max_ema=draw(st.floats(0, 1.5, allow_nan=False)),
            topics=draw(st.integers(0, 200)),
            updated_at=NOW - draw(st.sampled_from([0, 1000, int(TTL * 1000), int(TTL * 1000) + 1, 10**9])),
        )
    exclude = frozenset(draw(st.lists(st.sampled_from(IDS), max_size=4)))
    ctx = AssignContext(
        loads=loads,
        now_ms=NOW,
        load_ttl_s=TTL,
        max_topics=draw(st.sampled_from([0, 50, 100, 50_000])),
        prefer_later_versions=draw(st.booleans()),
        exclude=exclude,
    )
    diff = draw(st.sampled_from([0.0, 0.05, 0.10, 0.5]))
    return brokers, ctx, diff


def eligible(brokers: dict[str, BrokerInfo], ctx: AssignContext) -> set[str]:
    return {b for b, i in brokers.items() if b not in ctx.exclude and not i.draining}


@SETTINGS
@given(worlds(), st.integers(0, 2**32))
def test_selection_is_none_iff_nobody_is_eligible(world: Any, seed: int) -> None:
    brokers, ctx, diff = world
    sel = select_broker(BUNDLE, brokers, ctx, random.Random(seed), diff=diff)
    ok = eligible(brokers, ctx)
    assert (sel.broker is None) == (not ok)
    if sel.broker is not None:
        assert sel.broker in ok
        assert 1 <= sel.candidates <= len(ok)
        assert sel.reason == "selected"


@SETTINGS
@given(worlds(), st.integers(0, 2**32))
def test_same_seed_same_result(world: Any, seed: int) -> None:
    brokers, ctx, diff = world
    a = select_broker(BUNDLE, brokers, ctx, random.Random(seed), diff=diff)
    b = select_broker(BUNDLE, dict(reversed(list(brokers.items()))), ctx, random.Random(seed), diff=diff)
    assert a == b


@SETTINGS
@given(worlds(), st.integers(0, 2**32))
def test_choice_is_best_whenever_a_best_broker_exists(world: Any, seed: int) -> None:
    """When some fresh-reporting candidate is ``diff`` below the average, the pick is one of them."""
    brokers, ctx, diff = world
    cands = sorted(eligible(brokers, ctx))
    choice = least_resource_usage(cands, ctx.loads, diff, random.Random(seed), NOW, TTL)
    fresh = {
        b: ctx.loads[b].weighted_max_ema
        for b in cands
        if b in ctx.loads and NOW - ctx.loads[b].updated_at <= TTL * 1000
    }
    if not cands:
        assert choice is None
        return
    assert choice in cands
    if fresh:
        avg = sum(fresh.values()) / len(fresh)
        clearly_best = {b for b, s in fresh.items() if s + diff < avg - 1e-6}
        on_or_above = {b for b, s in fresh.items() if s + diff > avg + 1e-6}
        if clearly_best:
            assert choice in fresh
            assert choice not in on_or_above
