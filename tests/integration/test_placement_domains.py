"""PIP-7 and KIP-708 for real: two failure domains of two brokers each (real agent and controller
processes, a real ZooKeeper, the Kafka mock), one anti-affinity group of four bundles.

The group spreads one bundle per broker and two per domain; each bundle gets a warm standby in the other
zone, which its broker pre-warms; then a whole domain is killed (kill -9) and every bundle of the group
lands on the surviving domain -- each on the broker that stood by for it.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.waiting import wait_for
from trimtab.channel.bundles import BundleLayout, TopicName
from trimtab.devkit.localcluster import LocalCluster

NS = "acme/spread"
BUNDLES = 4
DOMAINS = {"agent-1": "d1", "agent-2": "d1", "agent-3": "d2", "agent-4": "d2"}


def topic_in(bundle: str) -> str:
    layout = BundleLayout.default(NS, BUNDLES)
    for i in range(10_000):
        topic = f"persistent://{NS}/t{i}"
        if layout.bundle_for_topic(TopicName.parse(topic)) == bundle:
            return topic
    raise AssertionError(f"no topic in {bundle}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    settings: dict[str, Any] = {
        "zookeeper": {"session_timeout_s": 4.0},
        "namespace": {"default_bundles": BUNDLES},
        "shedding": {"enabled": False},
        "split": {"enabled": False},
        # The grace covers the staggered detection of one dead domain: its brokers' sessions expire up to
        # about a second apart, and with no grace the first orphan is healed onto its domain-mate, dead but
        # not yet detected (the domain step prefers the emptier domain), and loses its standby.
        "healing": {"grace_s": 2.0, "safe_mode_settle_s": 0.0, "mass_failure_max_fraction": 0.6},
        "placement": {
            "failure_domains_enabled": True,
            "standby_replicas": 1,
            "standby_interval_s": 0.5,
            "awareness_tags": ["zone"],
        },
    }
    c = LocalCluster(Path(tmp_path_factory.mktemp("domains")), brokers=0, controllers=1, settings=settings)
    c.start(timeout=120)
    try:
        for name, domain in DOMAINS.items():
            c.add_agent(
                name,
                wait=False,
                args=["--set", f"broker.failure_domain={domain}", "--set", f"broker.tags.zone=z-{domain}"],
            )
        c.wait_ready(timeout=120)
        yield c
    finally:
        c.stop()


def test_a_group_spreads_over_domains_and_a_dead_domain_fails_over_to_the_standbys(
    cluster: LocalCluster,
) -> None:
    c = cluster
    leader = c.leader()
    assert leader is not None
    r = httpx.put(
        f"{leader.http}/v1/namespaces/{NS}/anti-affinity",
        json={"group": "Spread"},
        headers=c.auth_headers(),
        timeout=10,
    )
    assert r.status_code == 200, r.text
    domain_of = {c.node(name).broker: d for name, d in DOMAINS.items()}

    # One lookup at a time, each seeing the previous ones Owned: the next lookup may go to another agent,
    # so every agent's replica must have applied the Owned record first (else it counts the group without
    # it and may put two of its bundles on one broker -- a race of concurrent assignments, not this test's).
    def owned_everywhere(b: str) -> bool:
        return all(c.ownership(via=c.node(n)).get(b, {}).get("state") == "owned" for n in DOMAINS)

    bundles = list(BundleLayout.default(NS, BUNDLES).bundles)
    for b in bundles:
        wait_for(
            lambda b=b: c.lookup(topic_in(b)).get("state") == "owned",  # type: ignore[misc]
            timeout=30,
            message=f"{b} assigned and owned",
        )
        wait_for(lambda b=b: owned_everywhere(b), timeout=30, message=f"every agent sees {b} owned")  # type: ignore[misc]
    owners = {b: c.ownership()[b]["dst"] for b in bundles}
    assert sorted(owners.values()) == sorted(domain_of), owners  # one bundle per broker
    assert sorted(domain_of[o] for o in owners.values()) == ["d1", "d1", "d2", "d2"]

    # Warm standbys: each bundle pre-warmed by a broker of the other zone.
    # A bundle's standby can move between the two brokers of the other zone as their loads change (the
    # leader recomputes standbys every placement.standby_interval_s); both then hold it pre-warmed.
    def standbys() -> dict[str, set[str]] | None:
        found: dict[str, set[str]] = {}
        for n in c.agents:
            for b in c.get(n, "/v1/sim/state").get("prewarmed", []):
                if b in owners:
                    found.setdefault(b, set()).add(n.broker)
        return found if len(found) == len(bundles) else None

    wait_for(standbys, timeout=30, message="every bundle of the group has a pre-warmed standby")

    standby = standbys()
    assert standby is not None
    for b, ss in standby.items():
        assert all(domain_of[x] != domain_of[owners[b]] for x in ss), (b, ss, owners[b])

    # Kill domain d1 at once.
    for name, domain in DOMAINS.items():
        if domain == "d1":
            c.kill(name, signal.SIGKILL)
    survivors = {b for b, d in domain_of.items() if d == "d2"}

    def moved() -> dict[str, str] | None:
        own = c.ownership(via=leader)
        now = {b: own.get(b, {}).get("dst") for b in bundles}
        done = all(own.get(b, {}).get("state") == "owned" and now[b] in survivors for b in bundles)
        return now if done else None

    final = wait_for(moved, timeout=60, message="the group's bundles are owned by the surviving domain")
    for b in bundles:
        if domain_of[owners[b]] == "d1":
            assert final[b] in standby[b], f"{b} should have failed over to a standby {standby[b]}: {final}"
        else:
            assert final[b] == owners[b]
