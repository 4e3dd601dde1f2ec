"""Channel messages packed per fold task: Spark moves a few large rows instead of millions of small ones.

Why: a compaction's real work is Python's -- parse each message, fold it through ``TableView``. What Spark
adds is per *row*: Arrow to rows and back at each Python boundary, a shuffle record with its checksum,
a sort comparison, a batch-size check per row before Arrow. Measured with Java Flight Recorder on
``local[1]``, that JVM work cost about as much CPU as the Python work (docs/benchmarks.md), so on two
cores ``local[2]`` could not reach twice ``local[1]``. None of it is needed: Spark only has to bring
every message of a bundle to one fold task, in log order.

So a reader puts its messages into one bucket per fold task (:func:`bucket_of`, a hash of the key),
serialises each bucket as an LZ4-compressed Arrow stream (``blob``), and gives Spark one row per bucket:
``(dest, first, blob)``. ``dest`` is a value Spark's own hash partitioning sends to that bucket's task
(:func:`dest_values`); ``first`` is the log position (``order``) of the blob's first message. Spark
shuffles the rows to their tasks and sorts each task's rows by ``first``; the fold task unpacks them in
that order (:func:`unpack`).

Why that order is the log order the fold needs: a blob holds the messages of one reader (a byte range
of an export, an offset range of one Kafka partition) in log order, and one reader's successive blobs
for a bucket cover successive stretches of it. Readers of an export cover disjoint byte ranges, so
sorting a task's blobs by ``first`` orders all its messages by file position, exactly as sorting the
messages would. Ranges of one Kafka partition are disjoint too; ranges of different partitions may
interleave in any order, which changes nothing: a bundle's records count only in its home partition
(``channel.table``), and Kafka never re-delivers within one read.

Why a blob stays near ``exportfile.BLOB_BYTES`` (256 KiB) instead of holding a whole read batch: Spark
copies each row into a JVM byte array several times, and G1 allocates an array of half a heap region or
more (512 KiB on a small heap) as a humongous object, each of which may start a concurrent marking cycle.
Megabyte rows cost a 10 M-record compaction 4-9 CPU-seconds of G1 work that competes with the Python
workers for the same cores (docs/pipeline.md).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from trimtab.pipeline.common import PipelineError
from trimtab.pipeline.exportfile import BLOB_BYTES, Columns

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: A channel message as the compaction folds it (pipeline.fold.Message).
MESSAGE_SCHEMA = "key binary, value binary, partition int, offset long, order long, split int, bad boolean"
MESSAGE_ARROW = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("order", pa.int64()),
        ("split", pa.int32()),
        ("bad", pa.bool_()),
    ]
)
#: One bucket of messages bound for one fold task (module docstring).
PACKED_SCHEMA = "dest int, first long, blob binary"
PACKED_ARROW = pa.schema([("dest", pa.int32()), ("first", pa.int64()), ("blob", pa.binary())])


def bucket_of(key: bytes | None, buckets: int) -> int:
    """The bucket (fold task) of a message: a stable hash of its key, the same in every process (Python's
    own ``hash`` of bytes is salted per process). A message without a key (a bad line) goes to bucket 0."""
    return 0 if key is None else zlib.crc32(key) % buckets


def dest_values(spark: SparkSession, tasks: int) -> list[int]:
    """For each fold task ``i``, an int that ``repartition(tasks, "dest")`` sends to task ``i``.

    Spark places a row by ``pmod(hash(dest), tasks)`` (Murmur3); the values are found by asking Spark
    itself, so they are right for whatever version runs. Bucket ``i`` then lands on task ``i``: one
    bucket per task, none sharing, none empty.
    """
    from pyspark.sql import functions as sf

    found: dict[int, int] = {}
    lo, width = 0, max(64, 16 * tasks)
    while len(found) < tasks:
        if lo > 1 << 24:  # Murmur3 spreads ints evenly: this is never reached
            raise PipelineError(f"no int value hashes to every one of {tasks} Spark partitions")
        ids = sf.col("id").cast("int")
        rows = (
            spark.range(lo, lo + width)
            .select(ids.alias("v"), sf.pmod(sf.hash(ids), sf.lit(tasks)).alias("p"))
            .collect()
        )
        for row in rows:
            found.setdefault(int(row["p"]), int(row["v"]))
        lo += width
    return [found[i] for i in range(tasks)]


def messages_batch(c: Columns) -> pa.RecordBatch:
    """A batch of messages as Arrow (:data:`MESSAGE_ARROW`)."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array(c.key, pa.binary()),
            pa.array(c.value, pa.binary()),
            pa.array(c.partition, pa.int32()),
            pa.array(c.offset, pa.int64()),
            pa.array(c.order, pa.int64()),
            pa.array([c.split] * len(c), pa.int32()),
            pa.array(c.bad, pa.bool_()),
        ],
        schema=MESSAGE_ARROW,
    )


#: A blob is an Arrow IPC stream of messages with LZ4-compressed buffers. The JSON values compress about
#: 4:1, and every byte of a blob crosses a socket from a Python worker to the JVM, is copied there several
#: times, and crosses another socket to the fold's worker: compressing costs the reader ~0.25 µs and the
#: fold ~0.15 µs a message and saves the JVM and the kernel three quarters of that traffic (Spark
#: compresses its shuffle files anyway; docs/pipeline.md).
_BLOB_WRITE = pa.ipc.IpcWriteOptions(compression="lz4")


def blob_of(batch: pa.RecordBatch) -> bytes:
    """A batch of messages (:data:`MESSAGE_ARROW`) as a blob."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, MESSAGE_ARROW, options=_BLOB_WRITE) as w:
        w.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def blob_batches(blob: pa.Buffer) -> Iterator[pa.RecordBatch]:
    """The messages of a blob; anything but a stream of :data:`MESSAGE_ARROW` batches is refused."""
    with pa.ipc.open_stream(blob) as r:
        if not r.schema.equals(MESSAGE_ARROW):
            raise PipelineError(f"a packed row holds a stream of {r.schema}, not of channel messages")
        yield from r


def packed_batch(blobs: Iterable[tuple[int, int, pa.RecordBatch]]) -> pa.RecordBatch:
    """Rows of :data:`PACKED_ARROW` from (dest, first, messages) triples."""
    dests: list[int] = []
    firsts: list[int] = []
    data: list[bytes] = []
    for dest, first, batch in blobs:
        dests.append(dest)
        firsts.append(first)
        data.append(blob_of(batch))
    return pa.RecordBatch.from_arrays(
        [pa.array(dests, pa.int32()), pa.array(firsts, pa.int64()), pa.array(data, pa.binary())],
        schema=PACKED_ARROW,
    )


def pack_columns(blobs: Iterable[tuple[int, Columns]]) -> pa.RecordBatch:
    """Packed rows from (dest, messages) pairs: what an export's reader hands out
    (``exportfile.read_split_buckets``, its buckets mapped to their dests), each pair's messages non-empty
    and in log order."""
    return packed_batch((dest, c.order[0], messages_batch(c)) for dest, c in blobs)


#: Bytes a message adds to a blob beside its key and value (its offsets, numbers and flags): what
#: :func:`pack_messages` counts to keep a blob near ``exportfile.BLOB_BYTES``.
MESSAGE_OVERHEAD = 40


def pack_messages(
    dests: Sequence[int], blob_bytes: int = BLOB_BYTES
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function that packs a DataFrame of messages (:data:`MESSAGE_SCHEMA`) that was not
    read packed -- the Kafka sources'. Each input batch (one reader's, in log order) becomes, per bucket,
    packed rows of successive stretches of that bucket's messages, each about ``blob_bytes`` at most (one
    message more than that is a row of its own)."""
    n = len(dests)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            if not b.num_rows:
                continue
            # Spark's batches name the same columns with its own nullability: the blob's schema is ours.
            b = b.cast(MESSAGE_ARROW)
            keys = b.column(0).to_pylist()
            sizes = [
                (0 if k is None else len(k)) + (0 if v is None else len(v)) + MESSAGE_OVERHEAD
                for k, v in zip(keys, b.column(1).to_pylist(), strict=True)
            ]
            runs: list[tuple[int, list[int]]] = []
            open_runs: list[list[int] | None] = [None] * n
            filled = [0] * n
            for i, key in enumerate(keys):
                d = bucket_of(key, n)
                rows = open_runs[d]
                if rows is None or filled[d] + sizes[i] > blob_bytes:
                    rows = open_runs[d] = []
                    runs.append((d, rows))
                    filled[d] = 0
                rows.append(i)
                filled[d] += sizes[i]
            orders = b.column(4)
            yield packed_batch(
                (dests[d], orders[rows[0]].as_py(), b.take(pa.array(rows, pa.int64()))) for d, rows in runs
            )

    return run


def pack_frame(messages: DataFrame, dests: Sequence[int]) -> DataFrame:
    """A DataFrame of messages, packed (:func:`pack_messages`)."""
    return messages.mapInArrow(pack_messages(dests), PACKED_SCHEMA)


def unpack(batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[Any, ...]]:
    """The messages of packed rows, blob after blob, as tuples in :data:`MESSAGE_ARROW`'s field order."""
    width = len(MESSAGE_ARROW)
    for b in batches:
        for blob in b.column(2):
            for rb in blob_batches(blob.as_buffer()):
                yield from zip(*(rb.column(i).to_pylist() for i in range(width)), strict=True)
