"""Embedding uvicorn in a daemon that owns its own signals and event loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI


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
