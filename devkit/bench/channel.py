"""The channel benchmark (docs/design.md section 11): replay speed, bootstrap over Kafka, memory per bundle.

Everything is measured on one realistic, seeded channel log (:func:`generate_log`) and every measured run
is checked against what the generator intended -- accepted, rejected and skipped counts by reason and the
final state of every bundle -- so a fast but wrong result raises :class:`BenchError` instead of printing a
number. The Kafka part talks to a real Apache Kafka broker (JVM processes of their own), so this process is
an ordinary Kafka client, like a node at startup.

Figures (targets in brackets):

* ``replay_records_per_s`` -- encoded messages applied to a fresh :class:`channel.table.TableView` in
  batches, as the Kafka follower feeds it; median of ``runs`` (>= 1 000 000 on one core);
* ``bootstrap_1m_s`` -- a fresh :class:`channel.client.ChannelClient` from ``start()`` to ready over the
  Kafka protocol, no snapshot (< 2 s for 1 M records on real Kafka); ``kafka_consume_only_1m_s`` is the same read with
  an apply that does nothing, and ``bootstrap_snapshot_1m_s`` the same node bootstrapping from a snapshot;
* ``bytes_per_bundle`` -- traced memory of the replayed table divided by its bundles (<= 200);
  ``bytes_per_bundle_live`` the same once the table is live (broker ids shared, as on a node).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import heapq
import os
import random
import statistics
import subprocess
import sys
import time
import tracemalloc
import uuid
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import orjson

from trimtab import channel
from trimtab.channel.bundles import BundleLayout
from trimtab.channel.records import Record, State, encode, make
from trimtab.channel.table import TableView
from trimtab.channel.transport import Message
from trimtab.devkit.bench.common import BenchError, Progress, environment, loadavg, progress_printer

# Issue 33's targets (docs/benchmarks.md): 500 000/s, 3 s and 500 B were the founding design's.
REPLAY_TARGET_RECORDS_PER_S = 1_000_000
BOOTSTRAP_TARGET_S = 2.0
BYTES_PER_BUNDLE_TARGET = 200

PARTITIONS = 4  # the channel's partitions (kafka.channel_partitions' default)
BATCH = 5000  # what channel.transport.Follower hands TableView.apply_all
BASE_TS = 1_700_000_000_000
LEADER = "controller-0"
STALE_LEADER = "controller-1"

P_GARBAGE = 0.001  # share of messages that are not records at all (skipped)
P_RACE = 0.05 / 0.949  # per valid record: a second writer's record with the same version (~5% of messages)
RACE_DELAY = 64  # a racer lands within this many messages after the winner
ASSIGN_PHASE = 0.5  # every bundle gets its first assignment within this share of the log
INFLIGHT_K = 100  # the more operations in flight, the likelier the next message continues one
P_TRANSFER = 0.7  # an operation on an owned bundle is a transfer, otherwise an unload


# ---------------------------------------------------------------------------------------------- the log


@dataclass
class ChannelLog:
    """A generated channel log and everything replaying it must produce."""

    messages: list[Message]
    partitions: int
    bundles: int
    namespaces: int
    brokers: int
    seed: int
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    final: dict[str, Record] = field(default_factory=dict)
    ops: Counter[str] = field(default_factory=Counter)
    ends: dict[int, int] = field(default_factory=dict)  # partition -> next offset (the end of the log)

    def expected_stats(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "rejected": sum(self.rejected.values()),
            "skipped": sum(self.skipped.values()),
            "rejected_by_reason": dict(sorted(self.rejected.items())),
            "skipped_by_reason": dict(sorted(self.skipped.items())),
        }

    def encoded_bytes(self) -> int:
        return sum(len(m.key or b"") + len(m.value or b"") for m in self.messages)


def bundle_names(bundles: int, namespaces: int) -> list[str]:
    """``bundles`` valid bundle names spread evenly over ``namespaces`` namespaces of 10 tenants."""
    names: list[str] = []
    per, extra = divmod(bundles, namespaces)
    for i in range(namespaces):
        count = per + (1 if i < extra else 0)
        if count:
            names.extend(BundleLayout.default(f"tenant-{i % 10}/ns-{i}", count).bundles)
    return names


# One step of an operation: (state, dst, src, writer); the version and timestamp are set when it is written.
Step = tuple[State, str | None, str | None, str]


def generate_log(
    records: int,
    bundles: int,
    *,
    seed: int = 1,
    namespaces: int = 50,
    brokers: int = 50,
    partitions: int = PARTITIONS,
) -> ChannelLog:
    """A seeded, realistic channel log of exactly ``records`` messages over ``bundles`` bundles.

    Every bundle is assigned (``Assigning v1 -> Owned v2``) during the first half of the log, interleaved
    with a random mix of transfers (``Releasing{src=A,dst=B} -> Assigning{A,B} -> Owned{B,src=A}``) and
    unloads (``Releasing{src=A} -> Free``, later re-assigned ``Free -> Assigning -> Owned``), many
    operations in flight at once. About 5% of the messages are racing duplicates: a second writer's record
    with a version that was already used (a different choice of broker, or a retried write), which must be
    rejected as ``stale_version``; about 0.1% are garbage (truncated JSON, a future schema), which must be
    skipped. Partitions and offsets are what a producer with ``partitioner=consistent`` gets.
    """
    if bundles < 1 or records < 1:
        raise ValueError("need at least one record and one bundle")
    if brokers < 2:
        raise ValueError("transfers need at least two brokers")
    generator = LogGenerator(
        records, bundles, seed=seed, namespaces=namespaces, brokers=brokers, partitions=partitions
    )
    return generator.generate()


class LogGenerator:
    """Writes the log of :func:`generate_log`, one message per :meth:`_next_message`.

    One method per kind of message -- a racing duplicate landing, garbage, the start of an assignment, a
    transfer or an unload, the next step of an operation in flight -- so each can be read alone. The log
    must stay byte-for-byte the same for a seed (runs and machines are compared on it), so the random
    draws are part of the output: every method draws exactly what it draws, in the order it draws it; a
    change that adds, drops or reorders a draw changes every log.
    """

    def __init__(
        self, records: int, bundles: int, *, seed: int, namespaces: int, brokers: int, partitions: int
    ) -> None:
        self.records = records
        self.rng = random.Random(seed)
        self.names = bundle_names(bundles, namespaces)
        self.broker_ids = [f"broker-{i}:8080" for i in range(brokers)]
        self.log = ChannelLog([], partitions, bundles, min(namespaces, bundles), brokers, seed)
        self.messages = self.log.messages
        self.ends = [0] * partitions
        self.cur: list[Record | None] = [None] * bundles  # each bundle's last accepted record
        self.plans: dict[int, list[Step]] = {}  # bundle in flight -> the steps its operation has left
        self.unassigned = list(range(bundles))
        self.rng.shuffle(self.unassigned)
        self.inflight: list[int] = []
        self.stable: list[int] = []
        self.racers: list[tuple[int, int, int, Record]] = []  # heap of (due, seq, bundle, record)

    def generate(self) -> ChannelLog:
        while len(self.messages) < self.records:
            self._next_message()
        log = self.log
        log.final = {self.names[i]: r for i, r in enumerate(self.cur) if r is not None}
        log.ops["in_flight_at_end"] = len(self.inflight)
        log.ops["never_assigned"] = len(self.unassigned)
        log.ends = dict(enumerate(self.ends))
        return log

    def _next_message(self) -> None:
        n = len(self.messages)
        ts = BASE_TS + 3 * n
        if self.racers and self.racers[0][0] <= n:
            self._land_racer()
        elif self.rng.random() < P_GARBAGE:
            self._garbage(ts)
        else:
            self._operation_step(n, ts)

    def _operation_step(self, n: int, ts: int) -> None:
        """Start an operation or take the next step of one in flight. New assignments are paced to end
        within ASSIGN_PHASE of the log; the more operations in flight, the likelier one continues."""
        rng, unassigned, inflight, stable = self.rng, self.unassigned, self.inflight, self.stable
        p_new = min(1.0, len(unassigned) / max(1.0, self.records * ASSIGN_PHASE - n))
        if unassigned and (rng.random() < p_new or not (inflight or stable)):
            self._start(unassigned.pop(), ts)
        elif inflight and (not stable or rng.random() < len(inflight) / (len(inflight) + INFLIGHT_K)):
            self._advance(rng.randrange(len(inflight)), ts)
        elif stable:
            self._start(_swap_remove(stable, rng.randrange(len(stable))), ts)
        else:  # pragma: no cover - unreachable: some bundle is always unassigned, in flight or stable
            raise AssertionError("generator has nothing to do")

    # ------------------------------------------------------------------------------- operations

    def _start(self, idx: int, ts: int) -> None:
        """Begin an operation on a bundle at rest: write its first record, keep the rest as its plan."""
        now = self.cur[idx]
        if now is None or now.state is State.FREE:
            steps = self._assign(now)
        elif now.state is State.OWNED and self.rng.random() < P_TRANSFER:
            steps = self._transfer(now)
        elif now.state is State.OWNED:
            steps = self._unload(now)
        else:
            raise AssertionError(f"bundle {self.names[idx]} starts an operation in state {now.state}")
        self._write(idx, steps[0], ts)
        self.plans[idx] = steps[1:]
        self.inflight.append(idx)

    def _assign(self, now: Record | None) -> list[Step]:
        """Assign (a bundle never written) or re-assign (a Free one): Assigning -> Owned."""
        dst = self._other_broker(None)
        steps: list[Step] = [
            (State.ASSIGNING, dst, None, self._other_broker(None)),
            (State.OWNED, dst, None, dst),
        ]
        self.log.ops["assign" if now is None else "reassign"] += 1
        return steps

    def _transfer(self, now: Record) -> list[Step]:
        """Move an owned bundle to another broker: Releasing{src,dst} -> Assigning -> Owned."""
        src = now.dst
        assert src is not None
        dst = self._other_broker(src)
        steps: list[Step] = [
            (State.RELEASING, dst, src, LEADER),
            (State.ASSIGNING, dst, src, src),
            (State.OWNED, dst, src, dst),
        ]
        self.log.ops["transfer"] += 1
        return steps

    def _unload(self, now: Record) -> list[Step]:
        """Unload an owned bundle: Releasing{src} -> Free (re-assigned by a later operation)."""
        src = now.dst
        assert src is not None
        steps: list[Step] = [(State.RELEASING, None, src, LEADER), (State.FREE, None, src, src)]
        self.log.ops["unload"] += 1
        return steps

    def _advance(self, j: int, ts: int) -> None:
        """Write the next step of the ``j``-th operation in flight; a finished bundle comes to rest."""
        idx = self.inflight[j]
        plan = self.plans[idx]
        self._write(idx, plan.pop(0), ts)
        if not plan:
            del self.plans[idx]
            _swap_remove(self.inflight, j)
            self.stable.append(idx)
            self.log.ops["completed"] += 1

    # ------------------------------------------------------------------------------- messages

    def _put(self, idx: int, value: bytes | None) -> None:
        key = self.names[idx].encode()
        p = zlib.crc32(key) % len(self.ends)
        self.messages.append(Message(key, value, p, self.ends[p]))
        self.ends[p] += 1

    def _write(self, idx: int, step: Step, ts: int) -> None:
        """An accepted record: the bundle's next version. Sometimes a racer is queued to land soon after."""
        state, dst, src, writer = step
        prev = self.cur[idx]
        rec = make(state, version=(prev.version if prev else 0) + 1, ts=ts, writer=writer, dst=dst, src=src)
        self._put(idx, encode(rec))
        self.cur[idx] = rec
        self.log.accepted += 1
        if self.rng.random() < P_RACE:
            messages = self.messages
            heapq.heappush(
                self.racers,
                (len(messages) + self.rng.randrange(RACE_DELAY), len(messages), idx, self._racer(rec)),
            )

    def _racer(self, rec: Record) -> Record:
        """A record another writer could have written at the same version (valid had it landed first)."""
        ts = rec.ts + 1
        if rec.state is State.ASSIGNING and rec.src is None:  # two agents assigned the same bundle
            dst = self._other_broker(rec.dst)
            return make(State.ASSIGNING, version=rec.version, ts=ts, writer=self._other_broker(None), dst=dst)
        if rec.state is State.RELEASING:  # a stale leader decided differently (transfer vs unload)
            alt: str | None = self._other_broker(rec.src) if rec.dst is None else None
            return make(
                State.RELEASING, version=rec.version, ts=ts, writer=STALE_LEADER, dst=alt, src=rec.src
            )
        # Owned, the Assigning of a transfer, Free: a retried write of the same transition
        return make(rec.state, version=rec.version, ts=ts, writer=rec.writer, dst=rec.dst, src=rec.src)

    def _land_racer(self) -> None:
        """The racer due first lands: a version already used, so replay must reject it."""
        _, _, idx, rec = heapq.heappop(self.racers)
        self._put(idx, encode(rec))
        self.log.rejected["stale_version"] += 1

    def _garbage(self, ts: int) -> None:
        """A message that is not a record replay can use (truncated JSON or a future schema): skipped."""
        rng = self.rng
        idx = rng.randrange(self.log.bundles)
        fake = make(State.OWNED, version=7, ts=ts, writer="mystery", dst=self.broker_ids[0])
        if rng.random() < 0.5:
            value = encode(fake)
            assert value is not None
            self._put(idx, value[: rng.randrange(1, len(value) - 1)])  # truncated JSON
            self.log.skipped["malformed"] += 1
        else:
            self._put(idx, orjson.dumps({**fake.to_json(), "schema": 2, "lease": 30}))
            self.log.skipped["future_schema"] += 1

    def _other_broker(self, not_this: str | None) -> str:
        while True:
            b = self.broker_ids[self.rng.randrange(len(self.broker_ids))]
            if b != not_this:
                return b


def _swap_remove(items: list[int], j: int) -> int:
    """Remove and return ``items[j]`` in O(1) (the last item takes its place)."""
    item = items[j]
    items[j] = items[-1]
    items.pop()
    return item


def owned_pairs_log(bundles: int, *, brokers: int = 50, partitions: int = PARTITIONS) -> ChannelLog:
    """``bundles`` distinct bundles, each ``Assigning v1 -> Owned v2`` (2 records per bundle)."""
    names = bundle_names(bundles, 50)
    log = ChannelLog([], partitions, bundles, 50, brokers, 0)
    ends = [0] * partitions
    append = log.messages.append
    for i, name in enumerate(names):
        dst = f"broker-{i % brokers}:8080"
        key = name.encode()
        p = zlib.crc32(key) % partitions
        for rec in (
            make(State.ASSIGNING, version=1, ts=BASE_TS + 2 * i, writer=LEADER, dst=dst),
            make(State.OWNED, version=2, ts=BASE_TS + 2 * i + 1, writer=dst, dst=dst),
        ):
            append(Message(key, encode(rec), p, ends[p]))
            ends[p] += 1
        log.final[name] = rec
    log.accepted = 2 * bundles
    log.ends = dict(enumerate(ends))
    return log


# ---------------------------------------------------------------------------------------------- checks


def check_table(table: TableView, log: ChannelLog, what: str, *, stats: bool = True) -> None:
    """Raise BenchError unless ``table`` is exactly what replaying ``log`` must produce."""
    if stats:
        st = table.stats
        got = {
            **st.as_dict(),
            "rejected_by_reason": {str(k): n for k, n in sorted(st.rejected.items())},
            "skipped_by_reason": dict(sorted(st.skipped.items())),
        }
        want = log.expected_stats()
        if got != want:
            raise BenchError(f"{what}: replay stats {got} != what the generator wrote {want}")
    state = table.as_dict()
    if state != log.final:
        missing = len(log.final.keys() - state.keys())
        extra = len(state.keys() - log.final.keys())
        differ = [k for k in log.final.keys() & state.keys() if state[k] != log.final[k]]
        raise BenchError(
            f"{what}: table differs from the generator's final state ({len(state)} vs {len(log.final)} "
            f"bundles; {missing} missing, {extra} extra, {len(differ)} differ, e.g. {differ[:3]})"
        )
    ends = {p: o for p, o in log.ends.items() if o}
    if stats and {p: o for p, o in table.positions.items() if o} != ends:
        raise BenchError(f"{what}: positions {table.positions} != the end of the log {log.ends}")


# ---------------------------------------------------------------------------------------------- in memory


def batches_of(messages: Sequence[Message], size: int = BATCH) -> list[Sequence[Message]]:
    return [messages[i : i + size] for i in range(0, len(messages), size)]


def replay_once(batches: list[Sequence[Message]], partitions: int) -> tuple[TableView, float, float]:
    """Replay into a fresh table; returns it, the wall-clock seconds and this thread's CPU seconds."""
    table = TableView(partitions)
    apply_all = table.apply_all
    c0 = time.thread_time()
    t0 = time.perf_counter()
    for b in batches:
        apply_all(b)
    t1 = time.perf_counter()
    return table, t1 - t0, time.thread_time() - c0


def measure_floors(batches: list[Sequence[Message]], runs: int, progress: Progress) -> dict[str, Any]:
    """What replay cannot go below in this interpreter: the CPU per record of two steps every record takes
    before the table decides anything -- decoding its value with the table's own decoder (msgspec, in C)
    and its key with the partition check (``bytes.decode``, ``zlib.crc32``) -- medians of ``runs``. Their
    sum bounds ``replay_records_per_s`` from above whatever the rest (resolution, the dict) costs."""
    from trimtab.channel.table import _crc32, _decode_raw  # the table's own steps, not copies

    values = [m.value for b in batches for m in b if m.value is not None]
    keys = [m.key for b in batches for m in b if m.key is not None]
    records = sum(len(b) for b in batches)

    def decode_all() -> None:
        for v in values:
            try:  # noqa: SIM105 -- contextlib.suppress costs a context manager per record: not the table's
                _decode_raw(v)
            except Exception:  # a hostile value: the table tries the fast path on it too
                pass

    def keys_all() -> None:
        for k in keys:
            _crc32(k)
            k.decode()

    messages = [(m.key, m.value, m.partition, m.offset) for b in batches for m in b]
    parts = max(1, max((m.partition or 0) for b in batches for m in b) + 1)

    def mandatory_all() -> None:
        # Every step a replica must take for every record before it decides anything, and nothing else:
        # the offset de-duplication, the key's decoding and home partition, the table read, the value's
        # decoding and the table write -- no resolution, no name check, no counters, no listeners.
        table: dict[str, Any] = {}
        positions: dict[int, int] = {}
        get = table.get
        for key, value, partition, offset in messages:
            if offset < positions.get(partition, 0):
                continue
            positions[partition] = offset + 1
            if key is None:
                continue
            name = key.decode()
            if _crc32(key) % parts != partition:
                continue
            get(name)
            if value is None:
                continue
            try:
                table[name] = _decode_raw(value)
            except Exception:  # a hostile value
                continue

    def per_record(fn: Any) -> float:
        times = []
        for _ in range(runs):
            c0 = time.thread_time()
            fn()
            times.append(time.thread_time() - c0)
        return statistics.median(times) / records

    decode_s, keys_s = per_record(decode_all), per_record(keys_all)
    mandatory_s = per_record(mandatory_all)
    floor = 1 / (decode_s + keys_s)
    progress(
        f"replay floor: decoding values {decode_s * 1e9:.0f} ns + keys {keys_s * 1e9:.0f} ns per record "
        f"-> at most {floor / 1000:.0f}k records/s before any resolution; the loop of a replica's mandatory "
        f"steps alone {mandatory_s * 1e9:.0f} ns -> at most {1 / mandatory_s / 1000:.0f}k records/s"
    )
    return {
        "value_decode_ns_per_record": round(decode_s * 1e9),
        "key_decode_ns_per_record": round(keys_s * 1e9),
        "replay_ceiling_records_per_s": round(floor),
        "mandatory_loop_ns_per_record": round(mandatory_s * 1e9),
        "replay_mandatory_ceiling_records_per_s": round(1 / mandatory_s),
        "what": "CPU per record of decoding each value (msgspec) and each key with its partition check, "
        "alone; 1 / their sum bounds replay from above in this interpreter. The mandatory loop adds what "
        "every replica must do around them for every record -- offset de-duplication, the home-partition "
        "check, one table read and one write -- in a plain interpreted loop with no resolution at all: "
        "no replay in this interpreter can run faster",
    }


def traced_table_bytes(batches: list[Sequence[Message]], partitions: int) -> tuple[TableView, int]:
    """Replay into a fresh table under tracemalloc; bytes still allocated afterwards (the table)."""
    table, after_replay, _live, _peak = traced_table_bytes_live(batches, partitions)
    return table, after_replay


def traced_table_bytes_live(
    batches: list[Sequence[Message]], partitions: int
) -> tuple[TableView, int, int, int]:
    """:func:`traced_table_bytes`, then the table made live (broker ids shared, as a node does once caught
    up): (table, bytes after the replay, bytes once live, the peak while it went live)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        table = TableView(partitions)
        for b in batches:
            table.apply_all(b)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        table.set_live()
        gc.collect()
        live, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return table, after - before, live - before, peak - before


def size_breakdown(table: TableView) -> dict[str, Any]:
    """Where a table's bytes go, by ``sys.getsizeof`` (shallow sizes, shared objects counted once)."""
    raw: dict[str, Record | int] = table._table
    seen: set[int] = set()
    keys = records = packed = strings = 0
    for k, r in raw.items():
        keys += sys.getsizeof(k)
        if type(r) is int:
            packed += sys.getsizeof(r)
            continue
        records += sys.getsizeof(r)
        for s in (r.dst, r.src, r.writer):  # type: ignore[union-attr]  # not an int: a record
            if s is not None and id(s) not in seen:
                seen.add(id(s))
                strings += sys.getsizeof(s)
    n = max(1, len(raw))
    return {
        "dict_per_bundle": round(sys.getsizeof(raw) / n, 1),
        "key_str_per_bundle": round(keys / n, 1),
        "packed_int_per_bundle": round(packed / n, 1),
        "record_per_bundle": round(records / n, 1),
        "record_strings_per_bundle": round(strings / n, 1),
        "packed_bundles": table.packed_count(),
        "distinct_record_string_objects": len(seen),
        "note": "shallow sys.getsizeof; settled bundles are one packed int each (channel.packed), the rest "
        "records whose dst/src/writer strings are counted once per object",
    }


# ---------------------------------------------------------------------------------------------- Kafka


def _child_env() -> tuple[Path, dict[str, str]]:
    """The repository root and an environment whose PYTHONPATH holds it, for ``python -m`` children."""
    root = Path(channel.__file__).resolve().parent.parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    return root, env


class BenchKafka:
    """A real Apache Kafka (one KRaft broker, :mod:`trimtab.devkit.kafka_server`) in a scratch directory,
    with the bench's channel and snapshot topics made as trimtab makes them (cluster/topics.py): the
    channel with :data:`PARTITIONS` partitions and delete policy, the snapshot topic with one partition,
    compacted. The benchmarking process connects to it like a node at start-up."""

    def __init__(self, topic: str, snapshot_topic: str) -> None:
        import tempfile

        from trimtab.channel.topics import TopicSpec
        from trimtab.devkit.kafka_server import KafkaCluster

        self._dir = tempfile.TemporaryDirectory(prefix="trimtab-bench-kafka-")
        # 1 M records of ~50 B in lz4 batches: well within one broker's defaults; a 1 GiB heap keeps the
        # broker's GC out of the figures.
        self.cluster = KafkaCluster(Path(self._dir.name), brokers=1, heap_mb=1024).start()
        for spec in (
            TopicSpec(topic, PARTITIONS, compacted=False),
            TopicSpec(snapshot_topic, 1, compacted=True),
        ):
            self.cluster.create_topics([spec.name], partitions=spec.partitions, config=spec.topic_config())
        self.bootstrap_servers = self.cluster.bootstrap_servers

    def close(self) -> None:
        try:
            self.cluster.close()
        finally:
            self._dir.cleanup()


# The log goes out as trimtab's own producer writes (lz4, idempotent), in large batches so that producing
# it is not the slow part of the run.
BULK_PRODUCER: dict[str, Any] = {
    "compression.type": "lz4",
    "linger.ms": 50,
    "batch.num.messages": 1_000_000,
    "batch.size": 1 << 20,
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 1 << 21,
    "enable.idempotence": True,
}


def bulk_produce(bootstrap: str, topic: str, messages: Sequence[Message]) -> float:
    """Write ``messages`` to their own partitions with a bulk, compressing producer; returns seconds."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "trimtab-bench-producer",
            "log_level": 3,
            **BULK_PRODUCER,
        }
    )
    failures: list[str] = []
    delivered = 0

    def done(err: Any, _msg: Any) -> None:
        nonlocal delivered
        if err is not None:
            failures.append(str(err))
        else:
            delivered += 1

    t0 = time.perf_counter()
    produce = producer.produce
    for i, m in enumerate(messages):
        while True:
            try:
                produce(topic, m.value, m.key, partition=m.partition, on_delivery=done)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 20_000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    elapsed = time.perf_counter() - t0
    if left or failures or delivered != len(messages):
        raise BenchError(
            f"producing the log failed: {delivered}/{len(messages)} delivered, {left} pending, "
            f"errors {failures[:3]}"
        )
    return elapsed


def check_watermarks(transport: Any, topic: str, log: ChannelLog) -> None:
    for p in range(log.partitions):
        low, high = transport.watermarks(topic, p)
        if (low, high) != (0, log.ends.get(p, 0)):
            raise BenchError(f"{topic}[{p}] has offsets {low}..{high}, the log has 0..{log.ends.get(p, 0)}")


def table_digest(items: Iterator[tuple[str, Record]] | list[tuple[str, Record]]) -> str:
    """SHA-256 over the sorted (bundle, wire record) pairs: compares tables across processes."""
    h = hashlib.sha256()
    for name, rec in sorted(items):
        h.update(name.encode())
        h.update(b"\0")
        h.update(encode(rec) or b"")
        h.update(b"\n")
    return h.hexdigest()


def time_bootstrap_fresh_process(bootstrap: str, topic: str, timeout: float) -> tuple[float, dict[str, Any]]:
    """The same bootstrap in a new interpreter that holds nothing else (no generated log in its heap):
    :mod:`trimtab.devkit.bench.fresh_node`."""
    root, env = _child_env()
    proc = subprocess.run(
        [sys.executable, "-m", "trimtab.devkit.bench.fresh_node", bootstrap, topic, str(timeout)],
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
        timeout=timeout + 60,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        raise BenchError(f"fresh-process bootstrap failed ({proc.returncode}): {proc.stderr[-2000:]}")
    result: dict[str, Any] = orjson.loads(lines[-1])
    if not result["ok"]:
        raise BenchError(f"fresh-process bootstrap not ready within {timeout}s: {result['error']}")
    return float(result["elapsed"]), result


class _Starts(Protocol):
    def start(self) -> None: ...

    def wait_ready(self, timeout: float) -> bool: ...


class ReadyTime(NamedTuple):
    ok: bool  # ready within the timeout
    elapsed: float  # wall seconds from start() to ready
    start_call: float  # wall seconds of start() itself
    cpu: float  # this process's CPU seconds meanwhile


def time_to_ready(node: _Starts, timeout: float) -> ReadyTime:
    """Start ``node`` (a ChannelClient, a bare Follower) and wait until it is ready, or ``timeout``: every
    bootstrap figure, in-process or in a fresh process, is timed this one way."""
    c0 = time.process_time()
    t0 = time.perf_counter()
    node.start()
    t_started = time.perf_counter()
    ok = node.wait_ready(timeout)
    elapsed = time.perf_counter() - t0
    return ReadyTime(ok, elapsed, t_started - t0, time.process_time() - c0)


def time_bootstrap(
    bootstrap: str, topic: str, snapshot_topic: str | None, timeout: float
) -> tuple[Any, float, dict[str, Any]]:
    """A fresh node's ChannelClient from start() to ready; returns (client, seconds, details)."""
    from trimtab.channel.client import ChannelClient
    from trimtab.channel.kafka import KafkaTransport

    transport = KafkaTransport(bootstrap, client_id=f"bench-node-{uuid.uuid4().hex[:6]}")
    client = ChannelClient(transport, topic, snapshot_topic=snapshot_topic)
    ready = time_to_ready(client, timeout)
    client.stop()
    transport.close()
    if not ready.ok:
        raise BenchError(f"bootstrap not ready within {timeout}s (error: {client.error!r})")
    if client.error is not None:
        raise BenchError(f"bootstrap failed: {client.error!r}")
    details = {
        "start_call_s": round(ready.start_call, 4),
        "cpu_s": round(ready.cpu, 3),
        "records_replayed": client.follower.records if client.follower else 0,
        "snapshot_used": client.snapshot is not None,
    }
    return client, ready.elapsed, details


def time_consume_only(bootstrap: str, topic: str, timeout: float) -> tuple[float, int, float]:
    """A bare Follower whose apply does nothing: the cost of getting the messages into Python."""
    from trimtab.channel.kafka import KafkaTransport
    from trimtab.channel.transport import Follower

    transport = KafkaTransport(bootstrap, client_id=f"bench-consume-{uuid.uuid4().hex[:6]}")
    follower = Follower(transport, topic, lambda _msgs: None, name="bench-consume-only")
    ready = time_to_ready(follower, timeout)
    follower.stop()
    transport.close()
    if not ready.ok or follower.error is not None:
        raise BenchError(f"consume-only follower not ready within {timeout}s (error: {follower.error!r})")
    return ready.elapsed, follower.records, ready.cpu


def write_snapshot(bootstrap: str, snapshot_topic: str, topic: str, log: ChannelLog) -> dict[str, Any]:
    from trimtab.channel.kafka import KafkaTransport
    from trimtab.channel.snapshot import SnapshotWriter

    transport = KafkaTransport(bootstrap, client_id="bench-snapshotter")
    try:
        t0 = time.perf_counter()
        manifest = SnapshotWriter(transport, snapshot_topic, topic, writer="bench").write(
            log.final, dict(log.ends), log.partitions, term=1
        )
        elapsed = time.perf_counter() - t0
    finally:
        transport.close()
    return {"write_s": round(elapsed, 3), "chunks": manifest.chunks, "bundles": manifest.bundles}


def kafka_part(
    log: ChannelLog, kafka_runs: int, progress: Progress, timeout: float = 300.0
) -> dict[str, Any]:
    """Every Kafka measurement against one real Kafka broker, in this order: produce the log, bootstrap in
    this process, in a fresh process, consume only, then bootstrap from a snapshot written for it."""
    suffix = uuid.uuid4().hex[:8]
    topic, snapshot_topic = f"bench-channel-{suffix}", f"bench-channel-snapshot-{suffix}"
    progress("starting Apache Kafka (one KRaft broker)...")
    cluster = BenchKafka(topic, snapshot_topic)
    try:
        kafka = KafkaRuns(
            log, cluster.bootstrap_servers, topic, snapshot_topic, kafka_runs, timeout, progress
        )
        return {
            **kafka.produce(),
            **kafka.bootstraps(),
            **kafka.fresh_process_bootstraps(),
            **kafka.consume_only(),
            **kafka.snapshot_bootstraps(),
        }
    finally:
        cluster.close()


@dataclass
class KafkaRuns:
    """The Kafka measurements of :func:`kafka_part`, one method each, all on one topic of one Kafka broker.

    Each method returns its figures under the keys :func:`run` reads, and checks what it measured against
    the generated log first: a bootstrap that is fast because it read less than the log is not a figure.
    """

    log: ChannelLog
    bootstrap: str
    topic: str
    snapshot_topic: str
    runs: int
    timeout: float
    progress: Progress

    def produce(self) -> dict[str, Any]:
        """Write the log to the topic and check that Kafka holds all of it, from offset 0."""
        from trimtab.channel.kafka import KafkaTransport

        log, topic = self.log, self.topic
        meta = KafkaTransport(self.bootstrap, client_id="bench-meta")
        try:
            parts = meta.partitions(topic)
            if parts != log.partitions:
                raise BenchError(
                    f"{topic} has {parts} partitions, the log was generated for {log.partitions}"
                )
            self.progress(
                f"producing {len(log.messages)} records to {topic} (lz4 bulk producer, explicit partitions)..."
            )
            produce_s = round(bulk_produce(self.bootstrap, topic, log.messages), 3)
            check_watermarks(meta, topic, log)
        finally:
            meta.close()
        self.progress(f"produced in {produce_s} s")
        return {"kafka_produce_s": produce_s}

    def bootstraps(self) -> dict[str, Any]:
        """A fresh ChannelClient in this process, start() to ready; table, stats and positions checked."""
        log, runs = self.log, self.runs
        times: list[float] = []
        cpus: list[float] = []
        details: list[dict[str, Any]] = []
        for i in range(runs):
            gc.collect()
            client, elapsed, d = time_bootstrap(self.bootstrap, self.topic, None, self.timeout)
            check_table(client.table, log, f"kafka bootstrap run {i + 1}")
            if d["records_replayed"] != len(log.messages):
                raise BenchError(
                    f"bootstrap read {d['records_replayed']} records, the log has {len(log.messages)}"
                )
            times.append(elapsed)
            cpus.append(d["cpu_s"])
            details.append(d)
            self.progress(
                f"bootstrap run {i + 1}/{runs}: {elapsed:.2f} s, {d['cpu_s']:.2f} CPU-s (table verified)"
            )
            del client
        return {
            "bootstrap_1m_s": round(statistics.median(times), 3),
            "bootstrap_1m_s_runs": [round(x, 3) for x in times],
            "bootstrap_details": details[0],
            "bootstrap_1m_cpu_s": round(statistics.median(cpus), 3),
            "bootstrap_1m_cpu_s_runs": cpus,
        }

    def fresh_process_bootstraps(self) -> dict[str, Any]:
        """The same bootstrap in a new interpreter; its table is compared by digest, its stats by value."""
        log, runs = self.log, self.runs
        want_digest = table_digest(list(log.final.items()))
        want_stats = {k: v for k, v in log.expected_stats().items() if not k.endswith("_reason")}
        fresh: list[float] = []
        fresh_cpu: list[float] = []
        for i in range(runs):
            elapsed, r = time_bootstrap_fresh_process(self.bootstrap, self.topic, self.timeout)
            if r["digest"] != want_digest or r["records"] != len(log.messages):
                raise BenchError(f"fresh-process bootstrap table differs from the generator's: {r}")
            if r["stats"] != want_stats:
                raise BenchError(f"fresh-process bootstrap stats {r['stats']} != {log.expected_stats()}")
            fresh.append(elapsed)
            fresh_cpu.append(round(r["cpu"], 3))
            self.progress(
                f"fresh-process bootstrap run {i + 1}/{runs}: {elapsed:.2f} s, {r['cpu']:.2f} CPU-s "
                "(table verified)"
            )
        return {
            "bootstrap_1m_s_fresh_process": round(statistics.median(fresh), 3),
            "bootstrap_1m_s_fresh_process_runs": [round(x, 3) for x in fresh],
            "bootstrap_1m_cpu_s_fresh_process_runs": fresh_cpu,
        }

    def consume_only(self) -> dict[str, Any]:
        """A follower that applies nothing: what getting the messages into Python costs on its own."""
        runs = self.runs
        consume: list[float] = []
        consume_cpu: list[float] = []
        for i in range(runs):
            gc.collect()
            elapsed, n, cpu = time_consume_only(self.bootstrap, self.topic, self.timeout)
            if n != len(self.log.messages):
                raise BenchError(f"consume-only read {n} records, the log has {len(self.log.messages)}")
            consume.append(elapsed)
            consume_cpu.append(round(cpu, 3))
            self.progress(f"consume-only run {i + 1}/{runs}: {elapsed:.2f} s, {cpu:.2f} CPU-s")
        return {
            "kafka_consume_only_1m_s": round(statistics.median(consume), 3),
            "kafka_consume_only_1m_s_runs": [round(x, 3) for x in consume],
            "kafka_consume_only_1m_cpu_s_runs": consume_cpu,
        }

    def snapshot_bootstraps(self) -> dict[str, Any]:
        """Write a snapshot of the final table, then bootstrap from it: it must be used, with an empty
        tail, and give the same table and positions."""
        log, runs = self.log, self.runs
        self.progress(f"writing a snapshot of {len(log.final)} bundles to {self.snapshot_topic}...")
        snapshot = write_snapshot(self.bootstrap, self.snapshot_topic, self.topic, log)
        ends = {p: o for p, o in log.ends.items() if o}
        snap_runs: list[float] = []
        for i in range(runs):
            gc.collect()
            client, elapsed, d = time_bootstrap(self.bootstrap, self.topic, self.snapshot_topic, self.timeout)
            if not d["snapshot_used"]:
                raise BenchError("the snapshot bootstrap did not use the snapshot (it replayed the channel)")
            if d["records_replayed"] != 0:
                raise BenchError(
                    f"the snapshot bootstrap replayed {d['records_replayed']} tail records, want 0"
                )
            check_table(client.table, log, f"snapshot bootstrap run {i + 1}", stats=False)
            if {p: o for p, o in client.table.positions.items() if o} != ends:
                raise BenchError(f"snapshot bootstrap positions {client.table.positions} != {log.ends}")
            snap_runs.append(elapsed)
            self.progress(f"snapshot bootstrap run {i + 1}/{runs}: {elapsed:.2f} s (table verified)")
            del client
        return {
            "snapshot": snapshot,
            "bootstrap_snapshot_1m_s": round(statistics.median(snap_runs), 3),
            "bootstrap_snapshot_1m_s_runs": [round(x, 3) for x in snap_runs],
        }


# ---------------------------------------------------------------------------------------------- the run


@contextlib.contextmanager
def _frozen_gc(enabled: bool) -> Iterator[None]:
    if enabled:
        gc.collect()
        gc.freeze()
    try:
        yield
    finally:
        if enabled:
            gc.unfreeze()


@dataclass
class Figures:
    """Everything :func:`run` measured, each part already checked, for :func:`report`."""

    log: ChannelLog
    generate_s: float
    rates: list[float]  # replay, records per wall-clock second, one per run
    cpu_rates: list[float]  # replay, records per CPU second of this thread
    replay_stats: dict[str, Any]  # TableView.stats.detail() of the last replay
    bytes_per_bundle: float
    breakdown: dict[str, Any]
    big: dict[str, Any] | None  # the owned-only table of memory_bundles bundles, if measured
    instr: dict[str, Any] | None  # instructions per record under callgrind, if counted
    kafka: dict[str, Any]  # kafka_part's figures; empty with skip_kafka


def run(
    *,
    records: int = 1_000_000,
    bundles: int = 100_000,
    runs: int = 5,
    seed: int = 1,
    skip_kafka: bool = False,
    kafka_runs: int = 3,
    memory_bundles: int = 1_000_000,
    gc_freeze: bool = True,
    instructions: int = 0,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the whole benchmark and return its JSON-ready result. Raises BenchError on a wrong result."""
    if runs < 1 or kafka_runs < 1:
        raise ValueError("runs and kafka_runs must be at least 1")
    if records < 2 * bundles:
        raise ValueError(f"{records} records cannot assign {bundles} bundles (need at least 2 per bundle)")
    progress = progress or progress_printer("channel")
    load_start = loadavg()
    log, gen_s = generate_checked(records, bundles, seed, progress)
    batches = batches_of(log.messages)
    with _frozen_gc(gc_freeze):
        rates, cpu_rates, replay_stats = measure_replay(batches, log, runs, progress)
        floors = measure_floors(batches, runs, progress)
        bytes_per_bundle, breakdown = measure_memory(batches, log, progress)
        big = measure_memory_owned(memory_bundles, progress) if memory_bundles else None
        instr = count_instructions(log, instructions, progress) if instructions else None
        kafka = {} if skip_kafka else kafka_part(log, kafka_runs, progress)
    figures = Figures(
        log, gen_s, rates, cpu_rates, replay_stats, bytes_per_bundle, breakdown, big, instr, kafka
    )
    out = report(
        figures,
        bundles=bundles,
        seed=seed,
        runs=runs,
        kafka_runs=kafka_runs,
        gc_freeze=gc_freeze,
        load_start=load_start,
    )
    out["replay_ceiling_records_per_s"] = floors["replay_ceiling_records_per_s"]
    out["replay_mandatory_ceiling_records_per_s"] = floors["replay_mandatory_ceiling_records_per_s"]
    out["replay_floor"] = floors
    consume_cpu = kafka.get("kafka_consume_only_1m_cpu_s_runs")
    if consume_cpu:
        # One process holds the GIL for both: the client's messages and the replay's mandatory steps.
        floor_s = statistics.median(consume_cpu) + floors["mandatory_loop_ns_per_record"] * records / 1e9
        out["bootstrap_1m_floor_cpu_s"] = round(floor_s, 2)
        out["bootstrap_1m_floor_what"] = (
            "CPU seconds no single-process bootstrap of this log can go below: consuming it with "
            "confluent-kafka (kafka_consume_only_1m_cpu_s_runs, median) plus the replay's mandatory loop "
            "(replay_floor.mandatory_loop_ns_per_record) -- both under one GIL"
        )
    return out


def generate_checked(records: int, bundles: int, seed: int, progress: Progress) -> tuple[ChannelLog, float]:
    """The log every part measures, and the seconds generating it took. A log that leaves a bundle
    unassigned could not be checked against a table of ``bundles`` bundles: refused."""
    progress(f"generating log: {records} records over {bundles} bundles (seed {seed})...")
    t0 = time.perf_counter()
    log = generate_log(records, bundles, seed=seed)
    gen_s = time.perf_counter() - t0
    if log.ops["never_assigned"]:
        raise BenchError(f"generator left {log.ops['never_assigned']} bundles unassigned")
    progress(
        f"generated in {gen_s:.1f} s: accepted {log.accepted}, rejected {sum(log.rejected.values())}, "
        f"skipped {sum(log.skipped.values())}"
    )
    return log, gen_s


def measure_replay(
    batches: list[Sequence[Message]], log: ChannelLog, runs: int, progress: Progress
) -> tuple[list[float], list[float], dict[str, Any]]:
    """``runs`` replays into fresh tables, each checked: (wall-clock rates, CPU rates, the last run's
    stats). Each table is dropped before the next replay, so only one is alive at a time."""
    rates: list[float] = []
    cpu_rates: list[float] = []
    table: TableView | None = None
    for i in range(runs):
        table = None
        gc.collect()
        table, elapsed, cpu = replay_once(batches, log.partitions)
        check_table(table, log, f"replay run {i + 1}")
        rates.append(len(log.messages) / elapsed)
        cpu_rates.append(len(log.messages) / cpu)
        progress(
            f"replay run {i + 1}/{runs}: {rates[-1] / 1000:.0f}k rec/s "
            f"({cpu_rates[-1] / 1000:.0f}k per CPU-second, verified)"
        )
    assert table is not None
    return rates, cpu_rates, table.stats.detail()


def measure_memory(
    batches: list[Sequence[Message]], log: ChannelLog, progress: Progress
) -> tuple[float, dict[str, Any]]:
    """Bytes per bundle of the replayed (and checked) table under tracemalloc, and where they go."""
    progress("measuring memory per bundle (tracemalloc replay)...")
    table, traced, live, peak = traced_table_bytes_live(batches, log.partitions)
    check_table(table, log, "tracemalloc replay")
    bytes_per_bundle = traced / len(table)
    breakdown = size_breakdown(table)
    breakdown["bytes_per_bundle_live"] = round(live / len(table), 1)
    breakdown["going_live_peak_bytes_per_bundle"] = round(peak / len(table), 1)
    progress(
        f"{bytes_per_bundle:.0f} bytes per bundle over {len(log.final)} bundles after the replay, "
        f"{live / len(table):.0f} once live (peak {peak / len(table):.0f} while going live)"
    )
    return bytes_per_bundle, breakdown


def measure_memory_owned(memory_bundles: int, progress: Progress) -> dict[str, Any]:
    """Bytes per bundle of a table of ``memory_bundles`` owned bundles (a table at scale, not the log's)."""
    progress(f"measuring memory for {memory_bundles} owned bundles ({2 * memory_bundles} records)...")
    big_log = owned_pairs_log(memory_bundles)
    big_batches = batches_of(big_log.messages)
    big_table, big_traced, big_live, big_peak = traced_table_bytes_live(big_batches, big_log.partitions)
    check_table(big_table, big_log, f"{memory_bundles}-bundle replay")
    big = {
        "bytes_per_bundle": round(big_traced / len(big_table), 1),
        "bytes_per_bundle_live": round(big_live / len(big_table), 1),
        "going_live_peak_bytes_per_bundle": round(big_peak / len(big_table), 1),
        "bundles": len(big_table),
        "records": len(big_log.messages),
        "breakdown": size_breakdown(big_table),
    }
    del big_table, big_batches, big_log
    gc.collect()  # a million records and their table are gone before the next part measures anything
    progress(f"{big['bytes_per_bundle']:.0f} bytes per bundle over {big['bundles']} bundles")
    return big


def count_instructions(log: ChannelLog, instructions: int, progress: Progress) -> dict[str, Any]:
    """Instructions per record replaying the first ``instructions`` records, under callgrind."""
    from trimtab.devkit.bench import instructions as callgrind

    progress(f"counting instructions per record under callgrind ({instructions} records)...")
    instr = callgrind.measure(log.messages[:instructions])
    progress(f"{instr['replay_instructions_per_record']:.0f} instructions per record")
    return instr


# ---------------------------------------------------------------------------------------------- the report


def report(
    fig: Figures,
    *,
    bundles: int,
    seed: int,
    runs: int,
    kafka_runs: int,
    gc_freeze: bool,
    load_start: list[float] | None,
) -> dict[str, Any]:
    """The JSON-ready result: the headline figures first, then how each was measured."""
    out: dict[str, Any] = {"bench": "channel", **_headline(fig)}
    if fig.instr:
        out["instructions"] = fig.instr
    kafka = fig.kafka
    out["meets_targets"] = {
        "replay_records_per_s": statistics.median(fig.rates) >= REPLAY_TARGET_RECORDS_PER_S,
        "bootstrap_1m_s": None if not kafka else kafka["bootstrap_1m_s"] < BOOTSTRAP_TARGET_S,
        "bytes_per_bundle": fig.bytes_per_bundle <= BYTES_PER_BUNDLE_TARGET,
    }
    out["log"] = _log_section(fig, bundles, seed)
    out["replay"] = _replay_section(fig, runs, gc_freeze)
    out["memory"] = {
        "method": (
            "tracemalloc started just before replaying into a fresh TableView (messages generated before "
            "and kept alive, so not counted); traced bytes still allocated after replay / bundles in table"
        ),
        "bundles": len(fig.log.final),
        "breakdown": fig.breakdown,
        "one_million_bundles": fig.big,
    }
    if kafka:
        out["kafka"] = _kafka_section(kafka, kafka_runs)
    out["checks"] = {
        "replay_matches_generator": True,
        "tracemalloc_replay_matches_generator": True,
        "memory_1m_bundles_table_complete": fig.big is not None or None,
        "kafka_bootstrap_matches_generator": True if kafka else None,
        "kafka_fresh_process_bootstrap_matches_generator": True if kafka else None,
        "kafka_snapshot_bootstrap_matches_generator": True if kafka else None,
        "note": "any failed check aborts the bench with a non-zero exit before this JSON is printed",
    }
    out["env"] = environment(
        load_start,
        "msgspec",
        "orjson",
        "confluent-kafka",
        note="single-threaded replay; other processes on the machine share its cores (see loadavg)",
    )
    return out


def _headline(fig: Figures) -> dict[str, Any]:
    median_rate = statistics.median(fig.rates)
    kafka, big, instr = fig.kafka, fig.big, fig.instr
    return {
        "replay_records_per_s": round(median_rate),
        "replay_records_per_s_target": REPLAY_TARGET_RECORDS_PER_S,
        "replay_records_per_s_runs": [round(r) for r in fig.rates],
        "replay_us_per_record": round(1e6 / median_rate, 3),
        "replay_records_per_cpu_s": round(statistics.median(fig.cpu_rates)),
        "replay_records_per_cpu_s_runs": [round(r) for r in fig.cpu_rates],
        "bootstrap_1m_s": kafka.get("bootstrap_1m_s"),
        "bootstrap_1m_s_target": BOOTSTRAP_TARGET_S,
        "bootstrap_1m_s_runs": kafka.get("bootstrap_1m_s_runs"),
        "bootstrap_1m_cpu_s": kafka.get("bootstrap_1m_cpu_s"),
        "bootstrap_1m_cpu_s_runs": kafka.get("bootstrap_1m_cpu_s_runs"),
        "bootstrap_1m_s_fresh_process": kafka.get("bootstrap_1m_s_fresh_process"),
        "bootstrap_1m_s_fresh_process_runs": kafka.get("bootstrap_1m_s_fresh_process_runs"),
        "bootstrap_1m_cpu_s_fresh_process_runs": kafka.get("bootstrap_1m_cpu_s_fresh_process_runs"),
        "kafka_consume_only_1m_s": kafka.get("kafka_consume_only_1m_s"),
        "kafka_consume_only_1m_s_runs": kafka.get("kafka_consume_only_1m_s_runs"),
        "kafka_consume_only_1m_cpu_s_runs": kafka.get("kafka_consume_only_1m_cpu_s_runs"),
        "bootstrap_snapshot_1m_s": kafka.get("bootstrap_snapshot_1m_s"),
        "bootstrap_snapshot_1m_s_runs": kafka.get("bootstrap_snapshot_1m_s_runs"),
        "bytes_per_bundle": round(fig.bytes_per_bundle, 1),
        "bytes_per_bundle_target": BYTES_PER_BUNDLE_TARGET,
        "bytes_per_bundle_live": fig.breakdown.get("bytes_per_bundle_live"),
        "bytes_per_bundle_1m_bundles": big["bytes_per_bundle"] if big else None,
        "bytes_per_bundle_1m_bundles_live": big["bytes_per_bundle_live"] if big else None,
        "replay_instructions_per_record": instr["replay_instructions_per_record"] if instr else None,
    }


def _log_section(fig: Figures, bundles: int, seed: int) -> dict[str, Any]:
    log = fig.log
    return {
        "records": len(log.messages),
        "bundles": bundles,
        "bundles_in_table": len(log.final),
        "namespaces": log.namespaces,
        "brokers": log.brokers,
        "partitions": log.partitions,
        "seed": seed,
        "encoded_bytes": log.encoded_bytes(),
        "generate_s": round(fig.generate_s, 2),
        "intended": log.expected_stats(),
        "operations": dict(sorted(log.ops.items())),
        "final_states": dict(sorted(Counter(r.state.value for r in log.final.values()).items())),
        "how": (
            "seeded generator (trimtab.devkit.bench.channel.generate_log): every bundle assigned (Assigning v1 -> Owned v2) "
            "within the first half of the log, interleaved with transfers (Releasing{src,dst} -> Assigning "
            "-> Owned) and unloads (Releasing{src} -> Free, re-assigned later), many operations in flight; "
            "~5% racing second-writer records with an already-used version (must be rejected), ~0.1% "
            "garbage (truncated JSON, schema 2; must be skipped); partition = crc32(key) % 4 with "
            "per-partition offsets, as the consistent partitioner assigns them"
        ),
    }


def _replay_section(fig: Figures, runs: int, gc_freeze: bool) -> dict[str, Any]:
    return {
        **fig.replay_stats,
        "batch": BATCH,
        "runs": runs,
        "headline": "median of runs",
        "timer": "time.perf_counter around apply_all over pre-sliced batches, fresh TableView per run",
        "cpu_timer": (
            "time.thread_time over the same span (replay_records_per_cpu_s): what the rate would be with a "
            "core to itself; the wall-clock figure is the headline"
        ),
        "table_partitions": fig.log.partitions,
        "gc_frozen": gc_freeze,
        "gc_note": "gc.freeze() after generating the log (a node's log is not garbage); gc stays enabled",
    }


def _kafka_section(kafka: dict[str, Any], kafka_runs: int) -> dict[str, Any]:
    consume_cpu = statistics.median(kafka["kafka_consume_only_1m_cpu_s_runs"])
    return {
        "cluster": "Apache Kafka 4.4.0 (one KRaft broker, 1 GiB heap) in JVM processes of its own, over loopback",
        "produce_s": kafka["kafka_produce_s"],
        "producer": {**BULK_PRODUCER, "partition": "explicit, crc32(key) % 4"},
        "producer_note": "lz4 like trimtab's own producer; watermarks are checked after produce",
        "runs": kafka_runs,
        "bootstrap": (
            "fresh KafkaTransport + ChannelClient(snapshot_topic=None), perf_counter from start() until "
            "wait_ready() returns; the table and stats verified against the generator"
        ),
        "bootstrap_details_run1": kafka["bootstrap_details"],
        "split_estimate": {
            "wall_s": {
                "consume_into_python": kafka["kafka_consume_only_1m_s"],
                "replay_and_the_rest": round(kafka["bootstrap_1m_s"] - kafka["kafka_consume_only_1m_s"], 3),
            },
            "cpu_s": {
                "consume_into_python": consume_cpu,
                "replay_and_the_rest": round(kafka["bootstrap_1m_cpu_s"] - consume_cpu, 3),
            },
            "note": (
                "medians of the consume-only follower vs the full bootstrap (the follower thread does "
                "both in turn; librdkafka fetches and decompresses on its own thread). The CPU split is "
                "the steadier one when other processes compete for the cores"
            ),
        },
        "bootstrap_fresh_process": (
            "the same bootstrap in a new interpreter holding nothing else (no generated log in its "
            "heap, gc not frozen); table verified by SHA-256 digest, stats compared"
        ),
        "consume_only": "fresh KafkaTransport + Follower with a no-op apply, start() to ready",
        "cpu_s": (
            "time.process_time over the same span: every thread of the measuring process (follower "
            "and librdkafka threads; Kafka runs in its own processes); wall-clock is the headline"
        ),
        "snapshot": {
            **kafka["snapshot"],
            "bootstrap": "fresh ChannelClient with the snapshot topic: reads the snapshot, empty tail",
        },
    }
