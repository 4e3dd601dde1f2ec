"""Channel snapshot rules that the round-trip and property tests leave loose (channel/snapshot.py;
docs/protocol.md section 5, docs/testing.md).

A snapshot is what a node bootstraps from, so every rule here is about one of three things: which
snapshot a reader takes (the newest *complete* one of its channel and partition count, by (term,
position in the topic)), what a hostile or damaged value does to that choice (it is skipped and logged,
never fatal), and the order in which the writer makes a snapshot durable and collects what is older.
The writer and the topic readers run over the in-memory transport, with a fixed clock and snapshot id
where the values they produce depend on them.
"""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

import msgspec
import pytest
import structlog

import trimtab.channel.snapshot as snapshot_module
from trimtab.channel.memory import MemoryLog, MemoryReader, MemoryTransport
from trimtab.channel.records import Record, State, encode, make
from trimtab.channel.snapshot import (
    MAX_SNAPSHOT_VALUE_BYTES,
    Chunk,
    Manifest,
    SnapshotWriter,
    bootstrap,
    check_snapshot_topic,
    choose,
    chunk_key,
    decode_chunk,
    garbage,
    manifest_key,
    new_snapshot_id,
    read_all,
    read_snapshot_topic,
    snapshot_messages,
    snapshot_order,
)
from trimtab.channel.table import partition_for
from trimtab.channel.transport import Message
from trimtab.channel.values import Refused
from trimtab.errors import ConfigError, SnapshotTopicError, TransportError

CHANNEL = "trimtab-channel"
SNAP = "trimtab-snapshots"
FIXED_UUID = uuid.UUID("0123456789abcdef0123456789abcdef")  # hex[:8] is "01234567"

Pair = tuple[bytes | None, bytes | None]


def name(i: int) -> str:
    return f"t/ns/0x{i:08x}_0x{i + 1:08x}"


def rec(i: int = 0, writer: str = "w") -> Record:
    return make(State.OWNED, version=1 + i, ts=0, writer=writer, dst=f"b{i}:1")


def states(n: int, first: int = 0) -> dict[str, Record]:
    return {name(i): rec(i) for i in range(first, first + n)}


def snap(
    sid: str,
    table: dict[str, Record],
    *,
    channel: str = CHANNEL,
    partitions: int = 2,
    term: int = 1,
    positions: dict[int, int] | None = None,
    chunk_bundles: int = 2,
) -> list[Pair]:
    return list(
        snapshot_messages(
            sid,
            table,
            positions or {},
            channel=channel,
            partitions=partitions,
            writer="leader",
            term=term,
            chunk_bundles=chunk_bundles,
        )
    )


def manifest_value(**fields: Any) -> bytes:
    base: dict[str, Any] = {
        "schema": 1,
        "id": "1-1-a",
        "chunks": 1,
        "bundles": 1,
        "channel": CHANNEL,
        "partitions": 2,
        "positions": {0: 0, 1: 0},
        "ts": 0,
        "writer": "leader",
        "term": 1,
    }
    base.update(fields)
    return msgspec.json.encode(Manifest(**base))


def chunk_value(sid: str, seq: int, table: dict[str, Record], schema: int = 1) -> bytes:
    return msgspec.json.encode(Chunk(schema, sid, seq, table))


def chosen_id(messages: Iterable[Pair], **kw: Any) -> str | None:
    found = choose(messages, **kw)
    return None if found is None else found.manifest.id


class Clock:
    """Stands in for the module's ``time``: ``time()`` reads ``now``, ``monotonic()`` the ticks in turn
    (the last one for ever)."""

    def __init__(self, now: float = 1000.0, ticks: Iterable[float] = (0.0,)) -> None:
        self.now = now
        self._ticks = list(ticks)

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self._ticks.pop(0) if len(self._ticks) > 1 else self._ticks[0]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(snapshot_module, "time", c)
    monkeypatch.setattr(uuid, "uuid4", lambda: FIXED_UUID)
    return c


# ------------------------------------------------------------------------------------------- decoding


def test_a_chunk_of_another_schema_is_refused_as_invalid() -> None:
    """Rule: a chunk whose schema is not 1 is refused as ``invalid``, and the detail names its schema."""
    got = decode_chunk(chunk_value("1-1-a", 0, states(1), schema=2))
    assert isinstance(got, Refused)
    assert (got.reason, got.detail) == ("invalid", "chunk schema 2")


def test_a_chunk_naming_something_that_is_not_a_bundle_is_refused_with_the_name_cut_at_100() -> None:
    """Rule: a chunk naming a key that is not a bundle name is refused as ``invalid``; the detail quotes
    the first 100 characters of that name."""
    bad = "x" * 150
    got = decode_chunk(chunk_value("1-1-a", 0, {name(0): rec(0), bad: rec(1)}))
    assert isinstance(got, Refused)
    assert (got.reason, got.detail) == ("invalid", f"chunk names {'x' * 100!r}, not a bundle")


# ------------------------------------------------------------------------------------------ snapshot ids


@pytest.mark.parametrize(
    ("snapshot_id", "order"),
    [
        ("3-5-abc", (3, 5)),
        ("1-2", None),
        ("1-2-3-4", None),
        ("ab-1-x", None),
        ("1-ab-x", None),
        ("\u0661-2-x", None),  # ARABIC-INDIC DIGIT ONE: a digit, not ASCII
        ("1-\u0662-x", None),
        (f"{'9' * 19}-1-x", (int("9" * 19), 1)),
        (f"{'9' * 20}-1-x", None),
        (f"1-{'9' * 20}-x", None),
    ],
)
def test_only_a_three_part_id_with_ascii_numbers_of_at_most_19_digits_orders(
    snapshot_id: str, order: tuple[int, int] | None
) -> None:
    """Rule: a snapshot id orders as (term, sequence) only if it has exactly three '-'-separated parts
    and the first two are ASCII digits, at most 19 of them (an int64); any other id orders as None."""
    assert snapshot_order(snapshot_id) == order


def test_a_new_snapshot_id_is_term_sequence_and_eight_hex_digits(clock: Clock) -> None:
    """Rule: a new snapshot id is ``<term>-<sequence>-<first 8 hex digits of a random UUID>``."""
    assert new_snapshot_id(4, 17) == "4-17-01234567"


# ------------------------------------------------------------------------------------ writing messages


def test_a_snapshots_manifest_defaults_to_term_0_and_time_0_and_fills_missing_positions_with_0() -> None:
    """Rule: without a term and a time the manifest is of term 0 (its key too) at ts 0, and every
    partition of the channel the positions do not name starts at 0."""
    msgs = snapshot_messages("0-1-a", states(1), {1: 9}, channel=CHANNEL, partitions=3, writer="me")
    key, value = msgs[-1]
    assert key == b"manifest/trimtab-channel/000000000000"
    assert msgspec.json.decode(value, type=Manifest) == Manifest(
        schema=1,
        id="0-1-a",
        chunks=1,
        bundles=1,
        channel=CHANNEL,
        partitions=3,
        positions={0: 0, 1: 9, 2: 0},
        ts=0,
        writer="me",
        term=0,
    )


def test_a_snapshots_manifest_carries_its_term_in_key_and_value() -> None:
    """Rule: the manifest of a snapshot of term t is under ``manifest/<channel>/<t, 12 digits>`` and
    says term t."""
    msgs = snapshot_messages("3-1-a", states(1), {}, channel=CHANNEL, partitions=1, writer="me", term=3, ts=7)
    key, value = msgs[-1]
    manifest = msgspec.json.decode(value, type=Manifest)
    assert key == manifest_key(CHANNEL, 3) == b"manifest/trimtab-channel/000000000003"
    assert (manifest.term, manifest.ts) == (3, 7)


# ------------------------------------------------------------------------------------------ collection


def test_older_chunks_are_collected_and_newer_or_unorderable_ones_never() -> None:
    """Rule: garbage() collects the chunks of every snapshot with a smaller (term, sequence) than the one
    kept -- whatever stands before them in the key list (a manifest, a key that is not UTF-8) -- and
    never the kept snapshot's, a newer one's or one whose id does not order."""
    keep = "2-5-kk"
    keys = [
        manifest_key(CHANNEL, 1),
        b"chunk/\xff-1-x/000000",
        chunk_key("1-9-aa", 0),
        chunk_key("2-4-bb", 1),
        chunk_key(keep, 0),
        chunk_key("2-6-cc", 0),
        chunk_key("3-0-dd", 0),
        chunk_key("v2-snapshot", 0),
    ]
    assert garbage(keys, keep) == sorted([chunk_key("1-9-aa", 0), chunk_key("2-4-bb", 1)])
    assert garbage(keys, "not-an-id", 2, CHANNEL) == [manifest_key(CHANNEL, 1)]


def test_a_chunk_keys_snapshot_id_ends_at_the_first_slash() -> None:
    """Rule: the snapshot id of a chunk key is what lies between ``chunk/`` and the first '/' after it
    (or the end of the key): what follows does not change whether it is collected."""
    nested = b"chunk/1-5-ab/x-y/z-w"
    bare = b"chunk/1-5-ab"
    assert garbage([nested, bare], "2-0-cd") == [bare, nested]


def test_only_the_writers_channels_manifests_of_older_terms_are_collected() -> None:
    """Rule: given the writer's channel and term, garbage() collects that channel's manifests of older
    terms -- not the current or a newer term's, not another channel's, and not a key under the
    channel's prefix that is not a manifest key (another length); given only one of the two, none."""
    keys = [
        manifest_key("a", 3),
        manifest_key("a", 5),
        manifest_key("a", 7),
        manifest_key("a.b", 3),
        manifest_key("ab", 3),
        b"manifest/a/0",
        b"manifest/a/0000000000001",
    ]
    assert garbage(keys, "5-1-x", 5, "a") == [manifest_key("a", 3)]
    assert garbage(keys, "5-1-x", 5) == []
    assert garbage(keys, "5-1-x", channel="a") == []


# -------------------------------------------------------------------------------- choosing a snapshot


def test_a_later_terms_snapshot_wins_wherever_its_manifest_landed() -> None:
    """Rule: manifests are ordered by term first: a snapshot of term 2 whose manifest is earlier in the
    topic wins over a term-1 snapshot written after it."""
    topic = snap("2-1-new", states(1), term=2) + snap("1-9-old", states(2), term=1)
    assert chosen_id(topic, channel=CHANNEL) == "2-1-new"


def test_within_a_term_the_manifest_later_in_the_topic_wins() -> None:
    """Rule: between manifests of one term (here of two channels, so two keys) the one later in the
    topic wins."""
    first = snap("1-1-c1", states(1), channel="c1")
    second = snap("1-2-c2", states(1), channel="c2")
    assert chosen_id(first + second) == "1-2-c2"
    assert chosen_id(second + first) == "1-1-c1"


def test_a_snapshot_of_another_channel_is_passed_over_and_without_a_channel_any_counts() -> None:
    """Rule: given a channel, a newer snapshot of another channel is passed over for an older one of
    this channel; without a channel the newest of any channel is taken."""
    topic = snap("1-1-mine", states(1), channel=CHANNEL) + snap("1-2-theirs", states(1), channel="other")
    assert chosen_id(topic, channel=CHANNEL) == "1-1-mine"
    assert chosen_id(topic) == "1-2-theirs"


def test_a_snapshot_of_another_partition_count_is_passed_over() -> None:
    """Rule: given a partition count, a newer snapshot of a channel with another count is passed over
    for an older one with that count."""
    topic = snap("1-1-two", states(1), partitions=2, channel="c1") + snap(
        "1-2-four", states(1), partitions=4, channel="c2"
    )
    assert chosen_id(topic, partitions=2) == "1-1-two"
    assert chosen_id(topic, partitions=4) == "1-2-four"


def test_a_manifest_naming_a_partition_beyond_its_count_is_passed_over() -> None:
    """Rule: a manifest whose positions name a partition outside ``range(partitions)`` is passed over
    for the next newest."""
    bad: list[Pair] = [
        (chunk_key("1-2-bad", 0), chunk_value("1-2-bad", 0, states(1))),
        (
            manifest_key("other", 1),
            manifest_value(id="1-2-bad", channel="other", partitions=1, positions={0: 1, 1: 2}),
        ),
    ]
    topic = snap("1-1-good", states(1)) + bad
    assert chosen_id(topic) == "1-1-good"


def test_a_manifest_of_another_schema_is_passed_over() -> None:
    """Rule: a manifest whose schema is not 1 is passed over, even complete and of the right channel."""
    newer: list[Pair] = [
        (chunk_key("1-2-v2", 0), chunk_value("1-2-v2", 0, states(1))),
        (manifest_key(CHANNEL, 2), manifest_value(id="1-2-v2", schema=2, term=2)),
    ]
    topic = snap("1-1-v1", states(1)) + newer
    assert chosen_id(topic, channel=CHANNEL) == "1-1-v1"


def test_a_snapshot_with_a_missing_chunk_is_passed_over() -> None:
    """Rule: a manifest whose chunk is missing from the topic is passed over for the next newest; also
    when the chunks present hold exactly as many bundles as it names."""
    older = snap("1-1-old", states(1))
    missing_last = snap("2-1-gap", states(3), term=2)  # chunks 0 (2 bundles) and 1 (1 bundle)
    assert chosen_id(older + missing_last[:1] + missing_last[2:], channel=CHANNEL) == "1-1-old"
    empty: list[Pair] = [(manifest_key(CHANNEL, 3), manifest_value(id="3-1-e", chunks=1, bundles=0, term=3))]
    assert chosen_id(older + empty, channel=CHANNEL) == "1-1-old"


def test_a_chunk_of_another_snapshot_or_sequence_under_the_expected_key_does_not_count() -> None:
    """Rule: a chunk counts for a manifest only if its own id and sequence are the ones its key names;
    another id, or another sequence, under that key leaves the snapshot incomplete."""
    older = snap("1-1-old", states(1))
    manifest: list[Pair] = [(manifest_key(CHANNEL, 2), manifest_value(id="2-1-m", term=2))]
    other_id: list[Pair] = [(chunk_key("2-1-m", 0), chunk_value("2-1-x", 0, states(1)))]
    other_seq: list[Pair] = [(chunk_key("2-1-m", 0), chunk_value("2-1-m", 1, states(1)))]
    assert chosen_id(older + other_id + manifest) == "1-1-old"
    assert chosen_id(older + other_seq + manifest) == "1-1-old"
    right: list[Pair] = [(chunk_key("2-1-m", 0), chunk_value("2-1-m", 0, states(1)))]
    assert chosen_id(older + right + manifest) == "2-1-m"


def test_a_snapshot_whose_chunks_hold_another_number_of_bundles_is_passed_over() -> None:
    """Rule: a snapshot counts only if its chunks hold exactly the number of bundles its manifest names."""
    older = snap("1-1-old", states(1))
    chunks: list[Pair] = [(chunk_key("2-1-m", 0), chunk_value("2-1-m", 0, states(1)))]
    too_many: list[Pair] = [(manifest_key(CHANNEL, 2), manifest_value(id="2-1-m", bundles=2, term=2))]
    assert chosen_id(older + chunks + too_many) == "1-1-old"


def test_the_snapshot_chosen_holds_every_chunks_bundles_and_the_manifests_positions() -> None:
    """Rule: the snapshot chosen holds the union of its chunks' bundles and the positions of its manifest."""
    table = states(5)
    found = choose(snap("1-1-a", table, positions={0: 4, 1: 7}, chunk_bundles=2), channel=CHANNEL)
    assert found is not None
    assert found.states == table
    assert found.positions == {0: 4, 1: 7}


def test_a_message_without_key_does_not_end_the_scan() -> None:
    """Rule: a message without a key is ignored, and the messages after it are still read."""
    assert chosen_id([(None, b"x"), *snap("1-1-a", states(1))]) == "1-1-a"


def test_a_tombstone_removes_the_manifest_before_it_and_the_scan_goes_on() -> None:
    """Rule: a manifest tombstone removes the manifest written before it under that key, and the
    messages after the tombstone are still read."""
    first = snap("1-1-a", states(1), term=1)
    assert chosen_id([*first, (manifest_key(CHANNEL, 1), None)]) is None
    second = snap("2-1-b", states(1), term=2)
    assert chosen_id([*first, (manifest_key(CHANNEL, 1), None), *second]) == "2-1-b"


def test_a_tombstone_removes_the_chunk_before_it_and_the_scan_goes_on() -> None:
    """Rule: a chunk tombstone removes the chunk written before it under that key (its snapshot is then
    incomplete), and the messages after the tombstone are still read."""
    first = snap("1-1-a", states(1))
    assert chosen_id([*first, (chunk_key("1-1-a", 0), None)]) is None
    second = snap("2-1-b", states(1), term=2)
    assert chosen_id([(chunk_key("1-1-a", 0), None), *second]) == "2-1-b"


# A key of 300+ bytes that is not UTF-8: the log shows its first 200 bytes, decoded with replacement.
HOSTILE_TAIL = b"\xff" + b"m" * 300


def test_a_manifest_that_does_not_decode_is_skipped_and_logged_and_the_scan_goes_on() -> None:
    """Rule: a manifest value that does not decode is skipped with a warning
    ``snapshot_manifest_skipped`` naming the key (its first 200 bytes, undecodable bytes replaced) and
    the refusal's reason; it replaces the manifest before it under that key, and the scan goes on."""
    key = b"manifest/" + HOSTILE_TAIL
    good = snap("1-1-a", states(1))
    with structlog.testing.capture_logs() as logs:
        assert chosen_id([(key, b"{"), *good]) == "1-1-a"
    assert logs == [
        {
            "event": "snapshot_manifest_skipped",
            "log_level": "warning",
            "key": "manifest/\ufffd" + "m" * 190,
            "reason": "malformed",
        }
    ]
    assert chosen_id([*good, (good[-1][0], b"{")]) is None


def test_a_chunk_that_does_not_decode_is_skipped_and_logged_and_the_scan_goes_on() -> None:
    """Rule: a chunk value that does not decode is skipped with a warning ``snapshot_chunk_skipped``
    naming the key (its first 200 bytes, undecodable bytes replaced) and the refusal's reason; it
    replaces the chunk before it under that key, and the scan goes on."""
    key = b"chunk/" + HOSTILE_TAIL
    good = snap("1-1-a", states(1))
    with structlog.testing.capture_logs() as logs:
        assert chosen_id([(key, b"[]"), *good]) == "1-1-a"
    assert logs == [
        {
            "event": "snapshot_chunk_skipped",
            "log_level": "warning",
            "key": "chunk/\ufffd" + "m" * 193,
            "reason": "invalid",
        }
    ]
    assert chosen_id([good[0], (good[0][0], b"[]"), good[1]]) is None


# ------------------------------------------------------------------------------------------- bootstrap


def channel_message(i: int, offset: int, partitions: int = 2) -> tuple[bytes, bytes, int, int]:
    key = name(i).encode()
    value = encode(make(State.ASSIGNING, version=1, ts=0, writer="w", dst="a:1"))
    assert value is not None
    return key, value, partition_for(key, partitions), offset


def test_bootstrap_loads_the_chosen_snapshot_then_applies_the_tail() -> None:
    """Rule: bootstrap installs the newest snapshot of its channel and partition count, then applies the
    channel messages after it -- with the channel's partition count, so a record outside its key's
    partition is skipped. Snapshots of another channel or partition count are passed over."""
    table = states(2)
    mine = snap("1-1-mine", table, positions={0: 5, 1: 5})
    other_channel = snap("1-2-other", states(1, first=7), channel="other", positions={0: 9, 1: 9})
    other_count = snap("2-1-three", states(1, first=8), partitions=3, term=2)
    tail = [channel_message(3, 5)]
    key, value, home, _ = channel_message(4, 6)
    away = (key, value, 1 - home, 6)
    view = bootstrap(mine + other_channel + other_count, [*tail, away], partitions=2, channel=CHANNEL)
    assert view.partitions == 2
    assert set(view.as_dict()) == {name(0), name(1), name(3)}
    assert view.get(name(0)) == table[name(0)]
    assert view.stats.skipped == {"wrong_partition": 1}
    expected = {0: 5, 1: 5}
    expected[tail[0][2]] = 6
    expected[1 - home] = 7
    assert view.positions == expected


# ------------------------------------------------------------------------------------------- the topic


def test_a_snapshot_topic_of_one_partition_is_accepted_and_any_other_refused_with_the_fix() -> None:
    """Rule: check_snapshot_topic returns 1 for a one-partition topic and refuses any other count with an
    error naming the topic, its count and how to recreate it."""
    log = MemoryLog()
    log.create("one", 1)
    log.create("three", 3)
    transport = MemoryTransport(log)
    assert check_snapshot_topic(transport, "one") == 1
    with pytest.raises(SnapshotTopicError) as err:
        check_snapshot_topic(transport, "three")
    assert str(err.value) == (
        "snapshot topic 'three' has 3 partitions; it must have exactly 1 (delete it and create it "
        "with one partition and cleanup.policy=compact: trimtab topics ensure)"
    )


# ------------------------------------------------------------------------------------------ the writer


class TimedFuture(Future[Message]):
    def __init__(self, events: list[tuple[Any, ...]], key: bytes) -> None:
        super().__init__()
        self._events = events
        self._key = key

    def result(self, timeout: float | None = None) -> Message:
        self._events.append(("result", self._key, timeout))
        return super().result(timeout)


class RecordingReader(MemoryReader):
    def __init__(
        self, log: MemoryLog, topic: str, start: dict[int, int], events: list[tuple[Any, ...]]
    ) -> None:
        super().__init__(log, topic, start)
        self._events = events

    def poll(self, max_messages: int, timeout: float) -> list[Message]:
        self._events.append(("poll", max_messages, timeout))
        return super().poll(max_messages, timeout)


class Recording(MemoryTransport):
    """The in-memory transport, recording what a writer or reader asks of it."""

    def __init__(self, log: MemoryLog | None = None) -> None:
        super().__init__(log)
        self.events: list[tuple[Any, ...]] = []

    def produce(
        self, topic: str, key: bytes, value: bytes | None, *, partition: int | None = None
    ) -> Future[Message]:
        self.events.append(("produce", key, value is None, partition))
        done = super().produce(topic, key, value, partition=partition)
        fut = TimedFuture(self.events, key)
        fut.set_result(done.result())
        return fut

    def flush(self, timeout: float) -> int:
        self.events.append(("flush", timeout))
        return 0

    def reader(self, topic: str, start: dict[int, int], *, low_latency: bool = False) -> MemoryReader:
        self.events.append(("reader", low_latency))
        n = self.partitions(topic)
        return RecordingReader(self.log, topic, {p: start.get(p, 0) for p in range(n)}, self.events)


def test_a_writer_has_no_snapshot_id_until_it_writes_one(clock: Clock) -> None:
    """Rule: a new writer's last snapshot id is None; after a write it is that snapshot's id."""
    writer = SnapshotWriter(MemoryTransport(), SNAP, CHANNEL, writer="me")
    assert writer.last_id is None
    manifest = writer.write(states(1), {}, 2, term=1)
    assert writer.last_id == manifest.id == "1-1000001-01234567"


def test_the_sequence_starts_at_the_clock_in_ms_and_grows_by_one_while_the_clock_stands_still(
    clock: Clock,
) -> None:
    """Rule: a writer's sequence starts at the wall clock in ms when it is made; each write takes one
    more than the last, also when the clock has not moved (or went back)."""
    clock.now = 5000.0
    writer = SnapshotWriter(MemoryTransport(), SNAP, CHANNEL, writer="me")
    clock.now = 1000.0
    ids = [writer.write(states(1), {}, 2, term=1).id for _ in range(2)]
    assert ids == ["1-5000001-01234567", "1-5000002-01234567"]


def test_the_sequence_jumps_to_the_clock_in_ms_and_the_manifest_is_stamped_with_it(clock: Clock) -> None:
    """Rule: when the wall clock in ms is past the last sequence + 1, the write takes the clock; the
    manifest's ts is the wall clock in ms of the write."""
    writer = SnapshotWriter(MemoryTransport(), SNAP, CHANNEL, writer="me")
    clock.now = 7000.25
    manifest = writer.write(states(1), {}, 2, term=3)
    assert (manifest.id, manifest.ts) == ("3-7000250-01234567", 7000250)


def test_every_chunk_is_durable_before_the_manifest_and_collection_comes_last(clock: Clock) -> None:
    """Rule: the writer produces every chunk to the snapshot partition, waits for each (with its timeout),
    then produces the manifest and waits for it, and only then tombstones what is older (chunks of
    older snapshots and its channel's manifests of older terms) and flushes, with the same timeout."""
    transport = Recording(MemoryLog(default_partitions=4))
    writer = SnapshotWriter(transport, SNAP, CHANNEL, writer="me", chunk_bundles=2, timeout=2.5)
    first = writer.write(states(3), {0: 1}, 2, term=1)
    transport.events.clear()
    second = writer.write(states(1), {0: 2}, 2, term=3)
    c0, c1 = chunk_key(first.id, 0), chunk_key(first.id, 1)
    n0 = chunk_key(second.id, 0)
    m1, m3 = manifest_key(CHANNEL, 1), manifest_key(CHANNEL, 3)
    assert transport.events == [
        ("produce", n0, False, 0),
        ("result", n0, 2.5),
        ("produce", m3, False, 0),
        ("result", m3, 2.5),
        ("produce", c0, True, 0),
        ("produce", c1, True, 0),
        ("produce", m1, True, 0),
        ("flush", 2.5),
    ]
    # Every message, tombstones too, is in the one snapshot partition, though keys would hash elsewhere.
    everything = transport.log.messages(SNAP)
    assert {m.partition for m in everything} == {0}
    assert {zlib.crc32(m.key or b"") % 4 for m in everything} != {0}
    assert writer.known_keys == {n0, m3}


def test_a_writers_timeout_defaults_to_30_seconds(clock: Clock) -> None:
    """Rule: without a timeout the writer waits up to 30 s for each message and for the flush."""
    transport = Recording(MemoryLog(default_partitions=1))
    SnapshotWriter(transport, SNAP, CHANNEL, writer="me").write(states(1), {}, 2, term=1)
    assert {e[-1] for e in transport.events if e[0] in ("result", "flush")} == {30.0}


def test_a_writer_learns_the_snapshot_keys_of_the_topic_and_forgets_tombstoned_ones() -> None:
    """Rule: observe() learns every chunk and manifest key with a value, whatever comes before it in the
    topic, forgets a key once tombstoned, and ignores keyless messages and other keys."""
    writer = SnapshotWriter(MemoryTransport(), SNAP, CHANNEL, writer="me")
    c1, c2, m1 = chunk_key("1-1-a", 0), chunk_key("1-1-a", 1), manifest_key(CHANNEL, 1)
    writer.observe([(None, b"v"), (b"other", b"v"), (c1, b"v"), (m1, b"v"), (c2, b"v"), (c2, None)])
    assert writer.known_keys == {c1, m1}


def test_a_restarted_writer_collects_what_it_observed_in_the_topic(clock: Clock) -> None:
    """Rule: what a writer learnt from the topic is collected by its next write like its own keys."""
    transport = MemoryTransport(MemoryLog(default_partitions=1))
    old = SnapshotWriter(transport, SNAP, CHANNEL, writer="a").write(states(1), {}, 2, term=1)
    writer = SnapshotWriter(transport, SNAP, CHANNEL, writer="b")
    writer.observe(read_snapshot_topic(transport, SNAP))
    writer.write(states(1), {}, 2, term=2)
    tombstoned = [k for k, v in read_snapshot_topic(transport, SNAP) if v is None]
    assert tombstoned == [chunk_key(old.id, 0), manifest_key(CHANNEL, 1)]


def test_the_write_is_logged_with_its_id_size_positions_and_what_it_collected(clock: Clock) -> None:
    """Rule: a write logs ``snapshot_written`` with the snapshot id, its bundles, chunks and positions,
    and how many keys it collected."""
    writer = SnapshotWriter(MemoryTransport(MemoryLog(1)), SNAP, CHANNEL, writer="me", chunk_bundles=2)
    writer.write(states(3), {0: 4}, 2, term=1)
    with structlog.testing.capture_logs() as logs:
        manifest = writer.write(states(3), {0: 6, 1: 1}, 2, term=1)
    assert logs == [
        {
            "event": "snapshot_written",
            "log_level": "info",
            "snapshot": manifest.id,
            "bundles": 3,
            "chunks": 2,
            "positions": {0: 6, 1: 1},
            "collected": 2,
        }
    ]


def padded_states(sid: str, size: int) -> dict[str, Record]:
    """One bundle whose record's writer pads the chunk of snapshot ``sid`` to exactly ``size`` bytes."""
    one = {name(0): rec(0, writer="")}
    base = len(snapshot_messages(sid, one, {}, channel=CHANNEL, partitions=1, writer="me")[0][1])
    return {name(0): rec(0, writer="w" * (size - base))}


def test_a_message_exactly_at_the_size_limit_is_written_and_read_back(clock: Clock) -> None:
    """Rule: a snapshot message of exactly MAX_SNAPSHOT_VALUE_BYTES is written, and a reader takes it."""
    transport = MemoryTransport(MemoryLog(default_partitions=1))
    table = padded_states("1-1000001-01234567", MAX_SNAPSHOT_VALUE_BYTES)
    manifest = SnapshotWriter(transport, SNAP, CHANNEL, writer="me").write(table, {}, 1, term=1)
    topic = read_snapshot_topic(transport, SNAP)
    assert len(topic[0][1] or b"") == MAX_SNAPSHOT_VALUE_BYTES
    assert chosen_id(topic) == manifest.id


def test_a_message_over_the_size_limit_is_refused_before_anything_is_written(clock: Clock) -> None:
    """Rule: a snapshot message one byte over MAX_SNAPSHOT_VALUE_BYTES stops the write before anything
    is produced, with an error naming the key, both sizes and the setting to lower."""
    transport = MemoryTransport(MemoryLog(default_partitions=1))
    table = padded_states("1-1000001-01234567", MAX_SNAPSHOT_VALUE_BYTES + 1)
    with pytest.raises(ConfigError) as err:
        SnapshotWriter(transport, SNAP, CHANNEL, writer="me").write(table, {}, 1, term=1)
    assert str(err.value) == (
        "snapshot message chunk/1-1000001-01234567/000000 is 33554433 bytes, over 33554432: "
        "lower channel.snapshot_chunk_bundles"
    )
    assert transport.log.messages(SNAP) == []


# ------------------------------------------------------------------------------------------ reading


def filled(partitions: int, per_partition: int, default_partitions: int = 1) -> MemoryLog:
    log = MemoryLog(default_partitions=default_partitions)
    log.create("t", partitions)
    for p in range(partitions):
        for i in range(per_partition):
            log.append("t", f"k{p}.{i}".encode(), b"v", partition=p)
    return log


def test_read_all_reads_every_partition_of_the_topic_up_to_its_end() -> None:
    """Rule: without partitions read_all reads every partition of the topic (its own count, not a
    default), each in order."""
    got = [(m.partition, m.offset) for m in read_all(MemoryTransport(filled(3, 2)), "t")]
    assert got == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]


def test_read_all_reads_only_the_partitions_it_is_given() -> None:
    """Rule: given partitions, read_all returns only their messages, though the transport's reader
    delivers every partition."""
    got = [(m.partition, m.offset) for m in read_all(MemoryTransport(filled(3, 1)), "t", partitions=[2, 1])]
    assert got == [(1, 0), (2, 0)]


def test_read_all_stops_at_the_end_seen_when_it_began() -> None:
    """Rule: a message written after read_all took the high watermarks is not returned."""

    class WritesOnRead(Recording):
        def reader(self, topic: str, start: dict[int, int], *, low_latency: bool = False) -> MemoryReader:
            self.log.append(topic, b"late", b"v", partition=0)
            return super().reader(topic, start, low_latency=low_latency)

    got = [(m.key, m.offset) for m in read_all(WritesOnRead(filled(1, 1)), "t")]
    assert got == [(b"k0.0", 0)]


def test_read_all_opens_no_reader_when_there_is_nothing_to_read() -> None:
    """Rule: when every partition's first retained offset is its high watermark (empty, or all dropped by
    retention), read_all returns nothing without opening a reader."""
    log = filled(2, 2)
    log.truncate("t", 0, 2)
    log.truncate("t", 1, 2)
    transport = Recording(log)
    assert list(read_all(transport, "t")) == []
    assert list(read_all(transport, "empty")) == []
    assert transport.events == []


def test_read_all_asks_for_a_low_latency_reader_and_polls_in_batches_of_10000_for_a_tenth_second() -> None:
    """Rule: read_all reads with a low-latency reader, polling up to 10 000 messages for up to 0.1 s."""
    transport = Recording(filled(1, 1))
    assert [m.key for m in read_all(transport, "t")] == [b"k0.0"]
    assert transport.events == [("reader", True), ("poll", 10_000, 0.1)]


class NeverEnds(MemoryTransport):
    """Reports one more message than it holds: a reader never reaches the end."""

    def watermarks(self, topic: str, partition: int, *, timeout_s: float = 10.0) -> tuple[int, int]:
        low, high = super().watermarks(topic, partition)
        return low, high + 1


def read_until_error(read: Callable[[], Iterable[tuple[Any, ...]]]) -> tuple[list[bytes | None], str]:
    """The keys read until the error, and the error's text."""
    got: list[bytes | None] = []
    with pytest.raises(TransportError) as err:
        for m in read():
            got.append(m[0])
    return got, str(err.value)


def test_read_all_gives_up_once_past_its_deadline_not_at_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule: read_all raises a TransportError naming the topic and the timeout once the monotonic clock
    is past start + timeout; exactly at the deadline it still polls."""
    monkeypatch.setattr(snapshot_module, "time", Clock(ticks=[0.0, 5.0, 5.0 + 1 / 1024]))
    got, text = read_until_error(lambda: read_all(NeverEnds(filled(1, 1)), "t", 5.0))
    assert got == [b"k0.0"]
    assert text == "reading t did not reach its end within 5.0s"


def test_reading_gives_up_after_30_seconds_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule: read_all and read_snapshot_topic wait 30 s by default, and read_snapshot_topic passes its
    timeout on."""
    transport = NeverEnds(filled(1, 1))
    # (A last tick far past any deadline: a reader that waited longer would still stop.)
    for read in (
        lambda: read_all(transport, "t"),
        lambda: read_snapshot_topic(transport, "t"),
    ):
        monkeypatch.setattr(snapshot_module, "time", Clock(ticks=[0.0, 30.0, 30.5, 1e6]))
        assert read_until_error(read)[1] == "reading t did not reach its end within 30.0s"
    monkeypatch.setattr(snapshot_module, "time", Clock(ticks=[0.0, 2.0, 2.5, 1e6]))
    _, text = read_until_error(lambda: read_snapshot_topic(transport, "t", 2.0))
    assert text == "reading t did not reach its end within 2.0s"


def test_the_snapshot_topic_is_read_from_its_one_partition_only() -> None:
    """Rule: read_snapshot_topic returns the (key, value) pairs of partition 0 only, in order."""
    assert read_snapshot_topic(MemoryTransport(filled(2, 2)), "t") == [(b"k0.0", b"v"), (b"k0.1", b"v")]
