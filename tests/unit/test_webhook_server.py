"""The reference broker's front door (agent/adapters/webhook_server.py, ``SignedCalls``): bounded bodies
(413 without reading the rest), a client that hangs up mid-body is no error, signatures verified before any
route runs and refusals counted; and the agent's WebhookAdapter against it in process (signs the target it
really sends, for its broker id; splits large renewals)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import orjson
import pytest
import structlog
from fastapi.testclient import TestClient
from starlette.types import Message, Receive, Scope, Send

from trimtab.agent.adapters.base import Lease
from trimtab.agent.adapters.signing import BROKER, NONCE, SIGNATURE, TIMESTAMP, Signer, Verifier, sign
from trimtab.agent.adapters.simulated import SimulatedBroker
from trimtab.agent.adapters.webhook import WebhookAdapter
from trimtab.agent.adapters.webhook_server import REFUSALS, SignedCalls, create_app, request_target
from trimtab.config.settings import SimulationSettings
from trimtab.errors import AdapterError

KEY = b"0123456789abcdef0123456789abcdef"
ME = "broker-1:6650"
B1 = "public/default/0x00000000_0x40000000"
B2 = "public/default/0x40000000_0x80000000"
CLOSE = "/trimtab/v1/bundles/close"


def lease() -> Lease:
    return Lease(30.0, int((time.time() + 60) * 1000))


def scope(
    method: str = "POST",
    path: str = CLOSE,
    headers: list[tuple[bytes, bytes]] | None = None,
    query: bytes = b"",
) -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "headers": headers or [],
    }


class Inner:
    """The app behind the middleware: records what reached it."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        self.bodies.append(message["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def feed(*messages: Message) -> Receive:
    queue = list(messages)

    async def receive() -> Message:
        if not queue:
            raise AssertionError("the middleware read past what the client sent")
        return queue.pop(0)

    return receive


def run(mw: SignedCalls, sc: dict[str, Any], receive: Receive) -> list[Message]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(mw(sc, receive, send))
    return sent


def status_and_body(sent: list[Message]) -> tuple[int, dict[str, Any]]:
    return sent[0]["status"], orjson.loads(b"".join(m.get("body", b"") for m in sent[1:]))


# ---------------------------------------------------------------------------------------------- SignedCalls
def test_a_client_that_hangs_up_mid_body_gets_no_answer_and_is_no_error() -> None:
    inner, gone = Inner(), []
    mw = SignedCalls(inner, verifier=None, on_disconnect=lambda: gone.append(1))
    receive = feed(
        {"type": "http.request", "body": b"x" * 10, "more_body": True}, {"type": "http.disconnect"}
    )
    with structlog.testing.capture_logs() as logs:
        sent = run(mw, scope(headers=[(b"content-length", b"100")]), receive)
    assert sent == [] and inner.bodies == [] and gone == [1]
    # At most a debug line (filtered out when another test configured logging at info and up).
    assert all(e["log_level"] == "debug" for e in logs), logs


def test_a_declared_body_over_the_bound_is_refused_before_a_byte_is_read() -> None:
    inner, refused = Inner(), list[str]()
    mw = SignedCalls(inner, verifier=None, max_body=1000, on_refused=refused.append)
    sent = run(mw, scope(headers=[(b"content-length", b"1001")]), feed())  # feed(): any read fails
    status, body = status_and_body(sent)
    assert status == 413 and "1000 bytes" in body["error"] and refused == ["too_large"]
    assert (b"connection", b"close") in sent[0]["headers"] and inner.bodies == []


def test_a_streamed_body_is_cut_off_as_soon_as_it_passes_the_bound() -> None:
    inner = Inner()
    mw = SignedCalls(inner, verifier=None, max_body=1000)
    chunk = {"type": "http.request", "body": b"x" * 600, "more_body": True}
    sent = run(mw, scope(), feed(chunk, chunk))  # a third read would fail the test
    assert status_and_body(sent)[0] == 413 and inner.bodies == []
    # At the bound exactly, the body goes through whole.
    last = {"type": "http.request", "body": b"x" * 400, "more_body": False}
    sent = run(mw, scope(), feed(chunk, last))
    assert sent[0]["status"] == 200 and inner.bodies == [b"x" * 1000]


def signed(path: str = CLOSE, body: bytes = b"{}", broker: str = ME, query: bytes = b"") -> dict[str, Any]:
    target = path + ("?" + query.decode() if query else "")
    h = Signer(KEY, broker).headers("POST", target, body)
    return scope(path=path, headers=[(k.lower().encode(), v.encode()) for k, v in h.items()], query=query)


def body_of(raw: bytes) -> Receive:
    return feed({"type": "http.request", "body": raw, "more_body": False})


def test_signatures_are_verified_before_the_app_sees_the_call() -> None:
    inner, refused = Inner(), list[str]()
    mw = SignedCalls(inner, verifier=Verifier(KEY, ME), on_refused=refused.append)
    good = signed()
    assert run(mw, good, body_of(b"{}"))[0]["status"] == 200 and inner.bodies == [b"{}"]
    status, body = status_and_body(run(mw, good, body_of(b"{}")))  # the same call again
    assert status == 401 and "replayed" in body["error"] and not body["retryable"]
    assert status_and_body(run(mw, signed(), body_of(b"{ }")))[0] == 401  # another body
    assert status_and_body(run(mw, signed(broker="broker-2:6650"), body_of(b"{}")))[0] == 401
    assert status_and_body(run(mw, scope(), body_of(b"{}")))[0] == 401  # unsigned
    assert refused == ["replayed", "bad_signature", "wrong_broker", "missing_header"]
    assert inner.bodies == [b"{}"]


def test_the_query_string_is_signed_as_sent() -> None:
    inner = Inner()
    mw = SignedCalls(inner, verifier=Verifier(KEY, ME))
    with_query = signed(query=b"a=1&b=%2F")
    assert request_target(with_query) == CLOSE + "?a=1&b=%2F"
    assert run(mw, with_query, body_of(b"{}"))[0]["status"] == 200
    # A query added to a call signed without one: refused.
    plain = signed()
    assert status_and_body(run(mw, {**plain, "query_string": b"x=1"}, body_of(b"{}")))[0] == 401
    assert run(mw, plain, body_of(b"{}"))[0]["status"] == 200  # the genuine one still works


def test_a_signing_header_sent_twice_is_refused() -> None:
    mw = SignedCalls(Inner(), verifier=Verifier(KEY, ME))
    sc = signed()
    sc["headers"] = [*sc["headers"], (NONCE.lower().encode(), b"0" * 32)]
    status, body = status_and_body(run(mw, sc, body_of(b"{}")))
    assert status == 401 and "malformed_header" in body["error"]


def test_only_reads_of_the_spec_and_the_simulator_state_are_unsigned() -> None:
    inner = Inner()
    mw = SignedCalls(inner, verifier=Verifier(KEY, ME))
    for path in ("/trimtab/v1/sim/state", "/openapi.json"):
        assert run(mw, scope("GET", path), body_of(b""))[0]["status"] == 200
    assert run(mw, scope("POST", "/trimtab/v1/sim/state"), body_of(b""))[0]["status"] == 401
    assert run(mw, scope("GET", "/trimtab/v1/load"), body_of(b""))[0]["status"] == 401


# ---------------------------------------------------------------------------------------------- create_app
def test_the_reference_broker_acts_on_a_signed_call_once() -> None:
    broker = SimulatedBroker(ME, SimulationSettings())
    client = TestClient(create_app(broker, hmac_key=KEY))
    body = orjson.dumps({"bundle": B1, "lease_s": 30, "apply_by_ms": lease().apply_by_ms})
    h = {
        "content-type": "application/json",
        **Signer(KEY, ME).headers("POST", "/trimtab/v1/bundles/acquire", body),
    }
    r = client.post("/trimtab/v1/bundles/acquire", content=body, headers=h)
    assert r.status_code == 200, r.text
    r = client.post("/trimtab/v1/bundles/acquire", content=body, headers=h)
    assert r.status_code == 401 and "replayed" in r.json()["error"]
    assert r.headers["www-authenticate"].startswith("Trimtab-HMAC")
    state = client.get("/trimtab/v1/sim/state").json()
    assert state["serving"] == [B1] and state["calls"] == {"acquire": 1}
    assert set(state["refused_calls"]) == set(REFUSALS) and state["refused_calls"]["replayed"] == 1
    assert state["disconnected_calls"] == 0


def test_the_spec_documents_the_signing_headers_and_refusals() -> None:
    spec = create_app(SimulatedBroker("doc", SimulationSettings())).openapi()
    for path, ops in spec["paths"].items():
        for op in ops.values():
            if path.startswith("/trimtab/v1/sim/"):
                assert "401" not in op["responses"]
                continue
            names = {p["name"] for p in op.get("parameters", []) if p["in"] == "header"}
            assert names == {BROKER, TIMESTAMP, NONCE, SIGNATURE}, path
            assert {"401", "413", "503"} <= set(op["responses"]), path
    renew = spec["paths"]["/trimtab/v1/bundles/renew"]["post"]
    assert renew["x-max-body-bytes"] == 16 << 20


# ---------------------------------------------------------------------------------------------- the adapter
def adapter(app: Any, **kw: Any) -> WebhookAdapter:
    return WebhookAdapter("http://broker", 5, transport=httpx.ASGITransport(app=app), **kw)


def test_the_webhook_adapter_signs_for_its_broker_id() -> None:
    broker = SimulatedBroker(ME, SimulationSettings())
    app = create_app(broker, hmac_key=KEY)

    async def scenario() -> list[str]:
        a = adapter(app, hmac_key=KEY, broker_id=ME)
        wrong = adapter(app, hmac_key=KEY, broker_id="broker-2:6650")
        try:
            await a.acquire(B1, lease())
            await a.sample()
            with pytest.raises(AdapterError, match=r"HTTP 401.*wrong_broker"):
                await wrong.fence(B1)
            return await a.renew([B1, B2], lease())
        finally:
            await a.aclose()
            await wrong.aclose()

    assert asyncio.run(scenario()) == [B2]
    assert broker.snapshot()["serving"] == [B1]
    with pytest.raises(Exception, match="broker id"):
        WebhookAdapter("http://broker", 5, hmac_key=KEY)


def test_the_webhook_adapter_signs_the_target_it_really_sends() -> None:
    """A base URL with a path: the signature covers /prefix/trimtab/v1/..., what goes on the wire."""
    seen: list[str] = []
    verifier = Verifier(KEY, ME)

    def handler(request: httpx.Request) -> httpx.Response:
        target = request.url.raw_path.decode()
        seen.append(target)
        verifier.verify(dict(request.headers), request.method, target, request.content)
        return httpx.Response(200, json={"ok": True, "not_serving": []})

    async def scenario() -> None:
        a = WebhookAdapter(
            "http://broker/prefix", 5, hmac_key=KEY, broker_id=ME, transport=httpx.MockTransport(handler)
        )
        try:
            await a.fence(B1)
            await a.renew([B1], lease())
        finally:
            await a.aclose()

    asyncio.run(scenario())
    assert seen == ["/prefix/trimtab/v1/bundles/fence", "/prefix/trimtab/v1/bundles/renew"]


def test_a_renewal_too_large_for_one_body_is_split() -> None:
    broker = SimulatedBroker(ME, SimulationSettings())
    app = create_app(broker, hmac_key=KEY, max_body=2_000)
    bundles = [f"public/default/0x{i:08x}_0x{i + 1:08x}" for i in range(100)]  # ~4 KB of names

    async def scenario() -> list[str]:
        a = adapter(app, hmac_key=KEY, broker_id=ME, max_request_bytes=2_000)
        try:
            for b in bundles[:3]:
                await a.acquire(b, lease())
            return await a.renew(bundles, lease())
        finally:
            await a.aclose()

    assert asyncio.run(scenario()) == bundles[3:]
    assert broker.calls["renew"] >= 2  # several calls, each under the bound
    state = TestClient(app).get("/trimtab/v1/sim/state").json()
    assert state["refused_calls"]["too_large"] == 0


def test_an_unsigned_adapter_sends_no_signing_headers() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert not {h.lower() for h in (BROKER, TIMESTAMP, NONCE, SIGNATURE)} & set(request.headers.keys())
        return httpx.Response(200)

    async def scenario() -> None:
        a = WebhookAdapter("http://broker", 5, transport=httpx.MockTransport(handler))
        try:
            await a.close(B1, None)
        finally:
            await a.aclose()

    asyncio.run(scenario())


def test_signed_headers_are_exactly_the_contract() -> None:
    h = sign(KEY, ME, "POST", CLOSE, b"{}", ts_ms=1, nonce="0" * 32)
    assert list(h) == [BROKER, TIMESTAMP, NONCE, SIGNATURE]
