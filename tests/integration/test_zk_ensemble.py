"""ZooKeeper as a three-server ensemble (issue 31, point 3): a leader change under a client, and a member
cut off from the other two (each server on a host of its own) -- the majority keeps serving, the member
stops, and it rejoins when the link heals."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.support.waiting import wait_for
from trimtab.devkit import netns
from trimtab.devkit.netns import Network
from trimtab.devkit.zkserver import ZooKeeperEnsemble, ZooKeeperServerError


def client(connect: str) -> KazooClient:
    zk = KazooClient(hosts=connect, timeout=10.0)
    zk.start(timeout=20)
    return zk


def leader(e: ZooKeeperEnsemble, timeout: float = 30.0) -> int:
    """The leader's index once there is one (index 0 is a leader too: waited for as a 1-tuple)."""
    (i,) = wait_for(lambda: (e.leader(),) if e.leader() is not None else None, timeout, message="no leader")
    assert i is not None
    return i


@pytest.fixture
def ensemble(tmp_path: Path) -> Iterator[ZooKeeperEnsemble]:
    with ZooKeeperEnsemble(tmp_path, 3) as e:
        yield e


def test_killing_the_leader_elects_another_and_the_session_survives(ensemble: ZooKeeperEnsemble) -> None:
    zk = client(ensemble.connect)
    try:
        zk.create("/before", b"1", ephemeral=True)
        session = zk.client_id
        old = leader(ensemble)
        modes = sorted(s.mode() or "" for s in ensemble.servers)
        assert modes == ["follower", "follower", "leader"]
        ensemble.servers[old].kill()
        new = leader(ensemble)
        assert new != old
        # The client reconnects to a member of the new quorum: same session, ephemeral node kept.
        wait_for(lambda: zk.exists("/before") is not None, timeout=30, ignore=(Exception,))
        assert zk.client_id == session
        zk.create("/after", b"2")
        ensemble.restart(old)
        assert ensemble.servers[old].mode() == "follower"
        assert ensemble.leader() == new
    finally:
        zk.stop()
        zk.close()


def test_an_ensemble_has_an_odd_size() -> None:
    for size in (0, 2, 4, 11):
        with pytest.raises(ZooKeeperServerError, match="odd number"):
            ZooKeeperEnsemble("/nonexistent", size)


@pytest.mark.skipif(netns.available() is not None, reason=str(netns.available()))
def test_a_member_cut_off_stops_serving_and_the_majority_does_not(tmp_path: Path) -> None:
    with Network.create() as net:
        hosts = [net.add_host(f"zk{i}") for i in (1, 2, 3)]
        with ZooKeeperEnsemble(tmp_path, 3, hosts=[(h.ip, net.argv(h.name, [])) for h in hosts]) as e:
            lead = leader(e)
            member = next(i for i in range(3) if i != lead)  # a follower, so the quorum keeps its leader
            others = [h.name for i, h in enumerate(hosts) if i != member]
            for other in others:
                net.cut(hosts[member].name, other)
            wait_for(lambda: e.servers[member].mode() is None, timeout=30, message="the member kept serving")
            majority = ",".join(s.hosts for i, s in enumerate(e.servers) if i != member)
            zk = client(majority)
            try:
                zk.create("/while-cut", b"x")
            finally:
                zk.stop()
                zk.close()
            net.heal()
            wait_for(lambda: e.servers[member].mode() == "follower", timeout=60, message="did not rejoin")
            zk = client(e.servers[member].hosts)
            try:
                zk.sync("/")
                assert zk.exists("/while-cut") is not None  # it caught up with what it missed
            finally:
                zk.stop()
                zk.close()
