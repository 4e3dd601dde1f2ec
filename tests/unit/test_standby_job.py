"""The leader's standby job (controller/placement/standbys.py):

* outside leadership the ownership changes its channel listener notes are dropped each round -- a follower
  controller hears every move of every bundle and never repairs one, so what it keeps must not grow with
  them (a new leadership starts with a full pass, which counts afresh);
* what it wrote and Kafka acknowledged counts as published until the standby view reads it back: the next
  round neither writes it again nor repairs from the view's older set.
"""

from __future__ import annotations

import asyncio

import msgspec
from prometheus_client import CollectorRegistry

from tests.support.owned_table import OwnedRecords, change
from trimtab.balance.assign import BrokerInfo
from trimtab.balance.placement.standby import StandbySpec
from trimtab.channel.memory import MemoryTransport
from trimtab.channel.records import State, make
from trimtab.cluster.placement.standbys import StandbyIndex, StandbySet
from trimtab.cluster.placement.view import LivePlacement
from trimtab.controller.metrics import ControllerMetrics
from trimtab.controller.placement.standbys import StandbyJob


class Follower:
    is_leader = False

    def term(self) -> int:
        return 0


def test_a_follower_does_not_keep_the_moves_it_hears() -> None:
    job = StandbyJob(
        LivePlacement(dict, failure_domains_enabled=False, table=OwnedRecords()),
        StandbyIndex(),
        MemoryTransport(),
        "standbys",
        Follower(),  # type: ignore[arg-type]
        ControllerMetrics.create(CollectorRegistry()),
        StandbySpec(1),
    )
    for i in range(100):
        job.owner_changed(f"t/ns/0x{i:02x}_0x{i + 1:02x}", None, "b1:1")
    job.owner_changed("t/ns/0x00_0x01", "b1:1", "b1:1")  # no change of owner: not noted
    assert job.pending == 100
    assert asyncio.run(job.run_once()) == 0
    assert job.pending == 0


class Leader:
    is_leader = True

    def term(self) -> int:
        return 3


def test_what_was_acknowledged_is_not_written_again_before_the_view_reads_it() -> None:
    brokers = {
        f"b{i}:1": BrokerInfo(id=f"b{i}:1", service_url="s", http_url="h", tags={"zone": f"z{i % 2}"})
        for i in range(4)
    }
    placement = LivePlacement(lambda: brokers, failure_domains_enabled=False, table=OwnedRecords())
    transport = MemoryTransport()
    index = StandbyIndex()  # the standby view is not read back in this test: it stays empty
    job = StandbyJob(
        placement,
        index,
        transport,
        "standbys",
        Leader(),  # type: ignore[arg-type]
        ControllerMetrics.create(CollectorRegistry()),
        StandbySpec(1, ("zone",)),
    )
    placement.add_owner_listener(job.owner_changed)  # as the controller's wiring does
    keys = [f"t/ns/0x{i:02x}_0x{i + 1:02x}" for i in range(6)]
    for k in keys:
        change(placement, k, None, make(State.OWNED, version=1, ts=0, writer="b0:1", dst="b0:1"))
    assert asyncio.run(job.run_once()) == 6
    placement.brokers_changed()  # a full pass next round, over every bundle
    assert asyncio.run(job.run_once()) == 0  # acknowledged: not written again while the view lags
    assert job.full_passes == 2

    moved = keys[0]
    written = [m for m in transport.log.messages("standbys") if m.key == moved.encode()]
    standby = msgspec.json.decode(written[-1].value or b"", type=StandbySet).brokers[0]
    old = make(State.OWNED, version=1, ts=0, writer="b0:1", dst="b0:1")
    new = make(State.OWNED, version=5, ts=0, writer=standby, src="b0:1", dst=standby)
    change(placement, moved, old, new)
    assert asyncio.run(job.run_once()) == 1  # the moved bundle only, repaired from what was written
    latest = [m for m in transport.log.messages("standbys") if m.key == moved.encode()][-1]
    picks = msgspec.json.decode(latest.value or b"", type=StandbySet).brokers
    assert picks and standby not in picks
    assert brokers[picks[0]].tags["zone"] != brokers[standby].tags["zone"]
    # the loads it picks by are the owned bundles plus the standbys as written (none counted twice)
    sets = {}
    for m in transport.log.messages("standbys"):
        sets[m.key] = msgspec.json.decode(m.value or b"", type=StandbySet).brokers
    owned = {k: ("b0:1" if k != moved else standby) for k in keys}
    loads = job._loads  # what the next repair picks by
    assert loads is not None
    for b in brokers:
        want = sum(o == b for o in owned.values()) + sum(b in v for v in sets.values())
        assert loads.get(b) == want, b
