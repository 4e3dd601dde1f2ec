"""Choosing which agent a test kills.

A test that kills an agent to watch its bundles heal must kill one that owns some. Lookups place bundles
by load, and with a few dozen bundles over three brokers one of them sometimes owns none (seen as 5/5/0):
kill that one and nothing heals, so a "healing happened" assertion fails now and then. The agent that owns
the most bundles always owns at least one once anything is owned.

It may be any agent, ``agents[0]`` included: after the kill, wait for the process to end and query a
survivor by name, not by position (``LocalCluster.agents`` drops a node only once it has exited)."""

from __future__ import annotations

from collections import Counter

from tests.support.waiting import wait_for
from trimtab.devkit.localcluster import LocalCluster, Node


def agent_owning_most(cluster: LocalCluster, via: Node | None = None, timeout: float = 20) -> Node:
    """The live agent whose broker owns the most bundles in ``via``'s (default: the leader's) table."""

    def owned() -> Counter[str]:
        return Counter(r["dst"] for r in cluster.ownership(via).values() if r["state"] == "owned")

    counts = wait_for(owned, timeout=timeout, message="no bundle is owned yet")
    live = {n.broker: n for n in cluster.agents}
    return live[next(b for b, _ in counts.most_common() if b in live)]
