"""docs/operations.md lists every metric the code exports, with its type and labels, and says exactly which
alerts and dashboard panels use it: an operator paged by an alert finds what it reads there."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from trimtab.agent.metrics import AgentMetrics
from trimtab.cluster.auth import auth_failures
from trimtab.cluster.http_guard import Refusals
from trimtab.cluster.metrics import ChannelCollector, KeyValueCollector
from trimtab.controller.metrics import ControllerMetrics

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs/operations.md"
ALERTS = ROOT / "deploy/prometheus/alerts.yml"
DASHBOARD = ROOT / "deploy/grafana/dashboards/trimtab.json"
# Label names of the scrape-time collectors (their families carry no samples without a running node).
COLLECTOR_LABELS = {
    "trimtab_channel_records_total": ("outcome", "reason"),
    "trimtab_channel_bundles": ("state",),
    "trimtab_kv_values_skipped_total": ("topic", "reason"),
    "trimtab_kv_history_gaps_total": ("topic",),
    "trimtab_kv_follower_stalls_total": ("topic",),
}


def exported() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every trimtab metric the code can export: name (as scraped: counters end in ``_total``) -> (type,
    label names)."""
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for cls in (AgentMetrics, ControllerMetrics):
        m: Any = cls.create(CollectorRegistry())
        for f in fields(m):
            metric = getattr(m, f.name)
            if hasattr(metric, "_labelnames"):
                name = metric._name + ("_total" if metric._type == "counter" else "")
                out[name] = (metric._type, tuple(metric._labelnames))
    auth = auth_failures(CollectorRegistry())
    out[auth._name + "_total"] = ("counter", tuple(auth._labelnames))
    guard = Refusals.in_registry(CollectorRegistry())
    for metric in (guard.counter, guard.open_connections):
        assert metric is not None
        out[metric._name + ("_total" if metric._type == "counter" else "")] = (
            metric._type,
            tuple(metric._labelnames),
        )
    for collector in (ChannelCollector(lambda: None), KeyValueCollector(lambda: [])):
        for fam in collector.collect():
            name = fam.name + ("_total" if fam.type == "counter" else "")
            out[name] = (fam.type, COLLECTOR_LABELS.get(name, ()))
    return out


def documented() -> dict[str, dict[str, str]]:
    """The rows of the metrics table: metric -> its cells."""
    section = DOC.read_text().split("## Metrics", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, dict[str, str]] = {}
    header: list[str] = []
    for line in section.splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip()[1:-1].split("|")]
        if not header:
            header = cells
            continue
        assert len(cells) == len(header), line
        row = dict(zip(header, cells, strict=True))
        name = re.fullmatch(r"`([a-z_]+)`", row["metric"])
        assert name, f"one metric per row: {row['metric']}"
        assert name.group(1) not in rows, f"{name.group(1)} twice"
        rows[name.group(1)] = row
    return rows


def used_by() -> dict[str, set[str]]:
    """metric -> the alerts (names) and panels (quoted titles) whose expressions read it."""

    def metrics_in(expr: str) -> set[str]:
        names = {re.sub(r"_(bucket|sum|count)$", "", m) for m in re.findall(r"\btrimtab_[a-z_]+\b", expr)}
        return names | ({"up"} if re.search(r"\bup\{", expr) else set())

    out: dict[str, set[str]] = {}
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            for m in metrics_in(rule["expr"]):
                out.setdefault(m, set()).add(rule["alert"])
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            for m in metrics_in(target["expr"]):
                out.setdefault(m, set()).add(f'"{panel["title"]}"')
    return out


def test_every_exported_metric_is_documented_with_its_type_and_labels() -> None:
    code, rows = exported(), documented()
    assert len(code) > 50
    assert set(code) - set(rows) == set(), "metrics missing from docs/operations.md"
    assert set(rows) - set(code) - {"up"} == set(), "documented metrics the code does not export"
    for name, (kind, labels) in code.items():
        row = rows[name]
        assert row["type"] == kind, name
        assert tuple(x.strip() for x in row["labels"].split(",") if x.strip()) == labels, name
        assert len(row["meaning"]) > 10, name


def test_the_docs_name_exactly_the_alerts_and_panels_that_use_each_metric() -> None:
    rows, users = documented(), used_by()
    assert set(users) <= set(rows), f"alerts or panels read undocumented metrics: {set(users) - set(rows)}"
    for name, row in rows.items():
        cell = row["alerts and panels"]
        said = set(re.findall(r"\bTrimtab[A-Za-z]+\b", cell)) | set(re.findall(r'"[^"]+"', cell))
        assert said == users.get(name, set()), (
            f"{name}: docs say {sorted(said)}, the files {sorted(users.get(name, set()))}"
        )
