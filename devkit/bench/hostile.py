"""``trimtab bench hostile``: hostile clients against a live agent whose broker holds leases (docs/security.md,
"Hostile clients"), with what the agent and its broker went through, as JSON.

The attacks, each over raw sockets (an HTTP library would refuse to send most of them):

* ``big_unauthenticated_body``: 100 MB of JSON to ``/v1/admin/drain`` without a token -- the request that
  stalled an agent until its broker's leases expired. Expected: 401 from the head alone, the connection
  closed, the body never read;
* ``big_authenticated_body``: the same with an admin token -- 413 from the declared length;
* ``big_chunked_public_body``: a chunked body without a length to a public path -- 413 once past the limit;
* ``slowloris``: connections dripping their request head -- closed after ``http.header_timeout_s``;
* ``flood``: ten times ``http.max_connections`` idle connections from another process and address, at 640
  a second -- idle ones evicted, probes still answered;
* ``stalled_body``: a body that stops arriving -- 408 after ``http.body_timeout_s``;
* ``slow_reader``: requests pipelined by a client that never reads the answers -- the connection closed
  once its send buffer has been full for ``http.send_timeout_s``.

Meanwhile a prober opens a new connection every 20 ms for ``/healthz`` (as an orchestrator does) and a
sampler reads the agent's resident memory; afterwards the broker's timeline says whether any lease ran out.
The same functions are what tests/integration/test_hostile_clients.py asserts on.
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from trimtab.cluster.http_guard import MAX_PIPELINED
from trimtab.devkit.bench.common import BenchError
from trimtab.devkit.localcluster import LocalCluster, Node

HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
SEND_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 64
BIG = 100_000_000  # the 100 MB of the report
HEALTHZ_TARGET_S = 0.1  # /healthz answered within this while the agent is attacked (the bound)
RSS_TARGET_BYTES = 40 << 20


def cluster_settings() -> dict[str, Any]:
    """Short deadlines and a small connection cap, so that each limit is reached within seconds."""
    return {
        "http": {
            "header_timeout_s": HEADER_TIMEOUT_S,
            "body_timeout_s": BODY_TIMEOUT_S,
            "send_timeout_s": SEND_TIMEOUT_S,
            "max_connections": MAX_CONNECTIONS,
        },
        "namespace": {"auto_create": ["public/*"]},
    }


# ---------------------------------------------------------------------------------------------- raw HTTP
def addr(node: Node) -> tuple[str, int]:
    return ("127.0.0.1", node.port)


def head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_response(sock: socket.socket, timeout: float) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of one response (Content-Length framed, as trimtab answers)."""
    sock.settimeout(timeout)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response head: {buf[:200]!r}")
        buf += chunk
    raw_head, _, rest = buf.partition(b"\r\n\r\n")
    status_line, *header_lines = raw_head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in header_lines)}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(status_line.split()[1]), headers, rest[:length]


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """True if the peer closes ``sock`` within ``timeout`` (reading and discarding what it sends)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


# ---------------------------------------------------------------------------------------------- the watch
@dataclass
class Watch:
    """What happens to the victim while it is attacked: /healthz latencies (one request per new raw
    connection, so only the node's time is measured) and the agent's resident memory."""

    node: Node
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    phase: str = "start"
    slow: list[tuple[str, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        proc = psutil.Process(self.node.pid)
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                with socket.create_connection(addr(self.node), timeout=5) as s:
                    s.sendall(head("GET", "/healthz", {"Connection": "close"}))
                    status, _, _ = read_response(s, 5)
                if status != 200:
                    self.failures.append(f"{self.phase}: healthz answered {status}")
            except (OSError, ValueError) as e:
                self.failures.append(f"{self.phase}: healthz failed: {type(e).__name__}: {e}")
            took = time.monotonic() - t0
            self.latencies.append(took)
            if took > HEALTHZ_TARGET_S:
                self.slow.append((self.phase, round(took * 1000)))
            with contextlib.suppress(psutil.Error):
                self.rss.append(proc.memory_info().rss)
            self.stop.wait(0.02)


@contextlib.contextmanager
def watching(node: Node) -> Iterator[Watch]:
    w = Watch(node)
    t = threading.Thread(target=w.run, name="healthz-prober", daemon=True)
    t.start()
    try:
        yield w
    finally:
        w.stop.set()
        t.join(10)


# ---------------------------------------------------------------------------------------------- the attacks
Attack = Callable[[Node, str, Watch], dict[str, Any]]


def big_unauthenticated_body(node: Node, token: str, watch: Watch) -> dict[str, Any]:
    with socket.create_connection(addr(node)) as s:
        t0 = time.monotonic()
        s.sendall(
            head("POST", "/v1/admin/drain", {"Content-Type": "application/json", "Content-Length": str(BIG)})
        )
        status, headers, _ = read_response(s, 5)
        answered_s = time.monotonic() - t0
        sent = 0
        chunk = b'{"broker": "' + b"x" * (1 << 20)
        with contextlib.suppress(OSError):
            while sent < BIG:
                s.sendall(chunk)
                sent += len(chunk)
    return {
        "status": status,
        "seconds_to_answer": round(answered_s, 4),
        "connection": headers.get("connection"),
        "challenge": headers.get("www-authenticate", ""),
        "body_bytes_sent_before_close": sent,
    }


def big_authenticated_body(node: Node, token: str, watch: Watch) -> dict[str, Any]:
    with socket.create_connection(addr(node)) as s:
        h = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Content-Length": str(BIG),
        }
        s.sendall(head("POST", "/v1/admin/drain", h))
        status, headers, body = read_response(s, 5)
    return {"status": status, "connection": headers.get("connection"), "error": body.decode(errors="replace")}


def big_chunked_public_body(node: Node, token: str, watch: Watch) -> dict[str, Any]:
    sent = 0
    with socket.create_connection(addr(node)) as s:
        s.sendall(head("POST", "/v1/lookup", {"Transfer-Encoding": "chunked"}))
        piece = b"%x\r\n%s\r\n" % (8192, b"[" * 8192)
        with contextlib.suppress(OSError):
            for _ in range(1000):  # 8 MB at most
                s.sendall(piece)
                sent += 8192
                s.settimeout(0)
                with contextlib.suppress(BlockingIOError):
                    if s.recv(1, socket.MSG_PEEK):
                        break
        status, headers, _ = read_response(s, 5)
    return {"status": status, "connection": headers.get("connection"), "body_bytes_sent": sent}


def slowloris(node: Node, token: str, watch: Watch, connections: int = 20) -> dict[str, Any]:
    socks = [socket.create_connection(addr(node)) for _ in range(connections)]
    t0 = time.monotonic()
    try:
        for s in socks:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        deadline = t0 + HEADER_TIMEOUT_S + 3
        open_ = list(socks)
        while open_ and time.monotonic() < deadline:
            still = []
            for s in open_:
                try:
                    s.sendall(b"X")
                    still.append(s)
                except OSError:
                    pass
            open_ = still
            time.sleep(0.25)  # the attacker's drip rate
        closed = sum(closed_by_peer(s, 2) for s in socks)
    finally:
        for s in socks:
            s.close()
    return {"connections": connections, "closed_by_node": closed, "seconds": round(time.monotonic() - t0, 2)}


_FLOOD = """
import socket, sys, time
port, n, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
socks = []
for i in range(n):
    try:
        # From another address than the prober's, as an attacker's would be (all of 127/8 is loopback).
        socks.append(socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.2", 0)))
    except OSError:
        pass
    if i % 64 == 63:
        time.sleep(0.1)  # the attacker's pace: 640 connections a second
print(len(socks), flush=True)
time.sleep(hold)  # the attacker holds its connections open
"""


def flood(node: Node, token: str, watch: Watch) -> dict[str, Any]:
    """Ten times the connection cap, idle, from another process and address. (Each accepted connection
    costs the event loop ~0.25 ms on the 2-core machine whatever the guard decides: a burst of thousands at
    once delays probes by that much -- docs/security.md says so.)"""
    probes = len(watch.latencies)
    proc = subprocess.run(
        [sys.executable, "-c", _FLOOD, str(node.port), str(MAX_CONNECTIONS * 10), "1.5"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return {"opened": int(proc.stdout.strip()), "probes_during": len(watch.latencies) - probes}


def stalled_body(node: Node, token: str, watch: Watch) -> dict[str, Any]:
    with socket.create_connection(addr(node)) as s:
        h = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Content-Length": "100"}
        s.sendall(head("POST", "/v1/admin/drain", h) + b'{"broker": ')
        t0 = time.monotonic()
        status, headers, _ = read_response(s, BODY_TIMEOUT_S + 5)
    return {
        "status": status,
        "connection": headers.get("connection"),
        "seconds": round(time.monotonic() - t0, 2),
    }


def slow_reader(node: Node, token: str, watch: Watch) -> dict[str, Any]:
    """``GET /metrics`` pipelined without ever reading an answer, through a tiny receive window: the node's
    send buffer fills, and the connection must be closed once it has been full for the send deadline.

    As many requests at once as a connection may queue (``MAX_PIPELINED``; more is refused as such), then
    one every 0.1 s: the node stops reading while its answers wait, so those only fill its receive buffer
    -- and a send into a connection the node closed is how the attacker learns when it did."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(addr(node))
    request = head("GET", "/metrics", {})
    t0 = time.monotonic()
    sent = 0
    closed_after = None
    try:
        deadline = t0 + SEND_TIMEOUT_S + 15
        batch = MAX_PIPELINED
        while time.monotonic() < deadline:
            try:
                s.sendall(request * batch)
                sent += batch
                batch = 1
            except OSError:
                closed_after = time.monotonic() - t0
                break
            time.sleep(0.1)  # the attacker's pace
    finally:
        s.close()
    return {"requests_sent": sent, "closed_after_s": None if closed_after is None else round(closed_after, 2)}


ATTACKS: tuple[Attack, ...] = (
    big_unauthenticated_body,
    big_authenticated_body,
    big_chunked_public_body,
    slowloris,
    flood,
    stalled_body,
    slow_reader,
)


# ---------------------------------------------------------------------------------------------- a run
def victim(cluster: LocalCluster) -> Node:
    """The agent whose broker serves the most bundles: the one whose leases the attacks put at risk."""
    states = cluster.broker_states()
    agent = max(cluster.agents, key=lambda a: len(states.get(a.broker or "", {}).get("serving", [])))
    if not states[agent.broker or ""]["serving"]:
        raise BenchError("the victim's broker serves nothing: nothing to protect")
    return agent


def refused(node: Node) -> dict[str, float]:
    """``trimtab_http_refused_total`` by reason, as the node exports it now."""
    text = httpx.get(f"{node.http}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "trimtab_http_refused":
            for s in fam.samples:
                if s.name.endswith("_total"):
                    out[s.labels["reason"]] = s.value
    return out


def attack_run(cluster: LocalCluster) -> dict[str, Any]:
    """Every attack against the busiest agent, watched; the figures and facts as a dict."""
    node = victim(cluster)
    broker = node.broker or ""
    serving_before = set(cluster.broker_states()[broker]["serving"])
    before = refused(node)
    baseline_rss = psutil.Process(node.pid).memory_info().rss
    start_ns = time.monotonic_ns()
    results: dict[str, Any] = {}
    with watching(node) as watch:
        for attack in ATTACKS:
            watch.phase = attack.__name__
            results[attack.__name__] = attack(node, cluster.admin_token, watch)
    after = refused(node)
    state = cluster.broker_states()[broker]
    expired = [
        e for e in state["timeline"] if e.get("op") == "expire" and int(e.get("mono_ns", 0)) >= start_ns
    ]
    lat_ms = sorted(x * 1000 for x in watch.latencies)
    return {
        "victim": node.name,
        "attacks": results,
        "healthz": {
            "probes": len(lat_ms),
            "failures": watch.failures,
            "p50_ms": round(statistics.median(lat_ms), 2) if lat_ms else None,
            "p99_ms": round(lat_ms[min(len(lat_ms) - 1, int(len(lat_ms) * 0.99))], 2) if lat_ms else None,
            "max_ms": round(lat_ms[-1], 2) if lat_ms else None,
            "over_target": watch.slow,
            "target_ms": HEALTHZ_TARGET_S * 1000,
        },
        "agent_rss": {
            "baseline_mb": round(baseline_rss / 2**20, 1),
            "peak_growth_mb": round((max(watch.rss, default=baseline_rss) - baseline_rss) / 2**20, 1),
            "target_growth_mb": RSS_TARGET_BYTES >> 20,
        },
        "leases": {
            "bundles_served_before": len(serving_before),
            "still_served": len(serving_before & set(state["serving"])),
            "expired_during_attacks": len(expired),
        },
        "refused": {r: after.get(r, 0) - before.get(r, 0) for r in after},
    }


def run(workdir: Path | None = None) -> dict[str, Any]:
    """``trimtab bench hostile``: a local cluster of two agents beside sim-broker processes and one
    controller, bundles on both brokers, then :func:`attack_run`."""
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="trimtab-hostile-")))
        cluster = stack.enter_context(
            LocalCluster(
                workdir, brokers=2, controllers=1, broker_processes=True, settings=cluster_settings()
            )
        )
        for i in range(12):
            cluster.lookup(f"persistent://public/hostile-{i}/t")
        out = attack_run(cluster)
        out["settings"] = cluster_settings()["http"]
        return out
