"""Automatic merges through the agent's own wiring (agent/wiring.py -> agent/merges.py): the layout read
from a real ZooKeeper, the job run by the daemon's job runner, the merge carried out by the reconciler --
a namespace of 4 cold bundles owned by one broker ends as ``merge.min_bundles_per_namespace`` = 2 bundles
that tile the hash range, in the channel and in ZooKeeper alike."""

from __future__ import annotations

import asyncio

import pytest
from kazoo.client import KazooClient

from tests.integration.test_agent_inprocess import (
    BUNDLES,
    NS,
    agent_settings,
    layout,
    running_agent,
    topic_of,
    until,
)
from tests.support.memory_log import memory_log
from trimtab.channel.bundles import FULL_LOWER, FULL_UPPER, parse_bundle
from trimtab.channel.records import State
from trimtab.cluster.zk import NamespaceStore, ZkPaths

pytestmark = pytest.mark.integration

COLD_ENOUGH = {  # every bundle of the simulated broker counts as cold; the pair's sum never splits back
    "enabled": True,
    "interval_s": 0.3,
    "hit_count_threshold": 1,
    "min_bundles_per_namespace": 2,
    "max_topics": 1_000_000,
    "max_sessions": 0,
    "max_msg_rate": 1e12,
    "max_bandwidth_mbytes": 1e9,
    "split_fraction": 1.0,
}


def test_cold_bundles_of_one_broker_merge_down_to_the_minimum(zk_hosts: str, zk: KazooClient) -> None:
    s = agent_settings(zk_hosts, merge=COLD_ENOUGH, split={"enabled": False, "max_topics": 1_000_000})

    async def scenario() -> None:
        log = memory_log(s)
        async with running_agent(s, log) as a:
            me = a.identity.id
            for b in layout().bundles:
                assert (await asyncio.wait_for(a.lookups.lookup(topic_of(b)), 15)).owner == me

            def live() -> dict[str, State]:
                return {
                    k: r.state
                    for k, r in a.channel.table.items()
                    if k.startswith(NS + "/") and r.state is not State.DELETED
                }

            def merged_down() -> bool:
                states = live()
                return len(states) == 2 and all(st is State.OWNED for st in states.values())

            await until(merged_down, 30, what=f"{BUNDLES} bundles merged down to 2")
            ranges = sorted(parse_bundle(b)[1] for b in live())
            assert ranges[0].lower == FULL_LOWER and ranges[0].upper == ranges[1].lower
            assert ranges[1].upper == FULL_UPPER
            store = NamespaceStore(zk, ZkPaths(s.zk_path), s.namespace.default_bundles)
            got = store.read(NS)
            assert got is not None and sorted(got[0].layout(NS).ranges) == ranges  # ZooKeeper agrees
            assert a.sim is not None and set(a.sim.serving) == set(live())  # the broker serves exactly those
            merges = a.metrics.merges
            assert merges.labels("started")._value.get() == BUNDLES - 2
            # ... and then it stops, saying why (counted once the last pair has been cold long enough).
            min_bundles = merges.labels("min_bundles")._value
            await until(lambda: min_bundles.get() >= 1, 10, what="the pair left counted as min_bundles")
            assert len(live()) == 2
            shown = a.agent.status()["merges"]  # the agent's /v1/status says why it stopped
            assert shown["enabled"] and not shown["paused"]
            await until(
                lambda: "min_bundles" in (a.agent.status()["merges"]["last_check"] or {}).get("skipped", {})
            )

    asyncio.run(scenario())
