"""The public lookup over HTTP (``GET /v1/lookup``): what it answers, once, and the fast path that serves it.

Every client of every broker asks this on every connect and every move, and for an owned bundle the answer
is a dictionary read: the cost is the HTTP stack around it. So the lookup is served by :class:`FastLookup`,
a plain ASGI handler the HTTP guard calls directly (after its checks: the token rule -- public --, the
body limit), not through FastAPI's routing, dependency solving and response validation. FastAPI's route
(agent/api.py) stays: it declares the operation in the OpenAPI spec and answers exactly the same, since
both call :func:`answer_lookup` and render its refusals in the one error shape
(:func:`trimtab.cluster.http_errors.send_error`). A test holds the two byte for byte
(tests/integration/test_agent_inprocess.py).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol
from urllib.parse import parse_qsl

import orjson
import structlog

from trimtab.agent.lookup import LookupResult, LookupService
from trimtab.agent.metrics import NAMESPACE_NOT_FOUND, RATE_LIMITED, AgentMetrics
from trimtab.agent.ratelimit import ClientRateLimiter, worth_logging
from trimtab.cluster.http_errors import refusal_of, send_error, unexpected
from trimtab.errors import LookupTimeout, NamespaceNotFound, RequestError

log = structlog.get_logger("trimtab.lookup")

PATH = "/v1/lookup"
Scope = MutableMapping[str, Any]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
_JSON = (b"content-type", b"application/json")


class Ready(Protocol):
    @property
    def ready(self) -> bool: ...


class ChannelHealth(Protocol):
    def health(self) -> tuple[bool, str]: ...


class LookupDeps(Protocol):
    """What a lookup reads (the agent's :class:`~trimtab.agent.api.AgentApi` has it all)."""

    @property
    def node(self) -> Ready: ...

    @property
    def channel(self) -> ChannelHealth: ...

    @property
    def lookups(self) -> LookupService: ...

    @property
    def metrics(self) -> AgentMetrics: ...

    @property
    def limiter(self) -> ClientRateLimiter: ...


def _refusal_result(e: RequestError) -> str:
    """The ``trimtab_lookups_total{result}`` of a refused lookup."""
    if isinstance(e, LookupTimeout):
        return "timeout"
    if isinstance(e, NamespaceNotFound):
        return NAMESPACE_NOT_FOUND
    return "bad_request" if e.status == 400 else "unavailable"


async def answer_lookup(api: LookupDeps, client: str, topic: str | None) -> LookupResult:
    """Who owns ``topic`` (assigning its bundle if nobody does), asked by ``client`` (its address): the
    per-client rate limit first (429 with Retry-After), then 400 without a topic, 503 while the agent or
    its channel view is not ready, then :meth:`LookupService.lookup`. Counted and timed in
    ``trimtab_lookups_total`` / ``trimtab_lookup_seconds`` by result; refusals raised as RequestError."""
    t0 = time.perf_counter()
    metrics = api.metrics
    # First, before any work: a flood from one address is refused at the cost of a dict lookup.
    verdict = api.limiter.admit(client)
    if not verdict.allowed:
        metrics.lookup_done(RATE_LIMITED)
        if worth_logging(verdict.refused_before):
            log.warning(
                "lookup_rate_limited",
                client=client,
                refused=verdict.refused_before + 1,
                retry_after_s=round(verdict.retry_after_s, 3),
            )
        lim = api.limiter
        raise RequestError(
            429,
            f"too many lookups from {client}: at most {lim.rate:g} per second (bursts of {lim.burst}) per "
            f"client address (agent.lookup_rate_per_client); retry in {verdict.retry_after_header} s",
            headers={"Retry-After": verdict.retry_after_header},
        )
    if not topic:
        metrics.lookup_done("bad_request")
        raise RequestError(
            400, "missing query parameter 'topic' (a full topic name, e.g. persistent://tenant/ns/topic)"
        )
    if not api.node.ready:
        metrics.lookup_done("unavailable")
        raise RequestError(503, "agent is not ready (starting or draining)")
    channel_ok, channel_why = api.channel.health()
    if not channel_ok:
        # Never answer from a table that is being rebuilt (history gap, follower restart).
        metrics.lookup_done("unavailable")
        raise RequestError(503, f"agent's channel view is not ready: {channel_why}")
    try:
        res = await api.lookups.lookup(topic)
    except RequestError as e:  # counted by its kind, then answered as it is
        metrics.lookup_done(_refusal_result(e), time.perf_counter() - t0)
        raise
    metrics.lookup_done(res.how, time.perf_counter() - t0)
    return res


def encode_answer(res: LookupResult) -> bytes:
    """The 200 body: :class:`~trimtab.agent.api.LookupResponse`'s fields, in its order."""
    return orjson.dumps(
        {
            "topic": res.topic,
            "bundle": res.bundle,
            "owner": res.owner,
            "url": res.url,
            "state": res.state,
            "version": res.version,
            "how": res.how,
        }
    )


def topic_of(query_string: bytes) -> str | None:
    """The ``topic`` query parameter as Starlette reads it (latin-1, blank values kept, the last one wins)."""
    topic = None
    for key, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        if key == "topic":
            topic = value
    return topic


class FastLookup:
    """``GET /v1/lookup`` as a plain ASGI handler (the module docstring): called by the HTTP guard once its
    checks passed and the (empty) body was read."""

    def __init__(self, api: LookupDeps) -> None:
        self.api = api

    async def __call__(self, scope: Scope, send: Send) -> None:
        client = scope.get("client")
        try:
            res = await answer_lookup(
                self.api, client[0] if client else "unknown", topic_of(scope["query_string"])
            )
        except Exception as e:
            refusal = refusal_of(e)
            if refusal is None:  # a bug: answered 500 and the connection closed, as uvicorn does for the app
                await send_error(send, unexpected(PATH, e), close=True)
            else:
                await send_error(send, refusal, close=False)
            return
        body = encode_answer(res)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", str(len(body)).encode()), _JSON],
            }
        )
        await send({"type": "http.response.body", "body": body})
