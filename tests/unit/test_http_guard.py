"""The HTTP guard's request layer (cluster/http_guard.py) on a real FastAPI app, driven through ASGI
directly: what it answers, and -- the point of it -- what it does *not* read."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from fastapi import APIRouter, FastAPI
from pydantic import BaseModel

from trimtab.cluster.auth import ADMIN, PUBLIC, Authenticator, StaticToken, secure_app
from trimtab.cluster.http_errors import install_error_handlers
from trimtab.cluster.http_guard import MAX_BODY, BoundedApp, Limits, Refusals, json_too_deep
from trimtab.cluster.logs import RefusalLog

TOKEN = "t" * 24


class Body(BaseModel):
    x: Any = None


def make_app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    admin = APIRouter(dependencies=[ADMIN])

    @admin.post("/v1/admin/thing")
    async def thing(b: Body) -> dict[str, Any]:
        return {"got": b.x}

    @admin.post("/v1/admin/big", openapi_extra={MAX_BODY: 1 << 20})
    async def big(b: Body) -> dict[str, Any]:
        return {"n": len(b.x)}

    public = APIRouter(dependencies=[PUBLIC])

    @public.get("/v1/open")
    async def open_() -> dict[str, bool]:
        return {"ok": True}

    app.include_router(admin)
    app.include_router(public)
    secure_app(app, Authenticator(required=True, admin=[StaticToken(TOKEN.encode())]))
    return app


class Exchange:
    """One request through ``BoundedApp``: the body is handed over in ``chunks`` (None: the client stalls
    after them; "disconnect": it goes away), and every ``receive`` the guard makes is counted."""

    def __init__(self, chunks: list[bytes], then: str = "end") -> None:
        self.chunks = list(chunks)
        self.then = then
        self.reads = 0
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        self.reads += 1
        if self.chunks:
            chunk = self.chunks.pop(0)
            more = bool(self.chunks) or self.then != "end"
            return {"type": "http.request", "body": chunk, "more_body": more}
        if self.then == "disconnect":
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()  # the client stalls
        raise AssertionError("unreachable")

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int | None:
        starts = [m for m in self.sent if m["type"] == "http.response.start"]
        return starts[0]["status"] if starts else None

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(next(m for m in self.sent if m["type"] == "http.response.start")["headers"])

    @property
    def json(self) -> Any:
        return orjson.loads(
            b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")
        )


def run(
    guard: BoundedApp, method: str, path: str, ex: Exchange, headers: dict[str, str] | None = None
) -> Exchange:
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
        "scheme": "http",
        "http_version": "1.1",
        "root_path": "",
    }
    call: Callable[[], Awaitable[None]] = lambda: guard(scope, ex.receive, ex.send)  # noqa: E731
    asyncio.run(call())
    return ex


@pytest.fixture
def guard() -> BoundedApp:
    return BoundedApp(make_app(), Limits(max_body_bytes=4096, body_timeout_s=0.3), Refusals())


AUTH = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}


def test_no_token_is_refused_before_any_byte_of_the_body_is_read(guard: BoundedApp) -> None:
    ex = run(guard, "POST", "/v1/admin/thing", Exchange([b"{" * 10]), {"content-length": str(10**8)})
    assert ex.status == 401 and ex.reads == 0
    assert ex.headers[b"connection"] == b"close" and ex.headers[b"www-authenticate"].startswith(b"Bearer")
    assert ex.json == {"error": ex.json["error"], "retryable": False}


def test_a_declared_length_over_the_limit_is_refused_unread(guard: BoundedApp) -> None:
    ex = run(guard, "POST", "/v1/admin/thing", Exchange([b"x"]), {**AUTH, "content-length": "4097"})
    assert ex.status == 413 and ex.reads == 0 and ex.headers[b"connection"] == b"close"
    ex = run(guard, "POST", "/v1/admin/thing", Exchange([b"x"]), {**AUTH, "content-length": "12abc"})
    assert ex.status == 400 and ex.reads == 0


def test_a_streamed_body_is_cut_at_the_limit(guard: BoundedApp) -> None:
    ex = run(guard, "POST", "/v1/admin/thing", Exchange([b"[" * 1000] * 100), AUTH)
    assert ex.status == 413 and ex.reads == 5  # 5 000 bytes read: one chunk past 4 096, then no more


def test_a_route_may_declare_a_larger_limit(guard: BoundedApp) -> None:
    payload = orjson.dumps({"x": "y" * 100_000})
    ex = run(guard, "POST", "/v1/admin/big", Exchange([payload[:50_000], payload[50_000:]]), AUTH)
    assert ex.status == 200 and ex.json == {"n": 100_000}


def test_a_body_that_stops_arriving_gets_408(guard: BoundedApp) -> None:
    ex = run(guard, "POST", "/v1/admin/thing", Exchange([b'{"x": '], then="stall"), AUTH)
    assert ex.status == 408 and ex.headers[b"connection"] == b"close" and ex.json["retryable"] is True


def test_a_client_gone_mid_body_gets_no_answer_and_no_error(guard: BoundedApp) -> None:
    ex = run(guard, "POST", "/v1/admin/thing", Exchange([b'{"x": '], then="disconnect"), AUTH)
    assert ex.sent == []


def test_deep_json_is_400_and_good_json_reaches_the_route(guard: BoundedApp) -> None:
    ex = run(guard, "POST", "/v1/admin/thing", Exchange([b"[" * 40 + b"]" * 40]), AUTH)
    assert ex.status == 400 and "nested deeper than 32" in ex.json["error"]
    ex = run(guard, "POST", "/v1/admin/thing", Exchange([b'{"x": ', b"[1, 2]}"]), AUTH)
    assert ex.status == 200 and ex.json == {"got": [1, 2]}


def test_public_routes_need_no_token_and_unknown_routes_still_404(guard: BoundedApp) -> None:
    assert run(guard, "GET", "/v1/open", Exchange([b""])).status == 200
    assert run(guard, "GET", "/v1/nowhere", Exchange([b""])).status == 404
    # A wrong method on an admin path: the token first, as for the route itself.
    assert run(guard, "GET", "/v1/admin/thing", Exchange([b""])).status == 401


def test_refusals_are_counted_by_reason() -> None:
    refusals = Refusals.in_registry(__import__("prometheus_client").CollectorRegistry())
    guard = BoundedApp(make_app(), Limits(max_body_bytes=4096), refusals)
    run(guard, "POST", "/v1/admin/thing", Exchange([b"x"]), {**AUTH, "content-length": "5000"})
    run(guard, "POST", "/v1/admin/thing", Exchange([b"[" * 40 + b"]" * 40]), AUTH)
    assert refusals.counter is not None
    assert refusals.counter.labels("body_too_large")._value.get() == 1
    assert refusals.counter.labels("json_too_deep")._value.get() == 1


@pytest.mark.parametrize(
    ("body", "depth", "want"),
    [
        (b"1", 1, False),
        (b"[]", 1, False),
        (b"[[]]", 1, True),
        (b'{"a": [1, {"b": 2}]}', 3, False),
        (b'{"a": [1, {"b": 2}]}', 2, True),
        (b"[" * 5000 + b"]" * 5000, 32, True),  # past the decoder's own recursion bound
        (b"not json", 32, None),
        (b"[1, 2", 32, None),
    ],
)
def test_json_depth(body: bytes, depth: int, want: bool | None) -> None:
    assert json_too_deep(body, depth) is want


def test_refusal_log_summarises_what_it_does_not_log_one_by_one() -> None:
    now = [0.0]
    lines: list[tuple[str, dict[str, Any]]] = []
    pending: list[Callable[[], None]] = []
    rl = RefusalLog(
        "x_refused",
        burst=3,
        interval_s=60,
        clock=lambda: now[0],
        schedule=lambda _delay, fn: pending.append(fn),
        emit=lambda event, **kw: lines.append((event, kw)),
    )
    for i in range(10):
        rl("missing", client=f"10.0.0.{i % 2}")
    rl("invalid", client="10.0.0.9")
    assert [e for e, _ in lines] == ["x_refused"] * 4  # 3 of "missing", 1 of "invalid"
    assert len(pending) == 1
    now[0] = 60.0
    pending.pop()()
    event, fields = lines[-1]
    assert event == "x_refused_summary"
    assert fields["not_logged_individually"] == {"missing": 7}
    assert fields["top_clients"] == {"10.0.0.1": 4, "10.0.0.0": 3}  # refusals 3..9: odd ones from .1
    rl("missing", client="10.0.0.1")  # a new window: logged one by one again
    assert lines[-1][0] == "x_refused"


def test_forwarded_headers_are_believed_only_from_configured_proxies() -> None:
    from pydantic import ValidationError

    from trimtab.cluster.http import server_config
    from trimtab.config.settings import HttpSettings

    plain = server_config(make_app(), HttpSettings(), Refusals())
    assert plain.proxy_headers is False
    proxied = server_config(
        make_app(), HttpSettings(trusted_proxies=["10.1.0.0/16", "192.0.2.7"]), Refusals()
    )
    assert proxied.proxy_headers is True and proxied.forwarded_allow_ips == ["10.1.0.0/16", "192.0.2.7"]
    with pytest.raises(ValidationError, match="not an IP address or CIDR network"):
        HttpSettings(trusted_proxies=["proxy.example"])


def test_every_app_is_served_without_slash_redirects() -> None:
    from trimtab.cluster.http import server_config
    from trimtab.config.settings import HttpSettings

    app = make_app()
    server_config(app, HttpSettings(), Refusals())
    assert app.router.redirect_slashes is False


def test_a_write_to_a_closed_connection_is_dropped_on_uvloop_as_on_asyncio() -> None:
    """uvloop's transports raise on a write once closed (asyncio's drop it), and uvicorn writes a response
    without asking: a client gone, or cut off by the guard, between a handler's start and its answer made
    the handler fail (seen in the hostile-client suite). The guard's transport drops such writes."""
    import socket

    import uvloop

    from trimtab.cluster.http_guard import _Writes

    async def main() -> None:
        loop = asyncio.get_running_loop()
        made: asyncio.Future[asyncio.Transport] = loop.create_future()
        lost: asyncio.Future[None] = loop.create_future()

        class Server(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                made.set_result(transport)  # type: ignore[arg-type]

            def connection_lost(self, exc: Exception | None) -> None:
                lost.set_result(None)

        server = await loop.create_server(Server, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            transport = await made
            transport.close()
            await lost  # closed for good (until then uvloop still buffers a write)
            with pytest.raises(RuntimeError):
                transport.write(b"late")  # what uvicorn did
            _Writes(transport).write(b"late")  # what it does now: nothing
            assert _Writes(transport).is_closing()
        server.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
