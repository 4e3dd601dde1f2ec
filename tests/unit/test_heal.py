"""Self-healing and the ownership monitor (docs/design.md 5.4; digest pulsar_elb.md 2.x leader monitor).

The key property throughout: every override is a record that ``channel.resolve.resolve`` accepts as the
next state of the bundle -- an override the channel rejects would heal nothing.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest

from trimtab.balance.heal import (
    HealConfig,
    Override,
    dependents,
    due,
    in_flight_by_broker,
    mass_failure,
    monitor,
    names_broker,
    needs_healing,
    orphaned,
    override_for,
    plan_destinations,
    throttle,
)
from trimtab.balance.placement import Broker, Placement, PlacementPolicy
from trimtab.channel.bundles import parse_bundle
from trimtab.channel.records import Record, State, make
from trimtab.channel.resolve import ACCEPT, resolve

A, B, C, D = "a:1", "b:2", "c:3", "d:4"
DEAD = "dead:9"
BUNDLE = "t/ns/0x00000000_0x40000000"
CHILDREN: dict[str, str | None] = {"0x00000000_0x20000000": A, "0x20000000_0x40000000": A}
NOW = 1_000_000_000
W = "leader"


def r(state: State, v: int = 3, *, ts: int = NOW, force: bool = False, **kw: object) -> Record:
    return make(state, version=v, ts=ts, writer="w", force=force, **kw)  # type: ignore[arg-type]


def accepted(cur: Record | None, new: Record | None, bundle: str = BUNDLE) -> bool:
    return resolve(parse_bundle(bundle)[1], cur, new) is ACCEPT


def pick(*order: str):  # type: ignore[no-untyped-def]
    """A chooser that returns the first broker of ``order`` not excluded (and records its calls)."""
    calls: list[frozenset[str]] = []

    def choose(bundle: str, exclude: frozenset[str]) -> str | None:
        calls.append(exclude)
        return next((b for b in order if b not in exclude), None)

    choose.calls = calls  # type: ignore[attr-defined]
    return choose


NOBODY = pick()

# ------------------------------------------------------------------------------------------ dependents

DEPENDENTS = [
    (r(State.FREE, src=A), set()),
    (r(State.FREE), set()),
    (r(State.OWNED, dst=B), {B}),
    (r(State.OWNED, dst=B, src=A), {B}),  # A is history
    (r(State.ASSIGNING, dst=B), {B}),
    (r(State.ASSIGNING, dst=B, src=A), {B}),  # a reassignment in progress depends on its target only
    (r(State.RELEASING, src=A, dst=B), {A, B}),
    (r(State.RELEASING, src=A), {A}),
    (r(State.SPLITTING, src=A, children=CHILDREN), {A}),
    (r(State.DELETED, src=A), set()),  # nobody has work left: the leader tombstones it after the delay
    (r(State.DELETED, dst=B), set()),
]


@pytest.mark.parametrize(("rec", "deps"), DEPENDENTS)
def test_dependents_and_needs_healing(rec: Record, deps: set[str]) -> None:
    assert dependents(rec) == deps
    for b in (A, B, C):
        assert needs_healing(rec, frozenset({b})) == (b in deps)
    assert not needs_healing(rec, frozenset())
    assert needs_healing(rec, frozenset({A, B, C})) == bool(deps)


def test_names_broker() -> None:
    assert names_broker(r(State.OWNED, dst=A), A)
    assert not names_broker(r(State.OWNED, dst=B, src=A), A)
    assert names_broker(r(State.ASSIGNING, dst=B, src=A), A)
    assert names_broker(r(State.SPLITTING, src=A, children=CHILDREN), A)
    assert not names_broker(r(State.FREE, src=A), A)


def test_orphaned_in_name_order() -> None:
    items = [
        ("t/ns/z", r(State.OWNED, dst=DEAD)),
        ("t/ns/a", r(State.RELEASING, src=DEAD, dst=B)),
        ("t/ns/m", r(State.OWNED, dst=B)),
        ("t/ns/b", r(State.ASSIGNING, dst=B, src=DEAD)),
    ]
    assert [b for b, _ in orphaned(items, frozenset({DEAD}))] == ["t/ns/a", "t/ns/z"]


# ----------------------------------------------------------------------------------------- override_for


def check(cur: Record, gone: set[str], choose, expect: Record | None, dst: str | None) -> None:  # type: ignore[no-untyped-def]
    got = override_for(BUNDLE, cur, frozenset(gone), choose, NOW, W)
    assert got == (expect, dst)
    assert accepted(cur, expect), f"{cur} -> {expect}: {resolve(parse_bundle(BUNDLE)[1], cur, expect)}"
    if expect is not None:
        assert expect.force and expect.version == cur.version + 1
        assert expect.writer == W and expect.ts == NOW
        assert expect.dst not in gone


def forced(state: State, v: int = 4, **kw: object) -> Record:
    return make(state, version=v, ts=NOW, writer=W, force=True, **kw)  # type: ignore[arg-type]


def test_owned_by_a_dead_broker_is_forced_to_assigning() -> None:
    check(r(State.OWNED, dst=DEAD, src=A), {DEAD}, pick(B), forced(State.ASSIGNING, dst=B, src=DEAD), B)
    check(r(State.OWNED, dst=DEAD), {DEAD}, pick(B), forced(State.ASSIGNING, dst=B, src=DEAD), B)


def test_chooser_is_told_to_exclude_the_gone() -> None:
    choose = pick(DEAD, C, B)
    check(r(State.OWNED, dst=DEAD), {DEAD, C}, choose, forced(State.ASSIGNING, dst=B, src=DEAD), B)
    assert choose.calls == [frozenset({DEAD, C})]  # type: ignore[attr-defined]


def test_assigning_to_a_dead_broker() -> None:
    check(r(State.ASSIGNING, dst=DEAD), {DEAD}, pick(B), forced(State.ASSIGNING, dst=B), B)
    check(r(State.ASSIGNING, dst=DEAD, src=A), {DEAD}, pick(B), forced(State.ASSIGNING, dst=B, src=A), B)
    # back to the (live) source: no transfer to self
    check(r(State.ASSIGNING, dst=DEAD, src=A), {DEAD}, pick(A), forced(State.ASSIGNING, dst=A), A)


def test_assigning_to_a_live_broker_from_a_dead_one_is_in_progress() -> None:
    assert (
        override_for(BUNDLE, r(State.ASSIGNING, dst=B, src=DEAD), frozenset({DEAD}), pick(C), NOW, W) is None
    )


def test_releasing_with_dead_source_finishes_the_transfer() -> None:
    choose = pick(C)
    cur = r(State.RELEASING, src=DEAD, dst=B)
    check(cur, {DEAD}, choose, forced(State.ASSIGNING, dst=B, src=DEAD), B)
    assert choose.calls == []  # type: ignore[attr-defined]


def test_releasing_with_dead_destination_gets_a_new_one() -> None:
    cur = r(State.RELEASING, src=A, dst=DEAD)
    check(cur, {DEAD}, pick(C), forced(State.ASSIGNING, dst=C, src=A), C)
    check(cur, {DEAD}, pick(A), forced(State.ASSIGNING, dst=A), A)  # the fenced source takes it back


def test_releasing_both_dead_and_unload_with_dead_source() -> None:
    check(
        r(State.RELEASING, src=DEAD, dst=D), {DEAD, D}, pick(C), forced(State.ASSIGNING, dst=C, src=DEAD), C
    )
    check(r(State.RELEASING, src=DEAD), {DEAD}, pick(C), forced(State.ASSIGNING, dst=C, src=DEAD), C)


def test_splitting_source_dead_moves_the_split() -> None:
    cur = r(State.SPLITTING, src=DEAD, children={k: DEAD for k in CHILDREN})
    got = override_for(BUNDLE, cur, frozenset({DEAD}), pick(B), NOW, W)
    assert got is not None
    rec, dst = got
    assert dst == B
    assert rec == forced(State.SPLITTING, src=B, children={k: B for k in CHILDREN})
    assert rec is not None and rec.children is not None and set(rec.children) == set(CHILDREN)
    assert accepted(cur, rec)


def test_deleted_with_dead_source_is_left_for_the_tombstone_delay() -> None:
    # A split parent stays Deleted until the tombstone delay even when its source died: a tombstoned
    # parent would look unowned to a lookup with an outdated layout and could be assigned again.
    cur = r(State.DELETED, src=DEAD)
    assert not needs_healing(cur, frozenset({DEAD}))
    assert override_for(BUNDLE, cur, frozenset({DEAD}), pick(B), NOW, W) is None


@pytest.mark.parametrize(
    "cur",
    [
        r(State.OWNED, dst=DEAD, src=A),
        r(State.ASSIGNING, dst=DEAD, src=A),
        r(State.ASSIGNING, dst=DEAD),
        r(State.RELEASING, src=A, dst=DEAD),
        r(State.RELEASING, src=DEAD),
        r(State.SPLITTING, src=DEAD, children=CHILDREN),
    ],
)
def test_no_broker_available_forces_free(cur: Record) -> None:
    got = override_for(BUNDLE, cur, frozenset({DEAD}), NOBODY, NOW, W)
    assert got is not None
    rec, dst = got
    assert dst is None
    assert rec is not None and rec.state is State.FREE and rec.force and rec.dst is None
    assert accepted(cur, rec)


@pytest.mark.parametrize(
    "cur",
    [
        r(State.FREE, src=DEAD),
        r(State.OWNED, dst=B, src=DEAD),
        r(State.OWNED, dst=B),
        r(State.DELETED, dst=DEAD),
    ],
)
def test_nothing_to_heal(cur: Record) -> None:
    assert override_for(BUNDLE, cur, frozenset({DEAD}), pick(C), NOW, W) is None


@pytest.mark.parametrize("v", [1, 7, 1000])
def test_override_is_the_next_version(v: int) -> None:
    cur = r(State.OWNED, v, dst=DEAD)
    got = override_for(BUNDLE, cur, frozenset({DEAD}), pick(B), NOW, W)
    assert got is not None and got[0] is not None and got[0].version == v + 1
    assert accepted(cur, got[0])


# ------------------------------------------------------------------------------------ guard and grace


@pytest.mark.parametrize(
    ("failed", "live", "tripped"),
    [
        (0, 0, False),
        (0, 10, False),
        (1, 99, False),
        (10, 90, False),  # exactly max brokers
        (11, 89, True),  # more than 10
        (2, 3, False),  # exactly 40%
        (3, 4, True),  # 43%
        (1, 0, True),  # all of them
    ],
)
def test_mass_failure_thresholds(failed: int, live: int, tripped: bool) -> None:
    got = mass_failure(failed, live, HealConfig(mass_failure_max_brokers=10, mass_failure_max_fraction=0.4))
    assert (got is not None) == tripped
    if got is not None:
        assert str(failed) in got


def test_due_respects_grace() -> None:
    failed = {B: NOW - 60_000, A: NOW - 10_000, C: NOW}
    assert due(failed, HealConfig(grace_s=0), NOW) == [A, B, C]
    assert due(failed, HealConfig(grace_s=10), NOW) == [A, B]
    assert due(failed, HealConfig(grace_s=60), NOW) == [B]
    assert due(failed, HealConfig(grace_s=61), NOW) == []
    assert due(failed, HealConfig(grace_s=-1), NOW + 10**12) == []  # healing disabled
    assert due({}, HealConfig(), NOW) == []


# ---------------------------------------------------------------------------------------------- throttle


def dead_owned(n: int, v: int = 2) -> list[tuple[str, Record]]:
    return [(f"t/ns/0x{i:08x}_0x{i + 1:08x}", r(State.OWNED, v, dst=DEAD)) for i in range(n)]


def test_in_flight_by_broker() -> None:
    items = [
        ("x", r(State.ASSIGNING, dst=A)),
        ("y", r(State.ASSIGNING, dst=A, src=B)),
        ("z", r(State.RELEASING, src=A, dst=B)),
        ("w", r(State.OWNED, dst=B)),
    ]
    assert in_flight_by_broker(items) == Counter({A: 2})


def test_throttle_cluster_wide_limit() -> None:
    in_flight = Counter({C: 1})
    cfg = HealConfig(max_in_flight=3, max_in_flight_per_broker=100)
    out, deferred = throttle(
        dead_owned(5), frozenset({DEAD}), pick(A), in_flight, cfg, NOW, W, "failed_broker", DEAD
    )
    assert len(out) == 2 and deferred == 3
    assert in_flight == Counter({C: 1, A: 2})
    for o in out:
        assert o.reason == "failed_broker" and o.broker == DEAD and o.dst == A
        assert o.record is not None and o.record.state is State.ASSIGNING


def test_throttle_per_broker_limit() -> None:
    in_flight = Counter({A: 1})
    cfg = HealConfig(max_in_flight=100, max_in_flight_per_broker=2)
    cands = dead_owned(6)
    out, deferred = throttle(
        cands, frozenset({DEAD}), pick(A, B), in_flight, cfg, NOW, W, "failed_broker", DEAD
    )
    per_dst = Counter(o.dst for o in out)
    assert per_dst == Counter({A: 1, B: 2})
    assert deferred == 3  # nobody with room: wait, rather than force the bundles Free
    assert all(n <= 2 for n in in_flight.values())
    assert all(o.record is not None and o.record.state is State.ASSIGNING for o in out)
    items = dict(cands)
    for o in out:
        assert accepted(items[o.bundle], o.record, o.bundle)


def test_throttle_forces_free_when_no_broker_exists_at_all() -> None:
    out, deferred = throttle(
        dead_owned(2), frozenset({DEAD}), NOBODY, Counter(), HealConfig(), NOW, W, "x", DEAD
    )
    assert deferred == 0
    assert [o.record.state for o in out if o.record] == [State.FREE, State.FREE]


def test_throttle_skips_what_needs_no_healing() -> None:
    cands = [
        ("t/ns/0x00000000_0x40000000", r(State.OWNED, dst=A)),
        ("t/ns/0x40000000_0x80000000", r(State.DELETED, src=DEAD)),
        ("t/ns/0x80000000_0xc0000000", r(State.OWNED, dst=DEAD)),
    ]
    out, deferred = throttle(cands, frozenset({DEAD}), pick(A), Counter(), HealConfig(), NOW, W, "x", DEAD)
    assert [o.bundle for o in out] == ["t/ns/0x80000000_0xc0000000"]
    assert deferred == 0


def test_throttle_follows_the_planned_destination_while_it_can() -> None:
    cands = [(BUNDLE, r(State.OWNED, dst=DEAD))]

    def dsts(in_flight: Counter[str], live: set[str] | None = None) -> list[str]:
        """Where the dead broker's bundle goes, planned to B, with ``in_flight`` moves to each broker."""
        out, _ = throttle(
            cands,
            frozenset({DEAD}),
            pick(A),
            in_flight,
            HealConfig(),
            NOW,
            W,
            "x",
            DEAD,
            planned={BUNDLE: B},
            live=live,
        )
        return [o.dst for o in out]

    assert dsts(Counter(), live={A, B}) == [B]
    # The planned broker is gone (or full): another is chosen.
    assert dsts(Counter(), live={A}) == [A]
    assert dsts(Counter({B: HealConfig().max_in_flight_per_broker})) == [A]


def test_throttle_finishing_a_transfer_counts_in_flight() -> None:
    cands = [(BUNDLE, r(State.RELEASING, src=DEAD, dst=B))]
    in_flight: Counter[str] = Counter()
    out, _ = throttle(cands, frozenset({DEAD}), pick(C), in_flight, HealConfig(), NOW, W, "x", DEAD)
    assert [o.dst for o in out] == [B] and in_flight == Counter({B: 1})


# ---------------------------------------------------------------------------------- plan_destinations


def test_plan_destinations_spreads_over_equal_brokers() -> None:
    bundles = [f"t/ns/{i}" for i in range(100)]
    out = plan_destinations(bundles, {A: 0.3, B: 0.3, C: 0.3})
    counts = Counter(out.values())
    assert set(counts) == {A, B, C}
    assert max(counts.values()) - min(counts.values()) <= 1
    assert out == plan_destinations(bundles, {C: 0.3, A: 0.3, B: 0.3})  # deterministic


def test_plan_destinations_follows_headroom() -> None:
    bundles = [f"t/ns/{i}" for i in range(90)]
    out = plan_destinations(bundles, {A: 0.1, B: 0.55, C: 0.7})  # room .9, .45, .3
    counts = Counter(out.values())
    assert counts[A] > counts[B] > counts[C] > 0
    total = 0.9 + 0.45 + 0.3
    for b, room in ((A, 0.9), (B, 0.45), (C, 0.3)):
        assert counts[b] <= math.ceil(90 * room / total) + 1


def test_plan_destinations_counts_existing_bundles() -> None:
    out = plan_destinations([f"x{i}" for i in range(4)], {A: 0.5, B: 0.5}, {A: 4})
    assert Counter(out.values()) == Counter({B: 4})


def test_plan_destinations_counts_its_own_picks_for_anti_affinity() -> None:
    # A group of four, one bundle on each of A and B, two orphaned by a dead broker. Asked against the
    # ownership the plan started from, both orphans may go to either and both go to A (more headroom);
    # told each pick, the rules see A holding two after the first and send the second to B.
    group = [f"t/g/0x{i:08x}_0x{i + 1:08x}" for i in range(4)]
    owned = {group[0]: A, group[1]: B, group[2]: DEAD, group[3]: DEAD}
    policy = PlacementPolicy([Broker(A), Broker(B)], anti_affinity_groups={"t/g": "G"})
    loads = {A: 0.1, B: 0.6}

    blind = Placement(policy, owned)
    assert plan_destinations(group[2:], loads, None, blind.candidates) == {group[2]: A, group[3]: A}

    plan = Placement(policy, owned)
    out = plan_destinations(group[2:], loads, None, plan.candidates, plan.set_owner)
    assert out == {group[2]: A, group[3]: B}
    assert Counter(plan.owned[b] for b in group) == Counter({A: 2, B: 2})


def test_plan_destinations_without_candidates() -> None:
    assert plan_destinations(["x", "y"], {}) == {"x": None, "y": None}
    assert plan_destinations([], {A: 0.1}) == {}


def test_plan_destinations_overloaded_brokers_still_get_some_room() -> None:
    out = plan_destinations([f"x{i}" for i in range(200)], {A: 1.5, B: 0.0})
    counts = Counter(out.values())
    assert counts[A] > 0 and counts[B] > counts[A]


# ------------------------------------------------------------------------------------------- monitor

CFG = HealConfig(in_flight_timeout_s=30, tombstone_delay_s=3600)
OLD = NOW - 30_001
LIVE = frozenset({A, B, C})


def mon(items: list[tuple[str, Record]], choose=None, live: frozenset[str] = LIVE) -> list[Override]:  # type: ignore[no-untyped-def]
    return monitor(items, live, choose or pick(A, B, C), CFG, NOW, W)


def test_monitor_moves_a_stuck_assigning_away_from_its_target() -> None:
    cur = r(State.ASSIGNING, dst=B, ts=OLD)
    (o,) = mon([(BUNDLE, cur)], pick(B, C))
    assert (o.reason, o.broker, o.dst) == ("stuck", B, C)
    assert o.record == forced(State.ASSIGNING, dst=C)
    assert accepted(cur, o.record)


def test_monitor_stuck_transfer_assigning_keeps_its_source() -> None:
    cur = r(State.ASSIGNING, dst=B, src=A, ts=OLD)
    (o,) = mon([(BUNDLE, cur)], pick(B, C))
    assert o.record == forced(State.ASSIGNING, dst=C, src=A)
    assert accepted(cur, o.record)


def test_monitor_stuck_releasing_finishes_the_transfer() -> None:
    cur = r(State.RELEASING, src=A, dst=B, ts=OLD)
    (o,) = mon([(BUNDLE, cur)])
    assert (o.broker, o.dst) == (A, B)
    assert o.record == forced(State.ASSIGNING, dst=B, src=A)
    assert accepted(cur, o.record)


def test_monitor_stuck_unload_goes_elsewhere() -> None:
    cur = r(State.RELEASING, src=A, ts=OLD)
    (o,) = mon([(BUNDLE, cur)])
    assert o.record == forced(State.ASSIGNING, dst=B, src=A)
    assert accepted(cur, o.record)


def test_monitor_stuck_split_moves_to_another_source() -> None:
    cur = r(State.SPLITTING, src=A, children=CHILDREN, ts=OLD)
    (o,) = mon([(BUNDLE, cur)])
    assert o.record is not None and o.record.state is State.SPLITTING and o.record.src == B
    assert accepted(cur, o.record)


def test_monitor_stuck_with_nowhere_to_go_is_forced_free() -> None:
    cur = r(State.ASSIGNING, dst=B, ts=OLD)
    (o,) = mon([(BUNDLE, cur)], pick(B))
    assert o.record is not None and o.record.state is State.FREE
    assert accepted(cur, o.record)


def test_monitor_leaves_young_in_flight_states_alone() -> None:
    items = [
        (BUNDLE, r(State.ASSIGNING, dst=B, ts=NOW - 30_000)),  # exactly the timeout: not yet
        ("t/ns/0x40000000_0x80000000", r(State.RELEASING, src=A, dst=B, ts=NOW)),
        ("t/ns/0x80000000_0xc0000000", r(State.SPLITTING, src=A, children=CHILDREN, ts=NOW - 1)),
    ]
    assert mon(items) == []


@pytest.mark.parametrize(
    "cur",
    [
        r(State.ASSIGNING, dst=DEAD, ts=OLD),
        r(State.ASSIGNING, dst=DEAD, src=A, ts=OLD),
        r(State.RELEASING, src=DEAD, dst=B, ts=OLD),
        r(State.RELEASING, src=A, dst=DEAD, ts=OLD),
        r(State.RELEASING, src=DEAD, ts=OLD),
        r(State.SPLITTING, src=DEAD, children=CHILDREN, ts=OLD),
    ],
)
def test_monitor_leaves_failed_brokers_to_healing(cur: Record) -> None:
    assert mon([(BUNDLE, cur)]) == []


def test_monitor_moves_a_stuck_reassignment_from_a_dead_source() -> None:
    # Assigning{dst=live, src=dead} is not healing's (it depends on its live target only): if the target
    # never confirms, the monitor must move it on, or it stays stuck forever.
    cur = r(State.ASSIGNING, dst=B, src=DEAD, ts=OLD, force=True)
    assert not needs_healing(cur, frozenset({DEAD}))
    (o,) = mon([(BUNDLE, cur)], pick(B, C))
    assert o.record == forced(State.ASSIGNING, dst=C, src=DEAD)
    assert accepted(cur, o.record)
    assert mon([(BUNDLE, r(State.ASSIGNING, dst=B, src=DEAD, ts=NOW))]) == []  # young: untouched


def test_monitor_tombstones_semi_terminal_entries_after_the_delay() -> None:
    old = NOW - 3_600_001
    items = [
        ("t/ns/0x00000000_0x40000000", r(State.FREE, src=A, ts=old)),
        ("t/ns/0x40000000_0x80000000", r(State.FREE, ts=NOW - 3_600_000)),  # exactly the delay: not yet
        ("t/ns/0x80000000_0xc0000000", r(State.DELETED, src=A, ts=old)),
        ("t/ns/0xc0000000_0xffffffff", r(State.DELETED, src=A, ts=NOW - 1000)),  # young, source alive
    ]
    out = mon(items)
    assert [(o.bundle, o.record, o.reason) for o in out] == [
        ("t/ns/0x00000000_0x40000000", None, "tombstone"),
        ("t/ns/0x80000000_0xc0000000", None, "tombstone"),
    ]
    for o in out:
        assert accepted(dict(items)[o.bundle], o.record, o.bundle)


def test_monitor_leaves_a_young_deleted_parent_even_with_a_dead_source() -> None:
    assert mon([(BUNDLE, r(State.DELETED, src=DEAD, ts=NOW))]) == []


def test_monitor_never_touches_owned() -> None:
    items = [
        (BUNDLE, r(State.OWNED, dst=B, ts=0)),
        ("t/ns/0x40000000_0x80000000", r(State.OWNED, dst=DEAD, ts=0)),
    ]
    assert mon(items) == []
