"""Reference implementation of the webhook contract: a simulated broker served over HTTP.

It is what ``trimtab sim-broker`` runs, what the webhook adapter's tests talk to, and the source of
docs/webhook-openapi.json -- so the documented contract is exactly what is tested.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, Field

from trimtab.agent.adapters.base import Lease
from trimtab.agent.adapters.signing import verify
from trimtab.agent.adapters.simulated import SimulatedBroker
from trimtab.balance.load import FIGURE_MAX
from trimtab.channel.bundles import parse_bundle
from trimtab.cluster.http import error_response, install_error_handlers
from trimtab.errors import AdapterError, BundleError, LeaseRefused, RequestError


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


def _check(bundle: str) -> None:
    try:
        parse_bundle(bundle)
    except BundleError as e:
        raise RequestError(400, str(e)) from e


UNSIGNED = frozenset({"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


def create_app(broker: SimulatedBroker, *, hmac_key: bytes | None = None) -> FastAPI:
    """The reference broker; with ``hmac_key`` every call must carry a valid signature (401 otherwise)."""
    app = FastAPI(
        title="trimtab broker webhook contract",
        version="1",
        description="What a broker implements so a trimtab agent can manage it. Every operation is idempotent; "
        "any 2xx is success, anything else is retried by the agent with backoff. A bundle is served only "
        "under a lease: it ends lease_s after the acquire or renew request was received, and the broker "
        "stops serving it then on its own. With a shared HMAC key, calls carry X-Trimtab-Timestamp and "
        "X-Trimtab-Signature headers (docs/broker-adapter.md).",
    )
    install_error_handlers(app)
    refused = {"forged": 0}

    if hmac_key is not None:
        key = hmac_key

        @app.middleware("http")
        async def check_signature(request: Request, call_next: Any) -> Any:
            if request.url.path in UNSIGNED or request.url.path.startswith("/trimtab/v1/sim/"):
                return await call_next(request)  # read-only inspection of the simulator and the spec
            body = await request.body()
            why = verify(
                key, request.headers, request.method, request.url.path, body, int(time.time() * 1000)
            )
            if why is not None:
                refused["forged"] += 1
                return error_response(401, f"webhook call refused: {why}")
            return await call_next(request)

    async def guarded(op: Any) -> dict[str, bool]:
        try:
            await op
        except LeaseRefused as e:
            raise RequestError(409, str(e), retryable=True) from e
        except AdapterError as e:
            raise RequestError(503, str(e), retryable=True) from e
        return {"ok": True}

    @app.get(
        "/trimtab/v1/load",
        response_model=SampleModel,
        summary="Load sample: host figures and per-bundle stats",
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
        responses={409: {"description": "The request arrived after apply_by_ms; nothing was acquired."}},
    )
    async def acquire(req: AcquireRequest) -> dict[str, bool]:
        _check(req.bundle)
        return await guarded(broker.acquire(req.bundle, req.lease()))

    @app.post(
        "/trimtab/v1/bundles/renew",
        response_model=RenewAnswer,
        summary="Extend the leases of bundles this broker serves",
        responses={409: {"description": "The request arrived after apply_by_ms; no lease was extended."}},
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
        "/trimtab/v1/bundles/fence", summary="Release, phase 1: stop accepting work; clients stay connected"
    )
    async def fence(req: BundleRequest) -> dict[str, bool]:
        _check(req.bundle)
        return await guarded(broker.fence(req.bundle))

    @app.post("/trimtab/v1/bundles/close", summary="Release, phase 2: disconnect clients, redirecting them")
    async def close(req: CloseRequest) -> dict[str, bool]:
        _check(req.bundle)
        return await guarded(broker.close(req.bundle, req.redirect_url))

    @app.post("/trimtab/v1/bundles/prewarm", summary="Prepare to take a bundle over (warm standby)")
    async def prewarm(req: BundleRequest) -> dict[str, bool]:
        _check(req.bundle)
        return await guarded(broker.prewarm(req.bundle))

    @app.post("/trimtab/v1/bundles/split", summary="Re-partition a bundle's topics into child ranges")
    async def split(req: SplitRequest) -> dict[str, bool]:
        _check(req.bundle)
        try:
            return await guarded(broker.split(req.bundle, req.children))
        except BundleError as e:
            raise RequestError(400, str(e)) from e

    @app.get("/trimtab/v1/sim/state", summary="(simulator only) serving set, calls and timeline")
    async def state() -> dict[str, object]:
        return {**broker.snapshot(), "refused_calls": dict(refused)}

    return app
