"""The operations kit against a real Prometheus: a local cluster (three agents, two controllers) scraped
every second by a Prometheus server the tests start (trimtab.devkit.prometheus), with the deployed alert
rules loaded.

* every ``/metrics`` passes ``promtool check metrics`` and its label values come from small fixed sets;
* a kill -9 of an agent takes ``TrimtabAgentDown`` through pending to firing, and the dev cluster's live
  view shows it;
* every PromQL expression of the Grafana dashboard is valid and returns data from the live cluster.

One cluster serves the whole module (about 25 s in all). The rules file is a test-local copy in which only
``TrimtabAgentDown`` waits 2 s instead of 2 minutes before firing: its expression is the deployed one, and
its real ``for`` is covered by the promtool unit tests (tests/prometheus/alerts_test.yml).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from tests.support.victims import agent_owning_most
from tests.support.waiting import wait_for
from trimtab.config.loader import load_settings
from trimtab.devkit.devup import active_alerts, alerts_panel
from trimtab.devkit.localcluster import FAST_TIMERS, LocalCluster, Node
from trimtab.devkit.prometheus import (
    AGENT_JOB,
    ALERT_RULES,
    CONTROLLER_JOB,
    INSTALL_HINT,
    PrometheusError,
    PrometheusOptions,
    PrometheusServer,
    find_prometheus,
    find_promtool,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy/grafana/dashboards/trimtab.json"
AGENT_DOWN = "TrimtabAgentDown"
AGENT_DOWN_FOR = "2s"
# Label names a trimtab metric may carry: each takes its values from a small fixed set (task: the
# background jobs a process runs; broker and topic: the cluster's brokers and configured topics).
BOUNDED_LABELS = {
    "result",
    "reason",
    "kind",
    "op",
    "outcome",
    "state",
    "event",
    "topic",
    "broker",
    "le",
    "task",
}


def rules_with_short_agent_down(dst: Path) -> Path:
    doc = yaml.safe_load(ALERT_RULES.read_text())
    rule = next(r for g in doc["groups"] for r in g["rules"] if r.get("alert") == AGENT_DOWN)
    rule["for"] = AGENT_DOWN_FOR
    dst.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dst


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    if find_prometheus() is None:
        pytest.fail(f"no prometheus binary: {INSTALL_HINT}")
    work = tmp_path_factory.mktemp("prometheus-live")
    options = PrometheusOptions(
        rules=(rules_with_short_agent_down(work / "alerts.yml"),),
        scrape_interval_s=1.0,
        evaluation_interval_s=1.0,
    )
    cluster = LocalCluster(
        work / "cluster", brokers=3, controllers=2, settings=FAST_TIMERS, prometheus=options
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def prom_of(cluster: LocalCluster) -> PrometheusServer:
    assert cluster.prometheus_server is not None
    return cluster.prometheus_server


def instance(node: Node) -> str:
    return f"127.0.0.1:{node.port}"


def all_targets_up(prom: PrometheusServer, want: int) -> list[dict[str, Any]] | None:
    targets = prom.targets()
    return targets if len(targets) == want and all(t["health"] == "up" for t in targets) else None


def some_lookups(cluster: LocalCluster, n: int = 24, seed: int = 0) -> None:
    for i in range(n):
        cluster.lookup(f"persistent://public/ns-{i % 4}/t-{seed}-{i}")


def parse_time(ts: str) -> float:
    """An RFC 3339 time from Prometheus (nanoseconds, ``Z``) as a Unix time."""
    ts = re.sub(r"(\.\d{6})\d+", r"\1", ts).replace("Z", "+00:00")
    return datetime.fromisoformat(ts).timestamp()


@dataclass
class Fault:
    """A kill -9 of one agent and what Prometheus said about it afterwards, watched from the moment of
    the kill until its alert fired (whichever test asked for it first)."""

    victim: Node
    killed_at: float  # Unix time
    before: list[dict[str, Any]]  # active alerts just before the kill
    seen: list[tuple[float, str]] = field(default_factory=list)  # (monotonic, state) of the victim's alert
    firing: dict[str, Any] = field(default_factory=dict)
    others: list[dict[str, Any]] = field(default_factory=list)  # agent-down alerts of other instances


@pytest.fixture(scope="module")
def agent_killed(live: LocalCluster) -> Fault:
    prom = prom_of(live)
    wait_for(lambda: all_targets_up(prom, 5), timeout=20, message=lambda: str(prom.targets()))
    # The victim owns bundles, so that its death is healed and the dashboard's healing panel has data.
    some_lookups(live, seed=0)
    victim = agent_owning_most(live)
    before = prom.alerts()
    killed_at = time.time()
    live.kill(victim.name)
    fault = Fault(victim, killed_at, before)

    def fired() -> bool:
        mine = [a for a in prom.alerts() if a["labels"].get("alertname") == AGENT_DOWN]
        for a in mine:
            if a["labels"].get("instance") == instance(victim):
                fault.seen.append((time.monotonic(), a["state"]))
                if a["state"] == "firing":
                    fault.firing = a
            else:
                fault.others.append(a)
        return bool(fault.firing)

    wait_for(fired, timeout=30, interval=0.1, message=lambda: f"{AGENT_DOWN} never fired: {fault.seen}")
    return fault


def test_prometheus_scrapes_every_node_with_the_deployed_rules(live: LocalCluster) -> None:
    prom = prom_of(live)
    targets = wait_for(lambda: all_targets_up(prom, 5), timeout=20, message=lambda: str(prom.targets()))
    by_job: dict[str, set[str]] = {}
    for t in targets:
        by_job.setdefault(t["labels"]["job"], set()).add(t["labels"]["instance"])
    assert by_job == {
        AGENT_JOB: {instance(n) for n in live.agents},
        CONTROLLER_JOB: {instance(n) for n in live.controller_nodes},
    }
    deployed = {
        r["alert"]
        for g in yaml.safe_load(ALERT_RULES.read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    loaded = {r["name"] for g in prom.rule_groups() for r in g["rules"] if r["type"] == "alerting"}
    assert loaded == deployed
    # Scraped data is there to query, and scripts find the server in the state file.
    series = wait_for(lambda: prom.query("trimtab_channel_ready == 1"), timeout=10)
    assert {s["metric"]["instance"] for s in series} == {
        instance(n) for n in live.agents + live.controller_nodes
    }
    assert live.state()["prometheus"]["url"] == prom.url
    assert httpx.get(f"{prom.url}/-/ready", timeout=5).status_code == 200


def test_every_metrics_endpoint_passes_promtool_and_has_bounded_labels(live: LocalCluster) -> None:
    promtool = find_promtool()
    assert promtool is not None, INSTALL_HINT
    some_lookups(live, seed=1)
    s = load_settings(live.config_path, environ=False)
    topics = {
        s.kafka.channel_topic,
        s.kafka.snapshot_topic,
        s.kafka.broker_load_topic,
        s.kafka.top_bundles_topic,
        s.kafka.standby_topic,
        s.kafka.events_topic,
    }
    brokers = {n.broker for n in live.agents}
    for node in live.agents + live.controller_nodes:
        text = httpx.get(f"{node.http}/metrics", timeout=10).text
        check = subprocess.run(
            [promtool, "check", "metrics"],
            input=text,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert check.returncode == 0 and not (check.stdout + check.stderr).strip(), (
            f"{node.name}: promtool check metrics:\n{check.stdout}{check.stderr}"
        )
        families = [f for f in text_string_to_metric_families(text) if f.name.startswith("trimtab_")]
        assert len(families) > 20, node.name
        for fam in families:
            for sample in fam.samples:
                assert set(sample.labels) <= BOUNDED_LABELS, (node.name, sample)
                for name, value in sample.labels.items():
                    if name == "broker":
                        assert value in brokers, (node.name, sample)
                    elif name == "topic":
                        assert value in topics, (node.name, sample)
                    elif name == "le":
                        float(value)
                    else:
                        assert re.fullmatch(r"[a-z][a-z0-9_]*", value), (node.name, sample)


def test_a_killed_agent_fires_agent_down_and_the_live_view_shows_it(
    live: LocalCluster, agent_killed: Fault
) -> None:
    fault = agent_killed
    assert not [a for a in fault.before if a["labels"].get("alertname") == AGENT_DOWN], fault.before
    states = [s for _, s in fault.seen]
    assert states[0] == "pending" and states[-1] == "firing", states
    # Pending for at least the rule's `for` (2 s) before firing, and not active before the kill.
    first_firing = next(t for t, s in fault.seen if s == "firing")
    first_pending = fault.seen[0][0]
    assert first_firing - first_pending >= 1.0, fault.seen
    active_at = parse_time(fault.firing["activeAt"])
    assert active_at >= fault.killed_at - 1.0, (active_at, fault.killed_at)
    labels = fault.firing["labels"]
    assert labels["job"] == AGENT_JOB and labels["severity"] == "warning"
    assert labels["node"] == fault.victim.name
    assert fault.firing["annotations"]["summary"] == f"Agent {instance(fault.victim)} is not scraped"
    assert fault.others == [], "only the killed agent is down"
    # The dev cluster's live view lists it.
    prom = prom_of(live)
    alerts = active_alerts(prom)
    assert alerts is not None
    console = Console(record=True, width=200)
    console.print(alerts_panel(prom, alerts))
    view = console.export_text()
    assert re.search(
        rf"FIRING\s+{AGENT_DOWN}\s+Agent {re.escape(instance(fault.victim))} is not scraped", view
    ), view


def dashboard_expressions() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]


def test_every_dashboard_expression_returns_data(live: LocalCluster, agent_killed: Fault) -> None:
    """Each panel query is valid PromQL and returns at least one finite value from the live cluster. The
    cluster did what the panels show: lookups, an admin transfer (moves), the kill -9 of an agent that
    owned bundles (healing overrides), shedding cycles on the leader's timer."""
    prom = prom_of(live)
    some_lookups(live, seed=1)
    leader = wait_for(live.leader, timeout=20)
    ownership = live.ownership(leader)
    dead = agent_killed.victim.broker
    bundle, rec = next(
        (b, r) for b, r in sorted(ownership.items()) if r["state"] == "owned" and r["dst"] != dead
    )
    target = next(n.broker for n in live.agents if n.broker not in (rec["dst"], dead))
    assert live.post(leader, "/v1/admin/transfer", {"bundle": bundle, "broker": target}).status_code == 202
    exprs = dashboard_expressions()
    assert len(exprs) >= 20
    missing = set(exprs)
    round_ = iter(range(1_000_000))

    def all_have_data() -> bool:
        # Lookups keep flowing so that rates and the latency quantile have fresh increases to show.
        with contextlib.suppress(Exception):
            some_lookups(live, n=4, seed=2 + next(round_))
        for title, expr in sorted(missing):
            try:
                result = prom.query(expr)
            except PrometheusError as e:
                pytest.fail(f"panel {title!r}: invalid expression {expr!r}: {e}")
            if any(math.isfinite(float(s["value"][1])) for s in result):
                missing.discard((title, expr))
        return not missing

    wait_for(all_have_data, timeout=45, interval=1.0, message=lambda: f"panels without data: {missing}")
