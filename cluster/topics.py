"""The Kafka topics trimtab uses and how each must be made: one source of truth for the transport that
creates them on first use, ``trimtab topics ensure`` (what docker-compose's kafka-init and a Kubernetes Job
run), the dev kit's clusters and the deployment docs (docs/protocol.md, docs/operations.md).

The channel is never compacted (every transition is history a node replays; the leader's snapshots make
replay short), the snapshot topic is compacted with exactly one partition (a snapshot is a manifest plus
chunks a reader takes in order), and the latest-value views -- broker load, top bundles, standbys -- are
compacted: only each key's newest value matters, and a dead broker's tombstone must eventually remove it.

:func:`prepare_topics` is what every daemon runs at start, before it reports ready: it creates what is
missing (where the principal may) and refuses, with one line per topic naming the setting and the fix, a
topic it cannot rely on (:func:`trimtab.channel.topics.topic_problems`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from trimtab.channel.topics import DEFAULT_PARTITIONS, FoundTopic, TopicSpec, topic_problems
from trimtab.config.settings import KafkaSettings
from trimtab.errors import TopicError, TransportError

log = structlog.get_logger("trimtab.topics")

__all__ = ["DEFAULT_PARTITIONS", "TopicSpec", "prepare_topics", "topic_specs"]

#: How long one admin request may take before start-up says Kafka did not answer.
ADMIN_TIMEOUT_S = 10.0

# Creation refused because this principal or the cluster's policy forbids it: check, do not fail yet.
_NOT_ALLOWED = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.POLICY_VIOLATION,
    }
)


def min_insync_replicas(k: KafkaSettings) -> int | None:
    if k.min_insync_replicas is not None:
        return k.min_insync_replicas
    return 2 if k.replication_factor >= 3 else None


def topic_specs(k: KafkaSettings) -> list[TopicSpec]:
    """Every topic ``k`` names, as trimtab needs it, with the documented settings (docs/operations.md)."""
    common: dict[str, str] = {}
    isr = min_insync_replicas(k)
    if isr is not None:
        common["min.insync.replicas"] = str(isr)
    compacted = {
        **common,
        "segment.ms": str(k.compacted_segment_ms),
        "min.cleanable.dirty.ratio": str(k.min_cleanable_dirty_ratio),
        "delete.retention.ms": str(k.delete_retention_ms),
    }
    return [
        TopicSpec(
            k.channel_topic,
            k.channel_partitions,
            compacted=False,
            config={**common, "retention.ms": str(k.channel_retention_ms)},
            exact_partitions=True,
            setting="kafka.channel_topic",
        ),
        TopicSpec(
            k.snapshot_topic,
            1,
            compacted=True,
            config=compacted,
            exact_partitions=True,
            setting="kafka.snapshot_topic",
        ),
        TopicSpec(
            k.broker_load_topic, DEFAULT_PARTITIONS, True, compacted, setting="kafka.broker_load_topic"
        ),
        TopicSpec(
            k.top_bundles_topic, DEFAULT_PARTITIONS, True, compacted, setting="kafka.top_bundles_topic"
        ),
        TopicSpec(k.standby_topic, DEFAULT_PARTITIONS, True, compacted, setting="kafka.standby_topic"),
        TopicSpec(
            k.events_topic,
            DEFAULT_PARTITIONS,
            compacted=False,
            config={**common, "retention.ms": str(30 * 86_400_000)},
            setting="kafka.events_topic",
        ),
    ]


def _code(e: BaseException) -> int | None:
    err = e.args[0] if e.args else None
    return err.code() if isinstance(err, KafkaError) else None


class _Errors:
    """The client errors librdkafka reports while a request waits (an authentication failure, a refused
    connection): what start-up names when Kafka does not answer, instead of a bare timeout."""

    def __init__(self) -> None:
        self.last: str | None = None
        self.code: int | None = None

    def __call__(self, err: KafkaError) -> None:
        self.last, self.code = err.str(), err.code()


def _metadata(admin: Any, errors: _Errors, where: str) -> Any:
    """The cluster's metadata, asked for in short rounds: a refused authentication is final at once (no
    retry can fix a password), anything else is retried until :data:`ADMIN_TIMEOUT_S`."""
    deadline = time.monotonic() + ADMIN_TIMEOUT_S
    while True:
        try:
            return admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
        except KafkaException as e:
            admin.poll(0)  # serve the error callbacks queued meanwhile: the reason, where there is one
            why = errors.last or str(e)
            if errors.code == KafkaError._AUTHENTICATION:
                raise TransportError(f"Kafka at {where} refused this node's credentials: {why}") from None
            if time.monotonic() >= deadline:
                raise TransportError(
                    f"Kafka at {where} did not answer within {ADMIN_TIMEOUT_S:g}s: {why}"
                ) from None


def describe(admin: Any, names: Iterable[str], errors: _Errors, where: str) -> dict[str, FoundTopic]:
    """The named topics that exist, with their partition counts and configurations (None where the
    configuration could not be read)."""
    md = _metadata(admin, errors, where)
    found: dict[str, FoundTopic] = {}
    for name in names:
        t = md.topics.get(name)
        if t is not None and t.error is None and t.partitions:
            found[name] = FoundTopic(name, len(t.partitions))
    if not found:
        return found
    futures = admin.describe_configs(
        [ConfigResource(ResourceType.TOPIC, n) for n in found], request_timeout=ADMIN_TIMEOUT_S
    )
    for resource, fut in futures.items():
        try:
            entries = fut.result(timeout=ADMIN_TIMEOUT_S + 1)
        except Exception as e:  # not allowed to describe: the partition rules still apply
            log.warning("topic_config_unreadable", topic=resource.name, error=str(e))
            continue
        config = {k: v.value for k, v in entries.items() if v.value is not None}
        found[resource.name] = FoundTopic(resource.name, found[resource.name].partitions, config)
    return found


def prepare_topics(
    client_config: dict[str, Any], specs: Sequence[TopicSpec], *, create: bool = True, replication: int = -1
) -> dict[str, FoundTopic]:
    """Create the missing topics of ``specs`` (when ``create`` and the principal may), then check every one:
    a :class:`TopicError` names every problem, joined by "; " into the one line a daemon exits with. Kafka
    not answering is a :class:`TransportError` naming the servers and librdkafka's last error (an
    authentication failure says so). Returns what was found."""
    errors = _Errors()
    config: dict[str, Any] = {**client_config, "error_cb": errors}
    admin = AdminClient(config)
    where = str(client_config.get("bootstrap.servers", "?"))
    found = describe(admin, [s.name for s in specs], errors, where)
    missing = [s for s in specs if s.name not in found]
    problems: list[str] = []
    if missing and create:
        made: set[str] = set()
        new = [NewTopic(s.name, s.partitions, replication, config=s.topic_config()) for s in missing]
        for name, fut in admin.create_topics(new, request_timeout=ADMIN_TIMEOUT_S).items():
            try:
                fut.result(timeout=ADMIN_TIMEOUT_S + 1)
                log.info("topic_created", topic=name)
            except KafkaException as e:
                if _code(e) != KafkaError.TOPIC_ALREADY_EXISTS and _code(e) not in _NOT_ALLOWED:
                    raise TransportError(f"cannot create topic {name} on {where}: {e}") from None
                if _code(e) in _NOT_ALLOWED:
                    log.warning("topic_create_refused", topic=name, error=str(e))
                    continue
            made.add(name)  # by us, or by another node first: both are checked below
        # A topic just created reaches every broker's metadata a moment later: wait for it (bounded).
        deadline = time.monotonic() + ADMIN_TIMEOUT_S
        found = describe(admin, [s.name for s in specs], errors, where)
        while not made <= found.keys() and time.monotonic() < deadline:
            time.sleep(0.1)  # metadata propagation has no event to wait on
            found = describe(admin, [s.name for s in specs], errors, where)
    for s in specs:
        f = found.get(s.name)
        if f is None:
            problems.append(
                f"topic {s.name} ({s.setting}) does not exist and was not created: create it with "
                "`trimtab topics ensure` as a principal allowed to (docs/operations.md)"
            )
        else:
            problems.extend(topic_problems(s, f))
    if problems:
        raise TopicError("; ".join(problems))
    return found
