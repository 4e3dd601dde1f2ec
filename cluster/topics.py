"""The Kafka topics trimtab uses and how each must be made: one source of truth for the transport that
creates them on first use, the dev kit's clusters and the deployment docs (docs/protocol.md).

The channel is never compacted (every transition is history a node replays; the leader's snapshots make
replay short), the snapshot topic is compacted with exactly one partition (a snapshot is a manifest plus
chunks a reader takes in order), and the latest-value views -- broker load, top bundles, standbys -- are
compacted: only each key's newest value matters, and a dead broker's tombstone must eventually remove it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trimtab.config.settings import KafkaSettings

#: Partitions of a topic whose count trimtab does not need to choose (views, events).
DEFAULT_PARTITIONS = 4


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    compacted: bool
    config: dict[str, str] = field(default_factory=dict)

    def topic_config(self) -> dict[str, str]:
        """The topic-level configuration to create it with."""
        return {"cleanup.policy": "compact" if self.compacted else "delete", **self.config}


def topic_specs(k: KafkaSettings) -> list[TopicSpec]:
    """Every topic ``k`` names, as trimtab needs it."""
    return [
        TopicSpec(k.channel_topic, k.channel_partitions, compacted=False),
        TopicSpec(k.snapshot_topic, 1, compacted=True),
        TopicSpec(k.broker_load_topic, DEFAULT_PARTITIONS, compacted=True),
        TopicSpec(k.top_bundles_topic, DEFAULT_PARTITIONS, compacted=True),
        TopicSpec(k.standby_topic, DEFAULT_PARTITIONS, compacted=True),
        TopicSpec(k.events_topic, DEFAULT_PARTITIONS, compacted=False),
    ]
