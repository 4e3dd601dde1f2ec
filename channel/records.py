"""Bundle state records and their wire format (docs/protocol.md is the normative description).

A record is one JSON object per Kafka message, keyed by the bundle name; a null value is a tombstone and
means the bundle is back in ``Init``. Decoding is total: anything that is not a well-formed schema-1
record comes back as a :class:`Skip` with a reason, never as an exception, so replay cannot crash on input.

The record type is a ``msgspec.Struct``: msgspec checks the whole schema in C while decoding (about four
times faster than parsing with a general JSON library and checking fields in Python), and ``gc=False``
keeps a million resolved records out of the cyclic garbage collector's way. Pydantic stays at the edges
(config, HTTP); this is the replay hot path.
"""

from __future__ import annotations

import sys
from enum import StrEnum
from typing import Annotated, Any, Literal

import msgspec

from trimtab.channel import strictjson
from trimtab.channel.strictjson import INT64_MAX, INT64_MIN

SCHEMA_VERSION = 1


class State(StrEnum):
    FREE = "free"
    OWNED = "owned"
    ASSIGNING = "assigning"
    RELEASING = "releasing"
    SPLITTING = "splitting"
    MERGING = "merging"
    DELETED = "deleted"

    @property
    def in_flight(self) -> bool:
        return self in IN_FLIGHT


IN_FLIGHT = frozenset({State.ASSIGNING, State.RELEASING, State.SPLITTING, State.MERGING})
SEMI_TERMINAL = frozenset({State.FREE, State.DELETED})
_BY_NAME: dict[str, State] = {s.value: s for s in State}

BrokerId = Annotated[str, msgspec.Meta(min_length=1)]


class Record(msgspec.Struct, frozen=True, gc=False, omit_defaults=True, forbid_unknown_fields=True):
    """One proposed or resolved bundle state. ``children`` (range -> broker or null) is for splits (the
    child ranges) and merges (one entry: the merged range).

    Every field but ``children`` is required on the wire (msgspec refuses a missing field even when its
    value may be null), so build records with keywords through :func:`make`. ``forbid_unknown_fields``
    applies to msgspec's fast path only: a value with fields of a later protocol revision is refused
    there and decided by the strict reference path, which ignores unknown fields once they pass the
    structure rules (see :func:`decode`).
    """

    schema: Literal[1]
    state: State
    dst: BrokerId | None
    src: BrokerId | None
    version: Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)]
    force: bool
    ts: Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
    writer: str
    children: dict[str, BrokerId | None] | None = None

    def owner(self) -> str | None:
        """The broker serving the bundle right now: the owner, or the source while it splits or merges (its
        topics stay where they are until the new bundles are published)."""
        if self.state is State.OWNED:
            return self.dst
        if self.state is State.SPLITTING or self.state is State.MERGING:
            return self.src
        return None

    def names(self, broker: str) -> bool:
        return broker in (self.dst, self.src)

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON-ready dict, with every protocol field present (children only when set)."""
        out: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "state": self.state.value,
            "dst": self.dst,
            "src": self.src,
            "version": self.version,
            "force": self.force,
            "ts": self.ts,
            "writer": self.writer,
        }
        if self.children is not None:
            out["children"] = dict(self.children)
        return out


class Skip(msgspec.Struct, frozen=True):
    """Why a message could not be read as a record. Skipped messages never change the table."""

    reason: str


#: A channel value longer than this is refused unread (``too_large``): a record is ~150 bytes, and a split
#: into the maximum 128 children stays under 16 KiB.
MAX_RECORD_BYTES = 64 * 1024

SKIP_MALFORMED = Skip(strictjson.MALFORMED)  # not JSON, not an object, wrong types, missing fields
SKIP_UNKNOWN_STATE = Skip("unknown_state")
SKIP_FUTURE_SCHEMA = Skip("future_schema")
SKIP_BAD_KEY = Skip("bad_key")
SKIP_WRONG_PARTITION = Skip("wrong_partition")
SKIP_TOO_LARGE = Skip(strictjson.TOO_LARGE)
_STRUCTURE_SKIPS = {reason: Skip(reason) for reason in strictjson.REASONS}

#: Every reason a channel message can be skipped for (a bounded label set for metrics).
SKIP_REASONS = (
    SKIP_BAD_KEY.reason,
    SKIP_WRONG_PARTITION.reason,
    *strictjson.REASONS,
    SKIP_FUTURE_SCHEMA.reason,
    SKIP_UNKNOWN_STATE.reason,
)

_decoder = msgspec.json.Decoder(Record)
_encoder = msgspec.json.Encoder()
_intern = sys.intern
_FIELDS = tuple(Record.__struct_fields__)


def make(
    state: State,
    *,
    version: int,
    ts: int,
    writer: str,
    dst: str | None = None,
    src: str | None = None,
    force: bool = False,
    children: dict[str, str | None] | None = None,
) -> Record:
    return Record(
        schema=1,
        state=state,
        dst=dst,
        src=src,
        version=version,
        force=force,
        ts=ts,
        writer=writer,
        children=children,
    )


def encode(record: Record | None) -> bytes | None:
    """Wire bytes for a record; ``None`` (a tombstone) stays ``None``."""
    if record is None:
        return None
    return _encoder.encode(record)


def record_from_json(obj: object) -> Record | Skip:
    """A record from a value that passed :func:`channel.strictjson.parse`; fields not in schema 1 are
    ignored (additive fields are allowed within schema 1)."""
    if type(obj) is not dict:
        return SKIP_MALFORMED
    schema = obj.get("schema")
    if type(schema) is int and schema > SCHEMA_VERSION:
        return SKIP_FUTURE_SCHEMA
    if type(schema) is not int or schema != SCHEMA_VERSION:
        return SKIP_MALFORMED
    state = obj.get("state")
    if type(state) is str and state not in _BY_NAME:
        return SKIP_UNKNOWN_STATE
    # The structure rules bound the depth, so this conversion (recursive, in C) nests at most twice.
    known = {k: obj[k] for k in _FIELDS if k in obj}
    try:
        return msgspec.convert(known, Record)
    except msgspec.ValidationError:
        return SKIP_MALFORMED


def decode_strict(value: bytes) -> Record | Skip:
    """The reference decoder: the protocol's rules, applied by the strict parser. Never raises."""
    if len(value) > MAX_RECORD_BYTES:
        return SKIP_TOO_LARGE
    obj = strictjson.parse(value)
    if isinstance(obj, strictjson.Invalid):
        return _STRUCTURE_SKIPS[obj.reason]
    return record_from_json(obj)


def decode(value: bytes) -> Record | Skip:
    """Decode and validate one wire value: exactly :func:`decode_strict`, faster. Never raises.

    Fast path: msgspec decodes the value under the schema's types and ranges. Why its result is the strict
    reading: with ``forbid_unknown_fields`` the only strings msgspec accepts are the record's own names and
    values, which it decodes with CPython's strict UTF-8 decoder, refusing lone surrogate escapes; a BOM,
    non-ASCII bytes outside strings, an integer outside the ranges and any nesting beyond the record's own
    are refused too; and of a repeated name it keeps the last value, as the rules say (it type-checks every
    occurrence, so it may refuse what the rules accept -- never the reverse). Anything it refuses,
    whatever exception it raises, goes to the reference, which decides and says why. The property tests
    check that the two agree. ``channel.table.TableView`` inlines the same steps.
    """
    if len(value) > MAX_RECORD_BYTES:
        return SKIP_TOO_LARGE
    try:
        return _decoder.decode(value)
    except Exception:  # any refusal, whatever its type: the reference decides, and says why
        return decode_strict(value)


def intern_brokers(rec: Record) -> Record:
    """Share broker-id strings between records; called once per accepted record to bound memory."""
    dst, src, writer = rec.dst, rec.src, rec.writer
    return msgspec.structs.replace(
        rec,
        dst=_intern(dst) if dst is not None else None,
        src=_intern(src) if src is not None else None,
        writer=_intern(writer),
    )
