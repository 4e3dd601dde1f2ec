"""Replay of random channel logs against the independent reference model (docs/design.md 3.3).

The logs mix plausible flows (assign, transfer, unload, split and child claims, overrides, tombstones,
re-created bundles) with racing and stale writers, duplicates, garbage values, bad keys and records in the
wrong partition; see strategies.channel_logs.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import ChannelLog, Oracle, channel_logs, deliveries, table_json

from trimtab.channel.records import Record
from trimtab.channel.table import TableView, replay

# Big generated logs: slow to generate on a loaded CI machine, and that is fine.
SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=SLOW_OK)
partition_counts = st.one_of(st.none(), st.integers(1, 3))


def key_text(key: bytes | None) -> str | None:
    try:
        return None if key is None else key.decode("utf-8")
    except UnicodeDecodeError:
        return None


def expected_owner(d: dict[str, Any]) -> str | None:
    if d["state"] == "owned":
        return d["dst"]
    if d["state"] in ("splitting", "merging"):  # the source serves while it splits or merges
        return d["src"]
    return None


@SETTINGS
@given(data=st.data())
def test_replay_matches_reference_model_after_every_message(data: st.DataObject) -> None:
    log: ChannelLog = data.draw(channel_logs(partition_counts))
    stream = data.draw(deliveries(log))
    live_at = data.draw(st.integers(0, len(stream)))

    skips: list[tuple[str | None, int | None, int | None, str]] = []
    view = TableView(log.partitions, on_skip=lambda *a: skips.append(a))
    calls: list[tuple[str, Record | None, Record | None]] = []
    view.add_listener(lambda k, old, new: calls.append((k, old, new)))
    oracle = Oracle(log.partitions)
    outcomes: Counter[str] = Counter()

    for i, msg in enumerate(stream):
        if i == live_at:
            view.set_live()
        before = dict(oracle.table)
        n_calls, n_skips = len(calls), len(skips)
        expected, reason = oracle.apply(*msg)
        got = view.apply(*msg)
        outcomes[got] += 1

        assert got == expected, (i, msg)
        # The table is exactly the reference table: nothing unreachable by valid transitions gets in.
        assert table_json(view.items()) == oracle.table, (i, msg)
        # Safety: every bundle has at most one owner, and it is the one the reference model says.
        for name, r in view.items():
            assert r.owner() == expected_owner(oracle.table[name])
        # Skips are reported once, with the reference model's reason.
        if expected == "skipped":
            assert skips[n_skips:] == [(key_text(msg[0]), msg[2], msg[3], reason)]
        else:
            assert len(skips) == n_skips
        # Listeners hear exactly the accepted changes once the table is live, with (old, new).
        new_calls = calls[n_calls:]
        if expected == "accepted" and i >= live_at:
            assert len(new_calls) == 1
            key, old, new = new_calls[0]
            assert msg[0] is not None and key == msg[0].decode()
            assert (old.to_json() if old else None) == before.get(key)
            assert (new.to_json() if new else None) == oracle.table.get(key)
        else:
            assert new_calls == []

    stats = view.stats.as_dict()
    assert stats["accepted"] == outcomes["accepted"]
    assert stats["rejected"] == outcomes["rejected"]
    assert stats["skipped"] == outcomes["skipped"]
    non_duplicates = len({(m[2], m[3]) for m in stream}) if log.partitions is not None else len(stream)
    assert stats["accepted"] + stats["rejected"] + stats["skipped"] == non_duplicates


@SETTINGS
@given(data=st.data())
def test_replay_is_deterministic_across_interleavings_and_batching(data: st.DataObject) -> None:
    """Two replicas reading the same channel (partitions interleaved differently, with re-deliveries, one
    in one batch and one message by message) end with identical tables and stats."""
    log: ChannelLog = data.draw(channel_logs(partition_counts))
    a = data.draw(deliveries(log))
    b = data.draw(deliveries(log))

    batch = replay(a, log.partitions)
    single = TableView(log.partitions)
    for m in b:
        single.apply(*m)
    again = replay(a, log.partitions)

    assert batch.as_dict() == single.as_dict() == again.as_dict()
    assert batch.stats.as_dict() == single.stats.as_dict() == again.stats.as_dict()
    assert batch.stats.detail() == again.stats.detail()

    reference = Oracle(log.partitions)
    for m in log.in_partition_order():
        reference.apply(*m)
    assert table_json(batch.items()) == reference.table


@settings(max_examples=100, deadline=None, suppress_health_check=SLOW_OK)
@given(data=st.data())
def test_accepted_versions_move_by_exactly_one(data: st.DataObject) -> None:
    """Per bundle, accepted records go v -> v+1, start at 1 from Init, and tombstones only follow
    Free/Deleted: at most one record of a version is ever accepted after a given state."""
    log: ChannelLog = data.draw(channel_logs(partition_counts))
    view = TableView(log.partitions)
    view.set_live()
    changes: list[tuple[str, Record | None, Record | None]] = []
    view.add_listener(lambda k, old, new: changes.append((k, old, new)))
    view.apply_all(log.in_partition_order())
    assert len(changes) == view.stats.accepted
    for _key, old, new in changes:
        if new is None:
            assert old is not None and old.state.value in ("free", "deleted")
        elif old is None:
            assert new.version == 1
        else:
            assert new.version == old.version + 1


@settings(max_examples=60, deadline=None, suppress_health_check=SLOW_OK)
@given(log=channel_logs(st.integers(2, 3)))
def test_wrong_partition_and_duplicates_never_change_the_table(log: ChannelLog) -> None:
    """Dropping every wrong-partition record and re-delivering every message gives the same table."""
    assert log.partitions is not None
    homes = [m for m in log.messages if Oracle(log.partitions).apply(*m)[1] != "wrong_partition"]
    clean = replay(homes, log.partitions)
    reasons: Counter[str] = Counter()
    noisy = TableView(log.partitions, on_skip=lambda k, p, o, reason: reasons.update([reason]))
    outcomes = Counter(noisy.apply(*m) for m in [*log.messages, *log.messages])
    assert noisy.as_dict() == clean.as_dict()
    assert outcomes["duplicate"] == len(log.messages)
    assert reasons["wrong_partition"] == len(log.messages) - len(homes)
