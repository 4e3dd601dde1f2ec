"""Every route raises; one handler per app renders (issue 30, point 4): what each kind of failure answers,
the one 400 of a bad bundle name on every API, and the controller's forwarded admin operations raising the
agent's refusal instead of returning ``(status, body)``.

(tests/unit/test_http_errors.py has the error shape itself: malformed JSON, validation, 404/405, 307.)
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from trimtab.agent.adapters.simulated import SimulatedBroker
from trimtab.agent.adapters.webhook_server import create_app as webhook_app
from trimtab.agent.api import create_app as agent_app
from trimtab.balance.assign import BrokerInfo
from trimtab.channel.intents import IntentRefused
from trimtab.cluster.auth import Authenticator
from trimtab.cluster.http import PeerHttp
from trimtab.cluster.http_errors import install_error_handlers
from trimtab.config.settings import SimulationSettings
from trimtab.controller.admin import Admin
from trimtab.controller.api import create_app as controller_app
from trimtab.controller.metrics import ControllerMetrics
from trimtab.errors import (
    AuthRefused,
    NamespaceUnreadable,
    RequestError,
    TransportError,
    ZkAccessDenied,
    ZkConflict,
    ZkUnavailable,
    ZnodeUnreadable,
)

ROOT = Path(__file__).resolve().parents[2]
BAD_BUNDLE = "acme/orders/0x00000000_0xzzzzzzzz"


def body(r: httpx.Response) -> dict[str, Any]:
    out = r.json()
    assert set(out) == {"error", "retryable"}, out
    return dict(out)


# ---------------------------------------------------------------------------------------------- the handler
FAILURES: list[tuple[str, Exception, int, bool, str]] = [
    ("zk_unavailable", ZkUnavailable("ZooKeeper session is lost"), 503, True, "ZooKeeper session is lost"),
    ("zk_conflict", ZkConflict("/x kept changing; try again"), 503, True, "/x kept changing; try again"),
    ("unreadable", ZnodeUnreadable("/x is unreadable (bad: json)"), 500, False, "it was left as it is"),
    ("ns_unreadable", NamespaceUnreadable("namespace a/b: unreadable"), 500, False, "left as it is"),
    ("zk_denied", ZkAccessDenied("ZooKeeper refused ... on /x"), 500, False, "refused ... on /x"),
    ("unmapped", TransportError("kafka is down"), 500, True, "internal error (TransportError)"),
    (
        "moved",
        IntentRefused("release", None, "the bundle is not owned by b1:1"),
        409,
        False,
        "cannot release",
    ),
]


@pytest.fixture
def client() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)
    for name, exc, *_ in FAILURES:
        app.add_api_route(f"/{name}", _raiser(exc))
    app.add_api_route("/limited", _raiser(RequestError(429, "slow down", headers={"Retry-After": "2"})))
    app.add_api_route("/no-token", _raiser(AuthRefused(401, "no token", reason="missing")))
    return TestClient(app, raise_server_exceptions=False)


def _raiser(exc: Exception) -> Any:
    async def route() -> None:
        raise exc

    return route


@pytest.mark.parametrize(("name", "status", "retryable", "needle"), [(f[0], *f[2:]) for f in FAILURES])
def test_a_trimtab_error_answers_its_status_in_the_one_shape(
    client: TestClient, name: str, status: int, retryable: bool, needle: str
) -> None:
    r = client.get(f"/{name}")
    assert r.status_code == status and body(r)["retryable"] is retryable, r.text
    assert needle in body(r)["error"]


def test_a_refusal_carries_its_headers(client: TestClient) -> None:
    r = client.get("/limited")
    assert r.status_code == 429 and r.headers["retry-after"] == "2" and body(r)["retryable"]
    r = client.get("/no-token")
    assert r.status_code == 401 and r.headers["www-authenticate"] == 'Bearer realm="trimtab"'
    assert not body(r)["retryable"]
    r = client.post("/limited")  # a method the route does not take: HTTP says which it does
    assert r.status_code == 405 and r.headers["allow"] == "GET"


@pytest.mark.parametrize(
    ("status", "retryable"), [(400, False), (408, True), (429, True), (500, False), (503, True)]
)
def test_a_refusal_is_retryable_by_its_status_unless_it_says(status: int, retryable: bool) -> None:
    assert RequestError(status, "x").retryable is retryable
    assert RequestError(status, "x", retryable=not retryable).retryable is not retryable


# ---------------------------------------------------------------------------------------------- one 400
def test_a_bad_bundle_name_is_the_same_400_on_every_api() -> None:
    """One parser, one refusal: the agent, the controller and the broker webhook answer a bad bundle name
    alike, before they look at anything else (the apps are built without a daemon behind them)."""
    no_auth = Authenticator.disabled()
    apps = {
        "agent": (
            agent_app(None, auth=no_auth),
            [("GET", "/v1/bundles", None), ("POST", "/v1/admin/split", {})],
        ),  # type: ignore[arg-type]
        "controller": (
            controller_app(None, auth=no_auth),  # type: ignore[arg-type]
            [
                ("GET", "/v1/bundles", None),
                ("POST", "/v1/admin/transfer", {"broker": "b:1"}),
                ("POST", "/v1/admin/unload", {}),
                ("POST", "/v1/admin/split", {}),
            ],
        ),
        "webhook": (
            webhook_app(SimulatedBroker("b", SimulationSettings())),
            [("POST", "/trimtab/v1/bundles/fence", {})],
        ),
    }
    answers = set()
    for name, (app, calls) in apps.items():
        with TestClient(app, raise_server_exceptions=False) as http:
            for method, path, extra in calls:
                if extra is None:
                    r = http.request(method, path, params={"bundle": BAD_BUNDLE})
                else:
                    r = http.request(method, path, json={"bundle": BAD_BUNDLE, **extra})
                assert r.status_code == 400, (name, path, r.text)
                answers.add((body(r)["error"], body(r)["retryable"]))
    assert len(answers) == 1, answers
    ((error, retryable),) = answers
    assert BAD_BUNDLE in error and "0xLLLLLLLL_0xUUUUUUUU" in error and not retryable


# ---------------------------------------------------------------------------------------------- forwarded admin
class _Agent:
    """The owner's agent as the controller reaches it: answers ``POST`` with ``status`` and ``answer``."""

    def __init__(self, status: int, answer: Any) -> None:
        self.status = status
        self.answer = answer
        self.posted: list[tuple[str, Any]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # the dry-run check reads the agent's spec: it declares dry_run
            return httpx.Response(200, json=_spec_declaring_dry_run())
        self.posted.append((request.url.path, request.content))
        return httpx.Response(self.status, json=self.answer)


def _spec_declaring_dry_run() -> dict[str, Any]:
    body = {"requestBody": {"content": {"application/json": {"schema": {"properties": {"dry_run": {}}}}}}}
    return {"paths": {"/v1/admin/split": {"post": body}, "/v1/admin/drain": {"post": body}}}


class _Peers(PeerHttp):
    def __init__(self, agent: _Agent) -> None:
        super().__init__()
        self.agent = agent

    def client(self, timeout: float) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.agent.handle), timeout=timeout)


def _admin(agent: _Agent, journal: list[str]) -> Admin:
    owner = BrokerInfo(id="b1:1", service_url="pulsar://b1:6650", http_url="http://b1:1")
    record = SimpleNamespace(owner=lambda: "b1:1", state=SimpleNamespace(value="owned"))
    fakes: dict[str, Any] = {
        "table": SimpleNamespace(get=lambda bundle: record),
        "leadership": SimpleNamespace(require_leader=lambda: None),
        "registry": SimpleNamespace(brokers={"b1:1": owner}),
        "writes": None,
        "journal": SimpleNamespace(record=lambda kind, **kw: journal.append(kind)),
        "metrics": ControllerMetrics.create(CollectorRegistry()),
        "switch_store": None,
        "shedding": None,
        "placement": None,
        "operations": None,  # splits are forwarded to the owner's agent: the leader's operations play no part
        "destinations": None,
    }
    return Admin(**cast(dict[str, Any], fakes), peers=_Peers(agent))


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_forwarded_operation_returns_the_agents_answer(dry_run: bool) -> None:
    journal: list[str] = []
    agent = _Agent(200 if dry_run else 202, {"bundle": "a/b/0x00000000_0xffffffff", "children": ["x", "y"]})
    admin = _admin(agent, journal)
    got = asyncio.run(admin.split("a/b/0x00000000_0xffffffff", {"dry_run": dry_run}))
    assert got == agent.answer


@pytest.mark.parametrize(
    ("status", "answer", "retryable"),
    [
        (409, {"error": "a/b/0x00000000_0xffffffff is not owned by this broker", "retryable": False}, False),
        (503, {"error": "a/b/0x00000000_0xffffffff is releasing here; retry", "retryable": True}, True),
        (422, {"error": "range_equally_divide found no split boundary", "retryable": False}, False),
    ],
)
def test_an_agents_refusal_is_raised_as_it_gave_it(
    status: int, answer: dict[str, Any], retryable: bool
) -> None:
    journal: list[str] = []
    admin = _admin(_Agent(status, answer), journal)
    with pytest.raises(RequestError) as split:
        asyncio.run(admin.split("a/b/0x00000000_0xffffffff", {"dry_run": False}))
    e = split.value
    assert (e.status, str(e), e.retryable) == (status, answer["error"], retryable)
    assert journal == []  # a refused split is no decision


def test_an_answer_not_in_the_error_shape_is_named() -> None:
    admin = _admin(_Agent(418, ["not", "an", "error"]), [])
    with pytest.raises(RequestError) as e:
        asyncio.run(admin.split("a/b/0x00000000_0xffffffff", {"dry_run": False}))
    assert e.value.status == 418 and "b1:1's agent answered 418" in str(e.value) and "not" in str(e.value)


# ---------------------------------------------------------------------------------------------- nothing else
def test_no_route_builds_an_error_body_by_hand() -> None:
    """``error_response`` is for the ASGI layers in front of the apps (they cannot raise into the handler);
    a route raises. Nothing else imports it, nor returns a ``(status, body)`` of its own."""
    allowed = {"cluster/http_errors.py", "agent/adapters/webhook_server.py"}
    users = []
    for folder in ("agent", "controller", "cluster", "channel", "balance", "config"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            tree = ast.parse(path.read_text())
            names = {
                alias.name
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom)
                for alias in node.names
            }
            if "error_response" in names and rel not in allowed:
                users.append(rel)
    assert not users, f"build no error body by hand; raise a RequestError: {users}"
