"""Broker leases against a real ZooKeeper server: the session confirmation they rest on, the session
timeout the server really granted, and a lost session making the agent stop vouching at once; and the
signed webhook against the reference broker process."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from tests.conftest import ZooKeeperServers
from tests.support.procs import Procs
from tests.support.waiting import wait_for
from trimtab.agent.adapters.base import Lease
from trimtab.agent.adapters.webhook import WebhookAdapter
from trimtab.agent.leases import LeaseGuard
from trimtab.agent.metrics import AgentMetrics
from trimtab.cluster.metrics import new_registry
from trimtab.cluster.zk import ZkSession
from trimtab.config.settings import Settings
from trimtab.devkit.zkserver import free_port
from trimtab.errors import AdapterError, LeaseUnavailable, StartupError

pytestmark = pytest.mark.integration


def guard(session: ZkSession, lease_s: float = 2.0, margin_s: float = 1.0) -> LeaseGuard:
    return LeaseGuard(
        session, lease_s=lease_s, margin_s=margin_s, metrics=AgentMetrics.create(new_registry())
    )


def test_a_confirmed_session_grants_leases_that_end_before_it_can_expire(zk_hosts: str) -> None:
    session = ZkSession(zk_hosts, session_timeout_s=4)
    session.start()
    try:
        g = guard(session)
        assert g.bound() == 0.0
        with pytest.raises(LeaseUnavailable):
            g.grant()  # nothing confirmed yet
        lease = asyncio.run(g.lease_for_acquire())
        assert lease is not None
        assert session.granted_timeout_s() == 4.0
        assert lease.seconds == 2.0
        # No lease outlives the last confirmation + session timeout - margin. (The heartbeat thread may
        # confirm again at any moment -- a CI run saw it between the question and the check -- so the bound
        # is measured against that ceiling; that it runs down without confirmations is the next test's.)
        assert 0.0 < g.bound() <= 4.0 - 1.0
        assert lease.apply_by_ms - time.time() * 1000 <= 500 + 5  # half the margin to arrive
    finally:
        session.stop()


def test_the_heartbeat_keeps_the_bound_fresh_without_the_loop(zk_hosts: str) -> None:
    """No asyncio at all: the heartbeat thread alone keeps confirming, so the grantable lease stays near the
    full lease however long the caller does not confirm; stopping it lets the bound run down."""
    session = ZkSession(zk_hosts, session_timeout_s=4)
    session.start()
    g = guard(session, lease_s=2.0, margin_s=1.0)
    try:
        g.start_heartbeat()
        wait_for(lambda: g.confirmed_at is not None, timeout=5, message="a first heartbeat")
        first = g.confirmed_at
        assert first is not None
        # Several heartbeats (every lease/4 = 0.5 s) later the confirmation moved on with them.
        wait_for(lambda: (g.confirmed_at or 0) > first + 1.0, timeout=10, message="later heartbeats")
        assert g.bound() > 3.0 - 1.0 - 0.5 - 0.25  # timeout - margin - heartbeat period - slack
    finally:
        g.stop_heartbeat()
        last = g.confirmed_at
        session.stop()
    assert g.confirmed_at == last  # stopped means stopped


def test_a_confirmation_begun_before_the_session_was_lost_does_not_count() -> None:
    """forget() (the session was lost) between a round trip's start and its answer: the answer is dropped."""

    release = threading.Event()

    class SlowZk:
        connected = True
        requested_timeout_s = 4.0

        def granted_timeout_s(self, wait_s: float = 0) -> float:
            return 4.0

        def confirm(self, timeout_s: float, path: str = "/") -> None:
            release.wait(5)

    g = LeaseGuard(SlowZk(), lease_s=2.0, margin_s=1.0, metrics=AgentMetrics.create(new_registry()))  # type: ignore[arg-type]
    t = threading.Thread(target=g.confirm_blocking)
    t.start()
    g.forget()
    release.set()
    t.join(5)
    assert g.confirmed_at is None and g.bound() == 0.0
    g.confirm_blocking()  # a round trip begun after the loss counts
    assert g.bound() > 0


def test_the_session_timeout_the_server_grants_must_fit_the_lease(
    zk_server_factory: ZooKeeperServers,
) -> None:
    server = zk_server_factory.make(max_session_ms=3000)
    session = ZkSession(server.hosts, session_timeout_s=20)  # the server clamps it to 3 s
    session.start()
    try:
        assert session.granted_timeout_s() == 3.0
        with pytest.raises(StartupError, match="granted a 3s session timeout"):
            guard(session, lease_s=15.0, margin_s=2.0).check_session_timeout()
        guard(session, lease_s=1.0, margin_s=1.0).check_session_timeout()
    finally:
        session.stop()


def test_no_lease_without_zookeeper(zk_server_factory: ZooKeeperServers) -> None:
    server = zk_server_factory.make()
    session = ZkSession(server.hosts, session_timeout_s=4)
    session.start()
    try:
        g = guard(session)
        asyncio.run(g.confirm())
        server.stop()
        wait_for(lambda: not session.connected, 10, message="the client noticed the server is gone")
        g.forget()  # what a lost session does; a suspended one just stops being confirmed
        with pytest.raises(LeaseUnavailable, match="ZooKeeper"):
            asyncio.run(g.lease_for_acquire())
    finally:
        session.stop()


def test_settings_refuse_a_lease_that_outlives_the_session() -> None:
    with pytest.raises(ValueError, match="must not exceed"):
        Settings.model_validate(
            {"zookeeper": {"session_timeout_s": 6}, "broker": {"adapter": {"lease_s": 5}}}
        )
    s = Settings.model_validate({"zookeeper": {"session_timeout_s": 6}})
    assert s.lease_s() == 4.0


def test_the_reference_broker_refuses_unsigned_and_forged_calls(procs: Procs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    key = tmp_path / "key"
    key.write_text("0123456789abcdef0123456789abcdef\n")
    port = free_port()
    procs.trimtab(
        "sim-broker",
        "--port",
        str(port),
        "--set",
        f"broker.adapter.hmac_key_file={key}",
        name="signed-broker",
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(
        lambda: httpx.get(f"{url}/trimtab/v1/sim/state", timeout=1).status_code == 200,
        30,
        ignore=(httpx.HTTPError,),
        message="the signed sim-broker did not come up",
    )
    bundle = "t/ns/0x00000000_0x80000000"
    body = {"bundle": bundle, "lease_s": 30, "apply_by_ms": int(time.time() * 1000) + 60_000}
    r = httpx.post(f"{url}/trimtab/v1/bundles/acquire", json=body)
    assert r.status_code == 401 and "unsigned" in r.json()["error"]
    # The sim-broker's id is its --broker-id default: calls are signed for it.
    forged = WebhookAdapter(url, 5, hmac_key=b"not the key, but long enough", broker_id="sim-broker")
    signed = WebhookAdapter(url, 5, hmac_key=b"0123456789abcdef0123456789abcdef", broker_id="sim-broker")
    lease = Lease(30, int(time.time() * 1000) + 60_000)

    async def calls() -> list[str]:
        try:
            with pytest.raises(AdapterError, match="HTTP 401"):
                await forged.acquire(bundle, lease)
            await signed.acquire(bundle, lease)
            return await signed.renew([bundle, "t/ns/0x80000000_0xffffffff"], lease)
        finally:
            await forged.aclose()
            await signed.aclose()

    assert asyncio.run(calls()) == ["t/ns/0x80000000_0xffffffff"]
    state = httpx.get(f"{url}/trimtab/v1/sim/state").json()
    refused = {reason: n for reason, n in state["refused_calls"].items() if n}
    assert state["serving"] == [bundle] and refused == {"missing_header": 1, "bad_signature": 1}
