"""The table view: replay in log order, skips, partitions, offsets and listeners (examples)."""

from __future__ import annotations

import zlib
from typing import Any

import pytest

from trimtab.channel.records import Record, State, encode, make
from trimtab.channel.table import ReplayStats, TableView, partition_for, replay

K = "t/ns/0x00000000_0x80000000"
K2 = "t/ns/0x80000000_0xffffffff"
A, B = "a:1", "b:2"


def r(state: State, version: int, **kw: Any) -> Record:
    return make(state, version=version, ts=0, writer=kw.pop("writer", "w"), **kw)


Msg = tuple[bytes | None, bytes | None, int | None, int | None]


def msg(
    key: str | bytes | None,
    rec: Record | bytes | None,
    partition: int | None = None,
    offset: int | None = None,
) -> Msg:
    k = key.encode() if isinstance(key, str) else key
    v = rec if isinstance(rec, bytes) or rec is None else encode(rec)
    return (k, v, partition, offset)


def home(key: str, partitions: int) -> int:
    return zlib.crc32(key.encode()) % partitions


def test_assign_transfer_unload_split() -> None:
    view = TableView()
    steps = [
        (K, r(State.ASSIGNING, 1, dst=A), "accepted"),
        (K, r(State.OWNED, 2, dst=A), "accepted"),
        (K, r(State.OWNED, 2, dst=B), "rejected"),  # a racing writer, same version
        (K, r(State.RELEASING, 3, src=A, dst=B), "accepted"),
        (K, r(State.ASSIGNING, 4, src=A, dst=B), "accepted"),
        (K, r(State.OWNED, 5, src=A, dst=B), "accepted"),
        (
            K,
            r(State.SPLITTING, 6, src=B, children={"0x00000000_0x40000000": B, "0x40000000_0x80000000": B}),
            "accepted",
        ),
        ("t/ns/0x00000000_0x40000000", r(State.OWNED, 1, dst=B), "accepted"),
        ("t/ns/0x40000000_0x80000000", r(State.OWNED, 1, dst=B), "accepted"),
        (K, r(State.DELETED, 7, src=B), "accepted"),
        (K, None, "accepted"),
        (K, None, "rejected"),  # nothing to delete
        (K, r(State.ASSIGNING, 1, dst=A), "accepted"),  # re-created from version 1
    ]
    for key, rec, outcome in steps:
        assert view.apply(*msg(key, rec)) == outcome, (key, rec)
    assert view.get(K) == r(State.ASSIGNING, 1, dst=A)
    assert view.get("t/ns/0x00000000_0x40000000") == r(State.OWNED, 1, dst=B)
    assert len(view) == 3 and K in view and K2 not in view
    assert sorted(k for k, _ in view.owned_by(B)) == [
        "t/ns/0x00000000_0x40000000",
        "t/ns/0x40000000_0x80000000",
    ]
    assert list(view.owned_by(A)) == []
    assert view.stats.as_dict() == {"accepted": 11, "rejected": 2, "skipped": 0}
    assert view.stats.detail()["rejected_by_reason"] == {"stale_version": 1, "invalid_transition": 1}


def test_splitting_uses_the_key_range_for_children() -> None:
    view = TableView()
    view.apply(*msg(K2, r(State.ASSIGNING, 1, dst=A)))
    view.apply(*msg(K2, r(State.OWNED, 2, dst=A)))
    # Children that tile K (not K2) are refused for K2.
    wrong = r(State.SPLITTING, 3, src=A, children={"0x00000000_0x40000000": A, "0x40000000_0x80000000": A})
    assert view.apply(*msg(K2, wrong)) == "rejected"
    right = r(State.SPLITTING, 3, src=A, children={"0x80000000_0xc0000000": A, "0xc0000000_0xffffffff": A})
    assert view.apply(*msg(K2, right)) == "accepted"


@pytest.mark.parametrize(
    "value,reason",
    [
        (b"not json", "malformed"),
        (b"[]", "malformed"),
        (b'{"schema":2,"state":"owned"}', "future_schema"),
        (b'{"schema":1,"state":"migrating"}', "unknown_state"),
        (b'{"x":' + b"[" * 5000 + b"]" * 5000 + b"}", "too_deep"),
        (b'{"x":' + b"[" * 300 + b"]" * 300 + b"}", "too_deep"),
        (b'{"x":' + b"[" * 40_000 + b"]" * 40_000 + b"}", "too_large"),
        (
            b'{"schema":1,"state":"assigning","dst":"br\xc3","src":null,"version":1,"force":false,"ts":1,"writer":"w"}',
            "invalid_utf8",
        ),
        (b'\xef\xbb\xbf{"schema":1}', "bom"),
        (b'{"schema":1,"schema":2,"state":"owned"}', "future_schema"),  # a repeated name: the last counts
        (b'{"schema":1,"ts":9223372036854775808}', "int_out_of_range"),
        (b'{"schema":1,"w":"\\udc00"}', "lone_surrogate"),
    ],
)
def test_bad_values_are_skipped(value: bytes, reason: str) -> None:
    seen: list[tuple[Any, ...]] = []
    view = TableView(on_skip=lambda *a: seen.append(a))
    assert view.apply(K.encode(), value) == "skipped"
    assert seen == [(K, None, None, reason)]
    assert view.stats.skipped == {reason: 1}
    assert len(view) == 0


@pytest.mark.parametrize(
    "key",
    [
        None,
        b"\xff\xfe",
        b"",
        b"orders",
        b"t/ns/0x80000000_0x00000000",
        b"t/ns/0x00000000_0x00000000",
        b"t/ns/0x00000000_0x80000000\n",
        b"t/ns/0X00000000_0X80000000",
    ],
)
def test_bad_keys_are_skipped(key: bytes | None) -> None:
    seen: list[tuple[Any, ...]] = []
    view = TableView(on_skip=lambda *a: seen.append(a))
    assert view.apply(key, encode(r(State.ASSIGNING, 1, dst=A))) == "skipped"
    assert [s[3] for s in seen] == ["bad_key"]
    assert len(view) == 0


def test_duplicates_by_offset_are_ignored() -> None:
    p = home(K, 2)
    view = TableView(partitions=2)
    a1 = msg(K, r(State.ASSIGNING, 1, dst=A), p, 0)
    o2 = msg(K, r(State.OWNED, 2, dst=A), p, 1)
    assert view.apply(*a1) == "accepted"
    assert view.apply(*o2) == "accepted"
    assert view.apply(*a1) == "duplicate"
    assert view.apply(*o2) == "duplicate"
    assert view.positions == {p: 2}
    # Gaps in offsets are fine (transaction markers, compacted-away records elsewhere).
    assert view.apply(*msg(K, r(State.RELEASING, 3, src=A), p, 10)) == "accepted"
    assert view.apply(*msg(K, r(State.FREE, 4, src=A), p, 9)) == "duplicate"
    assert view.positions == {p: 11}
    assert sum(view.stats.as_dict().values()) == 3  # duplicates are not counted anywhere


def test_records_in_the_wrong_partition_are_skipped_for_known_and_unknown_keys() -> None:
    partitions = 3
    p = home(K, partitions)
    wrong = (p + 1) % partitions
    seen: list[tuple[Any, ...]] = []
    view = TableView(partitions=partitions, on_skip=lambda *a: seen.append(a))
    assert view.apply(*msg(K, r(State.ASSIGNING, 1, dst=A), wrong, 0)) == "skipped"
    assert view.apply(*msg(K, r(State.ASSIGNING, 1, dst=A), p, 0)) == "accepted"
    # The key is known now; a stray record in another partition must still be skipped, or replicas that
    # interleave the partitions differently would disagree.
    assert view.apply(*msg(K, r(State.OWNED, 2, dst=A), wrong, 1)) == "skipped"
    assert view.get(K) == r(State.ASSIGNING, 1, dst=A)
    assert [(s[0], s[1], s[2], s[3]) for s in seen] == [
        (K, wrong, 0, "wrong_partition"),
        (K, wrong, 1, "wrong_partition"),
    ]
    # Without offsets (files, tools) there is nothing to check.
    assert view.apply(*msg(K, r(State.OWNED, 2, dst=A))) == "accepted"


def test_wrong_partition_records_do_not_depend_on_interleaving() -> None:
    partitions = 2
    p = home(K, partitions)
    good = [msg(K, r(State.ASSIGNING, 1, dst=A), p, 0)]
    stray = [msg(K, r(State.OWNED, 2, dst=A), 1 - p, 0)]
    assert replay(good + stray, partitions).as_dict() == replay(stray + good, partitions).as_dict()


def test_partition_for_is_crc32_mod_partitions() -> None:
    for key in (K, K2, "x"):
        for n in (1, 2, 7):
            assert partition_for(key.encode(), n) == zlib.crc32(key.encode()) % n


def test_listeners_only_after_live() -> None:
    view = TableView()
    calls: list[tuple[str, Record | None, Record | None]] = []

    def listener(k: str, old: Record | None, new: Record | None) -> None:
        calls.append((k, old, new))

    view.add_listener(listener)
    a1, o2, rel, free = (
        r(State.ASSIGNING, 1, dst=A),
        r(State.OWNED, 2, dst=A),
        r(State.RELEASING, 3, src=A),
        r(State.FREE, 4, src=A),
    )
    view.apply_all([msg(K, a1), msg(K, o2)])
    assert calls == []  # catching up: nobody is told
    view.set_live()
    view.apply_all([msg(K, o2), msg(K, rel), msg(K, b"junk"), msg(K, free), msg(K, None)])
    assert calls == [(K, o2, rel), (K, rel, free), (K, free, None)]
    view.remove_listener(listener)
    view.apply(*msg(K, a1))
    assert len(calls) == 3


def test_load_snapshot_then_tail() -> None:
    p = home(K, 2)
    view = TableView(partitions=2)
    view.load({K: r(State.OWNED, 2, dst=A)}, {p: 5})
    assert view.apply(*msg(K, r(State.RELEASING, 3, src=A), p, 4)) == "duplicate"
    assert view.apply(*msg(K, r(State.RELEASING, 3, src=A), p, 5)) == "accepted"
    assert view.positions == {p: 6}
    assert view.get(K) == r(State.RELEASING, 3, src=A)


def test_items_is_a_copy() -> None:
    view = replay([msg(K, r(State.ASSIGNING, 1, dst=A))])
    items = view.items()
    view.apply(*msg(K, r(State.OWNED, 2, dst=A)))
    assert items == [(K, r(State.ASSIGNING, 1, dst=A))]
    d = view.as_dict()
    d.clear()
    assert len(view) == 1


def test_replay_stats() -> None:
    stats = ReplayStats()
    stats.accepted = 2
    stats.rejected["stale_version"] += 3
    stats.skipped["malformed"] += 1
    stats.skipped["bad_key"] += 1
    assert stats.as_dict() == {"accepted": 2, "rejected": 3, "skipped": 2}
    assert stats.detail() == {
        "accepted": 2,
        "rejected": 3,
        "skipped": 2,
        "rejected_by_reason": {"stale_version": 3},
        "skipped_by_reason": {"malformed": 1, "bad_key": 1},
    }


def test_apply_all_counts_match_outcomes() -> None:
    msgs = [
        msg(K, r(State.ASSIGNING, 1, dst=A)),
        msg(K, r(State.ASSIGNING, 1, dst=B)),
        msg(K, b"{}"),
        msg(None, b"{}"),
        msg(K2, r(State.OWNED, 1, dst=B)),
    ]
    single = TableView()
    outcomes = [single.apply(*m) for m in msgs]
    assert outcomes == ["accepted", "rejected", "skipped", "skipped", "accepted"]
    batch = replay(msgs)
    assert batch.as_dict() == single.as_dict()
    assert batch.stats.detail() == single.stats.detail()
    assert batch.last_outcome == "accepted"
