"""One Spark measurement of ``trimtab bench pipeline`` in a process of its own (a fresh JVM per master):
``python -m trimtab.devkit.bench.pipeline_worker --master local[2] --input FILE --result OUT.json ...``."""

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--master", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--warmup", required=True)
    ap.add_argument("--tasks", type=int, required=True)
    ap.add_argument("--split-bytes", type=int, required=True)
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument("--result", required=True)
    ap.add_argument("--table", required=True)
    args = ap.parse_args()

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
