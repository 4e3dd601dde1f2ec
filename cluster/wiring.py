"""Building the shared clients from settings, the same way in every daemon (and in the tools)."""

from __future__ import annotations

from trimtab.channel.kafka import KafkaTransport
from trimtab.cluster.zk import ZkSession
from trimtab.config.settings import Settings


def kafka_transport(s: Settings, client_id: str) -> KafkaTransport:
    """The Kafka transport every trimtab process uses: compacted topics created compacted, the channel
    with its configured partition count and the snapshot topic with one, channel readers tuned by
    ``kafka.fetch_wait_max_ms``."""
    k = s.kafka
    return KafkaTransport(
        k.bootstrap_servers,
        client_config=k.client_config,
        client_id=client_id,
        linger_ms=k.linger_ms,
        fetch_wait_max_ms=k.fetch_wait_max_ms,
        compacted_topics=frozenset(
            {k.snapshot_topic, k.broker_load_topic, k.top_bundles_topic, k.standby_topic}
        ),
        # The snapshot topic must have exactly one partition (channel.snapshot.check_snapshot_topic).
        topic_partitions={k.channel_topic: k.channel_partitions, k.snapshot_topic: 1},
        replication_factor=k.replication_factor,
    )


def zk_session(s: Settings) -> ZkSession:
    z = s.zookeeper
    return ZkSession(z.hosts, session_timeout_s=z.session_timeout_s, connect_timeout_s=z.connect_timeout_s)
