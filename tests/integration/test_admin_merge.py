"""An operator's merge of two adjacent bundles (issue 32 point 5), in-process: a real ZooKeeper server, the
in-memory channel, a controller and two agents built by the production wiring, each agent beside its
simulated broker.

* Refusals, each with its reason and nothing published: bundles of two namespaces, not adjacent, unknown,
  owned by two brokers (with the transfer that would make it possible).
* A dry run says which bundle would be made and by whom, and publishes nothing.
* The merge: both parents ``Merging``, the owner serves the merged bundle in place (its simulated broker
  moves the parents' topics to it), publishes it ``Owned``, the namespace layout in ZooKeeper loses the inner
  boundary, both parents end ``Deleted``; a lookup of a topic of either parent -- on the other agent, whose
  layout was read before -- answers the merged bundle and its owner.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.integration.test_admin_moves import channel_size, cluster
from tests.integration.test_agent_inprocess import NS, agent_settings, layout, topic_of, until
from trimtab.channel.bundles import BundleRange, bundle_name, parse_bundle
from trimtab.channel.memory import MemoryLog
from trimtab.channel.records import State
from trimtab.config.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture
def settings(zk_hosts: str) -> Settings:
    # Only the test moves bundles; the controller decides at once (no settling after connecting).
    return agent_settings(zk_hosts, healing={"safe_mode_settle_s": 0}, shedding={"enabled": False})


async def merge_followed(c: Any, merged: str) -> None:
    """The leader follows the merge as one operation of both parents, done once both were replaced; it
    refuses to pause it, with the reason."""
    op = await until(
        lambda: next(
            (
                o
                for o in c.ctl.operations.list()
                if o.kind.value == "merge" and o.target == merged and o.state.value == "done"
            ),
            None,
        ),
        10,
        f"a done merge operation of {merged}",
    )
    shown = (await c.http.get(f"/v1/admin/ops/{op.id}")).json()
    assert shown["outcomes"] == {"merged": 2} and shown["progress"] == {"done": 2, "total": 2}, shown
    r = await c.http.post(f"/v1/admin/ops/{op.id}/pause", json={})
    assert r.status_code == 409 and "one channel transition" in r.text, r.text


def test_an_operator_merges_two_neighbours_into_one_served_in_place(
    settings: Settings, log: MemoryLog
) -> None:
    s = settings
    first, second, third, _ = layout().bundles
    merged = bundle_name(NS, BundleRange(parse_bundle(first)[1].lower, parse_bundle(second)[1].upper))

    async def scenario() -> None:
        async with cluster(s, log) as c:
            owners = await c.assign(first, second, third)
            http = c.http
            # Refusals: nothing published by any of them.
            size = channel_size(log, s)
            r = await http.post("/v1/admin/merge", json={"bundles": [first, third]})
            assert r.status_code == 400 and "not adjacent" in r.json()["error"], r.text
            r = await http.post(
                "/v1/admin/merge", json={"bundles": [first, "other/ns/0x40000000_0x80000000"]}
            )
            assert r.status_code == 400 and "different namespaces" in r.json()["error"], r.text
            r = await http.post("/v1/admin/merge", json={"bundles": [first]})
            assert r.status_code == 400 and "at least 2" in r.json()["error"], r.text
            if owners[first] != owners[second]:
                r = await http.post("/v1/admin/merge", json={"bundles": [first, second]})
                assert r.status_code == 409 and "transfer" in r.json()["error"], r.text
                r = await http.post("/v1/admin/transfer", json={"bundle": second, "broker": owners[first]})
                assert r.status_code == 202, r.text
                await until(lambda: c.owned(second, owners[first]), 20, "the transfer before the merge")
            owner = owners[first]
            size = channel_size(log, s)
            r = await http.post("/v1/admin/merge", json={"bundles": [second, first], "dry_run": True})
            assert r.status_code == 200, r.text
            assert r.json()["merged"] == merged and r.json()["owner"] == owner
            assert r.json()["parents"] == [first, second]
            assert channel_size(log, s) == size
            # The merge.
            w = c.a if c.a.identity.id == owner else c.b
            other = c.b if w is c.a else c.a
            sim = w.sim
            assert sim is not None and {first, second} <= sim.serving
            r = await http.post("/v1/admin/merge", json={"bundles": [second, first], "by": "test"})
            assert r.status_code == 202, r.text
            table = c.ctl.channel.table

            def done() -> bool:
                m, p1, p2 = table.get(merged), table.get(first), table.get(second)
                return (
                    m is not None
                    and m.state is State.OWNED
                    and m.dst == owner
                    and all(p is not None and p.state is State.DELETED for p in (p1, p2))
                )

            await until(done, 20, "the merged bundle owned, both parents deleted")

            await merge_followed(c, merged)
            await until(lambda: merged in sim.serving, 10, "the owner's broker serves the merged bundle")
            assert not ({first, second} & sim.serving)
            # The layout in ZooKeeper: the inner boundary is gone.
            for agent in (w, other):
                got = await asyncio.wait_for(agent.lookups.lookup(topic_of(first)), 15)
                assert (got.bundle, got.owner) == (merged, owner), got
                got = await asyncio.wait_for(agent.lookups.lookup(topic_of(second)), 15)
                assert (got.bundle, got.owner) == (merged, owner), got
            # A second merge of the same pair is refused: they are gone.
            r = await http.post("/v1/admin/merge", json={"bundles": [first, second]})
            assert r.status_code == 409, r.text

    asyncio.run(scenario())
