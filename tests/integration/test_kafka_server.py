"""The real Apache Kafka launcher (devkit/kafka_server.py): a KRaft cluster of JVMs on loopback.

What the librdkafka mock cannot show: a real broker's replication (a killed partition leader is replaced and
an acks=all write still succeeds with min.insync.replicas=2), a killed broker rejoining the ISR, SCRAM
authentication over TLS, and ACLs. Each test starts its own cluster (the SASL_SSL tests share one); the
jars come from the cache ``scripts/setup.sh`` fills (or ``$TRIMTAB_KAFKA_CLASSPATH``). On a failure the
tail of every node's log is in the "Captured stdout teardown" section.
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.support.procs import REPO_ROOT, Procs
from tests.support.waiting import wait_for
from trimtab.cluster.wiring import parse_properties
from trimtab.devkit import kafka_server
from trimtab.devkit.kafka_server import KafkaCluster, KafkaServerError, find_classpath

pytestmark = pytest.mark.integration

QUIET = {"log_level": 0, "error_cb": lambda err: None}


class Clusters:
    """Clusters for one test (or module), each in its own directory; closed after, logs printed."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.clusters: list[KafkaCluster] = []

    def make(self, brokers: int = 1, **kwargs: Any) -> KafkaCluster:
        cluster = KafkaCluster(self.base / f"kafka{len(self.clusters)}", brokers, **kwargs)
        self.clusters.append(cluster)
        return cluster.start(timeout=180)

    def close(self) -> None:
        for cluster in self.clusters:
            for b in cluster.brokers:
                print(f"--- {cluster.log_path(b.id)} ---\n{cluster.log_tail(b.id, 25)}")
            cluster.close()


@pytest.fixture
def clusters(tmp_path: Path) -> Iterator[Clusters]:
    made = Clusters(tmp_path)
    try:
        yield made
    finally:
        made.close()


def produce(
    conf: dict[str, Any], topic: str, value: bytes, timeout: float = 90.0, *, idempotent: bool = True
) -> Any:
    """Produce one message with acks=all and return its delivery report (the message, or the error)."""
    reports: list[tuple[KafkaError | None, Any]] = []
    producer = Producer(
        {
            **conf,
            **QUIET,
            "acks": "all",
            "message.timeout.ms": int(timeout * 1000),
            "enable.idempotence": idempotent,
        }
    )
    producer.produce(topic, value=value, on_delivery=lambda err, msg: reports.append((err, msg)))
    wait_for(
        lambda: producer.poll(0.2) >= 0 and reports, timeout + 10, message=f"a delivery report for {topic}"
    )
    err, msg = reports[0]
    return err if err is not None else msg


def consume_all(
    conf: dict[str, Any], topic: str, count: int, group: str, timeout: float = 60.0
) -> list[bytes]:
    """Read ``count`` messages of partition 0 from the beginning (assigned, never committed)."""
    consumer = Consumer(
        {**conf, **QUIET, "group.id": group, "enable.auto.commit": False, "auto.offset.reset": "earliest"}
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        values: list[bytes] = []

        def got_all() -> bool:
            msg = consumer.poll(0.5)
            if msg is not None:
                if msg.error() is not None:
                    raise AssertionError(f"consumer error: {msg.error()}")
                values.append(msg.value())
            return len(values) >= count

        wait_for(got_all, timeout, interval=0, message=lambda: f"{count} messages of {topic} (got {values})")
        return values
    finally:
        consumer.close()


def partition_state(cluster: KafkaCluster, topic: str) -> tuple[int, list[int]]:
    """(leader, ISR) of partition 0, as the cluster's metadata says now."""
    md = AdminClient({**cluster.admin_config(), **QUIET}).list_topics(topic, timeout=10)
    p = md.topics[topic].partitions[0]
    return p.leader, sorted(p.isrs)


# ---------------------------------------------------------------------------------------------- discovery


def test_the_pom_pins_the_version_the_launcher_expects() -> None:
    pom = (REPO_ROOT / "devkit" / "kafka" / "pom.xml").read_text()
    pinned = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom)
    assert pinned is not None and pinned.group(1) == kafka_server.KAFKA_VERSION


def test_missing_jars_say_how_to_get_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kafka_server.CLASSPATH_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(KafkaServerError) as e:
        find_classpath()
    message = str(e.value)
    assert "\n" not in message
    assert str(tmp_path / "cache" / "trimtab" / f"kafka-{kafka_server.KAFKA_VERSION}" / "libs") in message
    assert "scripts/setup.sh" in message and kafka_server.CLASSPATH_ENV in message

    (tmp_path / "empty").mkdir()
    monkeypatch.setenv(kafka_server.CLASSPATH_ENV, str(tmp_path / "empty"))
    with pytest.raises(KafkaServerError, match=r"no kafka_2\.13"):
        find_classpath()
    monkeypatch.setenv(kafka_server.CLASSPATH_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(KafkaServerError, match="does not exist"):
        find_classpath()


def test_missing_java_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(KafkaServerError) as e:
        KafkaCluster(tmp_path / "k").start()
    assert "\n" not in str(e.value) and "Java" in str(e.value)


# ---------------------------------------------------------------------------------------------- plaintext


@pytest.mark.slow
def test_one_broker_serves_a_topic(clusters: Clusters) -> None:
    cluster = clusters.make(1)
    (broker,) = cluster.brokers
    assert (
        broker.id == 1 and broker.pid is not None and cluster.bootstrap_servers == f"127.0.0.1:{broker.port}"
    )
    assert cluster.ready_seconds is not None and cluster.ready_seconds < 180

    cluster.create_topics(["greetings"], partitions=1)
    cluster.create_topics(["greetings"], partitions=1)  # already there: fine
    conf = cluster.client_config()
    assert conf == {"bootstrap.servers": cluster.bootstrap_servers}
    sent = produce(conf, "greetings", b"hello, kafka")
    assert not isinstance(sent, KafkaError), sent
    assert sent.offset() == 0
    assert consume_all(conf, "greetings", 1, group="g1") == [b"hello, kafka"]
    with pytest.raises(KafkaServerError, match="sasl_ssl"):
        cluster.create_user("alice", "secret")


@pytest.mark.slow
def test_three_brokers_survive_the_partition_leader_being_killed(clusters: Clusters) -> None:
    cluster = clusters.make(3)
    assert sorted(b.id for b in cluster.brokers) == [1, 2, 3]
    conf = cluster.client_config()
    topic = "replicated"
    cluster.create_topics([topic], partitions=1, replication=3, config={"min.insync.replicas": "2"})
    first = produce(conf, topic, b"before")
    assert not isinstance(first, KafkaError), first
    wait_for(
        lambda: partition_state(cluster, topic)[1] == [1, 2, 3],
        60,
        interval=0.2,
        message="all three replicas in sync",
        ignore=(KafkaException,),
    )

    leader = cluster.partition_leader(topic)
    victim_pid, victim_port = cluster.broker(leader).pid, cluster.broker(leader).port
    cluster.kill(leader, signal.SIGKILL)
    assert not cluster.is_running(leader) and cluster.broker(leader).pid is None
    assert victim_pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(victim_pid, 0)

    # acks=all with min.insync.replicas=2: succeeds once the controller fences the dead broker and a
    # surviving replica leads with an ISR of two.
    second = produce(conf, topic, b"after")
    assert not isinstance(second, KafkaError), second
    # Every broker's metadata says so a moment later (the one that answers may lag the controller).
    survivors = sorted({1, 2, 3} - {leader})

    def survivor_leads() -> bool:
        new_leader, isr = partition_state(cluster, topic)
        return new_leader in survivors and isr == survivors

    wait_for(
        survivor_leads,
        30,
        interval=0.2,
        message=lambda: (
            f"a survivor leads with an ISR of {survivors} (now {partition_state(cluster, topic)})"
        ),
        ignore=(KafkaException,),
    )

    cluster.start_broker(leader)
    assert cluster.is_running(leader) and cluster.broker(leader).port == victim_port
    wait_for(
        lambda: partition_state(cluster, topic)[1] == [1, 2, 3],
        90,
        interval=0.2,
        message=lambda: f"broker {leader} back in the ISR (now {partition_state(cluster, topic)})",
        ignore=(KafkaException,),
    )
    assert consume_all(conf, topic, 2, group="g2") == [b"before", b"after"]


@pytest.mark.slow
def test_runs_standalone_until_ctrl_c(tmp_path: Path, procs: Procs) -> None:
    env = {kafka_server.CLASSPATH_ENV: v} if (v := os.environ.get(kafka_server.CLASSPATH_ENV)) else {}
    proc = procs.python_module(
        "trimtab.devkit.kafka_server", "--brokers", "1", "--workdir", str(tmp_path / "k"), env=env
    )
    line = wait_for(
        lambda: proc.stdout().partition("\n")[0] if "\n" in proc.stdout() else None,
        180,
        message=lambda: f"the bootstrap servers on stdout (stderr: {proc.stderr()[-2000:]})",
    )
    assert re.fullmatch(r"127\.0\.0\.1:\d+", line), line
    md = AdminClient({"bootstrap.servers": line, **QUIET}).list_topics(timeout=30)
    assert list(md.brokers) == [1]
    pid = int(re.search(r"broker 1: \S+ pid (\d+)", proc.stderr()).group(1))  # type: ignore[union-attr]

    proc.signal_group(signal.SIGINT)
    assert proc.wait(60).returncode == 0

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(gone, 10, message=f"the broker's JVM (pid {pid}) exits with the launcher")


# ---------------------------------------------------------------------------------------------- SASL_SSL


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """Three SASL_SSL brokers (SCRAM between them too), shared by the tests below: each uses its own users
    and topics."""
    made = Clusters(tmp_path_factory.mktemp("kafka-sasl"))
    try:
        yield made.make(3, security="sasl_ssl")
    finally:
        made.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.mark.slow
def test_sasl_ssl_accepts_the_right_scram_password(secure: KafkaCluster) -> None:
    user, topic = unique("alice"), unique("secured")
    secure.create_user(user, "alice-secret-1")
    secure.grant(user, ["WRITE", "READ"], topic=topic)
    secure.grant(user, ["READ"], group=f"{user}-group")
    secure.create_topics([topic], partitions=1, replication=3, config={"min.insync.replicas": "2"})

    conf = secure.client_config(user, "alice-secret-1")
    assert conf["security.protocol"] == "SASL_SSL" and conf["sasl.mechanisms"] == "SCRAM-SHA-512"
    assert conf["ssl.ca.location"] == str(secure.ca_file)
    sent = produce(conf, topic, b"over tls")  # replicated to all three over SASL_SSL (acks=all)
    assert not isinstance(sent, KafkaError), sent
    assert consume_all(conf, topic, 1, group=f"{user}-group") == [b"over tls"]


@pytest.mark.slow
def test_a_principal_s_properties_file_is_what_trimtab_reads(secure: KafkaCluster, tmp_path: Path) -> None:
    """``write_client_properties``: an owner-only ``kafka.client_config_file`` that, with the bootstrap
    servers, is a working client of that principal (trimtab's own parser reads it)."""
    user, topic = unique("carol"), unique("props")
    secure.create_user(user, "carol-secret-1")
    secure.grant(user, ["READ"], topic=topic)
    secure.create_topics([topic], partitions=1)
    path = secure.write_client_properties(tmp_path / "carol.properties", user, "carol-secret-1")
    assert path.stat().st_mode & 0o777 == 0o600
    props = parse_properties(path.read_text(), str(path))
    assert props == {
        k: str(v) for k, v in secure.client_config(user, "carol-secret-1").items() if k != "bootstrap.servers"
    }
    admin = AdminClient({"bootstrap.servers": secure.bootstrap_servers, **props, **QUIET})
    md = admin.list_topics(timeout=30)
    # READ implies DESCRIBE; the other tests' topics (and the internal ones) it may not even see.
    assert set(md.topics) == {topic} and md.topics[topic].error is None, md.topics


@pytest.mark.slow
def test_sasl_ssl_refuses_a_wrong_password_quickly_and_clearly(secure: KafkaCluster) -> None:
    user = unique("bob")
    secure.create_user(user, "bob-secret-1")
    errors: list[KafkaError] = []
    admin = AdminClient(
        {**secure.client_config(user, "not-bobs-password"), "log_level": 0, "error_cb": errors.append}
    )

    def refused() -> KafkaError | None:
        admin.poll(0.1)  # serves error_cb
        return next((e for e in errors if e.code() == KafkaError._AUTHENTICATION), None)

    # Bounded: librdkafka reports the broker's refusal at once (about 0.3 s here), not after retries.
    failure = wait_for(refused, 30, interval=0, message=lambda: f"an authentication error (so far: {errors})")
    assert "Authentication failed" in failure.str() and "SCRAM-SHA-512" in failure.str(), failure.str()
    # A request fails at its own deadline; it does not hang (nor does it get through).
    began = time.monotonic()
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    assert time.monotonic() - began < 20

    right = AdminClient({**secure.client_config(user, "bob-secret-1"), **QUIET})
    assert len(right.list_topics(timeout=30).brokers) == 3


@pytest.mark.slow
def test_an_acl_that_grants_only_read_refuses_writes(secure: KafkaCluster) -> None:
    reader, topic = unique("reader"), unique("read-only")
    secure.create_topics([topic], partitions=1)
    assert not isinstance(produce(secure.admin_config(), topic, b"written by the admin"), KafkaError)
    secure.create_user(reader, "reader-secret-1")
    secure.grant(reader, ["READ"], topic=topic)
    secure.grant(reader, ["READ"], group=f"{reader}-group")

    conf = secure.client_config(reader, "reader-secret-1")
    assert consume_all(conf, topic, 1, group=f"{reader}-group") == [b"written by the admin"]
    # Not idempotent: an idempotent producer would first be refused a producer id (no WRITE anywhere).
    refused = produce(conf, topic, b"not allowed", timeout=30, idempotent=False)
    assert isinstance(refused, KafkaError), refused
    assert refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, refused
