"""The chaos history checker (devkit/chaos/history.py) and run report (devkit/chaos/report.py) on
hand-computed timelines: every expected number below is worked out by hand from the events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trimtab.devkit.chaos import (
    KILLED,
    OPEN_END,
    ChaosReport,
    DoubleServing,
    Fault,
    Gap,
    coverage,
    double_serving,
    load_history,
    lost_bundles,
    markdown_table,
    nearest_rank,
    summarize,
    unserved_gaps,
)
from trimtab.devkit.chaos.history import serving_intervals

X, Y = "t/ns/0x00000000_0x80000000", "t/ns/0x80000000_0xffffffff"
X0, X1 = "t/ns/0x00000000_0x40000000", "t/ns/0x40000000_0x80000000"


def ev(mono_ns: int, op: str, bundle: str = X, detail: str | None = None) -> dict[str, Any]:
    return {"mono_ns": mono_ns, "wall_ms": mono_ns // 1_000_000, "op": op, "bundle": bundle, "detail": detail}


# ---------------------------------------------------------------------------------------------- double serving


def test_overlap_of_two_brokers_is_one_exact_window() -> None:
    tl = {"A": [ev(10, "acquire"), ev(40, "close")], "B": [ev(30, "acquire"), ev(50, "fence")]}
    h = load_history(tl, observed_until_ns=100)
    assert double_serving(h) == [DoubleServing(X, ("A", "B"), 2, 30, 40, False)]
    assert double_serving(h)[0].duration_ns == 10


def test_window_lengths_with_three_brokers_and_a_hand_over_at_one_instant() -> None:
    # A [0,100); B [20,50); C [40,70): two or more from 20 to 70, three in [40,50).
    # Y: A [0,10), B acquires at 10 the instant A fenced (a clean hand-over), C [15,25) -> one window [15,25).
    tl = {
        "A": [ev(0, "acquire"), ev(100, "close"), ev(0, "acquire", Y), ev(10, "fence", Y)],
        "B": [ev(20, "acquire"), ev(50, "close"), ev(10, "acquire", Y)],
        "C": [ev(40, "acquire"), ev(70, "expire"), ev(15, "acquire", Y), ev(25, "close", Y)],
    }
    h = load_history(tl, observed_until_ns=200)
    assert double_serving(h) == [
        DoubleServing(X, ("A", "B", "C"), 3, 20, 70, False),
        DoubleServing(Y, ("B", "C"), 2, 15, 25, False),
    ]
    s = summarize(h, settle_ns=0)
    assert s["double_serving_windows"] == 2
    assert s["double_serving_ns_total"] == 50 + 10


def test_two_disjoint_windows_of_one_bundle_and_a_window_open_at_the_end() -> None:
    tl = {
        "A": [ev(0, "acquire")],  # serves to the end of the window
        "B": [ev(10, "acquire"), ev(12, "fence"), ev(20, "acquire")],
    }
    h = load_history(tl, observed_until_ns=30)
    assert double_serving(h) == [
        DoubleServing(X, ("A", "B"), 2, 10, 12, False),
        DoubleServing(X, ("A", "B"), 2, 20, 30, True),
    ]


def test_fenced_does_not_count_as_serving() -> None:
    # A is fenced at 10 and closes at 30; B acquires at 20: no double serving, a gap [10, 20).
    tl = {"A": [ev(0, "acquire"), ev(10, "fence"), ev(30, "close")], "B": [ev(20, "acquire")]}
    h = load_history(tl, observed_until_ns=50)
    assert double_serving(h) == []
    assert unserved_gaps(h) == {X: [Gap(X, 10, 20, "fence", "A", "acquire", "B")]}
    assert [(i.broker, i.start_ns, i.end_ns, i.end_op) for i in h.intervals[X]] == [
        ("A", 0, 10, "fence"),
        ("B", 20, OPEN_END, None),
    ]


def test_a_repeated_acquire_keeps_the_interval_open() -> None:
    tl = {"A": [ev(0, "acquire"), ev(5, "acquire"), ev(9, "close")]}
    assert [(i.start_ns, i.end_ns) for i in serving_intervals(tl)[X]] == [(0, 9)]


def test_no_window_with_a_single_broker() -> None:
    tl = {"A": [ev(0, "acquire"), ev(5, "acquire"), ev(9, "close"), ev(9, "acquire"), ev(12, "expire")]}
    assert double_serving(load_history(tl, observed_until_ns=20)) == []


# ---------------------------------------------------------------------------------------------- expire


def test_expire_ends_serving() -> None:
    # A's lease lapses at 10 (recorded later, stamped with the deadline: out of order in the list).
    tl = {"A": [ev(0, "acquire"), ev(12, "prewarm", Y), ev(10, "expire")], "B": [ev(15, "acquire")]}
    h = load_history(tl, observed_until_ns=40)
    assert double_serving(h) == []
    assert [(i.broker, i.end_ns, i.end_op) for i in h.intervals[X]] == [
        ("A", 10, "expire"),
        ("B", OPEN_END, None),
    ]
    assert unserved_gaps(h) == {X: [Gap(X, 10, 15, "expire", "A", "acquire", "B")]}
    assert h.bundles == (X, Y)  # prewarmed only: seen, never served


def test_expire_of_a_fenced_bundle_is_harmless() -> None:
    tl = {"A": [ev(0, "acquire"), ev(5, "fence"), ev(8, "expire")], "B": [ev(6, "acquire")]}
    h = load_history(tl, observed_until_ns=10)
    assert [(i.broker, i.start_ns, i.end_ns, i.end_op) for i in h.intervals[X]] == [
        ("A", 0, 5, "fence"),
        ("B", 6, OPEN_END, None),
    ]
    assert double_serving(h) == []
    assert unserved_gaps(h)[X] == [Gap(X, 5, 6, "fence", "A", "acquire", "B")]


# ---------------------------------------------------------------------------------------------- split


def test_split_parent_stops_counting_and_children_start_at_their_acquire() -> None:
    children = f"{X0},{X1}"
    tl = {
        "A": [
            ev(0, "acquire"),
            ev(50, "split", X, children),
            ev(50, "acquire", X0, f"split from {X}"),
            ev(50, "acquire", X1, f"split from {X}"),
            ev(60, "close", X0, "http://b"),
        ],
        "B": [ev(75, "acquire", X0)],
    }
    h = load_history(tl, observed_until_ns=1000)
    assert h.is_split(X) and not h.is_split(X0)
    assert [(i.start_ns, i.end_ns, i.end_op) for i in h.intervals[X]] == [(0, 50, "split")]
    assert coverage(h, X) == [(0, 50)]
    assert coverage(h, X0) == [(50, 60), (75, 1000)]
    assert coverage(h, X1) == [(50, 1000)]
    assert unserved_gaps(h) == {X0: [Gap(X0, 60, 75, "close", "A", "acquire", "B")]}
    assert lost_bundles(h, settle_ns=0) == []  # the parent is unserved after 50, but split: not lost
    s = summarize(h, settle_ns=0)
    assert s["split_parents"] == 1
    assert s["bundles_served"] == 3


def test_a_gap_before_the_split_ends_at_the_split() -> None:
    # A fences the parent at 10, the split is only recorded at 20 (by A, which no longer served it).
    tl = {"A": [ev(0, "acquire"), ev(10, "fence"), ev(20, "split", X, f"{X0},{X1}")]}
    h = load_history(tl, observed_until_ns=100)
    assert unserved_gaps(h) == {X: [Gap(X, 10, 20, "fence", "A", "split", None)]}
    assert lost_bundles(h, settle_ns=0) == []


def test_a_split_after_the_window_is_not_seen() -> None:
    tl = {"A": [ev(0, "acquire"), ev(10, "close"), ev(200, "split", X, f"{X0},{X1}")]}
    h = load_history(tl, observed_until_ns=100)
    assert not h.is_split(X)
    assert unserved_gaps(h) == {X: [Gap(X, 10, 100, "close", "A")]}


# ---------------------------------------------------------------------------------------------- killed brokers


def test_killed_broker_intervals_end_at_its_death() -> None:
    tl = {"A": [ev(0, "acquire"), ev(0, "acquire", Y)], "B": [ev(45, "acquire")]}
    # Without the death time, A serves to the end of the window: a window [45, 100), open.
    assert double_serving(load_history(tl, observed_until_ns=100)) == [
        DoubleServing(X, ("A", "B"), 2, 45, 100, True)
    ]
    h = load_history(tl, ended_at={"A": 30}, observed_until_ns=100)
    assert double_serving(h) == []
    assert [(i.broker, i.end_ns, i.end_op) for i in h.intervals[X]] == [
        ("A", 30, KILLED),
        ("B", OPEN_END, None),
    ]
    assert unserved_gaps(h) == {
        X: [Gap(X, 30, 45, KILLED, "A", "acquire", "B")],
        Y: [Gap(Y, 30, 100, KILLED, "A")],
    }
    assert h.brokers == ("A", "B")


def test_restart_snapshots_are_deduplicated_sorted_and_split_by_the_deaths() -> None:
    first_life = [ev(0, "acquire"), ev(5, "acquire", Y)]
    second_life = [ev(30, "acquire", Y), ev(40, "close", Y)]
    third_life = [ev(70, "acquire")]
    # Two polls of the first process (the second a superset), then the later lives, oldest last.
    tl = {"A": third_life + first_life[:1] + second_life + first_life + first_life}
    h = load_history(tl, ended_at={"A": [60, 20]}, observed_until_ns=100)
    assert [(i.bundle, i.start_ns, i.end_ns, i.end_op) for b in (X, Y) for i in h.intervals[b]] == [
        (X, 0, 20, KILLED),
        (X, 70, OPEN_END, None),
        (Y, 5, 20, KILLED),
        (Y, 30, 40, "close"),
    ]
    assert unserved_gaps(h) == {
        X: [Gap(X, 20, 70, KILLED, "A", "acquire", "A")],
        Y: [Gap(Y, 20, 30, KILLED, "A", "acquire", "A"), Gap(Y, 40, 100, "close", "A")],
    }


def test_events_at_the_death_instant_happened_before_it() -> None:
    tl = {"A": [ev(0, "acquire"), ev(20, "acquire", Y)], "B": [ev(21, "acquire", Y)]}
    h = load_history(tl, ended_at={"A": 20}, observed_until_ns=30)
    assert [(i.start_ns, i.end_ns, i.end_op) for i in h.intervals[Y]] == [
        (20, 20, KILLED),
        (21, OPEN_END, None),
    ]
    assert unserved_gaps(h) == {X: [Gap(X, 20, 30, KILLED, "A")]}  # Y's empty interval covers nothing
    assert coverage(h, Y) == [(21, 30)]


# ---------------------------------------------------------------------------------------------- gaps and losses


def test_open_gap_at_the_window_end() -> None:
    tl = {"A": [ev(0, "acquire"), ev(40, "close")]}
    h = load_history(tl, observed_until_ns=100)
    (gap,) = unserved_gaps(h)[X]
    assert gap == Gap(X, 40, 100, "close", "A", None, None)
    assert gap.open and gap.duration_ns == 60
    assert coverage(h, X) == [(0, 40)]


def test_default_window_end_is_the_last_event_or_death() -> None:
    tl = {"A": [ev(0, "acquire"), ev(40, "close")], "B": [ev(10, "prewarm", Y)]}
    assert load_history(tl).observed_until_ns == 40
    assert load_history(tl, ended_at={"B": 55}).observed_until_ns == 55


def test_only_the_time_after_the_first_acquire_counts() -> None:
    tl = {"A": [ev(0, "prewarm"), ev(30, "acquire")]}
    h = load_history(tl, observed_until_ns=50)
    assert unserved_gaps(h) == {}
    assert coverage(h, X) == [(30, 50)]


def test_lost_bundle_needs_more_than_settle_ns_and_excludes_intentional_unloads() -> None:
    tl = {
        "A": [ev(0, "acquire"), ev(40, "close"), ev(0, "acquire", Y), ev(90, "fence", Y)],
        "B": [ev(10, "acquire", X0), ev(20, "close", X0), ev(30, "acquire", X0)],
    }
    h = load_history(tl, observed_until_ns=100)
    assert lost_bundles(h, settle_ns=59) == [Gap(X, 40, 100, "close", "A")]
    assert lost_bundles(h, settle_ns=9) == [Gap(X, 40, 100, "close", "A"), Gap(Y, 90, 100, "fence", "A")]
    assert lost_bundles(h, settle_ns=60) == []  # exactly settle_ns: not yet lost
    assert lost_bundles(h, settle_ns=0, intentionally_unserved={X}) == [Gap(Y, 90, 100, "fence", "A")]


def test_gap_cause_ties_go_to_the_first_broker_by_name() -> None:
    # Both brokers stop at 30 (a double-serving window [10, 30) before).
    tl = {"B": [ev(0, "acquire"), ev(30, "expire")], "A": [ev(10, "acquire"), ev(30, "close")]}
    h = load_history(tl, observed_until_ns=50)
    assert unserved_gaps(h)[X] == [Gap(X, 30, 50, "close", "A")]


# ---------------------------------------------------------------------------------------------- summary


def test_nearest_rank() -> None:
    hundred = list(range(100, 0, -1))
    assert nearest_rank(hundred, 50) == 50
    assert nearest_rank(hundred, 99) == 99
    assert nearest_rank(hundred, 100) == 100
    assert nearest_rank([1, 2], 50) == 1
    assert nearest_rank([7], 1) == 7
    assert nearest_rank([3, 1, 2], 67) == 3  # ceil(2.01) = 3
    with pytest.raises(ValueError):
        nearest_rank([], 50)
    with pytest.raises(ValueError):
        nearest_rank([1], 0)


def test_summarize_is_json_ready_and_hand_computed() -> None:
    s_ = 1_000_000_000
    tl = {
        "A": [ev(0, "acquire"), ev(10 * s_, "close"), ev(0, "acquire", Y), ev(5 * s_, "fence", Y)],
        "B": [ev(12 * s_, "acquire"), ev(8 * s_, "acquire", Y), ev(9 * s_, "close", Y), ev(0, "acquire", X0)],
        "C": [ev(1 * s_, "acquire", X0), ev(3 * s_, "close", X0)],  # while B serves X0 from 0 to the end
    }
    h = load_history(tl, ended_at={"C": 4 * s_}, observed_until_ns=20 * s_)
    s = summarize(h, settle_ns=5 * s_)
    # X: gap [10, 12) s; Y: gaps [5, 8) and [9, 20) open (11 s, lost); X0: B and C both serve [1, 3).
    assert s == json.loads(json.dumps(s))
    assert s["brokers"] == ["A", "B", "C"]
    assert (s["bundles_seen"], s["bundles_served"], s["split_parents"], s["intervals"]) == (3, 3, 0, 6)
    assert s["double_serving_windows"] == 1
    assert s["double_serving"] == [
        {
            "bundle": X0,
            "brokers": ["B", "C"],
            "max_brokers": 2,
            "start_ns": 1 * s_,
            "end_ns": 3 * s_,
            "duration_ns": 2 * s_,
            "open": False,
        }
    ]
    assert s["double_serving_ns_total"] == 2 * s_
    assert s["lost"] == 1
    assert [g["bundle"] for g in s["lost_bundles"]] == [Y]
    assert s["lost_bundles"][0]["cause_op"] == "close" and s["lost_bundles"][0]["open"]
    assert s["unavailability"] == {
        "gaps": 3,
        "open_gaps": 1,
        "p50_s": 3.0,  # durations 2, 3, 11: rank ceil(1.5) = 2
        "p99_s": 11.0,
        "max_s": 11.0,
        "unserved_bundle_s_total": 16.0,
    }
    quiet = summarize(h, settle_ns=5 * s_, intentionally_unserved={Y})
    assert quiet["lost"] == 0
    assert quiet["unavailability"]["gaps"] == 2  # Y's final open gap is no outage; its first one is
    assert quiet["unavailability"]["unserved_bundle_s_total"] == 5.0


def test_summarize_empty_history() -> None:
    s = summarize(load_history({}), settle_ns=0)
    assert s["unavailability"] == {
        "gaps": 0,
        "open_gaps": 0,
        "p50_s": None,
        "p99_s": None,
        "max_s": None,
        "unserved_bundle_s_total": 0.0,
    }
    assert s["double_serving_windows"] == 0 and s["lost"] == 0


def test_summary_lists_the_first_twenty_windows_and_counts_all() -> None:
    a = [ev(0, "acquire", f"b{i:02d}") for i in range(25)]
    b = [ev(5, "acquire", f"b{i:02d}") for i in range(25)] + [ev(7, "close", f"b{i:02d}") for i in range(25)]
    s = summarize(load_history({"A": a, "B": b}, observed_until_ns=10), settle_ns=0)
    assert s["double_serving_windows"] == 25
    assert len(s["double_serving"]) == 20
    assert s["double_serving_ns_total"] == 25 * 2


# ---------------------------------------------------------------------------------------------- legacy helpers


def test_tests_support_timeline_still_works_and_knows_expire() -> None:
    from tests.support import timeline

    tl = {"A": [ev(0, "acquire"), ev(10, "expire")], "B": [ev(10, "acquire")]}
    intervals = timeline.check_single_owner(tl)
    assert [(i.broker, i.end_op) for i in intervals[X]] == [("A", "expire"), ("B", None)]
    assert timeline.first(tl, "A", "expire", X) == {**ev(10, "expire"), "broker": "A"}
    assert timeline.overlaps({"A": [ev(0, "acquire")], "B": [ev(5, "acquire")]}, {"A": 4}) == []


# ---------------------------------------------------------------------------------------------- report


def _report(summary_timelines: dict[str, list[dict[str, Any]]], **kw: Any) -> ChaosReport:
    h = load_history(summary_timelines, observed_until_ns=100)
    faults = [
        Fault(1.5, "kill", "agent-1"),
        Fault(3.0, "partition", "zk", "30 s"),
        Fault(9.0, "kill", "agent-2"),
    ]
    return ChaosReport(name="kill|partition", summary=summarize(h, settle_ns=10), faults=faults, seed=7, **kw)


def test_report_passes_only_without_double_serving_and_losses() -> None:
    clean = _report({"A": [ev(0, "acquire"), ev(40, "fence")], "B": [ev(45, "acquire")]}, duration_s=12.5)
    assert clean.passed
    assert clean.fault_counts == {"kill": 2, "partition": 1}
    doubled = _report({"A": [ev(0, "acquire")], "B": [ev(45, "acquire")]})
    assert not doubled.passed
    lost = _report({"A": [ev(0, "acquire"), ev(40, "fence")]})
    assert not lost.passed and lost.summary["lost"] == 1


def test_report_json_round_trip() -> None:
    r = _report({"A": [ev(0, "acquire"), ev(40, "fence")], "B": [ev(45, "acquire")]}, params={"brokers": 2})
    data = json.loads(r.to_json())
    assert data["passed"] is True
    assert data["faults_injected"] == 3
    assert data["fault_counts"] == {"kill": 2, "partition": 1}
    assert data["faults"][1] == {"at_s": 3.0, "kind": "partition", "target": "zk", "detail": "30 s"}
    back = ChaosReport.from_dict(data)
    assert back == r
    assert back.to_json() == r.to_json()


def test_report_markdown() -> None:
    ok = _report({"A": [ev(0, "acquire"), ev(40, "fence")], "B": [ev(45, "acquire")]}, duration_s=12.5)
    md = ok.to_markdown()
    assert md.startswith("#### kill\\|partition\n")
    assert "| result | PASS |" in md
    assert "| faults injected | 3 (kill: 2, partition: 1) |" in md
    assert "| unserved gaps (open at end) | 1 (0) |" in md
    assert "| unavailability p50 / p99 / max | 0.000 s / 0.000 s / 0.000 s |" in md  # 5 ns
    assert "| kill | 2 |" in md
    bad = _report({"A": [ev(0, "acquire")], "B": [ev(45, "acquire")]})
    table = markdown_table([ok, bad]).splitlines()
    assert len(table) == 4
    assert all(line.replace("\\|", "").count("|") == 13 for line in table)  # 12 columns everywhere
    assert table[2].startswith("| kill\\|partition | 1 | 3 | 0 |") and table[2].endswith("| PASS |")
    assert table[3].endswith("| **FAIL** |")
