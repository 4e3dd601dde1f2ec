"""The agent memory benchmark (issue "Fast at every size", point 3): the resident memory of a real agent
process tracking 1 000 000 bundles.

``bytes_per_bundle`` (``trimtab bench channel``) is the table alone, traced in the bench's own process. An
operator sizes the sidecar by what the kernel charges for the whole agent: the interpreter, the libraries,
the Kafka client's buffers, the HTTP server, and every index the agent keeps beside the table (owners for
placement, the naming index, the lookup cache). This measures that, on the local cluster's real ZooKeeper
and real Apache Kafka:

1. a cluster with no node: ZooKeeper, Kafka, the topics as ``trimtab topics ensure`` makes them;
2. one agent on the empty channel, ready: ``agent_rss_mb_empty`` (what an agent costs before any bundle);
3. the channel filled with ``bundles`` bundles owned by ``owners`` other brokers (``Assigning v1 -> Owned
   v2``, 2 records a bundle, produced in bulk as a controller would have written them over time) -- brokers
   that are not registered, and no controller, so nothing moves while it is measured;
4. a second agent started on that channel, ready (its bootstrap read every record): its table is checked
   through its own metrics (``trimtab_channel_bundles{state="Owned"}`` = ``bundles``, ``trimtab_channel_
   records{outcome="accepted"}`` = every record, nothing skipped), then its RSS sampled ``samples`` times a
   second apart: ``agent_rss_mb_1m_bundles`` is the median (the spread beside it), ``agent_rss_mb_peak``
   the kernel's high-water mark (``VmHWM``: the bootstrap's transient peak), and
   ``agent_bytes_per_bundle`` = (RSS - empty RSS) / bundles.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from trimtab.channel.records import State
from trimtab.config.loader import load_settings
from trimtab.devkit.bench.channel import bulk_produce, owned_pairs_log
from trimtab.devkit.bench.common import (
    BenchError,
    Progress,
    bench_workdir,
    environment,
    loadavg,
    progress_printer,
)
from trimtab.devkit.localcluster import LocalCluster, Node

RSS_TARGET_MB = 350.0
MB = 1024 * 1024


def _metric(text: str, name: str, **labels: str) -> float:
    """The sum of a sample's values in the Prometheus exposition ``text`` (the agent's own /metrics) whose
    labels include ``labels``; 0 if there is none."""
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    )


def _kib_field(pid: int, field: str) -> float:
    """A ``/proc/<pid>/status`` field in MiB (``VmRSS``, ``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024 / MB
    raise BenchError(f"no {field} in /proc/{pid}/status")


def _rss_samples(node: Node, samples: int) -> list[float]:
    proc = psutil.Process(node.pid)
    out = []
    for i in range(samples):
        if i:
            time.sleep(1.0)  # samples a second apart: the agent's periodic jobs run between them
        out.append(proc.memory_info().rss / MB)
    return out


def _check_table(node: Node, bundles: int, records: int) -> dict[str, float]:
    text = httpx.get(f"{node.http}/metrics", timeout=30).text
    seen = {
        "owned": _metric(text, "trimtab_channel_bundles", state=State.OWNED.value),
        "accepted": _metric(text, "trimtab_channel_records_total", outcome="accepted"),
        "rejected_or_skipped": _metric(text, "trimtab_channel_records_total")
        - _metric(text, "trimtab_channel_records_total", outcome="accepted"),
        "ready": _metric(text, "trimtab_channel_ready"),
    }
    if seen != {"owned": bundles, "accepted": records, "rejected_or_skipped": 0, "ready": 1}:
        raise BenchError(
            f"the agent's table is not the channel's: {seen} (want {bundles} owned, {records} accepted)"
        )
    return seen


def run(
    *,
    bundles: int = 1_000_000,
    owners: int = 1000,
    samples: int = 5,
    workdir: Path | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    progress = progress or progress_printer("agent-memory")
    load_start = loadavg()
    with bench_workdir(workdir, "trimtab-bench-agent-memory-", progress) as base:
        cluster = LocalCluster(
            base,
            brokers=0,
            controllers=0,
            # The production defaults; no controller, so nothing moves while the memory is measured.
            cluster_name="bench-agent-memory",
        )
        progress("starting ZooKeeper and Kafka...")
        cluster.start()
        try:
            s = load_settings(cluster.config_path, environ=False)
            empty = cluster.add_agent(wait=True)
            _check_table(empty, 0, 0)
            rss_empty = statistics.median(_rss_samples(empty, samples))
            progress(f"an agent on the empty channel: {rss_empty:.1f} MiB RSS")
            cluster.terminate(empty.name)

            log = owned_pairs_log(bundles, brokers=owners, partitions=s.kafka.channel_partitions)
            progress(f"producing {len(log.messages)} records of {bundles} bundles...")
            produce_s = bulk_produce(cluster.bootstrap_servers, s.kafka.channel_topic, log.messages)
            progress(f"produced in {produce_s:.1f} s; starting an agent on the full channel...")
            t0 = time.monotonic()
            node = cluster.add_agent(wait=False)
            cluster.wait_node(node, 300)
            ready_s = time.monotonic() - t0
            seen = _check_table(node, bundles, len(log.messages))
            rss = _rss_samples(node, samples)
            peak = _kib_field(node.pid, "VmHWM")
            _check_table(node, bundles, len(log.messages))  # still the same table after the samples
        finally:
            cluster.stop()
    median = statistics.median(rss)
    progress(f"{bundles} bundles: {median:.1f} MiB RSS (peak {peak:.1f}), ready in {ready_s:.1f} s")
    return {
        "bench": "agent-memory",
        "agent_rss_mb_1m_bundles" if bundles == 1_000_000 else "agent_rss_mb": round(median, 1),
        "agent_rss_mb_runs": [round(x, 1) for x in rss],
        "agent_rss_mb_peak": round(peak, 1),
        "agent_rss_mb_empty": round(rss_empty, 1),
        "agent_bytes_per_bundle": round((median - rss_empty) * MB / bundles) if bundles else None,
        "agent_rss_mb_target": RSS_TARGET_MB,
        "meets_targets": {"agent_rss_mb": median < RSS_TARGET_MB},
        "bundles": bundles,
        "owners": owners,
        "records": len(log.messages),
        "table_seen_by_the_agent": seen,
        "checks": {
            "table_matches_the_channel": True,  # _check_table raised otherwise, before and after sampling
            "note": "the agent's metrics: every bundle Owned, every record accepted, none skipped, ready",
        },
        "kafka_produce_s": round(produce_s, 2),
        "agent_ready_s": round(ready_s, 2),
        "note": (
            "RSS of the agent process (psutil), median of samples a second apart once it is ready; the "
            "bundles are owned by brokers that are not registered and no controller runs, so nothing moves"
        ),
        "env": environment(load_start, "confluent-kafka", "uvicorn"),
    }
