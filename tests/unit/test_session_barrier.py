"""Records that predate this broker's registration are stale (agent/session_barrier.py).

The bug it closes, found by the chaos suite (partition_zk_member): an agent lost its ZooKeeper session; an
``Assigning`` to it entered the channel meanwhile; the leader healed the bundle to another broker; the
agent's new session acquired it under the old ``Assigning`` before it read the override -- two brokers
served the bundle for 43 ms. A stale ``Assigning`` is first taken through the channel (``Owned{dst=me}``
published, the acquire only once that is accepted), where the version check orders it against the
override."""

from __future__ import annotations

import asyncio
import time

from tests.unit.test_reconciler_yields import ME, Channel, InstantBroker, build_reconciler
from trimtab.agent.session_barrier import SessionBarrier
from trimtab.channel.records import State, encode, make
from trimtab.channel.table import TableView, partition_for

PARTS = 4


def test_before_a_registration_everything_predates_it_and_after_it_what_is_below_the_ends() -> None:
    table = TableView(partitions=PARTS)
    table.set_live()
    b = SessionBarrier()
    seen: list[tuple[str, bool]] = []
    table.add_listener(lambda key, old, new: seen.append((key, b.predates(table, key))))
    # Four bundles of one partition, each entering the channel as Assigning{dst=me} at the given offset.
    names = [f"t/ns{i}/0x00000000_0xffffffff" for i in range(200)]
    p = partition_for(names[0].encode(), PARTS)
    bundles = [n for n in names if partition_for(n.encode(), PARTS) == p][:4]

    def put(i: int, offset: int) -> None:
        rec = make(State.ASSIGNING, dst=ME, version=1, ts=1, writer="w")
        table.apply(bundles[i].encode(), encode(rec), p, offset)

    assert not b.open
    put(0, 0)  # before any registration
    b.set({p: 5}, session=7)  # registered; the partition ended at offset 5 then
    put(1, 4)  # entered before the registration, read after it
    put(2, 5)  # entered after it
    assert seen == [(bundles[0], True), (bundles[1], True), (bundles[2], False)]
    b.lost()
    put(3, 6)  # the session is gone again
    assert seen[-1] == (bundles[3], True) and b.session is None


def run_once(predates: bool) -> tuple[list[str], list[str]]:
    """An Assigning{dst=me} arrives (predating the registration or not): what the broker acquired and
    what the agent published."""

    async def main() -> tuple[list[str], list[str]]:
        now_ms = int(time.time() * 1000)
        bundle = "t/ns/b0"
        rec = make(State.ASSIGNING, dst=ME, version=1, ts=now_ms, writer="another-agent")
        channel, broker = Channel({bundle: rec}), InstantBroker()
        r = build_reconciler(channel, broker)
        r.on_change(bundle, None, rec, predates)
        r.start()
        await asyncio.wait_for(r.idle.wait(), 10)
        await r.stop()
        return broker.acquired, channel.sent

    return asyncio.run(main())


def test_an_assigning_from_before_the_registration_is_taken_through_the_channel_first() -> None:
    acquired, sent = run_once(predates=True)
    assert acquired == [] and sent == ["t/ns/b0"]  # Owned{dst=me} published; the acquire waits for it
    acquired, sent = run_once(predates=False)
    assert acquired == ["t/ns/b0"] and sent == ["t/ns/b0"]  # acquired, then Owned published
