"""Keep deploy/ and the generated docs honest: alerts and dashboards only use metrics the code exports, the
shipped config loads, and generated references match the code."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from trimtab.agent.adapters.simulated import SimulatedBroker
from trimtab.agent.adapters.webhook_server import create_app
from trimtab.agent.metrics import AgentMetrics
from trimtab.cluster.auth import auth_failures
from trimtab.cluster.http_guard import Refusals
from trimtab.cluster.metrics import ChannelCollector, KeyValueCollector
from trimtab.config.docs import render_markdown
from trimtab.config.loader import load_settings
from trimtab.config.settings import SimulationSettings
from trimtab.controller.metrics import ControllerMetrics

ROOT = Path(__file__).resolve().parents[2]
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported_metric_names() -> set[str]:
    names: set[str] = set()
    for factory in (AgentMetrics.create, ControllerMetrics.create, auth_failures, Refusals.in_registry):
        reg = CollectorRegistry()
        factory(reg)
        for fam in reg.collect():
            names.update(fam.name + s for s in _SUFFIXES.get(fam.type, ("",)))
    for collector in (ChannelCollector(lambda: None), KeyValueCollector(lambda: [])):
        for fam in collector.collect():
            names.update(fam.name + s for s in _SUFFIXES.get(fam.type, ("",)))
    return names


def referenced(text: str) -> set[str]:
    return set(re.findall(r"\btrimtab_[a-z_]+\b", text))


def test_alert_rules_use_only_exported_metrics() -> None:
    doc = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    exprs = [r["expr"] for g in doc["groups"] for r in g["rules"]]
    assert exprs, "no alert rules found"
    used = set().union(*(referenced(e) for e in exprs))
    missing = used - exported_metric_names()
    assert not missing, f"alerts reference metrics the code does not export: {sorted(missing)}"
    for g in doc["groups"]:
        for r in g["rules"]:
            assert r["labels"]["severity"] in {"critical", "warning"}, r["alert"]
            assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]


def test_dashboard_uses_only_exported_metrics() -> None:
    dash = json.loads((ROOT / "deploy/grafana/dashboards/trimtab.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = set().union(*(referenced(e) for e in exprs))
    assert used, "dashboard references no trimtab metrics"
    missing = used - exported_metric_names()
    assert not missing, f"dashboard references metrics the code does not export: {sorted(missing)}"


def test_prometheus_config_loads_the_rules() -> None:
    cfg = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    # Relative to the config file, which docker-compose mounts with the rules beside it.
    assert cfg["rule_files"] == ["alerts.yml"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert "./deploy/prometheus:/etc/prometheus:ro" in compose["services"]["prometheus"]["volumes"]
    # Grafana provisions the dashboard from where compose mounts deploy/grafana/dashboards.
    provider = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/trimtab.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert f"./deploy/grafana/dashboards:{path}:ro" in compose["services"]["grafana"]["volumes"]
    jobs = {j["job_name"] for j in cfg["scrape_configs"]}
    assert {"trimtab-agent", "trimtab-controller"} <= jobs


def test_shipped_config_is_valid_with_compose_environment(monkeypatch) -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    agent_env = compose["services"]["agent-1"]["environment"]
    for k, v in agent_env.items():
        if k.startswith("TRIMTAB_") and k != "TRIMTAB_CONFIG":
            monkeypatch.setenv(k, str(v))
    s = load_settings(ROOT / "deploy/config/trimtab.toml")
    assert s.zookeeper.hosts == "zookeeper:2181"
    assert s.broker.tags == {"zone": "a"}
    assert s.http.advertised_host == "agent-1"
    # The demo's lookups create public/* namespaces; the shipped config (production) allows none.
    assert s.namespace.auto_create == ["public/*"]
    assert load_settings(ROOT / "deploy/config/trimtab.toml", environ=False).namespace.auto_create == []


def test_compose_makes_the_topics_with_the_specs_the_daemons_check() -> None:
    """One source of truth (cluster/topics.py): kafka-init runs ``trimtab topics ensure`` from the trimtab
    image with the nodes' configuration file, before any node starts."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    init = compose["services"]["kafka-init"]
    assert init["image"] == compose["services"]["controller-1"]["image"]
    assert init["command"] == ["topics", "ensure"]
    assert init["environment"]["TRIMTAB_CONFIG"] == "/etc/trimtab/trimtab.toml"
    assert "./deploy/config/trimtab.toml:/etc/trimtab/trimtab.toml:ro" in init["volumes"]
    for name, svc in compose["services"].items():
        if svc.get("image") == init["image"] and name not in ("kafka-init", "trimtab-secrets"):
            assert svc["depends_on"]["kafka-init"]["condition"] == "service_completed_successfully", name


def test_configuration_reference_is_generated_from_the_code() -> None:
    doc = ROOT / "docs/configuration.md"
    assert doc.read_text() == render_markdown(), "docs/configuration.md is stale: run `trimtab docs`"


def test_openapi_specs_match_the_code() -> None:
    from trimtab.agent.api import create_app as agent_app
    from trimtab.controller.api import create_app as controller_app

    apps = {
        "webhook-openapi.json": create_app(SimulatedBroker("doc", SimulationSettings())),
        "agent-openapi.json": agent_app(None),  # type: ignore[arg-type]
        "controller-openapi.json": controller_app(None),  # type: ignore[arg-type]
    }
    for name, app in apps.items():
        doc = ROOT / "docs" / name
        assert json.loads(doc.read_text()) == json.loads(json.dumps(app.openapi())), (
            f"docs/{name} is stale: run `trimtab docs`"
        )
