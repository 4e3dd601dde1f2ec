"""Bounds on what one HTTP client can cost a node: every port of an agent is reachable by the brokers'
clients, and an agent that stalls lets its broker's leases expire (docs/security.md, "Hostile clients").

Two layers, both in front of the FastAPI app:

* :class:`GuardedHttpProtocol`, the connection layer (uvicorn's httptools protocol -- the C parser, several
  times cheaper per request than h11 -- with deadlines and a size cap): a connection must deliver a
  request's head, at most ``MAX_HEAD_BYTES``, within ``http.header_timeout_s`` of opening (or of its previous
  response),
  and at most ``http.max_connections`` are open at once -- beyond that, a new connection evicts the
  longest-idle connection that has no request in progress, so a flood of idle or dripping sockets cannot
  lock out ``/healthz`` (whose request arrives whole, at once). uvicorn alone closes a connection only
  after a response: one that never finishes its first request's headers stays open forever.
* :class:`BoundedApp`, the request layer (ASGI): the bearer token is checked from the headers before a byte
  of the body is read; the declared and the received body are bounded per route (413), the whole body must
  arrive within ``http.body_timeout_s`` (408), and a JSON body may nest at most ``http.max_json_depth``
  deep (400) -- large ones checked off the event loop. A refusal that leaves a body unread closes the
  connection, so nothing more is read from it; a client that disconnects mid-body is not an error.

Refusals are counted in ``trimtab_http_refused_total{reason}`` and logged as ``http_request_refused``
(rate-limited, with periodic summaries: :class:`RefusalLog`), never with a header's or a body's content.
"""

from __future__ import annotations

import asyncio
import fcntl
import re
import resource
import sys
import termios
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, cast

import msgspec
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge
from starlette.routing import compile_path
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from trimtab.cluster.auth import NO_TOKENS, Role, access_of, bearer_token, iter_routes
from trimtab.cluster.http_errors import send_error
from trimtab.cluster.logs import RefusalLog
from trimtab.config.settings import HttpSettings
from trimtab.errors import RequestError, TrimtabError

log = structlog.get_logger("trimtab.http")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
#: A route answered by the guard itself, after its checks (the request has no body left to read).
FastHandler = Callable[[Scope, Send], Awaitable[None]]
_MISS = object()

#: Why a request or a connection was refused: the label values of ``trimtab_http_refused_total``.
REASONS = (
    "body_too_large",  # 413: declared or received body over the route's limit
    "body_timeout",  # 408: the body did not arrive within http.body_timeout_s
    "json_too_deep",  # 400: nesting beyond http.max_json_depth
    "header_timeout",  # connection closed: the request head did not arrive within http.header_timeout_s
    "evicted",  # an idle connection closed to make room under http.max_connections
    "connection_limit",  # a new connection closed at once: every connection had a request in progress
    "send_timeout",  # a connection closed: its client did not read its response within http.send_timeout_s
    "header_too_large",  # 400, connection closed: a request line and headers over MAX_HEAD_BYTES
    "too_many_pipelined",  # 400, connection closed: over MAX_PIPELINED requests waiting on one connection
)

#: A route may raise or lower the node's body limit by declaring ``openapi_extra={MAX_BODY: n}``; the
#: limit is then also in the API spec.
MAX_BODY = "x-max-body-bytes"
#: How many of the longest-idle connections the cap looks at to find a silent one to evict.
_VICTIM_SCAN = 64
#: The most bytes a request line and its headers may take (h11's limit, which uvicorn used before httptools;
#: llhttp sets none, so without it one request could grow its headers until the head deadline).
MAX_HEAD_BYTES = 16 << 10
#: The most requests one connection may have waiting behind the one being answered (HTTP/1.1 pipelining).
MAX_PIPELINED = 16
#: Bodies larger than this are decoded on a worker thread, so the event loop keeps ticking.
OFF_LOOP_BYTES = 256 << 10


@dataclass(frozen=True)
class Limits:
    """The node's HTTP limits (``http.*`` settings: docs/configuration.md)."""

    max_body_bytes: int = 65_536
    max_json_depth: int = 32
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    send_timeout_s: float = 10.0
    keep_alive_timeout_s: float = 5.0
    max_connections: int = 1000

    @classmethod
    def from_settings(cls, http: HttpSettings) -> Limits:
        """Each limit is the ``http.*`` setting of its name: a limit added here is read from there too."""
        return cls(**{f.name: getattr(http, f.name) for f in fields(cls)})


# ---------------------------------------------------------------------------------------------- refusals
@dataclass
class Refusals:
    """Counts and logs every refusal of the guard (``trimtab_http_refused_total{reason}``)."""

    counter: Counter | None = None
    open_connections: Gauge | None = None
    log: RefusalLog = field(default_factory=lambda: RefusalLog("http_request_refused"))

    @classmethod
    def in_registry(cls, registry: CollectorRegistry) -> Refusals:
        counter = Counter(
            "trimtab_http_refused",
            "HTTP requests and connections refused by the node's limits (docs/security.md): body_too_large, "
            "body_timeout, json_too_deep, header_timeout, header_too_large (a request head over 16 KiB), "
            "too_many_pipelined (over 16 requests queued on one connection), "
            "evicted (an idle connection closed to make room), "
            "connection_limit, send_timeout (a client that does not read its responses)",
            ["reason"],
            registry=registry,
        )
        for r in REASONS:
            counter.labels(r)
        gauge = Gauge(
            "trimtab_http_open_connections",
            "HTTP connections open on this node (at most http.max_connections)",
            registry=registry,
        )
        return cls(counter=counter, open_connections=gauge)

    def __call__(self, reason: str, **fields: Any) -> None:
        if self.counter is not None:
            self.counter.labels(reason).inc()
        self.log(reason, **fields)


# ---------------------------------------------------------------------------------------------- connections
class ConnectionBook:
    """The open connections of one server and, per client address, the idle ones (no request in progress)
    in the order they became idle: what :attr:`Limits.max_connections` evicts. The client holding the most
    connections gives one up first, so a flood from a few addresses cannot push out a probe from another."""

    def __init__(self, limits: Limits, refusals: Refusals) -> None:
        self.limits = limits
        self.refusals = refusals
        self.max_connections = effective_max_connections(limits.max_connections)
        self.open: set[GuardedHttpProtocol] = set()
        self.per_client: dict[str | None, int] = {}
        self.idle: dict[str | None, OrderedDict[GuardedHttpProtocol, None]] = {}

    def opened(self, conn: GuardedHttpProtocol) -> bool:
        """Admit ``conn`` (True), evicting an idle connection if the node is full; False when every open
        connection has a request in progress (the caller closes ``conn``)."""
        if len(self.open) >= self.max_connections:
            victim = self._victim()
            if victim is None:
                self.refusals("connection_limit", client=conn.client_host())
                return False
            self.refusals("evicted", client=victim.client_host())
            victim.close_now()
            self.closed(victim)
        host = conn.client_host()
        self.open.add(conn)
        self.per_client[host] = self.per_client.get(host, 0) + 1
        self.idle.setdefault(host, OrderedDict())[conn] = None
        self._gauge()
        return True

    def _victim(self) -> GuardedHttpProtocol | None:
        """The connection to close for a new one: of the client with the most connections that has an
        idle one, its longest-idle *silent* connection -- no bytes of a request received and none waiting
        in its socket (a burst of new connections is accepted before any of them is read, so a probe whose
        request is already waiting must not be taken for idle); if all of them are talking, the longest
        idle."""
        if not self.idle:
            return None
        host = max(self.idle, key=lambda h: self.per_client.get(h, 0))
        queue = self.idle[host]
        for n, conn in enumerate(queue):
            if n >= _VICTIM_SCAN:
                break
            if not conn.talking():
                return conn
        return next(iter(queue))

    def busy(self, conn: GuardedHttpProtocol) -> None:
        self._not_idle(conn)

    def idle_again(self, conn: GuardedHttpProtocol) -> None:
        if conn in self.open:
            host = conn.client_host()
            queue = self.idle.setdefault(host, OrderedDict())
            queue[conn] = None
            queue.move_to_end(conn)

    def closed(self, conn: GuardedHttpProtocol) -> None:
        if conn in self.open:
            self.open.discard(conn)
            host = conn.client_host()
            left = self.per_client.get(host, 1) - 1
            if left > 0:
                self.per_client[host] = left
            else:
                self.per_client.pop(host, None)
        self._not_idle(conn)
        self._gauge()

    def _not_idle(self, conn: GuardedHttpProtocol) -> None:
        host = conn.client_host()
        queue = self.idle.get(host)
        if queue is not None:
            queue.pop(conn, None)
            if not queue:
                del self.idle[host]

    def _gauge(self) -> None:
        if self.refusals.open_connections is not None:
            self.refusals.open_connections.set(len(self.open))


def effective_max_connections(wanted: int) -> int:
    """``wanted``, but at most half of the open-file limit (raised to its hard limit first): a connection
    flood must never take the file descriptors the node's ZooKeeper and Kafka clients need."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    cap = max(16, soft // 2)
    if wanted > cap:
        log.warning("http_max_connections_lowered", wanted=wanted, effective=cap, open_file_limit=soft)
    return min(wanted, cap)


class _Writes:
    """A transport that drops what is written once it is closing, as asyncio's own transports do. uvloop's
    raise instead, and uvicorn writes a response without asking: a client gone, or cut off by this guard
    (a slow reader), between a handler's start and its answer would turn into a handler failure."""

    __slots__ = ("_t",)

    def __init__(self, transport: asyncio.Transport) -> None:
        self._t = transport

    def write(self, data: bytes) -> None:
        if not self._t.is_closing():
            self._t.write(data)

    def is_closing(self) -> bool:
        return self._t.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a request-head deadline, a head size cap and a connection cap
    (:class:`ConnectionBook`). :func:`protocol_class` binds a subclass to one server's book."""

    book: ClassVar[ConnectionBook]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._in_request = False
        self._head_bytes = 0
        self._head_size = 0  # of the request being parsed: its URL and its completed headers
        # A header line still arriving is invisible to the callbacks (httptools buffers it): the bytes of the
        # reads that came while the head was incomplete, not counting the read in which it began (a read is
        # at most 256 KiB: that bounds what the cap leaves uncounted).
        self._in_head = False
        self._head_began_here = False
        self._head_reads = 0
        inner = self.app

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            self._request_started()
            await inner(scope, receive, send)

        self.app = app

    def talking(self) -> bool:
        """Whether this connection has begun a request: bytes of it received, or waiting to be read."""
        if self._head_bytes:
            return True
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is None:
            return False
        try:
            waiting = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return False
        return int.from_bytes(waiting, sys.byteorder) > 0

    def client_host(self) -> str | None:
        return self.client[0] if self.client else None

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        transport = cast(asyncio.Transport, _Writes(transport))
        super().connection_made(transport)
        if not self.book.opened(self):
            self.connections.discard(self)
            transport.abort()
            return
        self._arm(self.book.limits.header_timeout_s)

    def data_received(self, data: bytes) -> None:
        if not self._in_request:
            self._head_bytes += len(data)
        self._head_began_here = False
        super().data_received(data)
        if self._in_head and not self._head_began_here and not self.transport.is_closing():
            self._head_reads += len(data)
            if self._head_reads > MAX_HEAD_BYTES:
                self.book.refusals(
                    "header_too_large", client=self.client_host(), received_bytes=self._head_reads
                )
                self.send_400_response("Request head too large.")

    # -- the parser's callbacks: the head's size and the queue of pipelined requests, bounded
    def on_message_begin(self) -> None:
        self._head_size = 0
        self._in_head, self._head_began_here, self._head_reads = True, True, 0
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_head = False
        if len(self.pipeline) >= MAX_PIPELINED:
            # httptools parses every request of a read at once and queues them (h11 took one at a time):
            # without a bound one read of 256 KiB queues thousands, each a whole request object.
            self.book.refusals("too_many_pipelined", client=self.client_host(), queued=len(self.pipeline))
            raise ValueError(f"more than {MAX_PIPELINED} pipelined requests waiting")
        super().on_headers_complete()

    def on_url(self, url: bytes) -> None:
        self._grow_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._grow_head(len(name) + len(value) + 4)  # ": " and CRLF: empty headers are not free either
        super().on_header(name, value)

    def _grow_head(self, n: int) -> None:
        self._head_size += n
        if self._head_size > MAX_HEAD_BYTES:
            self.book.refusals("header_too_large", client=self.client_host(), received_bytes=self._head_size)
            # The parser turns this into its error: uvicorn answers 400 and closes the connection.
            raise ValueError(f"request head over {MAX_HEAD_BYTES} bytes")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._cancel_send_deadline()
        self.book.closed(self)
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        """The send buffer is full: the client must read within ``http.send_timeout_s``."""
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.book.limits.send_timeout_s, self._send_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._cancel_send_deadline()

    def _cancel_send_deadline(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _send_timed_out(self) -> None:
        self._send_timer = None
        if not self.transport.is_closing():
            self.book.refusals("send_timeout", client=self.client_host())
            self.transport.abort()  # the unsent response is dropped: the client was not reading it

    # -- uvicorn hooks
    def on_response_complete(self) -> None:
        self._in_request = False
        self._head_bytes = 0
        super().on_response_complete()
        if not self.transport.is_closing():
            self.book.idle_again(self)
            # uvicorn closes a silent keep-alive connection itself; this closes one that drips a new head.
            limits = self.book.limits
            self._arm(max(limits.header_timeout_s, limits.keep_alive_timeout_s))

    # -- internals
    def _request_started(self) -> None:
        self._in_request = True
        self._disarm()
        self.book.busy(self)

    def _arm(self, delay: float) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(delay, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_request or self.transport.is_closing():
            return
        if self._head_bytes or self.cycle is None:
            # A first request that never completed its head, or a later one that dripped: slowloris.
            self.book.refusals("header_timeout", client=self.client_host(), received_bytes=self._head_bytes)
        self.close_now()

    def close_now(self) -> None:
        """Close the connection without waiting for anything (it has no request in progress)."""
        self._disarm()
        if not self.transport.is_closing():
            self.transport.close()


def protocol_class(book: ConnectionBook) -> type[GuardedHttpProtocol]:
    """A :class:`GuardedHttpProtocol` bound to ``book`` (uvicorn instantiates the class it is given)."""
    return type("GuardedHttp", (GuardedHttpProtocol,), {"book": book})


# ---------------------------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class RouteRule:
    """What the guard needs to know about a route before reading a request's body."""

    methods: frozenset[str]
    path: re.Pattern[str]
    need: Role | None  # None: public
    max_body: int
    template: str = ""  # the path as declared, e.g. /v1/admin/ops/{op_id}


def route_rules(app: Any, default_max_body: int) -> list[RouteRule]:
    """The guard's view of ``app``'s routes: methods, path pattern, the role they need, their body limit."""
    rules = []
    for route in iter_routes(app):
        methods = getattr(route, "methods", None)
        path_format = getattr(route, "path_format", None) or getattr(route, "path", None)
        if not methods or not path_format:
            continue
        access = access_of(route)
        need: Role | None = "admin" if "admin" in access else "read" if "read" in access else None
        extra = getattr(route, "openapi_extra", None) or {}
        max_body = int(extra.get(MAX_BODY, default_max_body))
        regex, _, _ = compile_path(path_format)
        rules.append(RouteRule(frozenset(methods), regex, need, max_body, path_format))
    return rules


def json_too_deep(body: bytes, max_depth: int) -> bool | None:
    """True if ``body`` is JSON nested deeper than ``max_depth``; None if it is not JSON at all (the app
    answers that); False otherwise. Decoding is C (msgspec), and bounded: it gives up past ~1000 levels."""
    try:
        doc = msgspec.json.decode(body)
    except RecursionError:
        return True
    except msgspec.DecodeError:
        return None
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > max_depth:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


class _Refused(RequestError):
    """A request the guard ends before the app sees it; ``reason`` is its refusal label (None: not counted).
    Retryable when it timed out (408), as any refusal with that status."""

    def __init__(self, status: int, reason: str | None, message: str) -> None:
        super().__init__(status, message)
        self.reason = reason


class BoundedApp:
    """The request layer of the guard (module docstring), wrapping the FastAPI ``app``."""

    def __init__(
        self,
        app: Any,
        limits: Limits,
        refusals: Refusals,
        fast: Mapping[tuple[str, str], FastHandler] | None = None,
    ) -> None:
        """``fast``: (method, path) -> a handler that answers that route instead of ``app`` once the guard's
        checks passed (the agent's lookup: agent/lookup_http.py). The route must still be one of ``app``'s
        -- its token rule and body limit are read from there."""
        self.app = app
        self.limits = limits
        self.refusals = refusals
        self.fast = dict(fast or {})
        self._rules: list[RouteRule] | None = None
        self._exact: dict[tuple[str, str], RouteRule | None] = {}  # rules of paths without parameters

    def _rule(self, method: str, path: str) -> RouteRule | None:
        hit = self._exact.get((method, path), _MISS)
        if hit is not _MISS:
            return hit  # type: ignore[return-value]
        if self._rules is None:  # built at the first request: every route is registered by then
            self._rules = route_rules(self.app, self.limits.max_body_bytes)
            # The scan's answer for each route without path parameters, remembered by (method, path): a
            # lookup skips the scan. Only those -- remembering any path asked would let a client grow this.
            for rule in self._rules:
                if "{" not in rule.template:
                    for m in rule.methods:
                        self._exact[(m, rule.template)] = self._scan(self._rules, m, rule.template)
        return self._scan(self._rules, method, path)

    @staticmethod
    def _scan(rules: list[RouteRule], method: str, path: str) -> RouteRule | None:
        fallback = None
        for rule in rules:
            if rule.path.match(path):
                if method in rule.methods or (method == "HEAD" and "GET" in rule.methods):
                    return rule
                fallback = fallback or rule
        return fallback  # a 405 to come: same token rule, no body wanted

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        host = client[0] if client else None
        try:
            rule = self._rule(scope["method"], scope["path"])
            max_body = rule.max_body if rule is not None else self.limits.max_body_bytes
            if rule is not None and rule.need is not None:
                self._authorize(scope, rule.need, host)
            body = await self._read_body(scope, receive, max_body)
        except RequestError as e:  # a _Refused, or an AuthRefused (the authenticator counted it)
            if isinstance(e, _Refused) and e.reason is not None:
                self.refusals(e.reason, client=host, method=scope["method"], path=scope["path"][:200])
            await send_error(send, e, close=True)
            return
        except _Disconnected:
            return  # the client went away mid-request: nothing to answer, not an error
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        fast = self.fast.get((scope["method"], scope["path"])) if self.fast else None
        if fast is not None:
            await fast(scope, send)
            return
        await self.app(scope, replay, send)

    def _authorize(self, scope: Scope, need: Role, host: str | None) -> None:
        auth = getattr(getattr(self.app, "state", None), "auth", None) or NO_TOKENS
        token = bearer_token(_header(scope, b"authorization"))
        auth.check(token, need, method=scope["method"], path=scope["path"][:200], client=host)

    async def _read_body(self, scope: Scope, receive: Receive, max_body: int) -> bytes:
        declared = _header(scope, b"content-length")
        if declared is not None:
            if not declared.isdigit() or len(declared) > 18:
                raise _Refused(400, None, "bad request: Content-Length is not a byte count")
            if int(declared) > max_body:
                raise _Refused(
                    413, "body_too_large", f"request body of {declared} bytes is over this route's {max_body}"
                )
        chunks: list[bytes] = []
        size = 0
        deadline = asyncio.get_running_loop().time() + self.limits.body_timeout_s
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                if remaining <= 0:
                    raise TimeoutError
                async with asyncio.timeout(remaining):
                    message = await receive()
            except TimeoutError:
                raise _Refused(
                    408,
                    "body_timeout",
                    f"the request body did not arrive within {self.limits.body_timeout_s:g} s",
                ) from None
            if message["type"] == "http.disconnect":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_body:
                raise _Refused(413, "body_too_large", f"request body is over this route's {max_body} bytes")
            if chunk:
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body:
            deep = (
                await asyncio.to_thread(json_too_deep, body, self.limits.max_json_depth)
                if len(body) > OFF_LOOP_BYTES
                else json_too_deep(body, self.limits.max_json_depth)
            )
            if deep:
                raise _Refused(
                    400, "json_too_deep", f"bad request: JSON nested deeper than {self.limits.max_json_depth}"
                )
        return body


class _Disconnected(TrimtabError):
    """The client went away mid-body: nothing to answer, and not an error of anyone's."""


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k == name:
            return bytes(v).decode("latin-1")
    return None
