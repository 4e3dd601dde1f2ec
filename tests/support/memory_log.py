"""The in-memory channel log the in-process tests run a cluster on, instead of Kafka."""

from __future__ import annotations

from trimtab.channel.memory import MemoryLog
from trimtab.config.settings import Settings


def memory_log(s: Settings) -> MemoryLog:
    """An empty log with the snapshot topic created as the Kafka transport creates it: one partition
    (the snapshot topic must have exactly one)."""
    log = MemoryLog()
    log.create(s.kafka.snapshot_topic, 1)
    return log
