"""trimtab's topics on a real Kafka (cluster/topics.py): made as the specs say, and refused at start -- with
one line naming the topic, the setting and the fix -- when an operator made them in a form trimtab cannot
rely on. A daemon given such a topic exits before it reports ready."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType  # type: ignore[attr-defined]

from trimtab.cluster.topics import prepare_topics, topic_specs
from trimtab.cluster.wiring import ensure_topics
from trimtab.config.settings import KafkaSettings, Settings
from trimtab.devkit.kafka_server import KafkaCluster
from trimtab.errors import TopicError, TransportError

pytestmark = pytest.mark.integration

TRIMTAB = [sys.executable, "-m", "trimtab.cli"]


def _kafka(cluster: KafkaCluster, **kw: object) -> KafkaSettings:
    p = f"tp-{uuid.uuid4().hex[:8]}"
    return KafkaSettings(
        bootstrap_servers=cluster.bootstrap_servers,
        channel_topic=f"{p}-channel",
        snapshot_topic=f"{p}-snapshot",
        broker_load_topic=f"{p}-load",
        top_bundles_topic=f"{p}-top",
        standby_topic=f"{p}-standbys",
        events_topic=f"{p}-events",
        **kw,  # type: ignore[arg-type]
    )


def _configs(cluster: KafkaCluster, names: list[str]) -> dict[str, dict[str, str]]:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    fs = admin.describe_configs([ConfigResource(ResourceType.TOPIC, n) for n in names])
    return {r.name: {k: v.value for k, v in f.result(10).items()} for r, f in fs.items()}


def test_missing_topics_are_created_as_the_specs_say(kafka_cluster: KafkaCluster) -> None:
    k = _kafka(kafka_cluster, compacted_segment_ms=600_000, delete_retention_ms=120_000)
    specs = topic_specs(k)
    found = prepare_topics({"bootstrap.servers": k.bootstrap_servers}, specs)
    assert {s.name: found[s.name].partitions for s in specs} == {s.name: s.partitions for s in specs}
    configs = _configs(kafka_cluster, [s.name for s in specs])
    for s in specs:
        for key, value in s.topic_config().items():
            assert configs[s.name][key] == value, (s.name, key)
    # Idempotent: a second node starting finds them and accepts them.
    assert (
        prepare_topics({"bootstrap.servers": k.bootstrap_servers}, specs, create=False).keys() == found.keys()
    )


@pytest.mark.parametrize(
    ("which", "made", "says"),
    [
        (
            "channel",
            {"partitions": 4, "config": {"cleanup.policy": "compact,delete"}},
            "must never be compacted",
        ),
        ("load", {"partitions": 4, "config": {"cleanup.policy": "delete"}}, "must be compacted"),
        ("snapshot", {"partitions": 3, "config": {"cleanup.policy": "compact"}}, "must have exactly 1"),
        (
            "channel",
            {"partitions": 2, "config": {"cleanup.policy": "delete"}},
            "kafka.channel_partitions = 2",
        ),
    ],
)
def test_a_topic_trimtab_cannot_rely_on_is_refused_with_the_fix(
    kafka_cluster: KafkaCluster, which: str, made: dict[str, object], says: str
) -> None:
    k = _kafka(kafka_cluster)
    name = {"channel": k.channel_topic, "load": k.broker_load_topic, "snapshot": k.snapshot_topic}[which]
    kafka_cluster.create_topics([name], **made)  # type: ignore[arg-type]
    with pytest.raises(TopicError) as e:
        prepare_topics({"bootstrap.servers": k.bootstrap_servers}, topic_specs(k))
    msg = str(e.value)
    assert name in msg and says in msg and "\n" not in msg
    # The other topics were created regardless: what is wrong is one topic, named.
    assert msg.count("topic ") == 1


def test_without_creating_a_missing_topic_is_named(kafka_cluster: KafkaCluster) -> None:
    k = _kafka(kafka_cluster)
    with pytest.raises(TopicError, match=f"topic {k.channel_topic} .kafka.channel_topic. does not exist"):
        prepare_topics({"bootstrap.servers": k.bootstrap_servers}, topic_specs(k), create=False)


def test_an_unreachable_kafka_is_a_clear_error_not_a_hang() -> None:
    s = Settings(kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9"))  # nothing listens on port 9
    t0 = time.monotonic()
    # librdkafka's last word is "Connection refused" or, once it has tried every broker, "1/1 brokers are
    # down" (which one depends on timing): either names the cause, and neither is a hang.
    cause = r"(refused|brokers are down)"
    with pytest.raises(TransportError, match=rf"Kafka at 127.0.0.1:9 did not answer within 10s: .*{cause}"):
        ensure_topics(s, "test", create=False)
    assert time.monotonic() - t0 < 15


def test_a_daemon_with_a_compacted_channel_exits_before_ready(
    kafka_cluster: KafkaCluster, zk_hosts: str, tmp_path: Path
) -> None:
    k = _kafka(kafka_cluster)
    kafka_cluster.create_topics([k.channel_topic], config={"cleanup.policy": "compact"})
    t0 = time.monotonic()
    out = _trimtab(
        "controller",
        "--zookeeper",
        zk_hosts,
        "--kafka",
        k.bootstrap_servers,
        "--http-port",
        "0",
        "--set=security.auth=disabled",
        *_topic_sets(k),
        cwd=tmp_path,
    )
    assert out.returncode == 1, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("controller failed: topic ") and "must never be compacted" in last, last
    assert time.monotonic() - t0 < 30


def _trimtab(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TRIMTAB, *args], capture_output=True, text=True, timeout=60, check=False, cwd=cwd)


def _topic_sets(k: KafkaSettings) -> list[str]:
    fields = ("channel_topic", "snapshot_topic", "broker_load_topic", "top_bundles_topic", "standby_topic")
    return [f"--set=kafka.{f}={getattr(k, f)}" for f in (*fields, "events_topic")]


def test_topics_ensure_makes_and_check_accepts_them(kafka_cluster: KafkaCluster) -> None:
    k = _kafka(kafka_cluster)
    sets = _topic_sets(k)
    check = _trimtab("topics", "check", "--kafka", k.bootstrap_servers, *sets)
    assert check.returncode == 1 and "does not exist" in check.stderr
    ensure = _trimtab("topics", "ensure", "--kafka", k.bootstrap_servers, *sets)
    assert ensure.returncode == 0, ensure.stderr
    assert f"{k.channel_topic}: ok" in ensure.stdout
    again = _trimtab("topics", "check", "--kafka", k.bootstrap_servers, *sets)
    assert again.returncode == 0, again.stderr
