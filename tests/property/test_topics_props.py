"""The rule a node applies to the topics it finds at start (channel/topics.py), against a reference
written from the documented contract (docs/operations.md "Kafka topics"): a topic is usable exactly when
its cleanup policy contains ``compact`` iff it is meant to be compacted, and -- for the channel and the
snapshot topic -- its partition count is the one trimtab needs. Every problem names the topic."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trimtab.channel.topics import FoundTopic, TopicSpec, policies, topic_problems
from trimtab.cluster.topics import topic_specs
from trimtab.config.settings import KafkaSettings

POLICY_WORDS = st.sampled_from(["compact", "delete", "Compact", " delete", "compact "])
POLICY = st.lists(POLICY_WORDS, min_size=1, max_size=3).map(",".join)

specs = st.builds(
    TopicSpec,
    name=st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True),
    partitions=st.integers(1, 64),
    compacted=st.booleans(),
    exact_partitions=st.booleans(),
)
found_config = st.one_of(st.none(), st.fixed_dictionaries({}, optional={"cleanup.policy": POLICY}))


@given(spec=specs, partitions=st.integers(1, 64), config=found_config)
def test_a_topic_is_usable_exactly_when_its_policy_and_partitions_fit(
    spec: TopicSpec, partitions: int, config: dict[str, str] | None
) -> None:
    found = FoundTopic(spec.name, partitions, config)
    problems = topic_problems(spec, found)
    compacted = None if config is None else "compact" in policies(config)
    policy_ok = compacted is None or compacted == spec.compacted
    partitions_ok = not spec.exact_partitions or partitions == spec.partitions
    assert (problems == []) == (policy_ok and partitions_ok)
    assert len(problems) == (not policy_ok) + (not partitions_ok)
    for p in problems:
        assert spec.name in p and "\n" not in p


@given(raw=POLICY)
def test_policies_ignore_case_order_and_spaces(raw: str) -> None:
    words = {w.strip().lower() for w in raw.split(",")}
    assert policies({"cleanup.policy": raw}) == words
    assert policies({}) == {"delete"}  # Kafka's default


def test_the_specs_say_what_the_protocol_needs() -> None:
    k = KafkaSettings(replication_factor=3)
    by = {s.name: s for s in topic_specs(k)}
    channel, snap = by[k.channel_topic], by[k.snapshot_topic]
    assert not channel.compacted and channel.exact_partitions and channel.partitions == k.channel_partitions
    assert channel.topic_config()["cleanup.policy"] == "delete"
    assert channel.topic_config()["retention.ms"] == str(k.channel_retention_ms)
    assert snap.compacted and snap.exact_partitions and snap.partitions == 1
    for name in (k.snapshot_topic, k.broker_load_topic, k.top_bundles_topic, k.standby_topic):
        c = by[name].topic_config()
        assert c["cleanup.policy"] == "compact"
        assert c["segment.ms"] == str(k.compacted_segment_ms)
        assert c["delete.retention.ms"] == str(k.delete_retention_ms)
        assert c["min.cleanable.dirty.ratio"] == str(k.min_cleanable_dirty_ratio)
    assert all(s.topic_config()["min.insync.replicas"] == "2" for s in by.values())
    assert all("min.insync.replicas" not in s.topic_config() for s in topic_specs(KafkaSettings()))
    assert all(
        s.topic_config()["min.insync.replicas"] == "1"
        for s in topic_specs(KafkaSettings(replication_factor=3, min_insync_replicas=1))
    )
