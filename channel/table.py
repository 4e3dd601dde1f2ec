"""The table view: the resolved state of every bundle, built by replaying the channel in log order.

One ``TableView`` per node. It is fed raw messages (key bytes, value bytes, partition, offset) by a
transport, applies :func:`channel.resolve.resolve` to each, and notifies listeners of accepted changes
once it is *live* (caught up). During catch-up nobody is notified: a bundle may pass through many states
in the backlog and only the final one matters; consumers scan the table when it turns live instead.

Determinism rules enforced here, beyond the predicate:

* A key belongs to exactly one channel partition, ``crc32(key) % partitions`` (librdkafka's ``consistent``
  partitioner, which trimtab's producers use). A record found in another partition is skipped: replicas
  interleave partitions differently, so one bundle's records must never be spread over two.
* Within a partition an offset is applied once; re-delivered offsets are ignored (idempotent by offset).
"""

from __future__ import annotations

import threading
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from trimtab.channel.bundles import BundleRange, is_bundle_name, parse_bundle
from trimtab.channel.packed import SETTLED, Packer, count_states
from trimtab.channel.records import (
    MAX_RECORD_BYTES,
    SKIP_BAD_KEY,
    SKIP_WRONG_PARTITION,
    Record,
    Skip,
    State,
    _decoder,
    decode_strict,
    intern_brokers,
)
from trimtab.channel.resolve import ACCEPT, resolve

# (key, old, new): old/new None means Init.
Listener = Callable[[str, Record | None, Record | None], None]
# (key or None, partition, offset, reason)
SkipHook = Callable[[str | None, int | None, int | None, str], None]

_crc32 = zlib.crc32
_decode_raw = _decoder.decode
# Only consulted for records that name ranges (splits, merges), which always get their real range; a
# placeholder otherwise.
_ANY_RANGE = BundleRange(0, 0xFFFFFFFF)


def _unpacked(_rec: Record) -> None:
    """The packer of a table that keeps records whole."""
    return None


def partition_for(key: bytes, partitions: int) -> int:
    """The channel partition a bundle's records live in (librdkafka ``consistent`` partitioner)."""
    return _crc32(key) % partitions


@dataclass(slots=True)
class ReplayStats:
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, int]:
        return {
            "accepted": self.accepted,
            "rejected": sum(self.rejected.values()),
            "skipped": sum(self.skipped.values()),
        }

    def detail(self) -> dict[str, object]:
        return {
            **self.as_dict(),
            "rejected_by_reason": {str(k): n for k, n in self.rejected.items()},
            "skipped_by_reason": dict(self.skipped),
        }


class TableView:
    """Resolved bundle states, keyed by bundle name. Not thread-safe for writers: one feeder at a time.

    Readers on other threads may call :meth:`get` and iterate :meth:`items` snapshots; single dict
    operations are atomic under the GIL and records are immutable.

    Settled records (owned, free, deleted) are kept packed into one int each (channel.packed: ~170 bytes a
    bundle instead of ~243) and made again on every read: a reader gets a record equal to the one applied,
    not the same object.
    """

    def __init__(
        self, partitions: int | None = None, on_skip: SkipHook | None = None, *, packed: bool = True
    ) -> None:
        """``packed``: hold settled records packed (a node's own table). The simulator's one table, which
        a hundred simulated nodes share and read a hundred times as often, keeps records whole instead:
        the same records, the same answers, ~20 % less of its time spent."""
        self.partitions = partitions
        self._table: dict[str, Record | int] = {}
        self._packer = Packer()
        self._pack = packed
        self.positions: dict[int, int] = {}  # partition -> next offset to apply
        self.stats = ReplayStats()
        self._listeners: list[Listener] = []
        self._on_skip = on_skip
        self.live = False
        self.generation = 0  # one more each time the table is replaced whole (load): listeners heard nothing
        self.last_outcome = ""
        # Held for a whole batch by the feeder and by snapshot(): a snapshot is always the state after
        # exactly the records its positions cover. One acquire per batch, nothing per record.
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ reading
    def get(self, bundle: str) -> Record | None:
        rec = self._table.get(bundle)
        if type(rec) is int:
            return self._packer.unpack(rec)
        return rec  # type: ignore[return-value]  # not an int: a record or None

    def _records(self, raw: list[tuple[str, Record | int]]) -> list[tuple[str, Record]]:
        unpack = self._packer.unpack
        return [(k, unpack(r) if type(r) is int else r) for k, r in raw]  # type: ignore[misc]

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, bundle: object) -> bool:
        return bundle in self._table

    def items(self) -> list[tuple[str, Record]]:
        """A point-in-time copy, safe to iterate while the feeder keeps applying."""
        return self._records(list(self._table.items()))

    def as_dict(self) -> dict[str, Record]:
        return dict(self.items())

    def snapshot(self) -> tuple[dict[str, Record], dict[int, int]]:
        """A consistent (states, positions) pair, for the snapshot writer. The feeder waits only for the
        copy; the records are made after it."""
        with self._lock:
            raw, positions = list(self._table.items()), dict(self.positions)
        return dict(self._records(raw)), positions

    def owned(self) -> Iterator[tuple[str, str]]:
        """``(bundle, dst)`` of every bundle in state ``Owned``, from a point-in-time copy of the table,
        without making a record of each (a placement index scans a million bundles this way)."""
        owner = self._packer.owner
        for k, r in list(self._table.items()):
            if type(r) is int:
                dst = owner(r)
            elif r.state is State.OWNED:  # type: ignore[union-attr]  # not an int: a record
                dst = r.dst  # type: ignore[union-attr]
            else:
                continue
            if dst is not None:
                yield k, dst

    def unsettled(self) -> list[tuple[str, Record]]:
        """Every bundle held as a record object: all those in flight or with children (and settled ones a
        table did not pack). What a scan for bundles in flight needs, from a point-in-time copy, without
        making a record of each settled bundle (an operations pass reads it every second)."""
        return [(k, r) for k, r in list(self._table.items()) if type(r) is not int]  # type: ignore[misc]

    def state_counts(self) -> dict[State, int]:
        """Bundles per state, without making a record of each packed one."""
        values = list(self._table.values())
        counts = count_states(v for v in values if type(v) is int)
        for r in values:
            if type(r) is not int:
                state = r.state  # type: ignore[union-attr]  # not an int: a record
                counts[state] = counts.get(state, 0) + 1
        return counts

    def packed_broker_ids(self) -> int:
        """Broker ids numbered for packing (channel.packed.MAX_IDS at most; never forgotten)."""
        return len(self._packer)

    def packed_count(self) -> int:
        """How many bundles are held packed (the rest are records in flight or with children)."""
        return sum(1 for r in list(self._table.values()) if type(r) is int)

    def owned_by(self, broker: str) -> Iterator[tuple[str, Record]]:
        for k, r in self.items():
            if r.owner() == broker:
                yield k, r

    # ------------------------------------------------------------------ listeners
    def add_listener(self, fn: Listener) -> None:
        self._listeners.append(fn)

    def remove_listener(self, fn: Listener) -> None:
        self._listeners.remove(fn)

    def set_live(self) -> None:
        """Caught up: notify listeners from now on, and share broker-id strings between the records held
        whole (in flight, or with children).

        Packed records share them already (channel.packed numbers each id once); the others are interned
        here once and then per accepted record, instead of on the bootstrap hot path, where every record
        decodes its own copies of its broker ids.
        """
        with self._lock:
            # In place: values replaced under existing keys, so the old records go one by one instead of
            # a second table existing beside the first (+130 B per bundle at the peak, a million bundles
            # at once at the end of a bootstrap). Readers see either record of a key, equal in value.
            # (Replacing the value of an existing key while iterating neither adds nor deletes one: safe.)
            table = self._table
            for k, r in table.items():
                if type(r) is not int:
                    table[k] = intern_brokers(r)  # type: ignore[arg-type]  # not an int: a record
            self.live = True

    # ------------------------------------------------------------------ loading
    def load(self, states: dict[str, Record], positions: dict[int, int]) -> None:
        """Install a snapshot (see channel.snapshot) before replaying the tail after it.

        Also the way back from a history gap: the table is replaced and is no longer live (listeners hear
        nothing until :meth:`set_live`, when their owner rescans it). Replay counters keep counting."""
        with self._lock:
            # The same packer: readers on other threads may hold a packed value of the old table, which only
            # this numbering reads right (it only grows; see channel.packed for its bound).
            pack = self._packer.pack if self._pack else _unpacked
            table: dict[str, Record | int] = {}
            for k, r in states.items():
                p = pack(r)
                table[k] = r if p is None else p
            self._table = table
            self.positions = dict(positions)
            self.live = False
            self.generation += 1

    # ------------------------------------------------------------------ applying
    def _skip(self, key: str | None, partition: int | None, offset: int | None, reason: str) -> str:
        self.stats.skipped[reason] += 1
        if self._on_skip is not None:
            self._on_skip(key, partition, offset, reason)
        return "skipped"

    def apply(
        self,
        key: bytes | None,
        value: bytes | None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> str:
        """Apply one message; returns ``accepted``, ``rejected``, ``skipped`` or ``duplicate``."""
        self.apply_all(((key, value, partition, offset),))
        return self.last_outcome

    def apply_all(
        self, messages: Iterable[tuple[bytes | None, bytes | None, int | None, int | None]]
    ) -> None:
        """Apply messages in log order. The one implementation of replay; kept tight because a node
        bootstrapping a large channel spends nearly all its time in this loop."""
        with self._lock:
            self._apply_all(messages)

    # One function on purpose, however long: a function call per record costs ~5 % of replay throughput.
    def _apply_all(  # noqa: PLR0915
        self, messages: Iterable[tuple[bytes | None, bytes | None, int | None, int | None]]
    ) -> None:
        table = self._table
        positions = self.positions
        parts = self.partitions
        listeners = self._listeners
        live = self.live
        rejected = self.stats.rejected
        decode_raw = _decode_raw
        intern = intern_brokers
        packing = self._pack
        pack = self._packer.pack_decoded  # records from the decoder only
        owned_state, free_state, deleted_state = SETTLED
        unpack = self._packer.unpack
        crc32 = _crc32
        max_len = MAX_RECORD_BYTES
        accept = ACCEPT
        accepted = 0
        outcome = ""
        for key, value, partition, offset in messages:
            if partition is not None and offset is not None:
                if offset < positions.get(partition, 0):
                    outcome = "duplicate"
                    continue
                positions[partition] = offset + 1
            if key is None:
                outcome = self._skip(None, partition, offset, SKIP_BAD_KEY.reason)
                continue
            try:
                name = key.decode()
            except UnicodeDecodeError:
                outcome = self._skip(None, partition, offset, SKIP_BAD_KEY.reason)
                continue
            # The home partition is checked for every record, known key or not: a stray record of a known
            # key in another partition would otherwise be applied or skipped depending on how this replica
            # interleaved the partitions, and replicas would diverge.
            if parts is not None and partition is not None and crc32(key) % parts != partition:
                outcome = self._skip(name, partition, offset, SKIP_WRONG_PARTITION.reason)
                continue
            held = table.get(name)
            # A key in the table had its name checked when its first record was accepted.
            if held is None:
                if not is_bundle_name(name):
                    outcome = self._skip(name, partition, offset, SKIP_BAD_KEY.reason)
                    continue
                cur: Record | None = None
            elif type(held) is int:
                cur = unpack(held)
            else:
                cur = held  # type: ignore[assignment]  # not an int: a record
            rng = _ANY_RANGE
            if value is None:
                new: Record | None = None
            else:
                # channel.records.decode, inlined: msgspec, and the strict reference for whatever it refuses.
                try:
                    new = decode_raw(value) if len(value) <= max_len else None
                except Exception:  # whatever msgspec raised, the reference decides
                    new = None
                if new is None:
                    res = decode_strict(value)
                    if isinstance(res, Skip):
                        outcome = self._skip(name, partition, offset, res.reason)
                        continue
                    new = res
                if new.children is not None:  # a split or a merge: its ranges are checked against the key's
                    rng = parse_bundle(name)[1]
            verdict = resolve(rng, cur, new)
            if verdict is not accept:
                rejected[verdict] += 1
                outcome = "rejected"
                continue
            accepted += 1
            outcome = "accepted"
            if new is None:
                del table[name]
            else:
                if live:  # listeners keep records: they get the broker ids shared
                    new = intern(new)
                state = new.state
                # Only a settled record may be packed: the others skip the call (nearly half of them).
                if packing and (state is owned_state or state is free_state or state is deleted_state):
                    packed = pack(new)
                    table[name] = new if packed is None else packed
                else:
                    table[name] = new
            if live:
                for fn in listeners:
                    fn(name, cur, new)
        self.stats.accepted += accepted
        self.last_outcome = outcome


def replay(
    messages: Iterable[tuple[bytes | None, bytes | None, int | None, int | None]],
    partitions: int | None = None,
) -> TableView:
    """Full replay of a log from its first message: the reference every bootstrap must equal."""
    view = TableView(partitions)
    view.apply_all(messages)
    return view
