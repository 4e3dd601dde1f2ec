"""Replay-table rules that the other table tests leave loose (channel/table.py; docs/testing.md)."""

from __future__ import annotations

from trimtab.channel.records import MAX_RECORD_BYTES, Record, State, encode, make
from trimtab.channel.table import TableView, partition_for

K = "t/ns/0x00000000_0x80000000"
A = "a:1"
PARTS = 4
HOME = partition_for(K.encode(), PARTS)
AWAY = (HOME + 1) % PARTS

Skipped = tuple[str | None, int | None, int | None, str]
Heard = tuple[str, Record | None, Record | None]


def rec(version: int = 1) -> Record:
    return make(State.ASSIGNING if version == 1 else State.OWNED, version=version, ts=0, writer="w", dst=A)


def wire(record: Record) -> bytes:
    raw = encode(record)
    assert raw is not None
    return raw


def spaced(record: Record, size: int) -> bytes:
    """The record's wire value padded with whitespace before its closing brace to exactly ``size`` bytes:
    valid JSON of the same record, which the fast decoder reads at any length."""
    raw = wire(record)
    value = raw[:-1] + b" " * (size - len(raw)) + b"}"
    assert len(value) == size
    return value


def recording_view(partitions: int | None = PARTS) -> tuple[TableView, list[Skipped]]:
    seen: list[Skipped] = []

    def hook(key: str | None, partition: int | None, offset: int | None, reason: str) -> None:
        seen.append((key, partition, offset, reason))

    return TableView(partitions, on_skip=hook), seen


def test_a_fresh_table_has_no_last_outcome() -> None:
    """Rule: before any message is applied the last outcome is empty -- none of accepted, rejected,
    skipped or duplicate."""
    assert TableView().last_outcome == ""


def test_the_skip_hook_hears_partition_and_offset_of_a_message_without_key() -> None:
    """Rule: a message without a key is skipped as bad_key, and the skip hook hears its partition and
    offset (the key as None)."""
    view, seen = recording_view()
    assert view.apply(None, wire(rec()), HOME, 7) == "skipped"
    assert seen == [(None, HOME, 7, "bad_key")]
    assert view.stats.skipped == {"bad_key": 1}
    assert view.positions == {HOME: 8}


def test_the_skip_hook_hears_partition_and_offset_of_a_key_that_is_not_utf8() -> None:
    """Rule: a key that is not UTF-8 is skipped as bad_key, and the skip hook hears its partition and
    offset (the key as None: it has no text)."""
    view, seen = recording_view(partitions=None)
    assert view.apply(b"\xff\xfe", wire(rec()), 3, 5) == "skipped"
    assert seen == [(None, 3, 5, "bad_key")]
    assert view.stats.skipped == {"bad_key": 1}


def test_the_skip_hook_hears_name_partition_and_offset_of_a_key_that_is_not_a_bundle() -> None:
    """Rule: a UTF-8 key that is not a bundle name is skipped as bad_key in its home partition, and the
    skip hook hears the key's text, its partition and its offset."""
    name = "not-a-bundle"
    part = partition_for(name.encode(), PARTS)
    view, seen = recording_view()
    assert view.apply(name.encode(), wire(rec()), part, 11) == "skipped"
    assert seen == [(name, part, 11, "bad_key")]
    assert view.stats.skipped == {"bad_key": 1}
    assert name not in view


def test_the_skip_hook_hears_name_partition_and_offset_of_a_stray_record() -> None:
    """Rule: a record outside its key's home partition is skipped as wrong_partition; the skip hook hears
    the key, the partition it was found in and its offset."""
    view, seen = recording_view()
    assert view.apply(K.encode(), wire(rec()), AWAY, 2) == "skipped"
    assert seen == [(K, AWAY, 2, "wrong_partition")]
    assert K not in view


def test_a_partition_without_offset_is_applied_and_not_tracked() -> None:
    """Rule: the once-per-offset rule needs both a partition and an offset: a message with a partition and
    no offset is applied and moves no position."""
    view = TableView(PARTS)
    assert view.apply(K.encode(), wire(rec(1)), HOME, None) == "accepted"
    assert view.apply(K.encode(), wire(rec(2)), HOME, None) == "accepted"
    assert view.positions == {}
    assert view.get(K) == rec(2)


def test_an_offset_without_partition_is_applied_and_not_tracked() -> None:
    """Rule: a message with an offset and no partition is applied (no home-partition check either) and
    moves no position: a later message at a lower offset is still applied."""
    view = TableView(PARTS)
    assert view.apply(K.encode(), wire(rec(1)), None, 5) == "accepted"
    assert view.apply(K.encode(), wire(rec(2)), None, 0) == "accepted"
    assert view.positions == {}
    assert view.get(K) == rec(2)


def test_a_value_over_the_size_limit_is_skipped_even_if_it_reads_as_a_record() -> None:
    """Rule: a value one byte over MAX_RECORD_BYTES is skipped as too_large unread, even when it is a valid
    record (padded with whitespace); exactly MAX_RECORD_BYTES is read and applied."""
    view, seen = recording_view()
    over = spaced(rec(1), MAX_RECORD_BYTES + 1)
    assert view.apply(K.encode(), over, HOME, 0) == "skipped"
    assert seen == [(K, HOME, 0, "too_large")]
    assert K not in view
    at = spaced(rec(1), MAX_RECORD_BYTES)
    assert view.apply(K.encode(), at, HOME, 1) == "accepted"
    assert view.get(K) == rec(1)
    assert view.stats.as_dict() == {"accepted": 1, "rejected": 0, "skipped": 1}


def test_load_leaves_the_table_not_live_and_listeners_silent() -> None:
    """Rule: installing a snapshot makes a live table not live (live is False): records applied after it
    reach no listener until set_live."""
    view = TableView(PARTS)
    heard: list[Heard] = []
    view.add_listener(lambda k, old, new: heard.append((k, old, new)))
    view.set_live()
    view.load({}, {HOME: 0})
    assert view.live is False
    assert view.apply(K.encode(), wire(rec(1)), HOME, 0) == "accepted"
    assert heard == []
    view.set_live()
    assert view.live is True
    assert view.apply(K.encode(), wire(rec(2)), HOME, 1) == "accepted"
    assert heard == [(K, rec(1), rec(2))]


def test_generation_counts_loads_one_by_one() -> None:
    """Rule: the generation starts at 0 and each load adds exactly 1 (the table was replaced whole)."""
    view = TableView()
    assert view.generation == 0
    view.load({}, {})
    assert view.generation == 1
    view.load({K: rec(1)}, {HOME: 1})
    assert view.generation == 2
    assert view.get(K) == rec(1)
    assert view.positions == {HOME: 1}
