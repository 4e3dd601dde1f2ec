"""``trimtab pipeline report``: what the cluster did, from the Parquet history, as an HTML page with plots.

Spark computes the aggregates over the history (``pipeline ingest``); they are small, so the driver writes
each one as a Parquet file (``aggregates/<name>.parquet``, the figures behind every plot) and draws the PNGs
with matplotlib:

* ``broker_load``     per time bucket, every broker live as of the bucket's end (its latest report, not a
                      tombstone, younger than ``load.ttl_s``): that report's ``weighted_max_ema``,
                      throughput and bundles, the highest load in force during the bucket, the reports
                      published in it (:func:`asof_loads`: a report is a state, not an event)
* ``load_std``        per bucket: the spread (population std) and mean of those brokers' loads, beside the
                      shedder's target (``shedding.target_std``)
* ``moves``           per hour and reason: shedder moves (by the shedder's reason), healing reassignments,
                      operators' transfers and unloads, splits, stuck states forced onward (events topic)
* ``healing``         per failed broker: recorded -> healed (or cancelled), and the bundles moved for it
* ``hottest_bundles`` the bundles with the highest reported throughput (top-bundles topic), and their
                      mean throughput while listed, each report weighted by how long it held
                      (:func:`hottest_bundles`)
* ``assignment_latency`` per hour: Assigning -> Owned, from the records' timestamps of the transitions the
                      channel accepted -- decided by the nodes' own replay (``pipeline.fold.transitions``)
* ``poison``          per table, the values the decoders refused, by reason

Lookup latency is not recorded on any topic (agents export it as the Prometheus histogram trimtab_lookup_duration_seconds only), so the report
says so rather than inventing it.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from trimtab.config.settings import LoadSettings
from trimtab.pipeline.common import Progress
from trimtab.pipeline.fold import Transition, transitions
from trimtab.pipeline.ingest import TABLES, History, read_table

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

#: The load TTL when the caller gives none: the settings' default (``load.ttl_s``, 30 min).
DEFAULT_LOAD_TTL_S = float(LoadSettings.model_fields["ttl_s"].default)
_BUCKETS_S = (1, 5, 10, 30, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 86400)
_TRANSITION_ARROW = pa.schema(
    [
        ("bundle", pa.string()),
        ("from_state", pa.string()),
        ("to_state", pa.string()),
        ("from_ts", pa.int64()),
        ("to_ts", pa.int64()),
        ("src", pa.string()),
        ("dst", pa.string()),
        ("force", pa.bool_()),
        ("version", pa.int64()),
    ]
)


@dataclass
class ReportResult:
    out: Path
    figures: dict[str, Any] = field(default_factory=dict)
    plots: list[str] = field(default_factory=list)
    aggregates: dict[str, int] = field(default_factory=dict)  # name -> rows


def choose_bucket_s(span_ms: int, points: int = 150) -> int:
    """A readable bucket (1 s ... 1 day) giving about ``points`` buckets over ``span_ms``."""
    want = max(1.0, span_ms / 1000 / points)
    for b in _BUCKETS_S:
        if b >= want:
            return b
    return _BUCKETS_S[-1]


def _load_span_ms(bl: DataFrame) -> int:
    """Milliseconds from the first to the last load report or tombstone (0 without any)."""
    from pyspark.sql import functions as sf

    got = _load_events(bl).agg(sf.min("t").alias("lo"), sf.max("t").alias("hi")).first()
    if got is None or got["lo"] is None:
        return 0
    return int(got["hi"]) - int(got["lo"])


def _load_events(bl: DataFrame) -> DataFrame:
    """The broker-load rows that change a broker's state: decoded reports and tombstones, each with ``t``
    (when it was published: ``reported_at``, else the Kafka timestamp) and ``fresh_from`` (what the
    balancer's ``is_fresh`` ages: ``updated_at``, the sample's time, else ``t``). Refused values are left
    out: a node's reader ignores them and keeps the broker's previous report."""
    from pyspark.sql import functions as sf

    t = sf.when(sf.col("reported_at") > 0, sf.col("reported_at")).otherwise(sf.col("timestamp"))
    return (
        bl.where(sf.col("skip_reason").isNull() & sf.col("broker").isNotNull())
        .withColumn("t", t.cast("long"))
        .withColumn(
            "fresh_from",
            sf.when(sf.col("updated_at") > 0, sf.col("updated_at")).otherwise(sf.col("t")).cast("long"),
        )
    )


def asof_loads(bl: DataFrame, bucket_ms: int, ttl_ms: int) -> DataFrame:
    """Per time bucket, every broker that is live as of the bucket's end, with its state then.

    A load report is a *state*: it holds from when it was published until the broker's next report or
    tombstone replaces it, or until it is older than the load TTL (``load.ttl_s``: the balancer ignores a
    report whose ``updated_at`` is more than that old, ``balance.load.is_fresh``). A steady broker publishes
    only every ``load.report_max_interval_s`` (15 min by default), so most buckets hold no report of it:
    taking the reports that fell into a bucket would count only the brokers that happened to publish then.
    Instead each bucket ``[b, b + bucket_ms)`` is judged as of its last millisecond (the last bucket as of
    the last report in the history, which may end inside it): the brokers whose latest report published by
    then is not a tombstone and is still fresh, and what that report says.

    Columns: ``bucket`` (ms), ``broker``, ``load`` (``weighted_max_ema`` as of the end), ``load_max`` (the
    highest ``weighted_max_ema`` in force at any moment of the bucket), ``throughput`` (in + out, as of the
    end), ``bundles`` (as of the end), ``reports`` (reports the broker published within the bucket).

    Each report becomes one row per bucket it is in force in -- at most one report per broker and instant,
    so at most brokers x buckets rows (plus the reports themselves) -- and no state crosses a task."""
    from pyspark.sql import Window
    from pyspark.sql import functions as sf

    ev = _load_events(bl)
    ends = ev.agg(sf.max("t").alias("hi")).first()
    if ends is None or ends["hi"] is None:
        return ev.sparkSession.createDataFrame(
            [],
            "bucket long, broker string, load double, load_max double, throughput double, bundles long, "
            "reports long",
        )
    hi = int(ends["hi"])
    last_k = hi // bucket_ms  # the history's last bucket, judged as of ``hi``
    order = Window.partitionBy("broker").orderBy("t", "partition", "offset")
    # [t, until): when the report is in force -- until the broker's next report or tombstone, or until the
    # TTL has passed (fresh while asof - fresh_from <= ttl_ms).
    until = sf.least(
        sf.coalesce(sf.lead("t").over(order), sf.lit(2**62)), sf.col("fresh_from") + sf.lit(ttl_ms + 1)
    )
    # A report never in force (the broker's next one came at the same instant, or it was stale when
    # published) is still one the broker published: it keeps one row, in its own bucket, for the count.
    live = sf.col("until") > sf.col("t")
    spans = (
        ev.withColumn("until", until)
        .where(~sf.col("tombstone"))
        .withColumn("live", live)
        .withColumn("k0", sf.floor(sf.col("t") / bucket_ms).cast("long"))
        .withColumn(
            "k1",
            sf.when(~sf.col("live"), sf.col("k0"))
            .when(sf.col("until") > hi, sf.lit(last_k))
            .otherwise(sf.least(sf.lit(last_k), sf.floor((sf.col("until") - 1) / bucket_ms).cast("long"))),
        )
    )
    per_bucket = spans.withColumn("k", sf.explode(sf.sequence("k0", "k1"))).withColumn(
        "asof", sf.least(sf.col("k") * bucket_ms + (bucket_ms - 1), sf.lit(hi))
    )
    thr = sf.col("msg_throughput_in") + sf.col("msg_throughput_out")
    in_force = sf.col("live") & (sf.col("until") > sf.col("asof"))  # the broker's state at the bucket's end
    state = sf.struct(
        sf.col("t"),
        sf.col("weighted_max_ema").alias("load"),
        thr.alias("throughput"),
        sf.col("bundles").alias("bundles"),
    )
    grouped = per_bucket.groupBy("k", "broker").agg(
        sf.max_by(sf.when(in_force, state), sf.when(in_force, sf.col("t"))).alias("end"),
        sf.max(sf.when(sf.col("live"), sf.col("weighted_max_ema"))).alias("load_max"),
        sf.sum(sf.when(sf.col("k") == sf.col("k0"), 1).otherwise(0)).cast("long").alias("reports"),
    )
    return grouped.where(sf.col("end").isNotNull()).select(
        (sf.col("k") * bucket_ms).cast("long").alias("bucket"),
        "broker",
        sf.col("end.load").alias("load"),
        "load_max",
        sf.col("end.throughput").alias("throughput"),
        sf.col("end.bundles").cast("long").alias("bundles"),
        "reports",
    )


def hottest_bundles(tb: DataFrame, ttl_ms: int, top: int) -> DataFrame:
    """The ``top`` bundles by the highest throughput any broker reported, with the mean while listed.

    A top-bundles report is a state too: a broker publishes one with each load report -- when its load
    moved, else every ``load.report_max_interval_s`` -- and it holds until the broker's next one (or
    tombstone), for at most the load TTL, and no later than the history's last report. A plain mean over
    the reports would weigh a minute of churn, reported ten times, above an hour of steady traffic reported
    four times; ``mean_throughput`` weighs each report by how long it held (the plain mean where no report
    held for any time: one report at the very end). A bundle outside a broker's top k is not reported at
    all, so this is the mean *while listed*, not over the whole history."""
    from pyspark.sql import Window
    from pyspark.sql import functions as sf

    good = tb.where(sf.col("skip_reason").isNull() & sf.col("broker").isNotNull()).withColumn(
        "t", sf.when(sf.col("reported_at") > 0, sf.col("reported_at")).otherwise(sf.col("timestamp"))
    )
    reports = good.select("broker", "partition", "offset", "t").distinct()
    hi = reports.agg(sf.max("t").alias("hi")).first()
    end = int(hi["hi"]) if hi is not None and hi["hi"] is not None else 0
    order = Window.partitionBy("broker").orderBy("t", "partition", "offset")
    held = reports.select(
        "partition",
        "offset",
        sf.greatest(
            sf.lit(0),
            sf.least(sf.coalesce(sf.lead("t").over(order), sf.lit(end)), sf.col("t") + ttl_ms, sf.lit(end))
            - sf.col("t"),
        ).alias("held_ms"),
    )
    thr = sf.col("msg_throughput_in") + sf.col("msg_throughput_out")
    listed = good.where(sf.col("bundle").isNotNull()).join(held, ["partition", "offset"])
    weighted = sf.sum(thr * sf.col("held_ms")) / sf.sum("held_ms")
    return (
        listed.groupBy("bundle")
        .agg(
            sf.max(thr).alias("max_throughput"),
            sf.when(sf.sum("held_ms") > 0, weighted).otherwise(sf.avg(thr)).alias("mean_throughput"),
            sf.max(sf.col("msg_rate_in") + sf.col("msg_rate_out")).alias("max_msg_rate"),
            sf.count(sf.lit(1)).alias("reports"),
            sf.max_by("broker", "t").alias("last_broker"),
        )
        .orderBy(sf.col("max_throughput").desc(), "bundle")
        .limit(top)
    )


def _transitions_task(partitions: int | None) -> Any:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        def messages() -> Iterator[tuple[Any, ...]]:
            for b in batches:
                yield from zip(
                    b.column("key").to_pylist(),
                    b.column("value").to_pylist(),
                    b.column("partition").to_pylist(),
                    strict=True,
                )

        got: list[Transition] = transitions(messages(), partitions)
        if got:
            yield pa.RecordBatch.from_pylist([t._asdict() for t in got], schema=_TRANSITION_ARROW)

    return run


def transitions_frame(
    spark: SparkSession, channel: DataFrame, partitions: int | None, tasks: int
) -> DataFrame:
    """Every accepted channel transition in the history, decided by the nodes' replay per bundle."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return (
        channel.select("key", "value", "partition", "offset")
        .repartition(tasks, "key")
        .sortWithinPartitions("partition", "offset")
        .mapInArrow(_transitions_task(partitions), from_arrow_schema(_TRANSITION_ARROW))
    )


def _channel_partitions(history: History) -> int | None:
    ms = history.manifests()
    for m in reversed(ms):
        t = m["topics"].get("channel")
        if t is not None and t["partitions"]:
            return len(t["partitions"])
    return None


def aggregates(
    spark: SparkSession,
    history_dir: str | Path,
    *,
    target_std: float,
    load_ttl_s: float = DEFAULT_LOAD_TTL_S,
    bucket_s: int | None = None,
    top: int = 20,
    tasks: int = 4,
    progress: Progress | None = None,
) -> dict[str, pd.DataFrame]:
    """Every aggregate of the report, as small pandas frames (computed by Spark over the history)."""
    from pyspark.sql import functions as sf

    say = progress or Progress("report", quiet=True)
    history = History(history_dir)
    ch, bl, tb, ev = (read_table(spark, history_dir, t) for t in TABLES)
    out: dict[str, pd.DataFrame] = {}

    say("poison values by table and reason")
    poison = None
    for name, df in zip(TABLES, (ch, bl, tb, ev), strict=True):
        part = (
            df.where(sf.col("skip_reason").isNotNull())
            .groupBy("skip_reason")
            .count()
            .withColumn("table", sf.lit(name))
        )
        poison = part if poison is None else poison.unionByName(part)
    assert poison is not None
    out["poison"] = poison.select("table", sf.col("skip_reason").alias("reason"), "count").toPandas()

    say("broker load (as of each bucket's end)")
    bucket = bucket_s or choose_bucket_s(_load_span_ms(bl))
    per_broker = asof_loads(bl, bucket * 1000, int(load_ttl_s * 1000))
    out["broker_load"] = per_broker.orderBy("bucket", "broker").toPandas()
    out["load_std"] = (
        per_broker.groupBy("bucket")
        .agg(
            sf.stddev_pop("load").alias("std"),
            sf.avg("load").alias("mean"),
            sf.count(sf.lit(1)).alias("brokers"),
        )
        .withColumn("target_std", sf.lit(float(target_std)))
        .orderBy("bucket")
        .toPandas()
    )

    say("moves per hour by reason")
    good = ev.where(sf.col("skip_reason").isNull())
    hour = (sf.floor(sf.col("ts") / 3_600_000) * 3_600_000).cast("long")
    move_schema = "struct<moves: array<struct<bundle: string, src: string, dst: string, reason: string>>>"
    shed = (
        good.where(sf.col("kind") == "shed")
        .withColumn("m", sf.explode_outer(sf.from_json("body", move_schema).getField("moves")))
        .where(sf.col("m").isNotNull())
        .select(
            hour.alias("hour"),
            sf.concat(sf.lit("shed: "), sf.coalesce(sf.col("m.reason"), sf.lit("?"))).alias("reason"),
            sf.lit(1).cast("long").alias("moves"),
        )
    )
    heal = good.where(sf.col("kind") == "heal").select(
        hour.alias("hour"),
        sf.lit("healing").alias("reason"),
        sf.get_json_object("body", "$.moved").cast("long").alias("moves"),
    )
    admin = good.where(sf.col("kind").isin("transfer", "unload")).select(
        hour.alias("hour"),
        sf.concat(sf.lit("admin: "), sf.col("kind")).alias("reason"),
        sf.lit(1).cast("long").alias("moves"),
    )
    split = good.where(sf.col("kind") == "split").select(
        hour.alias("hour"),
        sf.concat(sf.lit("split: "), sf.coalesce(sf.col("reason"), sf.lit("?"))).alias("reason"),
        sf.lit(1).cast("long").alias("moves"),
    )
    stuck = good.where(sf.col("kind") == "monitor").select(
        hour.alias("hour"),
        sf.lit("monitor: stuck").alias("reason"),
        sf.get_json_object("body", "$.stuck").cast("long").alias("moves"),
    )
    moves = (
        shed.unionByName(heal)
        .unionByName(admin)
        .unionByName(split)
        .unionByName(stuck)
        .where(sf.col("moves") > 0)
    )
    out["moves"] = (
        moves.groupBy("hour", "reason")
        .agg(sf.sum("moves").alias("moves"))
        .orderBy("hour", "reason")
        .toPandas()
    )

    say("healing timelines")
    failures = good.where(sf.col("kind").isin("broker_recorded", "broker_healed", "broker_cancelled")).select(
        "ts", "kind", "broker"
    )
    heals = good.where(sf.col("kind") == "heal").select("ts", "body")
    ends = [df.agg(sf.max("timestamp").alias("t")).first() for df in (ch, bl, ev)]
    until = max((int(e["t"]) for e in ends if e is not None and e["t"] is not None), default=0)
    out["healing"] = _healing(failures.orderBy("ts").toPandas(), heals.orderBy("ts").toPandas(), until)

    say("hottest bundles")
    out["hottest_bundles"] = hottest_bundles(tb, int(load_ttl_s * 1000), top).toPandas()

    say("assignment latency (transitions the channel accepted)")
    valid = ch.where(sf.col("key").isNotNull())
    trans = transitions_frame(spark, valid, _channel_partitions(history), tasks)
    lat = trans.where((sf.col("from_state") == "assigning") & (sf.col("to_state") == "owned")).select(
        (sf.floor(sf.col("to_ts") / 3_600_000) * 3_600_000).cast("long").alias("hour"),
        (sf.col("to_ts") - sf.col("from_ts")).alias("latency_ms"),
    )
    out["assignment_latency"] = (
        lat.groupBy("hour")
        .agg(
            sf.count(sf.lit(1)).alias("assignments"),
            sf.percentile_approx("latency_ms", 0.5).alias("p50_ms"),
            sf.percentile_approx("latency_ms", 0.9).alias("p90_ms"),
            sf.percentile_approx("latency_ms", 0.99).alias("p99_ms"),
            sf.max("latency_ms").alias("max_ms"),
        )
        .orderBy("hour")
        .toPandas()
    )
    out["transitions"] = (
        trans.groupBy("from_state", "to_state", "force").count().orderBy(sf.col("count").desc()).toPandas()
    )
    return out


def _healing(failures: pd.DataFrame, heals: pd.DataFrame, until: int) -> pd.DataFrame:
    """One row per broker failure: recorded -> healed/cancelled (end null while open; ``until`` is the end
    of the history), and the bundles healing moved for it."""
    import orjson
    import pandas as pd

    rows: list[dict[str, Any]] = []
    open_: dict[str, dict[str, Any]] = {}
    for ts, kind, broker in failures.itertuples(index=False):
        if broker is None:
            continue
        if kind == "broker_recorded":
            if broker not in open_:
                open_[broker] = {
                    "broker": broker,
                    "recorded": int(ts),
                    "ended": None,
                    "outcome": "open",
                    "moved": 0,
                }
                rows.append(open_[broker])
        elif broker in open_:
            row = open_.pop(broker)
            row["ended"] = int(ts)
            row["outcome"] = "healed" if kind == "broker_healed" else "cancelled"
    for ts, body in heals.itertuples(index=False):
        try:
            by = orjson.loads(body).get("by_failed_broker") or {}
        except orjson.JSONDecodeError:
            continue
        if not isinstance(by, dict):
            continue
        for broker, n in by.items():
            for row in rows:
                if (
                    row["broker"] == broker
                    and row["recorded"] <= ts
                    and (row["ended"] is None or ts <= row["ended"])
                ):
                    row["moved"] += int(n) if isinstance(n, int) else 0
                    break
    frame = pd.DataFrame(rows, columns=["broker", "recorded", "ended", "outcome", "moved"])
    frame["duration_s"] = (frame["ended"] - frame["recorded"]) / 1000.0
    frame["until"] = until
    return frame


# ---------------------------------------------------------------------------------------------- output


def _when(ms: Any) -> Any:
    """UTC times (naive, for matplotlib) of millisecond timestamps: one, or a DatetimeIndex of many."""
    import pandas as pd

    if isinstance(ms, (int, float)):
        return pd.Timestamp(int(ms), unit="ms")
    return pd.DatetimeIndex(pd.to_datetime(list(ms), unit="ms", utc=True)).tz_localize(None)


def _time_axis(ax: Any) -> None:
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator()  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    ax.set_xlabel("UTC")


def _hour_labels(ms: Any) -> list[str]:
    return [t.strftime("%m-%d %H:00") for t in _when(list(ms))]


def _empty(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} recorded", ha="center", va="center", transform=ax.transAxes, color="#777")
    ax.set_xticks([])
    ax.set_yticks([])


def _draw_broker_load(ax: Any, bl: pd.DataFrame) -> None:
    if not len(bl):
        _empty(ax, "load reports")
        return
    for broker, g in bl.groupby("broker"):
        ax.plot(_when(g["bucket"]), 100 * g["load"], label=str(broker), linewidth=1.5)
    ax.set_ylabel("weighted max EMA (%)")
    ax.legend(loc="upper left", fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    _time_axis(ax)


def _draw_load_std(ax: Any, st: pd.DataFrame) -> None:
    if not len(st):
        _empty(ax, "load reports")
        return
    t = _when(st["bucket"])
    ax.plot(t, st["std"], label="std of broker loads", color="#c0392b", linewidth=1.8)
    ax.plot(t, st["mean"], label="mean load", color="#2980b9", linewidth=1, alpha=0.7)
    ax.axhline(float(st["target_std"].iloc[0]), color="#27ae60", linestyle="--", label="target std")
    ax.set_ylabel("fraction of capacity")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    _time_axis(ax)


def _draw_moves(ax: Any, mv: pd.DataFrame) -> None:
    if not len(mv):
        _empty(ax, "moves")
        return
    pivot = mv.pivot_table(index="hour", columns="reason", values="moves", aggfunc="sum", fill_value=0)
    bottom = None
    labels = _hour_labels(pivot.index)
    for reason in pivot.columns:
        vals = pivot[reason].to_numpy()
        ax.bar(labels, vals, bottom=bottom, label=str(reason))
        bottom = vals if bottom is None else bottom + vals
    ax.set_ylabel("bundles moved")
    ax.legend(fontsize=8)
    ax.tick_params(axis="x", labelrotation=45)


def _draw_healing(ax: Any, he: pd.DataFrame) -> None:
    if not len(he):
        _empty(ax, "broker failures")
        return
    t0 = int(he["recorded"].min())
    for i, row in enumerate(he.itertuples(index=False)):
        end = row.until if row.ended is None or row.ended != row.ended else row.ended
        start_s, end_s = (row.recorded - t0) / 1000, (max(end, row.recorded) - t0) / 1000
        color = {"healed": "#27ae60", "cancelled": "#7f8c8d"}.get(row.outcome, "#c0392b")
        ax.barh(i, max(end_s - start_s, 0.05), left=start_s, color=color, height=0.5)
        took = f"{end_s - start_s:.1f} s" if row.outcome != "open" else f"open after {end_s - start_s:.1f} s"
        ax.text(
            start_s, i + 0.3, f"{row.broker}: {row.outcome} ({took}), {row.moved} bundles moved", fontsize=8
        )
    ax.set_ylim(-0.6, len(he) - 0.1)
    ax.set_yticks([])
    ax.set_xlabel(f"seconds since the first failure ({_when(t0).strftime('%Y-%m-%d %H:%M:%S')} UTC)")


def _draw_hottest(ax: Any, hot: pd.DataFrame) -> None:
    if not len(hot):
        _empty(ax, "top-bundle reports")
        return
    ax.barh(hot["bundle"].astype(str)[::-1], hot["max_throughput"][::-1] / 1e6, color="#e67e22")
    ax.set_xlabel("max reported throughput (MB/s)")
    ax.tick_params(axis="y", labelsize=7)


def _draw_latency(ax: Any, la: pd.DataFrame) -> None:
    if not len(la):
        _empty(ax, "assignments")
        return
    labels = _hour_labels(la["hour"])
    for q in ("p50", "p90", "p99"):
        ax.plot(labels, la[f"{q}_ms"], marker="o", label=q)
    ax.set_ylabel("Assigning -> Owned (ms)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.tick_params(axis="x", labelrotation=45)


#: (aggregate, title, caption, draw, height in inches; 0: grows with the rows)
PLOTS: tuple[tuple[str, str, str, Any, float], ...] = (
    (
        "broker_load",
        "Load per broker over time",
        "Each broker's weighted-max EMA (the figure decisions compare) as of each time bucket's end: its latest "
        "report, while fresh (load.ttl_s).",
        _draw_broker_load,
        4.5,
    ),
    (
        "load_std",
        "Load spread against the shedder's target",
        "Population std of the live brokers' loads as of each bucket's end; shedding aims below the dashed line.",
        _draw_load_std,
        4.0,
    ),
    (
        "moves",
        "Moves per hour by reason",
        "Bundles moved by the shedder (with its reason), healing, operators, splits and the monitor.",
        _draw_moves,
        4.0,
    ),
    (
        "healing",
        "Healing timelines (failure recorded -> healed)",
        "Each failed broker, from the leader recording it until every bundle it owned was owned elsewhere.",
        _draw_healing,
        0,
    ),
    (
        "hottest_bundles",
        "Hottest bundles",
        "The bundles with the highest throughput any broker reported.",
        _draw_hottest,
        0,
    ),
    (
        "assignment_latency",
        "Assignment latency per hour",
        "Time from an accepted Assigning to its Owned, from the writers' record timestamps.",
        _draw_latency,
        4.0,
    ),
)


def plot_all(aggs: dict[str, pd.DataFrame], plots: Path) -> list[tuple[str, str, str]]:
    """Draw one PNG per entry of :data:`PLOTS`; returns (aggregate, file, title) for each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots.mkdir(parents=True, exist_ok=True)
    made: list[tuple[str, str, str]] = []
    for name, title, _, draw, height in PLOTS:
        df = aggs[name]
        fig, ax = plt.subplots(figsize=(10, height or max(2.5, 0.4 * len(df) + 1.5)))
        draw(ax, df)
        ax.set_title(title)
        fig.tight_layout()
        fig.savefig(plots / f"{name}.png", dpi=100)
        plt.close(fig)
        made.append((name, f"plots/{name}.png", title))
    return made


def _table_html(df: pd.DataFrame, limit: int = 25) -> str:
    if not len(df):
        return "<p class=muted>none</p>"
    cols = list(df.columns)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
    body = []
    for row in df.head(limit).itertuples(index=False):
        cells = []
        for v in row:
            if isinstance(v, float):
                text = "" if math.isnan(v) else f"{v:,.4g}"
            else:
                text = str(v)
            cells.append(f"<td>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = f"<p class=muted>{len(df) - limit} more rows in the Parquet file</p>" if len(df) > limit else ""
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{more}"


def write_report(
    spark: SparkSession,
    history_dir: str | Path,
    out: str | Path,
    *,
    target_std: float,
    load_ttl_s: float = DEFAULT_LOAD_TTL_S,
    bucket_s: int | None = None,
    top: int = 20,
    tasks: int = 4,
    progress: Progress | None = None,
) -> ReportResult:
    """Compute the aggregates, write them as Parquet, draw the plots, write ``index.html``."""
    import pyarrow.parquet as pq

    say = progress or Progress("report", quiet=True)
    out = Path(out)
    (out / "aggregates").mkdir(parents=True, exist_ok=True)
    aggs = aggregates(
        spark,
        history_dir,
        target_std=target_std,
        load_ttl_s=load_ttl_s,
        bucket_s=bucket_s,
        top=top,
        tasks=tasks,
        progress=say,
    )
    result = ReportResult(out)
    for name, df in aggs.items():
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), out / "aggregates" / f"{name}.parquet")
        result.aggregates[name] = len(df)
    say("drawing plots")
    made = plot_all(aggs, out / "plots")
    result.plots = [f for _, f, _ in made]
    history = History(history_dir)
    manifests = history.manifests()
    rows = {t: sum(m["rows"].get(t, 0) for m in manifests) for t in TABLES}
    st, mv, la = aggs["load_std"], aggs["moves"], aggs["assignment_latency"]
    result.figures = {
        "runs": len(manifests),
        "rows": rows,
        "brokers": int(aggs["broker_load"]["broker"].nunique()) if len(aggs["broker_load"]) else 0,
        "moves": int(mv["moves"].sum()) if len(mv) else 0,
        "moves_by_reason": {str(k): int(v) for k, v in mv.groupby("reason")["moves"].sum().items()}
        if len(mv)
        else {},
        "failures": len(aggs["healing"]),
        "assignments": int(la["assignments"].sum()) if len(la) else 0,
        "final_std": float(st["std"].iloc[-1]) if len(st) else None,
        "poison": int(aggs["poison"]["count"].sum()) if len(aggs["poison"]) else 0,
    }
    captions = {name: caption for name, _, caption, _, _ in PLOTS}
    sections = []
    for name, file, title in made:
        sections.append(
            f"<h2>{html.escape(title)}</h2><p>{html.escape(captions[name])}</p>"
            f"<img src='{file}' alt='{html.escape(title)}'>"
            f"<details><summary>figures (aggregates/{name}.parquet)</summary>{_table_html(aggs[name])}</details>"
        )
    f = result.figures
    summary = (
        f"<ul><li>{f['runs']} ingest runs; rows: "
        + ", ".join(f"{html.escape(t)} {n:,}" for t, n in rows.items())
        + f"</li><li>{f['brokers']} brokers reported load; {f['moves']:,} bundles moved; {f['failures']} broker "
        f"failures; {f['assignments']:,} assignments</li><li>{f['poison']:,} values refused by the decoders "
        "(table <em>poison</em> below)</li><li>Lookup latency is not recorded on the cluster's topics: see the agents' "
        "<code>trimtab_lookup_duration_seconds</code> metric.</li></ul>"
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>trimtab report</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1060px; margin: 2em auto; color: #222; }}
img {{ max-width: 100%; border: 1px solid #ddd; }}
table {{ border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }}
td, th {{ border: 1px solid #ccc; padding: 2px 6px; text-align: right; }}
.muted {{ color: #777; }}
</style></head><body>
<h1>trimtab: what the cluster did</h1>
<p class=muted>From the history in {html.escape(str(history_dir))}; generated {time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}.</p>
{summary}
{"".join(sections)}
<h2>Poison values</h2><p>Values no decoder accepted, kept in the history with their reason.</p>{_table_html(aggs["poison"])}
<h2>Channel transitions</h2><p>Accepted transitions by kind (forced = the leader's overrides).</p>{_table_html(aggs["transitions"])}
</body></html>
"""
    (out / "index.html").write_text(page, encoding="utf-8")
    say(f"wrote {out / 'index.html'}")
    return result
