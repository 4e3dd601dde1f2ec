"""Keeping the channel bounded without breaking first-valid-transition (docs/protocol.md section 5).

Kafka compaction keeps the *last* record of a key, which may be one every node rejected; so the channel is
never compacted. Instead the leader periodically writes the *resolved* table to a compacted snapshot topic
together with the channel positions it covers, and a node bootstraps from the newest complete snapshot
and replays the channel from those positions.

Snapshot topic layout: **one partition** (:data:`SNAPSHOT_PARTITION`), so its order is total and compaction
sees every key of a snapshot together. Writers produce to that partition explicitly and readers read only
it; :func:`check_snapshot_topic` refuses a topic with more partitions unless the operator allowed it (the
librdkafka mock cluster cannot create a one-partition topic).

* ``chunk/<id>/<seq>`` -> ``{"schema":1,"id":..,"seq":n,"bundles":{name: record, ...}}``
* ``manifest/<channel>/<term>`` -> ``{"schema":1,"id":..,"chunks":n,"bundles":N,"channel":topic,
  "partitions":P,"positions":{"0":o0,...},"ts":..,"writer":..,"term":..}`` (one key per leader term)

A snapshot id is ``<term>-<sequence>-<random>``; (term, sequence) orders snapshots (the sequence only
grows within one writer, and one term has one writer). A writer appends every chunk, waits until they are
durable, then appends the manifest, and only then tombstones what is *older* than its snapshot: chunks of
snapshots with a smaller (term, sequence) -- never a newer leader's -- and the manifests of older terms.
A crash at any point leaves the previous manifest and its chunks intact; the chunk keys of a write that
failed are remembered and collected by the next one. A reader takes the newest complete manifest of its
channel and partition count, ordered by (term, position in the topic), or replays from offset zero when
there is none. Chunks and manifests are decoded like every other value (:mod:`channel.values`): a poisoned
one is skipped, never fatal. Everything here except :class:`SnapshotWriter` is pure.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Annotated

import msgspec
import structlog

from trimtab.channel.bundles import is_bundle_name
from trimtab.channel.records import Record
from trimtab.channel.table import TableView
from trimtab.channel.transport import Message, Transport
from trimtab.channel.values import Refused, StrictDecoder
from trimtab.errors import ConfigError, SnapshotTopicError, TransportError

log = structlog.get_logger("trimtab.snapshot")

MANIFEST_PREFIX = b"manifest/"
CHUNK_PREFIX = b"chunk/"
DEFAULT_CHUNK_BUNDLES = 2000  # ~300 KB of JSON: well under Kafka's 1 MB default message limit
SNAPSHOT_PARTITION = 0
#: A snapshot value longer than this is refused unread (100 000 bundles a chunk, the configurable maximum,
#: is ~15 MB); the writer refuses to write a longer one.
MAX_SNAPSHOT_VALUE_BYTES = 32 * 1024 * 1024


_Int64 = msgspec.Meta(ge=-(2**63), le=2**63 - 1)
_Count = msgspec.Meta(ge=0, le=2**63 - 1)


class Chunk(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    schema: int
    id: str
    seq: Annotated[int, _Count]
    bundles: dict[str, Record]


class Manifest(msgspec.Struct, frozen=True):
    schema: int
    id: str
    chunks: Annotated[int, _Count]
    bundles: Annotated[int, _Count]
    channel: str
    partitions: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)]
    positions: dict[Annotated[int, _Count], Annotated[int, _Count]]
    ts: Annotated[int, _Int64]
    writer: str
    term: Annotated[int, _Count] = 0


@dataclass(frozen=True)
class Snapshot:
    manifest: Manifest
    states: dict[str, Record]

    @property
    def positions(self) -> dict[int, int]:
        return dict(self.manifest.positions)


_enc = msgspec.json.Encoder()
_chunk_dec = StrictDecoder(Chunk, MAX_SNAPSHOT_VALUE_BYTES)
_manifest_dec = StrictDecoder(Manifest, MAX_SNAPSHOT_VALUE_BYTES)


def decode_chunk(value: bytes) -> Chunk | Refused:
    """A chunk, or why it is unusable: any value that fails the structure rules or the shape, and a chunk
    naming something that is not a bundle (a table built from it could not be replayed onto)."""
    chunk = _chunk_dec.decode(value)
    if isinstance(chunk, Refused):
        return chunk
    if chunk.schema != 1:
        return Refused("invalid", f"chunk schema {chunk.schema}")
    for name in chunk.bundles:
        if not is_bundle_name(name):
            return Refused("invalid", f"chunk names {name[:100]!r}, not a bundle")
    return chunk


def decode_manifest(value: bytes) -> Manifest | Refused:
    return _manifest_dec.decode(value)


def snapshot_order(snapshot_id: str) -> tuple[int, int] | None:
    """(term, sequence) of a snapshot id ``<term>-<sequence>-<random>``; None for any other id (never
    collected: it may be a newer version's)."""
    parts = snapshot_id.split("-")
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() and len(p) <= 19 for p in parts[:2]):
        return None
    return int(parts[0]), int(parts[1])


def manifest_key(channel: str, term: int) -> bytes:
    """One manifest key per channel topic and leader term: a stale leader's late manifest cannot replace a
    newer one. (Chunk keys do not name their channel, and :func:`garbage` collects older chunks whatever
    their channel: each channel needs a snapshot topic of its own -- docs/protocol.md section 5.)"""
    return MANIFEST_PREFIX + f"{channel}/{term:012d}".encode()


def chunk_key(snapshot_id: str, seq: int) -> bytes:
    return CHUNK_PREFIX + f"{snapshot_id}/{seq:06d}".encode()


def snapshot_messages(
    snapshot_id: str,
    states: dict[str, Record],
    positions: dict[int, int],
    *,
    channel: str,
    partitions: int,
    writer: str,
    term: int = 0,
    ts: int = 0,
    chunk_bundles: int = DEFAULT_CHUNK_BUNDLES,
) -> list[tuple[bytes, bytes]]:
    """The (key, value) messages of one snapshot: every chunk, then the manifest last."""
    names = sorted(states)
    out: list[tuple[bytes, bytes]] = []
    seq = 0
    for i in range(0, len(names), chunk_bundles):
        part = {n: states[n] for n in names[i : i + chunk_bundles]}
        out.append((chunk_key(snapshot_id, seq), _enc.encode(Chunk(1, snapshot_id, seq, part))))
        seq += 1
    manifest = Manifest(
        schema=1,
        id=snapshot_id,
        chunks=seq,
        bundles=len(names),
        channel=channel,
        partitions=partitions,
        positions={p: positions.get(p, 0) for p in range(partitions)},
        ts=ts,
        writer=writer,
        term=term,
    )
    out.append((manifest_key(channel, term), _enc.encode(manifest)))
    return out


def garbage(
    topic_keys: Iterable[bytes], keep_id: str, term: int | None = None, channel: str | None = None
) -> list[bytes]:
    """Keys to tombstone once the snapshot ``keep_id`` is durable: the chunks of every *older* snapshot
    (smaller (term, sequence), see :func:`snapshot_order`) and, given the writer's ``channel`` and
    ``term``, that channel's manifests of older terms. Never a newer leader's chunks or manifest, never
    a key whose id cannot be ordered."""
    keep = snapshot_order(keep_id)
    out: set[bytes] = set()
    if keep is not None:
        for k in topic_keys:
            if not k.startswith(CHUNK_PREFIX):
                continue
            sid, _, _ = k[len(CHUNK_PREFIX) :].partition(b"/")
            try:
                order = snapshot_order(sid.decode())
            except UnicodeDecodeError:
                continue
            if order is not None and order < keep:
                out.add(k)
    if term is not None and channel is not None:
        mine = manifest_key(channel, term)
        prefix = MANIFEST_PREFIX + channel.encode() + b"/"
        out |= {k for k in topic_keys if k.startswith(prefix) and len(k) == len(mine) and k < mine}
    return sorted(out)


def choose(
    messages: Iterable[tuple[bytes | None, bytes | None]],
    *,
    channel: str | None = None,
    partitions: int | None = None,
) -> Snapshot | None:
    """The newest complete snapshot in the snapshot topic's messages (in log order), or None.

    Total: a message that is not a chunk or manifest, or does not decode, is ignored (a poisoned value
    replaces the one before it under the same key, so that key counts as absent). Manifests are ordered
    by (term, position in the topic): a snapshot of a later leader wins wherever its manifest landed, and
    within a term the later one wins. A manifest counts only if it is of ``channel`` and has
    ``partitions`` (when given) and every chunk it names is present and belongs to it; otherwise the
    next newest is tried.
    """
    chunks: dict[bytes, Chunk] = {}
    manifests: dict[bytes, tuple[int, Manifest]] = {}  # key -> (position in the log, manifest)
    for i, (key, value) in enumerate(messages):
        if key is None:
            continue
        if key.startswith(MANIFEST_PREFIX):
            manifests.pop(key, None)
            if value is None:
                continue
            m = decode_manifest(value)
            if isinstance(m, Refused):
                log.warning(
                    "snapshot_manifest_skipped", key=key[:200].decode(errors="replace"), reason=m.reason
                )
                continue
            manifests[key] = (i, m)
        elif key.startswith(CHUNK_PREFIX):
            chunks.pop(key, None)
            if value is None:
                continue
            c = decode_chunk(value)
            if isinstance(c, Refused):
                log.warning("snapshot_chunk_skipped", key=key[:200].decode(errors="replace"), reason=c.reason)
                continue
            chunks[key] = c
    for _, m in sorted(manifests.values(), key=lambda x: (x[1].term, x[0]), reverse=True):
        if m.schema != 1 or (channel is not None and m.channel != channel):
            continue
        if partitions is not None and m.partitions != partitions:
            continue
        if set(m.positions) - set(range(m.partitions)):
            continue
        states: dict[str, Record] = {}
        complete = True
        for seq in range(m.chunks):
            found = chunks.get(chunk_key(m.id, seq))
            if found is None or found.id != m.id or found.seq != seq:
                complete = False
                break
            states.update(found.bundles)
        if complete and len(states) == m.bundles:
            return Snapshot(m, states)
    return None


def bootstrap(
    snapshot_topic: Iterable[tuple[bytes | None, bytes | None]],
    channel_messages: Iterable[tuple[bytes | None, bytes | None, int | None, int | None]],
    *,
    partitions: int | None = None,
    channel: str | None = None,
) -> TableView:
    """Snapshot + tail: must equal :func:`channel.table.replay` of the whole channel (property-tested).

    ``channel_messages`` may start anywhere at or before the snapshot positions: the table ignores
    offsets it has already covered.
    """
    view = TableView(partitions)
    snap = choose(snapshot_topic, channel=channel, partitions=partitions)
    if snap is not None:
        view.load(snap.states, snap.positions)
    view.apply_all(channel_messages)
    return view


def check_snapshot_topic(transport: Transport, topic: str) -> int:
    """The snapshot topic's partition count, refusing a topic trimtab cannot rely on.

    One partition keeps the topic's order total (chunks before their manifest, tombstones after) and lets
    compaction see a snapshot's keys together: a topic with more partitions is refused with a clear error.
    """
    n = transport.partitions(topic)
    if n != 1:
        raise SnapshotTopicError(
            f"snapshot topic {topic!r} has {n} partitions; it must have exactly 1 (delete it and create it "
            "with one partition and cleanup.policy=compact: trimtab topics ensure)"
        )
    return n


def new_snapshot_id(term: int, sequence: int) -> str:
    return f"{term}-{sequence}-{uuid.uuid4().hex[:8]}"


class SnapshotWriter:
    """Writes snapshots of a live table through a transport (the controller leader runs this).

    Crash-safety comes from the order of operations, documented in the module docstring.
    """

    def __init__(
        self,
        transport: Transport,
        snapshot_topic: str,
        channel_topic: str,
        *,
        writer: str,
        chunk_bundles: int = DEFAULT_CHUNK_BUNDLES,
        timeout: float = 30.0,
    ) -> None:
        self.transport = transport
        self.topic = snapshot_topic
        self.channel = channel_topic
        self.writer = writer
        self.chunk_bundles = chunk_bundles
        self.timeout = timeout
        self.known_keys: set[bytes] = set()
        self.last_id: str | None = None
        # Orders this writer's snapshots (see snapshot_order): starts at the wall clock in ms so that a
        # restarted writer with the same term (which should not happen) still sorts after itself.
        self._sequence = int(time.time() * 1000)

    def observe(self, messages: Iterable[tuple[bytes | None, bytes | None]]) -> None:
        """Learn which chunk keys exist (from reading the snapshot topic) so they can be collected."""
        for key, value in messages:
            if key is None or not (key.startswith(CHUNK_PREFIX) or key.startswith(MANIFEST_PREFIX)):
                continue
            if value is None:
                self.known_keys.discard(key)
            else:
                self.known_keys.add(key)

    def write(
        self, states: dict[str, Record], positions: dict[int, int], partitions: int, term: int
    ) -> Manifest:
        self._sequence = max(self._sequence + 1, int(time.time() * 1000))
        sid = new_snapshot_id(term, self._sequence)
        msgs = snapshot_messages(
            sid,
            states,
            positions,
            channel=self.channel,
            partitions=partitions,
            writer=self.writer,
            term=term,
            ts=int(time.time() * 1000),
            chunk_bundles=self.chunk_bundles,
        )
        chunk_msgs, (mkey, mvalue) = msgs[:-1], msgs[-1]
        for k, v in msgs:
            if len(v) > MAX_SNAPSHOT_VALUE_BYTES:
                raise ConfigError(
                    f"snapshot message {k.decode()} is {len(v)} bytes, over {MAX_SNAPSHOT_VALUE_BYTES}: "
                    "lower channel.snapshot_chunk_bundles"
                )
        # Remembered before they are written: if the write fails half-way, the next one collects them.
        self.known_keys.update(k for k, _ in chunk_msgs)
        part = SNAPSHOT_PARTITION
        futures = [self.transport.produce(self.topic, k, v, partition=part) for k, v in chunk_msgs]
        for f in futures:
            f.result(self.timeout)  # every chunk durable before the manifest names them
        self.transport.produce(self.topic, mkey, mvalue, partition=part).result(self.timeout)
        self.known_keys.add(mkey)
        stale = garbage(self.known_keys, sid, term, self.channel)
        for k in stale:
            self.transport.produce(self.topic, k, None, partition=part)
        self.transport.flush(self.timeout)
        self.known_keys.difference_update(stale)
        self.last_id = sid
        manifest = msgspec.json.decode(mvalue, type=Manifest)
        log.info(
            "snapshot_written",
            snapshot=sid,
            bundles=manifest.bundles,
            chunks=manifest.chunks,
            positions=manifest.positions,
            collected=len(stale),
        )
        return manifest


def read_all(
    transport: Transport, topic: str, timeout: float = 30.0, *, partitions: Iterable[int] | None = None
) -> Iterator[Message]:
    """Every message of ``topic`` (or of the given ``partitions``) up to the high watermarks seen now."""
    parts = sorted(partitions) if partitions is not None else list(range(transport.partitions(topic)))
    highs = {p: transport.watermarks(topic, p) for p in parts}
    start = {p: lo for p, (lo, _) in highs.items()}
    if all(start[p] >= highs[p][1] for p in parts):
        return
    reader = transport.reader(topic, start, low_latency=True)
    deadline = time.monotonic() + timeout
    try:
        pos = dict(start)
        while any(pos[p] < highs[p][1] for p in parts):
            if time.monotonic() > deadline:
                raise TransportError(f"reading {topic} did not reach its end within {timeout}s")
            for m in reader.poll(10_000, 0.1):
                if m.partition in highs and m.offset < highs[m.partition][1]:
                    yield m
            pos.update((p, o) for p, o in reader.positions().items() if p in highs)
    finally:
        reader.close()


def read_snapshot_topic(
    transport: Transport, topic: str, timeout: float = 30.0
) -> list[tuple[bytes | None, bytes | None]]:
    """The (key, value) messages of the snapshot topic's one partition, in order."""
    return [(m.key, m.value) for m in read_all(transport, topic, timeout, partitions=[SNAPSHOT_PARTITION])]
