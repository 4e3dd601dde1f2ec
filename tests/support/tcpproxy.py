"""A TCP proxy for client tests: forwards both ways to a real server, and can play a server that accepts
a connection and then says nothing (a ZooKeeper still starting, a paused JVM, a half-open link), or drop
every open connection at once (a server restart, as its clients see it)."""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._silent_next = 0
        self._open: list[socket.socket] = []
        self.silenced = 0  # connections accepted and never answered
        self.forwarded = 0
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name="tcpproxy-accept", daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def silence_next(self, n: int = 1) -> None:
        """The next ``n`` connections are accepted, read and never answered nor forwarded."""
        with self._lock:
            self._silent_next = n

    def cut(self) -> None:
        """Close every open connection, both sides."""
        with self._lock:
            socks, self._open = self._open, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        self.cut()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                silent = self._silent_next > 0
                if silent:
                    self._silent_next -= 1
                    self.silenced += 1
                self._open.append(client)
            if silent:
                threading.Thread(target=self._swallow, args=(client,), daemon=True).start()
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._open.append(server)
                self.forwarded += 1
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _swallow(s: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while s.recv(65536):
                pass

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
