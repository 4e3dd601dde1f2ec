"""A ZooKeeper session against a server that accepts a connection and then stays silent (one still
starting, a paused JVM, a half-open link): kazoo would give that one attempt the whole session timeout (it
divides the timeout by the number of servers listed), and the next attempt would be told the session
expired -- every lease of the broker lost to one slow answer. ZkSession caps an attempt at a third of the
session (cluster/zk.py), so the session survives. Against a real ZooKeeper, through a proxy that plays the
silent server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.tcpproxy import TcpProxy
from tests.support.waiting import wait_for
from trimtab.cluster.zk import ZkSession
from trimtab.devkit.zkserver import ZooKeeperServer

SESSION_S = 6.0


@pytest.fixture
def proxy(zk_server: ZooKeeperServer) -> Iterator[TcpProxy]:
    host, port = zk_server.hosts.split(",")[0].rsplit(":", 1)
    p = TcpProxy((host, int(port)))
    try:
        yield p
    finally:
        p.close()


def test_a_silent_server_costs_one_attempt_not_the_session(proxy: TcpProxy) -> None:
    session = ZkSession(proxy.address, session_timeout_s=SESSION_S)
    states: list[str] = []
    session.add_listener(states.append)
    session.start()
    try:
        wait_for(lambda: states == ["connected"], 10, message="the first connection heard")
        states.clear()
        assert session.connect_attempt_s == SESSION_S / 3
        session_id = session.client.client_id[0]
        proxy.silence_next(1)
        proxy.cut()  # the connection drops; the first attempt to reconnect meets a silent server
        wait_for(lambda: "suspended" in states, 10, message="the connection loss seen")
        wait_for(
            lambda: states[-1] != "suspended",
            SESSION_S * 3,
            message=lambda: f"the session reconnected or lost (states {states})",
        )
        assert proxy.silenced == 1
        assert states == ["suspended", "connected"], states  # never "lost"
        assert session.client.client_id[0] == session_id  # the same session: its ephemeral nodes kept
    finally:
        session.stop()


def test_an_attempt_is_capped_at_a_third_of_the_session_and_never_below_a_second() -> None:
    assert ZkSession("127.0.0.1:1", session_timeout_s=30).connect_attempt_s == 10.0
    assert ZkSession("127.0.0.1:1", session_timeout_s=2).connect_attempt_s == 1.0
