"""HTTP plumbing shared by the daemons: embedding uvicorn in a process that owns its signals and event
loop, one error shape for every API, and the read-only routes and probes both the agent and the
controller serve."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import msgspec
import structlog
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from trimtab.balance.assign import BrokerInfo
from trimtab.balance.load import BrokerLoadData
from trimtab.channel.records import Record
from trimtab.errors import NotLeader, RequestError

log = structlog.get_logger("trimtab.http")


# ------------------------------------------------------------------ one error shape
class ErrorBody(BaseModel):
    """Every error any trimtab API answers: what went wrong, and whether the same request may succeed
    later (a timeout, no leader yet) or never will (bad input)."""

    error: str
    retryable: bool = False


def error_response(status: int, message: str, *, retryable: bool = False) -> JSONResponse:
    return JSONResponse(ErrorBody(error=message, retryable=retryable).model_dump(), status_code=status)


def _validation_message(exc: RequestValidationError) -> str:
    """One line per problem, ``where: what`` -- the shape of a config error, not FastAPI's 422 list."""
    parts = []
    for e in exc.errors():
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        if e.get("type") == "json_invalid":
            ctx = e.get("ctx") or {}
            parts.append(f"the request body is not valid JSON ({ctx.get('error', e.get('msg', ''))})")
        else:
            parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    return "bad request: " + "; ".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    """Make every failure of ``app`` answer ``{"error": ..., "retryable": ...}``: a
    :class:`~trimtab.errors.RequestError` with its status; malformed JSON and failed validation with 400
    (FastAPI would say 422 in another shape); unknown routes and methods with their 404/405; a follower
    asked to act for the leader with a 307 to the leader (503 while there is none); anything unexpected
    with 500, logged with its traceback."""

    @app.exception_handler(NotLeader)
    async def not_leader(request: Request, exc: NotLeader) -> Response:
        if exc.leader_url is None:
            return error_response(exc.status, str(exc), retryable=True)
        # 307 keeps the method and the body: any controller address works for admin writes.
        # The query string goes along: it can change what a write does (?dry_run, ?unload_scope).
        query = f"?{request.url.query}" if request.url.query else ""
        return RedirectResponse(exc.leader_url + request.url.path + query, status_code=307)

    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError) -> Response:
        return error_response(exc.status, str(exc), retryable=exc.retryable)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        return error_response(400, _validation_message(exc))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        return error_response(exc.status_code, str(exc.detail), retryable=exc.status_code >= 500)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        log.error("http_handler_failed", path=request.url.path, error=repr(exc), exc_info=exc)
        return error_response(
            500, f"internal error ({type(exc).__name__}); see the node's log", retryable=True
        )

    def openapi() -> dict[str, Any]:
        """The spec as the API really answers: 400 with ErrorBody where FastAPI would document 422."""
        if app.openapi_schema is None:
            spec = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            schemas = spec.setdefault("components", {}).setdefault("schemas", {})
            schemas.pop("HTTPValidationError", None)
            schemas.pop("ValidationError", None)
            schemas["ErrorBody"] = ErrorBody.model_json_schema()
            bad_request = {
                "description": "Bad request: malformed JSON, a missing or invalid field",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
            }
            for ops in spec.get("paths", {}).values():
                for op in ops.values():
                    responses = op.get("responses", {})
                    if responses.pop("422", None) is not None:
                        responses.setdefault("400", bad_request)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The daemon handles SIGTERM itself (drain first); uvicorn must not swallow it.
        yield


def bind(host: str, port: int) -> socket.socket:
    """Bind before anything else so a port of 0 resolves to a real one (the broker id may depend on it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must be IPPROTO_TCP (not 0): asyncio only turns Nagle off (TCP_NODELAY) on accepted sockets
    # whose proto says TCP, and uvicorn writes a response's headers and body separately -- with Nagle on,
    # the body waits for the client's delayed ACK, ~40 ms on every request.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class HttpServer:
    def __init__(self, app: FastAPI, sock: socket.socket) -> None:
        self.sock = sock
        config = uvicorn.Config(
            app, log_config=None, access_log=False, lifespan="off", timeout_graceful_shutdown=3
        )
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(sockets=[self.sock]), name="http")

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, 5)


# ------------------------------------------------------------------ routes both daemons serve
def ownership_view(
    items: Iterable[tuple[str, Record]], broker: str | None, namespace: str | None
) -> dict[str, Any]:
    """``GET /v1/ownership``: bundle -> record, optionally of one owner or one namespace."""
    out = {}
    for k, r in sorted(items):
        if broker is not None and r.owner() != broker:
            continue
        if namespace is not None and not k.startswith(namespace + "/"):
            continue
        out[k] = r.to_json()
    return {"bundles": out, "count": len(out)}


def brokers_view(brokers: Mapping[str, BrokerInfo], loads: Mapping[str, BrokerLoadData]) -> dict[str, Any]:
    """``GET /v1/brokers``: every live broker's registration and latest load report."""
    return {
        "brokers": {
            k: {"info": msgspec.to_builtins(v), "load": msgspec.to_builtins(loads[k]) if k in loads else None}
            for k, v in sorted(brokers.items())
        }
    }


def add_probes(
    app: FastAPI,
    *,
    tick_age: Callable[[], float],
    started: Callable[[], bool],
    ready: Callable[[], tuple[bool, dict[str, Any]]],
    registry: Callable[[], CollectorRegistry],
    ready_summary: str,
) -> None:
    """``/healthz`` (the event loop is ticking), ``/readyz`` (the daemon's own criteria) and ``/metrics``."""

    @app.get("/healthz", summary="Liveness: the event loop is ticking")
    async def healthz() -> Any:
        age = tick_age()
        ok = age < 10 or not started()
        return JSONResponse({"ok": ok, "tick_age_s": round(age, 2)}, status_code=200 if ok else 503)

    @app.get("/readyz", summary=ready_summary)
    async def readyz() -> Any:
        ok, body = ready()
        return JSONResponse({"ready": ok, **body}, status_code=200 if ok else 503)

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics() -> Response:
        return PlainTextResponse(generate_latest(registry()), media_type=CONTENT_TYPE_LATEST)
