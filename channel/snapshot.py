"""Keeping the channel bounded without breaking first-valid-transition (DESIGN.md section 3.4).

Kafka compaction keeps the *last* record of a key, which may be one every node rejected; so the channel is
never compacted. Instead the leader periodically writes the *resolved* table to a compacted snapshot topic
together with the channel positions it covers, and a node bootstraps from the newest complete snapshot
and replays the channel from those positions.

Snapshot topic layout (one partition, so its order is total):

* ``chunk/<id>/<seq>`` -> ``{"schema":1,"id":..,"seq":n,"bundles":{name: record, ...}}``
* ``manifest/<term>`` -> ``{"schema":1,"id":..,"chunks":n,"bundles":N,"channel":topic,"partitions":P,
  "positions":{"0":o0,...},"ts":..,"writer":..,"term":..}`` (one key per leader term)

A writer appends every chunk, waits until they are durable, then appends the manifest, and only then
tombstones the chunks of older snapshots and the manifests of older terms. A crash at any point leaves the
previous manifest and its chunks intact; a reader takes the newest (term, time) manifest whose chunks are
all present, or replays from offset zero when there is none. Manifests are keyed by term so that a stale
leader finishing a snapshot late cannot replace a newer leader's manifest under compaction. Everything here except :class:`SnapshotWriter` is pure.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import msgspec
import structlog

from channel.records import Record
from channel.table import TableView
from channel.transport import Message, Transport

log = structlog.get_logger("trimtab.snapshot")

MANIFEST_PREFIX = b"manifest/"
CHUNK_PREFIX = b"chunk/"
DEFAULT_CHUNK_BUNDLES = 2000  # ~300 KB of JSON: well under Kafka's 1 MB default message limit


class Chunk(msgspec.Struct, frozen=True):
    schema: int
    id: str
    seq: int
    bundles: dict[str, Record]


class Manifest(msgspec.Struct, frozen=True):
    schema: int
    id: str
    chunks: int
    bundles: int
    channel: str
    partitions: int
    positions: dict[int, int]
    ts: int
    writer: str
    term: int = 0


@dataclass(frozen=True)
class Snapshot:
    manifest: Manifest
    states: dict[str, Record]

    @property
    def positions(self) -> dict[int, int]:
        return dict(self.manifest.positions)


_enc = msgspec.json.Encoder()
_chunk_dec = msgspec.json.Decoder(Chunk)
_manifest_dec = msgspec.json.Decoder(Manifest)


def manifest_key(channel: str, term: int) -> bytes:
    """One manifest key per channel topic and leader term: a stale leader's late manifest cannot replace a
    newer one, and channels sharing a snapshot topic do not collide."""
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
    """Keys to tombstone once the snapshot ``keep_id`` is durable: the chunks of every other snapshot and,
    given the writer's ``channel`` and ``term``, that channel's manifests of older terms (never a newer
    leader's)."""
    keep = CHUNK_PREFIX + keep_id.encode() + b"/"
    out = {k for k in topic_keys if k.startswith(CHUNK_PREFIX) and not k.startswith(keep)}
    if term is not None and channel is not None:
        mine = manifest_key(channel, term)
        prefix = MANIFEST_PREFIX + channel.encode() + b"/"
        out |= {k for k in topic_keys if k.startswith(prefix) and len(k) == len(mine) and k < mine}
    return sorted(out)


def choose(
    messages: Iterable[tuple[bytes | None, bytes | None]], *, channel: str | None = None
) -> Snapshot | None:
    """The newest complete snapshot in the snapshot topic's messages (in log order), or None.

    Total: undecodable messages are ignored. Manifests are compared by (term, ts): a snapshot of a later
    leader wins, whenever its manifest landed. A manifest counts only if every chunk it names is present
    (compaction keeps the latest value per key; tombstones delete); otherwise the next newest is tried.
    ``channel`` restricts to snapshots of that channel topic.
    """
    chunks: dict[bytes, Chunk] = {}
    manifests: dict[bytes, tuple[int, Manifest]] = {}  # key -> (position in the log, manifest)
    for i, (key, value) in enumerate(messages):
        if key is None:
            continue
        if key.startswith(MANIFEST_PREFIX):
            if value is None:
                manifests.pop(key, None)
                continue
            try:
                manifests[key] = (i, _manifest_dec.decode(value))
            except (msgspec.DecodeError, RecursionError):
                manifests.pop(key, None)
                log.warning("snapshot_manifest_unreadable", key=key.decode(errors="replace"))
            continue
        if not key.startswith(CHUNK_PREFIX):
            continue
        if value is None:
            chunks.pop(key, None)
            continue
        try:
            chunks[key] = _chunk_dec.decode(value)
        except (msgspec.DecodeError, RecursionError):
            chunks.pop(key, None)
    # Newest first: by term, then time, then position in the log.
    for _, m in sorted(manifests.values(), key=lambda x: (x[1].term, x[1].ts, x[0]), reverse=True):
        if m.schema != 1 or (channel is not None and m.channel != channel):
            continue
        states: dict[str, Record] = {}
        complete = True
        for seq in range(m.chunks):
            c = chunks.get(chunk_key(m.id, seq))
            if c is None or c.id != m.id or c.seq != seq:
                complete = False
                break
            states.update(c.bundles)
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
    snap = choose(snapshot_topic, channel=channel)
    if snap is not None and (partitions is None or snap.manifest.partitions == partitions):
        view.load(snap.states, snap.positions)
    view.apply_all(channel_messages)
    return view


def new_snapshot_id(term: int) -> str:
    return f"{term}-{int(time.time() * 1000)}-{uuid.uuid4().hex[:8]}"


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
        sid = new_snapshot_id(term)
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
        futures = [self.transport.produce(self.topic, k, v) for k, v in chunk_msgs]
        for f in futures:
            f.result(self.timeout)  # every chunk durable before the manifest names them
        self.transport.produce(self.topic, mkey, mvalue).result(self.timeout)
        self.known_keys.update(k for k, _ in chunk_msgs)
        self.known_keys.add(mkey)
        stale = garbage(self.known_keys, sid, term, self.channel)
        for k in stale:
            self.transport.produce(self.topic, k, None)
        self.transport.flush(self.timeout)
        self.known_keys.difference_update(stale)
        self.last_id = sid
        manifest = _manifest_dec.decode(mvalue)
        log.info(
            "snapshot_written",
            snapshot=sid,
            bundles=manifest.bundles,
            chunks=manifest.chunks,
            positions=manifest.positions,
            collected=len(stale),
        )
        return manifest


def read_all(transport: Transport, topic: str, timeout: float = 30.0) -> Iterator[Message]:
    """Every message of ``topic`` up to the high watermarks seen now, partition by partition."""
    n = transport.partitions(topic)
    highs = {p: transport.watermarks(topic, p) for p in range(n)}
    start = {p: lo for p, (lo, _) in highs.items()}
    if all(start[p] >= highs[p][1] for p in range(n)):
        return
    reader = transport.reader(topic, start, low_latency=True)
    deadline = time.monotonic() + timeout
    try:
        pos = dict(start)
        while any(pos[p] < highs[p][1] for p in range(n)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} did not reach its end within {timeout}s")
            for m in reader.poll(10_000, 0.1):
                if m.offset < highs[m.partition][1]:
                    yield m
            pos.update(reader.positions())
    finally:
        reader.close()
