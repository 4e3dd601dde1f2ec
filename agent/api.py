"""The agent's HTTP API (FastAPI): lookups, ownership, admin split and drain, health, metrics -- and, only on an
agent that runs the simulated broker, that broker's controls (``/v1/sim/*``). Typed request/response
models give the OpenAPI spec at ``/openapi.json``; bad input gets a 4xx with a message, a lookup that
cannot settle gets a retryable 503. Routes raise their refusals (:class:`~trimtab.errors.RequestError`);
the app's one error handler (:mod:`trimtab.cluster.http_errors`) answers them, in the one error shape.

:func:`create_app` takes the collaborators it serves (:class:`AgentApi`); the daemon's lifecycle is seen
through the small :class:`Lifecycle` protocol. Routes are grouped in routers per area, and each router
declares who may call it (docs/security.md): the lookup and the probes are public, the views need a read
token, everything that changes something needs an admin token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from fastapi import APIRouter, FastAPI, Query, Request, Response
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, Field

from trimtab.agent.adapters.simulated import SimulatedBroker
from trimtab.agent.lookup import LookupService
from trimtab.agent.lookup_http import answer_lookup
from trimtab.agent.metrics import AgentMetrics
from trimtab.agent.ratelimit import ClientRateLimiter
from trimtab.agent.splits import SplitScheduler
from trimtab.balance.load import BrokerLoadData
from trimtab.channel.client import ChannelClient
from trimtab.cluster.auth import ADMIN, PUBLIC, READ, Authenticator, secure_app
from trimtab.cluster.http import add_probes, brokers_view, ownership_view
from trimtab.cluster.http_errors import ErrorBody, install_error_handlers, require_bundle
from trimtab.cluster.kvview import KeyValueView
from trimtab.cluster.zk import BrokerRegistry
from trimtab.errors import RequestError

log = structlog.get_logger("trimtab.lookup")


class Lifecycle(Protocol):
    """The daemon's state as the API reads it (:class:`agent.daemon.Agent`)."""

    @property
    def ready(self) -> bool: ...

    @property
    def draining(self) -> bool: ...

    @property
    def last_tick(self) -> float: ...

    def status(self) -> Mapping[str, Any]: ...

    async def start_drain(self, *, mark_only: bool = False) -> Mapping[str, Any]: ...

    async def undrain(self) -> Mapping[str, Any]: ...

    def drain_plan(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class AgentApi:
    """What the routes serve."""

    node: Lifecycle
    channel: ChannelClient
    lookups: LookupService
    splits: SplitScheduler
    registry: BrokerRegistry
    loads: KeyValueView[BrokerLoadData]
    metrics: AgentMetrics
    prom: CollectorRegistry
    limiter: ClientRateLimiter  # per-client lookup rate (agent.lookup_rate_per_client)

    def url_of(self, broker: str) -> str | None:
        info = self.registry.brokers.get(broker)
        return info.service_url if info is not None else None


@dataclass(frozen=True)
class SimControls:
    """The simulated broker this agent runs, and how to make the load reporter notice a change now."""

    broker: SimulatedBroker
    poke: Callable[[], None]


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
    dry_run: bool = Field(
        False,
        description="Make every check and answer the children (200) without splitting; refusals are the "
        "real call's.",
    )


class SplitResponse(BaseModel):
    bundle: str
    children: list[str]
    reason: str
    dry_run: bool = Field(False, description="True: nothing was published; these are the would-be children")


class DrainRequest(BaseModel):
    dry_run: bool = Field(
        False,
        description="Answer where each owned bundle would go now (200); nothing moves and nothing is marked.",
    )
    mark_only: bool = Field(
        False,
        description="Only mark the broker draining: the leader moves its bundles, as an operation it "
        "persists (what the controller's drain asks).",
    )


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


def create_app(
    api: AgentApi, sim: SimControls | None = None, *, auth: Authenticator | None = None
) -> FastAPI:
    """The agent's app; ``sim`` (the simulated broker, when the agent runs one) adds ``/v1/sim/*``;
    ``auth`` checks the bearer tokens (None: no token is accepted, every protected route refuses).

    Routes touch ``api`` only inside request handlers, so ``create_app(None)`` gives the OpenAPI spec."""
    app = FastAPI(
        title="trimtab agent",
        version="1",
        description="Lookups and ownership for one broker's sidecar agent.",
    )
    install_error_handlers(app)
    app.include_router(_lookup_routes(api))
    app.include_router(_view_routes(api))
    app.include_router(_admin_routes(api))
    add_probes(
        app,
        tick_age=lambda: time.monotonic() - api.node.last_tick,
        started=lambda: api.node.ready,
        ready=lambda: (
            api.node.ready and not api.node.draining and api.channel.health()[0],
            {"draining": api.node.draining, "channel": api.channel.health()[1]},
        ),
        registry=lambda: api.prom,
        ready_summary="Readiness: registered, channel caught up, not draining",
    )
    if sim is not None:
        app.include_router(_sim_routes(sim))
    secure_app(app, auth)
    return app


def _lookup_routes(api: AgentApi) -> APIRouter:
    """The lookup: public, since it is what the brokers' clients call to find a topic's owner -- so it is
    bounded: a token bucket per client address (429 with Retry-After), and a namespace nobody created is
    not created unless ``namespace.auto_create`` allows it (404; docs/security.md)."""
    router = APIRouter(dependencies=[PUBLIC])

    @router.get(
        "/v1/lookup",
        response_model=LookupResponse,
        responses={
            400: {"model": ErrorBody},
            404: {
                "model": ErrorBody,
                "description": "The topic's namespace does not exist and namespace.auto_create does not let "
                "lookups create it: an operator creates it (POST /v1/admin/namespaces on a controller)",
            },
            429: {
                "model": ErrorBody,
                "description": "This client address made more lookups than agent.lookup_rate_per_client "
                "allows (retryable; the Retry-After header says when, in seconds)",
            },
            503: {"model": ErrorBody},
        },
        summary="Who owns this topic? Assigns the bundle if nobody does.",
    )
    async def lookup(
        request: Request,
        topic: str | None = Query(
            None, description="Full topic name, e.g. persistent://public/default/orders"
        ),
    ) -> Any:
        # Served by FastLookup (agent/lookup_http.py) in the daemons; this route declares the operation and
        # answers the same (the same function), for an app served without the guard's fast path.
        client = request.client.host if request.client is not None else "unknown"
        res = await answer_lookup(api, client, topic)
        return LookupResponse.model_validate(res, from_attributes=True)  # LookupResult's fields, by name

    return router


def _view_routes(api: AgentApi) -> APIRouter:
    """Read-only views of the channel, the brokers and this agent (a read token)."""
    router = APIRouter(dependencies=[READ])

    @router.get(
        "/v1/bundles",
        response_model=BundleResponse,
        responses={400: {"model": ErrorBody}},
        summary="One bundle's channel state",
    )
    async def bundle(bundle: str = Query(..., description="tenant/namespace/0xLLLLLLLL_0xUUUUUUUU")) -> Any:
        require_bundle(bundle)
        rec = api.channel.table.get(bundle)
        owner = rec.owner() if rec else None
        return BundleResponse(
            bundle=bundle, record=_record(rec), owner=owner, owner_url=api.url_of(owner) if owner else None
        )

    @router.get("/v1/ownership", summary="Bundle -> record for every bundle (optionally of one broker)")
    async def ownership(broker: str | None = None, namespace: str | None = None) -> dict[str, Any]:
        return ownership_view(api.channel.table.items(), broker, namespace)

    @router.get("/v1/brokers", summary="Live brokers with their latest load report")
    async def brokers() -> dict[str, Any]:
        return brokers_view(api.registry.brokers, api.loads.snapshot())

    @router.get("/v1/status", summary="Agent status")
    async def status() -> Any:
        return api.node.status()

    return router


def _admin_routes(api: AgentApi) -> APIRouter:
    """The admin split and drain, dry runs included (an admin token)."""
    router = APIRouter(dependencies=[ADMIN])

    @router.post(
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
    async def split(req: SplitRequest, response: Response) -> Any:
        require_bundle(req.bundle)
        try:
            positions = [int(b, 16) for b in req.boundaries]
        except ValueError:
            raise RequestError(
                400, f"boundaries must be hex numbers like 0x40000000, got {req.boundaries}"
            ) from None
        # A SplitRefused (not the owner, in flight, no boundary) is answered as it is: 503 is retryable.
        d = await api.splits.admin_split(req.bundle, req.algorithm, positions, dry_run=req.dry_run)
        ns = req.bundle.rsplit("/", 1)[0]
        if req.dry_run:
            response.status_code = 200
        return SplitResponse(
            bundle=req.bundle,
            children=[f"{ns}/{c.name}" for c in d.children],
            reason=d.reason,
            dry_run=req.dry_run,
        )

    @router.post(
        "/v1/admin/drain",
        status_code=202,
        responses={
            200: {"description": "A dry run: each owned bundle and where it would go now"},
            409: {"model": ErrorBody, "description": "Draining already"},
            503: {"model": ErrorBody, "description": "Starting or stopping: retry"},
        },
        summary="Drain this broker without exiting: move every bundle it owns elsewhere",
        description="Marks the broker draining in its registration (nothing new is assigned to it) and "
        "transfers every bundle it owns to other brokers, as on SIGTERM, but the agent stays up and "
        "registered as draining; /v1/status shows the progress under 'drain'. Returns at once (202). "
        "Undrain is not supported: restart the agent.",
    )
    async def drain(req: DrainRequest, response: Response) -> Any:
        if req.dry_run:
            response.status_code = 200
            return api.node.drain_plan()
        return {"dry_run": False, **(await api.node.start_drain(mark_only=req.mark_only))}

    @router.post(
        "/v1/admin/undrain",
        responses={409: {"model": ErrorBody, "description": "Not draining, or draining by itself"}},
        summary="End a drain the leader ran (maintenance over): the broker takes bundles again",
    )
    async def undrain() -> Any:
        return await api.node.undrain()

    return router


def _sim_routes(sim: SimControls) -> APIRouter:
    """The simulated broker's controls (only on an agent that runs it): its state to a read token, its load
    and faults to an admin token."""
    router = APIRouter()
    broker = sim.broker

    @router.get(
        "/v1/sim/state",
        summary="(simulated broker) serving set, calls and acquire/release timeline",
        dependencies=[READ],
    )
    async def sim_state() -> Any:
        return broker.snapshot()

    @router.post("/v1/sim/load", summary="(simulated broker) change the synthetic load", dependencies=[ADMIN])
    async def sim_load(req: SimLoadRequest) -> Any:
        if req.scale is not None:
            broker.model.scale = req.scale
        broker.model.namespace_scale.update(req.namespace_scale)
        sim.poke()
        return {"scale": broker.model.scale, "namespace_scale": broker.model.namespace_scale}

    @router.post(
        "/v1/sim/faults",
        summary="(simulated broker) inject adapter failures or latency",
        dependencies=[ADMIN],
    )
    async def sim_faults(req: SimFaultRequest) -> Any:
        broker.fail_next(req.op, req.times)
        if req.latency_s is not None:
            broker.extra_latency_s = req.latency_s
        return {"ok": True}

    return router
