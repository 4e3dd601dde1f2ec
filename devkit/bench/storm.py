"""The lookup storm benchmark (issue "Fast at every size", point 2): a broker owning 10 000 bundles dies, and
1 000 clients at once ask 100 000 lookups for the topics of those bundles through the surviving agents.

Pulsar's headline for its extensible load manager is the time to reconnect 100 000 publishers after
restarting brokers; trimtab's equivalent is this moment -- every client of a dead broker asking at once
where its topics went. Each must get the new owner, the cluster must not assign a bundle twice under the
load, and the last answer should come within seconds of the failure's detection.

1. The failover bench's cluster and set-up (devkit/bench/failover.py): ``agents`` agents with simulated
   brokers and a controller, a real ZooKeeper and a real Apache Kafka; ``bundles`` bundles assigned to one
   broker, the victim, through the channel, until it serves them all.
2. ``topics_per_bundle`` topics per bundle, found by hashing names into each bundle (``lookups`` in all),
   split evenly over the survivors; each survivor gets one ``wrk`` process with ``clients / survivors``
   keep-alive connections (the clients), which asks each of its topics until it has an answer for every
   one of them, then stops (a lookup answered with an error is asked again, like a client's retry, after
   ``RETRY_DELAY_MS``). The wrk script checks every answer: 200, a topic it asked, an owner among the
   surviving brokers.
3. ``kill -9`` of the victim; the ``wrk`` processes start the moment its ``brokers/<id>`` znode vanishes
   (the failure's detection, as ZooKeeper sees it): lookups before that are a client's business with a
   dead broker, not the control plane's.
4. ``lookup_storm_s`` = detection -> the last answer (when the last ``wrk`` reported it had every answer).
   ``lookup_storm_errors`` = answers that were not a 200 naming a surviving broker for the topic asked
   (each asked again until it was); ``lookup_storm_stale_answers`` = those among them that named another
   broker (the dead one).
   ``assignments_per_bundle_max`` = the most new owners any bundle got after the kill, from the channel.
5. The failover bench's checks after it: every bundle owned once by a survivor in every view, overridden
   exactly once, acquired exactly once by its new owner's broker, no other process died.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psutil
from kazoo.client import KazooClient

from trimtab.channel.bundles import BundleLayout, TopicName
from trimtab.cluster.zk import ZkPaths
from trimtab.config.loader import load_settings
from trimtab.config.merge import deep_merge
from trimtab.devkit.bench.common import (
    BenchError,
    ChannelWatch,
    Progress,
    bench_workdir,
    environment,
    loadavg,
    progress_printer,
    wrk_with_script,
)
from trimtab.devkit.bench.failover import (
    KAFKA_PROCESS,
    FailoverRun,
    MoveTracker,
    ZkMarks,
    _cpu,
    _start_replica,
    base_settings,
    bundle_names,
    channel_timings,
    stop_all,
)
from trimtab.devkit.kafka_server import KafkaCluster
from trimtab.devkit.localcluster import LocalCluster, Node

STORM_TARGET_S = 10.0
RETRY_DELAY_MS = 50
WRK_TIMEOUT_S = 120
WRK_SCRIPT = r"""
local live = {}
for b in string.gmatch(os.getenv("TRIMTAB_STORM_LIVE"), "[^,]+") do live[b] = true end
local retry_ms = tonumber(os.getenv("TRIMTAB_STORM_RETRY_MS"))
local paths, index = {}, {}
local n = 0
for line in io.lines(os.getenv("TRIMTAB_STORM_PATHS")) do
  n = n + 1
  paths[n] = "/v1/lookup?topic=" .. line
  index[line] = n
end
local answered = {}
local next_i = 0
local first_pass = true
answers, errors, wrong, requests, retries = 0, 0, 0, 0, 0
local threads = {}
setup = function(thread) table.insert(threads, thread) end

request = function()
  -- The first pass asks each topic once, in order; then only those still without an answer, again.
  for _ = 1, n do
    next_i = next_i + 1
    if next_i > n then
      next_i = 1
      first_pass = false
    end
    if not answered[next_i] then
      requests = requests + 1
      if not first_pass then retries = retries + 1 end
      return wrk.format("GET", paths[next_i])
    end
  end
  return wrk.format("GET", paths[1])
end

delay = function()
  if first_pass then return 0 end
  return retry_ms
end

response = function(status, headers, body)
  if status ~= 200 then
    errors = errors + 1
    return
  end
  local topic = string.match(body, '"topic":"(.-)"')
  local owner = string.match(body, '"owner":"(.-)"')
  local i = topic and index[topic]
  if not i or not owner or not live[owner] then
    wrong = wrong + 1  -- another topic's answer, or an owner that is not a surviving broker
    return
  end
  if not answered[i] then
    answered[i] = true
    answers = answers + 1
    if answers == n then
      -- wrk runs for its whole -d otherwise: say so at once (the bench notes the time and interrupts it)
      io.write("TRIMTAB_DONE\n")
      io.flush()
      wrk.thread:stop()
    end
  end
end

done = function(summary, latency, req)
  local t = threads[1]
  io.write(string.format("TRIMTAB {\"answers\": %d, \"errors\": %d, \"wrong\": %d, \"requests\": %d, " ..
    "\"retries\": %d, \"responses\": %d, \"socket_errors\": %d, \"duration_us\": %d, \"p50_us\": %d, " ..
    "\"p99_us\": %d, \"max_us\": %d}\n",
    t:get("answers"), t:get("errors"), t:get("wrong"), t:get("requests"), t:get("retries"),
    summary.requests, summary.errors.connect + summary.errors.read + summary.errors.write +
    summary.errors.timeout, summary.duration, latency:percentile(50), latency:percentile(99), latency.max))
end
"""


def storm_topics(bundles: list[str], per_namespace: int, per_bundle: int) -> dict[str, list[str]]:
    """bundle -> ``per_bundle`` topics whose hash falls in it (the failover bench's default layouts of
    ``per_namespace`` bundles)."""
    by_ns: dict[str, list[str]] = {}
    for b in bundles:
        ns, _, _ = b.rpartition("/")
        by_ns.setdefault(ns, []).append(b)
    out: dict[str, list[str]] = {b: [] for b in bundles}
    for ns, mine in by_ns.items():
        layout = BundleLayout.default(ns, per_namespace)
        wanted = set(mine)
        missing = len(mine)
        i = 0
        while missing:
            topic = f"persistent://{ns}/storm-{i}"
            i += 1
            b = layout.bundle_for_topic(TopicName.parse(topic))
            if b in wanted and len(out[b]) < per_bundle:
                out[b].append(topic)
                if len(out[b]) == per_bundle:
                    missing -= 1
            if i > 1000 * per_bundle * len(mine):
                raise BenchError(f"could not find {per_bundle} topics for every bundle of {ns}")
    return out


def _run_wrk(url: str, paths: Path, live: set[str], connections: int) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "TRIMTAB_STORM_PATHS": str(paths),
        "TRIMTAB_STORM_LIVE": ",".join(sorted(live)),
        "TRIMTAB_STORM_RETRY_MS": str(RETRY_DELAY_MS),
    }
    wrk = wrk_with_script(paths, WRK_SCRIPT)
    cmd = [*wrk, "-t1", f"-c{connections}", f"-d{WRK_TIMEOUT_S}s", "--timeout", "30s", url]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wrk_result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """Wait for ``proc``'s last answer (its ``TRIMTAB_DONE`` line: wrk itself would run for its whole
    ``-d``), note the time, interrupt it so that it prints its summary, and return that summary with
    ``last_answer_at`` (``time.time``)."""
    assert proc.stdout is not None and proc.stderr is not None
    last_answer_at = None
    cpu = None
    lines: list[str] = []
    for line in proc.stdout:  # ends when wrk exits: at -d at the latest
        if line.startswith("TRIMTAB_DONE"):
            last_answer_at = time.time()
            with contextlib.suppress(psutil.Error):
                t = psutil.Process(proc.pid).cpu_times()
                cpu = t.user + t.system
            proc.send_signal(signal.SIGINT)
        lines.append(line)
    proc.wait(30)
    summary = next((ln for ln in lines if ln.startswith("TRIMTAB ")), None)
    if summary is None or last_answer_at is None:
        raise BenchError(
            f"wrk ended ({proc.returncode}) without answers to all its lookups: {proc.stderr.read().strip()} "
            f"{''.join(lines)[-2000:]}"
        )
    r: dict[str, Any] = orjson.loads(summary.removeprefix("TRIMTAB "))
    r["last_answer_at"] = last_answer_at
    r["cpu_s"] = round(cpu, 3) if cpu is not None else None
    return r


def _topic_files(workdir: Path, survivors: list[Node], topics: list[str]) -> list[tuple[Node, Path]]:
    """Each survivor's share of ``topics``, one per line in a file of its own (read by its wrk)."""
    files = []
    for i, node in enumerate(survivors):
        f = workdir / f"storm-{node.name}.txt"
        f.write_text("".join(f"{t}\n" for t in topics[i :: len(survivors)]))
        files.append((node, f))
    return files


@dataclass
class Storm:
    """What :func:`_kill_and_storm` saw: wall-clock times (``time.time``) and each wrk's summary."""

    t_kill: float
    detected: float  # the victim's broker znode gone (kazoo's thread)
    t_start: float  # the wrk processes started
    n_changes: int  # the bench replica's changes before the kill
    tracker: MoveTracker
    results: list[dict[str, Any]]
    cpu_s: dict[str, float]  # CPU seconds of each process from the wrk start to the last answer


def _kill_and_storm(
    zk: KazooClient,
    paths: ZkPaths,
    run: FailoverRun,
    files: list[tuple[Node, Path]],
    per_wrk: int,
    session_timeout_s: float,
    progress: Progress,
) -> Storm:
    """Steps 3 and 4: kill -9 the victim, start one wrk per survivor the moment its znode vanishes, and
    wait for every wrk to have all its answers (killed if the bench fails meanwhile)."""
    marks = ZkMarks({})
    zk.DataWatch(paths.broker(run.victim), marks.broker_watch)
    nodes: dict[str, Any] = {n.name: n for n in run.cluster.nodes.values() if n is not run.victim_node}
    if isinstance(run.cluster.kafka, KafkaCluster):
        nodes.update({f"{KAFKA_PROCESS} {b.id}": b for b in run.cluster.kafka.brokers if b.pid})
    tracker = MoveTracker(run.names, run.survivors)
    n_changes = len(run.watch.changes)
    run.watch.client.table.add_listener(tracker.on_change)
    marks.armed.set()
    t_kill = time.time()
    run.cluster.kill(run.victim_node.name)
    deadline = time.monotonic() + session_timeout_s + 30
    while "broker_znode_gone" not in marks.marks:
        if time.monotonic() > deadline:
            raise BenchError("the victim's broker znode never disappeared")
        time.sleep(0.001)
    t_start = time.time()
    procs = [_run_wrk(node.http, f, run.survivors, per_wrk) for node, f in files]
    cpu0 = _cpu(nodes)
    try:
        detected = marks.marks["broker_znode_gone"]
        progress(f"detected {detected - t_kill:.2f} s after the kill; the storm is on")
        # One reader per wrk, all at once: each notes its wrk's last answer the moment it is told.
        with ThreadPoolExecutor(len(procs)) as pool:
            results = list(pool.map(_wrk_result, procs))
        cpu1 = _cpu(nodes)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    cpu = {n: round(cpu1[n] - cpu0[n], 3) for n in cpu1 if n in cpu0}
    return Storm(t_kill, detected, t_start, n_changes, tracker, results, cpu)


def run_config(
    workdir: Path,
    overrides: Mapping[str, Any],
    *,
    bundles: int,
    per_namespace: int,
    agents: int,
    per_bundle: int,
    clients: int,
    session_timeout_s: float,
    progress: Progress,
) -> dict[str, Any]:
    settings = deep_merge(
        deep_merge(base_settings(session_timeout_s, per_namespace), {"agent": {"lookup_rate_per_client": 0}}),
        overrides,
    )
    cluster = LocalCluster(
        workdir, brokers=agents, controllers=1, settings=settings, cluster_name="bench-storm"
    )
    progress(f"starting ZooKeeper, Kafka, {agents} agents and a controller...")
    cluster.start()
    watch: ChannelWatch | None = None
    zk: KazooClient | None = None
    try:
        s = load_settings(cluster.config_path, environ=False)
        watch = _start_replica(cluster.bootstrap_servers, s.kafka)
        names = bundle_names(bundles, per_namespace)
        run = FailoverRun(cluster, watch, names, progress)
        run.give_the_victim_every_bundle(s.kafka)
        leader = cluster.leader()
        if leader is None:
            raise BenchError("no leader")
        topics = storm_topics(names, per_namespace, per_bundle)
        all_topics = [t for b in names for t in topics[b]]
        survivors = [n for n in cluster.agents if n.broker != run.victim]
        files = _topic_files(workdir, survivors, all_topics)
        per_wrk = math.ceil(clients / len(survivors))
        progress(
            f"{len(all_topics)} topics of {len(names)} bundles; {len(survivors)} wrk x {per_wrk} connections "
            "wait for the victim's death"
        )
        zk = KazooClient(hosts=cluster.zk_hosts, timeout=10)
        zk.start(15)
        storm = _kill_and_storm(zk, ZkPaths(s.zk_path), run, files, per_wrk, session_timeout_s, progress)
        tracker, results = storm.tracker, storm.results
        if not tracker.done.wait(60):
            raise BenchError(f"{len(tracker.remaining)} bundles not owned by a survivor 60 s after the storm")
        time.sleep(0.5)  # late duplicates, if any, land before the checks
        timings = channel_timings(
            watch.changes[storm.n_changes :], names, run.victim, run.survivors, storm.t_kill
        )
        run.check_every_view_agrees(leader)
        run.check_no_other_process_died()
    finally:
        stop_all(cluster, watch, zk)

    answers = sum(r["answers"] for r in results)
    if answers != len(all_topics):
        raise BenchError(f"{answers} of {len(all_topics)} topics answered")
    wrong = sum(r["wrong"] for r in results)
    t_kill, detected, t_start = storm.t_kill, storm.detected, storm.t_start
    storm_s = max(r.pop("last_answer_at") for r in results) - detected
    # Every answer that was not a 200 naming a surviving owner (each asked again until it was).
    errors = sum(r["errors"] + r["socket_errors"] + r["wrong"] for r in results)
    assignments_max = max(timings.overridden.values())
    progress(
        f"storm {storm_s:.2f} s from detection to the last of {answers} answers; {errors} errors, "
        f"{wrong} answers naming the dead broker; at most {assignments_max} assignment(s) per bundle"
    )
    return {
        "lookup_storm_s": round(storm_s, 3),
        "lookup_storm_errors": errors,
        "lookup_storm_stale_answers": wrong,
        "assignments_per_bundle_max": assignments_max,
        "meets_targets": {
            "lookup_storm_s": storm_s <= STORM_TARGET_S,
            "lookup_storm_errors": errors == 0,
            "assignments_per_bundle_max": assignments_max == 1,
        },
        "detection_s": round(detected - t_kill, 3),
        "last_owned_after_detection_s": round(timings.owned_ts[-1] - (detected - t_kill), 3),
        "wrk": [{"agent": node.name, **r} for (node, _), r in zip(files, results, strict=True)],
        "lookups": len(all_topics),
        "bundles": len(names),
        "clients": per_wrk * len(survivors),
        "wrk_started_after_detection_s": round(t_start - detected, 4),
        "cpu_s": {
            **storm.cpu_s,
            "wrk (all)": round(sum(r["cpu_s"] or 0.0 for r in results), 3),
            "note": (
                "CPU seconds of each process from the wrk start to the last answer (the bench process "
                f"includes its channel replica); {os.cpu_count()} CPUs shared by all of them"
            ),
        },
    }


def run(
    *,
    bundles: int = 10_000,
    per_namespace: int = 1000,
    agents: int = 5,
    per_bundle: int = 10,
    clients: int = 1000,
    session_timeout_s: float = 4.0,
    settings: Mapping[str, Any] | None = None,
    workdir: Path | None = None,
    keep_workdir: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The whole benchmark; its JSON-ready result. Raises BenchError when a check fails."""
    if agents < 3:
        raise ValueError("need at least 3 agents (the victim and 2 survivors; the mass-failure guard)")
    progress = progress or progress_printer("storm")
    load_start = loadavg()
    with bench_workdir(workdir, "trimtab-bench-storm-", progress, keep=keep_workdir) as base:
        main = run_config(
            base / "storm",
            dict(settings or {}),
            bundles=bundles,
            per_namespace=per_namespace,
            agents=agents,
            per_bundle=per_bundle,
            clients=clients,
            session_timeout_s=session_timeout_s,
            progress=progress,
        )
    out: dict[str, Any] = {"bench": "storm", **main}
    out["targets"] = {
        "lookup_storm_s": STORM_TARGET_S,
        "lookup_storm_errors": 0,
        "assignments_per_bundle_max": 1,
    }
    out["checks"] = {
        "every_topic_answered_with_a_live_owner": True,
        "every_bundle_owned_by_a_survivor_in_every_view": True,
        "each_bundle_overridden_exactly_once": True,
        "no_other_process_died": True,
        "note": "any failed check aborts the bench with a non-zero exit before this JSON is printed",
    }
    out["cluster"] = {
        "agents": agents,
        "controllers": 1,
        "kafka": "Apache Kafka, one KRaft broker (its own JVM)",
        "client": "one wrk per surviving agent (Debian's wrk, one thread), all on the same 2 cores",
    }
    out["env"] = environment(load_start, "confluent-kafka", "kazoo", "uvicorn")
    return out
