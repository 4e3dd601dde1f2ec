"""HTTP plumbing shared by the daemons: embedding uvicorn (optionally serving TLS) in a process that owns
its signals and event loop, one error shape for every API, the read-only routes and probes both the agent
and the controller serve, and how a node calls its peers (their CA, its own token)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import httpx
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
from trimtab.cluster.auth import CHALLENGE, PUBLIC, SCHEME_NAME, authorize_early
from trimtab.cluster.http_guard import BoundedApp, ConnectionBook, Limits, Refusals, protocol_class
from trimtab.config.settings import HttpSettings
from trimtab.errors import AuthRefused, ConfigError, NotLeader, RequestError

log = structlog.get_logger("trimtab.http")


# ------------------------------------------------------------------ one error shape
class ErrorBody(BaseModel):
    """Every error any trimtab API answers: what went wrong, and whether the same request may succeed
    later (a timeout, no leader yet) or never will (bad input)."""

    error: str
    retryable: bool = False


def error_response(
    status: int, message: str, *, retryable: bool = False, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        ErrorBody(error=message, retryable=retryable).model_dump(), status_code=status, headers=headers
    )


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
        headers = CHALLENGE if isinstance(exc, AuthRefused) and exc.status == 401 else None
        return error_response(exc.status, str(exc), retryable=exc.retryable, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        try:
            authorize_early(request)  # a malformed body is parsed before the token is checked
        except AuthRefused as refused:
            return await request_error(request, refused)
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
                    _document_auth(op)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
    }


def _document_auth(op: dict[str, Any]) -> None:
    """A protected operation documents its 401 (and, when it needs admin, its 403)."""
    scopes = {s for req in op.get("security") or [] for s in req.get(SCHEME_NAME, [])}
    if not scopes:
        return
    responses = op.setdefault("responses", {})
    responses.setdefault("401", _error("No bearer token, or one this node does not know"))
    if "admin" in scopes:
        responses.setdefault("403", _error("A read token: this operation needs an admin token"))


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


def check_tls_files(http: HttpSettings) -> None:
    """Raise :class:`ConfigError` (naming the setting and the path, never a key) unless ``http.tls_*``
    can serve TLS and trust peers: found at start-up, not on the first connection."""
    if http.tls_cert_file and http.tls_key_file:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(http.tls_cert_file, http.tls_key_file)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(
                f"http.tls_cert_file ({http.tls_cert_file}) / http.tls_key_file ({http.tls_key_file}): "
                f"cannot load the certificate and key ({type(e).__name__}: {getattr(e, 'strerror', None) or e})"
            ) from None
    if http.tls_ca_file:
        client_context(http.tls_ca_file)


def client_context(ca_file: str | None) -> ssl.SSLContext | bool:
    """What trimtab's own HTTP clients verify peers with: ``http.tls_ca_file``, else the system's CAs."""
    if not ca_file:
        return True
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(
            f"http.tls_ca_file ({ca_file}): cannot load the CA bundle ({type(e).__name__})"
        ) from None


class HttpServer:
    def __init__(
        self,
        app: FastAPI,
        sock: socket.socket,
        http: HttpSettings | None = None,
        *,
        refusals: Refusals | None = None,
    ) -> None:
        """Serve ``app`` on ``sock`` behind the HTTP guard (:mod:`trimtab.cluster.http_guard`: bounded
        bodies, read deadlines, a connection cap, the token checked before any body is read), with the
        limits of ``http`` (defaults when None); over TLS when it names a certificate and key. Refusals
        are counted in ``refusals`` (a daemon passes :meth:`Refusals.in_registry`)."""
        self.sock = sock
        http = http if http is not None else HttpSettings()
        check_tls_files(http)
        self.scheme = "https" if http.tls_cert_file else "http"
        self.config = server_config(app, http, refusals if refusals is not None else Refusals())
        self._server = _Server(self.config)
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


def server_config(app: FastAPI, http: HttpSettings, refusals: Refusals) -> uvicorn.Config:
    """uvicorn's configuration for ``app`` behind the guard: every trimtab process that serves HTTP (the
    daemons, ``trimtab sim-broker``) is built with it, so none serves without the limits."""
    limits = Limits.from_settings(http)
    app.router.redirect_slashes = False  # a redirect built from the Host header points wherever a client says
    return uvicorn.Config(
        BoundedApp(app, limits, refusals),
        http=protocol_class(ConnectionBook(limits, refusals)),
        ws="none",  # no WebSocket routes: an Upgrade request is an ordinary request
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=3,
        timeout_keep_alive=max(1, round(limits.keep_alive_timeout_s)),
        # Forwarded headers only from the proxies an operator names: anyone else could claim any address.
        proxy_headers=bool(http.trusted_proxies),
        forwarded_allow_ips=list(http.trusted_proxies) or None,
        server_header=False,
        ssl_certfile=http.tls_cert_file,
        ssl_keyfile=http.tls_key_file,
    )


# ------------------------------------------------------------------ calling peers
class PeerHttp:
    """How a node calls another node's API (a controller forwarding a split or a drain to an agent): over
    TLS verified with ``http.tls_ca_file``, presenting this node's own admin token (every node of a cluster
    accepts the same tokens: docs/security.md)."""

    def __init__(
        self, verify: ssl.SSLContext | bool = True, token: Callable[[], str | None] = lambda: None
    ) -> None:
        self.verify = verify
        self.token = token

    @classmethod
    def from_settings(cls, http: HttpSettings, token: Callable[[], str | None]) -> PeerHttp:
        return cls(client_context(http.tls_ca_file), token)

    def client(self, timeout: float) -> httpx.AsyncClient:
        """A client for one exchange (close it: ``async with``); the token is read now, so a rotated token
        file is followed without a restart."""
        token = self.token()
        headers = {"authorization": f"Bearer {token}"} if token else None
        return httpx.AsyncClient(timeout=timeout, verify=self.verify, headers=headers)


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

    # Public: orchestrators and Prometheus reach them without a secret, and they change nothing.
    @app.get("/healthz", summary="Liveness: the event loop is ticking", dependencies=[PUBLIC])
    async def healthz() -> Any:
        age = tick_age()
        ok = age < 10 or not started()
        return JSONResponse({"ok": ok, "tick_age_s": round(age, 2)}, status_code=200 if ok else 503)

    @app.get("/readyz", summary=ready_summary, dependencies=[PUBLIC])
    async def readyz() -> Any:
        ok, body = ready()
        return JSONResponse({"ready": ok, **body}, status_code=200 if ok else 503)

    @app.get("/metrics", summary="Prometheus metrics", dependencies=[PUBLIC])
    async def metrics() -> Response:
        return PlainTextResponse(generate_latest(registry()), media_type=CONTENT_TYPE_LATEST)
