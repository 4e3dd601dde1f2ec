"""The controller's placement-policy routes (docs/placement.md): failure domains, namespace anti-affinity
groups and namespace isolation policies, stored in ZooKeeper and applied by every node without a restart.

Reads are answered by any controller; writes are the leader's (a follower answers ``307`` to the leader,
or a retryable ``503`` while there is none). Reads need a read token, writes (dry runs included) an admin
token (docs/security.md). Every refusal is ``{"error", "retryable"}``.

The routes reach the service through a callable, so the OpenAPI spec renders without a live controller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Path, Query
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from trimtab.cluster.auth import ADMIN, READ
from trimtab.cluster.http_errors import ErrorBody
from trimtab.cluster.placement.store import IsolationPolicyDoc
from trimtab.controller.placement.admin import (
    NAME_MAX,
    BrokerIsolation,
    PlacementAdmin,
    PolicyChange,
    UnloadScope,
)

_NAME_RULE = f"1-{NAME_MAX} of letters, digits, '_', '.', '-'"


# ------------------------------------------------------------------ models
class FailureDomainBody(BaseModel):
    """A failure domain: the brokers that fail together (a rack, a zone)."""

    model_config = ConfigDict(extra="forbid")
    brokers: list[str] = Field(
        description="Broker ids exactly as the brokers register (usually host:port). A broker may be in "
        "one domain only. Stored sorted, without duplicates."
    )


class AntiAffinityBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    group: str = Field(
        description=f"The namespace's anti-affinity group ({_NAME_RULE}); compared case-insensitively. "
        "A blank group takes the namespace out of its group."
    )


class NamespaceGroup(BaseModel):
    namespace: str = Field(description="tenant/namespace")
    group: str | None = Field(description="Its anti-affinity group, or null when it has none")


class GroupMembers(BaseModel):
    group: str = Field(description="The group asked about")
    namespaces: list[str] = Field(description="Namespaces in the group (case-insensitive match), sorted")


class IsolationPolicyOut(BaseModel):
    """A stored isolation policy."""

    namespaces: list[str] = Field(description="Namespace regexes (Python re, full match on tenant/namespace)")
    primary: list[str] = Field(description="Broker host regexes (full match on the id up to its last ':')")
    secondary: list[str] = Field(description="Fallback broker host regexes")
    min_limit: int = Field(description="Secondaries join while fewer than this many primaries are live")

    @classmethod
    def of(cls, doc: IsolationPolicyDoc) -> IsolationPolicyOut:
        return cls(
            namespaces=doc.namespaces, primary=doc.primary, secondary=doc.secondary, min_limit=doc.min_limit
        )

    @classmethod
    def maybe(cls, doc: IsolationPolicyDoc | None) -> IsolationPolicyOut | None:
        return None if doc is None else cls.of(doc)


class IsolationPolicyBody(BaseModel):
    """An isolation policy to create or replace, and how far the change moves bundles."""

    model_config = ConfigDict(extra="forbid")
    namespaces: list[str] = Field(
        description="Namespace regexes (Python re syntax, full match on tenant/namespace); not empty"
    )
    primary: list[str] = Field(
        description="Regexes of the primary brokers' hosts (the id up to its last ':'); not empty"
    )
    secondary: list[str] = Field(
        default_factory=list, description="Regexes of fallback brokers' hosts; may be empty"
    )
    min_limit: StrictInt = Field(
        1, ge=0, description="Secondaries are candidates while fewer than this many primaries are live"
    )
    unload_scope: UnloadScope = Field(
        "changed",
        description="Which bundles the change unloads (not stored): 'changed' -- namespaces matched by "
        "regexes added or removed (all of old and new if the primary list changed); 'all_matching' -- "
        "every namespace matched by the old or the new regexes; 'none' -- nothing",
    )

    def doc(self) -> IsolationPolicyDoc:
        return IsolationPolicyDoc(
            namespaces=self.namespaces,
            primary=self.primary,
            secondary=self.secondary,
            min_limit=self.min_limit,
        )


class PolicyChangeOut(BaseModel):
    """What an isolation-policy change did, or (dry run) would do."""

    policy: str = Field(description="The policy's name")
    unload_scope: UnloadScope = Field(description="The scope applied")
    dry_run: bool = Field(description="True: nothing was written, the lists say what would happen")
    previous: IsolationPolicyOut | None = Field(description="The policy before (null: there was none)")
    current: IsolationPolicyOut | None = Field(description="The policy after (null: deleted)")
    namespaces: list[str] = Field(description="Affected namespaces that have owned bundles")
    unloaded: list[str] = Field(description="Bundles unloaded (dry run: that would be unloaded)")
    failed: dict[str, str] = Field(
        description="Bundles whose unload could not be published, with the error (the policy is stored)"
    )

    @classmethod
    def of(cls, c: PolicyChange) -> PolicyChangeOut:
        return cls(
            policy=c.policy,
            unload_scope=c.unload_scope,
            dry_run=c.dry_run,
            previous=IsolationPolicyOut.maybe(c.previous),
            current=IsolationPolicyOut.maybe(c.current),
            namespaces=c.namespaces,
            unloaded=c.unloaded,
            failed=c.failed,
        )


class BrokerIsolationOut(BaseModel):
    """One live broker as the isolation policies see it."""

    broker: str = Field(description="Broker id")
    primary_in: list[str] = Field(description="Policies whose primary regexes match its host")
    secondary_in: list[str] = Field(description="Policies whose secondary (and no primary) regexes match")
    shared: bool = Field(description="Primary in no policy: it serves namespaces without a policy")

    @classmethod
    def of(cls, b: BrokerIsolation) -> BrokerIsolationOut:
        return cls(broker=b.broker, primary_in=b.primary_in, secondary_in=b.secondary_in, shared=b.shared)


# ------------------------------------------------------------------ routes
def _errors(*codes: int, leader: bool = False) -> dict[int | str, dict[str, Any]]:
    out: dict[int | str, dict[str, Any]] = {c: {"model": ErrorBody} for c in codes}
    if leader:
        out[307] = {"description": "Sent to a follower: redirected to the leader (method and body kept)"}
    return out


DomainName = Annotated[str, Path(description=f"The failure domain's name ({_NAME_RULE})")]
PolicyName = Annotated[str, Path(description=f"The isolation policy's name ({_NAME_RULE}; not 'brokers')")]
Tenant = Annotated[str, Path(description="Tenant")]
Namespace = Annotated[str, Path(description="Namespace (within the tenant)")]
DryRun = Annotated[
    bool, Query(description="Say what would be unloaded without writing anything (any controller answers)")
]


def add_placement_routes(app: FastAPI, admin: Callable[[], PlacementAdmin]) -> None:
    """Register the placement-policy routes on ``app``; ``admin()`` is called per request."""
    reads = APIRouter(dependencies=[READ])
    writes = APIRouter(dependencies=[ADMIN])
    znode_errors = _errors(500, 503)  # unreadable znode (500); ZooKeeper unavailable or contended (503)
    read_errors = _errors(400, 404, 500, 503)
    set_errors = _errors(400, 500, 503, leader=True)
    delete_errors = _errors(400, 404, 500, 503, leader=True)

    # ---- failure domains
    @reads.get(
        "/v1/failure-domains",
        summary="Every failure domain: name -> brokers (an empty map if none)",
        responses=znode_errors,
    )
    async def list_domains() -> dict[str, FailureDomainBody]:
        return {k: FailureDomainBody(brokers=v.brokers) for k, v in (await admin().domains()).items()}

    @reads.get("/v1/failure-domains/{name}", summary="One failure domain", responses=read_errors)
    async def get_domain(name: DomainName) -> FailureDomainBody:
        return FailureDomainBody(brokers=(await admin().domain(name)).brokers)

    @writes.put(
        "/v1/failure-domains/{name}",
        summary="Create or replace a failure domain (leader; 409 if a broker is in another domain)",
        responses=_errors(400, 409, 500, 503, leader=True),
    )
    async def put_domain(name: DomainName, body: FailureDomainBody) -> FailureDomainBody:
        return FailureDomainBody(brokers=(await admin().set_domain(name, body.brokers)).brokers)

    @writes.delete(
        "/v1/failure-domains/{name}",
        summary="Delete a failure domain (leader); returns it",
        responses=delete_errors,
    )
    async def delete_domain(name: DomainName) -> FailureDomainBody:
        return FailureDomainBody(brokers=(await admin().delete_domain(name)).brokers)

    # ---- anti-affinity groups
    aa_path = "/v1/namespaces/{tenant}/{namespace}/anti-affinity"

    @reads.get(
        aa_path, summary="A namespace's anti-affinity group (null if none)", responses=_errors(400, 500, 503)
    )
    async def get_anti_affinity(tenant: Tenant, namespace: Namespace) -> NamespaceGroup:
        group = await admin().anti_affinity(tenant, namespace)
        return NamespaceGroup(namespace=f"{tenant}/{namespace}", group=group)

    @writes.put(
        aa_path,
        summary="Put a namespace in an anti-affinity group (leader; blank clears)",
        responses=set_errors,
    )
    async def put_anti_affinity(
        tenant: Tenant, namespace: Namespace, body: AntiAffinityBody
    ) -> NamespaceGroup:
        group = await admin().set_anti_affinity(tenant, namespace, body.group)
        return NamespaceGroup(namespace=f"{tenant}/{namespace}", group=group)

    @writes.delete(
        aa_path,
        summary="Take a namespace out of its anti-affinity group (leader; 404 if in none); returns the group",
        responses=delete_errors,
    )
    async def delete_anti_affinity(tenant: Tenant, namespace: Namespace) -> NamespaceGroup:
        group = await admin().clear_anti_affinity(tenant, namespace)
        return NamespaceGroup(namespace=f"{tenant}/{namespace}", group=group)

    @reads.get(
        "/v1/anti-affinity/{group}",
        summary="The namespaces in an anti-affinity group (case-insensitive)",
        responses=_errors(400, 500, 503),
    )
    async def group_members(
        group: Annotated[str, Path(description=f"The group ({_NAME_RULE})")],
    ) -> GroupMembers:
        return GroupMembers(group=group, namespaces=await admin().group_members(group))

    # ---- isolation policies (the broker views first: ``brokers`` is not a policy name)
    @reads.get(
        "/v1/isolation-policies/brokers",
        summary="Every live broker: policies it is primary/secondary in, and whether it is shared",
        responses=znode_errors,
    )
    async def brokers_view() -> list[BrokerIsolationOut]:
        return [BrokerIsolationOut.of(b) for b in await admin().broker_isolation()]

    @reads.get(
        "/v1/isolation-policies/brokers/{broker}",
        summary="One live broker's isolation view (404 if it is not live)",
        responses=_errors(404, 500, 503),
    )
    async def broker_view(broker: Annotated[str, Path(description="Broker id")]) -> BrokerIsolationOut:
        return BrokerIsolationOut.of(await admin().broker(broker))

    @reads.get(
        "/v1/isolation-policies",
        summary="Every isolation policy: name -> policy (an empty map if none)",
        responses=znode_errors,
    )
    async def list_policies() -> dict[str, IsolationPolicyOut]:
        return {k: IsolationPolicyOut.of(v) for k, v in (await admin().policies()).items()}

    @reads.get("/v1/isolation-policies/{name}", summary="One isolation policy", responses=read_errors)
    async def get_policy(name: PolicyName) -> IsolationPolicyOut:
        return IsolationPolicyOut.of(await admin().policy(name))

    @writes.put(
        "/v1/isolation-policies/{name}",
        summary="Create or replace an isolation policy (leader), then unload the bundles it affects",
        responses=set_errors,
    )
    async def put_policy(
        name: PolicyName, body: IsolationPolicyBody, dry_run: DryRun = False
    ) -> PolicyChangeOut:
        change = await admin().set_policy(name, body.doc(), body.unload_scope, dry_run=dry_run)
        return PolicyChangeOut.of(change)

    @writes.delete(
        "/v1/isolation-policies/{name}",
        summary="Delete an isolation policy (leader), then unload the bundles of its namespaces",
        responses=delete_errors,
        response_model=PolicyChangeOut,
    )
    async def delete_policy(
        name: PolicyName,
        dry_run: DryRun = False,
        unload_scope: Annotated[
            UnloadScope,
            Query(description="'changed' or 'all_matching': unload its namespaces; 'none': nothing"),
        ] = "changed",
    ) -> Any:
        # (A follower's 307 keeps the query string: unload_scope=none must reach the leader unchanged.)
        return PolicyChangeOut.of(await admin().delete_policy(name, unload_scope, dry_run=dry_run))

    app.include_router(reads)
    app.include_router(writes)
