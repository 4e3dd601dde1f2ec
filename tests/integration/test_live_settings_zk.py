"""Live settings in a real ZooKeeper: a change by one controller is in force at another (its watch), a
refused change changes nothing, and concurrent writers do not lose each other's keys."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from tests.support.waiting import wait_for
from trimtab.cluster.zk import ZkPaths
from trimtab.config.settings import Settings
from trimtab.controller.live_settings import LiveSettings
from trimtab.errors import RequestError

pytestmark = pytest.mark.integration


def test_a_change_reaches_every_controller_and_a_refused_one_changes_nothing(zk: KazooClient) -> None:
    paths = ZkPaths("/trimtab/live")
    leader, follower = LiveSettings(Settings(), zk, paths), LiveSettings(Settings(), zk, paths)
    leader.start()
    follower.start()
    view = leader.change({"operations.max_in_flight": 12}, [], by="test")
    assert view["operations"]["max_in_flight"] == 12 and view["overrides"] == {"operations.max_in_flight": 12}
    wait_for(lambda: follower.operations().max_in_flight == 12, 10, message="the follower's watch")
    with pytest.raises(RequestError) as e:
        leader.change({"operations.max_in_flight_per_broker": 0}, [], by="test")
    assert e.value.status == 400 and "max_in_flight_per_broker" in str(e.value)
    assert leader.operations().max_in_flight_per_broker == Settings().operations.max_in_flight_per_broker
    other = LiveSettings(Settings(), zk, paths)  # a second writer: keys merge, none is lost
    other.change({"operations.republish_after_s": 30}, [], by="other")
    wait_for(
        lambda: follower.overrides == {"operations.max_in_flight": 12, "operations.republish_after_s": 30},
        10,
        message="both overrides",
    )
    leader.change({"healing.max_in_flight": 40}, [], by="test")  # healing's throttle: live too
    wait_for(
        lambda: follower.heal_config().max_in_flight == 40, 10, message="healing's throttle on the follower"
    )
    leader.change({}, ["operations.max_in_flight", "healing.max_in_flight"], by="test")
    wait_for(lambda: follower.operations().max_in_flight == Settings().operations.max_in_flight, 10)
    zk.set(paths.dynamic_config, b"\x00 not json")
    wait_for(lambda: follower.unreadable >= 1, 10, message="the hostile value counted")
    assert follower.operations().republish_after_s == 30  # kept in force


def test_zookeeper_away_is_a_retryable_503_not_an_internal_error(zk_hosts: str) -> None:
    """A change while the controller's ZooKeeper client has no connection is trimtab's ZooKeeper error,
    which the API answers as a retryable 503 -- kazoo's own exception was a 500 (found in a review)."""
    from trimtab.cluster.http_errors import refusal_of
    from trimtab.errors import ZkUnavailable

    client = KazooClient(hosts=zk_hosts, timeout=2)
    client.start(timeout=10)
    live = LiveSettings(Settings(), client, ZkPaths("/trimtab/away"))
    client.stop()  # no connection from here on
    try:
        with pytest.raises(ZkUnavailable) as e:
            live.change({"operations.max_in_flight": 12}, [], by="test")
        refusal = refusal_of(e.value)
        assert refusal is not None and (refusal.status, refusal.retryable) == (503, True)
    finally:
        client.close()
