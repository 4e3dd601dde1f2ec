"""The secured admin plane (docs/security.md), for real.

* Declarations: every route of both apps declares exactly one access (public, read, admin) -- walked from
  the apps' route tables and checked against their OpenAPI specs -- and every non-public route refuses a
  request without a token (401 with a ``Bearer`` challenge, in the one error shape), with an unknown token
  (401), with a malformed body and no token (401, not 400), and, for writes, with a read token (403). An app
  with an undeclared route, or a write declared less than admin, is refused when it is built.
* Start-up: a daemon with authentication required and no token, or a token file that is missing, empty or
  holds something that is not a token, refuses to start (exit 2) naming the setting and the path, never
  the content.
* A live local cluster (real ``trimtab`` processes, security on as ``dev up`` runs it): the same walk over
  real HTTP from each node's own ``/openapi.json``; public endpoints stay public; admin writes work, and
  the controller forwards a drain to the agent with its own token; the refusals are counted; an
  unauthenticated ZooKeeper client can read trimtab's znodes and change none; token files rotate without
  a restart (and emptying or deleting a token file revokes its tokens); no token or ZooKeeper password ever
  reaches a log line or the shown configuration.
* HTTPS: an agent and a controller built by the wiring serve TLS with a certificate made here (openssl);
  they advertise https:// URLs, a client with the CA gets in and one without is refused at the handshake,
  the controller reaches the agent over TLS, and ``trimtab admin --cacert`` works.
* ZooKeeper digest credentials from the settings (a SecretStr, e.g. from the environment) protect what a
  session creates.
* Kafka: ``kafka.client_config`` and ``kafka.client_config_file`` reach every client configuration the
  transport builds, every Kafka-using part of an agent and a controller shares that transport, and a real
  exchange with the mock cluster goes through clients built with them.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from click.testing import CliRunner
from fastapi import FastAPI
from fastapi.testclient import TestClient
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import Permissions
from prometheus_client.parser import text_string_to_metric_families
from starlette.responses import PlainTextResponse

from tests.integration.test_admin_moves import leading, running_controller
from tests.integration.test_agent_inprocess import agent_settings, running_agent, until
from tests.support.memory_log import memory_log
from tests.support.procs import Finished, Procs
from tests.support.tls import make_pki
from tests.support.waiting import wait_for
from trimtab.agent import wiring as agent_wiring
from trimtab.agent.api import SimControls
from trimtab.agent.api import create_app as agent_app
from trimtab.balance.assign import BrokerInfo
from trimtab.channel.kafka import KafkaTransport
from trimtab.channel.snapshot import read_all
from trimtab.cli.main import main
from trimtab.cluster.auth import ADMIN, READ, Authenticator, StaticToken, route_table, secure_app
from trimtab.cluster.http_errors import install_error_handlers
from trimtab.cluster.placement.store import znode_paths
from trimtab.cluster.wiring import kafka_transport, zk_session
from trimtab.cluster.zk import ZkPaths
from trimtab.config.loader import load_settings
from trimtab.controller.api import create_app as controller_app
from trimtab.controller.wiring import build_controller
from trimtab.devkit.kafka_server import KafkaCluster
from trimtab.devkit.localcluster import LocalCluster, Node
from trimtab.devkit.zkserver import free_port

pytestmark = pytest.mark.integration

ADMIN_TOKEN = "admin-" + secrets.token_urlsafe(24)
READ_TOKEN = "read-" + secrets.token_urlsafe(24)
PUBLIC = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics")}
AGENT_PUBLIC = {*PUBLIC, ("GET", "/v1/lookup")}
# Every secret a test here sends or writes: none may ever show up in a log line.
SECRETS: list[str] = [ADMIN_TOKEN, READ_TOKEN]


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def concrete(path: str) -> str:
    """A route's path with its parameters filled in (``/v1/failure-domains/{name}`` -> ``.../x``)."""
    return re.sub(r"\{[^}]+\}", "x", path)


def error_shape(r: httpx.Response) -> str:
    body = r.json()
    assert set(body) == {"error", "retryable"} and isinstance(body["error"], str), body
    return str(body["error"])


def refused_401(r: httpx.Response, what: str) -> None:
    assert r.status_code == 401, (what, r.status_code, r.text)
    assert r.headers.get("www-authenticate", "").startswith("Bearer"), (what, r.headers)
    error_shape(r)


def operations(spec: dict[str, Any]) -> list[tuple[str, str, set[str] | None]]:
    """(method, path, required scopes or None when the operation is public) from an OpenAPI spec."""
    out = []
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            sec = op.get("security")
            scopes = None if not sec else {s for req in sec for s in req.get("bearer", [])}
            out.append((method.upper(), path, scopes))
    return out


# ---------------------------------------------------------------------------------------------- declarations


def test_every_route_of_both_apps_declares_its_access_and_refuses_without_a_token() -> None:
    auth = Authenticator(
        required=True, admin=[StaticToken(ADMIN_TOKEN.encode())], read=[StaticToken(READ_TOKEN.encode())]
    )
    apps = {
        "agent": (agent_app(None, SimControls(None, lambda: None), auth=auth), AGENT_PUBLIC),  # type: ignore[arg-type]
        "controller": (controller_app(None, auth=auth), PUBLIC),  # type: ignore[arg-type]
    }
    for name, (app, public) in apps.items():
        table = route_table(app)
        assert len(table) > 10, name
        assert {(m, p) for m, p, access in table if access == "public"} == public, name
        spec = app.openapi()
        documented = {(m, p): scopes for m, p, scopes in operations(spec)}
        assert set(documented) == {(m, p) for m, p, _ in table}, name
        client = TestClient(app, raise_server_exceptions=False)
        for method, path, access in table:
            assert access in ("public", "read", "admin"), (name, method, path, access)
            if method != "GET":
                assert access == "admin", (name, method, path, "a write must need an admin token")
            what = f"{name} {method} {path}"
            if access == "public":
                assert documented[(method, path)] is None, what
                continue
            assert documented[(method, path)] == {access}, what
            responses = spec["paths"][path][method.lower()]["responses"]
            assert "401" in responses and ("403" in responses) == (access == "admin"), what
            url = concrete(path)
            refused_401(client.request(method, url), what)
            refused_401(client.request(method, url, headers=bearer("not-a-token-of-this-node")), what)
            refused_401(client.request(method, url, headers={"authorization": f"Basic {ADMIN_TOKEN}"}), what)
            if method != "GET":  # a malformed body does not tell a caller without a token anything more
                malformed = {"content-type": "application/json"}
                refused_401(client.request(method, url, content=b'{"x": ', headers=malformed), what)
                r = client.request(method, url, json={}, headers=bearer(READ_TOKEN))
                assert r.status_code == 403, (what, r.status_code, r.text)
                assert "admin token" in error_shape(r)
        assert client.get("/openapi.json").status_code == 200 and client.get("/docs").status_code == 200


def test_an_app_without_an_authenticator_refuses_every_protected_route() -> None:
    client = TestClient(controller_app(None), raise_server_exceptions=False)  # type: ignore[arg-type]
    refused_401(client.get("/v1/status", headers=bearer(ADMIN_TOKEN)), "no authenticator: fail closed")


def test_an_app_with_an_undeclared_route_or_a_write_declared_read_is_not_built() -> None:
    undeclared = FastAPI()
    install_error_handlers(undeclared)

    @undeclared.get("/v1/new-view")
    async def new_view() -> dict[str, str]:
        return {}

    with pytest.raises(RuntimeError, match=r"GET /v1/new-view declares no access"):
        secure_app(undeclared, None)

    weak = FastAPI()

    @weak.post("/v1/admin/new-write", dependencies=[READ])
    async def new_write() -> dict[str, str]:
        return {}

    with pytest.raises(RuntimeError, match=r"POST /v1/admin/new-write changes things but declares read"):
        secure_app(weak, None)

    both = FastAPI()

    @both.get("/v1/twice", dependencies=[READ, ADMIN])
    async def twice() -> dict[str, str]:
        return {}

    with pytest.raises(RuntimeError, match=r"declares \['admin', 'read'\] access"):
        secure_app(both, None)

    raw = FastAPI()
    raw.add_route("/raw", lambda request: PlainTextResponse("open"))
    with pytest.raises(RuntimeError, match="not a FastAPI route"):
        secure_app(raw, None)


# ---------------------------------------------------------------------------------------------- start-up


def _clean_env() -> dict[str, str | None]:
    return {k: None for k in os.environ if k.startswith("TRIMTAB_")}


@pytest.mark.parametrize("daemon", ["agent", "controller"])
def test_a_daemon_refuses_to_start_without_a_usable_token(daemon: str, tmp_path: Path) -> None:
    closed = f"127.0.0.1:{free_port()}"  # nothing listens: a daemon that got as far as connecting would hang
    base = [daemon, "--http-port", "0", "--zookeeper", closed, "--kafka", closed]
    if daemon == "agent":
        base += ["--set", "broker.adapter.kind=simulated"]
    runner = CliRunner()

    def start(*sets: str) -> str:
        args = [*base, *(x for s in sets for x in ("--set", s))]
        r = runner.invoke(main, args, env=_clean_env())
        assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
        return r.stderr

    err = start()
    assert "no token is configured" in err and "security.admin_tokens_file" in err, err
    assert 'security.auth = "disabled"' in err and "TRIMTAB_SECURITY__ADMIN_TOKEN" in err, err

    missing = tmp_path / "missing.tokens"
    err = start(f"security.admin_tokens_file={str(missing)!r}")
    assert "security.admin_tokens_file" in err and str(missing) in err and "does not exist" in err, err

    empty = tmp_path / "empty.tokens"
    empty.write_text("# nothing yet\n\n")
    err = start(f"security.read_tokens_file={str(empty)!r}")
    assert "security.read_tokens_file" in err and str(empty) in err and "holds no token" in err, err

    bad = tmp_path / "bad.tokens"
    bad.write_text(f"# rotation in progress\n{ADMIN_TOKEN}\nHUNTER TWO\n")
    err = start(f"security.admin_tokens_file={str(bad)!r}")
    assert f"{bad}), line 3" in err and "HUNTER" not in err and ADMIN_TOKEN not in err, err

    err = start("security.admin_token='short'")
    assert "security.admin_token" in err and "short" not in err.replace("security.admin_token", ""), err

    pki = tmp_path / "no-such-cert.pem"
    err = start(
        f"security.admin_token={ADMIN_TOKEN!r}",
        f"http.tls_cert_file={str(pki)!r}",
        "http.tls_key_file='k.pem'",
    )
    assert "http.tls_cert_file" in err and str(pki) in err, err


# ---------------------------------------------------------------------------------------------- a live cluster

CLUSTER_SETTINGS: dict[str, Any] = {
    "zookeeper": {"session_timeout_s": 6},
    "load": {"report_interval_s": 0.5, "report_max_interval_s": 5},
    "shedding": {"enabled": False},
    "split": {"enabled": False},
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("security"), brokers=1, controllers=1, settings=CLUSTER_SETTINGS)
    c.start(timeout=120)
    SECRETS.extend([c.admin_token, c.read_token, c.token_files["zookeeper_digest"].read_text().strip()])
    try:
        yield c
    finally:
        c.stop()


def _nodes(c: LocalCluster) -> tuple[Node, Node]:
    return c.agents[0], c.controller_nodes[0]


def _failures(http: httpx.Client, node: Node) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(http.get(f"{node.http}/metrics").text):
        for s in fam.samples:
            if s.name == "trimtab_http_auth_failures_total":
                out[s.labels["reason"]] = s.value
    return out


def test_roles_on_live_daemons(cluster: LocalCluster) -> None:
    agent, ctl = _nodes(cluster)
    admin, read = bearer(cluster.admin_token), bearer(cluster.read_token)
    with httpx.Client(timeout=30) as http:
        before = {n.name: _failures(http, n) for n in (agent, ctl)}
        assert set(before[ctl.name]) == {"missing", "invalid", "forbidden"}
        for node, public in ((agent, AGENT_PUBLIC), (ctl, PUBLIC)):
            spec = http.get(f"{node.http}/openapi.json").json()  # public: clients and tools read it
            assert http.get(f"{node.http}/docs").status_code == 200
            ops = operations(spec)
            assert {(m, p) for m, p, scopes in ops if scopes is None} == public, node.name
            for method, path, scopes in ops:
                if scopes is None:
                    continue
                url, what = node.http + concrete(path), f"{node.name} {method} {path}"
                refused_401(http.request(method, url), what)
                refused_401(http.request(method, url, headers=bearer("bad-" + cluster.admin_token[4:])), what)
                r = http.request(method, url, headers=read)
                if scopes == {"admin"}:
                    assert r.status_code == 403, (what, r.status_code, r.text)
                    assert "admin token" in error_shape(r)
                else:
                    assert r.status_code not in (401, 403), (what, r.status_code, r.text)
        # Public without a token: probes, metrics, the lookup the brokers' clients make.
        for node in (agent, ctl):
            for path in ("/healthz", "/readyz", "/metrics"):
                assert http.get(node.http + path).status_code == 200, (node.name, path)
        r = http.get(f"{agent.http}/v1/lookup", params={"topic": "persistent://public/sec/t"})
        assert r.status_code == 200 and r.json()["owner"] == agent.broker, r.text

        # A read token reads; an admin token also writes.
        assert http.get(f"{ctl.http}/v1/status", headers=read).status_code == 200
        assert http.get(f"{agent.http}/v1/sim/state", headers=read).status_code == 200
        r = http.post(f"{ctl.http}/v1/admin/shedding", json={"paused": True, "by": "sec"}, headers=admin)
        assert r.status_code == 200 and r.json()["shedding_paused"] is True, r.text
        r = http.post(f"{ctl.http}/v1/admin/shedding", json={"paused": False, "by": "sec"}, headers=admin)
        assert r.status_code == 200 and r.json()["shedding_paused"] is False, r.text
        r = http.put(f"{ctl.http}/v1/failure-domains/sec-d", json={"brokers": [agent.broker]}, headers=admin)
        assert r.status_code == 200 and r.json() == {"brokers": [agent.broker]}, r.text
        r = http.delete(f"{ctl.http}/v1/failure-domains/sec-d", headers=admin)
        assert r.status_code == 200, r.text
        assert http.post(f"{agent.http}/v1/sim/load", json={}, headers=admin).status_code == 200
        # The controller forwards a drain (dry run) to the agent, which wants an admin token: the
        # controller presents its own.
        body = {"broker": agent.broker, "dry_run": True}
        r = http.post(f"{ctl.http}/v1/admin/drain", json=body, headers=admin)
        assert r.status_code == 200 and r.json()["dry_run"] is True, r.text
        assert http.post(f"{ctl.http}/v1/admin/drain", json=body, headers=read).status_code == 403

        after = {n.name: _failures(http, n) for n in (agent, ctl)}
        for n in (agent, ctl):
            for reason in ("missing", "invalid", "forbidden"):
                assert after[n.name][reason] > before[n.name][reason], (n.name, reason, after)


def test_unauthenticated_zookeeper_clients_can_read_trimtabs_znodes_and_change_none(
    cluster: LocalCluster,
) -> None:
    agent, ctl = _nodes(cluster)
    s = load_settings(cluster.config_path, environ=False)
    paths = ZkPaths(s.zk_path)
    r = httpx.put(
        f"{ctl.http}/v1/failure-domains/acl-d",
        json={"brokers": [agent.broker]},
        headers=cluster.auth_headers(),
    )
    assert r.status_code == 200, r.text
    domains = znode_paths(paths)["domains"]
    anon = KazooClient(hosts=cluster.zk_hosts, timeout=10)
    wrong = KazooClient(
        hosts=cluster.zk_hosts, timeout=10, auth_data=[("digest", "trimtab:not-the-password")]
    )
    owner = KazooClient(hosts=cluster.zk_hosts, timeout=10, auth_data=[cluster.zk_auth])
    for c in (anon, wrong, owner):
        c.start(timeout=15)
    try:
        broker = paths.broker(agent.broker)
        info = msgspec.json.decode(anon.get(broker)[0], type=BrokerInfo)  # anybody may look
        assert info.id == agent.broker
        for path in (
            paths.base,
            paths.brokers,
            broker,
            paths.leader,
            paths.leader_term,
            paths.admin,
            domains,
        ):
            acls, _ = anon.get_acls(path)
            kinds = {(a.id.scheme, a.perms) for a in acls}
            assert kinds == {("digest", Permissions.ALL), ("world", Permissions.READ)}, (path, acls)
        for client in (anon, wrong):
            with pytest.raises(NoAuthError):
                client.create(f"{paths.brokers}/intruder:1", b"{}", ephemeral=True)
            with pytest.raises(NoAuthError):
                client.set(broker, b"{}")
            with pytest.raises(NoAuthError):
                client.delete(broker)
            with pytest.raises(NoAuthError):
                client.delete(paths.leader)
            with pytest.raises(NoAuthError):
                client.set(paths.leader_term, b"999999")
            with pytest.raises(NoAuthError):
                client.create(f"{paths.admin}/intruder", b"")
            with pytest.raises(NoAuthError):
                client.set(domains, b"{}")
        assert anon.get(broker)[0] == owner.get(broker)[0], "nothing changed"
        # With the cluster's credentials the same operations are allowed: the refusals were the ACLs.
        probe = owner.create(f"{paths.admin}/probe", b"x")
        owner.delete(probe)
    finally:
        for c in (anon, wrong, owner):
            c.stop()
            c.close()


def test_an_agent_with_credentials_the_acls_do_not_grant_exits_saying_so(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """An agent given another ZooKeeper digest than the cluster's (a rotated file, another cluster's) cannot
    register: it must exit 1 naming the znode and the setting -- kazoo's ``NoAuthError`` alone prints as
    nothing -- without showing the password, and change nothing."""
    password = secrets.token_urlsafe(18)
    other = tmp_path / "other.digest"
    other.write_text(f"trimtab:{password}\n")
    other.chmod(0o600)
    s = load_settings(cluster.config_path, environ=False)
    paths = ZkPaths(s.zk_path)
    procs = Procs(tmp_path / "procs")
    try:
        done = procs.run_trimtab(
            "agent",
            "--config",
            str(cluster.config_path),
            "--http-port",
            "0",
            "--broker-id",
            "intruder:1",
            "--set",
            f"zookeeper.auth_digest_file={str(other)!r}",
            timeout=60,
        )
    finally:
        procs.close()
    assert done.returncode == 1, done.describe()
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("agent failed: ZooKeeper refused the digest credentials"), done.describe()
    assert paths.broker("intruder:1") in last and "zookeeper.auth_digest (or auth_digest_file)" in last, last
    assert password not in done.stderr + done.stdout
    anon = KazooClient(hosts=cluster.zk_hosts, timeout=10)
    anon.start(timeout=15)
    try:
        assert anon.exists(paths.broker("intruder:1")) is None
    finally:
        anon.stop()
        anon.close()


def _replace(path: Path, text: str) -> None:
    """Write ``path`` as an operator should: a new file renamed over the old one (atomic)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    tmp.chmod(0o600)
    os.replace(tmp, path)


def test_token_files_rotate_without_a_restart(cluster: LocalCluster) -> None:
    agent, ctl = _nodes(cluster)
    admin_file = cluster.token_files["admin_token"]
    old, new = cluster.admin_token, "rotated-" + secrets.token_urlsafe(24)
    SECRETS.append(new)
    pids = {n.name: n.pid for n in (agent, ctl)}

    def status(node: Node, token: str) -> int:
        return httpx.get(f"{node.http}/v1/status", headers=bearer(token), timeout=10).status_code

    def drain_dry_run(token: str) -> int:
        body = {"broker": agent.broker, "dry_run": True}
        return httpx.post(
            f"{ctl.http}/v1/admin/drain", json=body, headers=bearer(token), timeout=30
        ).status_code

    try:
        _replace(admin_file, f"# rotated by the test\n{new}\n")
        wait_for(
            lambda: status(agent, new) == 200 and status(ctl, new) == 200, 10, message="the new token works"
        )
        assert status(agent, old) == 401 and status(ctl, old) == 401
        # The controller now presents the new first token to the agent.
        assert drain_dry_run(new) == 200

        # Overlap, as a real rotation does it: both work, the first one is what nodes present.
        _replace(admin_file, f"{new}\n{old}\n")
        wait_for(lambda: status(ctl, old) == 200 and status(agent, old) == 200, 10, message="both tokens")
        assert status(ctl, new) == 200

        # Emptying the file revokes its tokens (fail closed): that is how an operator revokes them. The
        # read token, from its own file, still works; the daemons keep running.
        admin_file.write_text("")
        assert status(ctl, new) == 401 and status(agent, old) == 401
        assert status(ctl, cluster.read_token) == 200
        assert "token_file_revoked" in cluster.log_tail(ctl.name, 200)
        _replace(admin_file, f"{new}\n")
        wait_for(lambda: status(ctl, new) == 200, 10, message="the rewritten file grants again")
        # So does deleting it.
        admin_file.unlink()
        assert status(ctl, new) == 401 and status(agent, new) == 401
        assert {n.name: n.pid for n in (agent, ctl)} == pids and agent.alive() and ctl.alive()
    finally:
        _replace(admin_file, f"{old}\n")
        wait_for(lambda: status(ctl, old) == 200 and status(agent, old) == 200, 10, message="restored")
    assert status(ctl, new) == 401


def test_tokens_and_passwords_never_reach_the_logs_or_the_shown_configuration(cluster: LocalCluster) -> None:
    agent, ctl = _nodes(cluster)
    bad = "bad-" + secrets.token_urlsafe(24)
    SECRETS.append(bad)
    with httpx.Client(timeout=30) as http:
        for node in (agent, ctl):
            assert http.get(f"{node.http}/v1/status", headers=bearer(cluster.admin_token)).status_code == 200
            assert http.get(f"{node.http}/v1/status", headers=bearer(bad)).status_code == 401
            assert http.get(f"{node.http}/v1/status").status_code == 401
        r = http.post(
            f"{ctl.http}/v1/admin/unload",
            json={"bundle": "a/b/0x00000000_0xffffffff"},
            headers=bearer(cluster.read_token),
        )
        assert r.status_code == 403

    def refusals() -> set[tuple[str, str]]:
        """(node, reason) of every ``http_auth_refused`` line the nodes wrote."""
        seen = set()
        for log in (cluster.workdir / "logs").glob("*.log"):
            for line in log.read_text(errors="replace").splitlines():
                if '"http_auth_refused"' in line:
                    event = json.loads(line)
                    seen.add((event.get("controller") or event.get("broker"), event["reason"]))
        return seen

    wait_for(
        lambda: {reason for _, reason in refusals()} == {"missing", "invalid", "forbidden"},
        10,
        message=lambda: f"refusals logged: {refusals()}",
    )
    logs = "\n".join(p.read_text(errors="replace") for p in (cluster.workdir / "logs").glob("*.log"))
    assert '"event": "http_auth"' in logs and '"auth": "required"' in logs
    for secret in SECRETS:
        assert secret not in logs, "a secret reached a log line"
    password = cluster.token_files["zookeeper_digest"].read_text().strip().split(":", 1)[1]
    assert password not in logs

    # The configuration as shown: secrets masked, token files by path only.
    env = {**_clean_env(), "TRIMTAB_SECURITY__ADMIN_TOKEN": ADMIN_TOKEN}
    r = CliRunner().invoke(
        main,
        [
            "config",
            "show",
            "--config",
            str(cluster.config_path),
            "--set",
            "kafka.client_config={'sasl.password' = 'kafka-secret-123', 'client.id' = 'x'}",
        ],
        env=env,
    )
    assert r.exit_code == 0, r.output
    shown = json.loads(r.stdout)
    assert shown["security"]["admin_token"] == "**********"
    assert shown["kafka"]["client_config"] == {"sasl.password": "**********", "client.id": "x"}
    assert shown["security"]["admin_tokens_file"] == str(cluster.token_files["admin_token"])
    for secret in (*SECRETS, "kafka-secret-123"):
        assert secret not in r.stdout
    s = load_settings(cluster.config_path, {"security": {"read_token": READ_TOKEN}}, environ=False)
    assert READ_TOKEN not in repr(s) and READ_TOKEN not in str(s.model_dump())


# ---------------------------------------------------------------------------------------------- HTTPS


def test_https_between_clients_the_controller_and_the_agent(
    zk_hosts: str, tmp_path: Path, procs: Procs
) -> None:
    pki = make_pki(tmp_path / "pki")
    tokens = tmp_path / "admin.tokens"
    tokens.write_text(f"{ADMIN_TOKEN}\n")
    tokens.chmod(0o600)
    tls = {"tls_cert_file": str(pki.cert), "tls_key_file": str(pki.key), "tls_ca_file": str(pki.ca)}
    s = agent_settings(
        zk_hosts,
        http={"host": "127.0.0.1", "port": 0, **tls},
        security={"auth": "required", "admin_tokens_file": str(tokens)},
        healing={"safe_mode_settle_s": 0},
        shedding={"enabled": False},
    )
    log = memory_log(s)

    def admin_cli(*args: str) -> Finished:
        return procs.run_trimtab("admin", *args, timeout=60)  # a real process: its own stdout

    async def scenario() -> None:
        async with running_controller(s, log) as ctl, running_agent(s, log) as w:
            agent_url, ctl_url = w.identity.http_url, ctl.election.http_url
            assert agent_url.startswith("https://") and ctl_url.startswith("https://")
            await until(lambda: w.identity.id in ctl.registry.brokers, what="the controller sees the agent")
            assert ctl.registry.brokers[w.identity.id].http_url == agent_url  # advertised as https
            await leading(ctl)
            ca = ssl.create_default_context(cafile=str(pki.ca))
            async with httpx.AsyncClient(verify=ca, headers=bearer(ADMIN_TOKEN), timeout=30) as http:
                assert (await http.get(f"{agent_url}/v1/status")).status_code == 200
                assert (await http.get(f"{ctl_url}/v1/status")).status_code == 200
                # The controller calls the agent over TLS, trusting http.tls_ca_file, with its token.
                body = {"broker": w.identity.id, "dry_run": True}
                r = await http.post(f"{ctl_url}/v1/admin/drain", json=body)
                assert r.status_code == 200 and r.json()["dry_run"] is True, r.text
            async with httpx.AsyncClient(timeout=10) as untrusting:  # the system's CAs only
                with pytest.raises(
                    httpx.ConnectError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"
                ):
                    await untrusting.get(f"{agent_url}/healthz")
            async with httpx.AsyncClient(timeout=10) as plain:
                with pytest.raises(httpx.HTTPError):
                    await plain.get(agent_url.replace("https://", "http://") + "/healthz")

            ok = await asyncio.to_thread(
                admin_cli,
                "--url",
                ctl_url,
                "--token",
                ADMIN_TOKEN,
                "--cacert",
                str(pki.ca),
                "-o",
                "json",
                "leader",
            )
            assert ok.check().json()["is_leader"] is True
            no_ca = await asyncio.to_thread(admin_cli, "--url", ctl_url, "--token", ADMIN_TOKEN, "leader")
            assert no_ca.returncode == 3 and "certificate" in no_ca.stderr.lower(), no_ca.describe()

    asyncio.run(scenario())


# ---------------------------------------------------------------------------------------------- ZooKeeper


def test_zookeeper_digest_from_the_settings_protects_what_a_session_creates(
    zk_hosts: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    digest = "trimtab-test:" + secrets.token_urlsafe(16)
    monkeypatch.setenv("TRIMTAB_ZOOKEEPER__AUTH_DIGEST", digest)  # a SecretStr, kept out of config files
    s = load_settings(None, {"zookeeper": {"hosts": zk_hosts}})
    assert digest not in repr(s)
    zk = zk_session(s)
    zk.start()
    anon = KazooClient(hosts=zk_hosts, timeout=10)
    anon.start(timeout=15)
    try:
        assert zk.authenticated
        paths = ZkPaths(s.zk_path)
        zk.client.ensure_path(paths.admin)
        zk.client.create(paths.broker("b1:1"), b"{}", ephemeral=True, makepath=True)
        assert anon.get(paths.broker("b1:1"))[0] == b"{}"
        with pytest.raises(NoAuthError):
            anon.create(f"{paths.admin}/x", b"")
        with pytest.raises(NoAuthError):
            anon.set(paths.broker("b1:1"), b"[]")
        with pytest.raises(NoAuthError):
            anon.delete(paths.broker("b1:1"))
    finally:
        anon.stop()
        anon.close()
        zk.stop()


# ---------------------------------------------------------------------------------------------- Kafka


def test_kafka_client_settings_reach_every_client(
    zk_hosts: str, tmp_path: Path, kafka_cluster: KafkaCluster
) -> None:
    props = tmp_path / "kafka.properties"
    props.write_text(
        "# secrets belong here, not in the TOML\nclient.id = from-the-file\n! also a comment\nsocket.keepalive.enable=true\n"
    )
    s = agent_settings(
        zk_hosts,
        kafka={
            "bootstrap_servers": kafka_cluster.bootstrap_servers,
            "client_config": {"socket.nagle.disable": "true", "client.id": "from-the-toml"},
            "client_config_file": str(props),
        },
    )
    want = {"socket.nagle.disable": "true", "socket.keepalive.enable": "true", "client.id": "from-the-file"}

    def configured(t: Any) -> bool:
        assert isinstance(t, KafkaTransport), t
        configs = [
            t.producer_config(),
            t.reader_config(),
            t.reader_config(low_latency=False),
            t.metadata_config(),
            t.admin_config(),
        ]
        return all(want.items() <= c.items() for c in configs)

    assert configured(kafka_transport(s, "test"))

    async def build_both() -> tuple[list[Any], list[Any]]:
        w = agent_wiring.build(s)
        ctl = build_controller(s)
        try:
            a = w.agent
            agent_parts = [
                w.channel.transport,
                w.reporter.transport,
                a.replica.transport,
                a.loads.transport,
                a.replica.standby_view.transport,
            ]
            assert ctl.replica.top is not None
            ctl_parts = [
                ctl.replica.transport,
                ctl.channel.transport,
                ctl.replica.loads.transport,
                ctl.replica.top.transport,
                ctl.replica.standby_view.transport,
                ctl.snapshots.transport,
                ctl.snapshots.writer.transport,
                ctl.standbys.transport,
                ctl.events.transport,
            ]
            return agent_parts, ctl_parts
        finally:
            w.http.sock.close()
            ctl.http.sock.close()

    for parts in asyncio.run(build_both()):
        assert all(p is parts[0] for p in parts), "every part of a daemon shares its one Kafka transport"
        assert configured(parts[0])

    # Real clients accept them: metadata and admin (partitions), the producer, a reader.
    t = kafka_transport(s, "test")
    topic = f"sec-{secrets.token_hex(4)}"
    kafka_cluster.create_topics([topic])
    try:
        assert t.partitions(topic) == 4
        t.produce(topic, b"k", b"v").result(15)
        assert [(m.key, m.value) for m in read_all(t, topic, 15)] == [(b"k", b"v")]
    finally:
        t.close()
