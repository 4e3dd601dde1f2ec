"""Per-test Kafka environment on the session's real Kafka (one KRaft node, ``trimtab.devkit.kafka_server``).

Every test gets its own topic names (a unique prefix), so tests never see each other's records even
though they share one cluster. The channel topic has four partitions, the snapshot topic one and is
compacted, as trimtab creates them (cluster/topics.py); other topics are created with four partitions.
The log cleaner does not run within a test's lifetime here (segments are large): tests of compaction make
their own topics with small segments.
"""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from trimtab.channel.kafka import KafkaTransport
from trimtab.channel.snapshot import read_all
from trimtab.channel.transport import Message
from trimtab.devkit.kafka_server import KafkaCluster

MOCK_PARTITIONS = 4  # the partitions of every topic a test makes (what the librdkafka mock gave every topic)


@dataclass
class KafkaEnv:
    """What the ``kafka`` fixture hands a test: a transport, unique topic names, more on demand."""

    cluster: KafkaCluster
    transport: KafkaTransport
    prefix: str
    channel_topic: str
    snapshot_topic: str
    _transports: list[KafkaTransport] = field(default_factory=list)

    @property
    def bootstrap_servers(self) -> str:
        return self.cluster.bootstrap_servers

    def topic(self, name: str) -> str:
        """A topic name unique to this test (created right away, four partitions)."""
        topic = f"{self.prefix}-{name}"
        self.cluster.create_topics([topic])
        return topic

    def new_transport(self, **kwargs: Any) -> KafkaTransport:
        """Another transport (its own producer and consumers, like another node); closed at teardown."""
        t = KafkaTransport(self.bootstrap_servers, **kwargs)
        self._transports.append(t)
        return t

    def dump_args(self, *extra: str) -> list[str]:
        """``trimtab channel dump`` arguments for this test's channel and snapshot topics."""
        return [
            "channel",
            "dump",
            "--bootstrap-servers",
            self.bootstrap_servers,
            "--topic",
            self.channel_topic,
            "--set",
            f"kafka.snapshot_topic={self.snapshot_topic}",
            "--timeout",
            "30",
            *extra,
        ]

    def read_all(self, topic: str, timeout: float = 30.0) -> list[Message]:
        """Every message of ``topic`` up to the current high watermarks."""
        return list(read_all(self.transport, topic, timeout))

    def close(self) -> None:
        for t in self._transports:
            t.close()
        self.transport.close()


def make_env(cluster: KafkaCluster, test_name: str) -> KafkaEnv:
    slug = "".join(ch if ch.isalnum() else "-" for ch in test_name)[:40].strip("-")
    prefix = f"t-{slug}-{uuid.uuid4().hex[:8]}"
    channel_topic, snapshot_topic = f"{prefix}-channel", f"{prefix}-snapshot"
    cluster.create_topics([channel_topic], partitions=MOCK_PARTITIONS)
    cluster.create_topics([snapshot_topic], partitions=1, config={"cleanup.policy": "compact"})
    transport = KafkaTransport(cluster.bootstrap_servers, client_id=f"test-{slug}")
    return KafkaEnv(cluster, transport, prefix, channel_topic, snapshot_topic)


def keys_per_partition(prefix: str, partitions: int = MOCK_PARTITIONS) -> list[bytes]:
    """One key for each partition (``crc32(key) % partitions == index``), e.g. for end-of-log sentinels."""
    found: dict[int, bytes] = {}
    i = 0
    while len(found) < partitions:
        key = f"{prefix}{i}".encode()
        found.setdefault(zlib.crc32(key) % partitions, key)
        i += 1
    return [found[p] for p in range(partitions)]


def by_partition(messages: list[Message]) -> Iterator[tuple[int, list[Message]]]:
    parts: dict[int, list[Message]] = {}
    for m in messages:
        parts.setdefault(m.partition, []).append(m)
    yield from sorted(parts.items())
