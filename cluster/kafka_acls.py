"""The Kafka ACLs each trimtab role needs, and nothing more: one table, which docs/security.md ("Kafka
ACLs") shows row for row (``tests/unit/test_kafka_acls.py`` checks that they agree) and which
``tests/integration/test_kafka_security.py`` grants, principal by principal, on a real Kafka cluster with the
``StandardAuthorizer`` to prove that each role works with exactly these rights.

Three roles, each its own principal:

* ``agent`` -- beside each broker: reads and writes the channel, reads the snapshot topic (bootstrap), writes
  its broker's load and top bundles, reads every broker's load and the standby advice, writes events.
* ``controller`` -- reads and writes the channel, writes (and reads back) snapshots, reads the load views,
  writes the standby advice and events.
* ``pipeline`` -- ``trimtab pipeline ingest``: reads the channel, the load views and the events; writes
  nothing.

Every consumer trimtab creates names a group (``trimtab-reader-*``, ``trimtab-meta-*``,
``trimtab-pipeline-*``) although it only ``assign()``-s partitions and never commits: librdkafka still looks
the group's coordinator up, which needs ``DESCRIBE`` on the group, and says "Group authorization failed"
otherwise. Daemons read each topic's configuration at start (``DESCRIBE_CONFIGS``) to check its cleanup
policy. No role may create topics: an operator (or a super user) creates them beforehand, as
cluster/topics.py specifies them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from confluent_kafka.admin import AclBinding  # type: ignore[attr-defined]

from trimtab.config.settings import KafkaSettings

Role = Literal["agent", "controller", "pipeline"]
ROLES: tuple[Role, ...] = ("agent", "controller", "pipeline")
ResourceKind = Literal["topic", "group"]

#: The group-id prefix of every consumer trimtab creates (channel/kafka.py, pipeline/kafka_io.py).
GROUP_PREFIX = "trimtab-"


@dataclass(frozen=True)
class KafkaAcl:
    """``role`` may do ``operations`` on a resource: a topic named by a ``kafka.*_topic`` setting, or the
    groups whose ids start with ``name`` (``prefixed``)."""

    role: Role
    resource: ResourceKind
    name: str  # a KafkaSettings field for a topic ("channel_topic"), else the resource name itself
    operations: tuple[str, ...]
    prefixed: bool = False

    def resource_name(self, k: KafkaSettings) -> str:
        """The resource's name in a cluster configured by ``k``."""
        return str(getattr(k, self.name)) if self.resource == "topic" else self.name

    def doc_name(self) -> str:
        """How docs/security.md names the resource: ``kafka.channel_topic``, or ``trimtab-*`` for a prefix."""
        if self.resource == "topic":
            return f"kafka.{self.name}"
        return f"{self.name}*" if self.prefixed else self.name


def _acl(role: Role, resource: ResourceKind, name: str, *ops: str, prefixed: bool = False) -> KafkaAcl:
    return KafkaAcl(role, resource, name, tuple(ops), prefixed)


_CHECK = "DESCRIBE_CONFIGS"  # start-up reads each topic's configuration (cluster/topics.py)


def _groups(role: Role) -> KafkaAcl:
    """Every role's consumers look their group's coordinator up (see the module docstring)."""
    return _acl(role, "group", GROUP_PREFIX, "DESCRIBE", prefixed=True)


#: Every right every role gets. READ and WRITE imply DESCRIBE (the topic's metadata); an idempotent producer
#: needs no cluster right once it may WRITE some topic (Kafka 3.0+).
KAFKA_ACLS: tuple[KafkaAcl, ...] = (
    _acl("agent", "topic", "channel_topic", "READ", "WRITE", _CHECK),
    _acl("agent", "topic", "snapshot_topic", "READ", _CHECK),
    _acl("agent", "topic", "broker_load_topic", "READ", "WRITE", _CHECK),
    _acl("agent", "topic", "top_bundles_topic", "WRITE", _CHECK),
    _acl("agent", "topic", "standby_topic", "READ", _CHECK),
    _acl("agent", "topic", "events_topic", "WRITE", _CHECK),
    _groups("agent"),
    _acl("controller", "topic", "channel_topic", "READ", "WRITE", _CHECK),
    _acl("controller", "topic", "snapshot_topic", "READ", "WRITE", _CHECK),
    _acl("controller", "topic", "broker_load_topic", "READ", _CHECK),
    _acl("controller", "topic", "top_bundles_topic", "READ", _CHECK),
    _acl("controller", "topic", "standby_topic", "READ", "WRITE", _CHECK),
    _acl("controller", "topic", "events_topic", "WRITE", _CHECK),
    _groups("controller"),
    _acl("pipeline", "topic", "channel_topic", "READ"),
    _acl("pipeline", "topic", "broker_load_topic", "READ"),
    _acl("pipeline", "topic", "top_bundles_topic", "READ"),
    _acl("pipeline", "topic", "events_topic", "READ"),
    _groups("pipeline"),
)


def acls_for(role: Role) -> list[KafkaAcl]:
    """The rows of :data:`KAFKA_ACLS` for ``role``."""
    if role not in ROLES:
        raise ValueError(f"no such role {role!r}: one of {', '.join(ROLES)}")
    return [a for a in KAFKA_ACLS if a.role == role]


def acl_bindings(role: Role, principal: str, k: KafkaSettings, *, host: str = "*") -> list[AclBinding]:
    """The ALLOW bindings that grant ``principal`` (``User:name``) exactly what ``role`` needs in a cluster
    configured by ``k`` -- what to pass to ``AdminClient.create_acls``."""
    return [
        AclBinding(
            a.resource.upper(),
            a.resource_name(k),
            "PREFIXED" if a.prefixed else "LITERAL",
            principal,
            host,
            op,
            "ALLOW",
        )
        for a in acls_for(role)
        for op in a.operations
    ]


def doc_rows(acls: Iterable[KafkaAcl] = KAFKA_ACLS) -> list[tuple[str, str, str, str]]:
    """``(role, resource, name, operations)`` as docs/security.md's table writes them (operations joined
    with ", ")."""
    return [(a.role, a.resource, a.doc_name(), ", ".join(a.operations)) for a in acls]
