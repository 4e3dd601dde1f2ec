"""The Kafka ACL table: docs/security.md ("Kafka ACLs") shows exactly :data:`KAFKA_ACLS`, and the bindings
built from it are what the table says (tests/integration/test_kafka_security.py grants them on a real cluster).
"""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AclBinding  # type: ignore[attr-defined]

from tests.support.procs import REPO_ROOT
from trimtab.cluster.kafka_acls import GROUP_PREFIX, KAFKA_ACLS, ROLES, acl_bindings, acls_for, doc_rows
from trimtab.config.settings import KafkaSettings

HEADER = "| role | resource | name | operations |"


def _name(value: object) -> str:
    """An enum member's name (AclBinding's fields are typed as enum, str or int)."""
    return str(getattr(value, "name", value))


def documented_rows() -> list[tuple[str, str, str, str]]:
    """The rows of the ACL table in docs/security.md, in order (backquotes dropped)."""
    lines = (REPO_ROOT / "docs" / "security.md").read_text().splitlines()
    assert lines.count(HEADER) == 1, "docs/security.md must hold exactly one Kafka ACL table"
    start = lines.index(HEADER) + 2  # the header, then the |---| line
    rows: list[tuple[str, str, str, str]] = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        assert len(cells) == 4, line
        rows.append((cells[0], cells[1], cells[2], cells[3]))
    return rows


def test_the_documented_table_is_the_code_table() -> None:
    assert documented_rows() == doc_rows()


def test_every_role_and_every_topic_setting_is_covered() -> None:
    k = KafkaSettings()
    for role in ROLES:
        rows = acls_for(role)
        assert rows, role
        # Every consumer names a trimtab-* group: every role may look its coordinator up.
        assert any(a.resource == "group" and a.prefixed and a.name == GROUP_PREFIX for a in rows), role
    topic_fields = {a.name for a in KAFKA_ACLS if a.resource == "topic"}
    assert all(isinstance(getattr(k, f), str) for f in topic_fields)
    assert topic_fields == {f for f in KafkaSettings.model_fields if f.endswith("_topic")}
    with pytest.raises(ValueError, match="no such role"):
        acls_for("admin")  # type: ignore[arg-type]


def test_least_privilege_where_the_docs_promise_it() -> None:
    k = KafkaSettings(snapshot_topic="snaps", channel_topic="chan")
    ops = {
        role: {(b.name, _name(b.operation)) for b in acl_bindings(role, f"User:{role}", k)} for role in ROLES
    }
    assert ("snaps", "WRITE") not in ops["agent"] and ("snaps", "READ") in ops["agent"]
    assert ("snaps", "WRITE") in ops["controller"]
    assert not any(op in ("WRITE", "CREATE", "ALTER", "DELETE") for _, op in ops["pipeline"])
    assert ("chan", "READ") in ops["pipeline"]
    assert not any(op in ("CREATE", "ALL", "ALTER_CONFIGS") for role in ROLES for _, op in ops[role])


def test_bindings_name_the_configured_topics_and_the_principal() -> None:
    k = KafkaSettings(channel_topic="my-channel")
    bindings = acl_bindings("pipeline", "User:etl", k, host="10.0.0.1")
    assert all(isinstance(b, AclBinding) for b in bindings)
    assert {b.principal for b in bindings} == {"User:etl"} and {b.host for b in bindings} == {"10.0.0.1"}
    assert {_name(b.permission_type) for b in bindings} == {"ALLOW"}
    chan = [b for b in bindings if b.name == "my-channel"]
    assert [(_name(b.restype), _name(b.resource_pattern_type), _name(b.operation)) for b in chan] == [
        ("TOPIC", "LITERAL", "READ")
    ]
    groups = [b for b in bindings if _name(b.restype) == "GROUP"]
    assert [(b.name, _name(b.resource_pattern_type), _name(b.operation)) for b in groups] == [
        (GROUP_PREFIX, "PREFIXED", "DESCRIBE")
    ]
    n_ops = sum(len(a.operations) for a in acls_for("pipeline"))
    assert len(bindings) == n_ops
