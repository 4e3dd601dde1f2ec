"""The agent's HTTP API (FastAPI): lookups, ownership and admin split, health, metrics, and the simulated
broker's controls. Typed request/response models give the OpenAPI spec at ``/openapi.json``; bad input
gets a 4xx with a message, a lookup that cannot settle gets a retryable 503.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Query
from pydantic import BaseModel, Field

from trimtab.channel.bundles import parse_bundle
from trimtab.cluster.http import (
    ErrorBody,
    add_probes,
    brokers_view,
    error_response,
    install_error_handlers,
    ownership_view,
)
from trimtab.errors import BundleError, LookupTimeout, RequestError

if TYPE_CHECKING:
    from trimtab.agent.daemon import Agent


class LookupResponse(BaseModel):
    topic: str
    bundle: str
    owner: str = Field(description="Broker id of the owner.")
    url: str | None = Field(
        description="The owner's service URL (null if the owner's registration is unknown)."
    )
    state: str
    version: int
    how: str = Field(
        description="owned: answered at once; assigned: this lookup assigned it; waited: an in-flight bundle settled"
    )


class RecordModel(BaseModel):
    state: str
    dst: str | None
    src: str | None
    version: int
    force: bool
    ts: int
    writer: str
    children: dict[str, str | None] | None = None


class BundleResponse(BaseModel):
    bundle: str
    record: RecordModel | None = Field(description="null when the bundle is in Init")
    owner: str | None
    owner_url: str | None


class SplitRequest(BaseModel):
    bundle: str
    algorithm: str | None = Field(
        None,
        description="range_equally_divide | topic_count_equally_divide | specified_positions_divide | "
        "flow_or_qps_equally_divide (default: split.algorithm, or specified_positions_divide with boundaries)",
    )
    boundaries: list[str] = Field(
        default_factory=list, description="Hex positions (0x...) for specified_positions_divide."
    )


class SplitResponse(BaseModel):
    bundle: str
    children: list[str]
    reason: str


class SimLoadRequest(BaseModel):
    scale: float | None = Field(None, ge=0, description="Global load multiplier.")
    namespace_scale: dict[str, float] = Field(
        default_factory=dict, description="Per-namespace multipliers to set."
    )


class SimFaultRequest(BaseModel):
    op: str = Field(description="acquire | fence | close | prewarm | split | sample")
    times: int = Field(1, ge=1, le=10_000)
    latency_s: float | None = Field(
        None, ge=0, le=60, description="Extra latency for every call from now on."
    )


def _record(rec: Any) -> RecordModel | None:
    return None if rec is None else RecordModel(**{k: v for k, v in rec.to_json().items() if k != "schema"})


def create_app(agent: Agent) -> FastAPI:
    app = FastAPI(
        title="trimtab agent",
        version="1",
        description="Lookups and ownership for one broker's sidecar agent.",
    )

    install_error_handlers(app)
    err = error_response

    @app.get(
        "/v1/lookup",
        response_model=LookupResponse,
        responses={400: {"model": ErrorBody}, 503: {"model": ErrorBody}},
        summary="Who owns this topic? Assigns the bundle if nobody does.",
    )
    async def lookup(
        topic: str | None = Query(
            None, description="Full topic name, e.g. persistent://public/default/orders"
        ),
    ) -> Any:
        t0 = time.perf_counter()
        if not topic:
            agent.metrics.lookups.labels("bad_request").inc()
            return err(
                400, "missing query parameter 'topic' (a full topic name, e.g. persistent://tenant/ns/topic)"
            )
        if not agent.ready:
            agent.metrics.lookups.labels("unavailable").inc()
            return err(503, "agent is not ready (starting or draining)", retryable=True)
        channel_ok, channel_why = agent.channel_health()
        if not channel_ok:
            # Never answer from a table that is being rebuilt (history gap, follower restart).
            agent.metrics.lookups.labels("unavailable").inc()
            return err(503, f"agent's channel view is not ready: {channel_why}", retryable=True)
        try:
            res = await agent.lookups.lookup(topic)
        except RequestError as e:
            result = (
                "timeout"
                if isinstance(e, LookupTimeout)
                else "bad_request"
                if e.status == 400
                else "unavailable"
            )
            agent.metrics.lookups.labels(result).inc()
            agent.metrics.lookup_seconds.labels(result).observe(time.perf_counter() - t0)
            return err(e.status, str(e), retryable=e.retryable)
        agent.metrics.lookups.labels(res.how).inc()
        agent.metrics.lookup_seconds.labels(res.how).observe(time.perf_counter() - t0)
        return LookupResponse(
            topic=res.topic,
            bundle=res.bundle,
            owner=res.owner,
            url=res.url,
            state=res.state,
            version=res.version,
            how=res.how,
        )

    @app.get(
        "/v1/bundles",
        response_model=BundleResponse,
        responses={400: {"model": ErrorBody}},
        summary="One bundle's channel state",
    )
    async def bundle(bundle: str = Query(..., description="tenant/namespace/0xLLLLLLLL_0xUUUUUUUU")) -> Any:
        try:
            parse_bundle(bundle)
        except BundleError as e:
            return err(400, str(e))
        assert agent.channel is not None
        rec = agent.channel.table.get(bundle)
        owner = rec.owner() if rec else None
        return BundleResponse(
            bundle=bundle, record=_record(rec), owner=owner, owner_url=agent.url_of(owner) if owner else None
        )

    @app.get("/v1/ownership", summary="Bundle -> record for every bundle (optionally of one broker)")
    async def ownership(broker: str | None = None, namespace: str | None = None) -> dict[str, Any]:
        assert agent.channel is not None
        return ownership_view(agent.channel.table.items(), broker, namespace)

    @app.get("/v1/brokers", summary="Live brokers with their latest load report")
    async def brokers() -> dict[str, Any]:
        return brokers_view(agent.registry.brokers, agent.loads.snapshot())

    @app.post(
        "/v1/admin/split",
        response_model=SplitResponse,
        status_code=202,
        responses={
            400: {"model": ErrorBody},
            409: {"model": ErrorBody},
            422: {"model": ErrorBody},
            503: {"model": ErrorBody},
        },
        summary="Split a bundle this broker owns",
    )
    async def split(req: SplitRequest) -> Any:
        from trimtab.agent.daemon import SplitRefused

        try:
            positions = [int(b, 16) for b in req.boundaries]
        except ValueError:
            return err(400, f"boundaries must be hex numbers like 0x40000000, got {req.boundaries}")
        try:
            d = await agent.admin_split(req.bundle, req.algorithm, positions)
        except SplitRefused as e:
            return err(e.status, str(e), retryable=e.status == 503)
        ns = req.bundle.rsplit("/", 1)[0]
        return SplitResponse(
            bundle=req.bundle, children=[f"{ns}/{c.name}" for c in d.children], reason=d.reason
        )

    @app.get("/v1/status", summary="Agent status")
    async def status() -> Any:
        return agent.status()

    add_probes(
        app,
        tick_age=lambda: time.monotonic() - agent.last_tick,
        started=lambda: agent.ready,
        ready=lambda: (
            agent.ready and not agent.draining and agent.channel_health()[0],
            {"draining": agent.draining, "channel": agent.channel_health()[1]},
        ),
        registry=lambda: agent.prom,
        ready_summary="Readiness: registered, channel caught up, not draining",
    )

    # ------------------------------------------------------------------ simulated broker controls
    @app.get("/v1/sim/state", summary="(simulated broker) serving set, calls and acquire/release timeline")
    async def sim_state() -> Any:
        if agent.sim is None:
            return err(404, "this agent does not run the simulated broker")
        return agent.sim.snapshot()

    @app.post("/v1/sim/load", summary="(simulated broker) change the synthetic load")
    async def sim_load(req: SimLoadRequest) -> Any:
        if agent.sim is None:
            return err(404, "this agent does not run the simulated broker")
        if req.scale is not None:
            agent.sim.model.scale = req.scale
        agent.sim.model.namespace_scale.update(req.namespace_scale)
        agent.reporter.poke()
        return {"scale": agent.sim.model.scale, "namespace_scale": agent.sim.model.namespace_scale}

    @app.post("/v1/sim/faults", summary="(simulated broker) inject adapter failures or latency")
    async def sim_faults(req: SimFaultRequest) -> Any:
        if agent.sim is None:
            return err(404, "this agent does not run the simulated broker")
        agent.sim.fail_next(req.op, req.times)
        if req.latency_s is not None:
            agent.sim.extra_latency_s = req.latency_s
        return {"ok": True}

    return app
