"""Fixtures shared by every test suite.

Real components only (docs/design.md section 9): a real ZooKeeper server process and a real Apache Kafka
(KRaft, from the dev kit's cache: scripts/setup.sh). Nothing here is mocked. If ZooKeeper or
Java is missing the ZooKeeper fixtures *error* with the install hint (``apt-get install zookeeper`` or
``bash scripts/setup.sh``): a missing dependency must not turn into a green run of skipped tests.

Fixtures (keep this table current when you add one; group new fixtures under the matching section):

=====================  ========  ==========================================================================
fixture                scope     what it gives
=====================  ========  ==========================================================================
``zk_server``          session   a running standalone :class:`trimtab.devkit.zkserver.ZooKeeperServer`; shared,
                                 so never stop/kill/restart it (use ``zk_server_factory``)
``zk_server_factory``  function  ``make(**kw)`` -> a private, started server (for kill/restart tests)
``zk_chroot``          function  a fresh, existing chroot path ``/t-<uuid>`` on ``zk_server``
``zk_hosts``           function  ``"127.0.0.1:<port>/t-<uuid>"``: the connect string for that chroot
``zk_client_factory``  function  ``make(**kw)`` -> another started KazooClient in the same chroot
``zk``                 function  a started KazooClient chrooted to ``zk_chroot``
``kafka_cluster``      session   a real one-node Kafka, :class:`trimtab.devkit.kafka_server.KafkaCluster`
``kafka``              function  :class:`tests.support.kafka.KafkaEnv`: a KafkaTransport and topic names
                                 unique to the test (``channel_topic``, ``snapshot_topic``, ``topic(x)``)
``procs``              function  :class:`tests.support.procs.Procs`: CLI/helper subprocesses, all killed
                                 (whole process groups) at teardown
``spark``              session   a local Spark session (``local[2]``, 4 shuffle partitions, no UI) for the
                                 pipeline tests; started on first use only (docs/pipeline.md)
``log``                function  :func:`tests.support.memory_log.memory_log` of the module's own ``settings``
                                 fixture: the in-memory channel log an in-process cluster runs on
``clients``            function  a list to append the ChannelClients a test starts to: each is stopped at
                                 teardown
``followers``          function  the same for the channel Followers a test starts
=====================  ========  ==========================================================================

Synchronise with ``tests.support.waiting.wait_for`` (a condition and a deadline), never with sleeps.

When a test fails, the report gets the tail of the ZooKeeper log of every server it used and the stderr
of every subprocess it started (``pytest_runtest_makereport`` below; kazoo's own suite does the same).
"""

from __future__ import annotations

import uuid
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.retry import KazooRetry

from tests.support.kafka import KafkaEnv, make_env
from tests.support.memory_log import memory_log
from tests.support.procs import Procs
from trimtab.channel.client import ChannelClient
from trimtab.channel.memory import MemoryLog
from trimtab.channel.transport import Follower
from trimtab.config.settings import Settings
from trimtab.devkit.kafka_server import KafkaCluster
from trimtab.devkit.zkserver import ZooKeeperServer

# ---------------------------------------------------------------------------------------------- ZooKeeper

# Reconnect quickly after a server restart (kazoo's default backs off up to a minute).
FAST_RETRY: dict[str, Any] = {"max_tries": -1, "delay": 0.05, "backoff": 1.5, "max_delay": 0.5}
ZK_SESSION_TIMEOUT = 10.0


class ZooKeeperServers:
    """Private servers for destructive tests (kill, restart), each in its own directory; stopped after."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.servers: list[ZooKeeperServer] = []

    def make(self, start: bool = True, **kwargs: Any) -> ZooKeeperServer:
        server = ZooKeeperServer(self.base / f"zk{len(self.servers)}", **kwargs)
        self.servers.append(server)
        return server.start() if start else server

    def close(self) -> None:
        for s in self.servers:
            s.stop(timeout=5.0)


class KazooClients:
    """Started KazooClients on one connect string; stopped and closed after the test."""

    def __init__(self, hosts: str) -> None:
        self.hosts = hosts
        self.clients: list[KazooClient] = []

    def make(self, hosts: str | None = None, **kwargs: Any) -> KazooClient:
        kwargs.setdefault("timeout", ZK_SESSION_TIMEOUT)
        kwargs.setdefault("connection_retry", KazooRetry(**FAST_RETRY))
        client = KazooClient(hosts=hosts or self.hosts, **kwargs)
        self.clients.append(client)
        client.start(timeout=15)
        return client

    def close(self) -> None:
        for c in self.clients:
            try:
                c.stop()
            finally:
                c.close()


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zk_server_factory(tmp_path: Path) -> Iterator[ZooKeeperServers]:
    servers = ZooKeeperServers(tmp_path)
    try:
        yield servers
    finally:
        servers.close()


@pytest.fixture
def zk_chroot(zk_server: ZooKeeperServer) -> str:
    """A unique chroot that exists (kazoo warns when connecting to a chroot that does not)."""
    chroot = f"/t-{uuid.uuid4().hex[:12]}"
    root = KazooClient(hosts=zk_server.hosts, timeout=ZK_SESSION_TIMEOUT)
    root.start(timeout=15)
    try:
        root.ensure_path(chroot)
    finally:
        root.stop()
        root.close()
    return chroot


@pytest.fixture
def zk_hosts(zk_server: ZooKeeperServer, zk_chroot: str) -> str:
    return f"{zk_server.hosts}{zk_chroot}"


@pytest.fixture
def zk_client_factory(zk_hosts: str) -> Iterator[KazooClients]:
    clients = KazooClients(zk_hosts)
    try:
        yield clients
    finally:
        clients.close()


@pytest.fixture
def zk(zk_client_factory: KazooClients) -> KazooClient:
    return zk_client_factory.make()


# ---------------------------------------------------------------------------------------------- Kafka


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """A real Apache Kafka (one KRaft node, trimtab.devkit.kafka_server) for the whole session. Topics a
    metadata request names are auto-created with four partitions, as on the librdkafka mock the suite
    used before; tests create what they need through :class:`tests.support.kafka.KafkaEnv`."""
    cluster = KafkaCluster(
        tmp_path_factory.mktemp("kafka"),
        brokers=1,
        extra_config={"auto.create.topics.enable": "true", "num.partitions": "4"},
    ).start()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def kafka(kafka_cluster: KafkaCluster, request: pytest.FixtureRequest) -> Iterator[KafkaEnv]:
    env = make_env(kafka_cluster, request.node.name)
    try:
        yield env
    finally:
        env.close()


# ---------------------------------------------------------------------------------------------- in-process clusters


@pytest.fixture
def log(settings: Settings) -> MemoryLog:
    return memory_log(settings)


def stopped_at_teardown() -> Iterator[list[Any]]:
    """A fixture's body: the list a test appends what it started to, each ``stop()``-ed at teardown."""
    started: list[Any] = []
    yield started
    for x in started:
        x.stop()


@pytest.fixture
def clients() -> Iterator[list[ChannelClient]]:
    yield from stopped_at_teardown()


@pytest.fixture
def followers() -> Iterator[list[Follower]]:
    yield from stopped_at_teardown()


# ---------------------------------------------------------------------------------------------- processes


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path / "procs")
    try:
        yield p
    finally:
        p.close()


# ---------------------------------------------------------------------------------------------- Spark


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One Spark session for every pipeline test: starting a JVM costs ~10 s, so it is shared (and only
    started when a test asks for it). Its Python workers run this interpreter (PYSPARK_PYTHON)."""
    from trimtab.pipeline.common import Progress
    from trimtab.pipeline.session import spark_session

    conf = {"spark.sql.shuffle.partitions": "4", "spark.default.parallelism": "2"}
    with spark_session(
        "trimtab-tests", master="local[2]", conf=conf, progress=Progress("tests", quiet=True)
    ) as s:
        yield s


# ---------------------------------------------------------------------------------------------- failure reports

_Section = tuple[str, str]


def _failure_sections(funcargs: dict[str, Any]) -> list[_Section]:
    sections: list[_Section] = []
    servers: list[ZooKeeperServer] = []
    for value in funcargs.values():
        if isinstance(value, ZooKeeperServer):
            servers.append(value)
        elif isinstance(value, ZooKeeperServers):
            servers.extend(value.servers)
        elif isinstance(value, Procs) and value.procs:
            sections.append(("subprocesses (stderr tails)", value.report()))
    for s in dict.fromkeys(servers):
        sections.append((f"ZooKeeper log {s.hosts if s.port else ''} ({s.log_path})", s.log_tail(60)))
    return sections


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        funcargs: dict[str, Any] = getattr(item, "funcargs", {}) or {}
        try:
            report.sections.extend(_failure_sections(funcargs))
        except Exception as e:  # a report helper must never hide the real failure
            report.sections.append(("failure context", f"could not collect: {e!r}"))
    return report
