"""Kafka offset ranges with confluent-kafka: plan them on the driver, read them in the Spark tasks.

No Spark here (and no consumer group, no commits): the driver resolves what to read -- from stored
positions or the low watermarks to the high watermarks -- into explicit ``[start, end)`` ranges per
partition, so that a job knows exactly which records it read (the ingest stores them as its commit point), and each Spark task reads one range
with a consumer assigned to it. A range is read to its end or the task fails: records deleted by
retention before they were read, or a partition that ends early (a re-created topic), are errors, never
silently skipped.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from trimtab.pipeline.common import PipelineError

#: A Kafka record as the pipeline reads it: (partition, offset, timestamp ms, key, value).
Record = tuple[int, int, int, bytes | None, bytes | None]

_EOF = KafkaError._PARTITION_EOF
_RESET = KafkaError._AUTO_OFFSET_RESET


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int  # first offset read
    end: int  # first offset not read

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def client_config(bootstrap_servers: str, extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A consumer configuration without a group: assign(), no commits, never skip past deleted records."""
    return {
        "bootstrap.servers": bootstrap_servers,
        "client.id": "trimtab-pipeline",
        "log_level": 3,
        **dict(extra or {}),
        "group.id": f"trimtab-pipeline-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "enable.partition.eof": True,
        "fetch.message.max.bytes": 8 << 20,
        "fetch.max.bytes": 64 << 20,
        "queued.max.messages.kbytes": 256 << 10,
    }


def _consumer(config: Mapping[str, Any]) -> Consumer:
    return Consumer(dict(config))


def watermarks(config: Mapping[str, Any], topic: str, timeout: float = 30.0) -> dict[int, tuple[int, int]]:
    """``partition -> (low, high)`` of every partition of ``topic``."""
    c = _consumer(config)
    try:
        md = c.list_topics(topic, timeout=timeout)
        t = md.topics.get(topic)
        if t is None or t.error is not None or not t.partitions:
            why = t.error.str() if t is not None and t.error is not None else "no such topic"
            raise PipelineError(f"topic {topic!r} is not readable: {why}")
        out: dict[int, tuple[int, int]] = {}
        for p in sorted(t.partitions):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout, cached=False)
            out[p] = (int(lo), int(hi))
        return out
    except KafkaException as e:
        raise PipelineError(f"cannot read the watermarks of {topic!r}: {e}") from e
    finally:
        c.close()


def resolve_bounds(
    config: Mapping[str, Any], topic: str, *, start: Mapping[int, int] | None = None
) -> dict[int, tuple[int, int]]:
    """``partition -> [start, end)`` to read now: from ``start`` (per partition; else the low watermark) to
    the high watermark. Starts below the low watermark are raised to it (callers that must know compare)."""
    marks = watermarks(config, topic)
    out: dict[int, tuple[int, int]] = {}
    for p, (lo, hi) in sorted(marks.items()):
        s = lo if start is None or p not in start else max(lo, start[p])
        out[p] = (min(s, hi), hi)
    return out


def in_time(records: list[Record], start_ts: int | None, end_ts: int | None) -> list[Record]:
    """The records whose timestamp lies in ``[start_ts, end_ts)`` (a bound of None is open). A filter on
    every record, exact whatever order the producers' clocks wrote the timestamps in."""
    if start_ts is None and end_ts is None:
        return records
    lo = start_ts if start_ts is not None else -(2**63)
    hi = end_ts if end_ts is not None else 2**63 - 1
    return [r for r in records if lo <= r[2] < hi]


def split_ranges(topic: str, bounds: Mapping[int, tuple[int, int]], max_records: int) -> list[OffsetRange]:
    """One range per partition, cut into pieces of at most ``max_records`` offsets (one Spark task each)."""
    out: list[OffsetRange] = []
    step = max(1, max_records)
    for p in sorted(bounds):
        s, e = bounds[p]
        while s < e:
            out.append(OffsetRange(topic, p, s, min(e, s + step)))
            s += step
    return out


def read_range(
    config: Mapping[str, Any], r: OffsetRange, *, batch: int = 20_000, idle_timeout: float = 60.0
) -> Iterator[list[Record]]:
    """Every record of ``r``, in offset order, in lists of up to ``batch``. Raises :class:`PipelineError`
    when the range cannot be read whole (records deleted before they were read, the partition ended
    early, nothing arrived for ``idle_timeout`` seconds)."""
    if r.size == 0:
        return
    c = _consumer(config)
    try:
        c.assign([TopicPartition(r.topic, r.partition, r.start)])
        out: list[Record] = []
        last = time.monotonic()
        while True:
            try:
                msgs = c.consume(batch, 0.5)
            except KafkaException as e:
                raise PipelineError(f"reading {r.topic}[{r.partition}] failed: {e}") from e
            if not msgs and time.monotonic() - last > idle_timeout:
                raise PipelineError(
                    f"reading {r.topic}[{r.partition}] {r.start}..{r.end}: nothing for {idle_timeout:.0f}s"
                )
            for m in msgs:
                err = m.error()
                if err is not None:
                    code = err.code()
                    if code == _EOF:
                        eof = m.offset() or 0
                        if eof < r.end:
                            raise PipelineError(
                                f"{r.topic}[{r.partition}] ends at offset {eof}, before {r.end}: "
                                "was the topic re-created?"
                            )
                        if out:
                            yield out
                        return
                    if code == _RESET:
                        raise PipelineError(
                            f"{r.topic}[{r.partition}]: offsets from {r.start} were deleted (retention) "
                            "before they were read; run again to read from the first retained offset"
                        )
                    if err.fatal():
                        raise PipelineError(f"reading {r.topic}[{r.partition}]: {err.str()}")
                    continue  # transient (the client retries)
                off = m.offset()
                if off is None or off < r.start:
                    continue
                if off >= r.end:
                    if out:
                        yield out
                    return
                ts = m.timestamp()
                out.append((r.partition, off, ts[1] if ts[0] else -1, m.key(), m.value()))
                last = time.monotonic()
                if off == r.end - 1:
                    yield out
                    return
            if len(out) >= batch:
                yield out
                out = []
    finally:
        c.close()
