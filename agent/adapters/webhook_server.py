"""Reference implementation of the webhook contract: a simulated broker served over HTTP.

It is what ``trimtab sim-broker`` runs, what the webhook adapter's tests talk to, and the source of
docs/webhook-openapi.json -- so the documented contract is exactly what is tested.

Every request passes :class:`SignedCalls` first, a pure ASGI middleware (not Starlette's
``BaseHTTPMiddleware``, which runs the app in a separate task and turns a client that hangs up mid-body
into an exception with a traceback): it reads at most :data:`~agent.adapters.webhook.MAX_REQUEST_BYTES` of
the body (413 beyond, before the rest is read), drops a call whose client disconnected without answering
it, and -- with a key -- hands the headers, request target and body to
:class:`~agent.adapters.signing.Verifier` before any route sees them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import structlog
from fastapi import FastAPI
from pydantic import BaseModel, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trimtab.agent.adapters.base import Lease
from trimtab.agent.adapters.signing import (
    BROKER,
    HEADERS,
    NONCE,
    SIGNATURE,
    TIMESTAMP,
    Verifier,
)
from trimtab.agent.adapters.simulated import SimulatedBroker
from trimtab.agent.adapters.webhook import MAX_REQUEST_BYTES
from trimtab.balance.load import FIGURE_MAX
from trimtab.cluster.http_errors import error_response, install_error_handlers, require_bundle
from trimtab.cluster.http_guard import MAX_BODY
from trimtab.cluster.logs import RefusalLog
from trimtab.errors import AdapterError, BundleError, LeaseRefused, RequestError, SignatureRefused

log = structlog.get_logger("trimtab.adapter.webhook_server")


class BundleRequest(BaseModel):
    bundle: str = Field(description="Bundle name tenant/namespace/0xLLLLLLLL_0xUUUUUUUU.", max_length=512)


class LeaseFields(BaseModel):
    lease_s: float = Field(
        gt=0,
        le=3600,
        description="Serve for this long after receiving the request, then stop serving without being told.",
    )
    apply_by_ms: int = Field(
        ge=0,
        le=2**53,
        description="Unix milliseconds: refuse the request (409) if it arrives after this instant.",
    )

    def lease(self) -> Lease:
        return Lease(self.lease_s, self.apply_by_ms)


class AcquireRequest(BundleRequest, LeaseFields):
    pass


class RenewRequest(LeaseFields):
    bundles: list[str] = Field(
        max_length=1_000_000, description="Bundles whose leases to extend (those the broker serves)."
    )


class RenewAnswer(BaseModel):
    ok: bool = True
    not_serving: list[str] = Field(
        description="The requested bundles this broker does not serve (never acquired, fenced, closed, or "
        "expired): the agent stops counting them as served and acquires them again if they are still its."
    )


class CloseRequest(BundleRequest):
    redirect_url: str | None = Field(
        None, description="Where clients should reconnect (the new owner), if known."
    )


class SplitRequest(BundleRequest):
    children: list[str] = Field(description="Child bundle names that tile the parent's range.")


class MergeRequest(BundleRequest):
    """``bundle`` is the merged bundle, the union of the two ``parents``."""

    parents: list[Annotated[str, Field(max_length=512)]] = Field(
        min_length=2,
        max_length=2,
        description="The two adjacent bundles (this broker's) whose topics become the merged bundle's.",
    )


#: Every figure non-negative and finite, every count non-negative: the agent refuses a sample that breaks
#: this (balance.load.Figure, docs/broker-adapter.md).
Figure = Annotated[float, Field(ge=0, le=FIGURE_MAX)]
Count = Annotated[int, Field(ge=0)]


class UsageModel(BaseModel):
    usage: Figure
    limit: Figure


class BundleStatsModel(BaseModel):
    bundle: str
    msg_rate_in: Figure = 0
    msg_rate_out: Figure = 0
    msg_throughput_in: Figure = Field(0, description="bytes/s")
    msg_throughput_out: Figure = Field(0, description="bytes/s")
    topics: Count = 0
    producers: Count = 0
    consumers: Count = 0
    topic_loads: dict[int, tuple[Figure, Figure]] = Field(
        default_factory=dict,
        description="topic hash -> (msg rate, throughput); optional, enables load-aware splits",
    )


class SampleModel(BaseModel):
    cpu: UsageModel | None = Field(
        None, description="cores used / cores available; omit to let the agent measure the host"
    )
    memory: UsageModel | None = None
    bandwidth_in: UsageModel | None = Field(None, description="bytes/s")
    bandwidth_out: UsageModel | None = None
    bundles: list[BundleStatsModel] = Field(default_factory=list)


#: Read-only inspection (the spec, the simulator's state) that a GET may do unsigned; everything else is
#: the contract and is signed when the broker has a key.
UNSIGNED = frozenset({"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
SIM_PREFIX = "/trimtab/v1/sim/"

#: Every refusal reason :class:`SignedCalls` counts (the sim broker's ``refused_calls``).
REFUSALS = (
    "missing_header",
    "malformed_header",
    "wrong_broker",
    "stale",
    "early",
    "bad_signature",
    "replayed",
    "replay_cache_full",
    "too_large",
)


def request_target(scope: Scope) -> str:
    """The path and query string exactly as the client sent them (what the signature covers):
    ``raw_path`` -- the undecoded path -- and ``?query_string`` when there is one."""
    raw: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
    query: bytes = scope.get("query_string", b"")
    return (raw + b"?" + query if query else raw).decode("latin-1")


def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers (lower-case names); a signing header sent twice is refused, so nothing in
    front of the broker can pick a different copy than the one verified."""
    signing = {name.lower().encode() for name in HEADERS}
    out: dict[str, str] = {}
    for raw_name, raw_value in scope["headers"]:
        name = raw_name.lower()
        if name in signing and name.decode() in out:
            raise SignatureRefused(401, "malformed_header", f"{name.decode()} sent more than once")
        out[name.decode("latin-1")] = raw_value.decode("latin-1")
    return out


class SignedCalls:
    """Bound the body, survive disconnects, verify signatures: in front of every route (pure ASGI).

    * a declared ``content-length`` over ``max_body``, or a body that grows past it, is answered 413 at
      once (``connection: close``; the rest is never read);
    * a client that disconnects before its body is complete gets no answer and costs a debug line: it is
      not an error of the broker;
    * with a ``verifier``, every request but a GET of the spec or the simulator's state must verify
      (:class:`~agent.adapters.signing.Verifier`; its refusal is the answer, 401 or 503).

    The body is then handed to the app unchanged. ``on_refused(reason)`` and ``on_disconnect()`` count.
    Refusals are logged as ``webhook_call_refused`` (warning: they are attacks or misconfigurations) with
    the reason, path and client, rate-limited (:class:`~cluster.logs.RefusalLog`) so a flood of forged
    calls cannot flood the log; never a header's or the body's content."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        verifier: Verifier | None,
        max_body: int = MAX_REQUEST_BYTES,
        on_refused: Callable[[str], None] = lambda reason: None,
        on_disconnect: Callable[[], None] = lambda: None,
    ) -> None:
        self.app = app
        self.verifier = verifier
        self.max_body = max_body
        self.on_refused = on_refused
        self.on_disconnect = on_disconnect
        self.log = RefusalLog("webhook_call_refused", emit=log.warning)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body:
            await self._refuse(scope, receive, send, self._too_large(), "too_large")
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                log.debug("webhook_client_disconnected", path=path, received=size)
                self.on_disconnect()
                return  # nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await self._refuse(scope, receive, send, self._too_large(), "too_large")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        exempt = scope["method"] in ("GET", "HEAD") and (path in UNSIGNED or path.startswith(SIM_PREFIX))
        if self.verifier is not None and not exempt:
            try:
                self.verifier.verify(_headers(scope), scope["method"], request_target(scope), body)
            except SignatureRefused as refused:
                await self._refuse(scope, receive, send, refused, refused.reason)
                return
        await self.app(scope, _replay(body, receive), send)

    def _too_large(self) -> RequestError:
        return RequestError(413, f"the body is larger than {self.max_body} bytes")

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, refused: RequestError, reason: str
    ) -> None:
        self.on_refused(reason)
        client = scope.get("client")
        self.log(
            reason, status=refused.status, path=scope["path"][:200], client=client[0] if client else None
        )
        # (A 401 carries its challenge itself: SignatureRefused.) The rest of a 413's body is never read:
        # the connection cannot be reused.
        close = {"connection": "close"} if refused.status == 413 else None
        await error_response(refused, close)(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name.lower() == b"content-length":
            return int(value) if value.isdigit() else None  # the HTTP server refuses a malformed one
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields the already-read body once, then defers to the real one (which reports
    the disconnect the app may wait for)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


def _signing_header(name: str, description: str, pattern: str, example: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "header",
        "required": False,
        "description": description + " Required when the broker has the shared key (docs/broker-adapter.md).",
        "schema": {"type": "string", "pattern": pattern},
        "example": example,
    }


def signed_operation(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """What every contract operation adds to its spec (a fresh copy each): the signing headers."""
    return {
        "parameters": [
            _signing_header(
                BROKER,
                "The broker id the call is meant for (the agent's broker.id); any other is refused.",
                "^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$",
                "broker-1.example:6650",
            ),
            _signing_header(
                TIMESTAMP,
                "Unix milliseconds when the call was signed.",
                "^[1-9][0-9]{0,14}$",
                "1732400000000",
            ),
            _signing_header(
                NONCE,
                "128 random bits, fresh for every call; accepted once.",
                "^[0-9a-f]{32}$",
                "00112233445566778899aabbccddeeff",
            ),
            _signing_header(
                SIGNATURE,
                "v2= and the hex HMAC-SHA256 of the signed string.",
                "^v2=[0-9a-f]{64}$",
                "v2=ceaa69b30fc762b79d9b3f3b0efca00b96168b86ba10bf6f7d4c8f7c82866e7d",
            ),
        ],
        **(extra or {}),
    }


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
    }


SIGNED_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: _error(
        "Refused by the signature check (missing or malformed header, another broker's id, a timestamp "
        "outside the window, a wrong signature, a nonce already accepted); nothing was done."
    ),
    413: _error(
        "The body is larger than the broker accepts (renew: more than x-max-body-bytes); nothing was done."
    ),
    503: _error(
        "The broker cannot act now (a failure of the broker, or its replay cache is full); retryable."
    ),
}


def create_app(
    broker: SimulatedBroker,
    *,
    hmac_key: bytes | None = None,
    verifier: Verifier | None = None,
    max_body: int = MAX_REQUEST_BYTES,
) -> FastAPI:
    """The reference broker. With ``hmac_key`` every contract call must be signed for this broker's id
    (``broker.broker_id``) and be new (:class:`~agent.adapters.signing.Verifier` with the contract's
    window); ``verifier`` instead is for tests (an injected clock, a small cache)."""
    app = FastAPI(
        title="trimtab broker webhook contract",
        version="2",
        description="What a broker implements so a trimtab agent can manage it. Every operation is idempotent; "
        "any 2xx is success, anything else is retried by the agent with backoff. A bundle is served only "
        "under a lease: it ends lease_s after the acquire or renew request was received, and the broker "
        "stops serving it then on its own. With a shared HMAC key, every call carries X-Trimtab-Broker, "
        "X-Trimtab-Timestamp, X-Trimtab-Nonce and X-Trimtab-Signature; the broker refuses (401) a call "
        "for another broker id, outside the time window, with a wrong signature or a nonce it already "
        f"accepted (docs/broker-adapter.md). A broker must accept a renew body of up to {MAX_REQUEST_BYTES} "
        "bytes (x-max-body-bytes) and may refuse a larger body with 413; the other bodies are small.",
    )
    install_error_handlers(app)
    refused = dict.fromkeys(REFUSALS, 0)
    disconnected = [0]

    def count_refusal(reason: str) -> None:
        refused[reason] = refused.get(reason, 0) + 1

    def count_disconnect() -> None:
        disconnected[0] += 1

    if verifier is None and hmac_key is not None:
        verifier = Verifier(hmac_key, broker.broker_id)
    app.add_middleware(
        SignedCalls,
        verifier=verifier,
        max_body=max_body,
        on_refused=count_refusal,
        on_disconnect=count_disconnect,
    )

    async def guarded(op: Any) -> dict[str, bool]:
        try:
            await op
        except BundleError as e:  # a split or merge whose bundles do not fit together: nothing was done
            raise RequestError(400, str(e)) from e
        except LeaseRefused as e:
            raise RequestError(409, str(e), retryable=True) from e
        except AdapterError as e:
            raise RequestError(503, str(e), retryable=True) from e
        return {"ok": True}

    @app.get(
        "/trimtab/v1/load",
        response_model=SampleModel,
        summary="Load sample: host figures and per-bundle stats",
        responses=SIGNED_RESPONSES,
        openapi_extra=signed_operation(),
    )
    async def load() -> Any:
        import msgspec

        try:
            return msgspec.to_builtins(await broker.sample())
        except AdapterError as e:
            raise RequestError(503, str(e), retryable=True) from e

    @app.post(
        "/trimtab/v1/bundles/acquire",
        summary="Start serving a bundle under a lease",
        responses={
            **SIGNED_RESPONSES,
            409: {"description": "The request arrived after apply_by_ms; nothing was acquired."},
        },
        openapi_extra=signed_operation(),
    )
    async def acquire(req: AcquireRequest) -> dict[str, bool]:
        require_bundle(req.bundle)
        return await guarded(broker.acquire(req.bundle, req.lease()))

    @app.post(
        "/trimtab/v1/bundles/renew",
        response_model=RenewAnswer,
        summary="Extend the leases of bundles this broker serves",
        responses={
            **SIGNED_RESPONSES,
            409: {"description": "The request arrived after apply_by_ms; no lease was extended."},
        },
        # The one large body: the node's HTTP guard (http.max_body_bytes) lets this route take the
        # contract's bound, and the spec says so.
        openapi_extra=signed_operation({MAX_BODY: MAX_REQUEST_BYTES}),
    )
    async def renew(req: RenewRequest) -> Any:
        try:
            missing = await broker.renew(req.bundles, req.lease())
        except LeaseRefused as e:
            raise RequestError(409, str(e), retryable=True) from e
        except AdapterError as e:
            raise RequestError(503, str(e), retryable=True) from e
        return {"ok": True, "not_serving": missing}

    @app.post(
        "/trimtab/v1/bundles/fence",
        summary="Release, phase 1: stop accepting work; clients stay connected",
        responses=SIGNED_RESPONSES,
        openapi_extra=signed_operation(),
    )
    async def fence(req: BundleRequest) -> dict[str, bool]:
        require_bundle(req.bundle)
        return await guarded(broker.fence(req.bundle))

    @app.post(
        "/trimtab/v1/bundles/close",
        summary="Release, phase 2: disconnect clients, redirecting them",
        responses=SIGNED_RESPONSES,
        openapi_extra=signed_operation(),
    )
    async def close(req: CloseRequest) -> dict[str, bool]:
        require_bundle(req.bundle)
        return await guarded(broker.close(req.bundle, req.redirect_url))

    @app.post(
        "/trimtab/v1/bundles/prewarm",
        summary="Prepare to take a bundle over (warm standby)",
        responses=SIGNED_RESPONSES,
        openapi_extra=signed_operation(),
    )
    async def prewarm(req: BundleRequest) -> dict[str, bool]:
        require_bundle(req.bundle)
        return await guarded(broker.prewarm(req.bundle))

    @app.post(
        "/trimtab/v1/bundles/split",
        summary="Re-partition a bundle's topics into child ranges",
        responses=SIGNED_RESPONSES,
        openapi_extra=signed_operation(),
    )
    async def split(req: SplitRequest) -> dict[str, bool]:
        require_bundle(req.bundle)
        return await guarded(broker.split(req.bundle, req.children))

    @app.post(
        "/trimtab/v1/bundles/merge",
        summary="Serve two adjacent bundles' topics as one bundle, their union, in place",
        responses={
            **SIGNED_RESPONSES,
            400: _error("The parents are not two adjacent bundles whose union is the bundle; nothing done."),
        },
        openapi_extra=signed_operation(),
    )
    async def merge(req: MergeRequest) -> dict[str, bool]:
        for name in (req.bundle, *req.parents):
            require_bundle(name)
        return await guarded(broker.merge(req.parents, req.bundle))

    @app.get("/trimtab/v1/sim/state", summary="(simulator only) serving set, calls and timeline")
    async def state() -> dict[str, object]:
        return {**broker.snapshot(), "refused_calls": dict(refused), "disconnected_calls": disconnected[0]}

    return app
