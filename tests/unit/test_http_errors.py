"""One error shape for every trimtab API: ``{"error": str, "retryable": bool}`` -- for refusals, malformed
JSON, failed validation, unknown routes, a follower asked to act, and unexpected failures alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel, Field

from trimtab.cluster.http_errors import install_error_handlers
from trimtab.errors import LookupTimeout, NotLeader, RequestError

ROOT = Path(__file__).resolve().parents[2]


class Body(BaseModel):
    bundle: str
    count: int = Field(ge=1)


@pytest.fixture
def client() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/typed")
    async def typed(body: Body) -> dict[str, Any]:
        return {"ok": body.count}

    @app.get("/refused")
    async def refused() -> None:
        raise RequestError(409, "bundle is in flight")

    @app.get("/timeout")
    async def timeout() -> None:
        raise LookupTimeout("t/ns/0x00000000_0xffffffff did not settle within 30s")

    @app.get("/follower")
    async def follower() -> None:
        raise NotLeader("http://leader:8080")

    @app.get("/no-leader")
    async def no_leader() -> None:
        raise NotLeader(None)

    @app.get("/bug")
    async def bug() -> None:
        raise KeyError("boom")

    return TestClient(app, raise_server_exceptions=False, follow_redirects=False)


def body(r: Any) -> dict[str, Any]:
    out = r.json()
    assert set(out) == {"error", "retryable"}, out
    assert isinstance(out["error"], str) and out["error"] and isinstance(out["retryable"], bool)
    return dict(out)


def test_malformed_json_is_400_in_the_one_shape(client: TestClient) -> None:
    r = client.post(
        "/typed", content=b'{"bundle": "x", "count": ', headers={"content-type": "application/json"}
    )
    assert r.status_code == 400
    b = body(r)
    assert "not valid JSON" in b["error"] and not b["retryable"]


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        ({"count": 1}, "bundle"),
        ({"bundle": "x", "count": 0}, "count"),
        ({"bundle": "x", "count": "many"}, "count"),
    ],
)
def test_validation_failures_are_400_naming_the_field(
    client: TestClient, payload: dict[str, Any], where: str
) -> None:
    r = client.post("/typed", json=payload)
    assert r.status_code == 400
    b = body(r)
    assert b["error"].startswith("bad request: ") and where in b["error"] and not b["retryable"]


def test_refusals_timeouts_routes_and_bugs(client: TestClient) -> None:
    r = client.get("/refused")
    assert r.status_code == 409 and body(r) == {"error": "bundle is in flight", "retryable": False}
    r = client.get("/timeout")
    assert r.status_code == 503 and body(r)["retryable"]
    r = client.get("/no-such-route")
    assert r.status_code == 404 and not body(r)["retryable"]
    r = client.post("/refused")
    assert r.status_code == 405 and not body(r)["retryable"]
    r = client.get("/bug")
    assert r.status_code == 500 and body(r)["retryable"] and "KeyError" in body(r)["error"]


def test_a_follower_redirects_to_the_leader_or_says_there_is_none(client: TestClient) -> None:
    r = client.get("/follower")
    assert r.status_code == 307 and r.headers["location"] == "http://leader:8080/follower"
    r = client.get("/no-leader")
    assert r.status_code == 503 and body(r)["retryable"]


@pytest.mark.parametrize("spec", ["agent-openapi.json", "controller-openapi.json", "webhook-openapi.json"])
def test_the_published_specs_document_400_not_fastapis_422(spec: str) -> None:
    doc = json.loads((ROOT / "docs" / spec).read_text())
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    assert "ErrorBody" in doc["components"]["schemas"]
    for ops in doc["paths"].values():
        for op in ops.values():
            assert "422" not in op["responses"], op.get("summary")
