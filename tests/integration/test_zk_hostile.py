"""Hostile bytes in ZooKeeper: every znode trimtab reads is decoded strictly, and one unreadable znode is
skipped (or, for a namespace's bundle layout, refused with a clear error) -- never a crashed watcher thread.

Against a real ZooKeeper server. Before, a broker znode with invalid UTF-8 inside a JSON string raised
``UnicodeDecodeError`` (not ``msgspec.DecodeError``) out of the registry's refresh.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import msgspec
import pytest
from kazoo.client import KazooClient

from tests.support.waiting import wait_for
from trimtab.balance.assign import BrokerInfo
from trimtab.cluster.zk import BrokerRegistry, NamespaceStore, ZkPaths, ZkSession
from trimtab.controller.election import LeaderElection
from trimtab.controller.stores import FailedBroker, FailedBrokers, Reassignments, Switches
from trimtab.errors import NamespaceUnreadable

pytestmark = pytest.mark.integration

HOSTILE = [
    b'{"id":"br\xc3"}',  # invalid UTF-8 inside a string
    b"\xef\xbb\xbf{}",  # a byte order mark
    b'{"id":"a","id":7}',  # a repeated name: the last (a number) counts
    b"[" * 50_000 + b"]" * 50_000,  # nesting far beyond any recursion limit
    b'{"id":"\\ud800"}',  # a lone surrogate
    b"\x00\xff garbage",
]


def _info(broker: str) -> bytes:
    return msgspec.json.encode(
        BrokerInfo(id=broker, service_url=f"pulsar://{broker}", http_url=f"http://{broker}")
    )


@contextlib.contextmanager
def started_registry(zk_hosts: str, paths: ZkPaths) -> Iterator[BrokerRegistry]:
    """A broker registry on a session of its own, synced once; both stopped at the end."""
    session = ZkSession(zk_hosts, session_timeout_s=10)
    session.start()
    registry = BrokerRegistry(session, paths)
    try:
        registry.start()
        assert registry.synced.wait(10)
        yield registry
    finally:
        registry.stop()
        session.stop()


@contextlib.contextmanager
def started_election(zk_hosts: str, paths: ZkPaths) -> Iterator[LeaderElection]:
    """A candidate ``ctl:1`` on a session of its own, not yet started; stopped (with its session) at the end."""
    session = ZkSession(zk_hosts, session_timeout_s=10)
    session.start()
    election = LeaderElection(session, paths, "ctl:1", "http://ctl:1")
    try:
        yield election
    finally:
        election.stop()
        session.stop()


def test_the_broker_registry_skips_unreadable_registrations(zk: KazooClient, zk_hosts: str) -> None:
    paths = ZkPaths("/trimtab/hostile")
    zk.ensure_path(paths.brokers)
    zk.create(paths.broker("good:1"), _info("good:1"))
    for i, value in enumerate(HOSTILE):
        zk.create(paths.broker(f"bad:{i}"), value)
    with started_registry(zk_hosts, paths) as registry:
        assert set(registry.brokers) == {"good:1"}
        # The registry keeps working: a new broker is seen, a hostile update of a good one is skipped.
        zk.create(paths.broker("late:2"), _info("late:2"))
        wait_for(lambda: "late:2" in registry.brokers, 10, message="the registry still follows changes")
        zk.set(paths.broker("late:2"), HOSTILE[0])
        wait_for(lambda: "late:2" not in registry.brokers, 10, message="the unreadable update is skipped")
        zk.create(paths.broker("later:3"), _info("later:3"))
        wait_for(lambda: set(registry.brokers) == {"good:1", "later:3"}, 10, message="still alive")


def test_an_unreadable_namespace_layout_is_refused_never_guessed(zk: KazooClient) -> None:
    paths = ZkPaths("/trimtab/hostile-ns")
    store = NamespaceStore(zk, paths, default_bundles=4)
    layout = store.ensure("t/ok")
    assert len(layout) == 4
    for value in HOSTILE:
        zk.ensure_path(paths.namespace("t/bad"))
        zk.set(paths.namespace("t/bad"), value)
        with pytest.raises(NamespaceUnreadable, match="t/bad"):
            store.ensure("t/bad")
        # The znode was not overwritten with a default layout.
        assert zk.get(paths.namespace("t/bad"))[0] == value
    assert store.ensure("t/ok") == layout


def test_controller_stores_skip_unreadable_znodes(zk: KazooClient) -> None:
    paths = ZkPaths("/trimtab/hostile-ctl")
    failed = FailedBrokers(zk, paths)
    assert failed.record("gone:1", 1000, by="ctl", term=1)
    for i, value in enumerate(HOSTILE):
        zk.create(f"{paths.failed_brokers}/bad:{i}", value, makepath=True)
    assert set(failed.read()) == {"gone:1"}
    assert isinstance(failed.read()["gone:1"], FailedBroker)

    moves = Reassignments(zk, paths)
    zk.ensure_path(f"{paths.admin}")
    for i, value in enumerate(HOSTILE):
        zk.create(f"{moves._dir('gone:1')}/{i:06d}", value, makepath=True)
    zk.create(f"{moves._dir('gone:1')}/not-a-number", b"{}", makepath=True)
    assert moves.read("gone:1") == {}

    switches = Switches(zk, paths)
    for value in HOSTILE:
        zk.ensure_path(paths.controller_state)
        zk.set(paths.controller_state, value)
        assert switches.read() == type(switches.read())()  # the defaults, not a crash


def test_a_null_znode_is_unreadable_like_any_hostile_value(zk: KazooClient, zk_hosts: str) -> None:
    """ZooKeeper allows a znode with no data at all (``null``, not empty), which kazoo returns as None."""
    paths = ZkPaths("/trimtab/hostile-null")
    zk.ensure_path(paths.brokers)
    zk.create(paths.broker("good:1"), _info("good:1"))
    zk.create(paths.broker("null:1"), b"")
    zk.set(paths.broker("null:1"), None)
    assert zk.get(paths.broker("null:1"))[0] is None
    with started_registry(zk_hosts, paths) as registry:
        assert set(registry.brokers) == {"good:1"}
    store = NamespaceStore(zk, paths, default_bundles=4)
    zk.ensure_path(paths.namespace("t/null"))
    zk.set(paths.namespace("t/null"), None)
    with pytest.raises(NamespaceUnreadable, match="t/null"):
        store.ensure("t/null")


BAD_TERMS = [b"", b"abc", b"-5", b"1e3", b"7.0", b" 12", b"9" * 40, b"\x00", None, *HOSTILE]


def test_an_unreadable_leader_term_stops_elections_loudly_until_it_is_repaired(
    zk: KazooClient, zk_hosts: str
) -> None:
    """The term fences every leader's writes, so a candidate must never guess one: an unreadable
    ``leader_term`` leaves the cluster without a leader (and says why) rather than one with a term that
    may go backwards -- and the election thread must survive it, to win once the term is readable."""
    paths = ZkPaths("/trimtab/hostile-term")
    zk.ensure_path(paths.base)
    zk.create(paths.leader_term, BAD_TERMS[0], makepath=True)
    with started_election(zk_hosts, paths) as election:
        election.start()
        for value in BAD_TERMS:
            zk.set(paths.leader_term, value)
            # Two steps: one in progress when the term was written may have read the one before.
            for _ in range(2):
                steps = election.steps
                election._wake.set()
                wait_for(lambda s=steps: election.steps > s, 10, message="the election read the new term")
            assert election.unreadable_term, value
            assert election.term is None and zk.exists(paths.leader) is None
        zk.set(paths.leader_term, b"41")
        election._wake.set()
        wait_for(lambda: election.term == 42, 10, message="leadership with the next term once repaired")
        assert zk.get(paths.leader_term)[0] == b"42" and not election.unreadable_term


def test_an_unreadable_leader_znode_does_not_end_the_election(zk: KazooClient, zk_hosts: str) -> None:
    paths = ZkPaths("/trimtab/hostile-leader")
    zk.create(paths.leader, b"", makepath=True)
    with started_election(zk_hosts, paths) as election:
        election.start()
        for value in [None, *HOSTILE]:
            zk.set(paths.leader, value)
            steps = election.steps
            election._wake.set()
            wait_for(lambda s=steps: election.steps > s, 10, message="the election read the leader znode")
            steps = election.steps
            election._wake.set()
            wait_for(lambda s=steps: election.steps > s, 10, message="the election thread is still alive")
            assert election.term is None and election.current is None
        zk.delete(paths.leader)
        wait_for(lambda: election.term is not None, 10, message="leadership once the znode is gone")
