"""Packed messages (pipeline.packing): every message reaches the bucket its key names, in log order, and
comes back unpacked exactly as it went in -- from an export's reader and from a DataFrame of messages
(the Kafka sources'). The end-to-end equality with ``trimtab channel replay`` is in
test_pipeline_fold_props.py (without Spark) and test_pipeline_spark_props.py (on Spark)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trimtab.channel.replayfile import export_line
from trimtab.pipeline.exportfile import Columns, read_split, read_split_buckets
from trimtab.pipeline.packing import (
    MESSAGE_ARROW,
    MESSAGE_OVERHEAD,
    bucket_of,
    messages_batch,
    pack_columns,
    pack_messages,
    unpack,
)
from trimtab.pipeline.sources import parse_dests

keys = st.one_of(st.none(), st.binary(max_size=12), st.sampled_from([b"t/a/0x0_0x1", b"t/b/0x0_0x1", b""]))


@st.composite
def message_rows(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    """Rows of MESSAGE_ARROW in strictly increasing ``order``, as one reader produces them."""
    n = draw(st.integers(0, 60))
    gaps = draw(st.lists(st.integers(1, 1000), min_size=n, max_size=n))
    order = draw(st.integers(0, 10**9))
    rows = []
    for gap in gaps:
        order += gap
        rows.append(
            (
                draw(keys),
                draw(st.one_of(st.none(), st.binary(max_size=20))),
                draw(st.one_of(st.none(), st.integers(0, 7))),
                draw(st.one_of(st.none(), st.integers(0, 2**40))),
                order,
                draw(st.integers(0, 5)),
                draw(st.booleans()),
            )
        )
    return rows


def regroup(packed: list[pa.RecordBatch], dests: list[int]) -> dict[int, list[tuple[Any, ...]]]:
    """What Spark does with packed rows -- each to its dest's task, sorted by first -- then unpacked."""
    by_dest: dict[int, list[tuple[int, Any]]] = {d: [] for d in dests}
    for b in packed:
        for i in range(b.num_rows):
            dest = b.column(0)[i].as_py()
            assert dest in by_dest, f"a row for an unknown dest {dest}"
            by_dest[dest].append((b.column(1)[i].as_py(), b.slice(i, 1)))
    return {d: list(unpack(rb for _, rb in sorted(rows, key=lambda r: r[0]))) for d, rows in by_dest.items()}


@settings(max_examples=200, deadline=None)
@given(
    batches=st.lists(message_rows(), max_size=5),
    tasks=st.integers(1, 6),
    blob_bytes=st.integers(1, 300),
    data=st.data(),
)
def test_packed_dataframe_messages_reach_their_bucket_in_order(
    batches: list[list[tuple[Any, ...]]], tasks: int, blob_bytes: int, data: st.DataObject
) -> None:
    """pack_messages (the Kafka path's mapInArrow): successive batches of one reader, packed, regrouped
    and unpacked, give each task exactly the messages of its bucket, in the readers' order; no blob holds
    more than blob_bytes but for a single message."""
    # Later batches continue the log: shift each batch's orders past the previous batch's last one.
    shifted: list[list[tuple[Any, ...]]] = []
    base = 0
    for rows in batches:
        if rows:
            offset = base - rows[0][4] + 1
            rows = [(*r[:4], r[4] + offset, *r[5:]) for r in rows]
            base = rows[-1][4]
        shifted.append(rows)
    dests = data.draw(st.permutations(list(range(-3, tasks - 3))))
    # Spark hands mapInArrow its own schema: order and split are never null there.
    spark_schema = pa.schema(
        [f.with_nullable(f.name not in ("order", "split", "bad")) for f in MESSAGE_ARROW]
    )
    arrow = [
        pa.RecordBatch.from_pylist(
            [dict(zip(MESSAGE_ARROW.names, r, strict=True)) for r in rows],
            schema=data.draw(st.sampled_from([MESSAGE_ARROW, spark_schema])),
        )
        for rows in shifted
    ]
    packed = list(pack_messages(dests, blob_bytes)(iter(arrow)))
    got = regroup(packed, dests)
    every = [r for rows in shifted for r in rows]
    for i, d in enumerate(dests):
        assert got[d] == [r for r in every if bucket_of(r[0], tasks) == i]
    # One packed batch per non-empty input batch; each blob within its bound.
    assert len(packed) == sum(1 for rows in shifted if rows)
    for b in packed:
        for blob in b.column(2):
            msgs = list(unpack([pa.RecordBatch.from_pylist([{"dest": 0, "first": 0, "blob": blob.as_py()}])]))
            size = sum(len(m[0] or b"") + len(m[1] or b"") + MESSAGE_OVERHEAD for m in msgs)
            assert len(msgs) == 1 or size <= blob_bytes


def line_bytes(body: bytes, order: int) -> int:
    """The length of the line that starts at ``order`` (without its newline)."""
    return body.index(b"\n", order) - order


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(
        st.tuples(keys, st.one_of(st.none(), st.binary(max_size=30)), st.integers(0, 3)), max_size=80
    ),
    tasks=st.integers(1, 6),
    blob_lines=st.integers(1, 30),
    blob_bytes=st.integers(1, 1500),
    held_bytes=st.integers(1, 3000),
)
def test_export_reader_buckets_are_read_split_by_key(
    tmp_path: Path,
    lines: list[tuple[bytes | None, bytes | None, int]],
    tasks: int,
    blob_lines: int,
    blob_bytes: int,
    held_bytes: int,
) -> None:
    """read_split_buckets = read_split cut by bucket_of (a keyless bad line in bucket 0): each bucket's
    blobs, in the order handed out, are that bucket's messages in file order; each blob within its line
    and byte bounds (but for its last line); packed and unpacked unchanged."""
    body = b"".join(
        b"junk line\n" if key is None else export_line(key, value, p, off)
        for off, (key, value, p) in enumerate(lines)
    )
    path = tmp_path / "x.jsonl"
    path.write_bytes(body)
    size = len(body)
    plain = [m for c in read_split(path, 0, size, 0, None) for m in c.messages()]
    blobs = list(
        read_split_buckets(
            path, 0, size, 0, None, tasks, blob_lines=blob_lines, blob_bytes=blob_bytes, held_bytes=held_bytes
        )
    )
    by_bucket: dict[int, list[Any]] = {i: [] for i in range(tasks)}
    for bucket, c in blobs:
        msgs = c.messages()
        assert 1 <= len(msgs) <= blob_lines
        assert all(bucket_of(m.key, tasks) == bucket for m in msgs)
        assert sum(line_bytes(body, m.order) for m in msgs[:-1]) < min(blob_bytes, held_bytes)
        by_bucket[bucket].extend(msgs)
        # Unpacked, the packed blob gives the messages back as they were.
        assert regroup([pack_columns([(7, c)])], [7])[7] == [tuple(m) for m in msgs]
    for i, msgs in by_bucket.items():
        assert msgs == [m for m in plain if bucket_of(m.key, tasks) == i]
    if min(blob_bytes, held_bytes) > size and blob_lines >= len(plain):
        assert len(blobs) == len({bucket_of(m.key, tasks) for m in plain})


def test_messages_batch_keeps_every_column() -> None:
    c = Columns(split=4)
    for row in [(b"k", b"v", 1, 7, 10, False), (None, None, None, None, 20, True)]:
        c.key.append(row[0])
        c.value.append(row[1])
        c.partition.append(row[2])
        c.offset.append(row[3])
        c.order.append(row[4])
        c.bad.append(row[5])
    assert [tuple(m) for m in unpack([pack_columns([(9, c)])])] == [tuple(m) for m in c.messages()]
    assert messages_batch(c).schema == MESSAGE_ARROW


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, None), ("", None), ("3", [3]), ("5,-1,7", [5, -1, 7])],
)
def test_parse_dests(raw: str | None, expected: list[int] | None) -> None:
    assert parse_dests({} if raw is None else {"dests": raw}) == expected


@pytest.mark.parametrize("raw", ["1,,2", "a", "1.5", "1;2", ","])
def test_parse_dests_refuses_what_is_not_a_list_of_ints(raw: str) -> None:
    with pytest.raises(ValueError, match="dests must be comma-separated ints"):
        parse_dests({"dests": raw})
