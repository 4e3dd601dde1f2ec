"""The report's as-of view of broker loads (``pipeline.report.asof_loads``) on real Spark equals a plain
Python reading of the same reports: per bucket, each broker's latest report published by the bucket's end
-- not a tombstone, fresh under the load TTL -- and the highest load in force at any instant of the bucket.

The reference below walks every bucket and every broker's reports directly (no intervals, no windows), so
it shares nothing with the Spark job but the definition. A handful of examples: every one is a Spark job.
"""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trimtab.pipeline.decode import SCHEMAS
from trimtab.pipeline.report import asof_loads, hottest_bundles, write_report

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
    rows: list[dict[str, Any]] = []
    for offset in range(n):
        t = 1000 + draw(st.integers(0, 240))  # epoch ms are positive: 0 means "no sample time"
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


@settings(max_examples=8, deadline=None, suppress_health_check=SLOW_OK)
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
            if x["broker"] == r["broker"]
            and not x.get("tombstone")
            and x["t"] // bucket_ms * bucket_ms == r["bucket"]
        ]
        assert r["reports"] == len(published)


def test_steady_brokers_at_different_phases_are_all_in_every_bucket(spark: Any, tmp_path: Path) -> None:
    """The report's bug: 4 brokers steady at 31/34/37/82 %, each reporting every 10 s at its own phase;
    each 5 s bucket held the reports of 1 or 3 brokers and the spread sawed between 0 and 0.22."""
    loads = {"b1": 0.31, "b2": 0.34, "b3": 0.37, "b4": 0.82}
    t0 = 1_790_000_000_000
    rows: list[dict[str, Any]] = []
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
    assert abs(true_std - 0.2089) < 1e-3  # the ≈ 0.21 the report should have said

    # The whole report over a history holding those reports: its headline and load_std.parquet.
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(history_frame(spark, rows).toPandas(), schema=SCHEMAS["broker_load"])
    part = tmp_path / "history" / "broker_load" / "date=2026-09-21"
    part.mkdir(parents=True)
    pq.write_table(table, part / "run-00000001-part-0.parquet")
    rep = write_report(
        spark, tmp_path / "history", tmp_path / "report", target_std=0.1, load_ttl_s=30, bucket_s=5
    )
    assert rep.figures["final_std"] is not None and abs(rep.figures["final_std"] - true_std) < 1e-9
    spread = pq.read_table(tmp_path / "report" / "aggregates" / "load_std.parquet").to_pandas()
    assert (spread["brokers"].iloc[1:] == 4).all() and (abs(spread["std"].iloc[1:] - true_std) < 1e-9).all()

    # b4 stops reporting: it stays for its TTL (30 s after its last sample), then drops out.
    last_b4 = max(r["t"] for r in rows if r["broker"] == "b4")
    cut = [r for r in rows if r["broker"] != "b4" or r["t"] <= last_b4 - 60_000]
    gone_at = last_b4 - 60_000 + 30_000  # fresh while (as of) - updated_at <= TTL
    got = asof_loads(history_frame(spark, cut), 5_000, 30_000).collect()
    b4 = {r["bucket"] for r in got if r["broker"] == "b4"}
    buckets = sorted({r["bucket"] for r in got})
    first_b4 = t0 + 3 * 2_500
    assert b4 == {b for b in buckets if first_b4 <= b + 4_999 <= gone_at}
    assert max(b4) < gone_at < max(buckets)
    for b in buckets:
        there = {r["broker"] for r in got if r["bucket"] == b}
        if b >= t0 + 5_000:
            assert there == ({"b1", "b2", "b3", "b4"} if b in b4 else {"b1", "b2", "b3"}), b


def test_hottest_bundles_mean_weighs_each_report_by_how_long_it_held(spark: Any) -> None:
    """A burst of reports on change (nine in a second) must not outweigh the steady ones around it: the
    mean while listed is per unit of time, the maximum is still the burst's."""
    stamps = [s * 10_000 for s in range(11)] + [50_000 + 100 * i for i in range(1, 10)]
    thr = {t: (100.0 if 50_000 < t < 60_000 else 10.0) for t in stamps}
    rows = [
        {"topic": "top", "partition": 0, "offset": i, "timestamp": t, "broker": "a", "tombstone": False}
        | {"reported_at": t, "rank": 0, "bundle": "t/ns/0x0_0x1", "msg_throughput_in": thr[t]}
        | {"msg_throughput_out": 0.0, "msg_rate_in": 1.0, "msg_rate_out": 0.0}
        for i, t in enumerate(sorted(stamps))
    ]
    tb = spark.createDataFrame(pa.Table.from_pylist(rows, schema=SCHEMAS["top_bundles"]))
    (got,) = hottest_bundles(tb, 60_000, 5).collect()
    ordered = sorted(stamps)
    held = {t: (nxt - t) for t, nxt in itertools.pairwise(ordered)}  # the last holds 0 ms
    want = sum(thr[t] * h for t, h in held.items()) / sum(held.values())
    assert abs(want - 18.91) < 1e-9  # not the 50.5 a plain mean over the 20 reports gives
    assert abs(got["mean_throughput"] - want) < 1e-9
    assert got["max_throughput"] == 100.0 and got["reports"] == 20 and got["last_broker"] == "a"


def test_two_reports_at_one_instant_are_both_counted(spark: Any) -> None:
    """Found by the property above: a broker that publishes twice at the same instant published two
    reports in that bucket, though only the later one is ever in force."""
    report = {"weighted_max_ema": 0.0, "msg_throughput_in": 0.0, "msg_throughput_out": 1.0, "bundles": 0}
    rows = [
        {"broker": "a", "t": 1000, "offset": 0, "tombstone": True},
        {"broker": "b", "t": 1109, "offset": 1, **report, "updated_at": 1109},
        {"broker": "b", "t": 1109, "offset": 2, **report, "updated_at": 1109},
    ]
    got = asof_loads(history_frame(spark, rows), 1, 0).collect()
    assert [(r["bucket"], r["broker"], r["reports"]) for r in got] == [(1109, "b", 2)]
