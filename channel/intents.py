"""Intents: the one place a channel record is built from what a writer wants to happen to a bundle.

Every writer -- an agent's lookup, its reconciler, a split or a drain; the leader's shedding, admin moves
and healing; the simulator's stand-ins for them -- says what it wants (assign this bundle, release it,
split or merge it...) and hands over the bundle's current record (None: Init). The intent checks that it
applies to that record -- the owner check lives here and nowhere else -- and returns the next record:
version current + 1 (1 from Init), the writer and the time given. When it does not apply it raises
:class:`IntentRefused` naming the state found, so a writer that read an older table refuses instead of
proposing what every replica would reject.

The final word stays with :func:`channel.resolve.resolve` (first valid transition wins, on every replica);
intents are what a well-behaved writer proposes. The transitions are docs/protocol.md's.
"""

from __future__ import annotations

from collections.abc import Iterable

from trimtab.channel.records import Record, State, make
from trimtab.errors import TrimtabError


class IntentRefused(TrimtabError):
    """The bundle's current record does not allow this intent (it moved, or is not this writer's)."""

    def __init__(self, intent: str, cur: Record | None, why: str) -> None:
        self.intent = intent
        self.state = cur.state if cur is not None else None
        self.version = cur.version if cur is not None else 0
        found = f"{cur.state.value} v{cur.version}" if cur is not None else "init"
        super().__init__(f"cannot {intent}: {why} (found {found})")


def _next(cur: Record | None) -> int:
    return 1 if cur is None else cur.version + 1


def owned_by(cur: Record | None, broker: str) -> bool:
    """The owner check: ``broker`` owns the bundle (Owned, not in flight)."""
    return cur is not None and cur.state is State.OWNED and cur.dst == broker


def assign(cur: Record | None, dst: str, *, writer: str, now_ms: int) -> Record:
    """Ask ``dst`` to take an unowned bundle (Init or Free): ``Assigning{dst}``."""
    if cur is not None and cur.state is not State.FREE:
        raise IntentRefused("assign", cur, "only an unowned bundle (init or free) is assigned")
    return make(State.ASSIGNING, dst=dst, version=_next(cur), ts=now_ms, writer=writer)


def place(cur: Record | None, dst: str, *, writer: str, now_ms: int) -> Record:
    """Give a bundle in Init straight to ``dst`` (``Owned{dst}``, version 1): a split's children, whose
    owner already serves their topics."""
    if cur is not None:
        raise IntentRefused("place", cur, "only a bundle without a record is placed directly")
    return make(State.OWNED, dst=dst, version=1, ts=now_ms, writer=writer)


def take(cur: Record | None, me: str, *, now_ms: int) -> Record:
    """The destination of an assignment took the bundle over: ``Owned{me}`` (keeping the source)."""
    if cur is None or cur.state is not State.ASSIGNING or cur.dst != me:
        raise IntentRefused("take", cur, f"the bundle is not being assigned to {me}")
    return make(State.OWNED, dst=me, src=cur.src, version=cur.version + 1, ts=now_ms, writer=me)


def release(cur: Record | None, *, src: str, dst: str | None, writer: str, now_ms: int) -> Record:
    """Move a bundle off its owner ``src``: a transfer to ``dst``, or an unload when ``dst`` is None
    (``Releasing{src, dst}``; the owner fences it, then hands it over or frees it)."""
    if not owned_by(cur, src):
        raise IntentRefused("release", cur, f"the bundle is not owned by {src}")
    assert cur is not None
    if dst == src:
        raise IntentRefused("release", cur, f"the bundle is already owned by {dst}")
    return make(State.RELEASING, src=src, dst=dst, version=cur.version + 1, ts=now_ms, writer=writer)


def hand_over(cur: Record | None, me: str, *, now_ms: int) -> Record:
    """The fenced source of a transfer passes the bundle on: ``Assigning{dst}`` from ``Releasing{me, dst}``."""
    if cur is None or cur.state is not State.RELEASING or cur.src != me or cur.dst is None:
        raise IntentRefused("hand over", cur, f"no transfer out of {me} is in progress")
    return make(State.ASSIGNING, dst=cur.dst, src=me, version=cur.version + 1, ts=now_ms, writer=me)


def free(cur: Record | None, me: str, *, now_ms: int) -> Record:
    """The fenced and closed source of an unload lets the bundle go: ``Free`` from ``Releasing{me, None}``."""
    if cur is None or cur.state is not State.RELEASING or cur.src != me or cur.dst is not None:
        raise IntentRefused("free", cur, f"no unload of {me}'s bundle is in progress")
    return make(State.FREE, src=me, version=cur.version + 1, ts=now_ms, writer=me)


def split(cur: Record | None, owner: str, children: Iterable[str], *, writer: str, now_ms: int) -> Record:
    """Split an owned bundle into ``children`` (range names), all staying with their owner:
    ``Splitting{src=owner, children}``."""
    if not owned_by(cur, owner):
        raise IntentRefused("split", cur, f"the bundle is not owned by {owner}")
    assert cur is not None
    kids: dict[str, str | None] = {c: owner for c in children}
    return make(
        State.SPLITTING,
        src=owner,
        version=cur.version + 1,
        ts=now_ms,
        writer=writer,
        children=kids,
    )


def retire(cur: Record | None, me: str, *, now_ms: int) -> Record:
    """The splitting owner published the children: the parent is ``Deleted``."""
    if cur is None or cur.state is not State.SPLITTING or cur.src != me:
        raise IntentRefused("retire", cur, f"{me} is not splitting the bundle")
    # dst continues the split's (None, unless a forced record set one): replicas require both to carry on
    return make(State.DELETED, src=me, dst=cur.dst, version=cur.version + 1, ts=now_ms, writer=me)


def merge(cur: Record | None, owner: str, merged_range: str, *, writer: str, now_ms: int) -> Record:
    """Start merging an owned bundle into ``merged_range`` (``0x..._0x...``: this bundle and one neighbour),
    to be owned by its owner: ``Merging{src=owner, children={merged_range: owner}}``. The leader writes it
    for both neighbours; the channel checks each on its own, so writing the pair is the leader's job."""
    if not owned_by(cur, owner):
        raise IntentRefused("merge", cur, f"the bundle is not owned by {owner}")
    assert cur is not None
    return make(
        State.MERGING,
        src=owner,
        version=cur.version + 1,
        ts=now_ms,
        writer=writer,
        children={merged_range: owner},
    )


def _merging_by(cur: Record | None, me: str) -> bool:
    return cur is not None and cur.state is State.MERGING and cur.src == me


def retire_merged(cur: Record | None, me: str, *, now_ms: int) -> Record:
    """The merging owner published the merged bundle: this parent is ``Deleted``."""
    if not _merging_by(cur, me):
        raise IntentRefused("retire merged", cur, f"{me} is not merging the bundle")
    assert cur is not None
    # src and dst continue the merge's, as Splitting -> Deleted does (replicas require both to carry on)
    return make(State.DELETED, src=me, dst=cur.dst, version=cur.version + 1, ts=now_ms, writer=me)


def abort_merge(cur: Record | None, me: str, *, now_ms: int) -> Record:
    """The partner cannot merge (it moved, split or was never asked): the bundle goes back to being
    ``Owned`` by the broker that was merging it, ``src`` kept (an Owned with src == dst is an aborted
    merge in the log)."""
    if not _merging_by(cur, me):
        raise IntentRefused("abort merge", cur, f"{me} is not merging the bundle")
    assert cur is not None
    return make(State.OWNED, dst=me, src=me, version=cur.version + 1, ts=now_ms, writer=me)


def force(
    cur: Record,
    state: State,
    *,
    dst: str | None,
    src: str | None,
    writer: str,
    now_ms: int,
    children: dict[str, str | None] | None = None,
) -> Record:
    """The leader's override of a bundle whose brokers failed or whose transition is stuck: any state,
    ``force`` set (replicas skip the transition and broker checks, never the version)."""
    return make(
        state,
        dst=dst,
        src=src,
        version=cur.version + 1,
        force=True,
        ts=now_ms,
        writer=writer,
        children=children,
    )
