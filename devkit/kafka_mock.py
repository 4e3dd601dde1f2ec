"""The librdkafka mock cluster: a Kafka-protocol broker on loopback, for the local cluster, the tests and
the benchmarks (no Kafka distribution can be installed on the development machines).

What it does not do, and trimtab never relies on: compaction, topic creation through the admin API (it
auto-creates every topic a metadata request names, with four partitions), waking a waiting fetch when data
arrives. It keeps about 5 MiB of batches per partition and silently deletes older ones -- real retention,
which the history-gap tests use.
"""

from __future__ import annotations

from confluent_kafka import Producer


class MockCluster:
    """Owns a librdkafka mock cluster for as long as this object lives (dev cluster, tests, benches).

    Other processes connect to :attr:`bootstrap_servers` like to any Kafka cluster.
    """

    def __init__(self, brokers: int = 1) -> None:
        self._owner = Producer(
            {"test.mock.num.brokers": brokers, "bootstrap.servers": "mock", "log_level": 0}
        )
        md = self._owner.list_topics(timeout=10)
        self.bootstrap_servers = ",".join(f"{b.host}:{b.port}" for b in md.brokers.values())

    def create_topics(self, topics: list[str]) -> None:
        """Metadata requests auto-create topics on the mock; do it up front so readers find them."""
        for t in topics:
            self._owner.list_topics(t, timeout=10)

    def close(self) -> None:
        self._owner.flush(1.0)
        del self._owner
