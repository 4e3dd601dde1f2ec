"""docs/design.md 3.4: bootstrap(snapshot, tail) produces exactly the table a full replay from offset zero produces.

A simulated leader follows a random multi-partition channel (partitions interleaved arbitrarily) and writes
snapshots of its live table at random points. Its writer may crash mid-write (only a prefix of the
snapshot's messages lands; the manifest is last), it may crash while collecting older chunks, leaders fail
over (the new one bootstraps from the snapshot topic and goes on), a snapshot of another channel may land
in the topic, the snapshot topic may be compacted (last value per key, tombstones dropped), and channel
retention may drop everything below the chosen snapshot's positions. A fresh node bootstrapping from all
of that must end with the full replay's table.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from strategies import ChannelLog, Msg, Oracle, channel_logs, deliveries, rec, table_json, to_record

from trimtab.channel.records import Record, encode
from trimtab.channel.snapshot import (
    bootstrap,
    choose,
    chunk_key,
    garbage,
    manifest_key,
    snapshot_messages,
)
from trimtab.channel.table import TableView, replay

# Big generated logs: slow to generate on a loaded CI machine, and that is fine.
SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]
CHANNEL = "trimtab-channel"
SnapshotMsg = tuple[bytes | None, bytes | None]


def compact(topic: list[SnapshotMsg], upto: int, drop_tombstones: bool) -> list[SnapshotMsg]:
    """Kafka log compaction of the first ``upto`` messages: a message survives only if no later message
    has its key; surviving tombstones may be removed too (after delete.retention.ms)."""
    last = {key: i for i, (key, _) in enumerate(topic)}
    out = []
    for i, (key, value) in enumerate(topic):
        if i < upto and (last[key] != i or (value is None and drop_tombstones)):
            continue
        out.append((key, value))
    return out


class Leader:
    """The snapshotting leader: a live table plus what it knows of the snapshot topic."""

    def __init__(self, partitions: int, term: int = 1) -> None:
        self.partitions = partitions
        self.term = term
        self.view = TableView(partitions)
        self.known_keys: set[bytes] = set()
        self.n = 0

    def write(self, draw: Any, topic: list[SnapshotMsg], complete_ids: list[str]) -> None:
        self.n += 1
        sid = f"{self.term}-{self.n}-x"
        msgs = snapshot_messages(
            sid,
            self.view.as_dict(),
            self.view.positions,
            channel=CHANNEL,
            partitions=self.partitions,
            writer="leader",
            term=self.term,
            chunk_bundles=draw(st.integers(1, 3)),
        )
        landed = msgs if draw(st.integers(0, 3)) else msgs[: draw(st.integers(0, len(msgs) - 1))]
        topic.extend(landed)
        self.known_keys.update(k for k, _ in msgs)  # a writer remembers keys before writing them
        if len(landed) < len(msgs):
            return  # crashed before the manifest
        complete_ids.append(sid)
        if draw(st.booleans()):
            stale = garbage(self.known_keys, sid, self.term, CHANNEL)
            done = stale if draw(st.integers(0, 3)) else stale[: draw(st.integers(0, len(stale)))]
            topic.extend((k, None) for k in done)
            self.known_keys.difference_update(done)

    def observe(self, topic: list[SnapshotMsg]) -> None:
        """Learn every key in the topic (the worst case for garbage collection: it knows everything)."""
        self.known_keys.update(k for k, v in compact(topic, len(topic), False) if k is not None and v)


def foreign_snapshot(n: int, partitions: int) -> list[SnapshotMsg]:
    """A complete snapshot of another channel, claiming everything is owned by a broker named 'intruder'."""
    states = {"t/ns0/0x00000000_0x80000000": to_record(rec("owned", 99, dst="intruder"))}
    return snapshot_messages(
        f"foreign{n}",
        states,
        dict.fromkeys(range(partitions), 10**6),
        channel="some-other-channel",
        partitions=partitions,
        writer="other",
    )


def failover(leader: Leader, topic: list[SnapshotMsg], by_partition: dict[int, list[Msg]]) -> Leader:
    """A new leader bootstraps from what is there now (the channel up to this leader's positions, which is
    what it could read) and carries on; the old one keeps a copy of its view as it was (deposed)."""
    partitions = leader.partitions
    seen = leader.view.positions
    so_far = [x for p, xs in sorted(by_partition.items()) for x in xs if x[3] < seen.get(p, 0)]
    new_view = bootstrap(list(topic), so_far, partitions=partitions, channel=CHANNEL)
    assert new_view.as_dict() == leader.view.as_dict()
    successor = Leader(partitions, leader.term + 1)
    successor.view = new_view
    successor.observe(topic)
    stale_view = TableView(partitions)
    stale_view.load(leader.view.as_dict(), leader.view.positions)
    leader.view = stale_view
    event("leader failover")
    return successor


def run_leaders(
    draw: Any, log: ChannelLog, by_partition: dict[int, list[Msg]]
) -> tuple[list[SnapshotMsg], list[str], bool]:
    """Leaders follow the channel and, at random points, write snapshots (sometimes crashing mid-write),
    fail over, let a deposed leader finish a snapshot of its older view (collecting garbage with full
    knowledge of the topic), or see another channel's snapshot land. Returns the snapshot topic, the ids
    of complete snapshots in the order they completed, and whether a foreign snapshot landed."""
    assert log.partitions is not None
    leader = Leader(log.partitions)
    deposed: list[Leader] = []  # earlier leaders that do not know they lost (they keep an old view)
    topic: list[SnapshotMsg] = []
    complete: list[str] = []
    foreign = False
    for i, m in enumerate(draw(deliveries(log))):
        leader.view.apply(*m)
        action = draw(
            st.sampled_from(["none"] * 6 + ["snapshot", "snapshot", "failover", "foreign", "stale"])
        )
        if action == "snapshot":
            leader.write(draw, topic, complete)
        elif action == "stale" and deposed:
            old = deposed[draw(st.integers(0, len(deposed) - 1))]
            old.observe(topic)
            old.write(draw, topic, complete)
            event("stale leader wrote a snapshot")
        elif action == "foreign":
            foreign = True
            topic.extend(foreign_snapshot(i, log.partitions))
        elif action == "failover":
            deposed.append(leader)
            leader = failover(leader, topic, by_partition)
    if draw(st.booleans()):
        leader.write(draw, topic, complete)
    return topic, complete, foreign


@settings(max_examples=150, deadline=None, suppress_health_check=SLOW_OK)
@given(data=st.data())
def test_bootstrap_equals_full_replay(data: st.DataObject) -> None:
    draw = data.draw
    log: ChannelLog = draw(channel_logs(st.integers(1, 4), max_steps=50))
    partitions = log.partitions
    assert partitions is not None
    by_partition = log.partition_logs()

    full = replay(log.in_partition_order(), partitions)
    reference = Oracle(partitions)
    for m in log.in_partition_order():
        reference.apply(*m)
    assert table_json(full.items()) == reference.table

    # The leader follows the channel in its own interleaving and snapshots at random points.
    topic, complete, foreign = run_leaders(draw, log, by_partition)

    # Compaction of (a prefix of) the snapshot topic.
    compacted = False
    if draw(st.booleans()):
        compacted = True
        topic = compact(topic, draw(st.integers(0, len(topic))), draw(st.booleans()))

    snap = choose(topic, channel=CHANNEL)
    if not complete:
        assert snap is None
    if snap is not None:
        assert snap.manifest.id in complete
        assert snap.manifest.channel == CHANNEL
    if complete and not compacted and not foreign:
        # The newest complete snapshot of the newest term that completed one.
        best = max(complete, key=lambda sid: (int(sid.split("-")[0]), complete.index(sid)))
        assert snap is not None and snap.manifest.id == best

    # Retention: the channel may have lost everything below the chosen snapshot's positions.
    start = {p: 0 for p in by_partition}
    if snap is not None:
        for p in by_partition:
            start[p] = draw(st.integers(0, snap.positions.get(p, 0)))
    tail: list[Msg] = draw(deliveries(log, start=start))
    event(f"snapshot chosen: {snap is not None}; channel truncated: {any(start.values())}")
    event(f"complete snapshots: {min(len(complete), 3)}+; compacted: {compacted}")

    booted = bootstrap(topic, tail, partitions=partitions, channel=CHANNEL)
    assert booted.as_dict() == full.as_dict()
    if not foreign:  # only our snapshots in the topic: no need to name the channel
        assert bootstrap(topic, tail, partitions=partitions).as_dict() == full.as_dict()


@settings(max_examples=100, deadline=None, suppress_health_check=SLOW_OK)
@given(data=st.data())
def test_stale_leaders_never_break_the_newest_snapshot(data: st.DataObject) -> None:
    """Leaders of increasing terms follow the channel and write snapshots; deposed leaders keep writing
    snapshots of their old views and collecting garbage with full knowledge of the topic, at any time.
    The newest complete snapshot of the newest term must survive, and a node bootstrapping from it after
    retention deleted everything it covers must equal the full replay."""
    draw = data.draw
    log: ChannelLog = draw(channel_logs(st.integers(1, 3), max_steps=40))
    partitions = log.partitions
    assert partitions is not None
    full = replay(log.in_partition_order(), partitions)
    leaders = [Leader(partitions, 1)]
    topic: list[SnapshotMsg] = []
    complete: list[str] = []
    positions: dict[str, dict[int, int]] = {}
    for m in draw(deliveries(log)):
        for ld in leaders[-1:]:  # only the current leader keeps following
            ld.view.apply(*m)
        action = draw(st.sampled_from(["none", "none", "snapshot", "failover", "stale"]))
        if action == "snapshot":
            before = len(complete)
            leaders[-1].write(draw, topic, complete)
            if len(complete) > before:
                positions[complete[-1]] = dict(leaders[-1].view.positions)
        elif action == "failover":
            successor = Leader(partitions, leaders[-1].term + 1)
            successor.view.load(leaders[-1].view.as_dict(), leaders[-1].view.positions)
            successor.observe(topic)
            leaders.append(successor)
        elif action == "stale" and len(leaders) > 1:
            old = leaders[draw(st.integers(0, len(leaders) - 2))]
            old.observe(topic)
            before = len(complete)
            old.write(draw, topic, complete)
            if len(complete) > before:
                positions[complete[-1]] = dict(old.view.positions)
            event("stale leader wrote a snapshot")
    if not complete:
        return
    best = max(complete, key=lambda sid: (int(sid.split("-")[0]), complete.index(sid)))
    snap = choose(topic, channel=CHANNEL, partitions=partitions)
    assert snap is not None and snap.manifest.id == best
    # Retention deleted everything the newest snapshot covers.
    tail: list[Msg] = draw(deliveries(log, start=positions[best]))
    booted = bootstrap(topic, tail, partitions=partitions, channel=CHANNEL)
    assert booted.as_dict() == full.as_dict()


@settings(max_examples=60, deadline=None, suppress_health_check=SLOW_OK)
@given(log=channel_logs(st.integers(1, 3), max_steps=30), data=st.data())
def test_snapshot_round_trips_the_table(log: ChannelLog, data: st.DataObject) -> None:
    """choose() returns exactly the states and positions that were written, whatever the chunking."""
    assert log.partitions is not None
    view = replay(log.messages, log.partitions)
    msgs = snapshot_messages(
        "x",
        view.as_dict(),
        view.positions,
        channel=CHANNEL,
        partitions=log.partitions,
        writer="w",
        chunk_bundles=data.draw(st.integers(1, 5)),
    )
    assert msgs[-1][0] == manifest_key(CHANNEL, 0)
    snap = choose(msgs, channel=CHANNEL)
    assert snap is not None
    assert snap.states == view.as_dict()
    assert snap.positions == {p: view.positions.get(p, 0) for p in range(log.partitions)}
    # Any strict prefix (a crash before the manifest) is not a snapshot.
    assert choose(msgs[: data.draw(st.integers(0, len(msgs) - 1))]) is None


# ------------------------------------------------------------------------------------------ examples


def _states(n: int) -> dict[str, Record]:
    names = ["t/ns/0x00000000_0x40000000", "t/ns/0x40000000_0x80000000", "t/ns/0x80000000_0xffffffff"]
    return {name: to_record(rec("owned", 2, dst=f"b{i}:1")) for i, name in enumerate(names[:n])}


def test_choose_is_none_without_a_complete_manifest() -> None:
    msgs = snapshot_messages(
        "a", _states(3), {0: 5}, channel=CHANNEL, partitions=1, writer="w", chunk_bundles=1
    )
    assert len(msgs) == 4
    assert choose([]) is None
    assert choose(msgs[:-1]) is None  # chunks only
    assert choose([msgs[0], msgs[2], msgs[3]]) is None  # a chunk is missing
    assert choose([*msgs, (msgs[1][0], None)]) is None  # a chunk was tombstoned
    assert choose([*msgs, (msgs[1][0], b"not json")]) is None  # a chunk was overwritten with garbage
    assert (
        choose([(manifest_key(CHANNEL, 0), b"{}"), (manifest_key(CHANNEL, 1), b"\xff"), (None, b"x")]) is None
    )
    assert choose([(manifest_key(CHANNEL, 0), None)]) is None


def test_choose_takes_the_newest_complete_snapshot() -> None:
    first = snapshot_messages("a", _states(1), {0: 1}, channel=CHANNEL, partitions=1, writer="w", term=1)
    second = snapshot_messages("b", _states(3), {0: 9}, channel=CHANNEL, partitions=1, writer="w", term=2)
    snap = choose([*first, *second])
    assert snap is not None and snap.manifest.id == "b" and snap.states == _states(3)
    # A newer manifest whose chunks are gone falls back to the older complete one.
    snap = choose([*first, *second, (second[0][0], None)])
    assert snap is not None and snap.manifest.id == "a" and snap.positions == {0: 1}
    # A crashed write after a complete one changes nothing.
    snap = choose([*first, *second[:-1]])
    assert snap is not None and snap.manifest.id == "a"
    # A stale leader (older term) finishing its snapshot after a newer leader's does not win.
    snap = choose([*second, *first])
    assert snap is not None and snap.manifest.id == "b"
    # Within one term, the latest manifest replaces the previous one (same key under compaction).
    again = snapshot_messages("c", _states(2), {0: 12}, channel=CHANNEL, partitions=1, writer="w", term=2)
    snap = choose([*first, *second, *again])
    assert snap is not None and snap.manifest.id == "c"


def test_choose_ignores_snapshots_of_another_channel() -> None:
    ours = snapshot_messages("a", _states(1), {0: 1}, channel=CHANNEL, partitions=1, writer="w")
    theirs = snapshot_messages("b", _states(2), {0: 7}, channel="elsewhere", partitions=1, writer="w")
    snap = choose([*ours, *theirs], channel=CHANNEL)
    assert snap is not None and snap.manifest.id == "a"
    assert choose(theirs, channel=CHANNEL) is None
    unrestricted = choose([*ours, *theirs])
    assert unrestricted is not None and unrestricted.manifest.id == "b"


def test_chunk_keys_and_garbage() -> None:
    assert chunk_key("s1", 3) == b"chunk/s1/000003"
    keys = [
        chunk_key("1-5-a", 0),
        chunk_key("1-5-a", 1),
        chunk_key("1-7-b", 0),
        chunk_key("1-10-c", 0),
        chunk_key("2-3-d", 0),  # a newer leader's
        chunk_key("s1", 0),  # an id that cannot be ordered: never collected
        b"chunk/\xff-1-x/000000",
        manifest_key(CHANNEL, 1),
        manifest_key(CHANNEL, 2),
        manifest_key(CHANNEL, 3),
        manifest_key("other", 1),
        b"x",
    ]
    # Only chunks of older snapshots (smaller term, then sequence), never a newer leader's.
    assert garbage(keys, "1-7-b") == sorted([chunk_key("1-5-a", 0), chunk_key("1-5-a", 1)])
    assert garbage(keys, "1-10-c") == sorted(
        [chunk_key("1-5-a", 0), chunk_key("1-5-a", 1), chunk_key("1-7-b", 0)]
    )
    assert garbage(keys, "2-3-d") == sorted(
        [chunk_key("1-5-a", 0), chunk_key("1-5-a", 1), chunk_key("1-7-b", 0), chunk_key("1-10-c", 0)]
    )
    assert garbage(keys, "s1") == []
    # Given the writer's term, older manifests of its channel go too -- never a newer term's, never
    # another channel's.
    assert garbage(keys, "1-7-b", 2, CHANNEL) == sorted(
        [chunk_key("1-5-a", 0), chunk_key("1-5-a", 1), manifest_key(CHANNEL, 1)]
    )


def test_a_stale_leader_never_collects_a_newer_leaders_snapshot() -> None:
    """Leader of term 2 writes a snapshot; the deposed leader of term 1 then finishes one and collects
    garbage knowing every key: the reader still gets term 2's snapshot, complete."""
    newer = snapshot_messages("2-1-n", _states(3), {0: 9}, channel=CHANNEL, partitions=1, writer="b", term=2)
    older = snapshot_messages("1-9-o", _states(1), {0: 4}, channel=CHANNEL, partitions=1, writer="a", term=1)
    topic: list[SnapshotMsg] = [*newer, *older]
    collected = garbage([k for k, _ in topic if k is not None], "1-9-o", 1, CHANNEL)
    assert collected == []
    topic.extend((k, None) for k in collected)
    snap = choose(compact(topic, len(topic), True), channel=CHANNEL)
    assert snap is not None and snap.manifest.id == "2-1-n" and snap.states == _states(3)
    # The newer leader, in turn, collects the stale one's chunks and manifest.
    assert garbage([k for k, _ in topic if k is not None], "2-1-n", 2, CHANNEL) == sorted(
        [chunk_key("1-9-o", 0), manifest_key(CHANNEL, 1)]
    )


def test_poisoned_chunks_and_manifests_are_skipped_not_fatal() -> None:
    good = snapshot_messages("1-1-a", _states(2), {0: 3}, channel=CHANNEL, partitions=1, writer="w", term=1)
    newer = snapshot_messages(
        "2-1-b", _states(3), {0: 9}, channel=CHANNEL, partitions=1, writer="w", term=2, chunk_bundles=1
    )
    poisons: list[bytes] = [
        b"\xff\xfe",
        b'{"schema":1,"id":"2-1-b","seq":0,"bundles":{"t/ns/0x00000000_0x40000000":{"state":"\xc3"}}}',
        b"[" * 100_000 + b"]" * 100_000,
        newer[0][1][:-1] + b',"seq":"0"}',  # a repeated name: the last (a string) counts
        newer[0][1].replace(b"t/ns/", b"not a bundle/"),
    ]
    for poison in poisons:
        # A poisoned chunk of the newer snapshot: it is incomplete, the older one is used.
        topic = [*good, *newer, (newer[0][0], poison)]
        snap = choose(topic, channel=CHANNEL)
        assert snap is not None and snap.manifest.id == "1-1-a", poison[:60]
        # A poisoned manifest: likewise.
        topic = [*good, *newer, (newer[-1][0], poison)]
        snap = choose(topic, channel=CHANNEL)
        assert snap is not None and snap.manifest.id == "1-1-a", poison[:60]


def test_choose_takes_the_newest_snapshot_with_the_channels_partition_count() -> None:
    two = snapshot_messages(
        "1-1-a", _states(1), {0: 1, 1: 1}, channel=CHANNEL, partitions=2, writer="w", term=1
    )
    four = snapshot_messages(
        "2-1-b", _states(2), {p: 1 for p in range(4)}, channel=CHANNEL, partitions=4, writer="w", term=2
    )
    snap = choose([*two, *four], channel=CHANNEL, partitions=2)
    assert snap is not None and snap.manifest.id == "1-1-a"
    snap = choose([*two, *four], channel=CHANNEL, partitions=4)
    assert snap is not None and snap.manifest.id == "2-1-b"
    assert choose([*two, *four], channel=CHANNEL, partitions=3) is None


def test_bootstrap_ignores_a_snapshot_with_another_partition_count() -> None:
    k = b"t/ns/0x00000000_0xffffffff"
    bogus = {k.decode(): to_record(rec("owned", 7, dst="ghost:1"))}
    topic = snapshot_messages("a", bogus, {0: 100, 1: 100}, channel=CHANNEL, partitions=2, writer="w")
    channel = [(k, _enc(rec("assigning", 1, dst="b1:1")), 0, 0)]
    booted = bootstrap(topic, channel, partitions=1, channel=CHANNEL)
    assert table_json(booted.items()) == {k.decode(): rec("assigning", 1, dst="b1:1")}
    # With the matching partition count the (bogus) snapshot is used and offsets below it are skipped.
    booted = bootstrap(
        topic, [(k, _enc(rec("assigning", 1, dst="b1:1")), 0, 0)], partitions=2, channel=CHANNEL
    )
    assert booted.get(k.decode()) == bogus[k.decode()]


def _enc(d: dict[str, Any]) -> bytes:
    out = encode(to_record(d))
    assert out is not None
    return out
