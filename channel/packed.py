"""Settled bundle states packed into one integer each: how a table holds a million bundles in ~170 bytes.

Every node keeps the whole table, and at a million bundles its size is the node's size. A
:class:`~trimtab.channel.records.Record` costs 88 bytes plus 32 for its timestamp's int; a dict entry
(~38) and the bundle name (85 for a 36-character name) come on top: ~243 bytes a bundle, however well
broker ids are shared. Most bundles sit in a settled state (owned, free, deleted) for hours, so the table
keeps those as one int of ~40 bytes -- state, force, three broker ids numbered by this table, the
timestamp and the version -- and makes the record again on each read (~0.35 us; a lookup costs ~100 us).
Records in flight (assigning, releasing, splitting, merging) and any record carrying children stay
objects: they are read again within moments, and packing them would only add work to the replay.

Layout, low bits first: state (3 bits, its index in :class:`State`), force (1), dst, src and writer ids
(16 bits each; 0 is ``None``), the timestamp plus 2**63 (64 bits: the protocol's whole signed range), and
the version in the bits above (any size). Broker ids are numbered as first seen and never forgotten by
the table that numbered them; past 65 535 distinct ids a record simply stays an object -- a hostile
writer inventing ids costs memory it pays for with its own records, never correctness.
"""

from __future__ import annotations

import sys

from trimtab.channel.records import Record, State

_STATES: tuple[State, ...] = tuple(State)
# Compared by identity: an Enum's hash is a Python-level function (~100 ns), too slow for a set or a dict
# on the replay's path.
_OWNED, _FREE, _DELETED = State.OWNED, State.FREE, State.DELETED
_OWNED_CODE, _FREE_CODE, _DELETED_CODE = (_STATES.index(s) for s in (_OWNED, _FREE, _DELETED))

_ID_BITS = 16
MAX_IDS = (1 << _ID_BITS) - 1  # ids 1..MAX_IDS; 0 is None
_ID_MASK = MAX_IDS
_DST_SHIFT = 4
_SRC_SHIFT = _DST_SHIFT + _ID_BITS
_WRITER_SHIFT = _SRC_SHIFT + _ID_BITS
_TS_SHIFT = _WRITER_SHIFT + _ID_BITS
_LOW_MASK = (1 << _TS_SHIFT) - 1
_TS_BIAS = 1 << 63
_TS_MASK = (1 << 64) - 1
_TS_MIN, _TS_MAX = -_TS_BIAS, _TS_BIAS - 1
_VERSION_SHIFT = _TS_SHIFT + 64
_FORCE_BIT = 8
_STATE_MASK = 7


class Packer:
    """Packs and unpacks one table's settled records; numbers the broker ids it meets.

    Not thread-safe for packing (the table's one feeder packs); unpacking from other threads is safe:
    an id is appended to the list before any packed value that uses it is stored.
    """

    __slots__ = ("_ids", "_index")

    def __init__(self) -> None:
        self._ids: list[str | None] = [None]
        self._index: dict[str | None, int] = {None: 0}

    def __len__(self) -> int:
        """Broker ids numbered so far."""
        return len(self._ids) - 1

    def _id(self, broker: str | None) -> int:
        """The number of a broker :meth:`pack` did not find (it may have numbered it since: dst, src and
        writer are often the same new broker); -1 once every number is taken."""
        i = self._index.get(broker)
        if i is not None:
            return i
        i = len(self._ids)
        if i > MAX_IDS or type(broker) is not str:  # a str unless built in code, not decoded
            return -1
        broker = sys.intern(broker)
        self._ids.append(broker)
        self._index[broker] = i
        return i

    def pack(self, rec: Record) -> int | None:
        """The record as one int, or ``None`` when it stays an object (in flight, with children, or a
        broker id past the last number)."""
        state = rec.state
        if state is _OWNED:
            code = _OWNED_CODE
        elif state is _FREE:
            code = _FREE_CODE
        elif state is _DELETED:
            code = _DELETED_CODE
        else:
            return None
        if rec.children is not None:
            return None
        ts, version, force = rec.ts, rec.version, rec.force
        # Decoded records are always in range; one built in code may not be, and stays an object.
        if type(ts) is not int or not _TS_MIN <= ts <= _TS_MAX or type(version) is not int or version < 0:
            return None
        if force is not True and force is not False:
            return None
        index = self._index
        try:
            dst = index.get(rec.dst)
            src = index.get(rec.src)
            writer = index.get(rec.writer)
        except TypeError:  # an unhashable id: a record built in code, never one decoded
            return None
        if dst is None:
            dst = self._id(rec.dst)
        if src is None:
            src = self._id(rec.src)
        if writer is None:
            writer = self._id(rec.writer)
        if dst < 0 or src < 0 or writer < 0:
            return None
        # The small fields first, in a short int: every operation on the long one allocates.
        low = (
            code
            | (_FORCE_BIT if force else 0)
            | (dst << _DST_SHIFT)
            | (src << _SRC_SHIFT)
            | (writer << _WRITER_SHIFT)
        )
        return low | ((ts + _TS_BIAS) << _TS_SHIFT) | (version << _VERSION_SHIFT)

    def owner(self, packed: int) -> str | None:
        """The ``dst`` of a packed ``Owned`` record, ``None`` for any other state -- without making it."""
        if packed & _STATE_MASK != _OWNED_CODE:
            return None
        return self._ids[(packed >> _DST_SHIFT) & _ID_MASK]

    def unpack(self, packed: int) -> Record:
        """The record :meth:`pack` was given, equal in every field (broker ids the shared strings)."""
        ids = self._ids
        low = packed & _LOW_MASK  # the small fields apart first: shifts of a short int cost less
        return Record(
            1,
            _STATES[low & _STATE_MASK],
            ids[(low >> _DST_SHIFT) & _ID_MASK],
            ids[(low >> _SRC_SHIFT) & _ID_MASK],
            packed >> _VERSION_SHIFT,
            low & _FORCE_BIT != 0,
            ((packed >> _TS_SHIFT) & _TS_MASK) - _TS_BIAS,
            ids[low >> _WRITER_SHIFT],  # type: ignore[arg-type]  # a writer is never None
        )
