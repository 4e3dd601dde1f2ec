"""The standby job (controller/placement/standbys.py) against the topic it writes, found by review:

* what it wrote and Kafka acknowledged stands for the topic only until the standby view reads a record of
  that bundle -- not across a lost leadership, nor past a write that timed out and landed later;
* a full pass counts each ownership change once, whether the change is heard just before its copy of the
  ownership index or just after.
"""

from __future__ import annotations

import asyncio
import concurrent.futures

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

TOPIC = "standbys"
KEY = "t/ns/0x00_0x01"


class Leadership:
    def __init__(self) -> None:
        self.is_leader = True

    def term(self) -> int:
        return 3


def _latest(transport: MemoryTransport, key: str) -> list[str] | None:
    msgs = [m for m in transport.log.messages(TOPIC) if m.key == key.encode()]
    if not msgs or msgs[-1].value is None:
        return None
    return msgspec.json.decode(msgs[-1].value, type=StandbySet).brokers


def _setup() -> tuple[LivePlacement, StandbyIndex, MemoryTransport, Leadership, StandbyJob]:
    brokers = {
        f"b{i}:1": BrokerInfo(id=f"b{i}:1", service_url="s", http_url="h", tags={"zone": f"z{i % 2}"})
        for i in range(4)
    }
    placement = LivePlacement(lambda: brokers, failure_domains_enabled=False, table=OwnedRecords())
    index, transport, leadership = StandbyIndex(), MemoryTransport(), Leadership()
    job = StandbyJob(
        placement,
        index,
        transport,
        TOPIC,
        leadership,  # type: ignore[arg-type]
        ControllerMetrics.create(CollectorRegistry()),
        StandbySpec(1, ("zone",)),
    )
    placement.add_owner_listener(job.owner_changed)  # as the controller's wiring does
    change(placement, KEY, None, make(State.OWNED, version=1, ts=0, writer="b0:1", dst="b0:1"))
    return placement, index, transport, leadership, job


def test_a_regained_leadership_does_not_trust_what_it_wrote_in_an_earlier_term() -> None:
    """Leader A writes a set (acknowledged; its standby view has not read it back yet) and loses the
    leadership. Leader B then tombstones the bundle's set (say it was unowned at B's round, or B ran with
    replicas 0); A's view reads A's set and B's tombstone between two of A's rounds, so the view never
    equals what A wrote and A's ``_written`` keeps it for ever. When A leads again, its full pass takes
    its own old set for what is published, computes the same set, and skips the write: the bundle has no
    standby on the topic while A's metrics count it covered -- and no later full pass fixes it."""
    _placement, index, transport, leadership, job = _setup()
    assert asyncio.run(job.run_once()) == 1
    mine = _latest(transport, KEY)
    assert mine

    leadership.is_leader = False
    assert asyncio.run(job.run_once()) == 0
    # leader B's tombstone; A's view reads both records between two rounds
    transport.produce(TOPIC, KEY.encode(), None).result()
    index.changed(KEY, StandbySet(brokers=mine, term=3))
    index.changed(KEY, None)
    assert asyncio.run(job.run_once()) == 0  # still a follower

    leadership.is_leader = True
    asyncio.run(job.run_once())  # a new leadership: a full pass
    assert _latest(transport, KEY) is not None, "the owned bundle is left without a standby set"


def test_moves_heard_around_a_full_pass_copy_are_counted_once() -> None:
    """The channel's thread keeps moving bundles while a full pass runs on a worker: one move lands just
    before the pass copies the ownership index, another just after (before the pass settles what it
    noted). Each must shift the owned counts exactly once -- found by review: a move whose placement
    update made the copy but whose note came after the pass cleared its notes was counted twice, and every
    pick for up to 10 minutes was made from counts one off."""
    placement, _index, _transport, _leadership, job = _setup()
    other = "t/ns/0x01_0x02"
    change(placement, other, None, make(State.OWNED, version=1, ts=0, writer="b0:1", dst="b0:1"))
    assert asyncio.run(job.run_once()) == 2

    first_old = make(State.OWNED, version=1, ts=0, writer="b0:1", dst="b0:1")
    first_new = make(State.OWNED, version=2, ts=0, writer="b2:1", src="b0:1", dst="b2:1")
    second_old = make(State.OWNED, version=1, ts=0, writer="b0:1", dst="b0:1")
    second_new = make(State.OWNED, version=2, ts=0, writer="b3:1", src="b0:1", dst="b3:1")
    real_planning = placement.planning

    def planning():  # type: ignore[no-untyped-def]
        change(placement, KEY, first_old, first_new)  # just before the copy
        copy = real_planning()
        change(placement, other, second_old, second_new)  # just after it
        return copy

    placement.planning = planning  # type: ignore[method-assign]
    placement.brokers_changed()  # a full pass this round
    asyncio.run(job.run_once())
    placement.planning = real_planning  # type: ignore[method-assign]
    asyncio.run(job.run_once())  # the repair of what came after the copy
    loads = job._loads
    assert loads is not None
    published = {b: job._current(b) for b in (KEY, other)}
    owned = {KEY: "b2:1", other: "b3:1"}
    for b in ("b0:1", "b1:1", "b2:1", "b3:1"):
        want = sum(o == b for o in owned.values()) + sum(b in s for s in published.values())
        assert loads.get(b) == want, b


def test_a_late_write_that_lands_after_its_timeout_does_not_leave_a_stale_overlay() -> None:
    """The same stale overlay with one leader: set W0 is acknowledged (``_written``), the owner moves, the
    repair's W1 is not acknowledged within ``ack_timeout_s`` (counted failed) but Kafka takes it later. The
    view reads W0 then W1 between two rounds, so ``_written`` keeps W0 for ever; every later pass repairs
    from W0 and, when it computes W0 again, writes nothing -- the topic keeps W1."""
    placement, index, transport, _leadership, job = _setup()
    job.ack_timeout_s = 0.0
    assert asyncio.run(job.run_once()) == 1
    w0 = _latest(transport, KEY)
    assert w0 == ["b1:1"]

    real_produce = transport.produce
    late: list[tuple[str, bytes, bytes | None]] = []

    def slow_produce(topic: str, key: bytes, value: bytes | None):  # type: ignore[no-untyped-def]
        late.append((topic, key, value))
        return concurrent.futures.Future()  # never acknowledged in time

    transport.produce = slow_produce  # type: ignore[method-assign]
    old = make(State.OWNED, version=1, ts=0, writer="b0:1", dst="b0:1")
    new = make(State.OWNED, version=2, ts=0, writer="b1:1", src="b0:1", dst="b1:1")
    change(placement, KEY, old, new)
    assert asyncio.run(job.run_once()) == 0  # W1 timed out
    transport.produce = real_produce  # type: ignore[method-assign]
    ((topic, key, value),) = late
    real_produce(topic, key, value).result()  # ... and landed after all
    w1 = _latest(transport, KEY)
    assert w1 is not None and w1 != w0
    index.changed(KEY, StandbySet(brokers=w0))  # the view reads both between two rounds
    index.changed(KEY, StandbySet(brokers=w1))

    # the bundle moves back to b0: the right set is W0 again, and the topic holds W1
    change(placement, KEY, new, old)
    asyncio.run(job.run_once())
    placement.brokers_changed()
    asyncio.run(job.run_once())
    assert _latest(transport, KEY) == w0, "the topic keeps a set naming the owner as its own standby"
