"""A librdkafka mock cluster in a process of its own (``python -m trimtab.devkit.bench.mock_process
TOPIC...``): prints its bootstrap servers, then lives until its stdin is closed. The benchmarking process
then connects to it like any Kafka client, instead of sharing its interpreter with the broker.

Only ``bench channel`` still uses it (its figures were measured on the mock; moving them to real Kafka is
open work), not for any fault the mock can inject."""

from __future__ import annotations

import sys

from trimtab.devkit.kafka_mock import MockCluster


def main(topics: list[str]) -> None:
    cluster = MockCluster()
    cluster.create_topics(topics)
    print(cluster.bootstrap_servers, flush=True)
    sys.stdin.read()
    cluster.close()


if __name__ == "__main__":
    main(sys.argv[1:])
