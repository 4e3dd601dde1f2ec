"""Merged simulated-broker timelines: who served which bundle when, and the single-owner check.

Every simulated broker (``agent.adapters.simulated.SimulatedBroker``) records ``acquire``, ``fence``,
``close``, ``prewarm`` and ``split`` events with ``time.monotonic_ns()``. On Linux that is
CLOCK_MONOTONIC, one clock for every process on the machine, so the timelines of all brokers (fetched
with ``GET /v1/sim/state`` or ``LocalCluster.timelines()``) can be merged and compared directly.

A broker *serves* a bundle from an ``acquire`` until the next ``fence``, ``close`` or ``split`` of that
bundle (a fenced bundle takes no more work; a split parent lives on in its children). The safety property
of the whole system is that these serving intervals never overlap across brokers:
:func:`check_single_owner` asserts exactly that.

A killed process cannot report its timeline: take a snapshot before killing it and pass its death time
(``time.monotonic_ns()`` once the process is known dead) in ``ended_at`` so its still-open intervals end
there instead of running forever. Several snapshots of the same broker id (a restarted agent) may be
concatenated: events are de-duplicated and sorted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

OPEN_END = 2**63 - 1  # an interval that had not ended when the timeline was taken
_ENDS = frozenset({"fence", "close", "split"})

Event = Mapping[str, Any]


@dataclass(frozen=True, order=True)
class Interval:
    """``[start_ns, end_ns)`` during which ``broker`` served ``bundle``; ``end_op`` is what ended it."""

    bundle: str
    start_ns: int
    end_ns: int
    broker: str
    end_op: str | None = None

    @property
    def open(self) -> bool:
        return self.end_ns == OPEN_END


def merged(timelines: Mapping[str, Iterable[Event]]) -> list[dict[str, Any]]:
    """Every event of every broker, with a ``broker`` field, de-duplicated, in ``mono_ns`` order."""
    seen: set[tuple[Any, ...]] = set()
    out: list[dict[str, Any]] = []
    for broker, events in timelines.items():
        for e in events:
            key = (broker, e["mono_ns"], e["op"], e["bundle"], e.get("detail"))
            if key in seen:
                continue
            seen.add(key)
            out.append({**e, "broker": broker})
    out.sort(key=lambda e: (e["mono_ns"], e["broker"]))
    return out


def serving_intervals(
    timelines: Mapping[str, Iterable[Event]], ended_at: Mapping[str, int] | None = None
) -> dict[str, list[Interval]]:
    """Bundle -> the serving intervals of every broker, sorted by start."""
    ended_at = ended_at or {}
    opened: dict[tuple[str, str], int] = {}  # (broker, bundle) -> start
    out: dict[str, list[Interval]] = {}
    for e in merged(timelines):
        key = (e["broker"], e["bundle"])
        op = e["op"]
        if op == "acquire":
            opened.setdefault(key, e["mono_ns"])  # a repeated acquire keeps the interval open
        elif op in _ENDS and key in opened:
            start = opened.pop(key)
            out.setdefault(e["bundle"], []).append(
                Interval(e["bundle"], start, e["mono_ns"], e["broker"], op)
            )
    for (broker, bundle), start in opened.items():
        end = ended_at.get(broker, OPEN_END)
        out.setdefault(bundle, []).append(Interval(bundle, start, max(end, start), broker, None))
    for intervals in out.values():
        intervals.sort(key=lambda i: (i.start_ns, i.end_ns, i.broker))
    return out


def overlaps(
    timelines: Mapping[str, Iterable[Event]], ended_at: Mapping[str, int] | None = None
) -> list[tuple[Interval, Interval]]:
    """Pairs of intervals of one bundle, on different brokers, that overlap in time."""
    bad: list[tuple[Interval, Interval]] = []
    for intervals in serving_intervals(timelines, ended_at).values():
        for i, a in enumerate(intervals):
            for b in intervals[i + 1 :]:
                if b.start_ns >= a.end_ns:
                    break  # sorted by start: no later interval can overlap a
                if a.broker != b.broker:
                    bad.append((a, b))
    return bad


def _fmt(i: Interval) -> str:
    end = "open" if i.open else f"{i.end_ns} ({i.end_op})"
    return f"{i.broker} [{i.start_ns}, {end})"


def check_single_owner(
    timelines: Mapping[str, Iterable[Event]], ended_at: Mapping[str, int] | None = None
) -> dict[str, list[Interval]]:
    """Assert that no bundle was ever served by two brokers at once; return the intervals.

    ``timelines`` maps broker id -> timeline events (``LocalCluster.timelines()``); ``ended_at`` maps a
    dead broker to the ``time.monotonic_ns()`` at which it was known dead.
    """
    bad = overlaps(timelines, ended_at)
    if bad:
        lines = [f"  {a.bundle}: {_fmt(a)} overlaps {_fmt(b)}" for a, b in bad[:20]]
        more = f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else ""
        raise AssertionError(
            f"{len(bad)} bundle(s) served by two brokers at once:\n" + "\n".join(lines) + more
        )
    return serving_intervals(timelines, ended_at)


def first(timelines: Mapping[str, Iterable[Event]], broker: str, op: str, bundle: str) -> Event | None:
    """The first ``op`` event of ``bundle`` on ``broker``, or None."""
    for e in merged({broker: timelines.get(broker, [])}):
        if e["op"] == op and e["bundle"] == bundle:
            return e
    return None


def last(timelines: Mapping[str, Iterable[Event]], broker: str, op: str, bundle: str) -> Event | None:
    """The last ``op`` event of ``bundle`` on ``broker``, or None."""
    found = None
    for e in merged({broker: timelines.get(broker, [])}):
        if e["op"] == op and e["bundle"] == bundle:
            found = e
    return found
