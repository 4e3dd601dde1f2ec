"""What this agent must do about one bundle, as a pure function of the bundle's current channel record
and what the local broker is doing with it.

Level-triggered on purpose: the executor calls :func:`plan` with the *current* record whenever a bundle
changes, and again for every bundle after a restart. Coalesced or missed events cannot leave work undone,
and the restart case (Pulsar #25379: an ``Assigning`` naming a restarted broker sat stuck until the
leader's timeout) is the same code path as the live one.

Roles (docs/design.md section 3.1 flows):

=================================  ====================================================================
current record                     steps on this broker
=================================  ====================================================================
Assigning{dst=me}                  acquire, publish Owned{dst=me, src kept}
Releasing{src=me, dst=B}           fence, publish Assigning{dst=B, src=me}        (transfer, phase 1)
Releasing{src=me, dst=None}        fence, close, publish Free{src=me}             (unload)
Owned{dst=B, src=me}, B != me      close with a redirect to B                     (transfer, phase 2)
Splitting{src=me, children}        split on the broker, publish children Owned{dst=me, v=1},
                                   update the namespace layout, publish Deleted{src=me}
Merging{src=me, {X}}, partner      merge both parents on the broker, publish X Owned{dst=me, v=1},
merging into X too, or X exists    update the namespace layout, publish Deleted{src=me}
Merging{src=me, {X}}, partner      nothing yet: the leader has not written the partner's Merging
Owned{dst=me}, X has no record
Merging{src=me, {X}}, anything     publish Owned{dst=me, src=me}                   (abort the merge)
else
Deleted{src=me}, still serving     forget the parent (its topics live on in the children or the merged
                                   bundle)
Owned{dst=me}, not serving         acquire                                        (override, split child)
anything else while serving        close with a redirect to the new owner, if any (forced override)
=================================  ====================================================================

Stale records: what names this broker and entered the channel before its registration in its current
ZooKeeper session (found at start-up, left when the session was lost, or arriving while it had none; the
agent's ``SessionBarrier`` judges each record as it is applied) was decided while the leader may have
counted it dead, and the leader may be about to force those bundles elsewhere. Acquiring first would let two brokers serve one bundle; so a
stale record is first settled through the channel, whose version check orders it against any override:

=================================  ====================================================================
Assigning{dst=me}, stale           publish Owned{dst=me} first; acquire once it is accepted (then fresh)
Owned{dst=me}, stale               publish Releasing{src=me, dst=None}: unload, reassigned on lookup
=================================  ====================================================================

Late assignments: an ``Assigning{dst=me}`` too old for any lease (``late``: its in-flight deadline, by the
writer's clock or by when this agent saw it, has passed or nearly -- typically a record a producer held
through a Kafka outage and delivered when Kafka came back) is settled the same way: ``Owned{dst=me}`` first,
acquired once accepted. Acquiring it directly is not allowed (the lease would outlive the monitor's
patience), and waiting for the leader's monitor to move it elsewhere left its clients without an answer for
a timeout or more; whichever of our ``Owned`` and the monitor's override lands first wins everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trimtab.channel import intents
from trimtab.channel.bundles import merge_partner, parse_bundle
from trimtab.channel.records import Record, State
from trimtab.errors import BundleError

#: A read of the channel table by bundle name (None: Init); a merge's plan needs its partner's record.
Lookup = Callable[[str], Record | None]


@dataclass(frozen=True, slots=True)
class Acquire:
    pass


@dataclass(frozen=True, slots=True)
class Fence:
    pass


@dataclass(frozen=True, slots=True)
class Close:
    redirect_to: str | None  # broker id; the executor resolves its service URL


@dataclass(frozen=True, slots=True)
class SplitOnBroker:
    children: tuple[str, ...]  # child bundle names


@dataclass(frozen=True, slots=True)
class PublishChildren:
    """Owned{dst=owner, v=1} for each child that has no channel entry yet (idempotent on retry)."""

    children: tuple[str, ...]
    owner: str


@dataclass(frozen=True, slots=True)
class UpdateLayout:
    children: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MergeOnBroker:
    """Serve both parents as the one merged bundle (idempotent: the partner's plan asks for it too)."""

    parents: tuple[str, str]  # bundle names, lower range first
    merged: str  # bundle name


@dataclass(frozen=True, slots=True)
class PublishMerged:
    """Owned{dst=owner, v=1} for the merged bundle if it has no channel entry yet (idempotent on retry, and
    whichever parent gets there first publishes it)."""

    merged: str
    owner: str


@dataclass(frozen=True, slots=True)
class UpdateLayoutMerge:
    """Replace the two parents by the merged bundle in the namespace layout (idempotent)."""

    parents: tuple[str, str]
    merged: str


@dataclass(frozen=True, slots=True)
class Forget:
    """Drop a split parent from the local served set without disconnecting (its topics live on in the
    children)."""


@dataclass(frozen=True, slots=True)
class Publish:
    record: Record | None  # None = tombstone


Step = (
    Acquire
    | Fence
    | Close
    | SplitOnBroker
    | PublishChildren
    | UpdateLayout
    | MergeOnBroker
    | PublishMerged
    | UpdateLayoutMerge
    | Forget
    | Publish
)


@dataclass(frozen=True, slots=True)
class Plan:
    kind: str  # a bounded label for metrics and logs
    steps: tuple[Step, ...]


def plan(
    me: str,
    bundle: str,
    cur: Record | None,
    *,
    serving: bool,
    fenced: bool,
    now_ms: int,
    stale: bool = False,
    late: bool = False,
    lookup: Lookup | None = None,
) -> Plan | None:
    """The steps this broker owes ``bundle`` in state ``cur``; None when there is nothing to do. ``stale``:
    ``cur`` was accepted before this broker's current ZooKeeper session; ``late``: ``cur`` is in flight and
    too old for any lease (see the module docstring). ``lookup`` reads other bundles' records: a merge is
    decided by its partner's (see :func:`plan_merge`); without it a merging bundle waits."""
    if cur is None:
        return Plan("forced_close", (Close(None),)) if serving or fenced else None
    s = cur.state

    if (stale or late) and s is State.ASSIGNING and cur.dst == me:
        return Plan(
            "assign_stale" if stale else "assign_late", (Publish(intents.take(cur, me, now_ms=now_ms)),)
        )
    if stale and s is State.OWNED and cur.dst == me:
        unload = intents.release(cur, src=me, dst=None, writer=me, now_ms=now_ms)
        return Plan("relinquish", (Publish(unload),))

    if s is State.ASSIGNING and cur.dst == me:
        return Plan("assign", (Acquire(), Publish(intents.take(cur, me, now_ms=now_ms))))

    if s is State.RELEASING and cur.src == me:
        if cur.dst is not None:
            return Plan("transfer_out", (Fence(), Publish(intents.hand_over(cur, me, now_ms=now_ms))))
        return Plan("unload", (Fence(), Close(None), Publish(intents.free(cur, me, now_ms=now_ms))))

    if s is State.SPLITTING and cur.src == me:
        children = tuple(sorted(f"{bundle.rsplit('/', 1)[0]}/{c}" for c in (cur.children or {})))
        return Plan(
            "split",
            (
                SplitOnBroker(children),
                PublishChildren(children, me),
                UpdateLayout(children),
                Publish(intents.retire(cur, me, now_ms=now_ms)),
            ),
        )

    if s is State.MERGING and cur.src == me:
        return plan_merge(me, bundle, cur, lookup, now_ms=now_ms) if lookup is not None else None

    if s is State.DELETED and cur.src == me:
        # The parent stays Deleted (not tombstoned) until the leader's tombstone delay: a lookup with an
        # outdated layout that lands on it re-reads the layout, whereas a tombstoned parent would look
        # unowned and could be assigned again while its children are owned (overlapping ranges).
        return Plan("forget_split_parent", (Forget(),)) if serving or fenced else None

    if s is State.OWNED and cur.dst == me:
        return None if serving else Plan("acquire_owned", (Acquire(),))

    owner = cur.owner()
    if fenced and not serving and s.in_flight and cur.src == me:
        # Our transfer is still in flight: clients stay connected (fenced) until the new owner holds the
        # bundle, then they are redirected straight to it (PIP-307).
        return None
    if (serving or fenced) and owner != me:
        # The transfer's second phase, or a forced override took the bundle from us.
        redirect = cur.dst if s is not State.FREE else None
        kind = (
            "close_after_transfer" if s is State.OWNED and cur.src == me and not cur.force else "forced_close"
        )
        return Plan(kind, (Close(redirect),))
    return None


def plan_merge(me: str, bundle: str, cur: Record, lookup: Lookup, *, now_ms: int) -> Plan | None:
    """The steps of ``Merging{src=me, {X}}``, decided by the partner's record and the merged bundle X's.

    Each parent has its own key, so the merge commits through what both keys say, read the same way by
    both parents' plans:

    * X has a record: the merge is committed (the leader starts a merge only while X has none, and only
      a merge's ``PublishMerged`` creates it before the layout names X). Carry on, whatever the partner.
    * the partner is ``Merging`` into X too (any source: a leader's override may have moved it): carry on.
      Neither parent can be rolled back from here: a parent leaves ``Merging`` only by its own plan or by
      an override, and overrides of a merge always roll it forward (``balance.heal``).
    * the partner is still ``Owned{dst=me}``: the leader has not written its half yet; wait.
    * anything else (split, moved, unloaded, deleted by a split, no record, owned by another broker after
      an override): the partner will never merge into X and X has not been created, so abort: the bundle
      is ``Owned`` by me again.
    """
    merged = next(iter(cur.children or {}), "")
    try:
        partner = merge_partner(bundle, merged)
    except BundleError:
        return None  # not an accepted record: the channel refuses such a shape
    namespace = parse_bundle(bundle)[0]
    merged_name = f"{namespace}/{merged}"
    mate = lookup(partner)
    if lookup(merged_name) is None and not merging_into(mate, merged):
        if mate is not None and mate.state is State.OWNED and mate.dst == me:
            return None
        return Plan("abort_merge", (Publish(intents.abort_merge(cur, me, now_ms=now_ms)),))
    parents = (bundle, partner) if parse_bundle(bundle)[1] < parse_bundle(partner)[1] else (partner, bundle)
    return Plan(
        "merge",
        (
            MergeOnBroker(parents, merged_name),
            PublishMerged(merged_name, me),
            UpdateLayoutMerge(parents, merged_name),
            Publish(intents.retire_merged(cur, me, now_ms=now_ms)),
        ),
    )


def merging_into(rec: Record | None, merged: str) -> bool:
    """Whether ``rec`` is a parent's ``Merging`` record into the range ``merged`` (``0x..._0x...``)."""
    return (
        rec is not None and rec.state is State.MERGING and rec.children is not None and merged in rec.children
    )


def needs_attention(me: str, rec: Record | None) -> bool:
    """Whether a record could require work from ``me`` (a cheap filter before queueing)."""
    return rec is not None and (me in (rec.dst, rec.src))
