"""What a daemon that cannot run tells its operator (``trimtab.cli.failure_reason``)."""

from __future__ import annotations

from kazoo.exceptions import NoAuthError, NoNodeError

from trimtab.cli.main import failure_reason
from trimtab.cluster.zk import access_denied
from trimtab.errors import ZkUnavailable


def test_a_zookeeper_refusal_is_explained_not_printed_as_nothing() -> None:
    assert str(NoAuthError()) == ""  # why the translation exists
    reason = failure_reason(NoAuthError())
    assert "ZooKeeper refused" in reason and "zookeeper.auth_digest or auth_digest_file" in reason, reason


def test_an_acl_refusal_names_the_znode_and_both_places_credentials_come_from() -> None:
    with_creds = str(access_denied("/trimtab/c1/brokers", authenticated=True))
    without = str(access_denied("/trimtab/c1/brokers", authenticated=False))
    assert "/trimtab/c1/brokers" in with_creds and "/trimtab/c1/brokers" in without
    assert "digest credentials of zookeeper.auth_digest (or auth_digest_file)" in with_creds, with_creds
    assert "unauthenticated client (neither zookeeper.auth_digest nor auth_digest_file" in without, without


def test_an_error_without_a_message_is_named_and_one_with_a_message_keeps_it() -> None:
    assert failure_reason(NoNodeError()) == "NoNodeError"
    assert failure_reason(ZkUnavailable("no session within 15 s")) == "no session within 15 s"
