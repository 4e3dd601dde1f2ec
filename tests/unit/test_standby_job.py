"""The leader's standby job (controller/placement/standbys.py) outside leadership: the ownership changes
its channel listener notes are dropped each round -- a follower controller hears every move of every
bundle and never repairs one, so what it keeps must not grow with them (a new leadership starts with a
full pass, which counts afresh)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from trimtab.balance.placement.standby import StandbySpec
from trimtab.channel.memory import MemoryTransport
from trimtab.channel.records import State, make
from trimtab.cluster.placement.standbys import StandbyIndex
from trimtab.cluster.placement.view import LivePlacement
from trimtab.controller.metrics import ControllerMetrics
from trimtab.controller.placement.standbys import StandbyJob


class Follower:
    is_leader = False

    def term(self) -> int:
        return 0


def test_a_follower_does_not_keep_the_moves_it_hears() -> None:
    job = StandbyJob(
        LivePlacement(dict, failure_domains_enabled=False),
        StandbyIndex(),
        MemoryTransport(),
        "standbys",
        Follower(),  # type: ignore[arg-type]
        ControllerMetrics.create(CollectorRegistry()),
        StandbySpec(1),
    )
    owned = make(State.OWNED, version=1, ts=0, writer="b1:1", dst="b1:1")
    for i in range(100):
        job.owner_changed(f"t/ns/0x{i:02x}_0x{i + 1:02x}", None, owned)
    job.owner_changed("t/ns/0x00_0x01", owned, owned)  # no change of owner: not noted
    assert job.pending == 100
    assert asyncio.run(job.run_once()) == 0
    assert job.pending == 0
