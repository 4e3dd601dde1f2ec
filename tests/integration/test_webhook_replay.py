"""The replay attack on signed webhook calls, against real `trimtab sim-broker` processes: the ``close`` an
agent sent to its broker during a transfer, captured and replayed byte for byte -- to the same broker, and
to the broker that took the bundle over -- is refused, as are forged variants, and none of them changes
what either broker serves. Also, through the real HTTP stack: a large signed renewal is accepted, an
oversized body is refused unread (413), and a client that hangs up mid-body is not an error."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.procs import Proc, Procs
from tests.support.waiting import wait_for
from trimtab.agent.adapters.base import Lease
from trimtab.agent.adapters.signing import BROKER, NONCE, TIMESTAMP
from trimtab.agent.adapters.webhook import MAX_REQUEST_BYTES, WebhookAdapter
from trimtab.devkit.zkserver import free_port

pytestmark = pytest.mark.integration

KEY = b"0123456789abcdef0123456789abcdef"
X = "public/default/0x00000000_0x40000000"


class SimBroker:
    def __init__(self, proc: Proc, port: int, broker_id: str) -> None:
        self.proc = proc
        self.port = port
        self.id = broker_id
        self.url = f"http://127.0.0.1:{port}"

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = httpx.get(f"{self.url}/trimtab/v1/sim/state", timeout=5).json()
        return state


def start(procs: Procs, key_file: Path, broker_id: str) -> SimBroker:
    port = free_port()
    proc = procs.trimtab(
        "sim-broker",
        "--port",
        str(port),
        "--broker-id",
        broker_id,
        "--set",
        f"broker.adapter.hmac_key_file={key_file}",
        name=broker_id,
    )
    b = SimBroker(proc, port, broker_id)
    wait_for(
        lambda: httpx.get(f"{b.url}/trimtab/v1/sim/state", timeout=1).status_code == 200,
        30,
        ignore=(httpx.HTTPError,),
        message=lambda: f"{broker_id} did not come up:\n{proc.stderr()[-2000:]}",
    )
    return b


@pytest.fixture
def brokers(procs: Procs, tmp_path: Path) -> tuple[SimBroker, SimBroker]:
    key_file = tmp_path / "hmac.key"
    key_file.write_text(KEY.decode() + "\n")
    return start(procs, key_file, "broker-1:6650"), start(procs, key_file, "broker-2:6650")


class Recording(httpx.AsyncBaseTransport):
    """A real transport that keeps every request it sends: the attacker's capture."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.sent: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def wire(
    request: httpx.Request, *, target: str | None = None, headers: dict[str, str] | None = None
) -> bytes:
    """The HTTP/1.1 bytes of a captured request (as h11 wrote them); ``target`` and ``headers`` forge."""
    line = f"{request.method} {target or request.url.raw_path.decode()} HTTP/1.1\r\n".encode()
    forged = {k.lower(): v for k, v in (headers or {}).items()}
    raw = [
        (k, forged[k.decode().lower()].encode()) if k.decode().lower() in forged else (k, v)
        for k, v in request.headers.raw
    ]
    assert len(forged) == sum(1 for k, _ in raw if k.decode().lower() in forged), (
        "a header to forge is missing"
    )
    head = b"".join(k + b": " + v + b"\r\n" for k, v in raw)
    return line + head + b"\r\n" + request.content


def send_raw(port: int, data: bytes) -> tuple[int, bytes]:
    """Send ``data`` on a fresh connection; the answer's status and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            assert chunk, f"connection closed before an answer: {buf!r}"
            buf += chunk
        head, _, body = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(
            int(v) for k, _, v in (ln.partition(":") for ln in lines[1:]) if k.lower() == "content-length"
        )
        while len(body) < length:
            chunk = s.recv(65536)
            assert chunk, "connection closed mid-answer"
            body += chunk
        return status, body


def lease() -> Lease:
    return Lease(60.0, int((time.time() + 60) * 1000))


def served(b: SimBroker) -> dict[str, Any]:
    """What a replay must not change: what the broker serves, its leases' existence and its history."""
    st = b.state()
    return {k: st[k] for k in ("serving", "fenced", "calls", "timeline")} | {"leases": sorted(st["leases"])}


def test_a_captured_close_replayed_to_either_broker_is_refused(brokers: tuple[SimBroker, SimBroker]) -> None:
    b1, b2 = brokers
    capture = Recording()

    async def transfer() -> None:
        # agent-1 beside broker-1, agent-2 beside broker-2; X moves from broker-1 to broker-2:
        # fence on the old owner, acquire on the new one, close on the old one (docs/broker-adapter.md).
        a1 = WebhookAdapter(b1.url, 5, hmac_key=KEY, broker_id=b1.id, transport=capture)
        a2 = WebhookAdapter(b2.url, 5, hmac_key=KEY, broker_id=b2.id)
        try:
            await a1.acquire(X, lease())
            await a1.fence(X)
            await a2.acquire(X, lease())
            await a1.close(X, "pulsar://broker-2:6650")
        finally:
            await a1.aclose()
            await a2.aclose()

    asyncio.run(transfer())
    close = capture.sent[-1]
    assert close.url.path == "/trimtab/v1/bundles/close"
    before1, before2 = served(b1), served(b2)
    assert before1["serving"] == [] and before2["serving"] == [X]

    # Byte for byte, to the broker it was meant for: already accepted once.
    status, body = send_raw(b1.port, wire(close))
    assert status == 401 and b"replayed" in body, body
    # Byte for byte, to the new owner -- the attack: not its broker id.
    status, body = send_raw(b2.port, wire(close))
    assert status == 401 and b"wrong_broker" in body, body
    # Forged: the broker header rewritten to the new owner's id, a fresh nonce, a timestamp one ms later
    # (to the new owner), a query string added (to the old one): the signature covers all of them.
    for forged in (
        wire(close, headers={BROKER: b2.id}),
        wire(close, headers={BROKER: b2.id, NONCE: "f" * 32}),
        wire(close, headers={BROKER: b2.id, TIMESTAMP: str(int(close.headers[TIMESTAMP]) + 1)}),
    ):
        status, body = send_raw(b2.port, forged)
        assert status == 401 and b"bad_signature" in body, body
    status, body = send_raw(b1.port, wire(close, target="/trimtab/v1/bundles/close?force=1"))
    assert status == 401 and b"bad_signature" in body, body

    assert served(b1) == before1 and served(b2) == before2  # nothing changed, on either broker
    assert b2.state()["serving"] == [X]
    r1 = {k: n for k, n in b1.state()["refused_calls"].items() if n}
    r2 = {k: n for k, n in b2.state()["refused_calls"].items() if n}
    assert r1 == {"replayed": 1, "bad_signature": 1} and r2 == {"wrong_broker": 1, "bad_signature": 3}


def test_large_renewals_pass_and_oversized_or_abandoned_bodies_are_harmless(
    brokers: tuple[SimBroker, SimBroker],
) -> None:
    b1, _ = brokers
    # 20 000 bundles: a ~0.8 MB renew body, far above the node's default body limit for other routes.
    bundles = [f"public/default/0x{i:08x}_0x{i + 1:08x}" for i in range(20_000)]

    async def renew() -> list[str]:
        a = WebhookAdapter(b1.url, 30, hmac_key=KEY, broker_id=b1.id)
        try:
            await a.acquire(bundles[0], lease())
            return await a.renew(bundles, lease())
        finally:
            await a.aclose()

    assert asyncio.run(renew()) == bundles[1:]

    # A body larger than any broker must accept: refused before it is read (none is sent at all).
    head = (
        "POST /trimtab/v1/bundles/renew HTTP/1.1\r\nhost: b\r\ncontent-type: application/json\r\n"
        f"content-length: {MAX_REQUEST_BYTES + 1}\r\n\r\n"
    ).encode()
    status, body = send_raw(b1.port, head)
    assert status == 413, body

    # A client announces 100 bytes, sends 10 and hangs up (half-close, then wait for the server to drop
    # the connection): no answer, and no error or traceback in the broker's log. The request that
    # follows is accepted only after that connection was dropped, so its task ran first.
    with socket.create_connection(("127.0.0.1", b1.port), timeout=10) as s:
        s.sendall(
            b"POST /trimtab/v1/bundles/fence HTTP/1.1\r\nhost: b\r\ncontent-type: application/json\r\n"
            b"content-length: 100\r\n\r\n" + b'{"bundle":'
        )
        s.shutdown(socket.SHUT_WR)
        assert s.recv(65536) == b""  # dropped without an answer
    assert b1.state()["serving"] == [bundles[0]]
    log = b1.proc.stderr()
    assert "http_handler_failed" not in log and "Traceback" not in log, log[-3000:]
