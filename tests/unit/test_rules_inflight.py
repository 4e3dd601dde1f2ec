"""The in-flight clock's rules that the clock-skew tests leave loose (channel/inflight.py; docs/testing.md).

The writer's age of a record is its timestamp read against ours, in seconds: exact values, both signs.
"""

from __future__ import annotations

from trimtab.channel.inflight import InFlightClock, wall_age_s
from trimtab.channel.records import Record, State, make

NOW_MS = 1_700_000_000_000
BUNDLE = "t/ns/0x00000000_0x40000000"


def assigning(ts: int, version: int = 4) -> Record:
    return make(State.ASSIGNING, dst="me:1", version=version, ts=ts, writer="w")


def test_the_writer_s_age_is_in_seconds() -> None:
    """Rule: ``wall_age_s`` is (now_ms - ts) / 1000 -- milliseconds to seconds, exactly (1 500 ms: 1.5 s,
    125 ms: .125 s)."""
    assert wall_age_s(assigning(NOW_MS - 1_500), NOW_MS) == 1.5
    assert wall_age_s(assigning(NOW_MS - 125), NOW_MS) == 0.125
    assert wall_age_s(assigning(NOW_MS - 30_000), NOW_MS) == 30.0
    assert wall_age_s(assigning(NOW_MS), NOW_MS) == 0.0


def test_a_writer_ahead_gives_a_negative_age() -> None:
    """Rule: a record stamped in our future is younger than new: its age is negative, not clamped (the
    lease bound reads the sign)."""
    assert wall_age_s(assigning(NOW_MS + 250), NOW_MS) == -0.25
    assert wall_age_s(assigning(NOW_MS + 30_000), NOW_MS) == -30.0


def test_the_seen_age_never_goes_below_zero() -> None:
    """Rule: a monotonic clock read that comes out earlier than the first sight (a test clock, a clock
    reset) gives age 0, never a negative age; the same version keeps its first sight."""
    t = [100.0]
    seen = InFlightClock(lambda: t[0])
    rec = assigning(NOW_MS)
    seen.on_change(BUNDLE, None, rec)
    t[0] = 99.5
    assert seen.age_s(BUNDLE, rec) == 0.0
    t[0] = 100.25
    assert seen.age_s(BUNDLE, rec) == 0.25
    assert len(seen) == 1
