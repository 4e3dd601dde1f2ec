"""The topic rules one at a time (channel/topics.py; docs/testing.md: mutation testing).

Every test names the rule it pins: how a topic is created (its cleanup policy from ``compacted``, the
documented settings beside it), how a found topic's cleanup policy is read (Kafka's default ``delete``, a
list in any case, order and spacing), and when a found topic is refused -- a partition count other than the
one trimtab needs, only where it needs one, at equality accepted; a policy with or without ``compact``
against what the topic must be; no policy check when the configuration could not be read -- each with the
exact sentence an operator reads.
"""

from __future__ import annotations

from trimtab.channel.topics import DEFAULT_PARTITIONS, FoundTopic, TopicSpec, policies, topic_problems

CHANNEL = TopicSpec("tt.channel", 16, False, {"retention.ms": "-1"}, exact_partitions=True)
SNAPSHOT = TopicSpec("tt.snap", 1, True, exact_partitions=True)
LOADS = TopicSpec("tt.loads", DEFAULT_PARTITIONS, True)
EVENTS = TopicSpec("tt.events", DEFAULT_PARTITIONS, False)


def must_be_compacted(name: str, shown: str) -> str:
    return (
        f"topic {name} has cleanup.policy={shown}; it must be compacted (only each key's newest value "
        "matters, and a dead broker's tombstone must remove it): kafka-configs.sh --alter --entity-type "
        f"topics --entity-name {name} --add-config cleanup.policy=compact"
    )


def must_not_be_compacted(name: str, shown: str) -> str:
    return (
        f"topic {name} has cleanup.policy={shown}; it must never be compacted (compaction keeps only a "
        "key's last record and drops history every node replays): kafka-configs.sh --alter --entity-type "
        f"topics --entity-name {name} --add-config cleanup.policy=delete"
    )


def test_a_topic_is_created_with_the_policy_it_needs_and_its_documented_settings() -> None:
    """Rule: ``topic_config`` is ``cleanup.policy`` = ``compact`` for a compacted topic and ``delete``
    otherwise, plus the spec's own settings."""
    assert CHANNEL.topic_config() == {"cleanup.policy": "delete", "retention.ms": "-1"}
    assert SNAPSHOT.topic_config() == {"cleanup.policy": "compact"}
    assert EVENTS.topic_config() == {"cleanup.policy": "delete"}
    spec = TopicSpec("t", 4, True, {"min.compaction.lag.ms": "0"})
    assert spec.topic_config() == {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}
    assert spec.exact_partitions is False and spec.setting == ""


def test_a_topic_without_a_cleanup_policy_has_kafka_s_default_delete() -> None:
    """Rule: a configuration without ``cleanup.policy`` reads as Kafka's default, ``delete``."""
    assert policies({}) == frozenset({"delete"})
    assert policies({"retention.ms": "1"}) == frozenset({"delete"})


def test_a_cleanup_policy_is_a_list_in_any_case_order_and_spacing() -> None:
    """Rule: ``cleanup.policy`` is a comma-separated list: each item stripped and lower-cased, empty items
    dropped (an empty policy is no policy at all, not ``delete``)."""
    assert policies({"cleanup.policy": "compact"}) == frozenset({"compact"})
    assert policies({"cleanup.policy": " Delete , COMPACT "}) == frozenset({"compact", "delete"})
    assert policies({"cleanup.policy": "compact,delete"}) == frozenset({"compact", "delete"})
    assert policies({"cleanup.policy": ",compact,, ,"}) == frozenset({"compact"})
    assert policies({"cleanup.policy": ""}) == frozenset()
    assert policies({"cleanup.policy": " , "}) == frozenset()


def test_a_topic_that_fits_has_no_problem() -> None:
    """Rule: the partition count the spec needs, exactly, and a policy with ``compact`` iff the topic is
    compacted: no problem (empty list)."""
    assert topic_problems(CHANNEL, FoundTopic("tt.channel", 16, {"cleanup.policy": "delete"})) == []
    assert topic_problems(SNAPSHOT, FoundTopic("tt.snap", 1, {"cleanup.policy": "compact,delete"})) == []
    assert topic_problems(LOADS, FoundTopic("tt.loads", 12, {"cleanup.policy": "Compact"})) == []
    assert topic_problems(EVENTS, FoundTopic("tt.events", 1, {})) == []


def test_the_channel_with_another_partition_count_is_refused() -> None:
    """Rule: a topic whose partition count is the bundle map (exact, more than 1) is refused with another
    count, more or fewer, and the sentence says which count to set."""
    for found in (15, 17, 1):
        assert topic_problems(CHANNEL, FoundTopic("tt.channel", found)) == [
            f"topic tt.channel has {found} partitions but kafka.channel_partitions is 16: set "
            f"kafka.channel_partitions = {found} (a channel's partition count never changes)"
        ]
    two = TopicSpec("tt.c2", 2, False, exact_partitions=True)
    assert topic_problems(two, FoundTopic("tt.c2", 1)) == [
        "topic tt.c2 has 1 partitions but kafka.channel_partitions is 2: set kafka.channel_partitions = 1 "
        "(a channel's partition count never changes)"
    ]


def test_a_one_partition_topic_with_more_is_refused() -> None:
    """Rule: a topic that must have exactly one partition (the snapshot topic) is refused with any other
    count, and the sentence says to recreate it."""
    for found in (2, 4):
        assert topic_problems(SNAPSHOT, FoundTopic("tt.snap", found, {"cleanup.policy": "compact"})) == [
            f"topic tt.snap has {found} partitions; it must have exactly 1 (delete it and create it with one "
            "partition and cleanup.policy=compact: trimtab topics ensure)"
        ]


def test_a_topic_whose_count_trimtab_does_not_choose_may_have_any() -> None:
    """Rule: without ``exact_partitions`` the partition count is never a problem, whatever it is."""
    for found in (1, DEFAULT_PARTITIONS + 1, 64):
        assert topic_problems(LOADS, FoundTopic("tt.loads", found, {"cleanup.policy": "compact"})) == []
        assert topic_problems(EVENTS, FoundTopic("tt.events", found)) == []


def test_a_latest_value_topic_without_compaction_is_refused() -> None:
    """Rule: a topic that must be compacted is refused when its policy lacks ``compact`` -- also without
    any policy (Kafka's default ``delete``) -- and the sentence shows the policy as found."""
    assert topic_problems(LOADS, FoundTopic("tt.loads", 4, {"cleanup.policy": "Delete"})) == [
        must_be_compacted("tt.loads", "Delete")
    ]
    assert topic_problems(LOADS, FoundTopic("tt.loads", 4, {})) == [must_be_compacted("tt.loads", "delete")]


def test_a_channel_with_compaction_is_refused() -> None:
    """Rule: a topic that must never be compacted is refused when its policy has ``compact`` at all (also
    ``delete,compact``), and the sentence shows the policy as found."""
    for shown in ("compact", "delete, Compact"):
        assert topic_problems(CHANNEL, FoundTopic("tt.channel", 16, {"cleanup.policy": shown})) == [
            must_not_be_compacted("tt.channel", shown)
        ]
    assert topic_problems(EVENTS, FoundTopic("tt.events", 4, {"cleanup.policy": "compact"})) == [
        must_not_be_compacted("tt.events", "compact")
    ]


def test_an_unreadable_configuration_is_not_checked() -> None:
    """Rule: when the configuration could not be read (None), only the partition count is checked."""
    assert topic_problems(LOADS, FoundTopic("tt.loads", 4)) == []
    assert topic_problems(CHANNEL, FoundTopic("tt.channel", 16)) == []


def test_both_problems_are_reported_partitions_first() -> None:
    """Rule: a topic wrong in both ways gets both sentences, the partition count's first."""
    assert topic_problems(SNAPSHOT, FoundTopic("tt.snap", 3, {"cleanup.policy": "delete"})) == [
        "topic tt.snap has 3 partitions; it must have exactly 1 (delete it and create it with one partition "
        "and cleanup.policy=compact: trimtab topics ensure)",
        must_be_compacted("tt.snap", "delete"),
    ]
