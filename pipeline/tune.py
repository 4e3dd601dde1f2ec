"""``trimtab pipeline tune``: a what-if sweep -- the recorded history replayed through the simulator under a
grid of shedder and split settings, one simulation per Spark task, ranked, with a recommended config.

1. Spark reads the history (``pipeline ingest --out``) and reduces it to what a replay needs: each broker's
   last load report per time bucket, the top-bundles rates, and each bundle's latest channel state.
2. :func:`trimtab.sim.history.scenario_from_history` turns that into a scenario (brokers joining and
   leaving, each namespace's traffic over time).
3. The grid -- every combination of the values given per setting -- runs as one Spark task per
   combination, each a full simulation with TransferShedder (or ``--policy``), judged against the same
   balance target (the one in effect for the operator, ``shedding.target_std`` of ``--config``/``--set``).
4. Results are ranked by time to balance after the last event (never is last), then moves, then unserved
   bundle-seconds, then seconds out of balance; the best becomes a TOML snippet of the settings that differ
   from the current configuration.

The workers need trimtab with the ``sim`` extra (local mode uses this virtualenv).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trimtab.errors import ConfigError
from trimtab.pipeline.common import PipelineError
from trimtab.pipeline.sweep import rank_key, simulate_point, toml_snippet

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from trimtab.pipeline.common import Progress


def collect_history(spark: SparkSession, history: str, bucket_s: float, progress: Progress) -> dict[str, Any]:
    """The history reduced (in Spark) to what a replay needs, as plain rows for the driver."""
    from pyspark.sql import functions as sf

    from trimtab.pipeline.ingest import read_table

    bucket_ms = int(bucket_s * 1000)
    bl = read_table(spark, history, "broker_load").where(sf.col("skip_reason").isNull())
    bl = bl.withColumn("b", sf.floor(sf.col("reported_at") / bucket_ms))
    # The last report of each broker in each bucket (and every tombstone: they mark graceful exits).
    last = (
        bl.groupBy("broker", "b")
        .agg(sf.max_by(sf.struct("reported_at", "msg_rate_in", "tombstone"), "reported_at").alias("r"))
        .select("broker", "r.reported_at", "r.msg_rate_in", "r.tombstone")
    )
    tb = (
        read_table(spark, history, "top_bundles")
        .where(sf.col("skip_reason").isNull() & sf.col("bundle").isNotNull())
        .select("broker", "reported_at", "bundle", "msg_rate_in", "topics")
    )
    ch = (
        read_table(spark, history, "channel")
        .where(sf.col("skip_reason").isNull() & sf.col("bundle").isNotNull())
        .groupBy("bundle")
        .agg(sf.max_by(sf.struct("state", "offset"), "offset").alias("r"))
        .select("bundle", "r.state", "r.offset")
    )
    rows = {
        "broker_load": [r.asDict() for r in last.collect()],
        "top_bundles": [r.asDict() for r in tb.collect()],
        "channel": [r.asDict() for r in ch.collect()],
    }
    progress(
        f"history: {len(rows['broker_load'])} broker-bucket reports, {len(rows['top_bundles'])} top-bundle "
        f"rows, {len(rows['channel'])} bundles"
    )
    return rows


def tune_job(
    spark: SparkSession,
    progress: Progress,
    *,
    history: str,
    grid: dict[str, list[Any]],
    configs: list[dict[str, Any]],
    bucket_s: float,
    policy: str,
    seed: int,
    top: int,
    target_std: float,
    current: dict[str, Any],
    scenario_out: Path | None = None,
) -> dict[str, Any]:
    """The sweep: history -> scenario -> one simulation per grid point as Spark tasks -> ranking."""
    from trimtab.sim.history import scenario_from_history

    rows = collect_history(spark, history, bucket_s, progress)
    try:
        sc = scenario_from_history(
            rows["broker_load"], rows["top_bundles"], rows["channel"], bucket_s=bucket_s, seed=seed
        )
    except ConfigError as e:
        raise PipelineError(str(e)) from None
    doc = sc.model_dump(mode="json")
    # One yardstick for every grid point: the operator's current balance target.
    doc["report"] = {**doc["report"], "balance_target_std": target_std}
    if scenario_out is not None:
        import yaml

        tmp = scenario_out.with_name(f".{scenario_out.name}.tmp")
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        tmp.replace(scenario_out)
    progress(
        f"{len(configs)} simulations of {sc.duration_s:g} virtual s over {len(sc.namespaces)} namespaces"
    )
    items = [(i, doc, cfg, policy) for i, cfg in enumerate(configs)]
    results = spark.sparkContext.parallelize(items, len(items)).map(simulate_point).collect()
    results.sort(key=rank_key)
    best = results[0]
    return {
        "scenario": {
            "duration_s": sc.duration_s,
            "brokers": len(sc.broker_specs()),
            "namespaces": len(sc.namespaces),
            "events": len(sc.events),
            "balance_target_std": target_std,
        },
        "policy": policy,
        "grid": {k: grid[k] for k in sorted(grid)},
        "simulations": len(results),
        "ranked": results[:top],
        "recommended": {"config": best["config"], "toml": toml_snippet(best["config"], current)},
    }
