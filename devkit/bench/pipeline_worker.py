"""One Spark measurement of ``trimtab bench pipeline`` in a process of its own (a fresh JVM per master):
``python -m trimtab.devkit.bench.pipeline_worker --master local[2] --input FILE --result OUT.json ...``,
or, with ``--bootstrap-servers`` and ``--topic``, the Kafka readers (``--readers python,connector``) on the
same topic in one JVM: each warmed up, then each timed reading every record and compacting the topic."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import psutil


def _tree_cpu() -> float:
    """CPU seconds of this process and every descendant alive now (the JVM, Spark's Python workers)."""
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def _jvm_times(spark: Any) -> tuple[int, int]:
    """(milliseconds the JVM's JIT compilers have spent, milliseconds of garbage collection) so far: in
    local mode the driver's JVM runs the tasks too, so these are the run's JVM costs beyond moving rows."""
    mgmt = spark.sparkContext._jvm.java.lang.management.ManagementFactory
    gc_ms = sum(max(0, bean.getCollectionTime()) for bean in mgmt.getGarbageCollectorMXBeans())
    return int(mgmt.getCompilationMXBean().getTotalCompilationTime()), int(gc_ms)


def readers(args: argparse.Namespace) -> None:
    """Each reader, in the order given: warm-up reads, then a timed full read (every value's bytes summed,
    so every record crosses into Spark) and a timed ``compact_kafka``; its table goes to ``TABLE.<reader>``."""
    from pyspark.sql import functions as sf

    from trimtab.channel.replayfile import report_json
    from trimtab.pipeline import kafka_io
    from trimtab.pipeline.common import Progress
    from trimtab.pipeline.compact import compact_kafka
    from trimtab.pipeline.session import spark_session, with_connector
    from trimtab.pipeline.sources import kafka_frame, register

    progress = Progress(f"bench readers {args.master}")
    conf = with_connector(
        {
            "spark.sql.shuffle.partitions": str(args.tasks),
            "spark.default.parallelism": str(args.tasks),
            "spark.driver.memory": args.driver_memory,
        }
    )
    names = [r for r in args.readers.split(",") if r]
    config = kafka_io.client_config(args.bootstrap_servers)
    bounds = kafka_io.resolve_bounds(config, args.topic)
    small = {p: (s, min(e, s + 5_000)) for p, (s, e) in bounds.items()}
    out: dict[str, Any] = {"master": args.master, "order": names, "readers": {}}
    with spark_session("trimtab-bench-readers", master=args.master, conf=conf, progress=progress) as spark:
        register(spark)

        def read_all(reader: str, ranges: dict[int, tuple[int, int]]) -> tuple[int, int]:
            df = kafka_frame(spark, args.bootstrap_servers, args.topic, ranges, reader=reader)
            row = df.agg(sf.count(sf.lit(1)).alias("n"), sf.sum(sf.length("value")).alias("b")).first()
            assert row is not None
            return int(row["n"]), int(row["b"] or 0)

        for reader in names:  # warm: both paths' classes loaded and Python workers started
            read_all(reader, small)
            compact_kafka(spark, args.bootstrap_servers, args.topic, reader=reader, tasks=args.tasks)
        progress("warm; timing each reader")
        for reader in names:
            cpu0, t0 = _tree_cpu(), time.perf_counter()
            records, value_bytes = read_all(reader, bounds)
            read_s, read_cpu = time.perf_counter() - t0, _tree_cpu() - cpu0
            cpu0, t0 = _tree_cpu(), time.perf_counter()
            r = compact_kafka(spark, args.bootstrap_servers, args.topic, reader=reader, tasks=args.tasks)
            compact_s, compact_cpu = time.perf_counter() - t0, _tree_cpu() - cpu0
            Path(f"{args.table}.{reader}").write_bytes(report_json(r.report))
            out["readers"][reader] = {
                "records": records,
                "value_bytes": value_bytes,
                "read_seconds": round(read_s, 3),
                "read_cpu_seconds": round(read_cpu, 2),
                "compact_seconds": round(compact_s, 3),
                "compact_cpu_seconds": round(compact_cpu, 2),
            }
            progress(f"{reader}: read {read_s:.2f} s, compact {compact_s:.2f} s")
    Path(args.result).write_text(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--master", required=True)
    ap.add_argument("--input")
    ap.add_argument("--warmup")
    ap.add_argument("--bootstrap-servers")
    ap.add_argument("--topic")
    ap.add_argument("--readers", default="python,connector")
    ap.add_argument("--tasks", type=int, required=True)
    ap.add_argument("--split-bytes", type=int, default=64 << 20)
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument("--result", required=True)
    ap.add_argument("--table", required=True)
    args = ap.parse_args()
    if args.bootstrap_servers:
        readers(args)
        return

    from trimtab.channel.replayfile import report_json
    from trimtab.pipeline.common import Progress
    from trimtab.pipeline.compact import compact_export
    from trimtab.pipeline.session import spark_session, watch_stages

    progress = Progress(f"bench {args.master}")
    conf = {
        "spark.sql.shuffle.partitions": str(args.tasks),
        "spark.default.parallelism": str(args.tasks),
        "spark.driver.memory": args.driver_memory,
    }
    with spark_session("trimtab-bench-pipeline", master=args.master, conf=conf, progress=progress) as spark:
        compact_export(spark, args.warmup, tasks=args.tasks, split_bytes=1 << 20, min_splits=args.tasks)
        progress("warm; compacting the whole file")
        jit0, gc0 = _jvm_times(spark)
        cpu0, t0 = _tree_cpu(), time.perf_counter()
        with watch_stages(spark, progress, every=10.0):
            r = compact_export(
                spark, args.input, tasks=args.tasks, split_bytes=args.split_bytes, min_splits=args.tasks
            )
        wall = time.perf_counter() - t0
        cpu = _tree_cpu() - cpu0
        jit1, gc1 = _jvm_times(spark)
    Path(args.table).write_bytes(report_json(r.report))
    Path(args.result).write_text(
        json.dumps(
            {
                "master": args.master,
                "seconds": round(wall, 2),
                "cpu_seconds_process_tree": round(cpu, 1),
                "jvm_jit_compile_s": round((jit1 - jit0) / 1000, 2),
                "jvm_gc_s": round((gc1 - gc0) / 1000, 2),
                "passes": r.passes,
                "bundles": len(r.table),
            }
        )
    )


if __name__ == "__main__":
    main()
