"""Unavailability per fault kind (issue 31, point 4): each gap in service is charged to the fault in
progress when it began."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trimtab.devkit.chaos.history import Gap, load_history, summarize
from trimtab.devkit.chaos.report import WARM_UP, ChaosReport, Fault, unavailability_by_fault

T0 = 1_000_000_000_000  # monotonic ns when the run started
S = 1_000_000_000


def gap(start_s: float, seconds: float) -> Gap:
    start = T0 + int(start_s * S)
    return Gap("t/ns/0x00000000_0x40000000", start, start + int(seconds * S), "close", "A", "acquire", "B")


FAULTS = [Fault(10.0, "kill_agent", "a1"), Fault(30.0, "netem_delay", "a2"), Fault(50.0, "kill_agent", "a3")]


def test_each_gap_goes_to_the_fault_in_progress_when_it_began() -> None:
    gaps = [gap(5, 1), gap(10, 2), gap(12, 4), gap(30, 0.5), gap(55, 3)]
    by = unavailability_by_fault(gaps, FAULTS, T0)
    assert by[WARM_UP] == {
        "faults": 0, "gaps": 1, "p50_s": 1.0, "p99_s": 1.0, "max_s": 1.0, "unserved_bundle_s": 1.0,
    }  # fmt: skip
    assert by["kill_agent"] == {
        "faults": 2, "gaps": 3, "p50_s": 3.0, "p99_s": 4.0, "max_s": 4.0, "unserved_bundle_s": 9.0,
    }  # fmt: skip  # a gap starting at the fault's very start is the fault's
    assert by["netem_delay"]["gaps"] == 1 and by["netem_delay"]["max_s"] == 0.5


def test_a_kind_without_gaps_is_listed_with_no_percentiles() -> None:
    by = unavailability_by_fault([], FAULTS, T0)
    assert by["netem_delay"] == {
        "faults": 1, "gaps": 0, "p50_s": None, "p99_s": None, "max_s": None, "unserved_bundle_s": 0.0,
    }  # fmt: skip
    assert WARM_UP not in by


@given(
    starts=st.lists(st.floats(0, 100), max_size=30),
    fault_at=st.lists(st.tuples(st.floats(0, 100), st.sampled_from(["a", "b", "c"])), max_size=10),
)
def test_every_gap_is_charged_once_to_a_fault_that_had_begun(
    starts: list[float], fault_at: list[tuple[float, str]]
) -> None:
    faults = [Fault(at, kind, "x") for at, kind in fault_at]
    gaps = [gap(s, 1) for s in starts]
    by = unavailability_by_fault(gaps, faults, T0)
    assert sum(u["gaps"] for u in by.values()) == len(gaps)
    first = min((f.at_s for f in faults), default=None)
    early = sum(1 for g in gaps if first is None or g.start_ns < T0 + int(first * S))
    assert by.get(WARM_UP, {"gaps": 0})["gaps"] == early


def test_the_report_keeps_it_and_shows_it() -> None:
    summary = summarize(load_history({}, observed_until_ns=100), settle_ns=10)
    report = ChaosReport("chaos", summary, faults=FAULTS)
    report.by_fault = unavailability_by_fault([gap(12, 4)], FAULTS, T0)
    back = ChaosReport.from_dict(report.to_dict())
    assert back.by_fault == report.by_fault
    md = report.to_markdown()
    assert "| kill_agent | 2 | 1 |" in md and "| netem_delay | 1 | 0 |" in md
