"""The alert rules and Prometheus configurations, checked by Prometheus' own tool.

``promtool`` comes with Debian's ``prometheus`` package, which ``scripts/setup.sh`` installs: a machine
without it fails here (with the install hint) rather than passing on skipped checks. The unit tests
themselves are in ``tests/prometheus/alerts_test.yml``; this module runs them and makes sure every alert
has them.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from trimtab.devkit.prometheus import (
    ALERT_RULES,
    INSTALL_HINT,
    PrometheusOptions,
    PrometheusServer,
    Target,
    find_promtool,
)

ROOT = Path(__file__).resolve().parents[2]
RULE_TESTS = ROOT / "tests/prometheus/alerts_test.yml"
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(duration: str) -> float:
    """A Prometheus duration (``90s``, ``1h30m``) in seconds."""
    parts = re.findall(r"(\d+)(ms|s|m|h|d)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(int(n) * _UNITS[u] for n, u in parts)


@pytest.fixture(scope="module")
def promtool() -> str:
    tool = find_promtool()
    if tool is None:
        pytest.fail(f"promtool not found: {INSTALL_HINT}")
    return tool


def run(promtool: str, *args: str) -> str:
    r = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, f"promtool {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout + r.stderr


def alert_rules() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(ALERT_RULES.read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


def test_the_dev_kit_loads_the_deployed_rules() -> None:
    assert ALERT_RULES == ROOT / "deploy/prometheus/alerts.yml"
    assert PrometheusOptions().rules == (ALERT_RULES,)


def test_alert_rules_pass_promtool_check(promtool: str) -> None:
    out = run(promtool, "check", "rules", str(ALERT_RULES))
    assert f"{len(alert_rules())} rules found" in out


def test_deployed_prometheus_config_passes_promtool_check(promtool: str) -> None:
    # Also checks the rule files it names, resolved relative to the config as Prometheus does.
    out = run(promtool, "check", "config", str(ROOT / "deploy/prometheus/prometheus.yml"))
    assert f"{len(alert_rules())} rules found" in out


def test_dev_cluster_prometheus_config_passes_promtool_check(promtool: str, tmp_path: Path) -> None:
    server = PrometheusServer(tmp_path, PrometheusOptions(scrape_interval_s=1, evaluation_interval_s=0.5))
    try:
        path = server.write_config()
        server.set_targets({"trimtab-agent": [Target("127.0.0.1:1", labels={"node": "agent-1"})]})
        out = run(promtool, "check", "config", str(path))
    finally:
        server.close()
    assert f"{len(alert_rules())} rules found" in out
    cfg = yaml.safe_load(path.read_text())
    assert cfg["global"]["scrape_timeout"] == "1000ms" and cfg["global"]["evaluation_interval"] == "500ms"


def test_every_alert_has_firing_and_quiet_unit_tests() -> None:
    """Each alert needs a case where it fires and one where it stays quiet after its ``for`` has run out
    (quiet before that only says the alert is not firing *yet*)."""
    rules = alert_rules()
    doc = yaml.safe_load(RULE_TESTS.read_text())
    assert doc["rule_files"] == ["../../deploy/prometheus/alerts.yml"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in doc["tests"]:
        for check in case["alert_rule_test"]:
            name = check["alertname"]
            assert name in rules, f"{case['name']}: no alert {name} in {ALERT_RULES.name}"
            if check["exp_alerts"]:
                firing.add(name)
                assert seconds(check["eval_time"]) > seconds(rules[name].get("for", "0s")), case["name"]
            elif seconds(check["eval_time"]) > seconds(rules[name].get("for", "0s")):
                quiet.add(name)
    assert set(rules) - firing == set(), "alerts without a firing case"
    assert set(rules) - quiet == set(), "alerts without a quiet case past their `for`"


def test_alert_unit_tests_pass(promtool: str) -> None:
    out = run(promtool, "test", "rules", str(RULE_TESTS))
    assert "SUCCESS" in out
