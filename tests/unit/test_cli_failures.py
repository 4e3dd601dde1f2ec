"""What a daemon that cannot run tells its operator (``trimtab.cli.failure_reason``)."""

from __future__ import annotations

from kazoo.exceptions import NoAuthError, NoNodeError

from trimtab.cli import failure_reason
from trimtab.errors import ZkUnavailable


def test_a_zookeeper_refusal_is_explained_not_printed_as_nothing() -> None:
    assert str(NoAuthError()) == ""  # why the translation exists
    reason = failure_reason(NoAuthError())
    assert "ZooKeeper refused" in reason and "zookeeper.auth_digest_file" in reason, reason


def test_an_error_without_a_message_is_named_and_one_with_a_message_keeps_it() -> None:
    assert failure_reason(NoNodeError()) == "NoNodeError"
    assert failure_reason(ZkUnavailable("no session within 15 s")) == "no session within 15 s"
