"""Topic names for tests that need a lookup to land on one given bundle."""

from __future__ import annotations

import itertools

from trimtab.channel.bundles import parse_bundle, topic_hash


def topic_in(bundle: str, prefix: str = "probe") -> str:
    """A topic name whose hash falls in ``bundle`` (so a lookup of it assigns exactly that bundle)."""
    ns, rng = parse_bundle(bundle)
    for i in itertools.count():
        topic = f"persistent://{ns}/{prefix}-{i}"
        if rng.contains(topic_hash(topic)):
            return topic
    raise AssertionError("unreachable")
