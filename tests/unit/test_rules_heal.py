"""Self-healing's rules one at a time (balance/heal.py; docs/testing.md: mutation testing).

Every test names the rule it pins: the defaults that decide when healing pauses and how much it does at
once, the boundaries of the guard and the timers at equality, a healing plan that goes on past a bundle
nobody may take, the bundle's name reaching placement on every path that chooses a broker, and a monitor
that looks at every record however many young ones come first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import fields

import pytest

from trimtab.balance.heal import (
    HealConfig,
    due,
    mass_failure,
    monitor,
    orphaned,
    overdue,
    override_for,
    plan_destinations,
    throttle,
)
from trimtab.channel.records import Record, State, make
from trimtab.config.settings import ChannelSettings, HealingSettings, Settings

A, B, C = "a:1", "b:2", "c:3"
DEAD = "dead:9"
NOW = 1_000_000_000
W = "leader"
KIDS: dict[str, str | None] = {"0x00000000_0x20000000": DEAD, "0x20000000_0x40000000": DEAD}


def rec(state: State, *, ts: int = NOW, v: int = 3, **kw: str | dict[str, str | None] | None) -> Record:
    return make(state, version=v, ts=ts, writer="w", **kw)  # type: ignore[arg-type]


class Chooser:
    """Records which bundle each choice was asked about; answers the first broker of ``order`` not
    excluded, or, per bundle, the broker ``per_bundle`` names (placement rules differ by namespace)."""

    def __init__(self, *order: str, per_bundle: dict[str, str] | None = None) -> None:
        self.order = order
        self.per_bundle = per_bundle or {}
        self.asked: list[str] = []

    def __call__(self, bundle: str, exclude: frozenset[str]) -> str | None:
        self.asked.append(bundle)
        if bundle in self.per_bundle:
            return self.per_bundle[bundle]
        return next((b for b in self.order if b not in exclude), None)


# ------------------------------------------------------------------------------------ configuration


def test_healing_defaults_are_pinned() -> None:
    """Rule: the defaults that decide how healing behaves out of the box -- heal at once (grace 0), at
    most 10 000 reassignments in flight (5 000 into one broker), pause when more than 10 brokers or 40 %
    of them fail together, 30 s before an in-flight state is stuck, tombstones after an hour, alert after
    10 minutes -- and the settings' defaults give exactly that config."""
    assert HealConfig() == HealConfig(
        grace_s=0.0,
        max_in_flight=10_000,
        max_in_flight_per_broker=5000,
        mass_failure_max_brokers=10,
        mass_failure_max_fraction=0.4,
        in_flight_timeout_s=30.0,
        tombstone_delay_s=3600.0,
        alert_after_s=600.0,
    )
    assert HealConfig.from_settings(Settings()) == HealConfig()


def test_from_settings_maps_every_field() -> None:
    """Rule: every healing setting (and the channel's two timers) reaches ``HealConfig``."""
    s = Settings(
        healing=HealingSettings(
            grace_s=5.0,
            max_in_flight=7,
            max_in_flight_per_broker=3,
            mass_failure_max_brokers=2,
            mass_failure_max_fraction=0.9,
            alert_after_s=11.0,
        ),
        channel=ChannelSettings(in_flight_timeout_s=13.0, tombstone_delay_s=170.0),
    )
    cfg = HealConfig.from_settings(s)
    assert cfg == HealConfig(
        grace_s=5.0,
        max_in_flight=7,
        max_in_flight_per_broker=3,
        mass_failure_max_brokers=2,
        mass_failure_max_fraction=0.9,
        in_flight_timeout_s=13.0,
        tombstone_delay_s=170.0,
        alert_after_s=11.0,
    )
    assert all(getattr(cfg, f.name) != f.default for f in fields(HealConfig))


@pytest.mark.parametrize(
    ("failed", "live", "tripped"),
    [(10, 1000, False), (11, 1000, True), (4, 6, False), (5, 7, True), (2, 3, False), (3, 4, True)],
)
def test_the_default_mass_failure_guard(failed: int, live: int, tripped: bool) -> None:
    """Rule: with the default config the guard trips at more than 10 failed brokers, or more than 40 % of
    them (exactly 10, exactly 40 % do not trip)."""
    assert (mass_failure(failed, live, HealConfig()) is not None) == tripped


def test_the_default_in_flight_limit() -> None:
    """Rule: by default a round starts at most 10 000 reassignments cluster-wide; the rest wait."""
    items = [(f"t/ns/{i:05d}", rec(State.OWNED, dst=DEAD)) for i in range(10_001)]
    out, deferred = throttle(items, frozenset({DEAD}), Chooser(A, B, C), Counter(), HealConfig(), NOW, W,
                             "failed_broker", DEAD)  # fmt: skip
    assert (len(out), deferred) == (10_000, 1)
    per = Counter(o.dst for o in out)
    assert max(per.values()) <= 5000


def test_grace_is_measured_at_equality() -> None:
    """Rule: a failed broker is due once ``grace_s`` has passed, at exactly that age too (``>=``)."""
    assert due({A: NOW - 10_000}, HealConfig(grace_s=10), NOW) == [A]
    assert due({A: NOW - 9_999}, HealConfig(grace_s=10), NOW) == []


def test_overdue_at_exactly_alert_after_s() -> None:
    """Rule: a failed broker is overdue once ``alert_after_s`` passed since its first failure, at exactly
    that age too, counting the records that still depend on it."""
    needing = [rec(State.OWNED, dst=A), rec(State.OWNED, dst=A), rec(State.OWNED, dst=B)]
    cfg = HealConfig(alert_after_s=600)
    assert overdue({A: NOW - 600_000, B: NOW - 599_999}, needing, cfg, NOW) == {A: 2}


# ------------------------------------------------------------------------------------ the plan


def test_orphaned_is_in_bundle_name_order() -> None:
    """Rule: the persisted plan lists the orphaned bundles by name, whatever the table's order."""
    items = [("t/ns/c", rec(State.OWNED, dst=DEAD)), ("t/ns/a", rec(State.OWNED, dst=DEAD))]
    items.append(("t/ns/b", rec(State.OWNED, dst=A)))
    assert [b for b, _ in orphaned(items, frozenset({DEAD}))] == ["t/ns/a", "t/ns/c"]


def test_a_bundle_nobody_may_take_does_not_cut_the_plan_short() -> None:
    """Rule: a bundle the placement rules let no broker take is planned nowhere (None) and the plan goes
    on with the next bundle (``continue``, not ``break``)."""

    def allowed(bundle: str) -> Collection[str]:
        return frozenset() if bundle == "t/ns/1" else frozenset({A, B})

    got = plan_destinations(["t/ns/1", "t/ns/2", "t/ns/3"], {A: 0.1, B: 0.1}, allowed=allowed)
    assert got == {"t/ns/1": None, "t/ns/2": A, "t/ns/3": B}


def test_a_pool_given_again_as_a_mutable_collection_is_read_again() -> None:
    """Rule: the plan keeps its heap of candidates only for a pool that cannot change (the candidates
    themselves or a frozenset); a set that the caller changes between bundles (a rule that counts the
    plan's picks, e.g. anti-affinity through ``placed``) is read again for every bundle."""
    pool = {A, B}

    def placed(bundle: str, broker: str) -> None:
        pool.discard(broker)  # one bundle per broker

    got = plan_destinations(["x", "y"], {A: 0.0, B: 0.9}, allowed=lambda b: pool, placed=placed)
    assert got == {"x": A, "y": B}


def test_the_bundle_reaches_the_chooser_in_a_throttled_round() -> None:
    """Rule: every path of a healing round that chooses a broker asks about the bundle by its name (the
    placement rules are per namespace): an owned bundle, a split moved to a new source, a merge rolled
    forward, and a planned destination that is gone."""
    bundles = {
        "t/owned/0x00000000_0x40000000": rec(State.OWNED, dst=DEAD),
        "t/split/0x00000000_0x40000000": rec(State.SPLITTING, src=DEAD, children=KIDS),
        "t/merge/0x00000000_0x40000000": rec(
            State.MERGING, src=DEAD, children={"0x00000000_0x80000000": None}
        ),
    }
    choose = Chooser(per_bundle={b: f"{b.split('/')[1]}:1" for b in bundles})
    out, deferred = throttle(sorted(bundles.items()), frozenset({DEAD}), choose, Counter(), HealConfig(),
                             NOW, W, "failed_broker", DEAD, planned={"t/owned/0x00000000_0x40000000": DEAD})  # fmt: skip
    assert deferred == 0
    assert sorted(choose.asked) == sorted(bundles)
    assert {o.bundle: o.dst for o in out} == {b: f"{b.split('/')[1]}:1" for b in bundles}


def test_a_merge_rolled_forward_asks_about_its_own_bundle() -> None:
    """Rule: a merge whose source failed is pushed forward to the broker chosen for that bundle."""
    cur = rec(State.MERGING, src=DEAD, children={"0x00000000_0x80000000": None})
    choose = Chooser(per_bundle={"t/ns/0x00000000_0x40000000": B})
    got = override_for("t/ns/0x00000000_0x40000000", cur, frozenset({DEAD}), choose, NOW, W)
    assert got is not None and got[1] == B and choose.asked == ["t/ns/0x00000000_0x40000000"]


# ------------------------------------------------------------------------------------ the monitor


def test_one_young_in_flight_record_does_not_hide_the_stuck_ones_after_it() -> None:
    """Rule: the monitor looks at every record: a young in-flight record (or one of a failed broker's) is
    passed over (``continue``), and the stuck records after it are still forced onward."""
    cfg = HealConfig(in_flight_timeout_s=30)
    old = NOW - 30_001
    items = [
        ("t/ns/1", rec(State.ASSIGNING, dst=A, ts=NOW)),  # young
        ("t/ns/2", rec(State.ASSIGNING, dst=DEAD, ts=old)),  # a failed broker's: healing's
        ("t/ns/3", rec(State.ASSIGNING, dst=A, ts=old)),  # stuck
    ]
    out = monitor(items, frozenset({A, B}), Chooser(A, B), cfg, NOW, W)
    assert [(o.bundle, o.reason, o.dst) for o in out] == [("t/ns/3", "stuck", B)]


def test_in_flight_is_stuck_only_after_more_than_the_timeout() -> None:
    """Rule: an in-flight record is stuck once strictly older than ``in_flight_timeout_s`` (``age <=
    timeout`` is still young), by the writer's clock and by this node's."""
    cfg = HealConfig(in_flight_timeout_s=30)
    at = [("t/ns/1", rec(State.ASSIGNING, dst=A, ts=NOW - 30_000))]
    assert monitor(at, frozenset({A, B}), Chooser(A, B), cfg, NOW, W) == []
    past = [("t/ns/1", rec(State.ASSIGNING, dst=A, ts=NOW - 30_001))]
    assert len(monitor(past, frozenset({A, B}), Chooser(A, B), cfg, NOW, W)) == 1
    # This node saw it only 30 s ago: its own clock says it is not stuck yet.
    assert monitor(past, frozenset({A, B}), Chooser(A, B), cfg, NOW, W, lambda b, r: 30.0) == []
    assert len(monitor(past, frozenset({A, B}), Chooser(A, B), cfg, NOW, W, lambda b, r: 30.001)) == 1


def test_tombstones_only_after_more_than_the_delay() -> None:
    """Rule: a Free or Deleted entry is tombstoned once strictly older than ``tombstone_delay_s``."""
    cfg = HealConfig(tombstone_delay_s=3600)
    at = [
        ("t/ns/1", rec(State.FREE, ts=NOW - 3_600_000)),
        ("t/ns/2", rec(State.DELETED, src=A, ts=NOW - 3_600_000)),
    ]
    assert monitor(at, frozenset({A}), Chooser(A), cfg, NOW, W) == []
    past = [(b, rec(r.state, src=r.src, ts=NOW - 3_600_001)) for b, r in at]
    out = monitor(past, frozenset({A}), Chooser(A), cfg, NOW, W)
    assert [(o.bundle, o.record, o.reason, o.broker) for o in out] == [
        ("t/ns/1", None, "tombstone", None),
        ("t/ns/2", None, "tombstone", A),
    ]


def test_a_stuck_record_is_forced_on_when_its_brokers_are_exactly_the_live_ones() -> None:
    """Rule: the monitor forces a stuck record when every broker it depends on is live (``<=``, a subset
    or the whole set): the only live broker being its destination is enough."""
    items = [("t/ns/1", rec(State.ASSIGNING, dst=A, ts=NOW - 30_001))]
    out = monitor(items, frozenset({A}), Chooser(A), HealConfig(in_flight_timeout_s=30), NOW, W)
    assert [(o.bundle, o.reason, o.broker) for o in out] == [("t/ns/1", "stuck", A)]
    assert out[0].record is not None and out[0].record.state is State.FREE  # nowhere else to go


def test_this_node_s_clock_is_asked_about_the_record_s_own_bundle() -> None:
    """Rule: how long ago this node saw a record is looked up by the record's bundle."""
    items = [(f"t/ns/{i}", rec(State.ASSIGNING, dst=A, ts=NOW - 60_000)) for i in (1, 2)]
    seen = {"t/ns/1": 10.0, "t/ns/2": 40.0}
    out = monitor(items, frozenset({A, B}), Chooser(A, B), HealConfig(in_flight_timeout_s=30), NOW, W,
                  lambda bundle, r: seen[bundle])  # fmt: skip
    assert [o.bundle for o in out] == ["t/ns/2"]


# ------------------------------------------------------------------------------------ overrides


def test_a_split_with_nowhere_to_go_is_freed_naming_its_source() -> None:
    """Rule: a split whose source failed, with no broker to take it over, is forced to Free with the
    failed source recorded (``src``), as every override names the broker it takes the bundle from."""
    cur = rec(State.SPLITTING, src=DEAD, children=KIDS)
    got = override_for("t/ns/0x00000000_0x40000000", cur, frozenset({DEAD}), Chooser(), NOW, W)
    assert got is not None and got[1] is None
    assert got[0] is not None and (got[0].state, got[0].src, got[0].dst) == (State.FREE, DEAD, None)


def test_an_owned_bundle_with_nowhere_to_go_is_freed_naming_its_owner() -> None:
    """Rule: an owned bundle of a failed broker, with no broker to take it, is forced to Free naming the
    failed owner as its source."""
    got = override_for("t/ns/0x00000000_0x40000000", rec(State.OWNED, dst=DEAD), frozenset({DEAD}), Chooser(),
                       NOW, W)  # fmt: skip
    assert got is not None and got[0] is not None
    assert (got[0].state, got[0].src, got[0].dst, got[1]) == (State.FREE, DEAD, None, None)


def test_a_transfer_to_a_failed_destination_asks_about_its_bundle() -> None:
    """Rule: a transfer whose destination failed (the source is fenced, alive) gets a new destination
    chosen for that bundle."""
    cur = rec(State.RELEASING, src=A, dst=DEAD)
    choose = Chooser(per_bundle={"t/ns/0x00000000_0x40000000": C})
    got = override_for("t/ns/0x00000000_0x40000000", cur, frozenset({DEAD}), choose, NOW, W)
    assert got is not None and got[1] == C and choose.asked == ["t/ns/0x00000000_0x40000000"]
    assert got[0] is not None and (got[0].state, got[0].src, got[0].dst) == (State.ASSIGNING, A, C)
