"""The broker registry registers again, whatever took its node away -- apache/pulsar#23298, #24057 and
#24907: Pulsar's registry did not re-register after its znode was deleted, after its session expired, or
after a reconnect, and a live broker stayed invisible (nothing assigned to it; its bundles healed away).
Against a real ZooKeeper server (issue 31, point 6)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import msgspec
import pytest
from kazoo.client import KazooClient

from tests.support.waiting import wait_for
from trimtab.balance.assign import BrokerInfo
from trimtab.cluster.zk import BrokerRegistry, ZkPaths, ZkSession
from trimtab.devkit.zkserver import ZooKeeperServer, expire_session

pytestmark = pytest.mark.integration

ME = "me:1"


@contextlib.contextmanager
def registered(zk_hosts: str, paths: ZkPaths) -> Iterator[tuple[ZkSession, BrokerRegistry]]:
    session = ZkSession(zk_hosts, session_timeout_s=4)
    session.start()
    registry = BrokerRegistry(session, paths)
    try:
        registry.start()
        assert registry.synced.wait(10)
        registry.register(BrokerInfo(id=ME, service_url="pulsar://me:1", http_url="http://me:1"), 5)
        yield session, registry
    finally:
        registry.stop()
        session.stop()


def owned_by_session(zk: KazooClient, paths: ZkPaths, session: ZkSession) -> bool:
    stat = zk.exists(paths.broker(ME))
    return stat is not None and stat.ephemeralOwner == session.session_id


def test_a_deleted_registration_is_created_again(zk: KazooClient, zk_hosts: str) -> None:
    paths = ZkPaths("/trimtab/reregister-deleted")
    with registered(zk_hosts, paths) as (session, registry):
        before = registry.registrations
        zk.delete(paths.broker(ME))  # an operator's mistake, a cleanup script
        wait_for(lambda: owned_by_session(zk, paths, session), 10, message="not registered again")
        wait_for(lambda: registry.registrations == before + 1, 10)
        assert registry.registered_session == session.session_id
        wait_for(lambda: registry.registered, 10)


def test_after_the_session_expired_it_registers_in_the_new_one(zk: KazooClient, zk_hosts: str) -> None:
    paths = ZkPaths("/trimtab/reregister-expired")
    with registered(zk_hosts, paths) as (session, registry):
        old = session.session_id
        expire_session(zk_hosts, session.client.client_id)  # the server ends it, as a real expiry does
        wait_for(lambda: session.session_id not in (None, old), 20, message="no new session")
        wait_for(
            lambda: owned_by_session(zk, paths, session), 20, message="not registered in the new session"
        )
        # The registry's worker records the session it registered in once its create returned: a moment
        # after the znode is visible (the assertion raced it under CI load).
        wait_for(lambda: registry.registered_session == session.session_id, 10, message="registered_session")
        assert session.session_id != old


def test_a_reconnect_to_a_restarted_server_keeps_the_registration(zk_server: ZooKeeperServer) -> None:
    paths = ZkPaths("/trimtab/reregister-reconnect")
    hosts = zk_server.hosts
    # The observer only reads; it must outlive the restart. The server listed twice: kazoo waits for a
    # connect answer up to the session timeout divided by the hosts, and a server that took the connection
    # while starting may never answer it (a CI run saw the observer's 10-s session expire that way).
    observer = KazooClient(hosts=f"{hosts},{hosts}", timeout=30)
    observer.start(10)
    try:
        with registered(hosts, paths) as (session, registry):
            zk_server.restart()  # the connection drops and comes back within the session timeout
            wait_for(lambda: session.connected, 20, message="no reconnect")
            wait_for(lambda: owned_by_session(observer, paths, session), 20, message="registration lost")
            wait_for(lambda: registry.registered, 10)
    finally:
        observer.stop()
        observer.close()


def test_an_unexpected_error_in_the_worker_does_not_freeze_the_registry(
    zk: KazooClient, zk_hosts: str
) -> None:
    """apache/pulsar#23297's class: a component that dies quietly while the node runs on. The worker that
    keeps the registry current survives an error nobody expected and still sees the next broker."""
    paths = ZkPaths("/trimtab/registry-worker-error")
    with registered(zk_hosts, paths) as (_session, registry):
        real = registry._refresh
        calls = []

        def broken_once() -> None:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("a bug nobody expected")
            real()

        registry._refresh = broken_once  # type: ignore[method-assign]
        other = BrokerInfo(id="other:2", service_url="pulsar://other:2", http_url="http://other:2")
        zk.create(paths.broker("other:2"), msgspec.json.encode(other), ephemeral=True, makepath=True)
        wait_for(lambda: "other:2" in registry.brokers, 15, message="the registry saw the new broker")
        assert len(calls) >= 2


def other_encoded(info: BrokerInfo) -> bytes:
    import msgspec

    return msgspec.json.encode(info)


# ---------------------------------------------------------------------------------------------- read cost
def _peer(zk: KazooClient, paths: ZkPaths, n: int, version: str = "1.0.0") -> str:
    bid = f"peer-{n}:1"
    info = BrokerInfo(id=bid, service_url=f"pulsar://{bid}", http_url=f"http://{bid}", version=version)
    zk.create(paths.broker(bid), msgspec.json.encode(info), ephemeral=True, makepath=True)
    return bid


def test_a_membership_change_reads_only_what_changed(zk: KazooClient, zk_hosts: str) -> None:
    """Every agent keeps this cache: reading every registration again on each change (or every 5 s, as it
    did) costs ZooKeeper brokers x brokers reads per change -- a million at 1 000 brokers. A new broker
    costs one read, a changed registration one, a broker gone none, and nothing is read while nothing
    changes; a new session reads everything again (its data watches are gone)."""
    paths = ZkPaths("/trimtab/registry-reads")
    peers = [_peer(zk, paths, n) for n in range(20)]
    with registered(zk_hosts, paths) as (session, registry):
        wait_for(lambda: len(registry.brokers) == 21, 10)
        reads: list[str] = []
        real_get = registry.zk.get

        def counting_get(path: str, *args: object, **kwargs: object) -> object:
            reads.append(path)
            return real_get(path, *args, **kwargs)  # type: ignore[arg-type]

        registry.zk.get = counting_get  # type: ignore[method-assign]
        added = _peer(zk, paths, 99)
        wait_for(lambda: added in registry.brokers, 10)
        assert reads == [paths.broker(added)]
        reads.clear()
        changed = BrokerInfo(
            id=peers[3], service_url=f"pulsar://{peers[3]}", http_url="http://x", version="2.0.0"
        )
        zk.set(paths.broker(peers[3]), msgspec.json.encode(changed))
        wait_for(lambda: registry.brokers[peers[3]].version == "2.0.0", 10)
        assert reads == [paths.broker(peers[3])]
        reads.clear()
        zk.delete(paths.broker(peers[5]))
        wait_for(lambda: peers[5] not in registry.brokers, 10)
        assert reads == []
        # Unreadable: refused once, not read again while it does not change.
        zk.create(paths.broker("junk:1"), b"\xff not json", ephemeral=True)
        wait_for(lambda: paths.broker("junk:1") in reads, 10)
        reads.clear()
        _peer(zk, paths, 100)
        wait_for(lambda: "peer-100:1" in registry.brokers, 10)
        assert reads == [paths.broker("peer-100:1")]
        # A new session: everything read again.
        reads.clear()
        expire_session(zk_hosts, session.client.client_id)
        wait_for(
            lambda: len(set(reads)) >= 21, 20, message=lambda: f"full read after expiry: {sorted(set(reads))}"
        )
        wait_for(lambda: registry.registered, 10)
        assert set(registry.brokers) >= {added, "peer-100:1", *[p for p in peers if p != peers[5]]}
