"""The real ZooKeeper server launcher (devkit/zkserver.py) and the fixtures built on it."""

from __future__ import annotations

import os
import sys
import threading
import uuid
from pathlib import Path

import pytest
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NodeExistsError

from tests.conftest import KazooClients, ZooKeeperServers
from tests.support.waiting import wait_for
from trimtab.devkit import zkserver
from trimtab.devkit.zkserver import ZooKeeperServer, ZooKeeperServerError, expire_session, find_classpath

pytestmark = pytest.mark.integration


class StateLog:
    """Records a kazoo client's connection states (listeners run on kazoo's thread)."""

    def __init__(self, client: KazooClient) -> None:
        self.states: list[str] = []
        self._lock = threading.Lock()
        client.add_listener(self._listen)

    def _listen(self, state: str) -> None:
        with self._lock:
            self.states.append(state)

    def seen(self, state: str) -> bool:
        with self._lock:
            return state in self.states


def test_server_serves_and_clients_create_ephemerals(zk_server: ZooKeeperServer, zk: KazooClient) -> None:
    assert zk_server.is_running()
    assert zk_server.is_serving()
    assert zk_server.four_letter_word("ruok") == "imok"
    assert "Mode: standalone" in zk_server.four_letter_word("srvr")
    assert zk_server.hosts == f"127.0.0.1:{zk_server.port}"

    zk.create("/brokers/b1", b"data", ephemeral=True, makepath=True)
    assert zk.get("/brokers/b1")[0] == b"data"
    assert zk.get("/brokers/b1")[1].ephemeralOwner == zk.client_id[0]
    with pytest.raises(NodeExistsError):
        zk.create("/brokers/b1", b"again", ephemeral=True)


def test_each_test_gets_its_own_chroot(zk: KazooClient, zk_server: ZooKeeperServer, zk_chroot: str) -> None:
    zk.create("/mine", b"1")
    root = KazooClient(hosts=zk_server.hosts)
    root.start(timeout=10)
    try:
        assert root.get_children(zk_chroot) == ["mine"]
        assert zk_chroot.startswith("/t-")
    finally:
        root.stop()
        root.close()


def test_kill_and_restart_keep_address_and_data(zk_server_factory: ZooKeeperServers) -> None:
    server = zk_server_factory.make()
    port, hosts = server.port, server.hosts
    clients = KazooClients(hosts)
    try:
        # A session that outlives a slow restart on a loaded machine (a CI run saw the restarted JVM take long
        # enough that a 10-s session expired): what is tested is that the server keeps its sessions, not speed.
        client = clients.make(timeout=30.0)
        client.create("/persistent", b"survives", makepath=True)
        client.create("/ephemeral", b"session", ephemeral=True)
        states = StateLog(client)

        first_pid = server.pid
        server.kill()
        assert not server.is_running()
        wait_for(lambda: states.seen(KazooState.SUSPENDED), 10, message="the client notices the dead server")

        server.restart()
        assert server.port == port and server.hosts == hosts
        assert server.pid != first_pid
        assert server.starts == 2

        # The same client reconnects to the same address and resumes its session (the restarted server
        # reloads sessions from its data dir and the session timeout has not passed).
        wait_for(lambda: client.state == KazooState.CONNECTED, 15, message="the client reconnects")
        assert client.get("/persistent")[0] == b"survives"
        assert client.exists("/ephemeral") is not None

        # A brand-new client sees the persistent data too.
        fresh = clients.make()
        assert fresh.get("/persistent")[0] == b"survives"
    finally:
        clients.close()


def test_stop_is_clean_and_start_again_is_possible(zk_server_factory: ZooKeeperServers) -> None:
    server = zk_server_factory.make()
    assert server.stop() is not None
    assert not server.is_running()
    assert not server.is_serving()
    assert server.stop() is not None  # idempotent
    server.start()
    assert server.is_serving()


def test_context_manager(tmp_path: Path) -> None:
    with ZooKeeperServer(tmp_path / "zk") as server:
        assert server.is_serving()
        log_path = server.log_path
    assert not server.is_running()
    assert "binding to port" in log_path.read_text()


def test_port_taken_by_another_server_fails_with_the_log(
    zk_server: ZooKeeperServer, zk_server_factory: ZooKeeperServers
) -> None:
    # The shared server answers on that port, but it is not ours: start() must not mistake it for the
    # new server (readiness checks the data dir through `envi`) and must say what went wrong.
    with pytest.raises(ZooKeeperServerError, match=r"port \d+ is in use") as info:
        zk_server_factory.make(port=zk_server.port)
    assert "last lines of the log" in str(info.value)
    assert zk_server.is_serving()


def test_missing_java_is_a_clear_error(zk_server_factory: ZooKeeperServers) -> None:
    server = zk_server_factory.make(start=False, java="/nonexistent/java")
    with pytest.raises(ZooKeeperServerError, match="cannot run"):
        server.start(timeout=5)


def test_classpath_discovery_prefers_explicit_then_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert find_classpath("a.jar:b.jar") == "a.jar:b.jar"
    assert find_classpath(["a.jar", "b.jar"]) == "a.jar:b.jar"
    monkeypatch.setenv("TRIMTAB_ZK_CLASSPATH", "/nonexistent/zookeeper.jar")
    with pytest.raises(ZooKeeperServerError, match="do not exist"):
        find_classpath()
    monkeypatch.delenv("TRIMTAB_ZK_CLASSPATH")
    assert "zookeeper" in find_classpath()


def test_expire_session_really_expires_it_on_the_server(
    zk_client_factory: KazooClients, zk: KazooClient
) -> None:
    victim = zk_client_factory.make()
    states = StateLog(victim)
    node = f"/victim-{uuid.uuid4().hex[:6]}"
    victim.create(node, b"alive", ephemeral=True)
    old_session = victim.client_id[0]

    expire_session(zk_client_factory.hosts, victim.client_id)

    # Seen by another client: the server dropped the ephemeral at once (not after the 10 s timeout).
    wait_for(lambda: zk.exists(node) is None, 3.0, message="the victim's ephemeral node disappears")
    wait_for(lambda: states.seen(KazooState.LOST), 5.0, message="the victim sees its session LOST")
    # kazoo then reconnects with a new session.
    wait_for(lambda: victim.state == KazooState.CONNECTED, 10.0, message="the victim reconnects")
    assert victim.client_id[0] != old_session
    assert victim.exists(node) is None


def test_classpath_falls_back_to_the_pyspark_wheel_jars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Debian jars, a pyspark wheel on sys.path: its ZooKeeper, netty and logging jars are used."""
    jars = tmp_path / "site" / "pyspark" / "jars"
    jars.mkdir(parents=True)
    (jars.parent / "__init__.py").write_text("")
    wanted = [
        "zookeeper-3.9.3.jar",
        "zookeeper-jute-3.9.3.jar",
        "netty-handler-4.1.118.Final.jar",
        "netty-transport-native-epoll-4.1.118.Final-linux-x86_64.jar",
        "slf4j-api-2.0.16.jar",
        "log4j-slf4j2-impl-2.24.3.jar",
        "log4j-core-2.24.3.jar",
        "metrics-core-4.2.30.jar",
    ]
    for name in [*wanted, "spark-core_2.13-4.0.0.jar", "hadoop-client-api-3.4.1.jar"]:
        (jars / name).write_bytes(b"")
    monkeypatch.delenv("TRIMTAB_ZK_CLASSPATH", raising=False)
    monkeypatch.setattr(zkserver, "DEBIAN_JAVA_DIR", tmp_path / "no-debian")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    # The real pyspark (the spark extra) may already be imported by earlier tests: look it up afresh.
    for name in [m for m in sys.modules if m == "pyspark" or m.startswith("pyspark.")]:
        monkeypatch.delitem(sys.modules, name)

    chosen = {Path(p).name for p in find_classpath().split(os.pathsep)}
    assert chosen == set(wanted)


def test_no_zookeeper_anywhere_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRIMTAB_ZK_CLASSPATH", raising=False)
    monkeypatch.setattr(zkserver, "DEBIAN_JAVA_DIR", tmp_path / "no-debian")
    monkeypatch.setattr(zkserver, "_pyspark_classpath", lambda: None)
    with pytest.raises(ZooKeeperServerError, match=r"apt-get install zookeeper.*scripts/setup\.sh"):
        find_classpath()
