"""Placement in the daemons: policies in ZooKeeper, followed live, obeyed by every decision that places a
bundle (docs/placement.md). A real ZooKeeper server and the in-memory channel; the rules themselves are
tests/unit/test_placement*.py's and tests/property/test_placement_props.py's."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from tests.integration.test_controller_jobs import Node, bundle, controller_settings, own, register
from tests.support.owned_table import OwnedRecords
from tests.support.waiting import wait_for
from trimtab.balance.assign import BrokerInfo
from trimtab.channel.memory import MemoryLog
from trimtab.channel.records import State, make
from trimtab.cluster.placement.store import (
    AntiAffinityGroups,
    FailureDomain,
    FailureDomains,
    IsolationPolicies,
    IsolationPolicyDoc,
    PlacementDocs,
    PlacementStore,
    PlacementWatch,
)
from trimtab.cluster.placement.view import LivePlacement, build_policy
from trimtab.cluster.zk import ZkPaths
from trimtab.config.settings import Settings
from trimtab.controller.admin import Admin
from trimtab.errors import RequestError

ISOLATED = IsolationPolicies(
    policies={"gold": IsolationPolicyDoc(namespaces=["acme/.*"], primary=["gold-.*"], min_limit=1)}
)


def info(b: str, domain: str | None = None, draining: bool = False) -> BrokerInfo:
    return BrokerInfo(
        id=b, service_url=f"pulsar://{b}", http_url=f"http://{b}", failure_domain=domain, draining=draining
    )


# ---------------------------------------------------------------------------------------------- the view


def test_the_view_follows_policies_brokers_and_ownership() -> None:
    brokers = {b: info(b) for b in ("gold-1:1", "gold-2:1", "plain-1:1", "plain-2:1")}
    table = OwnedRecords()
    view = LivePlacement(lambda: brokers, failure_domains_enabled=False, table=table)
    assert view.candidates(bundle(0)) == sorted(brokers)  # no policy: every broker

    view.policies_changed(PlacementDocs(isolation=ISOLATED))
    assert view.candidates(bundle(0)) == ["gold-1:1", "gold-2:1"]
    assert view.candidates("other/ns/0x00000000_0xffffffff") == ["plain-1:1", "plain-2:1"]  # shared only
    assert view.restrict(bundle(0), {b: brokers[b] for b in ("gold-2:1", "plain-1:1")}) == {
        "gold-2:1": brokers["gold-2:1"]
    }

    # Anti-affinity: the group's Owned bundles steer the next one to the least loaded primary.
    view.policies_changed(
        PlacementDocs(isolation=ISOLATED, groups=AntiAffinityGroups(groups={"acme/jobs": "G"}))
    )
    now = int(time.time() * 1000)
    table.change(view, bundle(1), None, make(State.OWNED, version=2, ts=now, writer="x", dst="gold-1:1"))
    assert view.candidates(bundle(0)) == ["gold-2:1"]
    assert not view.may_transfer(bundle(1), "gold-2:1") or view.candidates(bundle(1), "gold-1:1") == [
        "gold-2:1"
    ]
    table.change(view, bundle(1), table.get(bundle(1)), None)  # tombstoned: counts no more
    assert view.candidates(bundle(0)) == ["gold-1:1", "gold-2:1"]

    # A draining broker is no candidate; a broker leaving rebuilds the policy.
    brokers["gold-1:1"] = info("gold-1:1", draining=True)
    view.brokers_changed()
    assert view.candidates(bundle(0)) == ["gold-2:1"]
    del brokers["gold-2:1"]
    view.brokers_changed()
    assert view.candidates(bundle(0)) == []  # the hard rule: nobody may take it


def test_domains_come_from_zookeeper_then_from_the_registration() -> None:
    brokers = {"a:1": info("a:1", domain="reg-x"), "b:1": info("b:1", domain="reg-y"), "c:1": info("c:1")}
    docs = PlacementDocs(domains=FailureDomains(domains={"zk-1": FailureDomain(brokers=["a:1", "c:1"])}))
    policy = build_policy(docs, brokers, failure_domains_enabled=True)
    assert policy.domain_of == {"a:1": "zk-1", "b:1": "reg-y", "c:1": "zk-1"}


def test_a_policy_written_past_the_api_with_a_bad_regex_is_ignored_not_fatal() -> None:
    docs = PlacementDocs(
        isolation=IsolationPolicies(
            policies={"bad": IsolationPolicyDoc(namespaces=["acme/("], primary=["x"]), **ISOLATED.policies}
        )
    )
    policy = build_policy(docs, {"gold-1:1": info("gold-1:1")}, failure_domains_enabled=False)
    assert [p.name for p in policy.isolation_policies] == ["gold"]


# ---------------------------------------------------------------------------------------------- ZooKeeper


@pytest.fixture
def paths(settings: Settings) -> ZkPaths:
    return ZkPaths(settings.zk_path)


def test_the_watch_applies_every_valid_version_and_keeps_the_last_good_one(
    zk: KazooClient, paths: ZkPaths
) -> None:
    seen: list[PlacementDocs] = []
    watch = PlacementWatch(zk, paths, seen.append)
    watch.start()
    store = PlacementStore(zk, paths)
    store.update("isolation", lambda _old: ISOLATED)
    wait_for(lambda: watch.docs.isolation == ISOLATED, message="the watch sees the policy")

    zk.set(paths.isolation, b'{"policies": {"gold": {"namespaces": ["\xff"]}}}')  # invalid UTF-8
    wait_for(lambda: watch.unreadable["isolation"] == 1, message="the bad version is counted")
    assert watch.docs.isolation == ISOLATED  # still in force
    with pytest.raises(Exception, match="unreadable"):
        store.read("isolation")  # and a writer refuses to overwrite what it cannot read


@pytest.fixture
def settings(zk_hosts: str) -> Settings:
    return controller_settings(zk_hosts)


@pytest.fixture
def leader(settings: Settings, log: MemoryLog) -> Iterator[Node]:
    node = Node(settings, log).start()
    node.ctl.replica.placement_watch.start()
    try:
        wait_for(
            lambda: node.ctl.leadership.is_leader and node.ctl.leadership.safe_mode() is None, message="leads"
        )
        yield node
    finally:
        node.stop()


def test_healing_and_admin_moves_obey_isolation(
    leader: Node, settings: Settings, zk: KazooClient, paths: ZkPaths
) -> None:
    c = leader.ctl
    register(zk, settings, "gold-1:1", "gold-2:1", "plain-1:1", "plain-2:1")
    wait_for(lambda: len(c.registry.brokers) == 4, message="registry sees the brokers")
    PlacementStore(zk, paths).update("isolation", lambda _old: ISOLATED)
    placement = c.healing.destinations.placement
    wait_for(lambda: placement.candidates(bundle(0)) == ["gold-1:1", "gold-2:1"], message="policy applied")

    own(leader, {bundle(i): "gone:1" for i in range(6)} | {bundle(9): "gold-1:1"})
    asyncio.run(c.healing.on_lead())
    moved = asyncio.run(c.healing.run_once())
    assert len(moved) == 6
    assert {o.dst for o in moved} <= {"gold-1:1", "gold-2:1"}, [o.dst for o in moved]

    # An operator's transfer outside the policy is refused with the reason; inside it is accepted.
    sh = c.shedding
    admin = Admin(
        c.channel.table,
        c.leadership,
        c.registry,
        c.healing.writes,
        sh.journal,
        c.metrics,
        c.switch_store,
        sh,
        placement,
        operations=c.operations,
        destinations=c.healing.destinations,
    )
    asyncio.run(c.operations.on_lead())  # what a new leader reads first: a move is stored as an operation
    with pytest.raises(RequestError, match="placement forbids") as refused:
        asyncio.run(admin.move(bundle(9), "plain-1:1"))
    assert refused.value.status == 409
    rec, _ = asyncio.run(admin.move(bundle(9), "gold-2:1"))
    assert rec.state is State.RELEASING and rec.dst == "gold-2:1"


@contextlib.contextmanager
def standby_leader(settings: Settings, log: MemoryLog, zk: KazooClient, *brokers: str) -> Iterator[Node]:
    """A leading controller with one warm standby per bundle, its standby topic read, ``brokers``
    registered and seen."""
    s = settings.model_copy(
        update={"placement": settings.placement.model_copy(update={"standby_replicas": 1})}
    )
    node = Node(s, log).start()
    c = node.ctl
    try:
        c.replica.standby_view.start()
        wait_for(lambda: c.replica.standby_view.ready, message="the standby topic read")
        wait_for(lambda: c.leadership.is_leader and c.leadership.safe_mode() is None, message="leads")
        register(zk, s, *brokers)
        wait_for(lambda: len(c.registry.brokers) == len(brokers), message="registry sees the brokers")
        yield node
    finally:
        node.stop()
        c.replica.standby_view.stop()


def test_the_leader_publishes_standbys_and_healing_prefers_them(
    settings: Settings, log: MemoryLog, zk: KazooClient
) -> None:
    with standby_leader(settings, log, zk, "b1:1", "b2:1", "b3:1", "b4:1") as node:
        c = node.ctl
        owners = {bundle(i): "b1:1" for i in range(8)}
        own(node, owners)
        written = asyncio.run(c.standbys.run_once())
        assert written == 8
        index = c.healing.destinations.standbys
        wait_for(lambda: len(index.snapshot()) == 8, message="the view reads the sets back")
        sets = index.snapshot()
        assert all(len(v) == 1 and v[0] != "b1:1" for v in sets.values()), sets
        assert node.metric("trimtab_standby_coverage_ratio") == 1.0
        assert asyncio.run(c.standbys.run_once()) == 0  # nothing changed: nothing rewritten

        # b1 dies: each of its bundles goes to its own warm standby.
        zk.delete(ZkPaths(settings.zk_path).broker("b1:1"))
        wait_for(lambda: "b1:1" not in c.registry.brokers, message="b1 gone")
        asyncio.run(c.healing.on_lead())
        moved = asyncio.run(c.healing.run_once())
        assert {o.bundle: o.dst for o in moved} == {b: sets[b][0] for b in owners}


def test_an_ownership_change_repairs_that_bundle_only(
    settings: Settings, log: MemoryLog, zk: KazooClient
) -> None:
    """Standby sets follow ownership incrementally: a bundle that moves onto its own standby gets a new
    set in the next round, the other bundles keep theirs, and no pass over every bundle is made."""
    with standby_leader(settings, log, zk, "b1:1", "b2:1", "b3:1") as node:
        c = node.ctl
        own(node, {bundle(i): "b1:1" for i in range(6)})
        assert asyncio.run(c.standbys.run_once()) == 6
        index = c.healing.destinations.standbys
        wait_for(lambda: len(index.snapshot()) == 6, message="the view reads the sets back")
        before = index.snapshot()
        passes = c.standbys.full_passes

        moved, to = bundle(0), before[bundle(0)][0]
        now = int(time.time() * 1000)
        for state, version, writer in (
            (State.RELEASING, 3, "b1:1"),
            (State.ASSIGNING, 4, "b1:1"),
            (State.OWNED, 5, to),
        ):
            node.publish(moved, make(state, version=version, ts=now, writer=writer, src="b1:1", dst=to))
        wait_for(lambda: c.replica.placement.owner(moved) == to, message="the move is seen")
        assert asyncio.run(c.standbys.run_once()) == 1
        assert c.standbys.full_passes == passes  # one bundle repaired, not a pass over all of them
        wait_for(lambda: index.of(moved) != before[moved], message="the new set is read back")
        after = index.snapshot()
        assert len(after[moved]) == 1 and after[moved][0] != to
        assert {b: v for b, v in after.items() if b != moved} == {
            b: v for b, v in before.items() if b != moved
        }
        assert node.metric("trimtab_standby_coverage_ratio") == 1.0


def test_standbys_are_measured_but_not_published_before_the_topic_is_read(
    settings: Settings, log: MemoryLog, zk: KazooClient
) -> None:
    s = settings.model_copy(
        update={"placement": settings.placement.model_copy(update={"standby_replicas": 1})}
    )
    node = Node(s, log).start()  # the standby view is not started: what was published is unknown
    c = node.ctl
    try:
        wait_for(lambda: c.leadership.is_leader, message="leads")
        register(zk, s, "b1:1", "b2:1")
        wait_for(lambda: len(c.registry.brokers) == 2, message="registry sees the brokers")
        own(node, {bundle(0): "b1:1"})
        assert asyncio.run(c.standbys.run_once()) == 0
        assert log.messages(s.kafka.standby_topic) == []
        assert node.metric("trimtab_standby_coverage_ratio") == 1.0  # measured all the same
    finally:
        node.stop()
