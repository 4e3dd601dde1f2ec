"""Reading a channel export (docs/protocol.md section 8) in parallel: contiguous byte ranges, exact bytes.

An export is JSON lines; ``trimtab channel replay`` reads it front to back. To read one in parallel the
file is cut into byte ranges and every line belongs to the range holding its first byte, so each line is
read exactly once whatever the cut points. Nothing is decoded as text: a line's bytes go to the same
parser ``channel replay`` uses (:func:`channel.replayfile.parse_message_line`), so a value's bytes are the
bytes a node would judge. Only the first non-blank line of the file may be a header; the driver finds it
(:func:`find_header`) and the reader of the range that holds it skips it.

Everything here is pure Python over a file; the Spark data source (``pipeline.sources``) calls it.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from trimtab.channel.replayfile import is_blank, parse_message_line, read_header
from trimtab.errors import BadExportLine
from trimtab.pipeline.fold import Message

_CHUNK = 1 << 20
#: How many bytes of lines a bucket gathers before it is handed out as one packed row (``pipeline.packing``
#: says why rows stay well under half a megabyte).
BLOB_BYTES = 256 << 10
#: How many bytes of lines one reader holds at most, all buckets together.
HELD_BYTES = 64 << 20


@dataclass(frozen=True)
class Header:
    """The first non-blank line, if it is a header: where it starts, what it declares, what is wrong."""

    pos: int
    partitions: int | None
    problem: str | None  # a header that is not valid: one bad_line, and it declares nothing


def find_header(path: str | Path) -> Header | None:
    """The header of an export, or None when its first non-blank line is a message line (or it has none)."""
    pos = 0
    with open(path, "rb") as f:
        for line in f:
            if not is_blank(line):
                got = read_header(line)
                return None if got is None else Header(pos, got[0], got[1])
            pos += len(line)
    return None


def plan_splits(size: int, *, split_bytes: int, min_splits: int = 1) -> list[tuple[int, int]]:
    """Contiguous, non-empty ``[start, end)`` byte ranges covering ``size`` bytes: at most ``split_bytes``
    each (rounded to whole bytes), as many as that takes rounded up to a multiple of ``min_splits`` -- the
    task slots the job has -- so that every wave of reading tasks fills every slot: a 2.7 GB export in
    64 MiB splits is 43 tasks, whose last one ran alone on a two-slot Spark while the other slot idled
    (48 fill 24 waves). Fewer only when the file has fewer bytes than that."""
    if size <= 0:
        return [(0, 0)]
    slots = max(1, min_splits)
    n = -(-size // max(1, split_bytes))
    n = min(size, -(-n // slots) * slots)
    return [(size * i // n, size * (i + 1) // n) for i in range(n)]


#: A message as a reader holds it: (key, value, partition, offset, order, bad).
_Row = tuple[bytes | None, bytes | None, int | None, int | None, int, bool]


@dataclass
class Columns:
    """A batch of messages as columns (what a Spark task hands to Arrow): see :class:`pipeline.fold.Message`."""

    key: list[bytes | None] = field(default_factory=list)
    value: list[bytes | None] = field(default_factory=list)
    partition: list[int | None] = field(default_factory=list)
    offset: list[int | None] = field(default_factory=list)
    order: list[int] = field(default_factory=list)
    split: int = 0
    bad: list[bool] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.order)

    @classmethod
    def of(cls, rows: list[_Row], split: int) -> Columns:
        """Columns from rows of (key, value, partition, offset, order, bad)."""
        key, value, partition, offset, order, bad = (
            (list(c) for c in zip(*rows, strict=True)) if rows else ([], [], [], [], [], [])
        )
        return cls(key, value, partition, offset, order, split, bad)

    def messages(self) -> list[Message]:
        return [
            Message(k, v, p, o, order, self.split, bad)
            for k, v, p, o, order, bad in zip(
                self.key, self.value, self.partition, self.offset, self.order, self.bad, strict=True
            )
        ]


def read_split(
    path: str | Path, start: int, end: int, split: int, header_pos: int | None, *, batch: int = 50_000
) -> Iterator[Columns]:
    """The messages of the lines that start in ``[start, end)``, in file order, in batches of columns.

    A line that is not an export line comes back as a message with ``bad=True`` (counted ``bad_line``).
    A message that repeats an offset of an earlier line of this range in the same partition is dropped
    here (a node would ignore it); re-deliveries across ranges are the fold's second pass
    (``pipeline.fold``).
    """
    for _, columns in read_split_buckets(
        path, start, end, split, header_pos, 1, blob_lines=batch, blob_bytes=HELD_BYTES
    ):
        yield columns


def read_split_buckets(
    path: str | Path,
    start: int,
    end: int,
    split: int,
    header_pos: int | None,
    buckets: int,
    *,
    blob_lines: int = 50_000,
    blob_bytes: int = BLOB_BYTES,
    held_bytes: int = HELD_BYTES,
) -> Iterator[tuple[int, Columns]]:
    """:func:`read_split`, cut into ``buckets`` by key (``pipeline.packing.bucket_of``; a bad line goes to
    bucket 0): ``(bucket, columns)`` pairs, each bucket's successive columns successive stretches of it in
    file order.

    A bucket is handed out as soon as it holds ``blob_lines`` lines or ``blob_bytes`` bytes of them (so at
    most ``blob_bytes`` plus one line): what one packed row carries. When all buckets together hold ``held_bytes``,
    every non-empty one is handed out, which bounds a reader's memory whatever the number of buckets.
    """
    data, pos = _read_range(path, start, end)
    if not data:
        return
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()  # the empty string after the last newline is not a line
    seen: dict[int, int] = {}  # partition -> next offset not yet applied (this range only)
    outs: list[list[_Row]] = [[] for _ in range(buckets)]
    sizes = [0] * buckets
    held = 0
    parse = parse_message_line
    crc = zlib.crc32
    for line in lines:
        here = pos
        pos += len(line) + 1
        if here == header_pos:
            continue
        try:
            key, value, partition, offset = parse(line)
        except BadExportLine:
            if is_blank(line):
                continue  # blank lines are not lines of the export
            key = value = partition = offset = None
            bad = True
        else:
            bad = False
            if partition is not None and offset is not None:
                if offset < seen.get(partition, 0):
                    continue  # re-delivered within this range
                seen[partition] = offset + 1
        # packing.bucket_of, inlined: a call per line costs ~1 % of a compaction, and packing imports
        # this module. test_export_reader_buckets_are_read_split_by_key holds the two equal.
        b = 0 if key is None or buckets == 1 else crc(key) % buckets
        out = outs[b]
        out.append((key, value, partition, offset, here, bad))
        n = len(line)
        sizes[b] += n
        held += n
        if sizes[b] >= blob_bytes or len(out) >= blob_lines:
            yield b, Columns.of(out, split)
            outs[b] = []
            held -= sizes[b]
            sizes[b] = 0
        elif held >= held_bytes:
            yield from ((i, Columns.of(rows, split)) for i, rows in enumerate(outs) if rows)
            outs = [[] for _ in range(buckets)]
            sizes = [0] * buckets
            held = 0
    yield from ((i, Columns.of(rows, split)) for i, rows in enumerate(outs) if rows)


def _read_range(path: str | Path, start: int, end: int) -> tuple[bytes, int]:
    """The bytes of the lines that start in ``[start, end)`` (the last one whole), and where they start."""
    with open(path, "rb") as f:
        pos = start
        if start > 0:
            # The line holding byte start-1 belongs to an earlier range: skip to the byte after its newline.
            f.seek(start - 1)
            pos = start - 1
            while True:
                chunk = f.read(_CHUNK)
                if not chunk:
                    return b"", pos
                nl = chunk.find(b"\n")
                if nl >= 0:
                    pos += nl + 1
                    break
                pos += len(chunk)
        if pos >= end:
            return b"", pos
        f.seek(pos)
        data = f.read(end - pos)
        if data and not data.endswith(b"\n"):  # the last line runs past the range: read it whole
            rest = [data]
            while True:
                chunk = f.read(_CHUNK)
                if not chunk:
                    break
                nl = chunk.find(b"\n")
                if nl >= 0:
                    rest.append(chunk[: nl + 1])
                    break
                rest.append(chunk)
            data = b"".join(rest)
    return data, pos
