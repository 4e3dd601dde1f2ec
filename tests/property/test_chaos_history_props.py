"""Properties of the chaos history checker (devkit/chaos/history.py) against a brute-force reference.

Random brokers' lives (acquire, fence, close, expire, prewarm, split; deaths and restarts) on a small
integer clock. Because every event is at an integer instant, who serves a bundle is constant on each
``[t, t + 1)``: the reference replays each broker's events as a plain state machine and samples the set of
serving brokers at every integer ``t`` of the window. Double-serving windows are then the maximal runs of
instants with two or more brokers, gaps the maximal runs with none after the first served instant (up to
the split, for a split parent). The checker's sweep lines must match exactly, from concatenated, duplicated
and reordered snapshots, as the chaos runner will feed it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trimtab.devkit.chaos.history import (
    INTERVAL_ENDS,
    KILLED,
    History,
    coverage,
    double_serving,
    load_history,
    lost_bundles,
    summarize,
    unserved_gaps,
)

BROKERS = ("a", "b", "c")
PARENT, CHILDREN = "x", ("x/0", "x/1")
BUNDLES = (PARENT, "y", *CHILDREN)
OPS = ("acquire", "acquire", "acquire", "fence", "close", "expire", "prewarm", "split")
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class Life:
    """One broker id's events in the order they happened (times never decrease) and its deaths."""

    events: list[dict[str, Any]]
    deaths: list[int]


def ev(t: int, op: str, bundle: str, detail: str | None = None) -> dict[str, Any]:
    return {"mono_ns": t, "wall_ms": t, "op": op, "bundle": bundle, "detail": detail}


@st.composite
def lives(draw: Any, one_broker: bool = False) -> Life:
    events: list[dict[str, Any]] = []
    deaths: list[int] = []
    now = -1  # the last event's (or death's) instant
    for _ in range(draw(st.integers(0, 14))):
        if draw(st.integers(0, 7)) == 0:
            now = max(now, 0) + draw(st.integers(0, 2))
            deaths.append(now)  # the next event, if any, belongs to a new process
            continue
        # Strictly increasing per broker: one process never records two events at one nanosecond (but
        # different brokers do tie, and the split's children share its instant).
        now += draw(st.integers(1, 3))
        op = draw(st.sampled_from(OPS))
        if op == "split":
            events.append(ev(now, "split", PARENT, ",".join(CHILDREN)))
            events += [ev(now, "acquire", c, f"split from {PARENT}") for c in CHILDREN]
        else:
            events.append(ev(now, op, draw(st.sampled_from(BUNDLES))))
    return Life(events, deaths)


@st.composite
def snapshots(draw: Any, life: Life) -> list[dict[str, Any]]:
    """The timeline as the runner may pass it: polls overlapping each other, maybe newest first."""
    n = len(life.events)
    cut = draw(st.integers(0, n))
    again = draw(st.integers(0, cut))
    parts = [life.events[:cut], life.events[again:]]
    if draw(st.booleans()):
        parts.reverse()
    return [dict(e) for part in parts for e in part]


@st.composite
def histories(draw: Any, n_brokers: int = 3) -> tuple[dict[str, Life], History]:
    brokers = BROKERS[:n_brokers]
    world = {b: draw(lives()) for b in brokers}
    timelines = {b: draw(snapshots(world[b])) for b in brokers}
    ended_at: dict[str, int | list[int]] = {}
    for b, life in world.items():
        if len(life.deaths) == 1 and draw(st.booleans()):
            ended_at[b] = life.deaths[0]
        elif life.deaths:
            ended_at[b] = list(reversed(life.deaths))
    last = max([e["mono_ns"] for lf in world.values() for e in lf.events] + [0])
    until = draw(st.integers(0, last + 4))
    return world, load_history(timelines, ended_at=ended_at, observed_until_ns=until)


# ---------------------------------------------------------------------------------------------- the reference


def served_at(world: dict[str, Life], until: int) -> dict[str, list[set[str]]]:
    """bundle -> for each integer instant in [0, until), the brokers serving it then."""
    out = {b: [set[str]() for _ in range(until)] for b in BUNDLES}
    for broker, life in world.items():
        # Events at a death's instant were recorded before it; deaths only apply to later events.
        steps = sorted(
            [(e["mono_ns"], 0, i) for i, e in enumerate(life.events)] + [(d, 1, 0) for d in life.deaths]
        )
        serving: set[str] = set()
        k = 0
        for t in range(until):
            while k < len(steps) and steps[k][0] <= t:
                _, death, i = steps[k]
                k += 1
                if death:
                    serving.clear()
                    continue
                e = life.events[i]
                if e["op"] == "acquire":
                    serving.add(e["bundle"])
                elif e["op"] in INTERVAL_ENDS:
                    serving.discard(e["bundle"])
            for bundle in serving:
                out[bundle][t].add(broker)
    return out


def runs(flags: list[bool], lo: int = 0, hi: int | None = None) -> list[tuple[int, int]]:
    """Maximal ``[start, end)`` runs of True in ``flags[lo:hi]``."""
    hi = len(flags) if hi is None else hi
    out: list[tuple[int, int]] = []
    start = None
    for t in range(lo, hi):
        if flags[t] and start is None:
            start = t
        elif not flags[t] and start is not None:
            out.append((start, t))
            start = None
    if start is not None:
        out.append((start, hi))
    return out


def split_at(world: dict[str, Life], until: int) -> int | None:
    times = [e["mono_ns"] for lf in world.values() for e in lf.events if e["op"] == "split"]
    times = [t for t in times if t <= until]
    return min(times) if times else None


def reference_gaps(
    world: dict[str, Life], h: History, bundle: str, served: dict[str, list[set[str]]]
) -> tuple[int | None, int, list[tuple[int, int]]]:
    """(first served instant, where counting stops, the gaps)."""
    until = h.observed_until_ns
    points = served[bundle]
    first = next((t for t in range(until) if points[t]), None)
    split = split_at(world, until) if bundle == PARENT else None
    horizon = until if split is None else split
    if first is None:
        return None, horizon, []
    return first, horizon, runs([not p for p in points], first, max(first, horizon))


# ---------------------------------------------------------------------------------------------- properties


@SETTINGS
@given(histories())
def test_double_serving_windows_are_exact(case: tuple[dict[str, Life], History]) -> None:
    world, h = case
    served = served_at(world, h.observed_until_ns)
    expected = []
    for bundle in sorted(served):
        points = served[bundle]
        for s, e in runs([len(p) >= 2 for p in points]):
            brokers = tuple(sorted(set().union(*points[s:e])))
            peak = max(len(p) for p in points[s:e])
            expected.append((bundle, brokers, peak, s, e, e == h.observed_until_ns))
    got = [(w.bundle, w.brokers, w.max_brokers, w.start_ns, w.end_ns, w.open) for w in double_serving(h)]
    assert got == expected


@SETTINGS
@given(histories())
def test_unserved_gaps_are_exact_and_explained(case: tuple[dict[str, Life], History]) -> None:
    world, h = case
    until = h.observed_until_ns
    served = served_at(world, until)
    gaps = unserved_gaps(h)
    for bundle in BUNDLES:
        _, horizon, expected = reference_gaps(world, h, bundle, served)
        found = gaps.get(bundle, [])
        assert [(g.start_ns, g.end_ns) for g in found] == expected, bundle
        for g in found:
            # Coverage ended at the gap's start: the cause's broker served the instant before, not after.
            assert g.cause_op in {"fence", "close", "expire", KILLED}
            assert g.cause_broker in served[bundle][g.start_ns - 1]
            assert g.cause_broker not in served[bundle][g.start_ns]
            if g.end_ns < horizon:
                assert (g.ended_by, g.open) == ("acquire", False)
                assert g.resumed_by in served[bundle][g.end_ns]
            else:
                assert g.ended_by == (None if bundle not in h.split_at else "split")
                assert g.resumed_by is None


@SETTINGS
@given(histories())
def test_coverage_and_gaps_partition_first_acquire_to_horizon(case: tuple[dict[str, Life], History]) -> None:
    world, h = case
    served = served_at(world, h.observed_until_ns)
    gaps = unserved_gaps(h)
    for bundle in BUNDLES:
        first, horizon, _ = reference_gaps(world, h, bundle, served)
        cov = coverage(h, bundle)
        pieces = sorted(
            [(s, e, "served") for s, e in cov] + [(g.start_ns, g.end_ns, "gap") for g in gaps.get(bundle, [])]
        )
        if first is None or first >= horizon:
            assert pieces == []
            continue
        assert pieces[0][0] == first
        assert pieces[-1][1] == horizon
        for (_, e1, k1), (s2, _, k2) in itertools.pairwise(pieces):
            assert e1 == s2 and k1 != k2  # contiguous, and served/unserved alternate
        assert all(s < e for s, e, _ in pieces)
        for s, e, kind in pieces:  # and each piece is what the reference says, at every instant
            assert all(bool(served[bundle][t]) == (kind == "served") for t in range(s, e))


@SETTINGS
@given(histories(), st.integers(0, 6))
def test_lost_bundles_and_summary_agree_with_the_reference(
    case: tuple[dict[str, Life], History], settle: int
) -> None:
    world, h = case
    until = h.observed_until_ns
    served = served_at(world, until)
    expected_lost = []
    all_gaps: list[tuple[int, int]] = []
    for bundle in sorted(BUNDLES):
        gaps = reference_gaps(world, h, bundle, served)[2]
        all_gaps += gaps
        if gaps and bundle not in h.split_at and gaps[-1][1] == until and until - gaps[-1][0] > settle:
            expected_lost.append(bundle)
    assert [g.bundle for g in lost_bundles(h, settle_ns=settle)] == expected_lost
    assert [g.bundle for g in lost_bundles(h, settle_ns=settle, intentionally_unserved={"y"})] == [
        b for b in expected_lost if b != "y"
    ]
    s = summarize(h, settle_ns=settle)
    assert s["lost"] == len(expected_lost)
    assert s["double_serving_ns_total"] == sum(sum(1 for p in pts if len(p) >= 2) for pts in served.values())
    u = s["unavailability"]
    assert u["gaps"] == len(all_gaps)
    assert u["unserved_bundle_s_total"] == round(sum(e - s for s, e in all_gaps) / 1e9, 6)
    assert u["max_s"] == (round(max(e - s for s, e in all_gaps) / 1e9, 6) if all_gaps else None)


@SETTINGS
@given(histories(n_brokers=1))
def test_no_window_when_a_single_broker_exists(case: tuple[dict[str, Life], History]) -> None:
    _, h = case
    assert double_serving(h) == []
    assert summarize(h, settle_ns=0)["double_serving_windows"] == 0
