"""The chaos suite's clients (devkit/chaos/runner.py): the clients of a bundle without an owner look it up
first, as real clients do when the unload of their bundle closed their connection. Found by the second
long run: 905 bundles their owners had let go waited for a single round-robin over 20 000 topics (ten
minutes) and were counted as lost."""

from __future__ import annotations

from typing import Any

from trimtab.channel.bundles import BundleLayout, TopicName
from trimtab.devkit.chaos.runner import LookupClient


def test_a_bundle_without_an_owner_is_looked_up_first_through_one_of_its_topics() -> None:
    layout = BundleLayout.default("chaos/ns-0", 16)
    topics = [f"persistent://chaos/ns-0/t-{i}" for i in range(400)]
    records: dict[str, Any] = {b: {"state": "owned", "dst": "a:1"} for b in layout.bundles}
    free = layout.bundles[5]
    records[free] = {"state": "free", "dst": None}
    client = LookupClient(None, topics, ownership=lambda: records)  # type: ignore[arg-type]
    urgent = client._unowned()
    assert len(urgent) == 1 and layout.bundle_for_topic(TopicName.parse(urgent[0])) == free
    assert client.topic_for("chaos/ns-9/0x00000000_0xffffffff") is None  # none of ours there
    assert client.topic_for("not a bundle") is None


def test_a_failing_ownership_view_leaves_the_round_robin_alone() -> None:
    def broken() -> dict[str, Any]:
        raise OSError("the leader is partitioned")

    client = LookupClient(None, ["persistent://chaos/ns-0/t-1"], ownership=broken)  # type: ignore[arg-type]
    assert client._unowned() == []
