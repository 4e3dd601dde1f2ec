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
import orjson

SCHEMA_VERSION = 1


class State(StrEnum):
    FREE = "free"
    OWNED = "owned"
    ASSIGNING = "assigning"
    RELEASING = "releasing"
    SPLITTING = "splitting"
    DELETED = "deleted"

    @property
    def in_flight(self) -> bool:
        return self in IN_FLIGHT


IN_FLIGHT = frozenset({State.ASSIGNING, State.RELEASING, State.SPLITTING})
SEMI_TERMINAL = frozenset({State.FREE, State.DELETED})
_BY_NAME: dict[str, State] = {s.value: s for s in State}

BrokerId = Annotated[str, msgspec.Meta(min_length=1)]


class Record(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """One proposed or resolved bundle state. ``children`` (child range -> broker or null) is for splits.

    Every field but ``children`` is required on the wire (msgspec refuses a missing field even when its
    value may be null), so build records with keywords through :func:`make`.
    """

    schema: Literal[1]
    state: State
    dst: BrokerId | None
    src: BrokerId | None
    version: Annotated[int, msgspec.Meta(ge=1)]
    force: bool
    ts: int
    writer: str
    children: dict[str, BrokerId | None] | None = None

    def owner(self) -> str | None:
        """The broker serving the bundle right now: the owner, or the source while it splits."""
        if self.state is State.OWNED:
            return self.dst
        if self.state is State.SPLITTING:
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


SKIP_MALFORMED = Skip("malformed")  # not JSON, not an object, wrong types, missing fields
SKIP_UNKNOWN_STATE = Skip("unknown_state")
SKIP_FUTURE_SCHEMA = Skip("future_schema")
SKIP_BAD_KEY = Skip("bad_key")

_decoder = msgspec.json.Decoder(Record)
_encoder = msgspec.json.Encoder()
_intern = sys.intern
# msgspec raises RecursionError (not DecodeError) on deeply nested input, e.g. in an unknown field: a ~2 KB
# value would otherwise crash replay on every node.
_DecodeError = (msgspec.DecodeError, RecursionError)

SKIP_TOO_DEEP = Skip("too_deep")
# Where msgspec gives up on nesting depends on how deep the *caller's* stack already is, so two nodes could
# disagree about one record. A fixed, stack-independent rule comes first: a value over 1 KiB with more than
# 64 JSON containers is skipped. A protocol record has at most three containers; a short value cannot nest
# deep enough to reach any interpreter's recursion limit, so only long values are counted.
MAX_CHECKED_LEN = 1024
MAX_CONTAINERS = 64


def too_deep(value: bytes) -> bool:
    return len(value) > MAX_CHECKED_LEN and value.count(b"{") + value.count(b"[") > MAX_CONTAINERS


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


def _classify(value: bytes) -> Skip:
    """Say precisely why ``value`` failed strict decoding (the slow path, off the hot path)."""
    try:
        d = orjson.loads(value)
    except orjson.JSONDecodeError:
        return SKIP_MALFORMED
    if type(d) is not dict:
        return SKIP_MALFORMED
    schema = d.get("schema")
    if type(schema) is int and schema > SCHEMA_VERSION:
        return SKIP_FUTURE_SCHEMA
    st = d.get("state")
    if type(st) is str and st not in _BY_NAME and type(schema) is int and schema == SCHEMA_VERSION:
        return SKIP_UNKNOWN_STATE
    return SKIP_MALFORMED


def decode(value: bytes) -> Record | Skip:
    """Decode and validate one wire value. Never raises."""
    if too_deep(value):
        return SKIP_TOO_DEEP
    try:
        return _decoder.decode(value)
    except _DecodeError:
        return _classify(value)


def decode_obj(obj: object) -> Record | Skip:
    """Validate an already-parsed JSON value (used by file tooling that reads JSON lines)."""
    try:
        raw = orjson.dumps(obj)
    except TypeError:
        return SKIP_MALFORMED
    return decode(raw)


def intern_brokers(rec: Record) -> Record:
    """Share broker-id strings between records; called once per accepted record to bound memory."""
    dst, src, writer = rec.dst, rec.src, rec.writer
    return msgspec.structs.replace(
        rec,
        dst=_intern(dst) if dst is not None else None,
        src=_intern(src) if src is not None else None,
        writer=_intern(writer),
    )
