"""The history checker: merged simulated-broker timelines, who served which bundle when, and what went wrong.

Every simulated broker (``agent.adapters.simulated.SimulatedBroker``) records ``acquire``, ``fence``,
``close``, ``expire``, ``prewarm`` and ``split`` events with ``time.monotonic_ns()``. On Linux that is
CLOCK_MONOTONIC, one clock for every process on the machine, so the timelines of all brokers (fetched with
``GET /v1/sim/state`` or ``LocalCluster.timelines()``) can be merged and compared directly. A broker's
timeline is not in time order (an ``expire`` is recorded when the broker notices it, stamped with the
lease's deadline): everything here sorts by ``mono_ns``.

A broker *serves* a bundle from an ``acquire`` until the next ``fence``, ``close``, ``expire`` or
``split`` of that bundle on that broker (a fenced bundle takes no more work; a lapsed lease stops service
on its own; a split parent lives on in its children, each acquired with detail ``"split from <parent>"``
at the split's instant). A repeated ``acquire`` keeps the interval open; an end with no interval open (an
``expire`` of a fenced bundle) changes nothing. Intervals are half-open, ``[start_ns, end_ns)``: a
hand-over where the old owner's ``fence`` and the new owner's ``acquire`` carry the same instant is neither
an overlap nor a gap, and an interval of length zero covers nothing.

Two questions are asked of the merged history (:func:`load_history` builds it once):

* safety -- :func:`double_serving`: every window, computed exactly with a sweep line, in which two or more
  brokers served one bundle. The whole system exists to keep that list empty.
* availability -- :func:`unserved_gaps` and :func:`lost_bundles`: once a bundle has been served, every
  stretch of time in which no broker served it, with the op and broker that ended the coverage; and the
  bundles still unserved at the end of the observation window after the cluster had time to settle.

A killed process cannot report its timeline: snapshot it before the kill and pass the death time
(``time.monotonic_ns()`` once the process is known dead) in ``ended_at``, so intervals still open then end
there (``end_op`` :data:`KILLED`) instead of running forever. Several snapshots of the same broker id (a
restarted agent, or repeated polls of one process) may be concatenated: events are de-duplicated and
sorted. A broker restarted several times may be given all its death times; events after a death belong to
the next process, which starts with nothing served.

:func:`check_single_owner` (the integration tests' assertion) and its helpers keep the interface of the
original ``tests.support.timeline``, which now re-exports them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

OPEN_END = 2**63 - 1  # an interval that had not ended when the timeline was taken
INTERVAL_ENDS = frozenset({"fence", "close", "expire", "split", "merge"})
KILLED = "killed"  # ``end_op`` of an interval ended by its broker's death (``ended_at``)
SHOWN_WINDOWS = 20  # double-serving windows listed in full by :func:`summarize`

Event = Mapping[str, Any]
# Broker -> the instant (or instants, for a broker restarted several times) its process was known dead.
EndedAt = Mapping[str, int | Iterable[int]]


# ---------------------------------------------------------------------------------------------- intervals


@dataclass(frozen=True, order=True, slots=True)
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
    """Every event of every broker, with a ``broker`` field, de-duplicated, in ``mono_ns`` order.

    The sort is stable, so events of one broker at the same instant keep the order it recorded them in
    (an ``expire`` noticed by a call is recorded before what the call then does).
    """
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


def _death_times(ended_at: EndedAt | None) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for broker, when in (ended_at or {}).items():
        out[broker] = sorted({when} if isinstance(when, int) else set(when))
    return out


@dataclass(slots=True)
class _Scan:
    intervals: dict[str, list[Interval]]
    split_at: dict[str, int]  # bundle -> its first split or merge, by any broker
    bundles: set[str]
    last_ns: int  # the latest event or death: the default end of the observation window


def _scan(timelines: Mapping[str, Iterable[Event]], ended_at: EndedAt | None) -> _Scan:
    """One pass over the merged events: serving intervals, split instants, bundles seen."""
    deaths = _death_times(ended_at)
    next_death = dict.fromkeys(deaths, 0)
    opened: dict[str, dict[str, int]] = {}  # broker -> bundle -> start of its open interval
    out: dict[str, list[Interval]] = {}
    split_at: dict[str, int] = {}
    bundles: set[str] = set()
    last_ns = max((t for ts in deaths.values() for t in ts), default=0)

    def bury(broker: str, before_ns: int) -> None:
        # A death ends every interval of the broker open then. Events at the death instant itself were
        # recorded before it (the death time is taken once the process is known dead).
        times = deaths.get(broker)
        if not times:
            return
        i = next_death[broker]
        while i < len(times) and times[i] < before_ns:
            for bundle, start in opened.pop(broker, {}).items():
                out.setdefault(bundle, []).append(Interval(bundle, start, times[i], broker, KILLED))
            i += 1
        next_death[broker] = i

    for e in merged(timelines):
        broker, bundle, op, t = e["broker"], e["bundle"], e["op"], e["mono_ns"]
        bury(broker, t)
        bundles.add(bundle)
        last_ns = max(last_ns, t)
        mine = opened.setdefault(broker, {})
        if op == "acquire":
            mine.setdefault(bundle, t)  # a repeated acquire keeps the interval open
        elif op in INTERVAL_ENDS:
            start = mine.pop(bundle, None)
            if start is not None:
                out.setdefault(bundle, []).append(Interval(bundle, start, t, broker, op))
            if op in ("split", "merge"):
                # A parent that lives on in its children or in the bundle it merged into: not lost.
                split_at.setdefault(bundle, t)  # merged() is in time order: the first is the earliest
    for broker in deaths:
        bury(broker, OPEN_END)
    for broker, mine in opened.items():
        for bundle, start in mine.items():
            out.setdefault(bundle, []).append(Interval(bundle, start, OPEN_END, broker, None))
    for intervals in out.values():
        intervals.sort(key=lambda i: (i.start_ns, i.end_ns, i.broker))
    return _Scan(out, split_at, bundles, last_ns)


def serving_intervals(
    timelines: Mapping[str, Iterable[Event]], ended_at: EndedAt | None = None
) -> dict[str, list[Interval]]:
    """Bundle -> the serving intervals of every broker, sorted by start."""
    return _scan(timelines, ended_at).intervals


def overlaps(
    timelines: Mapping[str, Iterable[Event]], ended_at: EndedAt | None = None
) -> list[tuple[Interval, Interval]]:
    """Pairs of intervals of one bundle, on different brokers, that overlap in time.

    A pass/fail flag for the integration tests; :func:`double_serving` measures the windows exactly.
    """
    bad: list[tuple[Interval, Interval]] = []
    for intervals in serving_intervals(timelines, ended_at).values():
        for i, a in enumerate(intervals):
            for b in intervals[i + 1 :]:
                if b.start_ns >= a.end_ns:
                    break  # sorted by start: no later interval can overlap a
                if a.broker != b.broker and b.start_ns < b.end_ns:
                    bad.append((a, b))
    return bad


def _fmt(i: Interval) -> str:
    end = "open" if i.open else f"{i.end_ns} ({i.end_op})"
    return f"{i.broker} [{i.start_ns}, {end})"


def check_single_owner(
    timelines: Mapping[str, Iterable[Event]], ended_at: EndedAt | None = None
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


# ---------------------------------------------------------------------------------------------- the history


@dataclass(frozen=True, slots=True)
class History:
    """The merged history of one observation window, built once by :func:`load_history`.

    ``intervals`` are as recorded (a live broker's current interval ends at :data:`OPEN_END`); every
    analysis clips them to ``observed_until_ns``, because nothing after the window end is known.
    ``split_at`` holds only splits inside the window.
    """

    brokers: tuple[str, ...]
    bundles: tuple[str, ...]  # every bundle named by any event, served or not
    intervals: Mapping[str, Sequence[Interval]]
    split_at: Mapping[str, int]
    observed_until_ns: int

    def is_split(self, bundle: str) -> bool:
        return bundle in self.split_at


def load_history(
    timelines: Mapping[str, Iterable[Event]],
    *,
    ended_at: EndedAt | None = None,
    observed_until_ns: int | None = None,
) -> History:
    """Merge the brokers' timelines into a :class:`History`.

    ``timelines``: broker id -> events (snapshots of one broker may be concatenated). ``ended_at``: broker
    id -> the death time(s) of its process. ``observed_until_ns``: the end of the observation window,
    ideally ``time.monotonic_ns()`` right after the last snapshot; by default the latest event or death,
    which cannot see how long the final state lasted.
    """
    scan = _scan(timelines, ended_at)
    until = scan.last_ns if observed_until_ns is None else observed_until_ns
    return History(
        brokers=tuple(sorted(set(timelines) | set(ended_at or {}))),
        bundles=tuple(sorted(scan.bundles)),
        intervals=scan.intervals,
        split_at={b: t for b, t in scan.split_at.items() if t <= until},
        observed_until_ns=until,
    )


# (start_ns, end_ns, broker, end_op): an interval clipped to the window, never empty.
_Span = tuple[int, int, str, str | None]


def _spans(history: History, bundle: str) -> list[_Span]:
    until = history.observed_until_ns
    out = [
        (i.start_ns, min(i.end_ns, until), i.broker, i.end_op)
        for i in history.intervals.get(bundle, ())
        if i.start_ns < min(i.end_ns, until)
    ]
    out.sort(key=lambda s: (s[0], s[2]))
    return out


# ---------------------------------------------------------------------------------------------- safety


class DoubleServingDict(TypedDict):
    bundle: str
    brokers: list[str]
    max_brokers: int
    start_ns: int
    end_ns: int
    duration_ns: int
    open: bool


@dataclass(frozen=True, slots=True)
class DoubleServing:
    """A maximal window ``[start_ns, end_ns)`` in which at least two brokers served ``bundle``.

    ``brokers`` are all that served it at some instant of the window (the set may change inside it: A+B,
    then A+B+C, then B+C is one window); ``max_brokers`` is how many at once, at most. ``open``: the
    window lasted until the end of observation, its true end is unknown.
    """

    bundle: str
    brokers: tuple[str, ...]
    max_brokers: int
    start_ns: int
    end_ns: int
    open: bool

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    def to_dict(self) -> DoubleServingDict:
        return {
            "bundle": self.bundle,
            "brokers": list(self.brokers),
            "max_brokers": self.max_brokers,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "duration_ns": self.duration_ns,
            "open": self.open,
        }


def _windows(bundle: str, spans: Sequence[_Span], until: int) -> list[DoubleServing]:
    # Sweep line: +1/-1 per broker at each span's ends; the state between two distinct instants is the
    # one after applying every edge at the earlier instant (half-open spans).
    edges = sorted([(s, 1, b) for s, _, b, _ in spans] + [(e, -1, b) for _, e, b, _ in spans])
    active: Counter[str] = Counter()
    out: list[DoubleServing] = []
    start: int | None = None
    involved: set[str] = set()
    peak = 0
    i = 0
    while i < len(edges):
        t = edges[i][0]
        while i < len(edges) and edges[i][0] == t:
            _, delta, broker = edges[i]
            active[broker] += delta
            if not active[broker]:
                del active[broker]
            i += 1
        n = len(active)
        if n >= 2:
            if start is None:
                start, involved, peak = t, set(), 0
            involved.update(active)
            peak = max(peak, n)
        elif start is not None:
            out.append(DoubleServing(bundle, tuple(sorted(involved)), peak, start, t, t >= until))
            start = None
    return out  # every span ends by ``until``: no window is left unclosed


def double_serving(history: History) -> list[DoubleServing]:
    """Every window in which two or more brokers served one bundle, by bundle then start.

    Exact: a sweep line over the interval ends, O(n log n) per bundle.
    """
    out: list[DoubleServing] = []
    for bundle in sorted(history.intervals):
        out.extend(_windows(bundle, _spans(history, bundle), history.observed_until_ns))
    return out


# ---------------------------------------------------------------------------------------------- availability


class GapDict(TypedDict):
    bundle: str
    start_ns: int
    end_ns: int
    duration_ns: int
    open: bool
    cause_op: str | None
    cause_broker: str | None
    ended_by: str | None
    resumed_by: str | None


@dataclass(frozen=True, slots=True)
class Gap:
    """``[start_ns, end_ns)``: after it was first served, nobody served ``bundle``.

    ``cause_op``/``cause_broker``: the end of the coverage (``fence``, ``close``, ``expire`` or
    :data:`KILLED`) and whose it was. ``ended_by``: ``"acquire"`` (``resumed_by`` acquired it),
    ``"split"`` (the bundle split: its children took over), or None: still open at the end of the
    observation window, where ``end_ns`` is put.
    """

    bundle: str
    start_ns: int
    end_ns: int
    cause_op: str | None
    cause_broker: str | None
    ended_by: str | None = None
    resumed_by: str | None = None

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def open(self) -> bool:
        return self.ended_by is None

    def to_dict(self) -> GapDict:
        return {
            "bundle": self.bundle,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "duration_ns": self.duration_ns,
            "open": self.open,
            "cause_op": self.cause_op,
            "cause_broker": self.cause_broker,
            "ended_by": self.ended_by,
            "resumed_by": self.resumed_by,
        }


def _coverage_and_gaps(history: History, bundle: str) -> tuple[list[tuple[int, int]], list[Gap]]:
    """The union of the bundle's serving intervals and the gaps in it, from its first acquire to its
    split (a split parent stops counting there) or the end of the window: together they partition that
    stretch of time."""
    split = history.split_at.get(bundle)
    horizon = history.observed_until_ns if split is None else split
    coverage: list[tuple[int, int]] = []
    gaps: list[Gap] = []
    cov_start = cov_end = -1
    cause: tuple[str | None, str] = (None, "")
    for s, e, broker, op in _spans(history, bundle):  # by start, then broker
        if s >= horizon:
            break
        e = min(e, horizon)
        if cov_end < 0:
            cov_start, cov_end, cause = s, e, (op, broker)
        elif s > cov_end:
            coverage.append((cov_start, cov_end))
            gaps.append(Gap(bundle, cov_end, s, cause[0], cause[1], "acquire", broker))
            cov_start, cov_end, cause = s, e, (op, broker)
        elif e > cov_end or (e == cov_end and broker < cause[1]):  # ties: the first broker by name
            cov_end, cause = e, (op, broker)
    if cov_end < 0:
        return [], []  # never served in the window
    coverage.append((cov_start, cov_end))
    if cov_end < horizon:
        gaps.append(Gap(bundle, cov_end, horizon, cause[0], cause[1], None if split is None else "split"))
    return coverage, gaps


def coverage(history: History, bundle: str) -> list[tuple[int, int]]:
    """The union over brokers of the bundle's serving intervals, as disjoint ``[start, end)`` spans in
    order, clipped to the window and, for a split parent, to its split."""
    return _coverage_and_gaps(history, bundle)[0]


def unserved_gaps(history: History) -> dict[str, list[Gap]]:
    """Bundle -> its gaps in order (bundles with none are left out).

    A gap starts when the coverage (any broker serving) ends and ends at the next acquire by any broker.
    Only the time after the bundle's first acquire counts (before that it did not exist, or nobody had
    looked it up), and a split parent stops counting at its split: its children count from their own
    acquires. A gap still open at the end of the window runs to ``observed_until_ns``.
    """
    out: dict[str, list[Gap]] = {}
    for bundle in sorted(history.intervals):
        gaps = _coverage_and_gaps(history, bundle)[1]
        if gaps:
            out[bundle] = gaps
    return out


def lost_bundles(
    history: History, *, settle_ns: int, intentionally_unserved: Collection[str] = ()
) -> list[Gap]:
    """The open final gap of every bundle that was served once and has been unserved for more than
    ``settle_ns`` at the end of the window, by bundle.

    ``settle_ns`` is the time the cluster is allowed to re-home a bundle (a transfer or a failover in
    progress when the window closed is not a loss). Split parents live on in their children and are never
    lost; ``intentionally_unserved`` lists the bundles the run unloaded or deleted on purpose.
    """
    lost: list[Gap] = []
    for bundle, gaps in unserved_gaps(history).items():
        tail = gaps[-1]
        if tail.open and tail.duration_ns > settle_ns and bundle not in intentionally_unserved:
            lost.append(tail)
    return lost


# ---------------------------------------------------------------------------------------------- summary


def nearest_rank(values: Sequence[int], percent: int) -> int:
    """The ``percent``-th percentile by the nearest-rank method: with the N values sorted ascending, the
    one at 1-based rank ``ceil(percent / 100 * N)``. Always a value that was actually observed (p100 is
    the maximum; p50 of two values is the smaller one). Integer arithmetic, so no float rounding moves
    the rank."""
    if not values:
        raise ValueError("no values")
    if not 0 < percent <= 100:
        raise ValueError(f"percent must be in (0, 100], not {percent}")
    ordered = sorted(values)
    return ordered[-(-percent * len(ordered) // 100) - 1]


class Unavailability(TypedDict):
    gaps: int
    open_gaps: int
    p50_s: float | None
    p99_s: float | None
    max_s: float | None
    unserved_bundle_s_total: float


class Summary(TypedDict):
    observed_until_ns: int
    brokers: list[str]
    bundles_seen: int
    bundles_served: int
    split_parents: int
    intervals: int
    double_serving_windows: int
    double_serving: list[DoubleServingDict]
    double_serving_ns_total: int
    lost: int
    lost_bundles: list[GapDict]
    unavailability: Unavailability


def _seconds(ns: int) -> float:
    return round(ns / 1e9, 6)


def summarize(history: History, *, settle_ns: int, intentionally_unserved: Collection[str] = ()) -> Summary:
    """The verdict on one history as a JSON-ready dict (ints, floats, strings, lists, None).

    ``double_serving`` lists the first :data:`SHOWN_WINDOWS` windows (by bundle, then start); the count
    and ``double_serving_ns_total`` cover them all. ``lost_bundles`` lists every lost bundle.
    ``unavailability`` is over every gap (an open one measured to the window end, so a lower bound), but
    the final open gap of an ``intentionally_unserved`` bundle is no outage and is left out; percentiles
    are nearest-rank (:func:`nearest_rank`) of the gap durations, in seconds; None when there is no gap.
    ``intervals`` and ``bundles_served`` count only what the window saw (non-empty, clipped intervals).
    """
    windows = double_serving(history)
    lost = lost_bundles(history, settle_ns=settle_ns, intentionally_unserved=intentionally_unserved)
    gaps = [
        g
        for bundle, found in unserved_gaps(history).items()
        for g in found
        if not (g.open and bundle in intentionally_unserved)
    ]
    durations = [g.duration_ns for g in gaps]
    spans = {b: len(_spans(history, b)) for b in history.intervals}
    return {
        "observed_until_ns": history.observed_until_ns,
        "brokers": list(history.brokers),
        "bundles_seen": len(history.bundles),
        "bundles_served": sum(1 for n in spans.values() if n),
        "split_parents": len(history.split_at),
        "intervals": sum(spans.values()),
        "double_serving_windows": len(windows),
        "double_serving": [w.to_dict() for w in windows[:SHOWN_WINDOWS]],
        "double_serving_ns_total": sum(w.duration_ns for w in windows),
        "lost": len(lost),
        "lost_bundles": [g.to_dict() for g in lost],
        "unavailability": {
            "gaps": len(gaps),
            "open_gaps": sum(1 for g in gaps if g.open),
            "p50_s": _seconds(nearest_rank(durations, 50)) if durations else None,
            "p99_s": _seconds(nearest_rank(durations, 99)) if durations else None,
            "max_s": _seconds(max(durations)) if durations else None,
            "unserved_bundle_s_total": _seconds(sum(durations)),
        },
    }
