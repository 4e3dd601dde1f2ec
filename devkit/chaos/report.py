"""The report of one chaos run: what was done to the cluster, what the history checker found, the verdict.

One structure serves three readers: the runner's exit status (:attr:`ChaosReport.passed`), the JSON result
file kept with the run (:meth:`ChaosReport.to_json`, read back by :meth:`ChaosReport.from_dict`), and
docs/reliability.md (:meth:`ChaosReport.to_markdown` for one run, :func:`markdown_table` for a row per
run). The verdict is deliberately narrow: a run passes iff no bundle was ever served by two brokers at
once and no bundle was lost; unavailability is measured and reported, never a failure by itself, because
its acceptable size depends on the faults injected.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

import orjson

from trimtab.devkit.chaos.history import Gap, Summary, nearest_rank

#: The kind charged with gaps that began before the first fault.
WARM_UP = "(before the first fault)"


class FaultUnavailability(TypedDict):
    faults: int
    gaps: int
    p50_s: float | None
    p99_s: float | None
    max_s: float | None
    unserved_bundle_s: float


class FaultDict(TypedDict):
    at_s: float
    kind: str
    target: str
    detail: str | None


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault: ``at_s`` seconds after the run started, of ``kind`` (``"kill"``,
    ``"partition"``, ``"zk-expire"``, ...) against ``target`` (a broker, a controller, a process)."""

    at_s: float
    kind: str
    target: str
    detail: str | None = None

    def to_dict(self) -> FaultDict:
        return {"at_s": self.at_s, "kind": self.kind, "target": self.target, "detail": self.detail}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fault:
        return cls(float(data["at_s"]), str(data["kind"]), str(data["target"]), data.get("detail"))


@dataclass(slots=True)
class ChaosReport:
    """A whole chaos run.

    ``runs``: how many rounds (fresh histories) the run is made of, the ``summary`` covering them all;
    ``faults``: every fault injected, in order; ``summary``: :func:`trimtab.devkit.chaos.history.summarize`
    of the merged history; ``params``: free-form settings worth keeping with the result (JSON values).
    """

    name: str
    summary: Summary
    faults: list[Fault] = field(default_factory=list)
    runs: int = 1
    seed: int | None = None
    duration_s: float | None = None
    params: dict[str, Any] = field(default_factory=dict)
    by_fault: dict[str, FaultUnavailability] = field(default_factory=dict)
    #: What went wrong with the run itself, not with the cluster's history: a fault that could not be
    #: injected or a cluster that did not settle at the end. The report is still written (two hours of
    #: evidence are not thrown away for it), but it does not pass.
    problems: list[str] = field(default_factory=list)

    @property
    def fault_counts(self) -> dict[str, int]:
        """Injected faults by kind, kinds in name order."""
        return dict(sorted(Counter(f.kind for f in self.faults).items()))

    @property
    def passed(self) -> bool:
        """No double-serving window, no lost bundle, and the run itself went through (:attr:`problems`)."""
        return self.summary["double_serving_windows"] == 0 and self.summary["lost"] == 0 and not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passed": self.passed,
            "runs": self.runs,
            "seed": self.seed,
            "duration_s": self.duration_s,
            "problems": self.problems,
            "faults_injected": len(self.faults),
            "fault_counts": self.fault_counts,
            "faults": [f.to_dict() for f in self.faults],
            "summary": self.summary,
            "unavailability_by_fault": self.by_fault,
            "params": self.params,
        }

    def to_json(self) -> str:
        """The report as indented JSON (the verdict first); ``from_dict(json.loads(...))`` reads it back."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2).decode()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChaosReport:
        """Read back :meth:`to_dict`/:meth:`to_json` output; derived fields (``passed``, counts) are
        recomputed, not trusted."""
        return cls(
            name=str(data["name"]),
            summary=cast(Summary, dict(data["summary"])),
            faults=[Fault.from_dict(f) for f in data.get("faults", [])],
            runs=int(data.get("runs", 1)),
            seed=data.get("seed"),
            duration_s=data.get("duration_s"),
            params=dict(data.get("params", {})),
            by_fault=cast(dict[str, FaultUnavailability], dict(data.get("unavailability_by_fault", {}))),
            problems=[str(p) for p in data.get("problems") or []],
        )

    def to_markdown(self) -> str:
        """One run as a two-column markdown table (metric, value), then its faults by kind."""
        s = self.summary
        u = s["unavailability"]
        faults = ", ".join(f"{k}: {n}" for k, n in self.fault_counts.items()) or "none"
        rows = [
            ("result", _verdict(self.passed)),
            ("problems", "; ".join(self.problems) or "none"),
            ("runs", str(self.runs)),
            ("seed", "—" if self.seed is None else str(self.seed)),
            ("duration", _secs(self.duration_s)),
            ("faults injected", f"{len(self.faults)} ({faults})"),
            ("brokers", str(len(s["brokers"]))),
            ("bundles seen / served", f"{s['bundles_seen']} / {s['bundles_served']}"),
            ("split parents", str(s["split_parents"])),
            ("serving intervals", str(s["intervals"])),
            ("double-serving windows", str(s["double_serving_windows"])),
            ("double-serving time", _secs(s["double_serving_ns_total"] / 1e9)),
            ("lost bundles", str(s["lost"])),
            ("unserved gaps (open at end)", f"{u['gaps']} ({u['open_gaps']})"),
            (
                "unavailability p50 / p99 / max",
                f"{_secs(u['p50_s'])} / {_secs(u['p99_s'])} / {_secs(u['max_s'])}",
            ),
            ("unserved bundle-seconds", f"{u['unserved_bundle_s_total']:.3f}"),
        ]
        lines = [f"#### {_cell(self.name)}", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {_cell(v)} |" for k, v in rows]
        if self.by_fault:
            lines += [
                "",
                "| fault | count | gaps | p50 | p99 | max | unserved bundle-s |",
                "|---|---:|---:|---:|---:|---:|---:|",
            ]
            for k, fu in self.by_fault.items():
                lines.append(
                    f"| {_cell(k)} | {fu['faults']} | {fu['gaps']} | {_secs(fu['p50_s'])} | {_secs(fu['p99_s'])} "
                    f"| {_secs(fu['max_s'])} | {fu['unserved_bundle_s']:.1f} |"
                )
        elif self.fault_counts:
            lines += ["", "| fault | count |", "|---|---:|"]
            lines += [f"| {_cell(k)} | {n} |" for k, n in self.fault_counts.items()]
        return "\n".join(lines) + "\n"


def unavailability_by_fault(
    gaps: Iterable[Gap], faults: Sequence[Fault], t0_ns: int
) -> dict[str, FaultUnavailability]:
    """Unavailability per fault kind: each gap is charged to the fault in progress when it began -- the
    last one that started at or before the gap's start (``t0_ns`` + its ``at_s``, on the monotonic clock
    the timelines use); gaps before the first fault to :data:`WARM_UP`. A fault whose effects outlast the
    next fault's start has its late gaps charged to the next one: the figures are per window, which is what
    an operator sees. Kinds in name order; every injected kind is listed, with or without gaps."""
    order = sorted(faults, key=lambda f: f.at_s)
    starts = [t0_ns + int(f.at_s * 1e9) for f in order]
    durations: dict[str, list[int]] = defaultdict(list)
    for g in gaps:
        i = bisect.bisect_right(starts, g.start_ns) - 1
        durations[order[i].kind if i >= 0 else WARM_UP].append(g.duration_ns)
    counts = Counter(f.kind for f in faults)
    out: dict[str, FaultUnavailability] = {}
    for kind in sorted(set(counts) | set(durations)):
        d = durations.get(kind, [])
        out[kind] = {
            "faults": counts.get(kind, 0),
            "gaps": len(d),
            "p50_s": nearest_rank(d, 50) / 1e9 if d else None,
            "p99_s": nearest_rank(d, 99) / 1e9 if d else None,
            "max_s": max(d) / 1e9 if d else None,
            "unserved_bundle_s": round(sum(d) / 1e9, 3),
        }
    return out


_TABLE_HEADER = (
    "| scenario | runs | faults | double-serving windows | double-serving s | lost | gaps (open) "
    "| p50 s | p99 s | max s | unserved bundle-s | result |"
)
_TABLE_RULE = "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"


def markdown_table(reports: Sequence[ChaosReport]) -> str:
    """Many runs side by side, one row each: the table at the top of docs/reliability.md."""
    lines = [_TABLE_HEADER, _TABLE_RULE]
    for r in reports:
        s, u = r.summary, r.summary["unavailability"]
        cells = [
            _cell(r.name),
            str(r.runs),
            str(len(r.faults)),
            str(s["double_serving_windows"]),
            _num(s["double_serving_ns_total"] / 1e9),
            str(s["lost"]),
            f"{u['gaps']} ({u['open_gaps']})",
            _num(u["p50_s"]),
            _num(u["p99_s"]),
            _num(u["max_s"]),
            _num(u["unserved_bundle_s_total"]),
            _verdict(r.passed),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _verdict(passed: bool) -> str:
    return "PASS" if passed else "**FAIL**"


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _secs(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f} s"


def _cell(text: str) -> str:
    """Table-safe text: a pipe would split the cell, a newline the row."""
    return text.replace("|", "\\|").replace("\n", " ")
