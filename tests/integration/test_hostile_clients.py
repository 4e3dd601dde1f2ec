"""Hostile clients on every port, over raw sockets, against a live local cluster (docs/security.md,
"Hostile clients").

One cluster -- two agents each beside a sim-broker *process* (signed webhook, leases), one controller --
with short HTTP deadlines and a small connection cap so that each limit is reached within seconds. While
the attacks run, a prober asks the victim agent's ``/healthz`` every 20 ms and a sampler reads its RSS; the
broker behind it must keep every lease (no ``expire`` in its timeline). The attacks:

* a 100 MB body to an admin route without a token: 401 before a byte of the body is read, and the node
  closes the connection; with a token, 413 from the declared length; a body sent chunked without a length
  to a public route, 413 once it passes the limit;
* slowloris: connections that drip their request head are closed after ``http.header_timeout_s``;
* a connection flood past ``http.max_connections``: idle connections are evicted and ``/healthz`` is still
  answered;
* a body that stops arriving: 408 after ``http.body_timeout_s``; a client that announces a body, sends part
  of it and disconnects: no error anywhere (agent, controller, sim-broker);
* JSON nested too deep: 400; a malformed body without a token: 401, not 400;
* a trailing slash: 404, never a redirect built from the ``Host`` header; ``X-Forwarded-For`` from an
  untrusted peer is not believed.

Then every log the cluster wrote is read: no token, no ZooKeeper password, no webhook key, no traceback
of a disconnect, and every log file is readable by its owner only.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import stat
from collections.abc import Iterator

import httpx
import pytest

from tests.support.waiting import wait_for
from trimtab.cluster.http_guard import MAX_HEAD_BYTES, MAX_PIPELINED
from trimtab.devkit.bench import hostile
from trimtab.devkit.bench.hostile import addr, head
from trimtab.devkit.localcluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path_factory.mktemp("hostile"),
        brokers=2,
        controllers=1,
        broker_processes=True,
        settings=hostile.cluster_settings(),
    )
    with c:
        for i in range(12):  # bundles on both brokers, so both hold leases
            c.lookup(f"persistent://public/hostile-{i}/t")
        yield c


# ---------------------------------------------------------------------------------------------- the attack run
#: A /healthz answer slower than this while attacked is a stall, not noise (the bench's target is 100 ms).
STALL_MS = 1000.0


def test_an_attacked_agent_keeps_its_leases_and_answers_probes(cluster: LocalCluster) -> None:
    """The attacks of ``trimtab bench hostile`` (devkit/bench/hostile.py), asserted."""
    run = hostile.attack_run(cluster)
    a = run["attacks"]

    # 100 MB without a token: 401 from the head alone, then the connection closed -- the body never read.
    big = a["big_unauthenticated_body"]
    assert big["status"] == 401 and big["challenge"].startswith("Bearer") and big["connection"] == "close"
    assert big["seconds_to_answer"] < 1.0, big
    assert big["body_bytes_sent_before_close"] < hostile.BIG // 2, big
    # With a token: 413 from the declared length.
    authed = a["big_authenticated_body"]
    assert authed["status"] == 413 and authed["connection"] == "close"
    assert json.loads(authed["error"])["error"].startswith("request body of 100000000 bytes")
    # Chunked, no length, to a public path: 413 once past the limit.
    assert a["big_chunked_public_body"]["status"] == 413
    # Slowloris: every dripping connection closed after the head deadline.
    loris = a["slowloris"]
    assert loris["closed_by_node"] == loris["connections"], loris
    # The flood was really over the cap, and probes kept being answered during it.
    assert a["flood"]["opened"] > hostile.MAX_CONNECTIONS and a["flood"]["probes_during"] >= 10, a["flood"]
    # A body that stops arriving: 408 after the body deadline, connection closed.
    stalled = a["stalled_body"]
    assert stalled["status"] == 408 and stalled["connection"] == "close"
    assert hostile.BODY_TIMEOUT_S - 0.5 <= stalled["seconds"] <= hostile.BODY_TIMEOUT_S + 3

    # A client that never reads its answers: cut off once its send buffer stayed full for the deadline.
    slow = a["slow_reader"]
    assert slow["closed_after_s"] is not None, slow

    hz = run["healthz"]
    assert not hz["failures"], hz["failures"][:5]
    assert hz["probes"] > 50, "the prober hardly ran"
    # No stall: unguarded, one body stalled /healthz for seconds (4.3 s). The 100-ms figure itself is the
    # benchmark's to measure (trimtab bench hostile, docs/benchmarks.md), on a machine not shared with the
    # other test worker: here a bound that tells a stall from a busy machine.
    assert hz["max_ms"] < STALL_MS, f"/healthz stalled (attack, ms): {hz['over_target']}"
    assert run["agent_rss"]["peak_growth_mb"] < run["agent_rss"]["target_growth_mb"], run["agent_rss"]
    # No lease ran out: the broker still serves everything it served, and never expired a bundle.
    leases = run["leases"]
    assert leases["expired_during_attacks"] == 0 and leases["still_served"] == leases["bundles_served_before"]
    for reason in ("body_too_large", "body_timeout", "header_timeout", "evicted", "send_timeout"):
        assert run["refused"][reason] > 0, (reason, run["refused"])


# ---------------------------------------------------------------------------------------------- smaller holes
def test_a_client_that_disconnects_mid_body_is_not_an_error_anywhere(cluster: LocalCluster) -> None:
    nodes = [cluster.agents[0], cluster.controller_nodes[0], *cluster.broker_nodes]
    paths = {
        "agent": "/v1/admin/drain",
        "controller": "/v1/admin/drain",
        "broker": "/trimtab/v1/bundles/close",
    }
    for node in nodes:
        headers = {"Content-Type": "application/json", "Content-Length": "100"}
        if node.kind != "broker":
            headers["Authorization"] = f"Bearer {cluster.admin_token}"
        with socket.create_connection(addr(node)) as s:
            s.sendall(head("POST", paths[node.kind], headers) + b'{"bundle": ')
        # The node is still fine, and says nothing of the kind.
        assert (
            httpx.get(
                f"{node.http}/healthz" if node.kind != "broker" else f"{node.http}/trimtab/v1/sim/state",
                headers=cluster.auth_headers() if node.kind != "broker" else None,
                timeout=10,
            ).status_code
            == 200
        )
    for node in nodes:
        tail = cluster.log_tail(node.name, 400)
        assert "http_handler_failed" not in tail and "Traceback" not in tail, f"{node.name}:\n{tail[-3000:]}"


def test_a_request_head_over_the_size_cap_is_refused_and_the_node_keeps_serving(
    cluster: LocalCluster,
) -> None:
    """llhttp (under uvicorn's httptools protocol) bounds no header: the guard does (``MAX_HEAD_BYTES``),
    so one request cannot grow its head for the whole head deadline. Refused with 400, the connection
    closed, counted as ``header_too_large``; a head just under the cap is served."""
    agent = cluster.agents[0]
    refused_before = hostile.refused(agent).get("header_too_large", 0.0)
    with socket.create_connection(addr(agent), timeout=10) as s:
        s.sendall(head("GET", "/healthz", {"x-junk": "j" * (MAX_HEAD_BYTES + 1)}))
        answer = _read_all(s)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert hostile.refused(agent)["header_too_large"] == refused_before + 1
    r = httpx.get(f"{agent.http}/healthz", headers={"x-junk": "j" * (MAX_HEAD_BYTES - 200)}, timeout=10)
    assert r.status_code == 200


def test_a_header_that_never_ends_and_a_flood_of_pipelined_requests_are_cut_off(
    cluster: LocalCluster,
) -> None:
    """httptools buffers a header line until it ends (the callbacks never see it) and parses every request
    of a read at once, queueing each: one header value streamed for ever, or thousands of pipelined
    requests in one write, would grow the node's memory and hold its loop. Both are refused."""
    agent = cluster.agents[0]
    before = hostile.refused(agent)
    with socket.create_connection(addr(agent), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-junk: ")
        with contextlib.suppress(OSError):  # the node may close the connection while we still send
            for _ in range(256):
                s.sendall(b"a" * 4096)  # (the kernel's buffers may take all of it: not the node's)
        # Ends only if the node closed the connection (10-s socket timeout otherwise; its 400 may be lost
        # to the reset); the refusal is counted below. Unguarded, it read on until the head deadline.
        _read_all(s)
    request = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
    with socket.create_connection(addr(agent), timeout=10) as s:
        with contextlib.suppress(OSError):
            s.sendall(request * 2000)
        answer = _read_all(s)
    assert answer.count(b"HTTP/1.1 200") <= MAX_PIPELINED + 1, answer[-300:]
    after = hostile.refused(agent)
    assert after["header_too_large"] >= before.get("header_too_large", 0.0) + 1
    assert after["too_many_pipelined"] >= before.get("too_many_pipelined", 0.0) + 1
    assert httpx.get(f"{agent.http}/healthz", timeout=10).status_code == 200


def _read_all(s: socket.socket) -> bytes:
    """Everything the node sends until it closes the connection."""
    out = b""
    with contextlib.suppress(ConnectionResetError):  # a node that closes with our bytes unread resets
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_deep_json_and_malformed_bodies(cluster: LocalCluster) -> None:
    ctl = cluster.controller_nodes[0]
    deep = "[" * 100 + "]" * 100
    r = httpx.post(
        f"{ctl.http}/v1/admin/drain",
        content=deep,
        headers={**cluster.auth_headers(), "content-type": "application/json"},
        timeout=10,
    )
    assert r.status_code == 400 and "nested deeper" in r.json()["error"]
    # Without a token, a malformed body is still a 401: nothing about the body is told before the token.
    for body in (deep, "{not json", "x" * 70_000):
        r = httpx.post(
            f"{ctl.http}/v1/admin/drain",
            content=body,
            headers={"content-type": "application/json"},
            timeout=10,
        )
        assert r.status_code == 401, (body[:20], r.status_code, r.text)


def test_no_redirect_from_the_host_header_and_no_forwarded_address_believed(cluster: LocalCluster) -> None:
    agent = cluster.agents[0]
    r = httpx.get(
        f"{agent.http}/v1/status/", headers={**cluster.auth_headers(), "host": "evil.example"}, timeout=10
    )
    assert r.status_code == 404 and "location" not in r.headers
    marker = "198.51.100.77"
    r = httpx.get(f"{agent.http}/v1/status", headers={"x-forwarded-for": marker}, timeout=10)
    assert r.status_code == 401
    wait_for(lambda: "http_auth_refused" in cluster.log_tail(agent.name, 200), 10)
    assert marker not in cluster.log_tail(agent.name, 400)


def test_no_secret_in_any_log_and_logs_are_private(cluster: LocalCluster) -> None:
    """Runs last in this module: after every attack above, grep every log the cluster wrote."""
    secrets_held = {
        "admin token": cluster.admin_token,
        "read token": cluster.read_token,
        "ZooKeeper password": cluster.zk_auth[1].partition(":")[2],
    }
    key_file = cluster.workdir / "webhook-hmac.key"
    secrets_held["webhook key"] = key_file.read_text().strip()
    logs = sorted(p for p in (cluster.workdir / "logs").rglob("*") if p.is_file())
    logs += sorted((cluster.workdir / "zookeeper").rglob("*.log"))
    assert len(logs) >= 4, logs
    for path in logs:
        text = path.read_text(errors="replace")
        for what, value in secrets_held.items():
            assert value not in text, f"the {what} is in {path}"
        assert not re.search(r"\bkey = b'", text), f"a traceback with local variables in {path}"
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path} is readable by others ({oct(mode)})"
