"""Reference implementation of the webhook contract: a simulated broker served over HTTP.

It is what ``trimtab sim-broker`` runs, what the webhook adapter's tests talk to, and the source of
docs/webhook-openapi.json -- so the documented contract is exactly what is tested.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

from trimtab.agent.adapters.simulated import SimulatedBroker
from trimtab.channel.bundles import parse_bundle
from trimtab.cluster.http import install_error_handlers
from trimtab.errors import AdapterError, BundleError, RequestError


class BundleRequest(BaseModel):
    bundle: str = Field(description="Bundle name tenant/namespace/0xLLLLLLLL_0xUUUUUUUU.")


class CloseRequest(BundleRequest):
    redirect_url: str | None = Field(
        None, description="Where clients should reconnect (the new owner), if known."
    )


class SplitRequest(BundleRequest):
    children: list[str] = Field(description="Child bundle names that tile the parent's range.")


class UsageModel(BaseModel):
    usage: float
    limit: float


class BundleStatsModel(BaseModel):
    bundle: str
    msg_rate_in: float = 0
    msg_rate_out: float = 0
    msg_throughput_in: float = Field(0, description="bytes/s")
    msg_throughput_out: float = Field(0, description="bytes/s")
    topics: int = 0
    producers: int = 0
    consumers: int = 0
    topic_loads: dict[int, tuple[float, float]] = Field(
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


def create_app(broker: SimulatedBroker) -> FastAPI:
    app = FastAPI(
        title="trimtab broker webhook contract",
        version="1",
        description="What a broker implements so a trimtab agent can manage it. Every operation is idempotent; "
        "any 2xx is success, anything else is retried by the agent with backoff.",
    )
    install_error_handlers(app)

    async def guarded(op: Any) -> dict[str, bool]:
        try:
            await op
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

    @app.post("/trimtab/v1/bundles/acquire", summary="Start serving a bundle")
    async def acquire(req: BundleRequest) -> dict[str, bool]:
        _check(req.bundle)
        return await guarded(broker.acquire(req.bundle))

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
        return broker.snapshot()

    return app
