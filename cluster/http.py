"""HTTP plumbing shared by the daemons: embedding uvicorn (optionally serving TLS) in a process that owns
its signals and event loop, the read-only routes and probes both the agent and the controller serve, and
how a node calls its peers (their CA, its own token). The one error shape of every API, and its handler,
are :mod:`trimtab.cluster.http_errors`."""

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
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from trimtab.balance.assign import BrokerInfo
from trimtab.balance.load import BrokerLoadData
from trimtab.channel.records import Record
from trimtab.cluster.auth import PUBLIC
from trimtab.cluster.http_guard import (
    BoundedApp,
    ConnectionBook,
    FastHandler,
    Limits,
    Refusals,
    protocol_class,
    route_rules,
)
from trimtab.config.settings import HttpSettings
from trimtab.errors import ConfigError

log = structlog.get_logger("trimtab.http")


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
        fast: Mapping[tuple[str, str], FastHandler] | None = None,
    ) -> None:
        """Serve ``app`` on ``sock`` behind the HTTP guard (:mod:`trimtab.cluster.http_guard`: bounded
        bodies, read deadlines, a connection cap, the token checked before any body is read), with the
        limits of ``http`` (defaults when None); over TLS when it names a certificate and key. Refusals
        are counted in ``refusals`` (a daemon passes :meth:`Refusals.in_registry`); ``fast`` routes are answered
        by the guard itself (:class:`~trimtab.cluster.http_guard.BoundedApp`)."""
        self.sock = sock
        http = http if http is not None else HttpSettings()
        check_tls_files(http)
        self.scheme = "https" if http.tls_cert_file else "http"
        self.config = server_config(app, http, refusals if refusals is not None else Refusals(), fast)
        self._server = _Server(self.config)
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(sockets=[self.sock]), name="http")

    async def stop(self) -> None:
        self._server.should_exit = True
        task = self._task
        if task is not None:
            # asyncio.wait, not wait_for: it never takes the caller's own cancellation for the server's.
            await asyncio.wait({task}, timeout=5)
            if not task.done():
                task.cancel()
                await asyncio.wait({task})
            if not task.cancelled() and (e := task.exception()) is not None:
                log.warning("http_server_failed", error=str(e))


def server_config(
    app: FastAPI,
    http: HttpSettings,
    refusals: Refusals,
    fast: Mapping[tuple[str, str], FastHandler] | None = None,
) -> uvicorn.Config:
    """uvicorn's configuration for ``app`` behind the guard: every trimtab process that serves HTTP (the
    daemons, ``trimtab sim-broker``) is built with it, so none serves without the limits. A ``fast`` route
    must be one of ``app``'s (the guard reads its token rule and body limit there): ValueError if not."""
    limits = Limits.from_settings(http)
    declared = {(m, r.template) for r in route_rules(app, limits.max_body_bytes) for m in r.methods}
    if unknown := sorted(set(fast or {}) - declared):
        raise ValueError(f"fast routes not declared by the app: {unknown}")
    app.router.redirect_slashes = False  # a redirect built from the Host header points wherever a client says
    return uvicorn.Config(
        BoundedApp(app, limits, refusals, fast),
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
