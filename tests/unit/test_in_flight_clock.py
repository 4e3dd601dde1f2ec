"""In-flight deadlines against stepped wall clocks (issue 31, ``clock_skew``): the monitor waits the
timeout after it saw a record whatever the writer's clock says, and an agent never grants its broker a
lease past what the monitor waits because the writer's clock runs ahead."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trimtab.agent.leases import lease_bound
from trimtab.balance.heal import HealConfig, monitor
from trimtab.channel.inflight import InFlightClock
from trimtab.channel.records import Record, State, make

ME, OTHER = "me:1", "other:2"
BUNDLE = "t/ns/0x00000000_0x40000000"
NOW_MS = 1_700_000_000_000
TIMEOUT, MARGIN = 30.0, 2.0


class Mono:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def assigning(ts: int, version: int = 4, dst: str = ME) -> Record:
    return make(State.ASSIGNING, dst=dst, version=version, ts=ts, writer="w")


# ------------------------------------------------------------------ the clock itself
def test_a_record_is_seen_when_it_arrives_and_ages_on_the_monotonic_clock() -> None:
    mono = Mono()
    seen = InFlightClock(mono)
    rec = assigning(NOW_MS)
    seen.on_change(BUNDLE, None, rec)
    mono.t += 7.5
    assert seen.age_s(BUNDLE, rec) == 7.5


def test_a_record_met_first_by_a_question_is_seen_then() -> None:
    """Bootstrap and history gaps apply records without listeners: the first question starts the clock."""
    mono = Mono()
    seen = InFlightClock(mono)
    rec = assigning(NOW_MS - 3_600_000)
    assert seen.age_s(BUNDLE, rec) == 0.0
    mono.t += 4
    assert seen.age_s(BUNDLE, rec) == 4.0


def test_a_new_version_starts_again_and_a_settled_record_is_forgotten() -> None:
    mono = Mono()
    seen = InFlightClock(mono)
    first = assigning(NOW_MS, version=4)
    seen.on_change(BUNDLE, None, first)
    mono.t += 10
    second = assigning(NOW_MS, version=5, dst=OTHER)
    seen.on_change(BUNDLE, first, second)
    assert seen.age_s(BUNDLE, second) == 0.0
    seen.on_change(BUNDLE, second, make(State.OWNED, dst=OTHER, version=6, ts=NOW_MS, writer="w"))
    assert len(seen) == 0
    seen.on_change(BUNDLE, None, None)  # a tombstone: nothing to forget, no error
    assert len(seen) == 0


# ------------------------------------------------------------------ the agent's lease bound
@given(
    skew_s=st.floats(-120, 120),
    seen_s=st.floats(0, 120),
    written_ago_s=st.floats(0, 120),
)
def test_a_lease_is_never_longer_than_either_clock_allows(
    skew_s: float, seen_s: float, written_ago_s: float
) -> None:
    """``skew_s``: how far the writer's clock is ahead of ours. The bound is at most the timeout (minus the
    margin) after this agent saw the record, and at most what the writer's timestamp allows."""
    ts = int(NOW_MS - written_ago_s * 1000 + skew_s * 1000)
    rec = assigning(ts)
    kw = {"now_ms": NOW_MS, "in_flight_timeout_s": TIMEOUT, "margin_s": MARGIN, "stale": False}
    bound = lease_bound(ME, rec, seen_age_s=seen_s, **kw)  # type: ignore[arg-type]
    by_writer = lease_bound(ME, rec, **kw)  # type: ignore[arg-type]
    assert bound is not None and by_writer is not None
    assert bound <= by_writer + 1e-9
    assert bound <= TIMEOUT - MARGIN - seen_s + 1e-9


def test_a_writer_thirty_seconds_ahead_cannot_lengthen_the_lease() -> None:
    """By the writer's timestamp alone the record would have 58 s left (30 s of timeout + 30 s of skew,
    minus the margin); the lease is bounded as if it had just been written, then by when it was seen."""
    rec = assigning(NOW_MS + 30_000)  # stamped 30 s in our future
    kw = {"now_ms": NOW_MS, "in_flight_timeout_s": TIMEOUT, "margin_s": MARGIN, "stale": False}
    assert lease_bound(ME, rec, **kw) == TIMEOUT - MARGIN  # type: ignore[arg-type]
    assert lease_bound(ME, rec, seen_age_s=5.0, **kw) == TIMEOUT - MARGIN - 5  # type: ignore[arg-type]


# ------------------------------------------------------------------ the leader's monitor
CFG = HealConfig(in_flight_timeout_s=TIMEOUT)
LIVE = frozenset({ME, OTHER})


def choose(bundle: str, exclude: frozenset[str]) -> str | None:
    return next((b for b in sorted(LIVE) if b not in exclude), None)


def stuck(rec: Record, seen_s: float | None) -> bool:
    seen = None if seen_s is None else (lambda bundle, r: seen_s)
    return bool(monitor([(BUNDLE, rec)], LIVE, choose, CFG, NOW_MS, "leader", seen))


def test_a_record_from_a_writer_behind_is_not_forced_on_before_the_timeout_passed_here() -> None:
    rec = assigning(NOW_MS - 45_000)  # 45 s old by its writer's clock, which is 30 s behind
    assert stuck(rec, None)  # by the writer's clock alone: forced onward at once
    assert not stuck(rec, 15.0)  # seen 15 s ago: waits
    assert stuck(rec, TIMEOUT + 0.001)


@given(written_ago_s=st.floats(-120, 600), seen_s=st.floats(0, TIMEOUT))
def test_the_monitor_never_forces_a_record_seen_less_than_the_timeout_ago(
    written_ago_s: float, seen_s: float
) -> None:
    assert not stuck(assigning(int(NOW_MS - written_ago_s * 1000)), seen_s)


def test_the_monitor_still_needs_the_writer_s_timeout_too() -> None:
    """Seen long ago but stamped just now (a writer ahead, or a leader behind): the writer's age decides."""
    assert not stuck(assigning(NOW_MS - 1_000), 600.0)
