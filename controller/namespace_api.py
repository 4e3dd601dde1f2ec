"""The controller's namespace routes (docs/security.md, "Namespaces and lookup limits"): list (a read token,
any controller), create and delete (an admin token; the leader's: a follower answers ``307`` to the leader,
or a retryable ``503`` while there is none). Every refusal is ``{"error", "retryable"}``.

The routes reach the service through a callable, so the OpenAPI spec renders without a live controller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Path, Query, Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from trimtab.balance.namespaces import PART_MAX
from trimtab.cluster.auth import ADMIN, READ
from trimtab.cluster.http_errors import ErrorBody
from trimtab.controller.namespace_admin import NamespaceAdmin, NamespaceDeleted

_PART_RULE = f"1-{PART_MAX} of letters, digits, '_', '.', '=', ':', '-', starting with a letter or a digit"


class NamespaceSummary(BaseModel):
    bundles: int | None = Field(description="Bundles in its layout (null: its znode does not decode)")
    owned: int = Field(description="Of them, owned by a broker now (the controller's channel replica)")


class NamespaceList(BaseModel):
    namespaces: dict[str, NamespaceSummary] = Field(description="tenant/namespace -> its bundles, sorted")
    count: int


class CreateNamespaceBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenant: str = Field(description=f"Tenant ({_PART_RULE})")
    namespace: str = Field(description=f"Namespace within the tenant ({_PART_RULE})")
    bundles: StrictInt | None = Field(
        None,
        ge=1,
        description="Equal bundles to start with (default namespace.default_bundles; at most "
        "split.max_bundles_per_namespace)",
    )
    dry_run: bool = Field(
        False, description="Check and answer the bundles it would have (200); create nothing. Any controller."
    )


class NamespaceCreatedOut(BaseModel):
    namespace: str = Field(description="tenant/namespace")
    bundles: list[str] = Field(description="Its bundles; the first lookup of a topic in one assigns it")
    dry_run: bool


class NamespaceDeletedOut(BaseModel):
    """What deleting a namespace did, or (dry run) would do."""

    namespace: str
    dry_run: bool
    existed: bool = Field(
        description="It had a znode (false: a repeated delete, which only unloads bundles left owned)"
    )
    unloaded: list[str] = Field(description="Bundles unloaded (dry run: that would be)")
    in_flight: dict[str, str] = Field(
        description="Bundles moving now (bundle -> state), not unloaded: delete again once they settle"
    )
    failed: dict[str, str] = Field(description="Bundles whose unload could not be published, with why")

    @classmethod
    def of(cls, d: NamespaceDeleted) -> NamespaceDeletedOut:
        return cls.model_validate(d, from_attributes=True)  # the same fields, by name


def _errors(*codes: int, leader: bool = False) -> dict[int | str, dict[str, Any]]:
    out: dict[int | str, dict[str, Any]] = {c: {"model": ErrorBody} for c in codes}
    if leader:
        out[307] = {
            "description": "Sent to a follower: redirected to the leader (method, body and query kept)"
        }
    return out


Tenant = Annotated[str, Path(description=f"Tenant ({_PART_RULE})")]
Namespace = Annotated[str, Path(description=f"Namespace within the tenant ({_PART_RULE})")]
DryRun = Annotated[
    bool,
    Query(description="Say what would be unloaded without changing anything (200; any controller answers)"),
]


def add_namespace_routes(app: FastAPI, admin: Callable[[], NamespaceAdmin]) -> None:
    """Register the namespace routes on ``app``; ``admin()`` is called per request."""
    reads = APIRouter(dependencies=[READ])
    writes = APIRouter(dependencies=[ADMIN])

    @reads.get(
        "/v1/namespaces",
        response_model=NamespaceList,
        summary="Every namespace (from ZooKeeper) with its bundle count and owned bundles",
        responses=_errors(500, 503),
    )
    async def list_namespaces() -> Any:
        got = await admin().namespaces()
        return NamespaceList(
            namespaces={n.namespace: NamespaceSummary(bundles=n.bundles, owned=n.owned) for n in got},
            count=len(got),
        )

    @writes.post(
        "/v1/admin/namespaces",
        status_code=201,
        response_model=NamespaceCreatedOut,
        summary="Create a namespace (leader; 409 if it exists; 200: a dry run)",
        description="Lookups create no namespace unless namespace.auto_create allows it (the default allows "
        "none): this is how an operator makes one. Its bundles are assigned by the first lookups of its "
        "topics.",
        responses={
            200: {"model": NamespaceCreatedOut, "description": "A dry run: the bundles it would have"},
            **_errors(400, 409, 500, 503, leader=True),
        },
    )
    async def create_namespace(body: CreateNamespaceBody, response: Response) -> Any:
        got = await admin().create(body.tenant, body.namespace, body.bundles, dry_run=body.dry_run)
        if body.dry_run:
            response.status_code = 200
        return NamespaceCreatedOut(namespace=got.namespace, bundles=got.bundles, dry_run=got.dry_run)

    @writes.delete(
        "/v1/admin/namespaces/{tenant}/{namespace}",
        response_model=NamespaceDeletedOut,
        summary="Delete a namespace (leader): its znode first, then every bundle it owns is unloaded",
        description="The znode is deleted first, so that no lookup can assign one of its bundles again (a "
        "lookup of one of its topics answers 404 unless namespace.auto_create allows the namespace); then "
        "every Owned bundle is unloaded. Bundles in flight are listed, not unloaded: delete again once they "
        "settle (a repeated delete unloads what the channel still gives a broker; 404 once nothing is left).",
        responses=_errors(400, 404, 500, 503, leader=True),
    )
    async def delete_namespace(tenant: Tenant, namespace: Namespace, dry_run: DryRun = False) -> Any:
        return NamespaceDeletedOut.of(await admin().delete(tenant, namespace, dry_run=dry_run))

    app.include_router(reads)
    app.include_router(writes)
