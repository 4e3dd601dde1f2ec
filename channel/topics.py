"""What a Kafka topic must be for trimtab to rely on it, and the rule that checks one that exists.

A spec says how trimtab creates a topic (partitions, cleanup policy, the documented retention and
compaction settings). Where trimtab may not create topics (an ACL, a broker policy) an operator makes them,
and a node checks at start that what it finds can be relied on: the channel must never be compacted (a
compacted channel keeps only each bundle's last record and loses the transitions every node replays), the
latest-value topics must be (or a dead broker's tombstoned report never goes), the snapshot topic has
exactly one partition, and the channel the partition count every node maps bundles with.

Pure: the Kafka calls are in :mod:`trimtab.cluster.topics`; the rule is property-tested.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

#: Partitions of a topic whose count trimtab does not need to choose (views, events).
DEFAULT_PARTITIONS = 4


@dataclass(frozen=True)
class TopicSpec:
    """A topic as trimtab needs it. ``exact_partitions``: a topic with another count is refused (the
    channel, whose count is the bundle-to-partition map, and the one-partition snapshot topic)."""

    name: str
    partitions: int
    compacted: bool
    config: Mapping[str, str] = field(default_factory=dict)
    exact_partitions: bool = False
    #: The setting that names the topic, for error messages (``kafka.channel_topic``).
    setting: str = ""

    def topic_config(self) -> dict[str, str]:
        """The topic-level configuration to create it with."""
        return {"cleanup.policy": "compact" if self.compacted else "delete", **self.config}


@dataclass(frozen=True)
class FoundTopic:
    """A topic as Kafka describes it: its partition count and (when it could be read) its configuration."""

    name: str
    partitions: int
    config: Mapping[str, str] | None = None


def policies(config: Mapping[str, str]) -> frozenset[str]:
    """The set of ``cleanup.policy`` values (Kafka accepts ``compact,delete``, in any order and spacing)."""
    raw = config.get("cleanup.policy", "delete")
    return frozenset(p.strip().lower() for p in raw.split(",") if p.strip())


def topic_problems(spec: TopicSpec, found: FoundTopic) -> list[str]:
    """Why ``found`` cannot be used as ``spec`` (empty when it can). Each problem is one sentence naming the
    topic, the setting and the fix -- what an operator reads in the start-up error."""
    out: list[str] = []
    name = spec.name
    if spec.exact_partitions and found.partitions != spec.partitions:
        if spec.partitions == 1:
            out.append(
                f"topic {name} has {found.partitions} partitions; it must have exactly 1 (delete it and "
                "create it with one partition and cleanup.policy=compact: trimtab topics ensure)"
            )
        else:
            out.append(
                f"topic {name} has {found.partitions} partitions but kafka.channel_partitions is "
                f"{spec.partitions}: set kafka.channel_partitions = {found.partitions} (a channel's "
                "partition count never changes)"
            )
    if found.config is not None:
        got = policies(found.config)
        shown = found.config.get("cleanup.policy", "delete")
        if spec.compacted and "compact" not in got:
            out.append(
                f"topic {name} has cleanup.policy={shown}; it must be compacted (only each key's newest "
                "value matters, and a dead broker's tombstone must remove it): kafka-configs.sh --alter "
                f"--entity-type topics --entity-name {name} --add-config cleanup.policy=compact"
            )
        if not spec.compacted and "compact" in got:
            out.append(
                f"topic {name} has cleanup.policy={shown}; it must never be compacted (compaction keeps "
                "only a key's last record and drops history every node replays): kafka-configs.sh --alter "
                f"--entity-type topics --entity-name {name} --add-config cleanup.policy=delete"
            )
    return out
