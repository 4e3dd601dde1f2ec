"""The report's as-of view of broker loads (``pipeline.report.asof_loads``) on real Spark equals a plain
Python reading of the same reports: per bucket, each broker's latest report published by the bucket's end
-- not a tombstone, fresh under the load TTL -- and the highest load in force at any instant of the bucket.

The reference below walks every bucket and every broker's reports directly (no intervals, no windows), so
it shares nothing with the Spark job but the definition. A handful of examples: every one is a Spark job.
"""

from __future__ import annotations

import statistics
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trimtab.pipeline.decode import SCHEMAS
from trimtab.pipeline.report import asof_loads

SLOW_OK = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
BROKERS = ("a", "b", "c")


def history_frame(spark: Any, rows: list[dict[str, Any]]) -> Any:
    """A broker_load history table (the ingest's schema) holding ``rows``; other columns null."""
    schema = SCHEMAS["broker_load"]
    full = [
        {
            "topic": "load",
            "partition": 0,
            "timestamp": r["t"],
            "tombstone": False,
            **{k: v for k, v in r.items() if k != "t"},
            "reported_at": None if r.get("tombstone") else r["t"],
        }
        for r in rows
    ]
    return spark.createDataFrame(pa.Table.from_pylist(full, schema=schema))


def _state_at(reports: list[dict[str, Any]], instant: int, ttl_ms: int) -> dict[str, Any] | None:
    """The broker's report in force at ``instant``: its latest (by time, then offset) published at or
    before it, unless that is a tombstone or older than the TTL."""
    before = [r for r in reports if r["t"] <= instant]
    if not before:
        return None
    last = max(before, key=lambda r: (r["t"], r["offset"]))
    if last.get("tombstone") or instant - last["updated_at"] > ttl_ms:
        return None
    return last


def reference(rows: list[dict[str, Any]], bucket_ms: int, ttl_ms: int) -> dict[tuple[int, str], Any]:
    """(bucket, broker) -> (load as of the bucket's end, highest load in force during it, throughput)."""
    if not rows:
        return {}
    hi = max(r["t"] for r in rows)
    out: dict[tuple[int, str], Any] = {}
    for k in range(min(r["t"] for r in rows) // bucket_ms, hi // bucket_ms + 1):
        start, end = k * bucket_ms, min(k * bucket_ms + bucket_ms - 1, hi)
        for b in BROKERS:
            mine = [r for r in rows if r["broker"] == b]
            now = _state_at(mine, end, ttl_ms)
            if now is None:
                continue
            seen = [_state_at(mine, start, ttl_ms)]
            seen += [_state_at(mine, r["t"], ttl_ms) for r in mine if start <= r["t"] <= end]
            peak = max(s["weighted_max_ema"] for s in seen if s is not None)
            thr = now["msg_throughput_in"] + now["msg_throughput_out"]
            out[(start, b)] = (now["weighted_max_ema"], peak, thr)
    return out


@st.composite
def load_histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    n = draw(st.integers(0, 14))
    rows = []
    for offset in range(n):
        t = draw(st.integers(0, 240))
        row: dict[str, Any] = {"broker": draw(st.sampled_from(BROKERS)), "t": t, "offset": offset}
        if draw(st.integers(0, 6)) == 0:
            row["tombstone"] = True
        else:
            row.update(
                weighted_max_ema=draw(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.9])),
                msg_throughput_in=float(draw(st.integers(0, 3))),
                msg_throughput_out=1.0,
                bundles=draw(st.integers(0, 5)),
                updated_at=t - draw(st.integers(0, 20)),  # sampled a little before it was published
            )
        rows.append(row)
    return rows


@settings(max_examples=12, deadline=None, suppress_health_check=SLOW_OK)
@given(rows=load_histories(), bucket_ms=st.integers(1, 60), ttl_ms=st.integers(0, 90))
def test_asof_loads_equal_a_direct_reading(
    spark: Any, rows: list[dict[str, Any]], bucket_ms: int, ttl_ms: int
) -> None:
    got = asof_loads(history_frame(spark, rows), bucket_ms, ttl_ms).collect()
    want = reference(rows, bucket_ms, ttl_ms)
    assert {(r["bucket"], r["broker"]): (r["load"], r["load_max"], r["throughput"]) for r in got} == want
    for r in got:
        published = [
            x
            for x in rows
            if x["broker"] == r["broker"] and not x.get("tombstone") and x["t"] // bucket_ms * bucket_ms == r["bucket"]
        ]
        assert r["reports"] == len(published)


def test_steady_brokers_at_different_phases_are_all_in_every_bucket(spark: Any) -> None:
    """The report's bug: 4 brokers steady at 31/34/37/82 %, each reporting every 10 s at its own phase;
    each 5 s bucket held the reports of 1 or 3 brokers and the spread sawed between 0 and 0.22."""
    loads = {"b1": 0.31, "b2": 0.34, "b3": 0.37, "b4": 0.82}
    t0 = 1_790_000_000_000
    rows = []
    for i, (b, load) in enumerate(loads.items()):
        for n in range(12):  # two minutes
            t = t0 + n * 10_000 + i * 2_500
            rows.append(
                {
                    "broker": b,
                    "t": t,
                    "offset": len(rows),
                    "weighted_max_ema": load,
                    "msg_throughput_in": 1.0,
                    "msg_throughput_out": 1.0,
                    "bundles": 3,
                    "updated_at": t,
                }
            )
    true_std = statistics.pstdev(loads.values())
    from pyspark.sql import functions as sf

    per_broker = asof_loads(history_frame(spark, rows), 5_000, 30_000)
    std = (
        per_broker.groupBy("bucket")
        .agg(sf.stddev_pop("load").alias("std"), sf.count(sf.lit(1)).alias("brokers"))
        .orderBy("bucket")
        .collect()
    )
    # From the bucket where the last broker first reported on, every bucket sees all four.
    full = [r for r in std if r["bucket"] >= t0 + 5_000]
    assert len(full) == 23
    assert all(r["brokers"] == 4 and abs(r["std"] - true_std) < 1e-9 for r in full), full
    assert abs(true_std - 0.2106) < 1e-3

    # b4 stops reporting: it stays for its TTL (30 s after its last sample), then drops out.
    last_b4 = max(r["t"] for r in rows if r["broker"] == "b4")
    cut = [r for r in rows if r["broker"] != "b4" or r["t"] <= last_b4 - 60_000]
    gone_at = last_b4 - 60_000 + 30_000  # fresh while (as of) - updated_at <= TTL
    got = asof_loads(history_frame(spark, cut), 5_000, 30_000).collect()
    b4 = {r["bucket"] for r in got if r["broker"] == "b4"}
    buckets = sorted({r["bucket"] for r in got})
    assert b4 == {b for b in buckets if b + 4_999 <= gone_at}
    assert max(b4) < gone_at < max(buckets)
    for b in buckets:
        there = {r["broker"] for r in got if r["bucket"] == b}
        assert there == ({"b1", "b2", "b3", "b4"} if b in b4 else {"b1", "b2", "b3"}) or b < t0 + 5_000
