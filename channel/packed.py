"""Settled bundle states packed into one integer each: how a table holds a million bundles in ~170 bytes.

Every node keeps the whole table, and at a million bundles its size is the node's size. A
:class:`~trimtab.channel.records.Record` costs 88 bytes plus 32 for its timestamp's int; a dict entry
(~38) and the bundle name (85 for a 36-character name) come on top: ~243 bytes a bundle, however well
broker ids are shared. Most bundles sit in a settled state (owned, free, deleted) for hours, so the table
keeps those as one int of ~44 bytes -- state, force, three broker ids numbered by this table, the
timestamp and the version -- and makes the record again on each read (~0.25 us; a lookup costs ~100 us).
Records in flight (assigning, releasing, splitting, merging) and any record carrying children stay
objects: they are read again within moments, and packing them would only add work to the replay.

Layout: the little-endian bytes of ``struct`` format ``<BHHHqQ`` read as one unsigned int -- state index
and force (one byte: bits 0-2 and 3), dst, src and writer ids (two bytes each; 0 is ``None``), the
timestamp (the protocol's whole signed 64-bit range) and the version in the top bytes, so that a small
version makes a short int. One ``struct`` call each way costs half of what the same fields cost in shifts
and masks. Broker ids are numbered as first seen and never forgotten by the table; past 65 535 distinct ids
a record simply stays an object -- a hostile writer inventing ids costs memory it pays for with its own
records, never correctness.
"""

from __future__ import annotations

import struct
import sys
from collections import Counter
from collections.abc import Iterable

from trimtab.channel.records import Record, State

_STATES: tuple[State, ...] = tuple(State)
# Compared by identity: an Enum's hash is a Python-level function (~100 ns), too slow for a set or a dict
# on the replay's path.
_OWNED, _FREE, _DELETED = SETTLED = State.OWNED, State.FREE, State.DELETED  # the states a table packs
_OWNED_CODE, _FREE_CODE, _DELETED_CODE = (_STATES.index(s) for s in (_OWNED, _FREE, _DELETED))

_LAYOUT = struct.Struct("<BHHHqQ")
_SIZE = _LAYOUT.size
_pack_fields = _LAYOUT.pack
_unpack_fields = _LAYOUT.unpack
_from_bytes = int.from_bytes
MAX_IDS = 0xFFFF  # ids 1..MAX_IDS; 0 is None
_DST_SHIFT = 8  # dst's two bytes follow the state byte
_FORCE_BIT = 8
_STATE_MASK = 7


class Packer:
    """Packs and unpacks one table's settled records; numbers the broker ids it meets.

    Not thread-safe for packing (the table's one feeder packs); unpacking from other threads is safe: an id
    is appended to the list before any packed value that uses it is stored.
    """

    __slots__ = ("_ids", "_index")

    def __init__(self) -> None:
        self._ids: list[str | None] = [None]
        self._index: dict[str | None, int] = {None: 0}

    def __len__(self) -> int:
        """Broker ids numbered so far."""
        return len(self._ids) - 1

    def _id(self, broker: str) -> int:
        """A new number for a broker :meth:`pack_decoded` just looked up and did not find (each lookup
        follows the numbering of the field before it); -1 once every number is taken."""
        i = len(self._ids)
        if i > MAX_IDS:
            return -1
        broker = sys.intern(broker)
        self._ids.append(broker)
        self._index[broker] = i
        return i

    def pack(self, rec: Record) -> int | None:
        """The record as one int, or ``None`` when it stays an object (in flight, with children, a broker
        id past the last number, or -- built in code, never decoded -- a field outside the protocol)."""
        ids = (rec.dst, rec.src, rec.writer)
        if rec.force is not True and rec.force is not False:
            return None
        if type(rec.ts) is not int or type(rec.version) is not int:  # a bool would come back an int
            return None
        if not all(b is None or type(b) is str for b in ids) or rec.writer is None:
            return None
        try:
            return self.pack_decoded(rec)
        except struct.error:  # beyond 64 bits, or a negative version: built in code, never decoded
            return None

    def pack_decoded(self, rec: Record) -> int | None:
        """:meth:`pack` for a record the decoder made, whose fields have the schema's types and ranges
        (the replay's path: ~1 300 instructions fewer a record than checking them again)."""
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
        if rec.force:
            code |= _FORCE_BIT
        # Decoded ids are new strings whose hash is not computed yet: a lookup costs a hash, so the usual
        # cases skip it -- no src (a first assignment), the owner writing its own record.
        index = self._index
        d, s, w = rec.dst, rec.src, rec.writer
        dst = index.get(d)
        if dst is None:
            dst = self._id(d)  # type: ignore[arg-type]  # None is numbered 0: only a str is missing
        src = 0 if s is None else index.get(s)
        if src is None:
            src = self._id(s)  # type: ignore[arg-type]  # None is 0, found above
        writer = dst if w == d else index.get(w)
        if writer is None:
            writer = self._id(w)
        if dst | src | writer < 0:  # an id past the last number
            return None
        return _from_bytes(_pack_fields(code, dst, src, writer, rec.ts, rec.version), "little")

    def owner(self, packed: int) -> str | None:
        """The ``dst`` of a packed ``Owned`` record, ``None`` for any other state -- without making it."""
        if packed & _STATE_MASK != _OWNED_CODE:
            return None
        return self._ids[(packed >> _DST_SHIFT) & MAX_IDS]

    def unpack(self, packed: int) -> Record:
        """The record :meth:`pack` was given, equal in every field (broker ids the shared strings)."""
        code, dst, src, writer, ts, version = _unpack_fields(packed.to_bytes(_SIZE, "little"))
        ids = self._ids
        return Record(
            1,
            _STATES[code & _STATE_MASK],
            ids[dst],
            ids[src],
            version,
            code & _FORCE_BIT != 0,
            ts,
            ids[writer],
        )


def count_states(packed: Iterable[int]) -> dict[State, int]:
    """Packed values per state, read from their state bits: a metric scrape counts a million bundles
    without making a record of each."""
    return {_STATES[code]: n for code, n in Counter(v & _STATE_MASK for v in packed).items()}
