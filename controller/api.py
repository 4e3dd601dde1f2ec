"""The controller's HTTP API: admin basics (transfer, unload, split, ownership, brokers, leader, shedding
pause/resume, healing status), health and metrics. Admin writes sent to a follower get ``307`` to the
leader (method and body preserved), so any controller address works for operators and scripts.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import httpx
import msgspec
from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse
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
from trimtab.errors import BundleError

if TYPE_CHECKING:
    from trimtab.controller.daemon import Controller


class TransferRequest(BaseModel):
    bundle: str = Field(description="tenant/namespace/0xLLLLLLLL_0xUUUUUUUU")
    broker: str = Field(description="Destination broker id")


class UnloadRequest(BaseModel):
    bundle: str


class SplitRequest(BaseModel):
    bundle: str
    algorithm: str | None = None
    boundaries: list[str] = Field(default_factory=list)


class SheddingRequest(BaseModel):
    paused: bool
    by: str = Field("api", description="Who asked (recorded in ZooKeeper and the event)")


def create_app(ctl: Controller) -> FastAPI:
    app = FastAPI(
        title="trimtab controller", version="1", description="Leader-elected balancing and healing."
    )

    install_error_handlers(app)
    err = error_response

    def check_bundle(bundle: str) -> JSONResponse | None:
        try:
            parse_bundle(bundle)
        except BundleError as e:
            return err(400, str(e))
        return None

    @app.get("/v1/leader", summary="Who leads, with which term")
    async def leader() -> Any:
        cur = ctl.election.leader()
        return {
            "leader": msgspec.to_builtins(cur) if cur else None,
            "me": ctl.me,
            "is_leader": ctl.is_leader,
            "safe_mode": ctl.safe_mode(),
        }

    @app.get("/v1/ownership", summary="Bundle -> record (optionally of one broker or namespace)")
    async def ownership(broker: str | None = None, namespace: str | None = None) -> Any:
        assert ctl.channel is not None
        return ownership_view(ctl.channel.table.items(), broker, namespace)

    @app.get("/v1/brokers", summary="Live brokers with their latest load")
    async def brokers() -> Any:
        return brokers_view(ctl.registry.brokers, ctl.loads.snapshot())

    @app.post(
        "/v1/admin/transfer",
        status_code=202,
        responses={400: {"model": ErrorBody}, 404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
    )
    async def transfer(req: TransferRequest) -> Any:
        if (bad := check_bundle(req.bundle)) is not None:
            return bad
        rec = await ctl.admin_move(req.bundle, req.broker)
        ctl.metrics.admin.labels("transfer", "ok").inc()
        return {"bundle": req.bundle, "record": rec.to_json()}

    @app.post(
        "/v1/admin/unload",
        status_code=202,
        responses={400: {"model": ErrorBody}, 404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
    )
    async def unload(req: UnloadRequest) -> Any:
        if (bad := check_bundle(req.bundle)) is not None:
            return bad
        rec = await ctl.admin_move(req.bundle, None)
        ctl.metrics.admin.labels("unload", "ok").inc()
        return {"bundle": req.bundle, "record": rec.to_json()}

    @app.post("/v1/admin/split", status_code=202, summary="Split a bundle (forwarded to its owner's agent)")
    async def split(req: SplitRequest) -> Any:
        if (bad := check_bundle(req.bundle)) is not None:
            return bad
        ctl.require_leader()
        assert ctl.channel is not None
        cur = ctl.channel.table.get(req.bundle)
        owner = cur.owner() if cur else None
        info = ctl.registry.brokers.get(owner) if owner else None
        if info is None:
            return err(
                409,
                f"{req.bundle} has no live owner to split it (state {cur.state.value if cur else 'init'})",
            )
        async with httpx.AsyncClient(timeout=30) as client:
            r = await client.post(f"{info.http_url}/v1/admin/split", json=req.model_dump())
        ctl.metrics.admin.labels("split", "ok" if r.is_success else "failed").inc()
        return JSONResponse(r.json(), status_code=r.status_code)

    @app.post("/v1/admin/shedding", summary="Pause or resume shedding (persisted; survives failover)")
    async def shedding(req: SheddingRequest) -> Any:
        sw = await ctl.set_shedding_paused(req.paused, req.by)
        ctl.metrics.admin.labels("shedding", "ok").inc()
        return msgspec.to_builtins(sw)

    @app.get("/v1/healing", summary="Failed brokers, healing progress and pause reason")
    async def healing() -> Any:
        return ctl.healer.status()

    @app.get("/v1/status", summary="Leader, brokers with load and bundle counts, load std, recent decisions")
    async def status() -> Any:
        return ctl.status()

    @app.get("/v1/bundles", summary="One bundle's channel state")
    async def bundle(bundle: str = Query(...)) -> Any:
        if (bad := check_bundle(bundle)) is not None:
            return bad
        assert ctl.channel is not None
        rec = ctl.channel.table.get(bundle)
        return {"bundle": bundle, "record": rec.to_json() if rec else None}

    add_probes(
        app,
        tick_age=lambda: time.monotonic() - ctl.last_tick,
        started=lambda: ctl.ready,
        ready=lambda: (
            ctl.ready and ctl.zk.connected and ctl.channel_health()[0],
            {"leader": ctl.is_leader, "channel": ctl.channel_health()[1]},
        ),
        registry=lambda: ctl.prom,
        ready_summary="Readiness: warm (channel and load views caught up) and connected",
    )

    return app
