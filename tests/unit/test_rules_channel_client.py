"""The rules of ChannelClient an operator relies on, one test per rule, on the in-memory log.

What a node says before it starts and once it follows the channel (``health()``, ``status()``), how it
bootstraps from a snapshot (and ignores one past the end of the channel), how a history gap and a failed
follower make it unready with a reason and are recovered from (at once after a gap, with backoff after a
failure, ``on_ready`` called again), what ``lag()`` counts, and what publishing writes. Threads are
synchronised by events and ``wait_for`` with timeouts; timing bounds are asserted only where the rule is
a delay.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import Future

import msgspec
import pytest

from tests.support.logs import capture_logs
from tests.support.waiting import wait_for
from trimtab.channel.bundles import BundleLayout
from trimtab.channel.client import ChannelClient
from trimtab.channel.memory import MemoryLog, MemoryTransport
from trimtab.channel.records import Record, State, encode, make
from trimtab.channel.snapshot import Manifest, SnapshotWriter, manifest_key
from trimtab.channel.table import TableView
from trimtab.channel.transport import Delivered, Message
from trimtab.errors import HistoryGap, TransportError

CHANNEL, SNAPSHOTS = "chan", "snap"
B = "b1:1"


def rec(version: int) -> Record:
    return {
        1: make(State.ASSIGNING, version=1, ts=1, writer=B, dst=B),
        2: make(State.OWNED, version=2, ts=2, writer=B, dst=B),
        3: make(State.RELEASING, version=3, ts=3, writer=B, src=B),
        4: make(State.FREE, version=4, ts=4, writer=B, src=B),
    }[version]


def bundles_in(partition: int, n: int) -> list[str]:
    """``n`` bundle names whose records land in ``partition`` of 2."""
    out = [b for b in BundleLayout.default("t/ns", 64).bundles if zlib.crc32(b.encode()) % 2 == partition]
    return out[:n]


P0 = bundles_in(0, 4)
P1 = bundles_in(1, 4)


def step(log: MemoryLog, bundle: str, version: int) -> None:
    log.append(CHANNEL, bundle.encode(), encode(rec(version)))


class Hooked(MemoryTransport):
    """A MemoryTransport that calls ``on_partitions(thread name, topic)`` and ``on_watermarks(thread name, topic,
    partition, timeout_s)`` first (each may block or raise) and can answer another partition count."""

    def __init__(self, log: MemoryLog) -> None:
        super().__init__(log)
        self.on_partitions: Callable[[str, str], None] | None = None
        self.on_watermarks: Callable[[str, str, int, float], None] | None = None
        self.count: int | None = None

    def partitions(self, topic: str) -> int:
        if self.on_partitions is not None:
            self.on_partitions(threading.current_thread().name, topic)
        n = super().partitions(topic)
        return self.count if self.count is not None and topic == CHANNEL else n

    def watermarks(self, topic: str, partition: int, *, timeout_s: float = 10.0) -> tuple[int, int]:
        if self.on_watermarks is not None:
            self.on_watermarks(threading.current_thread().name, topic, partition, timeout_s)
        return super().watermarks(topic, partition, timeout_s=timeout_s)


@pytest.fixture
def log() -> MemoryLog:
    log = MemoryLog(default_partitions=3)  # a topic created by mistake gets 3, the channel has 2
    log.create(CHANNEL, 2)
    log.create(SNAPSHOTS, 1)
    return log


def threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def fresh_stats() -> dict[str, object]:
    return TableView().stats.detail()


# ------------------------------------------------------------------------------------ before start


def test_a_client_not_started_is_not_ready_and_says_so(log: MemoryLog) -> None:
    """Rule: before start() the node is not ready with the reason "not started", and its status has no
    lag, no bundles, no positions, no activity, no recovery, no gap and no error."""
    c = ChannelClient(MemoryTransport(log), CHANNEL, SNAPSHOTS)
    assert c.health() == (False, "not started")
    assert c.status() == {
        "ready": False,
        "reason": "not started",
        "lag": 0,
        "bundles": 0,
        "positions": {},
        "last_record_s_ago": None,
        "recoveries": 0,
        "stalls": 0,
        "history_gaps": 0,
        "last_error": None,
        "stats": fresh_stats(),
    }
    assert c.lag() == 0 and c.error is None and not c.history_gap and c.snapshot is None
    assert (c.started_at, c.ready_at, c.retry_s, c.max_retry_s) == (0.0, 0.0, 2.0, 30.0)


def test_without_a_snapshot_topic_no_snapshot_is_used(log: MemoryLog) -> None:
    """Rule: use_snapshot holds only with a snapshot topic; use_snapshot=False is kept with one."""
    assert ChannelClient(MemoryTransport(log), CHANNEL, None).use_snapshot is False
    assert ChannelClient(MemoryTransport(log), CHANNEL, SNAPSHOTS, use_snapshot=False).use_snapshot is False
    assert ChannelClient(MemoryTransport(log), CHANNEL, SNAPSHOTS).use_snapshot is True


def test_use_snapshot_false_neither_checks_nor_reads_the_snapshot_topic(
    log: MemoryLog, clients: list[ChannelClient]
) -> None:
    """Rule: with use_snapshot=False the snapshot topic is not checked (4 partitions pass) and a snapshot
    that would cover a history gap is not read: the node stays unready on the gap."""
    log.create("snap4", 4)
    step(log, P0[0], 1)
    ok = ChannelClient(MemoryTransport(log), CHANNEL, "snap4", use_snapshot=False)
    clients.append(ok)
    ok.start()
    assert ok.wait_ready(10)
    step(log, P0[0], 2)
    SnapshotWriter(MemoryTransport(log), SNAPSHOTS, CHANNEL, writer="w").write(
        {P0[0]: rec(2)}, {0: 2, 1: 0}, 2, term=1
    )
    log.truncate(CHANNEL, 0, 2)
    c = ChannelClient(MemoryTransport(log), CHANNEL, SNAPSHOTS, use_snapshot=False, max_retry_s=60.0)
    clients.append(c)
    c.start()
    assert c.health()[0] is False and c.history_gap and c.snapshot is None
    assert not c.wait_ready(0.25)


# ------------------------------------------------------------------------------------ ready


def test_a_caught_up_client_is_ready_and_reports_its_replica(
    log: MemoryLog, clients: list[ChannelClient]
) -> None:
    """Rule: once caught up the node is ready with the reason "ready"; on_ready got the client's table,
    already live; status() gives the positions, the bundle count, the time since the last record (to the
    ms), no recovery, gap or error; started_at and ready_at are monotonic times, in that order."""
    for b in P0[:2] + P1[:1]:
        step(log, b, 1)
    seen: list[tuple[TableView, bool, int]] = []
    before = time.monotonic()
    c = ChannelClient(
        MemoryTransport(log), CHANNEL, SNAPSHOTS, on_ready=lambda t: seen.append((t, t.live, len(t)))
    )
    clients.append(c)
    c.start()
    assert c.wait_ready(10)
    assert len(seen) == 1 and seen[0][0] is c.table and seen[0][1:] == (True, 3)
    assert c.health() == (True, "ready") and c.ready
    assert before <= c.started_at <= c.ready_at <= time.monotonic()
    follower = c.follower
    assert follower is not None
    follower.last_activity = time.monotonic() - 100.2504  # to the ms: 100.25
    st = c.status()
    ago = st.pop("last_record_s_ago")
    assert isinstance(ago, float) and 100.25 <= ago < 160 and round(ago, 3) == ago
    assert st == {
        "ready": True,
        "reason": "ready",
        "lag": 0,
        "bundles": 3,
        "positions": {0: 2, 1: 1},
        "recoveries": 0,
        "stalls": 0,
        "history_gaps": 0,
        "last_error": None,
        "stats": {**fresh_stats(), "accepted": 3},
    }
    follower.last_activity = 0.0
    assert c.status()["last_record_s_ago"] is None
    assert c.naming(B) == {b: rec(1) for b in P0[:2] + P1[:1]} and c.naming("b9:9") == {}


def test_on_skip_hears_the_records_replay_skips(log: MemoryLog, clients: list[ChannelClient]) -> None:
    """Rule: on_skip is given to the table: a record without a key is reported with its position."""
    heard: list[tuple[str | None, int | None, int | None, str]] = []
    log.append(CHANNEL, None, encode(rec(1)), partition=1)
    c = ChannelClient(MemoryTransport(log), CHANNEL, None, on_skip=lambda *a: heard.append(a))
    clients.append(c)
    c.start()
    assert c.wait_ready(10)
    assert [(k, p, o) for k, p, o, _ in heard] == [(None, 1, 0)]


# ------------------------------------------------------------------------------------ snapshots


def test_a_snapshot_is_loaded_and_the_tail_replayed_after_it(
    log: MemoryLog, clients: list[ChannelClient]
) -> None:
    """Rule: start() loads the newest snapshot of this channel and partition count that covers what is
    retained, logs snapshot_loaded, and follows from its positions (the records before are not replayed
    again)."""
    step(log, P0[0], 1)
    step(log, P1[0], 1)
    manifest = SnapshotWriter(MemoryTransport(log), SNAPSHOTS, CHANNEL, writer="w").write(
        {P0[0]: rec(1), P1[0]: rec(1)}, {0: 1, 1: 1}, 2, term=1
    )
    log.truncate(CHANNEL, 0, 1)  # partition 1 keeps its record: the snapshot covers it, not replayed
    step(log, P0[0], 2)
    with capture_logs() as logs:
        c = ChannelClient(MemoryTransport(log), CHANNEL, SNAPSHOTS, retry_s=60.0, max_retry_s=60.0)
        clients.append(c)
        c.start()
        assert c.wait_ready(10), c.health()
    assert c.snapshot is not None and c.snapshot.manifest.id == manifest.id
    assert c.table.snapshot() == ({P0[0]: rec(2), P1[0]: rec(1)}, {0: 2, 1: 1})
    assert c.status()["stats"] == {**fresh_stats(), "accepted": 1}
    assert c.status()["positions"] == {0: 2, 1: 1}
    assert c.follower is not None and c.follower.records == 1  # only the tail was read
    assert {
        "event": "snapshot_loaded",
        "log_level": "info",
        "snapshot": manifest.id,
        "bundles": 2,
        "positions": {0: 1, 1: 1},
    } in logs


def test_without_a_snapshot_the_table_starts_with_no_positions(
    log: MemoryLog, clients: list[ChannelClient]
) -> None:
    """Rule: without a snapshot the table is loaded empty with no positions: only partitions with
    records read get one."""
    step(log, P0[0], 1)
    c = ChannelClient(MemoryTransport(log), CHANNEL, SNAPSHOTS)
    clients.append(c)
    c.start()
    assert c.wait_ready(10)
    assert c.table.snapshot() == ({P0[0]: rec(1)}, {0: 1}) and c.snapshot is None


def test_a_snapshot_past_the_end_of_the_channel_is_ignored(
    log: MemoryLog, clients: list[ChannelClient]
) -> None:
    """Rule: a snapshot with a position past the end of the channel (a re-created topic) is ignored and
    logged as snapshot_ignored; the node replays the channel from offset 0. A position exactly at the end
    is not past it."""
    step(log, P0[0], 1)
    w = SnapshotWriter(MemoryTransport(log), SNAPSHOTS, CHANNEL, writer="w")
    m = w.write({P0[0]: rec(4)}, {0: 1, 1: 1}, 2, term=1)
    with capture_logs() as logs:
        c = ChannelClient(MemoryTransport(log), CHANNEL, SNAPSHOTS)
        clients.append(c)
        c.start()
        assert c.wait_ready(10)
    assert c.snapshot is None and c.table.as_dict() == {P0[0]: rec(1)}
    assert {
        "event": "snapshot_ignored",
        "log_level": "error",
        "snapshot": m.id,
        "reason": "its positions are past the end of the channel (re-created topic?)",
    } in logs
    at_end = w.write({P0[0]: rec(4)}, {0: 1, 1: 0}, 2, term=2)
    c2 = ChannelClient(MemoryTransport(log), CHANNEL, SNAPSHOTS)
    clients.append(c2)
    c2.start()
    assert c2.wait_ready(10)
    assert c2.snapshot is not None and c2.snapshot.manifest.id == at_end.id
    assert c2.table.as_dict() == {P0[0]: rec(4)}


def test_a_snapshot_without_a_partition_starts_it_at_offset_0(
    log: MemoryLog, clients: list[ChannelClient]
) -> None:
    """Rule: a partition the snapshot has no position for counts as offset 0: not past the end of an empty
    partition, and read from its start."""
    step(log, P0[0], 1)
    manifest = Manifest(
        schema=1, id="s1", chunks=0, bundles=0, channel=CHANNEL, partitions=2, positions={0: 1},
        ts=0, writer="w", term=1,
    )  # fmt: skip
    log.append(SNAPSHOTS, manifest_key(CHANNEL, 1), msgspec.json.encode(manifest))
    c = ChannelClient(MemoryTransport(log), CHANNEL, SNAPSHOTS)
    clients.append(c)
    c.start()
    assert c.wait_ready(10)
    assert c.snapshot is not None and c.snapshot.manifest.id == "s1"
    step(log, P1[0], 1)
    wait_for(lambda: P1[0] in c.table, message="partition 1 is read from offset 0")
    assert c.table.as_dict() == {P1[0]: rec(1)}


def test_only_a_snapshot_of_this_channel_and_partition_count_is_used(
    log: MemoryLog, clients: list[ChannelClient]
) -> None:
    """Rule: a newer snapshot of another channel, or of this channel with another partition count, is
    passed over for the newest one of this channel with its partition count."""
    step(log, P0[0], 1)
    t = MemoryTransport(log)
    mine = SnapshotWriter(t, SNAPSHOTS, CHANNEL, writer="w").write({P0[0]: rec(1)}, {0: 1, 1: 0}, 2, term=1)
    SnapshotWriter(t, SNAPSHOTS, "other", writer="w").write({P0[0]: rec(4)}, {0: 1, 1: 0}, 2, term=2)
    SnapshotWriter(t, SNAPSHOTS, CHANNEL, writer="w").write({P0[0]: rec(4)}, {0: 1, 1: 0, 2: 0}, 3, term=3)
    c = ChannelClient(MemoryTransport(log), CHANNEL, SNAPSHOTS)
    clients.append(c)
    c.start()
    assert c.wait_ready(10)
    assert c.snapshot is not None and c.snapshot.manifest.id == mine.id
    assert c.table.as_dict() == {P0[0]: rec(1)}


# ------------------------------------------------------------------------------------ gaps


def test_a_gap_at_start_makes_the_node_unready_with_the_gap_as_its_reason(log: MemoryLog) -> None:
    """Rule: a history gap at start is not raised: the node is not ready, says "history gap: <gap>;
    re-bootstrapping from the newest snapshot", counts it, and a daemon thread channel-recover tries at
    once; when no snapshot covers the retained channel it says so, counts a gap again and waits
    max_retry_s (logged as history_gap_unrecovered)."""
    step(log, P0[0], 1)
    step(log, P0[0], 2)
    log.truncate(CHANNEL, 0, 1)
    t = Hooked(log)
    entered, gate = threading.Event(), threading.Event()

    def hold(name: str, topic: str) -> None:
        if name == "channel-recover":
            entered.set()
            assert gate.wait(10)

    t.on_partitions = hold
    c = ChannelClient(t, CHANNEL, SNAPSHOTS, retry_s=60.0, max_retry_s=60.0)
    try:
        with capture_logs() as logs:
            c.start()
            assert entered.wait(10)
            gap = HistoryGap(CHANNEL, 0, 0, 1)
            assert c.health() == (False, f"history gap: {gap}; re-bootstrapping from the newest snapshot")
            err = c.error
            assert isinstance(err, HistoryGap) and c.history_gap
            assert (err.topic, err.partition, err.position, err.low) == (CHANNEL, 0, 0, 1)
            assert c.gaps == 1 and c.recoveries == 0
            assert [th.daemon for th in threads("channel-recover")] == [True]
            gate.set()
            want = (
                f"history gap not covered by any snapshot: {gap}; waiting for a snapshot that covers "
                "the retained channel"
            )
            wait_for(lambda: c.health()[1] == want, message=lambda: str(c.health()))
        assert c.status()["history_gaps"] == 2 and c.recoveries == 1
        assert c.status()["last_error"] == repr(gap) and c.health()[0] is False
        assert {
            "event": "channel_recovering",
            "log_level": "warning",
            "reason": f"history gap: {gap}; re-bootstrapping from the newest snapshot",
            "attempt": 1,
        } in logs
        assert {
            "event": "history_gap_unrecovered",
            "log_level": "error",
            "error": str(gap),
            "retry_s": 60.0,
        } in logs
    finally:
        gate.set()
        c.stop()


def test_a_gap_while_following_is_recovered_at_once_from_a_covering_snapshot(log: MemoryLog) -> None:
    """Rule: a history gap while following makes the node unready ("history gap: ..."), counts it, and
    the recovery starts at once (not after retry_s) from a snapshot that covers the retained channel;
    on_ready runs again; the recovery thread then ends. Each later gap is counted too."""
    for b in P0[:2]:
        step(log, b, 1)
    t = Hooked(log)
    recovering: list[float] = []
    t.on_partitions = lambda name, topic: (
        recovering.append(time.monotonic()) if name == "channel-recover" else None
    )
    ready_calls: list[int] = []
    c = ChannelClient(
        t, CHANNEL, SNAPSHOTS, retry_s=60.0, max_retry_s=60.0, on_ready=lambda tb: ready_calls.append(len(tb))
    )
    try:
        c.start()
        assert c.wait_ready(10)
        w = SnapshotWriter(MemoryTransport(log), SNAPSHOTS, CHANNEL, writer="w")
        for n, b in enumerate(P0[2:4], start=1):
            with log._cond:  # written and deleted before the follower reads it: a history gap
                step(log, b, 1)
                states, _ = c.table.snapshot()
                w.write({**states, b: rec(1)}, {0: 2 + n, 1: 0}, 2, term=n)
                log.truncate(CHANNEL, 0, 2 + n)
                t0 = time.monotonic()

            def called(k: int = n + 1) -> bool:
                return len(ready_calls) == k

            wait_for(called, message=lambda: f"{c.health()} {ready_calls}")
            assert recovering[-1] - t0 < 1.0
            assert c.gaps == n and c.recoveries == n and c.health() == (True, "ready")
            wait_for(lambda: not threads("channel-recover"), message="the recovery thread ends")
        assert ready_calls == [2, 3, 4]
        assert c.status()["history_gaps"] == 2 and c.status()["recoveries"] == 2
        assert c.status()["last_error"] == repr(HistoryGap(CHANNEL, 0, 3, 4))
        assert c.table.as_dict() == {b: rec(1) for b in P0}
    finally:
        c.stop()


# ------------------------------------------------------------------------------------ failures


def test_a_failed_recovery_is_retried_with_doubling_backoff_up_to_max_retry_s(log: MemoryLog) -> None:
    """Rule: after a follower failure ("channel follower stopped: <error!r>; restarting") the first try
    waits retry_s; each failed try ("channel recovery failed: <error!r>; retrying", logged as
    channel_recovery_failed) doubles the wait, up to max_retry_s; the next try that works makes the node
    ready again."""
    step(log, P0[0], 1)
    t = Hooked(log)
    tries: list[tuple[float, tuple[bool, str], BaseException | None]] = []
    fails = [TransportError(f"down {i}") for i in range(3)]

    def flaky(name: str, topic: str) -> None:
        if name == "channel-recover" and topic == CHANNEL:
            tries.append((time.monotonic(), c.health(), c.error))
            if len(tries) <= len(fails):
                raise fails[len(tries) - 1]

    t.on_partitions = flaky
    c = ChannelClient(t, CHANNEL, SNAPSHOTS, retry_s=0.125, max_retry_s=0.5)
    boom = RuntimeError("a bug in a listener")
    failed_at: list[float] = []

    def listener(key: str, _old: Record | None, _new: Record | None) -> None:
        if not failed_at:
            failed_at.append(time.monotonic())
            raise boom

    try:
        with capture_logs() as logs:
            c.start()
            assert c.wait_ready(10)
            c.table.add_listener(listener)
            step(log, P0[0], 2)
            wait_for(lambda: len(tries) == 4 and c.ready, message=lambda: f"{c.health()} {len(tries)}")
        assert (
            tries[0][1] == (False, f"channel follower stopped: {boom!r}; restarting") and tries[0][2] is boom
        )
        for i, e in enumerate(fails):
            assert tries[i + 1][1] == (False, f"channel recovery failed: {e!r}; retrying")
            assert tries[i + 1][2] is e
            assert {"event": "channel_recovery_failed", "log_level": "error", "error": repr(e)} in logs
        gaps = [tries[0][0] - failed_at[0]] + [b[0] - a[0] for a, b in itertools.pairwise(tries)]
        assert [g >= want for g, want in zip(gaps, [0.125, 0.25, 0.5, 0.5], strict=True)] == [True] * 4, gaps
        assert c.recoveries == 1 and c.gaps == 0 and c.health() == (True, "ready")
    finally:
        c.stop()


def test_a_changed_partition_count_is_refused_by_the_recovery(log: MemoryLog) -> None:
    """Rule: a recovery that finds the channel with another partition count does not bootstrap: the node
    stays unready and says the count must never change."""
    step(log, P0[0], 1)
    t = Hooked(log)
    c = ChannelClient(t, CHANNEL, SNAPSHOTS, retry_s=0.0, max_retry_s=60.0)
    try:
        c.start()
        assert c.wait_ready(10)
        t.count = 3
        follower = c.follower
        assert follower is not None
        c.table.add_listener(lambda *_: (_ for _ in ()).throw(RuntimeError("x")))
        step(log, P0[0], 2)
        e = TransportError(
            f"{CHANNEL} now has 3 partitions, not 2: the channel partition count must never change "
            "(replicas would diverge); restore it"
        )
        want = (False, f"channel recovery failed: {e!r}; retrying")
        wait_for(lambda: c.health() == want, message=lambda: str(c.health()))
        assert repr(c.error) == repr(e) and c.recoveries == 0
    finally:
        c.stop()


class HeldRecovery(ChannelClient):
    """Holds the recovery thread after its first bootstrap until ``release`` is set: a thread descheduled
    just after it started a follower."""

    def __init__(self, transport: MemoryTransport, retry_s: float) -> None:
        super().__init__(transport, CHANNEL, SNAPSHOTS, retry_s=retry_s, max_retry_s=60.0)
        self.held, self.release = threading.Event(), threading.Event()

    def _bootstrap(self, partitions: int) -> None:
        super()._bootstrap(partitions)
        if threading.current_thread().name == "channel-recover" and not self.release.is_set():
            self.held.set()
            assert self.release.wait(10)


@pytest.mark.parametrize(
    ("failure", "retry_s", "least", "most"), [("gap", 60.0, 0.0, 1.0), ("error", 0.25, 0.25, 60.0)]
)
def test_a_follower_failing_before_its_recovery_returned_is_retried_like_any_other(
    log: MemoryLog, failure: str, retry_s: float, least: float, most: float
) -> None:
    """Rule: when the follower a recovery just started fails before the recovery returned, the recovery
    goes round again: at once after a history gap, after retry_s after any other failure."""
    step(log, P0[0], 1)
    t = Hooked(log)
    armed = threading.Event()
    tries: list[float] = []

    def partitions(name: str, topic: str) -> None:
        if name == "channel-recover" and topic == CHANNEL:
            tries.append(time.monotonic())
        if name == "follow-channel" and armed.is_set():
            armed.clear()
            raise HistoryGap(CHANNEL, 0, 0, 1) if failure == "gap" else TransportError("refused")

    c = HeldRecovery(t, retry_s)
    try:
        c.start()
        assert c.wait_ready(10)
        t.on_partitions = partitions
        with log._cond:  # a gap while following: the recovery starts at once
            step(log, P0[0], 2)
            log.truncate(CHANNEL, 0, 2)
            SnapshotWriter(MemoryTransport(log), SNAPSHOTS, CHANNEL, writer="w").write(
                {P0[0]: rec(2)}, {0: 2, 1: 0}, 2, term=1
            )
            armed.set()
        assert c.held.wait(10)
        wait_for(
            lambda: (
                (not armed.is_set() and c.error is not None and not isinstance(c.error, HistoryGap))
                or (failure == "gap" and c.gaps == 2)
            ),
            message=lambda: str(c.health()),
        )
        released = time.monotonic()
        c.release.set()
        wait_for(lambda: len(tries) == 2, 10, message=lambda: str(c.health()))
        assert least <= tries[1] - released < most
        assert c.wait_ready(10) and c.recoveries == 2
    finally:
        c.release.set()
        c.stop()


# ------------------------------------------------------------------------------------ lag


def test_the_lag_counts_per_partition_up_to_the_ends_read(
    log: MemoryLog, clients: list[ChannelClient]
) -> None:
    """Rule: with the ends thread (a daemon named channel-ends, reading each end with ENDS_TIMEOUT_S) the
    lag is, per partition, the end read (or the end seen at start when it could not be read) less the
    position, never below 0; an end that cannot be read is logged as channel_ends_unread."""
    step(log, P0[0], 1)
    t = Hooked(log)
    timeouts: list[float] = []
    down = TransportError("partition 1 unreadable")

    def ends(name: str, topic: str, partition: int, timeout_s: float) -> None:
        if name == "channel-ends":
            timeouts.append(timeout_s)
            if partition == 1:
                raise down

    t.on_watermarks = ends
    with capture_logs() as logs:
        c = ChannelClient(t, CHANNEL, SNAPSHOTS, ends_every_s=0.02)
        clients.append(c)
        c.start()
        assert c.wait_ready(10)
        assert [th.daemon for th in threads("channel-ends")] == [True]
        follower = c.follower
        assert follower is not None
        follower.stop()
        with log._cond:  # all three at once: the ends read go from 1 to 4
            for b in P0[1:4]:
                step(log, b, 1)
        wait_for(lambda: c.lag() == 3, 5, message=lambda: f"lag {c.lag()}")
    assert set(timeouts) == {1.0}
    assert {"event": "channel_ends_unread", "log_level": "debug", "partition": 1, "error": str(down)} in logs


def test_the_lag_while_the_follower_prepares_counts_from_offset_0(
    log: MemoryLog, clients: list[ChannelClient]
) -> None:
    """Rule: a partition whose end the follower has seen but whose position it has not set yet counts
    from offset 0."""
    for b in P0[:3]:
        step(log, b, 1)
    t = Hooked(log)
    gate = threading.Event()
    ends_reads: list[int] = []

    def hold(name: str, topic: str, partition: int, timeout_s: float) -> None:
        if name == "follow-channel" and partition == 1:
            assert gate.wait(10)
        if name == "channel-ends":
            ends_reads.append(partition)

    t.on_watermarks = hold
    c = ChannelClient(t, CHANNEL, SNAPSHOTS, ends_every_s=0.02)
    clients.append(c)
    try:
        c.start()
        assert c.health() == (False, "catching up with the channel")
        wait_for(lambda: len(ends_reads) >= 4, 5, message="the ends are read")
        assert c.lag() == 3
        assert c.health() == (False, "catching up with the channel")
    finally:
        gate.set()
    assert c.wait_ready(10)


# ------------------------------------------------------------------------------------ stop


def test_stop_stops_the_follower_and_waits_for_a_read_of_the_ends(log: MemoryLog) -> None:
    """Rule: stop() stops the follower and waits for a read of the ends in flight: neither runs after it
    returns."""
    step(log, P0[0], 1)
    t = Hooked(log)
    c = ChannelClient(t, CHANNEL, SNAPSHOTS, ends_every_s=0.02)
    entered, never = threading.Event(), threading.Event()

    def slow_ends(name: str, topic: str, partition: int, timeout_s: float) -> None:
        if name == "channel-ends":
            entered.set()
            c._stopping.wait(10)
            never.wait(0.25)  # a read of the ends still in flight when stop() begins

    try:
        c.start()
        assert c.wait_ready(10)
        follower = c.follower
        assert follower is not None and follower.running
        t.on_watermarks = slow_ends
        assert entered.wait(10)
    finally:
        c.stop()
    assert not follower.running and threads("channel-ends") == []


def test_stop_waits_for_a_recovery_at_work(log: MemoryLog) -> None:
    """Rule: stop() waits for a recovery at work: it does not run after stop() returns."""
    step(log, P0[0], 1)
    t = Hooked(log)
    c = ChannelClient(t, CHANNEL, SNAPSHOTS, retry_s=0.0, max_retry_s=60.0)
    entered, never = threading.Event(), threading.Event()

    def slow_recovery(name: str, topic: str) -> None:
        if name == "channel-recover":
            entered.set()
            c._stopping.wait(10)
            never.wait(0.25)  # a recovery still at work when stop() begins
            raise TransportError("gone")

    try:
        c.start()
        assert c.wait_ready(10)
        t.on_partitions = slow_recovery
        c.table.add_listener(lambda *_: (_ for _ in ()).throw(RuntimeError("x")))
        step(log, P0[0], 2)
        assert entered.wait(10)
    finally:
        c.stop()
    assert threads("channel-recover") == []


def test_stop_waits_two_seconds_for_a_read_of_the_ends_and_no_longer(log: MemoryLog) -> None:
    """Rule: stop() waits ENDS_TIMEOUT_S + 1 s (2 s) for a read of the ends in flight, then returns (a
    read of 2.5 s is still running when it does)."""
    t = Hooked(log)
    c = ChannelClient(t, CHANNEL, SNAPSHOTS, ends_every_s=0.02)
    entered, never = threading.Event(), threading.Event()

    def slow(name: str, topic: str, partition: int, timeout_s: float) -> None:
        if name == "channel-ends":
            entered.set()
            c._stopping.wait(10)
            never.wait(2.5)  # the read in flight lasts 2.5 s from stop()

    try:
        c.start()
        assert c.wait_ready(10)
        t.on_watermarks = slow
        assert entered.wait(10)
    finally:
        t0 = time.monotonic()
        c.stop()
        took = time.monotonic() - t0
        alive = [th.is_alive() for th in threads("channel-ends")]
        wait_for(lambda: not threads("channel-ends"), 10, message="the read ends")
    assert alive == [True] and took >= 2.0


def test_stop_waits_five_seconds_for_a_recovery_and_no_longer(log: MemoryLog) -> None:
    """Rule: stop() waits 5 s for a recovery at work, then returns (a recovery step of 5.5 s is still
    running when it does)."""
    step(log, P0[0], 1)
    t = Hooked(log)
    c = ChannelClient(t, CHANNEL, SNAPSHOTS, retry_s=0.0, max_retry_s=60.0)
    entered, never = threading.Event(), threading.Event()

    def slow(name: str, topic: str) -> None:
        if name == "channel-recover":
            entered.set()
            c._stopping.wait(10)
            never.wait(5.5)  # the recovery step lasts 5.5 s from stop()
            raise TransportError("gone")

    try:
        c.start()
        assert c.wait_ready(10)
        t.on_partitions = slow
        c.table.add_listener(lambda *_: (_ for _ in ()).throw(RuntimeError("x")))
        step(log, P0[0], 2)
        assert entered.wait(10)
    finally:
        t0 = time.monotonic()
        c.stop()
        took = time.monotonic() - t0
        alive = [th.is_alive() for th in threads("channel-recover")]
        wait_for(lambda: not threads("channel-recover"), 10, message="the recovery ends")
    assert alive == [True] and took >= 5.0


# ------------------------------------------------------------------------------------ writing


class Refusing(MemoryTransport):
    def __init__(self, log: MemoryLog, err: TransportError) -> None:
        super().__init__(log)
        self.err = err

    def produce(
        self, topic: str, key: bytes, value: bytes | None, *, partition: int | None = None
    ) -> Future[Message]:
        raise self.err

    def send(self, topic: str, key: bytes, value: bytes | None, on_done: Delivered) -> None:
        raise self.err


def test_publish_appends_the_encoded_record_under_the_bundle(log: MemoryLog) -> None:
    """Rule: publish and send write the encoded record (None: a tombstone) under the bundle's name to the
    channel; publish's future gives the message, send's callback None."""
    c = ChannelClient(MemoryTransport(log), CHANNEL, SNAPSHOTS)
    msg = c.publish(P0[0], rec(1)).result(5)
    assert msg == Message(P0[0].encode(), encode(rec(1)), 0, 0)
    assert c.publish(P0[0], None).result(5) == Message(P0[0].encode(), None, 0, 1)
    done: list[TransportError | None] = []
    c.send(P1[0], rec(2), done.append)
    c.send(P1[0], None, done.append)
    assert done == [None, None]
    assert [(m.key, m.value, m.partition) for m in log.messages(CHANNEL)] == [
        (P0[0].encode(), encode(rec(1)), 0),
        (P0[0].encode(), None, 0),
        (P1[0].encode(), encode(rec(2)), 1),
        (P1[0].encode(), None, 1),
    ]


def test_a_write_the_transport_refuses_is_reported_not_raised(log: MemoryLog) -> None:
    """Rule: a TransportError raised by the transport is given back: as publish's future's exception, as
    send's callback's argument -- never raised."""
    err = TransportError("refused")
    c = ChannelClient(Refusing(log, err), CHANNEL, SNAPSHOTS)
    fut = c.publish(P0[0], rec(1))
    assert fut.exception(5) is err
    done: list[TransportError | None] = []
    with capture_logs() as logs:
        c.send(P0[0], rec(1), done.append)
    assert done == [err] and done[0] is err and logs == []

    def broken(e: TransportError | None) -> None:
        raise ValueError("callback broke")

    with capture_logs() as logs:
        c.send(P0[0], rec(1), broken)
    assert logs == [
        {"event": "delivery_report_failed", "log_level": "error", "topic": CHANNEL, "exc_info": True}
    ]


def test_publish_acked_returns_the_message_or_times_out(log: MemoryLog) -> None:
    """Rule: publish_acked gives the acknowledged message, and TimeoutError after timeout_s when no
    acknowledgement comes."""
    c = ChannelClient(MemoryTransport(log), CHANNEL, SNAPSHOTS)

    async def both() -> tuple[Message, BaseException | None, float]:
        msg = await asyncio.wait_for(c.publish_acked(P1[0], rec(1), 5.0), 10)
        never: Future[Message] = Future()
        c.transport.produce = lambda *a, **k: never  # type: ignore[method-assign]
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(c.publish_acked(P1[0], rec(1), 0.125), 5)
        except TimeoutError as e:
            return msg, e, time.monotonic() - t0
        return msg, None, 0.0

    msg, err, took = asyncio.run(both())
    assert msg == Message(P1[0].encode(), encode(rec(1)), 1, 0)
    assert isinstance(err, TimeoutError) and 0.125 <= took < 2.5
