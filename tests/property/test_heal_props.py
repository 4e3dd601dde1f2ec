"""Properties of healing and the monitor (docs/design.md 5.4) over random tables and random dead sets.

The key one: every override returned by ``throttle``/``monitor`` is accepted by ``channel.resolve`` as
the bundle's next record, and never names a dead broker as its destination.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from trimtab.balance.heal import (
    HealConfig,
    in_flight_by_broker,
    monitor,
    needs_healing,
    orphaned,
    override_for,
    plan_destinations,
    throttle,
)
from trimtab.channel.bundles import BundleLayout, parse_bundle
from trimtab.channel.records import Record, State, make
from trimtab.channel.resolve import ACCEPT, resolve, shape_ok

BROKERS = ("a:1", "b:2", "c:3", "d:4", "e:5")
LAYOUT = BundleLayout.default("t/ns", 8)
NOW = 2_000_000_000
AGES = (0, 29_999, 30_000, 30_001, 600_000, 3_600_000, 3_600_001)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

maybe_broker = st.sampled_from([None, *BROKERS])


@st.composite
def record_for(draw: Any, bundle: str) -> Record:
    rng = parse_bundle(bundle)[1]
    state = draw(st.sampled_from(list(State)))
    children = None
    if state is State.SPLITTING:
        mid = rng.lower + (rng.upper - rng.lower) // 2
        children = {
            f"0x{rng.lower:08x}_0x{mid:08x}": draw(maybe_broker),
            f"0x{mid:08x}_0x{rng.upper:08x}": draw(maybe_broker),
        }
    rec = make(
        state,
        version=draw(st.integers(1, 9)),
        ts=NOW - draw(st.sampled_from(AGES)),
        writer="w",
        dst=draw(maybe_broker),
        src=draw(maybe_broker),
        force=draw(st.booleans()),
        children=children,
    )
    assume(shape_ok(rng, rec))  # only records the channel could have accepted
    return rec


@st.composite
def tables(draw: Any) -> tuple[list[tuple[str, Record]], frozenset[str], Any]:
    bundles = draw(st.lists(st.sampled_from(LAYOUT.bundles), min_size=1, unique=True))
    items = [(b, draw(record_for(b))) for b in bundles]
    dead = frozenset(draw(st.lists(st.sampled_from(BROKERS), max_size=4)))
    order = draw(st.permutations(BROKERS))
    broken = draw(st.integers(0, 9)) == 0  # sometimes nobody can take anything

    def choose(bundle: str, exclude: frozenset[str]) -> str | None:
        if broken:
            return None
        # a chooser over live brokers only, as the controller's select_broker is
        return next((b for b in order if b not in exclude and b not in dead), None)

    return items, dead, choose


def check_override(
    items: dict[str, Record], bundle: str, rec: Record | None, dst: str | None, dead: frozenset[str]
) -> None:
    cur = items[bundle]
    verdict = resolve(parse_bundle(bundle)[1], cur, rec)
    assert verdict is ACCEPT, f"{cur} -> {rec}: {verdict}"
    if rec is not None:
        assert rec.force and rec.version == cur.version + 1
        assert rec.dst not in dead
        if rec.state is State.SPLITTING:
            assert rec.src not in dead
    assert dst not in dead


@SETTINGS
@given(tables(), st.integers(1, 6), st.integers(1, 4))
def test_throttle_overrides_are_valid_and_within_limits(world: Any, max_total: int, per_broker: int) -> None:
    items, dead, choose = world
    table = dict(items)
    cfg = HealConfig(max_in_flight=max_total, max_in_flight_per_broker=per_broker)
    before = in_flight_by_broker(items)
    in_flight = Counter(before)
    cands = orphaned(items, dead)
    out, deferred = throttle(cands, dead, choose, in_flight, cfg, NOW, "leader", "failed_broker", None)
    assert len({o.bundle for o in out}) == len(out)
    assert len(out) + deferred <= len(cands)
    for o in out:
        check_override(table, o.bundle, o.record, o.dst, dead)
        assert needs_healing(table[o.bundle], dead)
    new = Counter(o.dst for o in out if o.record is not None and o.record.state is State.ASSIGNING)
    assert in_flight == before + new
    # per broker: the resulting Assigning count, existing in-flight included, stays within the limit
    for b, n in new.items():
        assert before[b] + n <= per_broker
    assert sum(new.values()) <= max(0, max_total - sum(before.values()))


@SETTINGS
@given(tables())
def test_monitor_overrides_are_valid(world: Any) -> None:
    items, dead, choose = world
    table = dict(items)
    live = frozenset(BROKERS) - dead
    cfg = HealConfig(in_flight_timeout_s=30, tombstone_delay_s=3600)
    out = monitor(items, live, choose, cfg, NOW, "leader")
    assert len({o.bundle for o in out}) == len(out)
    for o in out:
        check_override(table, o.bundle, o.record, o.dst, dead)
        cur = table[o.bundle]
        if o.reason == "stuck":
            assert cur.state.in_flight and NOW - cur.ts > 30_000
            # moved away from the broker that did not act
            assert o.record is None or o.record.dst != o.broker
        else:
            assert o.reason == "tombstone" and o.record is None
            assert cur.state in (State.FREE, State.DELETED)


@SETTINGS
@given(tables())
def test_override_for_is_always_a_valid_next_record(world: Any) -> None:
    items, dead, choose = world
    table = dict(items)
    for bundle, cur in items:
        got = override_for(bundle, cur, dead, choose, NOW, "leader")
        assert (got is None) == (not needs_healing(cur, dead))
        if got is not None:
            check_override(table, bundle, got[0], got[1], dead)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 60),
    st.dictionaries(
        st.sampled_from(BROKERS), st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.8, 0.97, 1.2]), min_size=1
    ),
)
def test_plan_destinations_is_proportional_to_headroom(n: int, loads: dict[str, float]) -> None:
    bundles = [f"t/ns/{i}" for i in range(n)]
    out = plan_destinations(bundles, loads)
    assert out == plan_destinations(bundles, dict(reversed(list(loads.items()))))  # deterministic
    assert set(out) == set(bundles) and set(out.values()) <= set(loads)
    room = {b: max(0.05, 1.0 - x) for b, x in loads.items()}
    total = sum(room.values())
    got = Counter(out.values())
    k = len(loads)
    for b in loads:
        quota = n * room[b] / total
        # never below its share (rounded down), never more than its share plus one per broker's share
        assert got[b] >= math.floor(quota - 1e-9)
        assert got[b] <= math.ceil(quota + k * room[b] / total + 1e-9)
    # no single move would lower the most loaded broker's bundles per unit of headroom
    if got:
        worst = max(got[b] / room[b] for b in loads)
        best_next = min((got[b] + 1) / room[b] for b in loads)
        assert worst <= best_next + 1e-9
    if len(set(room.values())) == 1:  # equal headroom: the brief's bound, and a spread of at most one
        for b in loads:
            assert got[b] <= math.ceil(n * room[b] / total) + 1
        assert max(got[b] for b in loads) - min(got[b] for b in loads) <= 1
