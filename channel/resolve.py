"""First valid transition wins: the pure predicate every node applies to every record in log order.

Validity depends only on (bundle range, current record, proposed record) -- never on time, liveness or
local configuration -- so every replica that sees the same log computes the same table. Two writers that
race compute the same next version; whichever lands first is accepted everywhere and the other is
rejected everywhere.

Versions are strict (the channel is never compacted, see docs/protocol.md): a record is accepted only with
``version == current.version + 1``, or ``version == 1`` when the bundle is in ``Init``. ``force`` (the
leader's override) skips the transition and broker checks but never the version check.

Enum members are bound to module constants below: attribute access on an Enum class costs ~80 ns on
CPython 3.11 and this function runs once per replayed record.
"""

from __future__ import annotations

from enum import StrEnum

from trimtab.channel.bundles import BundleRange, check_merge, check_partition
from trimtab.channel.records import Record, State
from trimtab.errors import BundleError


class Verdict(StrEnum):
    ACCEPT = "accepted"
    STALE_VERSION = "stale_version"  # version <= current: a duplicate or the loser of a race
    VERSION_GAP = "version_gap"  # version > current + 1, or != 1 from Init
    INVALID_TRANSITION = "invalid_transition"
    BROKER_MISMATCH = "broker_mismatch"  # src/dst do not continue the current record
    BAD_RECORD = "bad_record"  # well-formed JSON but wrong for its state (owned without dst, ...)


_FREE = State.FREE
_OWNED = State.OWNED
_ASSIGNING = State.ASSIGNING
_RELEASING = State.RELEASING
_SPLITTING = State.SPLITTING
_MERGING = State.MERGING
_DELETED = State.DELETED

ACCEPT = Verdict.ACCEPT
_STALE = Verdict.STALE_VERSION
_GAP = Verdict.VERSION_GAP
_INVALID = Verdict.INVALID_TRANSITION
_MISMATCH = Verdict.BROKER_MISMATCH
_BAD = Verdict.BAD_RECORD

# Valid non-forced transitions; ``None`` is Init (no record, or a tombstone).
TRANSITIONS: dict[State | None, frozenset[State | None]] = {
    None: frozenset({_ASSIGNING, _OWNED}),
    _FREE: frozenset({_ASSIGNING, None}),
    _OWNED: frozenset({_SPLITTING, _RELEASING, _MERGING}),
    _ASSIGNING: frozenset({_OWNED}),
    _RELEASING: frozenset({_ASSIGNING, _FREE}),
    _SPLITTING: frozenset({_DELETED}),
    _MERGING: frozenset({_DELETED, _OWNED}),  # merged, or aborted (the partner could not follow)
    _DELETED: frozenset({None}),
}
_SEMI_TERMINAL = frozenset({_FREE, _DELETED})


def children_ok(rng: BundleRange, children: dict[str, str | None]) -> bool:
    try:
        check_partition(rng, sorted(BundleRange.parse(name) for name in children))
    except BundleError:
        return False
    return True


def merged_ok(rng: BundleRange, children: dict[str, str | None]) -> bool:
    """A merging record names exactly one range, the union of this bundle and one neighbour
    (:func:`~trimtab.channel.bundles.check_merge`). The partner has its own key, so the channel cannot see
    that it merges too: the writers' flow (docs/protocol.md section 3) makes sure of that."""
    if len(children) != 1:
        return False
    try:
        check_merge(rng, BundleRange.parse(next(iter(children))))
    except BundleError:
        return False
    return True


def shape_ok(rng: BundleRange, new: Record) -> bool:
    """Per-state field rules; they hold for forced records too."""
    s = new.state
    if s is _SPLITTING:
        return new.src is not None and new.children is not None and children_ok(rng, new.children)
    if s is _MERGING:
        return new.src is not None and new.children is not None and merged_ok(rng, new.children)
    if new.children is not None:
        return False
    if s is _OWNED or s is _ASSIGNING:
        return new.dst is not None
    if s is _RELEASING:
        return new.src is not None and new.src != new.dst
    if s is _DELETED:
        return new.src is not None or new.dst is not None
    return True  # FREE


def resolve(rng: BundleRange, cur: Record | None, new: Record | None) -> Verdict:
    """Decide whether ``new`` is the next state of a bundle currently at ``cur``.

    ``rng`` is the bundle's hash range; only the ranges a split or a merge names are checked against it. The shape rules
    of :func:`shape_ok` are inlined here (this runs once per replayed record).
    """
    if new is None:
        # A tombstone returns a semi-terminal bundle to Init. It carries no version, so it is only valid
        # where nothing is in flight or owned: a late cleanup tombstone cannot erase a fresh assignment.
        if cur is not None and cur.state in _SEMI_TERMINAL:
            return ACCEPT
        return _INVALID

    v = new.version
    if cur is None:
        if v != 1:
            return _GAP
        cur_state = None
    else:
        cv = cur.version
        if v != cv + 1:
            return _STALE if v <= cv else _GAP
        cur_state = cur.state

    s = new.state
    src = new.src
    dst = new.dst
    # Shape (shape_ok, inlined).
    if s is _SPLITTING:
        children = new.children
        if src is None or children is None or not children_ok(rng, children):
            return _BAD
    elif s is _MERGING:
        children = new.children
        if src is None or children is None or not merged_ok(rng, children):
            return _BAD
    elif new.children is not None:
        return _BAD
    elif s is _OWNED or s is _ASSIGNING:
        if dst is None:
            return _BAD
    elif s is _RELEASING:
        if src is None or src == dst:
            return _BAD
    elif s is _DELETED and src is None and dst is None:
        return _BAD
    if new.force:
        return ACCEPT
    if s not in TRANSITIONS[cur_state]:
        return _INVALID

    # Broker checks: the new record must continue the current one.
    if cur is None:
        # Init -> Assigning (a fresh assignment) or Init -> Owned (a split child claimed by its owner).
        return _MISMATCH if s is _ASSIGNING and src is not None else ACCEPT
    if cur_state is _FREE:  # -> Assigning
        return _MISMATCH if src is not None else ACCEPT
    if cur_state is _OWNED:
        # Only the current owner can release, split or merge: src names the broker that does the work.
        if src != cur.dst or ((s is _SPLITTING or s is _MERGING) and dst is not None):
            return _MISMATCH
        return ACCEPT  # Releasing to itself was refused by the shape rules
    if cur_state is _MERGING and s is _OWNED:
        # An aborted merge: the bundle stays with the broker that was merging it, and says so in src.
        return ACCEPT if src == cur.src and dst == cur.src else _MISMATCH
    # Assigning -> Owned, Releasing -> Assigning|Free, Splitting|Merging -> Deleted: same src and dst.
    if src != cur.src or dst != cur.dst:
        return _MISMATCH
    if cur_state is _RELEASING:
        if s is _ASSIGNING and dst is None:
            return _MISMATCH  # only a transfer continues to Assigning
        if s is _FREE and cur.dst is not None:
            return _MISMATCH  # a transfer cannot end as an unload
    return ACCEPT
