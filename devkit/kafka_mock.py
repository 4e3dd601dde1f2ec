"""The librdkafka mock cluster: a Kafka-protocol broker on loopback, for the local cluster, the tests and
the benchmarks (no Kafka distribution can be installed on the development machines).

What it does not do, and trimtab never relies on: compaction, topic creation through the admin API (it
auto-creates every topic a metadata request names, with four partitions), waking a waiting fetch when data
arrives. It keeps about 5 MiB of batches per partition and silently deletes older ones -- real retention,
which the history-gap tests use.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from confluent_kafka import Producer

from trimtab.devkit.procs import die_with_parent_hook, open_log
from trimtab.errors import DevKitError


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


class MockClusterProcess:
    """A librdkafka mock cluster in a process of its own (``python -m trimtab.devkit.kafka_mock``), so that
    the chaos suite can pause "the Kafka cluster" (SIGSTOP) without pausing itself. It dies with its parent.
    """

    def __init__(self, python: str, log: Path) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open_log(log) as err:
            self.proc = subprocess.Popen(
                [python, "-m", "trimtab.devkit.kafka_mock"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent_hook(),  # noqa: PLW1509
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode().strip()
        if not line:
            self.close()
            raise DevKitError(f"the mock Kafka process did not start (see {log})")
        self.bootstrap_servers = line
        self._admin = Producer({"bootstrap.servers": line, "log_level": 0})

    @property
    def pid(self) -> int:
        return self.proc.pid

    def create_topics(self, topics: list[str]) -> None:
        for t in topics:
            self._admin.list_topics(t, timeout=10)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGCONT)  # a paused cluster cannot exit
            self.proc.kill()
        self.proc.wait(10)


def main() -> None:
    """Run a mock cluster until stdin closes (the parent went away); print its bootstrap servers first."""
    cluster = MockCluster()
    sys.stdout.write(cluster.bootstrap_servers + "\n")
    sys.stdout.flush()
    sys.stdin.read()
    cluster.close()


if __name__ == "__main__":
    main()
