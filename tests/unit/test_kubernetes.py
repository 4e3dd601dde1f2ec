"""deploy/kubernetes, validated offline: the base and the example overlay are rendered by the real
kustomize (trimtab.devkit.kustomize runs the pinned release scripts/setup.sh installs), every built-in
object is checked against the Kubernetes JSON schemas (kubernetes-validate, strict: no unknown fields),
the Prometheus operator's objects against the fields the operator defines, and the properties an
operator relies on are asserted one by one."""

from __future__ import annotations

import copy
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from trimtab.config.loader import load_settings
from trimtab.devkit import kustomize
from trimtab.devkit.kustomize import (
    KUBERNETES_DIR,
    KUSTOMIZE_VERSION,
    PROMETHEUS_RULE,
    KustomizeError,
    build,
    key,
    prometheus_rule,
)
from trimtab.devkit.prometheus import AGENT_JOB, ALERT_RULES, CONTROLLER_JOB

# The oldest Kubernetes the manifests are meant for (PodDisruptionBudget policy/v1 needs 1.21; the schemas
# of kubernetes-validate are per minor version).
KUBERNETES_VERSION = "1.28"
RENDERINGS = ["base", "overlays/example"]
README = KUBERNETES_DIR / "README.md"
REPO_ROOT = KUBERNETES_DIR.parents[1]
Obj = dict[str, Any]

# --------------------------------------------------------------------------- Prometheus operator objects
# kubernetes-validate knows only built-in kinds. These are the parts of the operator's CRD schemas
# (monitoring.coreos.com/v1) that the manifests use, closed to unknown fields so a typo fails.
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array"},
    },
}
_SECRET_KEY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "key"],
    "properties": {"name": {"type": "string"}, "key": {"type": "string"}, "optional": {"type": "boolean"}},
}
_RELABEL = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "action": {"enum": ["replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep"]},
        "sourceLabels": {"type": "array", "items": {"type": "string"}},
        "separator": {"type": "string"},
        "targetLabel": {"type": "string"},
        "regex": {"type": "string"},
        "replacement": {"type": "string"},
        "modulus": {"type": "integer"},
    },
}
_ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["port"],
    "properties": {
        "port": {"type": "string"},
        "path": {"type": "string", "pattern": "^/"},
        "scheme": {"enum": ["http", "https"]},
        "interval": _DURATION,
        "scrapeTimeout": _DURATION,
        "honorLabels": {"type": "boolean"},
        "relabelings": {"type": "array", "items": _RELABEL},
        "metricRelabelings": {"type": "array", "items": _RELABEL},
        "tlsConfig": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "ca": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"secret": _SECRET_KEY, "configMap": _SECRET_KEY},
                },
                "serverName": {"type": "string"},
                "insecureSkipVerify": {"type": "boolean"},
            },
        },
    },
}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}},
}


def _crd(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"type": "string"},
            "metadata": _METADATA,
            "spec": spec,
        },
    }


def _monitor(endpoints: str) -> dict[str, Any]:
    """A ServiceMonitor or a PodMonitor: the two differ only in what their endpoints are called."""
    return _crd(
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", endpoints],
            "properties": {
                "selector": _SELECTOR,
                endpoints: {"type": "array", "minItems": 1, "items": _ENDPOINT},
                "jobLabel": {"type": "string"},
                "namespaceSelector": {"type": "object"},
            },
        }
    )


OPERATOR_SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": _monitor("endpoints"),
    "PodMonitor": _monitor("podMetricsEndpoints"),
    "PrometheusRule": _crd(
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["groups"],
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name", "rules"],
                        "properties": {
                            "name": {"type": "string"},
                            "interval": _DURATION,
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["expr"],
                                    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                    "properties": {
                                        "alert": {"type": "string"},
                                        "record": {"type": "string"},
                                        "expr": {"type": "string"},
                                        "for": _DURATION,
                                        "labels": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                        "annotations": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                    },
                                },
                            },
                        },
                    },
                }
            },
        }
    ),
}


def validate(obj: Obj) -> None:
    """Raise if ``obj`` is not a valid object of its kind (jsonschema or kubernetes-validate errors)."""
    if obj["apiVersion"].startswith("monitoring.coreos.com/"):
        jsonschema.validate(obj, OPERATOR_SCHEMAS[obj["kind"]])
    else:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


# --------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module", params=RENDERINGS)
def rendered(request: pytest.FixtureRequest) -> list[Obj]:
    return build(KUBERNETES_DIR / request.param)


def one(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, [o["metadata"]["name"] for o in found])
    return found[0]


def pod_spec(workload: Obj) -> Obj:
    spec: Obj = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Obj, name: str) -> Obj:
    return next(c for c in pod_spec(workload)["containers"] if c["name"] == name)


def env_of(c: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def workloads(objs: list[Obj]) -> Iterator[Obj]:
    return (o for o in objs if o["kind"] in ("Deployment", "StatefulSet"))


def trimtab_settings(objs: list[Obj], c: Obj, tmp_path: Path) -> Any:
    """The settings a trimtab container of this rendering runs with: the ConfigMap's file, its env."""
    toml = one(objs, "ConfigMap", "trimtab-config")["data"]["trimtab.toml"]
    path = tmp_path / "trimtab.toml"
    path.write_text(toml)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env_of(c).items():
            if k.startswith("TRIMTAB_") and k != "TRIMTAB_CONFIG" and isinstance(v, str):
                mp.setenv(k, v)
        return load_settings(path)


def mounted_secret(workload: Obj, c: Obj, file: str) -> str:
    """The Secret ``file`` comes from in container ``c`` (asserts it is mounted from one)."""
    volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
    for m in c.get("volumeMounts", []):
        if file.startswith(m["mountPath"].rstrip("/") + "/"):
            secret = volumes[m["name"]].get("secret")
            assert secret is not None, f"{file} is mounted from {volumes[m['name']]}, not a Secret"
            assert secret["defaultMode"] == 0o440, f"{file}: Secret files readable by the pod's group only"
            return str(secret["secretName"])
    raise AssertionError(f"{c['name']}: {file} is not in any volume mount")


# --------------------------------------------------------------------------- schemas
def test_every_object_is_valid(rendered: list[Obj]) -> None:
    kinds = sorted(o["kind"] for o in rendered)
    assert {"ConfigMap", "Deployment", "StatefulSet", "PodDisruptionBudget", "Service"} <= set(kinds)
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule"} <= set(kinds)
    for obj in rendered:
        try:
            validate(obj)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as e:
            pytest.fail(f"{key(obj)}: {e.message} at {list(e.path)}")


@pytest.mark.parametrize(
    ("kind", "name", "path", "value"),
    [
        (
            "Deployment",
            "trimtab-controller",
            ["spec", "template", "spec", "containers", 0, "readinessProbe", "httpGet", "paht"],
            "/",
        ),
        ("Deployment", "trimtab-controller", ["spec", "replicas"], "two"),
        ("StatefulSet", "broker", ["spec", "template", "spec", "terminationGracePeriod"], 90),
        ("PodDisruptionBudget", "broker", ["spec", "maxUnavailable"], [1]),
        ("Service", "broker", ["spec", "ports", 0, "port"], "eighty"),
        ("ServiceMonitor", "trimtab-controller", ["spec", "endpoints", 0, "intervall"], "30s"),
        ("PodMonitor", "trimtab-agent", ["spec", "podMetricsEndpoints", 0, "scheme"], "tcp"),
        ("PrometheusRule", "trimtab", ["spec", "groups", 0, "rules", 0, "for"], "two minutes"),
    ],
)
def test_the_validation_rejects_a_broken_object(kind: str, name: str, path: list[Any], value: Any) -> None:
    obj = copy.deepcopy(one(build(KUBERNETES_DIR / "base"), kind, name))
    at: Any = obj
    for step in path[:-1]:
        at = at[step]
    at[path[-1]] = value
    with pytest.raises((kubernetes_validate.ValidationError, jsonschema.ValidationError)):
        validate(obj)


# --------------------------------------------------------------------------- the controllers
def test_controllers_run_replicated_probed_and_locked_down(rendered: list[Obj]) -> None:
    dep = one(rendered, "Deployment", "trimtab-controller")
    replicas = dep["spec"]["replicas"]
    assert 2 <= replicas <= 3
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert selects(dep["spec"]["selector"]["matchLabels"], labels)
    pdb = one(rendered, "PodDisruptionBudget", "trimtab-controller")
    assert selects(pdb["spec"]["selector"]["matchLabels"], labels)
    assert pdb["spec"]["maxUnavailable"] == 1 and replicas - 1 >= 1, "a follower must stay to take over"
    c = container(dep, "controller")
    assert c["args"][:2] == ["controller", "--controller-id"] and "$(POD_NAME)" in c["args"][2]
    assert env_of(c)["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert_probed_and_locked_down(dep, c, port="http")


def assert_probed_and_locked_down(workload: Obj, c: Obj, port: str) -> None:
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports[port] == 8080
    assert (
        c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["livenessProbe"]["httpGet"]["port"] == port
    )
    assert (
        c["readinessProbe"]["httpGet"]["path"] == "/readyz" and c["readinessProbe"]["httpGet"]["port"] == port
    )
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert c["resources"]["limits"]["memory"]
    pod = pod_spec(workload)
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    for each in pod["containers"]:
        sc = each["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True, each["name"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], each["name"]


# --------------------------------------------------------------------------- the agent sidecar
def test_the_agent_is_a_sidecar_that_drains_before_its_broker_stops(
    rendered: list[Obj], tmp_path: Path
) -> None:
    sts = one(rendered, "StatefulSet", "broker")
    agent, broker = container(sts, "agent"), container(sts, "broker")
    assert_probed_and_locked_down(sts, agent, port="agent-http")
    # The broker id comes from the pod: its stable name through the downward API.
    assert agent["args"][:2] == ["agent", "--broker-id"] and agent["args"][2].startswith("$(POD_NAME).")
    assert env_of(agent)["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert sts["spec"]["serviceName"] in agent["args"][2]
    s = trimtab_settings(rendered, agent, tmp_path)
    # The adapter talks to the broker in the same pod, and nobody else can.
    assert s.broker.adapter.kind == "webhook"
    assert re.fullmatch(r"https?://(127\.0\.0\.1|localhost):8081/?", s.broker.adapter.url)
    assert broker["args"][broker["args"].index("--host") + 1] == "127.0.0.1"
    assert broker["args"][broker["args"].index("--port") + 1] == "8081"
    assert broker["args"][broker["args"].index("--broker-id") + 1] == agent["args"][2]
    # Graceful drain: the grace period covers the agent's drain, and the broker waits for the agent.
    assert pod_spec(sts)["terminationGracePeriodSeconds"] >= s.agent.drain_timeout_s + 15
    wait = broker["lifecycle"]["preStop"]["exec"]["command"]
    scheme = "https" if s.http.tls_cert_file else "http"
    assert f"{scheme}://127.0.0.1:{s.http.port}/healthz" in " ".join(wait)
    assert "preStop" not in agent.get("lifecycle", {}), "SIGTERM itself starts the agent's drain"
    pdb = one(rendered, "PodDisruptionBudget", "broker")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert selects(pdb["spec"]["selector"]["matchLabels"], sts["spec"]["template"]["metadata"]["labels"])


def test_config_is_valid_and_every_file_comes_from_a_documented_secret(
    rendered: list[Obj], tmp_path: Path
) -> None:
    documented = set(re.findall(r"^\| `(trimtab-[a-z-]+)`", README.read_text(), re.MULTILINE))
    assert {"trimtab-tokens", "trimtab-zookeeper", "trimtab-webhook", "trimtab-tls"} <= documented
    used: set[str] = set()
    for workload in workloads(rendered):
        for c in pod_spec(workload)["containers"]:
            if c["args"][0] not in ("agent", "controller"):
                continue
            s = trimtab_settings(rendered, c, tmp_path)
            assert s.security.auth == "required" and s.http.host == "0.0.0.0"
            assert s.http.advertised_host == "$(POD_IP)"  # expanded by Kubernetes from the env above it
            assert env_of(c)["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
            files = [
                s.security.admin_tokens_file,
                s.security.read_tokens_file,
                s.zookeeper.auth_digest_file,
                s.http.tls_cert_file,
                s.http.tls_key_file,
                s.http.tls_ca_file,
            ]
            if c["args"][0] == "agent":
                files.append(s.broker.adapter.hmac_key_file)
            used |= {mounted_secret(workload, c, f) for f in files if f}
            config_mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
            assert env_of(c)["TRIMTAB_CONFIG"] == f"{config_mount['mountPath']}/trimtab.toml"
    assert used and used <= documented, used - documented
    # Every Secret a pod mounts is one the README tells how to create.
    for workload in workloads(rendered):
        for v in pod_spec(workload)["volumes"]:
            if "secret" in v:
                assert v["secret"]["secretName"] in documented


# --------------------------------------------------------------------------- wiring between objects
def test_services_and_monitors_select_what_exists(rendered: list[Obj]) -> None:
    pods = [
        (
            w["spec"]["template"]["metadata"]["labels"],
            {p["name"] for c in pod_spec(w)["containers"] for p in c.get("ports", [])},
        )
        for w in workloads(rendered)
    ]
    services = [o for o in rendered if o["kind"] == "Service"]
    for svc in services:
        matched = [ports for labels, ports in pods if selects(svc["spec"]["selector"], labels)]
        assert matched, f"Service {svc['metadata']['name']} selects no pods"
        for p in svc["spec"]["ports"]:
            assert all(p["targetPort"] in ports for ports in matched), (svc["metadata"]["name"], p)
    sts = one(rendered, "StatefulSet", "broker")
    assert one(rendered, "Service", sts["spec"]["serviceName"])["spec"]["clusterIP"] == "None"
    jobs_in_rules = set(re.findall(r'job="([^"]+)"', ALERT_RULES.read_text()))
    assert jobs_in_rules == {AGENT_JOB, CONTROLLER_JOB}

    sm = one(rendered, "ServiceMonitor")
    svc = next(s for s in services if selects(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"]))
    for ep in sm["spec"]["endpoints"]:
        assert ep["port"] in {p["name"] for p in svc["spec"]["ports"]} and ep["path"] == "/metrics"
        assert {"action": "replace", "targetLabel": "job", "replacement": CONTROLLER_JOB} in ep["relabelings"]
    assert selects(
        svc["spec"]["selector"], one(rendered, "Deployment")["spec"]["template"]["metadata"]["labels"]
    )

    pm = one(rendered, "PodMonitor")
    assert selects(pm["spec"]["selector"]["matchLabels"], sts["spec"]["template"]["metadata"]["labels"])
    for ep in pm["spec"]["podMetricsEndpoints"]:
        assert (
            ep["port"] in {p["name"] for p in container(sts, "agent")["ports"]} and ep["path"] == "/metrics"
        )
        assert {"action": "replace", "targetLabel": "job", "replacement": AGENT_JOB} in ep["relabelings"]
    # Scrapes use the nodes' scheme.
    tls = "tls_cert_file" in one(rendered, "ConfigMap")["data"]["trimtab.toml"]
    for ep in sm["spec"]["endpoints"] + pm["spec"]["podMetricsEndpoints"]:
        assert ep.get("scheme", "http") == ("https" if tls else "http")


def test_the_overlay_changes_what_it_says(tmp_path: Path) -> None:
    base, overlay = build(KUBERNETES_DIR / "base"), build(KUBERNETES_DIR / "overlays/example")
    assert {o["metadata"]["name"] for o in base} == {o["metadata"]["name"] for o in overlay}
    assert all(o["metadata"]["namespace"] == "pulsar" for o in overlay)
    assert one(overlay, "Deployment")["spec"]["replicas"] == 3
    assert one(overlay, "StatefulSet")["spec"]["replicas"] == 4
    images = {c["image"] for w in workloads(overlay) for c in pod_spec(w)["containers"]}
    assert images == {"registry.example.com/platform/trimtab:0.1.0"}
    agent = container(one(overlay, "StatefulSet"), "agent")
    assert agent["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert trimtab_settings(overlay, agent, tmp_path).cluster.name == "pulsar-prod"


def test_prometheus_rule_is_the_deployed_alert_rules() -> None:
    assert PROMETHEUS_RULE.read_text() == prometheus_rule(), (
        "deploy/kubernetes/base/prometheusrule.yaml is stale: run .venv/bin/trimtab docs"
    )
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert rule["spec"]["groups"] == yaml.safe_load(ALERT_RULES.read_text())["groups"]


# --------------------------------------------------------------------------- the kustomize binary
def test_kustomize_is_the_pinned_release_that_setup_installs() -> None:
    binary = kustomize.find_binary()
    assert subprocess_out([str(binary), "version"]) == KUSTOMIZE_VERSION
    # setup.sh installs the version it reads from devkit/kustomize.py, with go install.
    setup = (REPO_ROOT / "scripts" / "setup.sh").read_text()
    assert 'install "sigs.k8s.io/kustomize/kustomize/v5@$kustomize_version"' in setup
    read = next(line for line in setup.splitlines() if line.startswith("kustomize_version="))
    assert (
        subprocess_out(["bash", "-c", f"{read}; echo $kustomize_version"], cwd=REPO_ROOT) == KUSTOMIZE_VERSION
    )


def test_a_missing_kustomize_is_one_line_naming_setup(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TRIMTAB_KUSTOMIZE", str(tmp_path / "nowhere" / "kustomize"))
    with pytest.raises(KustomizeError) as e:
        build(KUBERNETES_DIR / "base")
    message = str(e.value)
    assert "\n" not in message and "bash scripts/setup.sh" in message and KUSTOMIZE_VERSION in message


def test_kustomize_errors_are_reported(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [missing.yaml]\n"
    )
    with pytest.raises(KustomizeError, match=re.escape("missing.yaml")):
        build(tmp_path)


def test_patches_merge_by_kubernetes_merge_keys() -> None:
    """What the overlay relies on from kustomize's strategic merge: containers and volume mounts merged
    by their keys (not replaced), fields the patch does not name kept."""
    base, overlay = (
        one(build(KUBERNETES_DIR / "base"), "StatefulSet"),
        one(build(KUBERNETES_DIR / "overlays/example"), "StatefulSet"),
    )
    assert [c["name"] for c in pod_spec(overlay)["containers"]] == [
        c["name"] for c in pod_spec(base)["containers"]
    ]
    agent, base_agent = container(overlay, "agent"), container(base, "agent")
    assert agent["readinessProbe"]["httpGet"]["path"] == base_agent["readinessProbe"]["httpGet"]["path"]
    mounts = {m["mountPath"] for m in agent["volumeMounts"]}
    assert mounts == {m["mountPath"] for m in base_agent["volumeMounts"]} | {"/run/trimtab-secrets/tls"}
    assert container(overlay, "broker")["args"] == container(base, "broker")["args"]


def subprocess_out(argv: list[str], cwd: Path | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True, cwd=cwd)
    return done.stdout.strip()
