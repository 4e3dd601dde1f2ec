"""The controller's HTTP API: admin basics (transfer, unload, split, drain, ownership, brokers, leader,
shedding pause/resume, healing status; namespaces in controller/namespace_api.py), health and metrics.
Admin writes sent to a follower get ``307`` to the leader (method and body preserved), so any controller
address works for operators and scripts; their dry runs (``"dry_run": true``) are answered by whichever
controller gets them, from its own replica.

Who may call what (docs/security.md): the views need a read token, the writes (and their dry runs) an admin
token, the probes are public; each router declares it. Routes raise their refusals (split and drain raise
the agent's own, as it gave it); the app's one error handler (:mod:`trimtab.cluster.http_errors`) answers.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import msgspec
from fastapi import APIRouter, FastAPI, Query, Response
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, Field

from trimtab.balance.load import BrokerLoadData
from trimtab.channel.client import ChannelClient
from trimtab.cluster.auth import ADMIN, READ, Authenticator, secure_app
from trimtab.cluster.http import add_probes, brokers_view, ownership_view
from trimtab.cluster.http_errors import ErrorBody, install_error_handlers, require_bundle
from trimtab.cluster.kvview import KeyValueView
from trimtab.cluster.liveness import Liveness
from trimtab.cluster.zk import BrokerRegistry
from trimtab.controller.admin import Admin
from trimtab.controller.healing import Healer
from trimtab.controller.leadership import Leadership
from trimtab.controller.live_settings import LiveSettings
from trimtab.controller.namespace_admin import NamespaceAdmin
from trimtab.controller.namespace_api import add_namespace_routes
from trimtab.controller.operations import OperationsJob, operation_detail
from trimtab.controller.placement.admin import PlacementAdmin
from trimtab.controller.placement.api import add_placement_routes
from trimtab.controller.status import StatusReport


@dataclass(frozen=True)
class ControllerApi:
    """What the HTTP API reads and calls; built by :mod:`trimtab.controller.wiring`."""

    leadership: Leadership
    channel: ChannelClient
    registry: BrokerRegistry
    loads: KeyValueView[BrokerLoadData]
    admin: Admin
    healer: Healer
    status: StatusReport
    liveness: Liveness
    prom: CollectorRegistry
    placement: PlacementAdmin
    namespaces: NamespaceAdmin
    operations: OperationsJob
    live: LiveSettings


_DRY_RUN = (
    "Check and answer what would happen (200), or the refusal the real call would give; publish nothing. "
    "Any controller answers a dry run from its own replica (no redirect to the leader)."
)


class UnloadRequest(BaseModel):
    bundle: str = Field(description="tenant/namespace/0xLLLLLLLL_0xUUUUUUUU")
    dry_run: bool = Field(False, description=_DRY_RUN)
    reason: str = Field("", max_length=1024, description="Why (kept with the operation)")
    by: str = Field("admin", max_length=256, description="Who asked (kept with the operation)")


class TransferRequest(UnloadRequest):
    broker: str = Field(description="Destination broker id")


class MergeRequest(BaseModel):
    bundles: list[str] = Field(
        min_length=2, max_length=2, description="Two adjacent bundles of one namespace, owned by one broker"
    )
    dry_run: bool = Field(False, description=_DRY_RUN)
    by: str = Field("admin", max_length=256, description="Who asked (recorded with the decision)")


class SplitRequest(BaseModel):
    bundle: str
    algorithm: str | None = None
    boundaries: list[str] = Field(default_factory=list)
    dry_run: bool = Field(
        False,
        description="Ask the owner's agent for the children it would make, without splitting (200); any "
        "controller forwards a dry run",
    )


class DrainRequest(BaseModel):
    broker: str = Field(description="The broker id to drain (as registered, usually host:port)")
    dry_run: bool = Field(
        False,
        description="Ask the broker's agent where each bundle it owns would go now (200); nothing moves. "
        "Any controller forwards a dry run",
    )


class MoveRecord(BaseModel):
    """The record a dry run would publish."""

    state: str = Field(description="releasing")
    src: str = Field(description="The current owner")
    dst: str | None = Field(description="The destination (null: an unload; the next lookup assigns it)")
    version: int = Field(description="The record's version")


class MoveDryRun(BaseModel):
    """What a transfer or unload would do."""

    bundle: str
    dry_run: bool = Field(description="Always true")
    would: MoveRecord
    why: str = Field(description="Why the move is allowed: owner, destination, placement rules")


class SheddingRequest(BaseModel):
    paused: bool
    by: str = Field("api", description="Who asked (recorded in ZooKeeper and the event)")


def create_app(ctl: ControllerApi, *, auth: Authenticator | None = None) -> FastAPI:
    """The controller's app; ``auth`` checks the bearer tokens (None: no token is accepted, every
    protected route refuses)."""
    app = FastAPI(
        title="trimtab controller", version="1", description="Leader-elected balancing and healing."
    )
    install_error_handlers(app)
    _views(app, ctl)
    _admin(app, ctl)
    _operations(app, ctl)
    add_placement_routes(app, lambda: ctl.placement)
    add_namespace_routes(app, lambda: ctl.namespaces)
    # The probes read ``ctl`` late: the OpenAPI spec is rendered from an app built without one.
    add_probes(
        app,
        tick_age=lambda: ctl.liveness.tick_age(),  # noqa: PLW0108
        started=lambda: ctl.liveness.ready,
        ready=lambda: (
            ctl.liveness.ready and ctl.leadership.zk.connected and ctl.channel.health()[0],
            {"leader": ctl.leadership.is_leader, "channel": ctl.channel.health()[1]},
        ),
        registry=lambda: ctl.prom,
        ready_summary="Readiness: warm (channel and load views caught up) and connected",
    )
    secure_app(app, auth)
    return app


def _views(app: FastAPI, ctl: ControllerApi) -> None:
    """Read-only views (a read token): any controller answers them from its own (warm) replica."""
    router = APIRouter(dependencies=[READ])

    @router.get("/v1/leader", summary="Who leads, with which term")
    async def leader() -> Any:
        lead = ctl.leadership
        cur = lead.election.leader()
        return {
            "leader": msgspec.to_builtins(cur) if cur else None,
            "me": lead.me,
            "is_leader": lead.is_leader,
            "safe_mode": lead.safe_mode(),
        }

    @router.get("/v1/ownership", summary="Bundle -> record (optionally of one broker or namespace)")
    async def ownership(broker: str | None = None, namespace: str | None = None) -> Any:
        return ownership_view(ctl.channel.table.items(), broker, namespace)

    @router.get("/v1/brokers", summary="Live brokers with their latest load")
    async def brokers() -> Any:
        return brokers_view(ctl.registry.brokers, ctl.loads.snapshot())

    @router.get("/v1/healing", summary="Failed brokers, healing progress and pause reason")
    async def healing() -> Any:
        return ctl.healer.status()

    @router.get(
        "/v1/status", summary="Leader, brokers with load and bundle counts, load std, recent decisions"
    )
    async def status() -> Any:
        return ctl.status.render()

    @router.get("/v1/bundles", summary="One bundle's channel state")
    async def bundle(bundle: str = Query(...)) -> Any:
        require_bundle(bundle)
        rec = ctl.channel.table.get(bundle)
        return {"bundle": bundle, "record": rec.to_json() if rec else None}

    app.include_router(router)


def _admin(app: FastAPI, ctl: ControllerApi) -> None:
    """Leader-only writes (a follower answers 307 to the leader, or a retryable 503 while there is none);
    their dry runs are answered by any controller. An admin token, dry runs included."""
    router = APIRouter(dependencies=[ADMIN])
    refusals: dict[int | str, dict[str, Any]] = {
        400: {"model": ErrorBody},
        404: {"model": ErrorBody},
        409: {"model": ErrorBody},
    }

    moves = {**refusals, 200: {"model": MoveDryRun, "description": "A dry run: what would be published"}}

    @router.post(
        "/v1/admin/transfer",
        status_code=202,
        responses=moves,
        summary="Move a bundle to a broker (202: the Releasing record is published; 200: a dry run)",
    )
    async def transfer(req: TransferRequest, response: Response) -> Any:
        return await _move(ctl, response, req, req.broker)

    @router.post(
        "/v1/admin/unload",
        status_code=202,
        responses=moves,
        summary="Unload a bundle; the next lookup assigns it (202: published; 200: a dry run)",
    )
    async def unload(req: UnloadRequest, response: Response) -> Any:
        return await _move(ctl, response, req, None)

    @router.post(
        "/v1/admin/split",
        status_code=202,
        responses={200: {"description": "A dry run: the children the owner's agent would make"}},
        summary="Split a bundle (forwarded to its owner's agent)",
    )
    async def split(req: SplitRequest, response: Response) -> Any:
        require_bundle(req.bundle)
        if req.dry_run:
            response.status_code = 200
        return await ctl.admin.split(req.bundle, req.model_dump())

    @router.post(
        "/v1/admin/merge",
        status_code=202,
        responses={**refusals, 200: {"description": "A dry run: the merge that would start and why"}},
        summary="Merge two adjacent bundles owned by one broker into one (202: both Merging records "
        "published; 200: a dry run)",
    )
    async def merge(req: MergeRequest, response: Response) -> Any:
        a, b = req.bundles
        require_bundle(a)
        require_bundle(b)
        if req.dry_run:
            plan = ctl.admin.dry_run_merge(a, b)
            response.status_code = 200
            return {
                "dry_run": True,
                "parents": list(plan.parents),
                "merged": plan.merged,
                "owner": plan.owner,
                "why": plan.why,
            }
        return await ctl.admin.merge(a, b, requested_by=req.by)

    @router.post(
        "/v1/admin/drain",
        status_code=202,
        responses={
            200: {
                "description": "A dry run: the bundles the broker owns and where the drain operation would move each now"
            },
            404: {"model": ErrorBody, "description": "The broker is not live"},
            409: {"model": ErrorBody, "description": "The broker is draining already"},
        },
        summary="Drain a broker: move every bundle it owns elsewhere (an operation of the leader's)",
        description="The broker's agent marks itself draining in its registration (nothing new is assigned "
        "to it) and stays up; the leader moves every bundle it owns to brokers placement allows (a plain "
        "unload when none is) as an operation stored in ZooKeeper -- resumed by the next leader if this one "
        "dies; /v1/admin/ops/{id} shows its progress. Answers {broker, operation, agent}. To take it back "
        "into service, use maintenance (start, then end) instead, or restart the agent. 202 when the drain started; "
        "404 if the broker is not live; 409 if it is draining already. The real call is the leader's; a dry "
        "run is answered by any controller from its replica: the moves the leader's drain operation would "
        "store now (planned_by: leader).",
    )
    async def drain(req: DrainRequest, response: Response) -> Any:
        if req.dry_run:
            response.status_code = 200
        return await ctl.admin.drain(req.broker, dry_run=req.dry_run)

    @router.post("/v1/admin/shedding", summary="Pause or resume shedding (persisted; survives failover)")
    async def shedding(req: SheddingRequest) -> Any:
        return msgspec.to_builtins(await ctl.admin.set_shedding_paused(req.paused, req.by))

    app.include_router(router)


class OperationVerb(BaseModel):
    reason: str | None = Field(
        None, max_length=1024, description="Why (kept as the operation's state_reason)"
    )


def _operations(app: FastAPI, ctl: ControllerApi) -> None:
    """The leader's operations (docs/operations.md, "Operations"): views with a read token, verbs with an
    admin token; a follower answers 307 to the leader (only the leader holds them)."""
    leader_only: dict[int | str, dict[str, Any]] = {
        307: {"description": "Not the leader: the same request at the leader's address"},
        503: {
            "model": ErrorBody,
            "description": "No leader right now, or it has not read the operations yet",
        },
    }
    view = APIRouter(dependencies=[READ])

    @view.get(
        "/v1/admin/ops",
        responses=leader_only,
        summary="Every operation the leader holds: [{id, kind, state, reason, progress: {done, total}}]",
    )
    async def ops_list() -> Any:
        ctl.leadership.require_leader()
        return [op.summary() for op in ctl.operations.list()]

    @view.get(
        "/v1/admin/ops/{op_id}",
        responses={**leader_only, 404: {"model": ErrorBody, "description": "No such operation"}},
        summary="One operation: its summary, who asked, its state's reason, outcomes and moves",
    )
    async def ops_show(op_id: str, moves: int = Query(100, ge=0, le=100_000)) -> Any:
        ctl.leadership.require_leader()
        return operation_detail(ctl.operations.get(op_id), moves)

    write = APIRouter(dependencies=[ADMIN])

    @write.post(
        "/v1/admin/ops/{op_id}/{verb}",
        responses={
            **leader_only,
            400: {"model": ErrorBody, "description": "Not a verb (pause, resume, cancel)"},
            404: {"model": ErrorBody, "description": "No such operation"},
            409: {
                "model": ErrorBody,
                "description": "The verb does not apply: the operation has finished, or is of a kind it "
                "never applies to (split and merge: one channel transition; heal: no cancel)",
            },
        },
        summary="Pause, resume or cancel an operation (persisted: a new leader keeps it so)",
        description="pause: moves already started finish, no new one starts. resume: carries on. cancel: moves "
        "already started finish (a move cannot be taken back half made), the rest are not made. Answers the "
        "operation's summary.",
    )
    async def ops_verb(op_id: str, verb: str, req: OperationVerb | None = None) -> Any:
        ctl.leadership.require_leader()
        why = (req.reason if req is not None else None) or "operator"
        return (await ctl.operations.verb(op_id, verb, why=why)).summary()

    @view.get("/v1/admin/maintenance", summary="Brokers in maintenance, with their operation and deadline")
    async def maintenance_list() -> Any:
        return await ctl.admin.maintenance_list()

    @write.post(
        "/v1/admin/maintenance",
        status_code=202,
        responses={
            **leader_only,
            400: {"model": ErrorBody, "description": "A deadline that is not a positive number of seconds"},
            404: {"model": ErrorBody, "description": "The broker is not live"},
            409: {
                "model": ErrorBody,
                "description": "In maintenance or draining already, or its failure domain's budget is used up",
            },
        },
        summary="Put a broker in maintenance: drained before the deadline, kept out of service until ended",
    )
    async def maintenance_start(req: MaintenanceStart) -> Any:
        return await ctl.admin.maintenance_start(
            req.broker, deadline_s=req.deadline_s, reason=req.reason, requested_by=req.by
        )

    @write.post(
        "/v1/admin/maintenance/{broker}/end",
        responses={**leader_only, 404: {"model": ErrorBody, "description": "Not in maintenance"}},
        summary="End a broker's maintenance: it takes bundles again, as balance requires",
    )
    async def maintenance_end(broker: str, by: str = Query("admin", max_length=256)) -> Any:
        return await ctl.admin.maintenance_end(broker, requested_by=by)

    @view.get(
        "/v1/admin/explain",
        responses={**leader_only, 400: {"model": ErrorBody, "description": "Not a bundle name"}},
        summary="Why the cluster is not balanced (or, with ?bundle=, why that bundle is where it is and "
        "did not move), from the leader's last decisions: reasons as stable words with a sentence each",
    )
    async def explain(bundle: str | None = None) -> Any:
        if bundle is None:
            return ctl.status.explain()
        require_bundle(bundle)
        return ctl.status.explain_bundle(bundle)

    @view.get(
        "/v1/admin/settings",
        summary="The settings changeable at run time: which keys, the overrides, the values in force",
    )
    async def live_settings() -> Any:
        return ctl.live.view()

    @write.put(
        "/v1/admin/settings",
        responses={
            **leader_only,
            400: {
                "model": ErrorBody,
                "description": "A key that is not live, or a value that does not validate",
            },
        },
        summary="Change live settings (stored in ZooKeeper; every controller applies them, no restart)",
        description="set: key -> value (e.g. operations.max_in_flight); reset: keys back to the configured "
        "value. Validated as a whole: nothing changes unless every value is valid. The leader's next "
        "operations pass uses them. Answers the live settings in force.",
    )
    async def change_live_settings(req: LiveSettingsChange) -> Any:
        ctl.leadership.require_leader()
        return await asyncio.to_thread(ctl.live.change, req.set, req.reset, by=req.by)

    app.include_router(view)
    app.include_router(write)


class MaintenanceStart(BaseModel):
    broker: str = Field(description="The broker id (as registered)")
    deadline_s: float = Field(
        allow_inf_nan=False, description="Seconds from now by which it must be drained (at most a week)"
    )
    reason: str = Field("", max_length=1024, description="Why (kept with the operation)")
    by: str = Field("admin", max_length=256, description="Who asked")


class LiveSettingsChange(BaseModel):
    set: dict[str, Any] = Field(
        default_factory=dict, description="key -> value, e.g. operations.max_in_flight"
    )
    reset: list[str] = Field(default_factory=list, description="keys back to their configured value")
    by: str = Field("admin", max_length=256, description="Who asked (logged, stored)")


async def _move(ctl: ControllerApi, response: Response, req: UnloadRequest, dst: str | None) -> Any:
    bundle = req.bundle
    require_bundle(bundle)
    if req.dry_run:
        plan = ctl.admin.dry_run_move(bundle, dst)
        response.status_code = 200
        return MoveDryRun(bundle=bundle, dry_run=True, would=MoveRecord(**plan.would()), why=plan.why)
    rec, op = await ctl.admin.move(bundle, dst, reason=req.reason, requested_by=req.by)
    return {"bundle": bundle, "record": rec.to_json(), "operation": op.summary()}
