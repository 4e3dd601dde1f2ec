"""Operations in ZooKeeper (issue 32): where a new leader finds the work the last one left.

Layout, under ``<root>/<cluster>/admin/operations``::

    <id>            -> the header: every field of the operation but its moves, and how many chunks
    <id>/<seq>      -> moves seq*CHUNK_MOVES .. (seq+1)*CHUNK_MOVES-1, as a JSON list

Why chunks: a znode holds at most ~1 MiB (ZooKeeper's ``jute.maxbuffer``) and a drain of 20 000 bundles
is ~4 MB of moves; and a pass of :func:`~trimtab.balance.operations.advance` changes a few moves, so only
their chunks are written again. A move's chunk is written *before* its record is published (the caller's
order), so a leader killed in between leaves the started version behind and the next one proposes the
same record -- never a second move. The header is written last; a reader that finds chunks newer than
the header recomputes the state from the moves (:func:`~trimtab.balance.operations.advance` does).

Everything read is hostile until decoded: an undecodable header or chunk is skipped with its reason
(logged, counted by the caller through :attr:`OperationStore.unreadable`), never raised.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Protocol

import msgspec
import structlog
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from trimtab.balance.operations import (
    MAX_BYTES,
    Move,
    Operation,
    OpKind,
    OpState,
    Undecodable,
    decode,
    encode,
)
from trimtab.cluster.zk import ZkPaths
from trimtab.errors import RequestError, ZkConflict

log = structlog.get_logger("trimtab.controller")

#: Moves per chunk znode: ~200 bytes each, so ~100 KB per znode, far below ZooKeeper's limit.
CHUNK_MOVES = 500
#: One stored part at most (a chunk of started moves is ~120 KB).
PART_MAX_BYTES = 512 * 1024
#: One ZooKeeper request at most: a transaction larger than the server's jute.maxbuffer (~1 MiB by
#: default) is refused, so a large operation is created in several.
TX_MAX_BYTES = 512 * 1024


class OperationConflict(ZkConflict):
    """Another controller wrote the operation since this one read it (a leader deposed mid-pass, or its
    successor): read every operation again before deciding anything more."""


class Header(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An operation without its moves (``chunks``: how many chunk znodes hold them)."""

    schema: int
    id: str
    kind: OpKind
    reason: str
    requested_by: str
    created_ms: int
    updated_ms: int
    state: OpState
    state_reason: str | None = None
    deadline_ms: int | None = None
    target: str | None = None
    chunks: int = 0
    moves: int = 0


_HEADER = msgspec.json.Decoder(Header)
_MOVES = msgspec.json.Decoder(list[Move])
_ENC = msgspec.json.Encoder()


def header_of(op: Operation) -> Header:
    n = len(op.moves)
    return Header(
        schema=op.schema,
        id=op.id,
        kind=op.kind,
        reason=op.reason,
        requested_by=op.requested_by,
        created_ms=op.created_ms,
        updated_ms=op.updated_ms,
        state=op.state,
        state_reason=op.state_reason,
        deadline_ms=op.deadline_ms,
        target=op.target,
        chunks=(n + CHUNK_MOVES - 1) // CHUNK_MOVES,
        moves=n,
    )


def chunks_of(moves: Sequence[Move]) -> list[tuple[Move, ...]]:
    return [tuple(moves[i : i + CHUNK_MOVES]) for i in range(0, len(moves), CHUNK_MOVES)]


def assemble(header_bytes: bytes, chunk_bytes: Sequence[bytes]) -> Operation | Undecodable:
    """An operation from its stored parts, or why not (pure: the store's decoding, tested on its own)."""
    if len(header_bytes) > PART_MAX_BYTES or any(len(c) > PART_MAX_BYTES for c in chunk_bytes):
        return Undecodable("a stored part is larger than any this version writes")
    if len(header_bytes) + sum(len(c) for c in chunk_bytes) > MAX_BYTES:
        return Undecodable("the stored parts are larger than any operation this version writes")
    try:
        h = _HEADER.decode(header_bytes)
        moves = [m for c in chunk_bytes for m in _MOVES.decode(c)]
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        return Undecodable(f"not an operation: {e}")
    if len(chunk_bytes) != h.chunks or len(moves) != h.moves:
        return Undecodable(
            f"{len(chunk_bytes)} chunks of {len(moves)} moves; the header says {h.chunks} of {h.moves}"
        )
    op = Operation(
        schema=h.schema,
        id=h.id,
        kind=h.kind,
        reason=h.reason,
        requested_by=h.requested_by,
        created_ms=h.created_ms,
        updated_ms=h.updated_ms,
        state=h.state,
        state_reason=h.state_reason,
        deadline_ms=h.deadline_ms,
        target=h.target,
        moves=tuple(moves),
    )
    # Revalidate the whole (patterns, lengths, one move per bundle) exactly as a single value is.
    return decode(encode(op))


class OperationStore(Protocol):
    unreadable: int

    def list(self) -> list[Operation]: ...

    def create(self, op: Operation) -> None: ...

    def write(self, op: Operation, before: Operation | None) -> None: ...

    def delete(self, op_id: str) -> None: ...


class ZkOperations:
    """The store in ZooKeeper. Blocking (kazoo): callers on the event loop use ``asyncio.to_thread``."""

    def __init__(self, zk: KazooClient, paths: ZkPaths) -> None:
        self.zk = zk
        self.dir = f"{paths.admin}/operations"
        self.unreadable = 0
        # znode -> the version this store last read or wrote: every write is conditional on it, so a leader
        # deposed mid-pass cannot overwrite the progress its successor stored (it gets OperationConflict).
        self._versions: dict[str, int] = {}

    def _path(self, op_id: str, seq: int | None = None) -> str:
        return f"{self.dir}/{op_id}" if seq is None else f"{self.dir}/{op_id}/{seq:06d}"

    def list(self) -> list[Operation]:
        try:
            ids = sorted(self.zk.get_children(self.dir))
        except NoNodeError:
            return []
        out = []
        for op_id in ids:
            op = self.read(op_id)
            if isinstance(op, Operation):
                out.append(op)
            elif op is not None:
                self.unreadable += 1
                log.warning("operation_unreadable", operation=op_id[:100], reason=op.reason)
        return out

    def read(self, op_id: str) -> Operation | Undecodable | None:
        try:
            header, stat = self.zk.get(self._path(op_id))
            versions = {self._path(op_id): stat.version}
            names = sorted(self.zk.get_children(self._path(op_id)))
            chunks = []
            for n in names:
                data, cstat = self.zk.get(f"{self._path(op_id)}/{n}")
                chunks.append(data)
                versions[f"{self._path(op_id)}/{n}"] = cstat.version
        except NoNodeError:
            return None  # deleted meanwhile
        self._versions.update(versions)
        if names != [f"{i:06d}" for i in range(len(names))]:
            return Undecodable(f"unexpected chunk names {names[:5]}")
        # A znode may hold no data at all (null, which kazoo returns as None): unreadable like any other.
        op = assemble(header or b"", [c or b"" for c in chunks])
        if isinstance(op, Operation) and op.id != op_id:
            return Undecodable(f"stored as {op_id[:100]!r} but names itself {op.id!r}")
        return op

    def create(self, op: Operation) -> None:
        """Store a new operation whole, in one transaction (refused if its id exists)."""
        with contextlib.suppress(NodeExistsError):
            self.zk.ensure_path(self.dir)
        # The header and as many chunks as fit in one request, then the rest in more: a reader that meets
        # the operation between two of them finds fewer chunks than its header names and skips it as
        # unreadable for that read (only the leader, which is writing it, reads them for work).
        parts = [(self._path(op.id, seq), _ENC.encode(list(c))) for seq, c in enumerate(chunks_of(op.moves))]
        batch: list[tuple[str, bytes]] = [(self._path(op.id), _ENC.encode(header_of(op)))]
        first = True
        for item in [*parts, None]:
            if item is None or (
                len(batch) > 1 and sum(len(d) for _, d in batch) + len(item[1]) > TX_MAX_BYTES
            ):
                tx = self.zk.transaction()
                for path, data in batch:
                    tx.create(path, data)
                results = tx.commit()
                if first and any(isinstance(r, NodeExistsError) for r in results):
                    raise RequestError(409, f"operation {op.id} exists already")
                errors = [r for r in results if isinstance(r, Exception)]
                if errors:
                    raise errors[0]
                first = False
                batch = []
            if item is not None:
                batch.append(item)
        self._versions[self._path(op.id)] = 0
        for seq in range(len(chunks_of(op.moves))):
            self._versions[self._path(op.id, seq)] = 0

    def write(self, op: Operation, before: Operation | None) -> None:
        """Write what changed since ``before`` (the operation as last read or written): the changed chunks
        first, the header last."""
        old = chunks_of(before.moves) if before is not None else []
        for seq, chunk in enumerate(chunks_of(op.moves)):
            if seq >= len(old):
                # A chunk the operation did not have (a drain extended past a multiple of CHUNK_MOVES): made,
                # not set -- setting a znode that does not exist would read as a conflict on every pass.
                self._create(self._path(op.id, seq), _ENC.encode(list(chunk)))
            elif old[seq] != chunk:
                self._set(self._path(op.id, seq), _ENC.encode(list(chunk)))
        if before is None or header_of(before) != header_of(op):
            self._set(self._path(op.id), _ENC.encode(header_of(op)))

    def _create(self, path: str, data: bytes) -> None:
        try:
            self.zk.create(path, data)
        except (NodeExistsError, NoNodeError):
            raise OperationConflict(f"{path} was written (or deleted) by another controller") from None
        self._versions[path] = 0

    def _set(self, path: str, data: bytes) -> None:
        try:
            stat = self.zk.set(path, data, version=self._versions.get(path, -1))
        except (BadVersionError, NoNodeError):
            self._versions.pop(path, None)
            raise OperationConflict(
                f"{path} was written by another controller since this one read it"
            ) from None
        self._versions[path] = stat.version

    def delete(self, op_id: str) -> None:
        with contextlib.suppress(NoNodeError):
            self.zk.delete(self._path(op_id), recursive=True)


class MemoryOperations:
    """The same contract in memory (the simulator, unit tests): values stored as the bytes ZooKeeper
    would hold, so decoding is exercised the same way."""

    def __init__(self) -> None:
        self.parts: dict[str, tuple[bytes, list[bytes]]] = {}
        self.unreadable = 0
        self.writes = 0

    def list(self) -> list[Operation]:
        out = []
        for op_id in sorted(self.parts):
            op = assemble(*self.parts[op_id])
            if isinstance(op, Operation):
                out.append(op)
            else:
                self.unreadable += 1
        return out

    def create(self, op: Operation) -> None:
        if op.id in self.parts:
            raise RequestError(409, f"operation {op.id} exists already")
        self.parts[op.id] = (_ENC.encode(header_of(op)), [_ENC.encode(list(c)) for c in chunks_of(op.moves)])

    def write(self, op: Operation, before: Operation | None) -> None:
        if op.id not in self.parts:  # as in ZooKeeper: an operation is created, then written
            raise OperationConflict(f"operation {op.id} was not created (or was deleted)")
        self.writes += 1
        self.parts[op.id] = (_ENC.encode(header_of(op)), [_ENC.encode(list(c)) for c in chunks_of(op.moves)])

    def delete(self, op_id: str) -> None:
        self.parts.pop(op_id, None)
