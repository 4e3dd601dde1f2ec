"""The lookup benchmark (docs/design.md sections 3.5 and 11): owned lookups, assignment latency, and the raw
produce->consume round trip it is compared with (assignment p99 <= 2x the raw round trip's p99).

One :class:`trimtab.devkit.localcluster.LocalCluster` per configuration -- a real ZooKeeper server, a real
Apache Kafka (one KRaft broker), 3 agents (with their simulated brokers) as separate processes, no
controllers (nothing sheds or heals while we measure) -- and in it:

1. **owned lookups**: ``topics`` topics are looked up once (so their bundles get owners), then ``lookups``
   lookups of random ones among them from ``concurrency`` keep-alive ``httpx.AsyncClient`` connections
   spread over the 3 agents. Latency per request; throughput = lookups / elapsed. Every answer must be the
   owner the first lookup got, ``how=owned``.
2. **assignment**: ``assign_samples`` sequential lookups, each of a topic in a bundle nobody owns yet. The
   namespaces' layouts are created first (one lookup per namespace via every agent, so each agent caches
   the layout: no ZooKeeper read inside a measured lookup); each measured lookup then hits another, still
   unowned, bundle of such a namespace. Every answer must say ``how=assigned``, ``Owned``, a live owner; the
   bench's own channel replica must agree and each owner's simulated broker must have acquired the bundle
   exactly once. Where the time goes is reported per sample from the records' writer timestamps
   (``breakdown``).
3. **raw round trip**: a :class:`channel.kafka.KafkaTransport` producer and a low-latency reader from
   another ``KafkaTransport`` (the channel's client settings, ``fetch.wait.max.ms =
   kafka.fetch_wait_max_ms``) on a topic of the same Kafka, one message at a time, the reader
   returning each message as soon as it has it (``poll(1, ...)``): the transport's floor. The same round
   trip through the channel's :class:`channel.transport.Follower` (how every node actually receives
   records) is reported beside it (``follower_rtt``).

A real Kafka answers a waiting fetch as soon as data arrives (``fetch.min.bytes`` 1), so
``kafka.fetch_wait_max_ms`` bounds only how often an idle reader asks again: the run is repeated with one
alternative setting (``alternative``) to show what it costs and saves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from trimtab.channel.bundles import BundleLayout, TopicName
from trimtab.channel.kafka import KafkaTransport
from trimtab.channel.records import State
from trimtab.channel.transport import Follower, Message
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
    summary_ms,
    wrk_with_script,
)
from trimtab.devkit.localcluster import LocalCluster, Node

ASSIGN_VS_RTT_TARGET = 2.0
RTT_TOPIC = "trimtab-bench-rtt"
WARMUP_LOOKUPS = 200

# Nothing but the lookup path runs: no controllers (no shedding, healing, monitor), no automatic splits.
# Its namespaces are created by lookups (namespace.auto_create: none by default).
# Every lookup comes from this machine's one address: the per-client rate limit (1 000/s by default) is off,
# or it would measure the limit rather than the agent.
BASE_SETTINGS: dict[str, Any] = {
    "split": {"enabled": False},
    "agent": {"lookup_rate_per_client": 0},
    "namespace": {"auto_create": ["bench-owned/*", "bench-assign/*"]},
}


# ---------------------------------------------------------------------------------------------- helpers


def topics_per_bundle(namespace: str, bundles: int) -> dict[str, str]:
    """bundle -> a topic whose hash falls in it, for every bundle of ``namespace``'s default layout of
    ``bundles`` equal bundles, in bundle order (also what the namespace tests look their bundles up by)."""
    layout = BundleLayout.default(namespace, bundles)
    found: dict[str, str] = {}
    i = 0
    while len(found) < bundles:
        topic = f"persistent://{namespace}/t-{i}"
        found.setdefault(layout.bundle_for_topic(TopicName.parse(topic)), topic)
        i += 1
        if i > bundles * 1000:
            raise BenchError(f"could not find a topic for every bundle of {namespace}")
    return {b: found[b] for b in layout.bundles}


def _metrics(cluster: LocalCluster) -> dict[str, dict[str, float]]:
    """Sum and count of the agents' lookup and reaction histograms, over all agents."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, float]] = {}
    for node in cluster.agents:
        text = httpx.get(f"{node.http}/metrics", timeout=10).text
        for fam in text_string_to_metric_families(text):
            if fam.name not in ("trimtab_lookup_duration_seconds", "trimtab_reaction_duration_seconds"):
                continue
            for s in fam.samples:
                if s.name.endswith("_sum") or s.name.endswith("_count"):
                    label = s.labels.get("result") or s.labels.get("kind") or "?"
                    key = f"{fam.name}{{{label}}}"
                    d = out.setdefault(key, {"sum": 0.0, "count": 0.0})
                    d["sum" if s.name.endswith("_sum") else "count"] += s.value
    return out


def _metric_means_ms(
    before: Mapping[str, Mapping[str, float]], after: Mapping[str, Mapping[str, float]]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, a in after.items():
        b = before.get(key, {"sum": 0.0, "count": 0.0})
        n = a["count"] - b["count"]
        if n > 0:
            out[key] = {"count": int(n), "mean_ms": round((a["sum"] - b["sum"]) / n * 1000, 3)}
    return out


def _agents_cpu(cluster: LocalCluster) -> float:
    """User + system CPU seconds of every agent process so far."""
    import psutil

    total = 0.0
    for n in cluster.agents:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(n.pid).cpu_times()
            total += t.user + t.system
    return total


# ---------------------------------------------------------------------------------------------- 1. owned


Answer = tuple[str, int, dict[str, Any] | str]


async def _lookup_pool(
    agents: list[str], plans: list[list[str]], concurrency: int, between: Any = None
) -> list[tuple[list[float], list[Answer], float, float]]:
    """Run each plan's lookups in turn from the same ``concurrency`` keep-alive connections (worker ``w``
    talks to agent ``w % len(agents)``); per plan (latencies, answers, elapsed, CPU of this process).
    ``between()`` runs before each plan (e.g. to read counters)."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    clients = [
        httpx.AsyncClient(base_url=agents[w % len(agents)], timeout=60, limits=limits)
        for w in range(concurrency)
    ]
    out = []
    try:
        for plan in plans:
            lat = [0.0] * len(plan)
            answers: list[Answer] = [("", 0, "")] * len(plan)
            work = iter(enumerate(plan))

            async def worker(
                c: httpx.AsyncClient, work: Any = work, lat: Any = lat, answers: Any = answers
            ) -> None:
                for i, topic in work:
                    t0 = time.perf_counter()
                    r = await c.get("/v1/lookup", params={"topic": topic})
                    lat[i] = time.perf_counter() - t0
                    answers[i] = (topic, r.status_code, r.json() if r.status_code == 200 else r.text)

            if between is not None:
                between()
            t0, c0 = time.perf_counter(), time.process_time()
            await asyncio.gather(*(worker(c) for c in clients))
            out.append((lat, answers, time.perf_counter() - t0, time.process_time() - c0))
    finally:
        for c in clients:
            await c.aclose()
    return out


def owned_topics(topics: int) -> list[str]:
    """The topics of the owned-lookup phases (32 namespaces)."""
    return [f"persistent://bench-owned/ns-{i % 32}/t-{i}" for i in range(topics)]


def owned_phase(
    cluster: LocalCluster, topics: int, lookups: int, concurrency: int, seed: int, progress: Progress
) -> dict[str, Any]:
    agents = [n.http for n in cluster.agents]
    names = owned_topics(topics)
    progress(f"owned lookups: assigning {topics} topics...")
    [(_lat, answers, _el, _cpu)] = asyncio.run(_lookup_pool(agents, [names], min(concurrency, 8)))
    owner: dict[str, str] = {}
    for topic, status, body in answers:
        if status != 200 or not isinstance(body, dict) or body["state"] != State.OWNED.value:
            raise BenchError(f"first lookup of {topic}: {status} {body}")
        owner[topic] = body["owner"]
    bundles = {body["bundle"] for _, _, body in answers if isinstance(body, dict)}
    rng = random.Random(seed)
    warm = [rng.choice(names) for _ in range(max(concurrency, min(WARMUP_LOOKUPS, lookups)))]
    plan = [rng.choice(names) for _ in range(lookups)]
    progress(
        f"owned lookups: {len(warm)} warm-up lookups, then {lookups} measured, from {concurrency} connections..."
    )
    cpu0: list[float] = []
    runs = asyncio.run(
        _lookup_pool(agents, [warm, plan], concurrency, between=lambda: cpu0.append(_agents_cpu(cluster)))
    )
    lat, answers, elapsed, cpu = runs[1]
    agents_cpu = _agents_cpu(cluster) - cpu0[1]
    bad = [
        (t, s, b)
        for t, s, b in [*runs[0][1], *answers]
        if s != 200 or not isinstance(b, dict) or b["owner"] != owner[t] or b["how"] != "owned"
    ]
    if bad:
        raise BenchError(f"{len(bad)} owned lookups answered wrongly, e.g. {bad[:3]}")
    s = summary_ms(lat)
    progress(f"owned lookups: p50 {s['p50']} ms, p99 {s['p99']} ms, {lookups / elapsed:.0f}/s (all checked)")
    return {
        "owned_lookup_p50_ms": s["p50"],
        "owned_lookup_p99_ms": s["p99"],
        "owned_lookups_per_s": round(lookups / elapsed, 1),
        "detail": {
            "latency_ms": s,
            "lookups": lookups,
            "warmup_lookups": len(warm),
            "topics": topics,
            "bundles": len(bundles),
            "owners": dict(Counter(owner.values())),
            "concurrency": concurrency,
            "connections_per_agent": {
                a: sum(1 for w in range(concurrency) if w % len(agents) == i) for i, a in enumerate(agents)
            },
            "client": (
                "httpx.AsyncClient per connection (keep-alive, one connection each, opened by the warm-up), "
                "one asyncio loop in the bench process"
            ),
            "elapsed_s": round(elapsed, 3),
            "client_cpu_s": round(cpu, 3),
            "client_cpu_share": round(cpu / elapsed, 3),
            "client_cpu_note": "CPU time of the bench process during the run (the HTTP client and its Kafka reader)",
            "client_cpu_ms_per_lookup": round(cpu / lookups * 1000, 3),
            "agents_cpu_s": round(agents_cpu, 3),
            "agents_cpu_ms_per_lookup": round(agents_cpu / lookups * 1000, 3),
            "agents_lookups_per_cpu_s": round(lookups / agents_cpu, 1) if agents_cpu > 0 else None,
            "cpu_note": (
                "on a 2-core machine the client and the 3 agents share the cores: owned_lookups_per_s is "
                "bounded by their summed CPU per lookup; agents_lookups_per_cpu_s is the agents' side alone"
            ),
        },
    }


# ------------------------------------------------------------------------------ 1b. one agent, one core

ONE_CORE_TARGET_PER_S = 10_000
HALF_RATE_P99_TARGET_MS = 5.0
WRK_SCRIPT = r"""
local paths = {}
local n = 0
bad = 0

local delay_ms = tonumber(os.getenv("TRIMTAB_WRK_DELAY_MS") or "0")
for line in io.lines(os.getenv("TRIMTAB_WRK_PATHS")) do
  n = n + 1
  paths[n] = line
end
local i = 0
local threads = {}
setup = function(thread)
  table.insert(threads, thread)
end
request = function()
  i = i % n + 1
  return wrk.format("GET", paths[i])
end
if delay_ms > 0 then
  delay = function() return delay_ms end
end
response = function(status, headers, body)

  if status ~= 200 or not string.find(body, '"how":"owned"', 1, true) then
    bad = bad + 1
  end
end
done = function(summary, latency, requests)
  local wrong = 0
  for _, t in ipairs(threads) do
    wrong = wrong + t:get("bad")
  end
  io.write(string.format("TRIMTAB {\"errors_answer\": %d, \"requests\": %d, \"errors_connect\": %d, \"errors_read\": %d, " ..
    "\"errors_write\": %d, \"errors_status\": %d, \"errors_timeout\": %d, \"duration_us\": %d, " ..
    "\"p50_us\": %d, \"p90_us\": %d, \"p99_us\": %d, \"p999_us\": %d, \"max_us\": %d}\n",
    wrong, summary.requests, summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.status, summary.errors.timeout, summary.duration,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9),
    latency.max))
end
"""


def _pin(pid: int, cpus: str) -> None:
    """Every thread of ``pid`` onto ``cpus`` (``taskset -a``: affinity is per thread on Linux)."""
    subprocess.run(["taskset", "-a", "-cp", cpus, str(pid)], check=True, capture_output=True)


def _wrk(
    url: str, paths: Path, *, connections: int, seconds: float, delay_ms: int, cpu: str
) -> dict[str, Any]:
    """One wrk run (one thread, pinned to ``cpu``) over the lookup paths in ``paths``; its summary."""
    env = {**os.environ, "TRIMTAB_WRK_PATHS": str(paths), "TRIMTAB_WRK_DELAY_MS": str(delay_ms)}
    wrk = wrk_with_script(paths, WRK_SCRIPT)
    cmd = ["taskset", "-c", cpu, *wrk, "-t1", f"-c{connections}", f"-d{seconds:g}s", url]
    out = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=seconds + 60)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("TRIMTAB ")), None)
    if out.returncode != 0 or line is None:
        raise BenchError(f"wrk failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    r: dict[str, Any] = json.loads(line.removeprefix("TRIMTAB "))
    r["per_s"] = r["requests"] / (r["duration_us"] / 1e6)
    return r


CONNECTIONS = (8, 16, 32)


def _half_rate(
    base: str, paths: Path, runs: list[dict[str, Any]], seconds: float
) -> tuple[dict[str, Any], float, int, int, dict[str, Any]]:
    """The best of ``runs``, half its rate, and a wrk run paced to it: (best, half, connections, delay, run).
    Each connection sends one lookup per (delay + response time): the connections are sized for the
    target, then once more from the rate the first paced run reached."""
    best = max(runs, key=lambda r: r["per_s"])
    half = best["per_s"] / 2
    delay_ms = 4
    conns = max(1, round(half * (delay_ms + best["p50_us"] / 1000) / 1000))
    paced = _wrk(base, paths, connections=conns, seconds=seconds, delay_ms=delay_ms, cpu="1")
    if abs(paced["per_s"] - half) > 0.05 * half:
        conns = max(1, round(conns * half / paced["per_s"]))
        paced = _wrk(base, paths, connections=conns, seconds=seconds, delay_ms=delay_ms, cpu="1")
    return best, half, conns, delay_ms, paced


def one_core_phase(
    cluster: LocalCluster, names: list[str], *, seconds: float, progress: Progress
) -> dict[str, Any]:
    """Owned lookups of one agent pinned to one core, from ``wrk`` (one thread) pinned to the other: the
    most lookups/s one agent answers, then the p99 at half that rate (wrk paced by a per-connection delay:
    a closed loop with think time, so the rate reached is reported beside the target). Every response is
    checked by the wrk script: status 200 and ``how`` owned."""
    if (os.cpu_count() or 1) < 2:
        raise BenchError("the one-core phase needs two CPUs (the agent on one, wrk on the other)")
    node = cluster.agents[0]
    base = node.http
    paths = cluster.workdir / "wrk-paths.txt"
    paths.write_text("".join(f"/v1/lookup?topic={t}\n" for t in names))
    _pin(node.pid, "0")
    try:
        progress(f"one core: agent {node.name} pinned to CPU 0, wrk to CPU 1; warming up...")
        _wrk(base, paths, connections=16, seconds=2, delay_ms=0, cpu="1")
        runs = [_wrk(base, paths, connections=c, seconds=seconds, delay_ms=0, cpu="1") for c in CONNECTIONS]
        best, half, conns, delay_ms, paced = _half_rate(base, paths, runs, seconds)
    finally:
        _pin(node.pid, f"0-{(os.cpu_count() or 1) - 1}")
    errors = sum(r[k] for r in (*runs, paced) for k in r if k.startswith("errors_"))
    if errors:
        raise BenchError(f"one-core phase: {errors} lookups failed or answered wrongly: {[*runs, paced]}")
    progress(
        f"one core: {best['per_s']:.0f} owned lookups/s (p99 {best['p99_us'] / 1000:.2f} ms); "
        f"at {paced['per_s']:.0f}/s p99 {paced['p99_us'] / 1000:.2f} ms (all checked)"
    )
    return {
        "owned_lookups_per_s_one_core": round(best["per_s"], 1),
        "owned_lookup_p99_ms_half_rate": round(paced["p99_us"] / 1000, 3),
        "detail": {
            "runs": [{"connections": c, **r} for c, r in zip(CONNECTIONS, runs, strict=True)],
            "half_rate": {
                "reached_half_rate": abs(paced["per_s"] - half) <= 0.1 * half,
                "target_per_s": round(half, 1),
                "connections": conns,
                "delay_ms": delay_ms,
                **paced,
            },
            "topics": len(names),
            "agent": node.name,
            "seconds_per_run": seconds,
            "client": "wrk (Debian), one thread pinned to CPU 1; the agent's every thread pinned to CPU 0",
            "checks": "every response: status 200 and how=owned (wrk script); any other fails the bench",
        },
    }


# ---------------------------------------------------------------------------------------------- 2. assign


def assign_phase(
    cluster: LocalCluster, watch: ChannelWatch, samples: int, default_bundles: int, progress: Progress
) -> dict[str, Any]:
    """Phase 2 (see the module docstring): ``samples`` sequential lookups that each assign an unowned
    bundle, every answer checked against the bench's replica and the brokers' timelines; their latency,
    and where it goes."""
    if default_bundles < 2:
        raise BenchError("namespace.default_bundles must be at least 2 for the assignment phase")
    agents = cluster.agents
    per_ns = default_bundles - 1
    namespaces = [f"bench-assign/ns-{i}" for i in range((samples + per_ns - 1) // per_ns)]
    topics = {ns: list(topics_per_bundle(ns, default_bundles).values()) for ns in namespaces}
    clients = [httpx.Client(base_url=n.http, timeout=60) for n in agents]
    try:
        progress(
            f"assignment: creating {len(namespaces)} namespace layouts and caching them on every agent..."
        )
        _cache_layouts(clients, namespaces, topics)
        plan = _assignment_plan(namespaces, topics, samples, default_bundles, len(agents))
        for topic, bundle, _ in plan:
            if watch.table.get(bundle) is not None:
                raise BenchError(
                    f"{bundle} ({topic}) already has a channel record before its measured lookup"
                )
        before = _metrics(cluster)
        progress(f"assignment: measuring {samples} sequential lookups of unowned bundles...")
        lat, rows = _timed_assignments(clients, agents, plan)
        after = _metrics(cluster)
    finally:
        for c in clients:
            c.close()
    seen = _check_replica_agrees(watch, rows)
    _check_acquired_once(cluster, rows)
    seg, hop, local, remote = _time_segments(rows, seen)
    s = summary_ms(lat)
    progress(f"assignment: p50 {s['p50']} ms, p99 {s['p99']} ms over {samples} samples (all checked)")
    return {
        "assign_p50_ms": s["p50"],
        "assign_p99_ms": s["p99"],
        "detail": {
            "latency_ms": s,
            "samples": samples,
            "namespaces": len(namespaces),
            "default_bundles": default_bundles,
            "owner_is_the_looking_up_agent": local,
            "owner_is_another_agent": remote,
            "owners": dict(Counter(x["owner"] for x in rows)),
            "how": (
                "sequential; each sample a topic in a bundle with no channel record (its namespace's layout "
                "created and cached on every agent beforehand), round-robin over the agents; perf_counter "
                "around the whole HTTP GET /v1/lookup (keep-alive httpx.Client per agent)"
            ),
        },
        "breakdown": {
            "segments_ms": {k: summary_ms(v, 1) for k, v in seg.items()},
            "bench_replica_hop_ms": summary_ms(hop, 1),
            "agent_metrics_mean_ms": _metric_means_ms(before, after),
            "what": {
                "to_assigning": (
                    "request sent -> the looking-up agent stamped Assigning (HTTP in, layout from the cache, "
                    "broker selection)"
                ),
                "assigning_to_owned": (
                    "Assigning stamped -> the destination agent stamped Owned: produce, the destination's "
                    "channel follower receiving it, reconciler queue, simulated acquire"
                ),
                "owned_to_answer": (
                    "Owned stamped -> HTTP answer received: produce, the looking-up agent's follower "
                    "receiving it, the waiting lookup woken, HTTP out"
                ),
                "bench_replica_hop_ms": (
                    "record stamped by its writer -> seen by this process's ChannelClient (a follower like "
                    "every node's): one channel hop, sampled on both records of every assignment"
                ),
                "agent_metrics_mean_ms": (
                    "means from the agents' own histograms over the measured phase: "
                    "trimtab_lookup_duration_seconds{assigned} = the lookup inside the agent, "
                    "trimtab_reaction_duration_seconds{assign} = acquire + publish Owned + its delivery"
                ),
                "resolution": "record timestamps are integer milliseconds",
            },
        },
    }


def _cache_layouts(clients: list[httpx.Client], namespaces: list[str], topics: dict[str, list[str]]) -> None:
    """Look up each namespace's first topic through every agent: the first lookup creates the layout (and
    owns bundle 0), and every agent caches it, so no measured lookup reads ZooKeeper."""
    for ns in namespaces:
        for c in clients:
            r = c.get("/v1/lookup", params={"topic": topics[ns][0]})
            if r.status_code != 200:
                raise BenchError(f"layout lookup in {ns}: {r.status_code} {r.text}")


def _assignment_plan(
    namespaces: list[str], topics: dict[str, list[str]], samples: int, default_bundles: int, agents: int
) -> list[tuple[str, str, int]]:
    """(topic, expected bundle, agent index) per sample: bundles 1.. of each namespace in turn (bundle 0
    was assigned by :func:`_cache_layouts`), round-robin over the agents."""
    per_ns = default_bundles - 1
    plan: list[tuple[str, str, int]] = []
    for j in range(samples):
        ns = namespaces[j // per_ns]
        k = 1 + j % per_ns
        plan.append((topics[ns][k], BundleLayout.default(ns, default_bundles).bundles[k], j % agents))
    return plan


def _timed_assignments(
    clients: list[httpx.Client], agents: list[Node], plan: list[tuple[str, str, int]]
) -> tuple[list[float], list[dict[str, Any]]]:
    """The measured lookups, one at a time: (latencies, one row per sample with the owner, the agent asked
    and the wall-clock times around the request). Each answer must be an assignment to a live broker."""
    brokers = {n.broker for n in agents}
    lat: list[float] = []
    rows: list[dict[str, Any]] = []
    for topic, bundle, a in plan:
        w0 = time.time()
        t0 = time.perf_counter()
        r = clients[a].get("/v1/lookup", params={"topic": topic})
        t1 = time.perf_counter()
        w1 = time.time()
        if r.status_code != 200:
            raise BenchError(f"assigning lookup of {topic}: {r.status_code} {r.text}")
        body = r.json()
        if body["bundle"] != bundle or body["how"] != "assigned" or body["state"] != State.OWNED.value:
            raise BenchError(f"assigning lookup of {topic} answered {body}, want an assignment of {bundle}")
        if body["owner"] not in brokers:
            raise BenchError(f"{bundle} assigned to {body['owner']}, not a live broker")
        lat.append(t1 - t0)
        rows.append({"bundle": bundle, "owner": body["owner"], "via": agents[a].broker, "w0": w0, "w1": w1})
    return lat, rows


Seen = dict[str, dict[str, tuple[int, float]]]  # bundle -> state -> (writer timestamp ms, seen at wall s)


def _check_replica_agrees(watch: ChannelWatch, rows: list[dict[str, Any]]) -> Seen:
    """Independent replica: every sampled bundle Owned by the answered owner, after Assigning (v1, v2).
    Returns what the replica saw, for :func:`_time_segments`."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(watch.table.get(x["bundle"]) is None for x in rows):
        time.sleep(0.05)
    seen: Seen = {}
    for key, rec, at in list(watch.changes):
        if rec is not None:
            seen.setdefault(key, {})[rec.state.value] = (rec.ts, at)
    for x in rows:
        rec = watch.table.get(x["bundle"])
        if rec is None or rec.state is not State.OWNED or rec.dst != x["owner"] or rec.version != 2:
            raise BenchError(
                f"the bench's channel replica has {x['bundle']} as {rec}, lookup said {x['owner']}"
            )
        if State.ASSIGNING.value not in seen.get(x["bundle"], {}):
            raise BenchError(f"the bench's channel replica never saw {x['bundle']} Assigning")
    return seen


def _check_acquired_once(cluster: LocalCluster, rows: list[dict[str, Any]]) -> None:
    """Each owner's simulated broker acquired each sampled bundle exactly once; nobody else touched it."""
    acquired: Counter[tuple[str, str]] = Counter()
    touched: Counter[str] = Counter()
    sampled = {x["bundle"] for x in rows}
    for broker, timeline in cluster.timelines().items():
        for e in timeline:
            if e["bundle"] in sampled:
                touched[e["bundle"]] += 1
                if e["op"] == "acquire":
                    acquired[(broker, e["bundle"])] += 1
    for x in rows:
        if acquired[(x["owner"], x["bundle"])] != 1 or touched[x["bundle"]] != 1:
            raise BenchError(
                f"{x['bundle']}: acquired {acquired[(x['owner'], x['bundle'])]}x by its owner, "
                f"{touched[x['bundle']]} timeline events in all (want exactly one acquire)"
            )


def _time_segments(
    rows: list[dict[str, Any]], seen: Seen
) -> tuple[dict[str, list[float]], list[float], int, int]:
    """Where the time goes, from the records' writer timestamps (ms) and this process's clock: (seconds
    per segment, the replica's channel hops, samples owned by the agent asked, by another agent)."""
    seg: dict[str, list[float]] = {k: [] for k in ("to_assigning", "assigning_to_owned", "owned_to_answer")}
    hop: list[float] = []
    local = remote = 0
    for x in rows:
        st = seen[x["bundle"]]
        a_ts, a_seen = st[State.ASSIGNING.value]
        o_ts, o_seen = st[State.OWNED.value]
        seg["to_assigning"].append(a_ts / 1000 - x["w0"])
        seg["assigning_to_owned"].append((o_ts - a_ts) / 1000)
        seg["owned_to_answer"].append(x["w1"] - o_ts / 1000)
        hop.append(a_seen - a_ts / 1000)
        hop.append(o_seen - o_ts / 1000)
        if x["owner"] == x["via"]:
            local += 1
        else:
            remote += 1
    return seg, hop, local, remote


# ---------------------------------------------------------------------------------------------- 3. raw rtt


def rtt_phase(
    bootstrap: str,
    *,
    fetch_wait_max_ms: int,
    linger_ms: float,
    client_config: Mapping[str, str],
    samples: int,
    follower_samples: int,
    progress: Progress,
) -> dict[str, Any]:
    """Phase 3 (see the module docstring): the raw produce -> consume round trip the assignment latency is
    compared with, and the same round trip through the channel's Follower."""

    def transport(name: str) -> KafkaTransport:
        return KafkaTransport(
            bootstrap,
            client_config=client_config,
            client_id=f"trimtab-bench-{name}",
            linger_ms=linger_ms,
            fetch_wait_max_ms=fetch_wait_max_ms,
        )

    producer, consumer = transport("rtt-producer"), transport("rtt-reader")
    try:
        n = producer.partitions(RTT_TOPIC)
        start = {p: consumer.watermarks(RTT_TOPIC, p)[1] for p in range(n)}
        lat = _raw_round_trips(producer, consumer, start, samples, progress)
        progress(f"follower round trip: {follower_samples} samples through channel.transport.Follower...")
        fstart = {p: consumer.watermarks(RTT_TOPIC, p)[1] for p in range(n)}
        flat = _follower_round_trips(producer, transport("rtt-follower"), fstart, follower_samples)
    finally:
        producer.close()
        consumer.close()
    s, f = summary_ms(lat), summary_ms(flat)
    progress(
        f"raw round trip: p50 {s['p50']} ms, p99 {s['p99']} ms; via Follower p50 {f['p50']} ms, p99 {f['p99']} ms"
    )
    return {
        "raw_rtt_p50_ms": s["p50"],
        "raw_rtt_p99_ms": s["p99"],
        "detail": {
            "latency_ms": s,
            "samples": samples,
            "how": (
                "KafkaTransport.produce (idempotent, lz4, linger.ms as the channel) -> a low-latency "
                "KafkaTransport reader (fetch.wait.max.ms = kafka.fetch_wait_max_ms) polled with "
                "poll(1, 0.05), which returns as soon as the message is there; one message in flight; every "
                "message checked (key, value, offset) and consumed exactly once"
            ),
            "topic": RTT_TOPIC,
        },
        "follower_rtt": {
            "latency_ms": f,
            "samples": follower_samples,
            "how": (
                "the same producer -> channel.transport.Follower (what every node's ChannelClient runs: "
                "reader.poll(5000, 0.05) in a loop) -> apply callback"
            ),
        },
    }


def _raw_round_trips(
    producer: KafkaTransport,
    consumer: KafkaTransport,
    start: dict[int, int],
    samples: int,
    progress: Progress,
) -> list[float]:
    """``samples`` produce -> consume round trips (after 20 that warm the connections), one message in
    flight, each checked (key, value, offset) and consumed exactly once; seconds each."""
    reader = consumer.reader(RTT_TOPIC, start, low_latency=True)
    try:
        progress(f"raw round trip: {samples} produce -> consume samples...")
        lat: list[float] = []
        for i in range(samples + 20):
            key = f"rtt-{i}".encode()
            value = f"{i}:{time.time_ns()}".encode()
            t0 = time.perf_counter()
            fut = producer.produce(RTT_TOPIC, key, value)
            got: list[Message] = []
            deadline = t0 + 10
            while not got:
                got = reader.poll(1, 0.05)
                if time.perf_counter() > deadline:
                    raise BenchError(f"raw round trip: message {i} not consumed within 10 s")
            t1 = time.perf_counter()
            m = got[0]
            if m.key != key or m.value != value:
                raise BenchError(f"raw round trip: sent {key!r}={value!r}, consumed {m.key!r}={m.value!r}")
            written = fut.result(10)
            if (written.partition, written.offset) != (m.partition, m.offset):
                raise BenchError("raw round trip: consumed a different offset than the one written")
            if i >= 20:  # the first ones warm the connections
                lat.append(t1 - t0)
        extra = reader.poll(100, 0.2)
        if extra:
            raise BenchError(f"raw round trip: {len(extra)} messages consumed twice or unexpected")
    finally:
        reader.close()
    return lat


def _follower_round_trips(
    producer: KafkaTransport, follower_transport: KafkaTransport, start: dict[int, int], samples: int
) -> list[float]:
    """``samples`` round trips (after 5 warm-ups) from ``producer`` to the apply callback of a
    :class:`channel.transport.Follower` on ``follower_transport`` (closed when done); seconds each."""
    arrived: dict[bytes, float] = {}
    ev = threading.Event()

    def apply(msgs: list[Message]) -> None:
        now = time.perf_counter()
        for m in msgs:
            if m.key is not None:
                arrived[m.key] = now
        ev.set()

    follower = Follower(follower_transport, RTT_TOPIC, apply, start=start, name="bench-rtt")
    follower.start()
    try:
        if not follower.wait_ready(30):
            raise BenchError("follower round trip: the follower did not start")
        flat: list[float] = []
        for i in range(samples + 5):
            key = f"frtt-{i}".encode()
            ev.clear()
            t0 = time.perf_counter()
            producer.produce(RTT_TOPIC, key, b"x")
            deadline = t0 + 10
            while key not in arrived:
                ev.wait(0.5)
                ev.clear()
                if time.perf_counter() > deadline:
                    raise BenchError(f"follower round trip: message {i} not applied within 10 s")
            if i >= 5:
                flat.append(arrived[key] - t0)
    finally:
        follower.stop()
        with contextlib.suppress(Exception):
            follower.transport.close()
    return flat


# ---------------------------------------------------------------------------------------------- the run


def run_config(
    workdir: Path,
    overrides: Mapping[str, Any],
    *,
    topics: int,
    lookups: int,
    concurrency: int,
    assign_samples: int,
    rtt_samples: int,
    follower_samples: int,
    seed: int,
    progress: Progress,
    one_core_seconds: float = 0.0,
) -> dict[str, Any]:
    settings = deep_merge(BASE_SETTINGS, overrides)
    cluster = LocalCluster(workdir, brokers=3, controllers=0, settings=settings, cluster_name="bench-lookup")
    t0 = time.perf_counter()
    progress(f"starting ZooKeeper, Kafka and 3 agents (settings {dict(overrides) or 'defaults'})...")
    cluster.start()
    watch: ChannelWatch | None = None
    try:
        progress(f"cluster up in {time.perf_counter() - t0:.1f} s")
        s = load_settings(cluster.config_path, environ=False)
        k = s.kafka
        watch = ChannelWatch(
            cluster.bootstrap_servers,
            k.channel_topic,
            fetch_wait_max_ms=k.fetch_wait_max_ms,
            linger_ms=k.linger_ms,
            client_config=dict(k.client_config),
        ).start()
        owned = owned_phase(cluster, topics, lookups, concurrency, seed, progress)
        one_core = (
            one_core_phase(cluster, owned_topics(topics), seconds=one_core_seconds, progress=progress)
            if one_core_seconds > 0
            else None
        )
        assign = assign_phase(cluster, watch, assign_samples, s.namespace.default_bundles, progress)
        rtt = rtt_phase(
            cluster.bootstrap_servers,
            fetch_wait_max_ms=k.fetch_wait_max_ms,
            linger_ms=k.linger_ms,
            client_config=dict(k.client_config),
            samples=rtt_samples,
            follower_samples=follower_samples,
            progress=progress,
        )
        dead = [n.name for n in cluster.nodes.values() if not n.alive()]
        if dead:
            raise BenchError(f"processes died during the run: {dead}")
        stats = {n.broker: cluster.get(n, "/v1/status")["channel"]["stats"] for n in cluster.agents}
    finally:
        if watch is not None:
            watch.stop()
        cluster.stop()
    ratio = assign["assign_p99_ms"] / rtt["raw_rtt_p99_ms"]
    targets = {"assign_vs_rtt_ratio": ratio <= ASSIGN_VS_RTT_TARGET}
    if one_core is not None:
        targets["owned_lookups_per_s_one_core"] = (
            one_core["owned_lookups_per_s_one_core"] >= ONE_CORE_TARGET_PER_S
        )
        # Judged only if the paced run really ran at about half the rate (within 10 %).
        targets["owned_lookup_p99_ms_half_rate"] = (
            one_core["owned_lookup_p99_ms_half_rate"] <= HALF_RATE_P99_TARGET_MS
            and one_core["detail"]["half_rate"]["reached_half_rate"]
        )
    return {
        **{k: v for k, v in owned.items() if k != "detail"},
        **({k: v for k, v in one_core.items() if k != "detail"} if one_core is not None else {}),
        "one_core": one_core["detail"] if one_core is not None else None,
        **{k: v for k, v in assign.items() if k not in ("detail", "breakdown")},
        **{k: v for k, v in rtt.items() if k not in ("detail", "follower_rtt")},
        "assign_vs_rtt_ratio": round(ratio, 2),
        "assign_vs_rtt_ratio_target": ASSIGN_VS_RTT_TARGET,
        "follower_rtt_p50_ms": rtt["follower_rtt"]["latency_ms"]["p50"],
        "follower_rtt_p99_ms": rtt["follower_rtt"]["latency_ms"]["p99"],
        "meets_targets": targets,
        "settings": {
            "overrides": dict(overrides),
            "kafka.fetch_wait_max_ms": k.fetch_wait_max_ms,
            "kafka.linger_ms": k.linger_ms,
            "kafka.channel_partitions": k.channel_partitions,
            "namespace.default_bundles": s.namespace.default_bundles,
            "agent.lookup_cache_s": s.agent.lookup_cache_s,
            "channel.in_flight_timeout_s": s.channel.in_flight_timeout_s,
            "split.enabled": s.split.enabled,
            "agents": 3,
            "controllers": 0,
        },
        "owned": owned["detail"],
        "assign": {**assign["detail"], "breakdown": assign["breakdown"]},
        "raw_rtt": rtt["detail"],
        "follower_rtt": rtt["follower_rtt"],
        "agents_channel_stats": stats,
        "cluster_start_s": round(time.perf_counter() - t0, 1),
    }


HEADLINE = (
    "owned_lookup_p50_ms",
    "owned_lookup_p99_ms",
    "owned_lookups_per_s",
    "owned_lookups_per_s_one_core",
    "owned_lookup_p99_ms_half_rate",
    "assign_p50_ms",
    "assign_p99_ms",
    "raw_rtt_p50_ms",
    "raw_rtt_p99_ms",
    "assign_vs_rtt_ratio",
    "assign_vs_rtt_ratio_target",
    "follower_rtt_p50_ms",
    "follower_rtt_p99_ms",
)


def run(
    *,
    topics: int = 512,
    lookups: int = 5000,
    concurrency: int = 12,
    assign_samples: int = 240,
    rtt_samples: int = 600,
    follower_samples: int = 200,
    alternative_fetch_wait_ms: int | None = 5,
    one_core_seconds: float = 10.0,
    settings: Mapping[str, Any] | None = None,
    seed: int = 1,
    workdir: Path | None = None,
    keep_workdir: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The whole benchmark; returns its JSON-ready result. Raises BenchError on a wrong answer."""
    progress = progress or progress_printer("lookup")
    load_start = loadavg()
    sizes: dict[str, Any] = {
        "topics": topics,
        "lookups": lookups,
        "concurrency": concurrency,
        "assign_samples": assign_samples,
        "rtt_samples": rtt_samples,
        "follower_samples": follower_samples,
        "seed": seed,
    }
    with bench_workdir(workdir, "trimtab-bench-lookup-", progress, keep=keep_workdir) as base:
        main = run_config(
            base / "default",
            dict(settings or {}),
            **sizes,
            progress=progress,
            one_core_seconds=one_core_seconds,
        )
        alt = None
        if alternative_fetch_wait_ms is not None:
            alt_settings = deep_merge(
                dict(settings or {}), {"kafka": {"fetch_wait_max_ms": alternative_fetch_wait_ms}}
            )
            alt_full = run_config(base / "alternative", alt_settings, **sizes, progress=progress)
            alt = {k: alt_full.get(k) for k in (*HEADLINE, "meets_targets", "settings")}
            alt["detail"] = {
                k: alt_full[k] for k in ("owned", "assign", "raw_rtt", "follower_rtt", "agents_channel_stats")
            }
    out: dict[str, Any] = {"bench": "lookup"}
    out.update({k: main.get(k) for k in HEADLINE})
    out["meets_targets"] = main["meets_targets"]
    out["settings"] = main["settings"]
    out["alternative"] = alt
    out["sizes"] = sizes
    out["owned"] = main["owned"]
    out["one_core"] = main["one_core"]
    out["assign"] = main["assign"]
    out["raw_rtt"] = main["raw_rtt"]
    out["follower_rtt"] = main["follower_rtt"]
    out["agents_channel_stats"] = main["agents_channel_stats"]
    out["cluster"] = {
        "agents": 3,
        "controllers": 0,
        "zookeeper": "real server (trimtab.devkit.zkserver), one per configuration",
        "kafka": "Apache Kafka 4.4.0, one KRaft broker (its own JVM); agents are separate processes",
        "start_s": main["cluster_start_s"],
    }
    out["checks"] = {
        "owned_lookups_same_owner_how_owned": True,
        "assignments_how_assigned_live_owner": True,
        "bench_replica_agrees_with_every_assignment": True,
        "each_assigned_bundle_acquired_exactly_once_by_its_owner": True,
        "raw_rtt_messages_exactly_once_in_order": True,
        "no_process_died": True,
        "note": "any failed check aborts the bench with a non-zero exit before this JSON is printed",
    }
    out["env"] = environment(load_start, "confluent-kafka", "httpx", "fastapi", "uvicorn", "msgspec")
    out["note"] = (
        "Kafka answers a waiting fetch when data arrives; kafka.fetch_wait_max_ms bounds how often an idle "
        "reader asks again. 'alternative' repeats everything with another value"
    )
    return out
