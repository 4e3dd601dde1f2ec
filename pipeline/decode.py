"""Typed rows from hostile Kafka records, one table per topic of the history (docs/pipeline.md).

Every byte read is untrusted: each value goes through the decoder the nodes use for that topic -- the
channel record codec (``channel.records.decode``), ``channel.values.StrictDecoder`` for load and
top-bundle reports, the structure rules (``channel.strictjson``) for events -- and nothing a value holds
can make decoding raise. A value that is refused is kept as a row with its ``skip_reason`` (one of the
decoders' bounded reasons) and null fields, so the history loses nothing and every job counts poison the
same way. Raw keys and values of the channel are kept too: compaction from the history replays the exact
bytes.

The functions here turn one Arrow batch of Kafka records (``sources.KAFKA_SCHEMA``) into one batch of a
table's rows; the Spark jobs call them in ``mapInArrow``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pyarrow as pa

from trimtab.balance.load import BrokerLoadData, TopBundles
from trimtab.channel import strictjson
from trimtab.channel.bundles import is_bundle_name
from trimtab.channel.records import Record, Skip, decode
from trimtab.channel.values import Refused, StrictDecoder

#: Load reports, top-bundle reports and events: values up to 1 MiB (docs/protocol.md section 6).
MAX_REPORT_BYTES = 1 << 20

_KAFKA = [
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp", pa.int64()),
]

CHANNEL = pa.schema(
    [
        *_KAFKA,
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("bundle", pa.string()),
        ("tombstone", pa.bool_()),
        ("state", pa.string()),
        ("dst", pa.string()),
        ("src", pa.string()),
        ("version", pa.int64()),
        ("force", pa.bool_()),
        ("ts", pa.int64()),
        ("writer", pa.string()),
        ("children", pa.string()),
        ("skip_reason", pa.string()),
    ]
)
BROKER_LOAD = pa.schema(
    [
        *_KAFKA,
        ("broker", pa.string()),
        ("tombstone", pa.bool_()),
        ("cpu", pa.float64()),
        ("memory", pa.float64()),
        ("bandwidth_in", pa.float64()),
        ("bandwidth_out", pa.float64()),
        ("msg_rate_in", pa.float64()),
        ("msg_rate_out", pa.float64()),
        ("msg_throughput_in", pa.float64()),
        ("msg_throughput_out", pa.float64()),
        ("bundles", pa.int64()),
        ("topics", pa.int64()),
        ("weighted_max", pa.float64()),
        ("weighted_max_ema", pa.float64()),
        ("updated_at", pa.int64()),
        ("reported_at", pa.int64()),
        ("skip_reason", pa.string()),
    ]
)
TOP_BUNDLES = pa.schema(
    [
        *_KAFKA,
        ("broker", pa.string()),
        ("tombstone", pa.bool_()),
        ("reported_at", pa.int64()),
        ("rank", pa.int32()),
        ("bundle", pa.string()),
        ("msg_rate_in", pa.float64()),
        ("msg_rate_out", pa.float64()),
        ("msg_throughput_in", pa.float64()),
        ("msg_throughput_out", pa.float64()),
        ("topics", pa.int64()),
        ("producers", pa.int64()),
        ("consumers", pa.int64()),
        ("skip_reason", pa.string()),
    ]
)
EVENTS = pa.schema(
    [
        *_KAFKA,
        ("key", pa.string()),
        ("ts", pa.int64()),
        ("kind", pa.string()),
        ("source", pa.string()),
        ("role", pa.string()),
        ("term", pa.int64()),
        ("bundle", pa.string()),
        ("broker", pa.string()),
        ("reason", pa.string()),
        ("body", pa.string()),
        ("skip_reason", pa.string()),
    ]
)
SCHEMAS: dict[str, pa.Schema] = {
    "channel": CHANNEL,
    "broker_load": BROKER_LOAD,
    "top_bundles": TOP_BUNDLES,
    "events": EVENTS,
}

_load_dec = StrictDecoder(BrokerLoadData, MAX_REPORT_BYTES)
_top_dec = StrictDecoder(TopBundles, MAX_REPORT_BYTES)
_INT64 = (-(2**63), 2**63 - 1)


def _text(key: bytes | None) -> str | None:
    if key is None:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _pct(u: Any) -> float:
    return float(u.percent)


def _messages(batch: pa.RecordBatch) -> Iterator[tuple[dict[str, Any], bytes | None, bytes | None]]:
    """Each message of a Kafka batch: its Kafka columns (the start of its row), its key and its value."""
    cols = batch.to_pydict()
    for topic, p, off, ts, key, value in zip(
        cols["topic"],
        cols["partition"],
        cols["offset"],
        cols["timestamp"],
        cols["key"],
        cols["value"],
        strict=True,
    ):
        yield {"topic": topic, "partition": p, "offset": off, "timestamp": ts}, key, value


def channel_rows(batch: pa.RecordBatch, partitions: int | None) -> list[dict[str, Any]]:
    """The channel's records, decoded as a node decodes them (key, home partition, value); a record a
    node would skip has its reason in ``skip_reason``. Acceptance is not decided here: that needs the
    bundle's history (``pipeline compact``, ``pipeline.report``)."""
    out: list[dict[str, Any]] = []
    for kafka, key, value in _messages(batch):
        row: dict[str, Any] = {**kafka, "key": key, "value": value, "tombstone": value is None}
        name = _text(key)
        if name is None or not is_bundle_name(name):
            row["skip_reason"] = "bad_key"
        elif partitions is not None and zlib.crc32(key or b"") % partitions != kafka["partition"]:
            row["bundle"] = name
            row["skip_reason"] = "wrong_partition"
        else:
            row["bundle"] = name
            if value is not None:
                rec = decode(value)
                if isinstance(rec, Skip):
                    row["skip_reason"] = rec.reason
                else:
                    _record_fields(row, rec)
        out.append(row)
    return out


def _record_fields(row: dict[str, Any], rec: Record) -> None:
    row.update(
        state=rec.state.value,
        dst=rec.dst,
        src=rec.src,
        version=rec.version,
        force=rec.force,
        ts=rec.ts,
        writer=rec.writer,
        children=None
        if rec.children is None
        else orjson.dumps(rec.children, option=orjson.OPT_SORT_KEYS).decode(),
    )


def broker_load_rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for kafka, key, value in _messages(batch):
        row: dict[str, Any] = {**kafka, "broker": _text(key), "tombstone": value is None}
        if value is not None:
            load = _load_dec.decode(value)
            if isinstance(load, Refused):
                row["skip_reason"] = load.reason
            else:
                row.update(
                    cpu=_pct(load.cpu),
                    memory=_pct(load.memory),
                    bandwidth_in=_pct(load.bandwidth_in),
                    bandwidth_out=_pct(load.bandwidth_out),
                    msg_rate_in=load.msg_rate_in,
                    msg_rate_out=load.msg_rate_out,
                    msg_throughput_in=load.msg_throughput_in,
                    msg_throughput_out=load.msg_throughput_out,
                    bundles=load.bundles,
                    topics=load.topics,
                    weighted_max=load.weighted_max,
                    weighted_max_ema=load.weighted_max_ema,
                    updated_at=load.updated_at,
                    reported_at=load.reported_at,
                )
                if row["broker"] is None:
                    row["broker"] = load.broker
        out.append(row)
    return out


def top_bundles_rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """One row per reported bundle (``rank`` 0 is the busiest); a tombstone or a refused value is one row."""
    out: list[dict[str, Any]] = []
    for kafka, key, value in _messages(batch):
        base: dict[str, Any] = {**kafka, "broker": _text(key), "tombstone": value is None}
        if value is None:
            out.append(base)
            continue
        top = _top_dec.decode(value)
        if isinstance(top, Refused):
            out.append({**base, "skip_reason": top.reason})
            continue
        if not top.bundles:
            out.append({**base, "reported_at": top.reported_at})
        for rank, b in enumerate(top.bundles):
            out.append(
                {
                    **base,
                    "reported_at": top.reported_at,
                    "rank": rank,
                    "bundle": b.bundle,
                    "msg_rate_in": b.msg_rate_in,
                    "msg_rate_out": b.msg_rate_out,
                    "msg_throughput_in": b.msg_throughput_in,
                    "msg_throughput_out": b.msg_throughput_out,
                    "topics": b.topics,
                    "producers": b.producers,
                    "consumers": b.consumers,
                }
            )
    return out


def _str_field(obj: dict[str, Any], name: str) -> str | None:
    v = obj.get(name)
    return v if type(v) is str else None


def _int_field(obj: dict[str, Any], name: str) -> int | None:
    v = obj.get(name)
    return v if type(v) is int and _INT64[0] <= v <= _INT64[1] else None


def event_fields(value: bytes) -> dict[str, Any] | str:
    """An event's columns, or why it is refused: the structure rules, then an object with a string
    ``kind`` and an integer ``ts``."""
    if len(value) > MAX_REPORT_BYTES:
        return strictjson.TOO_LARGE
    obj = strictjson.parse(value)
    if isinstance(obj, strictjson.Invalid):
        return obj.reason
    if type(obj) is not dict or type(obj.get("kind")) is not str or _int_field(obj, "ts") is None:
        return "invalid"
    return {
        "ts": obj["ts"],
        "kind": obj["kind"],
        "source": _str_field(obj, "source"),
        "role": _str_field(obj, "role"),
        "term": _int_field(obj, "term"),
        "bundle": _str_field(obj, "bundle"),
        "broker": _str_field(obj, "broker") or _str_field(obj, "dst"),
        "reason": _str_field(obj, "reason"),
        "body": orjson.dumps(obj).decode(),
    }


def events_rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for kafka, key, value in _messages(batch):
        row: dict[str, Any] = {**kafka, "key": _text(key)}
        if value is None:
            row["skip_reason"] = "tombstone"
        else:
            got = event_fields(value)
            if isinstance(got, str):
                row["skip_reason"] = got
            else:
                row.update(got)
        out.append(row)
    return out


def decoder(
    table: str, partitions: int | None = None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function that decodes Kafka records (sources.KAFKA_SCHEMA) into ``table``'s rows."""
    schema = SCHEMAS[table]
    rows: Callable[[pa.RecordBatch], list[dict[str, Any]]]
    if table == "channel":

        def rows(b: pa.RecordBatch) -> list[dict[str, Any]]:
            return channel_rows(b, partitions)

    elif table == "broker_load":
        rows = broker_load_rows
    elif table == "top_bundles":
        rows = top_bundles_rows
    else:
        rows = events_rows

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            got = rows(b)
            if got:
                yield pa.RecordBatch.from_pylist(got, schema=schema)

    return run
