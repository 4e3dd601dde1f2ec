"""HTTP plumbing shared by the daemons: embedding uvicorn in a process that owns its signals and event
loop, and the read-only routes and probes both the agent and the controller serve."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import msgspec
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from trimtab.balance.assign import BrokerInfo
from trimtab.balance.load import BrokerLoadData
from trimtab.channel.records import Record


class RequestError(Exception):
    """An operation refused with an HTTP status and a message meant for the caller."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


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
