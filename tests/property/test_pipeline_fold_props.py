"""The pipeline's compaction, without Spark: cut an export into byte ranges, read each range packed into one
bucket per fold task by key (pipeline.packing), bring each bucket's blobs together in their order, fold
each group with the nodes' replay, merge -- and get exactly what
``trimtab channel replay --json`` prints for the same file (same bytes).

The logs are the replay tests' (strategies.channel_logs: racing and stale writers, splits and child
claims, overrides, tombstones, garbage values, bad keys, records in the wrong partition), delivered with
re-fetched offsets (strategies.deliveries), written as an export with junk lines, blank lines, headers
good and bad, lines without partition or offset, and sometimes a second copy of part of the log appended
(re-deliveries across ranges, which only the second pass removes). The Spark job
(tests/integration/test_pipeline.py) runs the same functions; here hypothesis can afford many examples.
"""

from __future__ import annotations

import base64
import io
import itertools
import zlib
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import ChannelLog, channel_logs, deliveries

from trimtab.channel.replayfile import export_line, header_line, replay_lines, report_json, table_report
from trimtab.pipeline.exportfile import find_header, plan_splits, read_split, read_split_buckets
from trimtab.pipeline.fold import (
    Covered,
    Partial,
    earlier_maxima,
    fold,
    merge_all,
    redeliveries_across_splits,
    report,
    two_pass,
)
from trimtab.pipeline.packing import PACKED_ARROW, pack_columns, unpack

SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]
JUNK = (
    b"not json",
    b'{"key": "t/ns0/0x00000000_0x80000000"}',
    b'{"format": "trimtab-channel-export", "version": 1}',  # a header that is not first: a bad line
    b'{"key": "a", "value": 1, "value_b64": null}',
    b"[1, 2, 3]",
    b'{"key": "t/ns0/0x00000000_0x80000000", "value_b64": "!!!"}',
)


def export_bytes(data: st.DataObject, log: ChannelLog) -> tuple[bytes, int | None]:
    """An export of one node's view of ``log`` with everything a hand-made file may hold; and the
    ``--partitions`` override to replay it with (None: the header decides)."""
    stream = data.draw(deliveries(log))
    lines: list[bytes] = []
    header = data.draw(st.sampled_from(["good", "good", "none", "bad", "blank-then-good"]))
    if header in ("good", "blank-then-good"):
        if header == "blank-then-good":
            lines.append(b"   ")
        lines.append(header_line("ch", log.partitions).rstrip(b"\n"))
    elif header == "bad":
        lines.append(b'{"format": "trimtab-channel-export", "version": 2, "partitions": 3}')
    for key, value, partition, offset in stream:
        form = data.draw(st.integers(0, 19))
        if form == 0:
            lines.append(data.draw(st.sampled_from(JUNK)))
        elif form == 1:
            lines.append(b"")
        line = export_line(key, value, partition, offset).rstrip(b"\n")
        if form == 2 and key is not None:
            # The general form: members reordered, value as JSON text where it can be.
            obj: dict[str, Any] = {"partition": partition, "offset": offset}
            obj["key_b64"] = base64.b64encode(key).decode()
            obj["value_b64"] = None if value is None else base64.b64encode(value).decode()
            line = orjson.dumps(obj)
        elif form == 3:
            line = export_line(key, value, None, None).rstrip(b"\n")  # no position: never a re-delivery
        lines.append(line)
    if lines and data.draw(st.integers(0, 3)) == 0:
        # Part of the file again (two exports concatenated): offsets re-delivered across byte ranges.
        start = data.draw(st.integers(0, len(lines) - 1))
        lines.extend(lines[start : start + data.draw(st.integers(1, 30))])
    override = data.draw(st.sampled_from([None, None, 1, 2, 3]))
    body = b"\n".join(lines) + (b"\n" if data.draw(st.booleans()) else b"")
    return body, override


def distributed(path: Path, data: st.DataObject, override: int | None) -> tuple[bytes, int]:
    """The pipeline's compaction, with lists instead of Spark: ranges read into packed buckets -> rows
    grouped by dest and sorted by first (what Spark's shuffle and sort do) -> unpacked -> folds."""
    size = path.stat().st_size
    header = find_header(path)
    partitions = override if override is not None else (header.partitions if header else None)
    split_bytes = data.draw(st.integers(1, max(1, size)))
    splits = plan_splits(size, split_bytes=split_bytes, min_splits=data.draw(st.integers(1, 6)))
    tasks = data.draw(st.integers(1, 5))
    dests = data.draw(st.permutations(range(100, 100 + tasks)))  # any ints: Spark's hash places them
    bounds = {
        "blob_lines": data.draw(st.integers(1, 40)),
        "blob_bytes": data.draw(st.integers(1, 2000)),
        "held_bytes": data.draw(st.integers(1, 4000)),
    }
    rows: dict[int, list[tuple[int, bytes]]] = {d: [] for d in dests}
    for i, (start, end) in enumerate(splits):
        blobs = [
            (dests[b], columns)
            for b, columns in read_split_buckets(
                path, start, end, i, header.pos if header else None, tasks, **bounds
            )
        ]
        # A reader's rows reach Spark in batches of any size: cut them anywhere.
        cut = data.draw(st.integers(0, len(blobs)))
        for part in (blobs[:cut], blobs[cut:]):
            packed = pack_columns(part).to_pydict()
            for dest, first, blob in zip(packed["dest"], packed["first"], packed["blob"], strict=True):
                rows[dest].append((first, blob))
    groups = [
        [tuple(m) for m in unpack([packed_batch_of(sorted(rows[d], key=lambda r: r[0]))])] for d in dests
    ]

    def run(covered: Covered | None) -> Partial:
        return merge_all(fold(g, partitions, covered) for g in groups)

    result, passes = two_pass(run)
    extra = {"bad_line": 1} if header is not None and header.problem is not None else {}
    return report_json(report(result.table, result.stats, extra)), passes


def packed_batch_of(rows: list[tuple[int, bytes]]) -> pa.RecordBatch:
    """Packed rows as the fold task receives them (dest is no longer needed there)."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array([0] * len(rows), pa.int32()),
            pa.array([f for f, _ in rows], pa.int64()),
            pa.array([b for _, b in rows], pa.binary()),
        ],
        schema=PACKED_ARROW,
    )


@settings(
    max_examples=150, deadline=None, suppress_health_check=[*SLOW_OK, HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_distributed_fold_equals_channel_replay(data: st.DataObject, tmp_path: Path) -> None:
    log = data.draw(channel_logs(st.one_of(st.none(), st.integers(1, 3)), max_steps=60))
    body, override = export_bytes(data, log)
    path = tmp_path / "export.jsonl"
    path.write_bytes(body)
    expected = report_json(table_report(replay_lines(io.BytesIO(body), partitions=override)))
    got, _ = distributed(path, data, override)
    assert got == expected


def test_re_delivery_across_ranges_takes_a_second_pass(tmp_path: Path) -> None:
    """An offset repeated in a later range is a duplicate a node ignores; the first pass cannot see it
    (it is in another range), the spans show it, and the second pass drops it."""
    key = b"t/ns0/0x00000000_0x80000000"
    p = zlib.crc32(key) % 2
    owned = b'{"schema":1,"state":"assigning","dst":"b1:1","src":null,"version":1,"force":false,"ts":1,"writer":"w"}'
    other = b'{"schema":1,"state":"assigning","dst":"b2:2","src":null,"version":1,"force":false,"ts":2,"writer":"w"}'
    lines = [
        header_line("ch", 2),
        export_line(key, owned, p, 0),
        export_line(key, None, p, 1),
        # A second export of the same partition: offset 0 again, with another value. A node ignores it
        # (a re-delivery); folded as a message it would be one more rejection (stale_version).
        export_line(key, other, p, 0),
    ]
    path = tmp_path / "x.jsonl"
    path.write_bytes(b"".join(lines))
    expected = report_json(table_report(replay_lines(io.BytesIO(b"".join(lines)))))
    header = find_header(path)
    assert header is not None
    cut = len(b"".join(lines[:3]))  # the repeated offset starts the second range
    splits = [(0, cut), (cut, path.stat().st_size)]
    messages = [
        m
        for i, (a, b) in enumerate(splits)
        for batch in read_split(path, a, b, i, header.pos)
        for m in batch.messages()
    ]

    def run(covered: Covered | None) -> Partial:
        return fold(sorted(messages, key=lambda m: m.order), 2, covered)

    first = run(None)
    assert earlier_maxima(first.spans) == {(1, p): 1}
    assert redeliveries_across_splits(first.spans) == {(1, p): 1}
    result, passes = two_pass(run)
    assert passes == 2
    assert report_json(report(result.table, result.stats)) == expected
    # And the first pass alone would have been wrong: it counted the re-delivered record as rejected.
    assert report_json(report(first.table, first.stats)) != expected


@given(size=st.integers(0, 10**12), data=st.data(), slots=st.integers(1, 64))
def test_splits_cover_the_file_within_their_size_in_full_waves_of_tasks(
    size: int, data: st.DataObject, slots: int
) -> None:
    split_bytes = data.draw(st.integers(max(1, size // 2000), max(1, size * 2)))  # up to ~2 000 splits
    splits = plan_splits(size, split_bytes=split_bytes, min_splits=slots)
    if size == 0:
        assert splits == [(0, 0)]
        return
    assert splits[0][0] == 0 and splits[-1][1] == size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(splits)), "contiguous"
    assert all(e > s for s, e in splits), "none empty"
    n = len(splits)
    assert n % slots == 0 or n == size, "every wave fills every slot, unless the file has too few bytes"
    assert max(e - s for s, e in splits) <= max(split_bytes, -(-size // n)), "no split above its size"
    assert max(e - s for s, e in splits) - min(e - s for s, e in splits) <= 1, "even"
    assert n < slots or n - slots < -(-size // split_bytes), "no more than one wave beyond the size's count"


def test_every_line_is_read_once_whatever_the_cuts(tmp_path: Path) -> None:
    lines = [b'{"key": "k%d", "value": null}\n' % i for i in range(50)]
    path = tmp_path / "lines.jsonl"
    path.write_bytes(b"".join(lines))
    size = path.stat().st_size
    for split_bytes in (1, 7, 31, 32, 100, size - 1, size, size * 2):
        splits = plan_splits(size, split_bytes=split_bytes)
        assert splits[0][0] == 0 and splits[-1][1] == size
        assert all(a[1] == b[0] for a, b in itertools.pairwise(splits))
        keys = [
            k
            for i, (a, b) in enumerate(splits)
            for batch in read_split(path, a, b, i, None)
            for k in batch.key
        ]
        assert keys == [b"k%d" % i for i in range(50)], split_bytes
