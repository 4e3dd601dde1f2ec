"""Namespaces by policy and per-client lookup limits (docs/security.md, "Namespaces and lookup limits"),
in-process: a real ZooKeeper server, the in-memory channel, agents (each beside its simulated broker) and
controllers built by the production wiring, on real HTTP ports; the admin CLI as a real subprocess.
Synchronisation is by waiting on conditions with deadlines.

* The attack this answers: lookups of topics in namespaces nobody created answer 404 naming the namespace
  and how an operator creates it, are counted, and write nothing -- no znode, no channel record -- while a
  namespace that ``namespace.auto_create`` allows is created by its first lookup.
* Operators list, create and delete namespaces through the controller's API: deleting removes the znode
  first (an agent that had cached the layout learns of it from ZooKeeper's watch and answers 404 from
  then on), then unloads every bundle it owned; a repeated delete cleans up what the channel still gives
  a broker (a namespace whose znode went while bundles stayed owned), then answers 404.
* The same through ``trimtab admin namespaces list|create|delete``, sent to a follower that redirects the
  writes to the leader.
* A lookup flood from one client address gets 429s (with ``Retry-After``) while another address is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from kazoo.client import KazooClient
from prometheus_client import CollectorRegistry

from tests.integration.test_admin_moves import channel_size, leading, running_controller
from tests.integration.test_agent_inprocess import agent_settings, running_agent, until
from tests.support.memory_log import memory_log
from trimtab.agent.wiring import WiredAgent
from trimtab.channel.memory import MemoryLog
from trimtab.channel.records import State
from trimtab.channel.table import TableView
from trimtab.cluster.zk import ZkPaths
from trimtab.config.settings import Settings
from trimtab.controller.daemon import Controller
from trimtab.devkit.bench.lookup import topics_per_bundle

pytestmark = pytest.mark.integration


def settings_for(zk_hosts: str, **sections: Any) -> Settings:
    """As in production, lookups create no namespace (``namespace.auto_create`` empty) unless a test says
    otherwise; agents keep a layout cached for a minute, so that only ZooKeeper's deletion watch can make
    them forget a deleted namespace's layout within a test; only the tests move bundles."""
    base: dict[str, Any] = {
        "namespace": {"auto_create": []},
        "agent": {"lookup_cache_s": 60.0},
        "healing": {"safe_mode_settle_s": 0},
        "shedding": {"enabled": False},
    }
    for k, v in sections.items():
        base[k] = {**base.get(k, {}), **v}
    return agent_settings(zk_hosts, **base)


def znode(zk: KazooClient, s: Settings, namespace: str) -> bool:
    return zk.exists(f"{ZkPaths(s.zk_path).namespaces}/{namespace}") is not None


def records_of(log: MemoryLog, s: Settings, prefix: str) -> list[bytes]:
    """Channel messages whose key is a bundle under ``prefix`` (a tenant/ or a namespace/)."""
    return [m.key for m in log.messages(s.kafka.channel_topic) if m.key and m.key.startswith(prefix.encode())]


def states(table: TableView, bundles: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for b in bundles:
        rec = table.get(b)
        out[b] = rec.state.value if rec is not None else None
    return out


def lookups_counted(w: WiredAgent, result: str) -> float:
    return w.prom.get_sample_value("trimtab_lookups_total", {"result": result}) or 0.0


# ---------------------------------------------------------------------------------------------- lookups


def test_a_lookup_creates_only_the_namespaces_the_policy_allows(zk_hosts: str, zk: KazooClient) -> None:
    s = settings_for(zk_hosts, namespace={"auto_create": ["public/*"]})
    log = memory_log(s)

    async def scenario() -> None:
        async with (
            running_agent(s, log) as w,
            httpx.AsyncClient(base_url=w.identity.http_url, timeout=30) as http,
        ):
            before = channel_size(log, s)
            # The attack: 20 lookups of topics in namespaces nobody created.
            for i in range(20):
                r = await http.get("/v1/lookup", params={"topic": f"persistent://sectest-tenant/ns-{i}/t"})
                assert r.status_code == 404, r.text
                body = r.json()
                assert set(body) == {"error", "retryable"} and body["retryable"] is False, body
                assert f"namespace sectest-tenant/ns-{i} does not exist" in body["error"], body
                assert f"trimtab admin namespaces create sectest-tenant/ns-{i}" in body["error"], body
            assert zk.exists(f"{ZkPaths(s.zk_path).namespaces}/sectest-tenant") is None, "no znode"
            assert channel_size(log, s) == before and not records_of(log, s, "sectest-tenant/"), "no record"
            assert lookups_counted(w, "namespace_not_found") == 20
            assert w.lookups.layouts.cached() == {}, "nothing is cached for a namespace that does not exist"

            # A name that is not one is refused before ZooKeeper is asked.
            r = await http.get("/v1/lookup", params={"topic": "persistent://bad tenant/ns/t"})
            assert r.status_code == 400 and r.json()["retryable"] is False, r.text

            # The allow-list lets public/* be created by its first lookup, as before.
            r = await http.get("/v1/lookup", params={"topic": "persistent://public/orders/t"})
            assert r.status_code == 200, r.text
            assert r.json()["owner"] == w.identity.id and r.json()["how"] == "assigned"
            assert znode(zk, s, "public/orders")
            # ... but a tenant that merely starts like it is not: the glob is matched part by part.
            r = await http.get("/v1/lookup", params={"topic": "persistent://public2/orders/t"})
            assert r.status_code == 404, r.text
            assert lookups_counted(w, "namespace_not_found") == 21

    asyncio.run(scenario())


def test_a_lookup_flood_from_one_client_is_limited_while_another_is_served(zk_hosts: str) -> None:
    rate, burst = 0.5, 10
    s = settings_for(
        zk_hosts,
        namespace={"auto_create": ["public/*"]},
        agent={"lookup_rate_per_client": rate, "lookup_burst_per_client": burst},
    )
    log = memory_log(s)
    topic = "persistent://public/flood/t"

    def client_from(address: str, base: str) -> httpx.AsyncClient:
        """Requests from ``address`` (any 127.x address is this machine's): another client for the agent."""
        return httpx.AsyncClient(
            base_url=base, timeout=30, transport=httpx.AsyncHTTPTransport(local_address=address)
        )

    async def scenario() -> None:
        async with (
            running_agent(s, log) as w,
            client_from("127.0.0.2", w.identity.http_url) as flood,
            client_from("127.0.0.3", w.identity.http_url) as other,
        ):
            t0 = time.monotonic()
            answers = [await flood.get("/v1/lookup", params={"topic": topic}) for _ in range(3 * burst)]
            elapsed = time.monotonic() - t0
            ok = [r for r in answers if r.status_code == 200]
            limited = [r for r in answers if r.status_code == 429]
            assert len(ok) + len(limited) == len(answers), [r.status_code for r in answers]
            assert answers[:burst] == ok[:burst], "the first burst passes"
            assert burst <= len(ok) <= burst + rate * elapsed + 1, (len(ok), elapsed)
            for r in limited:
                body = r.json()
                assert set(body) == {"error", "retryable"} and body["retryable"] is True, body
                assert "too many lookups from 127.0.0.2" in body["error"], body
                assert int(r.headers["retry-after"]) >= 1
            assert lookups_counted(w, "rate_limited") == len(limited)

            # Another address is served meanwhile, and the flooding one still is not.
            r = await other.get("/v1/lookup", params={"topic": topic})
            assert r.status_code == 200, r.text
            assert (await flood.get("/v1/lookup", params={"topic": topic})).status_code == 429

    asyncio.run(scenario())


# ---------------------------------------------------------------------------------------------- the admin API


@dataclass
class Plane:
    """A leading controller, one agent, and HTTP clients on both."""

    ctl: Controller
    a: WiredAgent
    http: httpx.AsyncClient  # the controller
    agent: httpx.AsyncClient
    prom: CollectorRegistry

    async def lookup(self, topic: str) -> httpx.Response:
        return await self.agent.get("/v1/lookup", params={"topic": topic})

    async def owned(self, topics: dict[str, str]) -> None:
        """Look one topic of each bundle up, and wait until the controller sees them all owned."""
        for topic in topics.values():
            r = await self.lookup(topic)
            assert r.status_code == 200, r.text
        await until(
            lambda: set(states(self.ctl.channel.table, list(topics)).values()) == {"owned"},
            what="the controller sees every bundle owned",
        )


@contextlib.asynccontextmanager
async def plane(s: Settings, log: MemoryLog) -> AsyncIterator[Plane]:
    prom = CollectorRegistry()
    async with (
        running_controller(s, log, prom) as ctl,
        running_agent(s, log) as a,
        httpx.AsyncClient(base_url=ctl.election.http_url, timeout=30) as http,
        httpx.AsyncClient(base_url=a.identity.http_url, timeout=30) as agent,
    ):
        await leading(ctl)
        await until(lambda: a.identity.id in ctl.registry.brokers, what="the controller sees the agent")
        yield Plane(ctl, a, http, agent, prom)


def test_namespaces_are_created_listed_and_deleted_through_the_admin_api(
    zk_hosts: str, zk: KazooClient
) -> None:
    s = settings_for(zk_hosts)
    log = memory_log(s)
    ns, bundles = "ops/orders", 8
    topics = topics_per_bundle(ns, bundles)
    names = list(topics)

    async def scenario() -> None:
        async with plane(s, log) as p:
            ctl, a, http = p.ctl, p.a, p.http
            # Nobody created it, and lookups may not.
            assert (await p.lookup(topics[names[0]])).status_code == 404

            # Create: a dry run creates nothing; bad requests are refused before ZooKeeper is asked.
            body = {"tenant": "ops", "namespace": "orders", "bundles": bundles}
            r = await http.post("/v1/admin/namespaces", json={**body, "dry_run": True})
            assert r.status_code == 200 and r.json() == {"namespace": ns, "bundles": names, "dry_run": True}
            assert not znode(zk, s, ns)
            for bad, why in (
                ({**body, "bundles": 129}, "between 1 and 128"),
                ({**body, "bundles": 0}, ""),
                ({**body, "tenant": "a b"}, "holds ' '"),
                ({**body, "namespace": "x" * 129}, "at most 128"),
                ({**body, "namespace": "-x"}, "must start with a letter or a digit"),
            ):
                r = await http.post("/v1/admin/namespaces", json=bad)
                assert r.status_code == 400 and why in r.json()["error"], (bad, r.text)
            r = await http.post("/v1/admin/namespaces", json=body)
            assert r.status_code == 201 and r.json() == {"namespace": ns, "bundles": names, "dry_run": False}
            assert znode(zk, s, ns)
            r = await http.post("/v1/admin/namespaces", json=body)
            assert r.status_code == 409 and "exists already" in r.json()["error"], r.text

            # Its topics are assigned by lookups, as any unowned bundle.
            await p.owned(topics)
            r = await http.get("/v1/namespaces")
            assert r.status_code == 200 and r.json() == {
                "namespaces": {ns: {"bundles": bundles, "owned": bundles}},
                "count": 1,
            }, r.text

            # A dry-run delete says what it would unload and changes nothing.
            size = channel_size(log, s)
            r = await http.delete(f"/v1/admin/namespaces/{ns}", params={"dry_run": "true"})
            assert r.status_code == 200, r.text
            assert r.json() == {**deleted(ns, names), "dry_run": True}
            assert znode(zk, s, ns) and channel_size(log, s) == size

            # Delete: the znode goes, then every bundle is unloaded (and freed by its owner).
            r = await http.delete(f"/v1/admin/namespaces/{ns}")
            assert r.status_code == 200 and r.json() == deleted(ns, names), r.text
            assert not znode(zk, s, ns)
            await until(
                lambda: set(states(a.channel.table, names).values()) == {"free"},
                what="the agent sees every bundle freed",
            )
            # The agent had the layout cached (for a minute): ZooKeeper's watch made it forget it, so no
            # lookup takes a bundle back.
            for topic in topics.values():
                r = await p.lookup(topic)
                assert r.status_code == 404 and f"namespace {ns} does not exist" in r.json()["error"], r.text
            assert set(states(ctl.channel.table, names).values()) == {"free"}
            r = await http.get("/v1/namespaces")
            assert r.json() == {"namespaces": {}, "count": 0}

            # Nothing left: 404.
            r = await http.delete(f"/v1/admin/namespaces/{ns}")
            assert r.status_code == 404 and r.json()["retryable"] is False, r.text
            counted = {"op": "namespace_delete", "result": "ok"}
            assert p.prom.get_sample_value("trimtab_admin_requests_total", counted) == 1

    asyncio.run(scenario())


def deleted(ns: str, unloaded: list[str], existed: bool = True) -> dict[str, Any]:
    """The answer of a real delete that unloaded ``unloaded`` with nothing in flight."""
    return {
        "namespace": ns,
        "dry_run": False,
        "existed": existed,
        "unloaded": unloaded,
        "in_flight": {},
        "failed": {},
    }


def test_a_repeated_delete_unloads_what_the_channel_still_gives_a_broker(
    zk_hosts: str, zk: KazooClient
) -> None:
    """A namespace whose znode went while its bundles stayed owned -- what a lookup racing a delete, or an
    agent cut off from ZooKeeper, could leave: a delete unloads them, then answers 404."""
    s = settings_for(zk_hosts)
    log = memory_log(s)
    ns = "ops/jobs"
    topics = topics_per_bundle(ns, s.namespace.default_bundles)

    async def scenario() -> None:
        async with plane(s, log) as p:
            r = await p.http.post("/v1/admin/namespaces", json={"tenant": "ops", "namespace": "jobs"})
            assert r.status_code == 201, r.text
            await p.owned(topics)
            zk.delete(f"{ZkPaths(s.zk_path).namespaces}/{ns}")
            r = await p.http.delete(f"/v1/admin/namespaces/{ns}")
            assert r.status_code == 200 and r.json() == deleted(ns, list(topics), existed=False), r.text
            await until(
                lambda: set(states(p.ctl.channel.table, list(topics)).values()) == {"free"},
                what="its bundles freed",
            )
            assert (await p.http.delete(f"/v1/admin/namespaces/{ns}")).status_code == 404

    asyncio.run(scenario())


# ---------------------------------------------------------------------------------------------- the CLI


async def admin_cli(*args: str, url: str) -> tuple[int, str, str]:
    """``trimtab admin --url URL ARGS`` as a subprocess: (exit code, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMTAB_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "trimtab.cli",
        "admin",
        "--url",
        url,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def test_the_admin_cli_lists_creates_and_deletes_namespaces_through_a_follower(
    zk_hosts: str, zk: KazooClient
) -> None:
    s = settings_for(zk_hosts)
    log = memory_log(s)
    ns = "cli/ns"
    topics = topics_per_bundle(ns, 2)

    async def scenario() -> None:
        async with (
            running_controller(s, log) as leader,
            running_agent(s, log) as a,
            httpx.AsyncClient(base_url=a.identity.http_url, timeout=30) as agent,
        ):
            await leading(leader)
            async with running_controller(s, log) as follower:
                await until(lambda: a.identity.id in follower.registry.brokers, what="the follower is warm")
                assert not follower.leadership.is_leader
                url = follower.election.http_url

                # A follower redirects the writes; the CLI follows to the leader.
                async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                    r = await http.post("/v1/admin/namespaces", json={"tenant": "cli", "namespace": "ns"})
                    assert r.status_code == 307, r.text
                    assert r.headers["location"] == leader.election.http_url + "/v1/admin/namespaces"
                    r = await http.delete(f"/v1/admin/namespaces/{ns}")
                    assert r.status_code == 307, r.text
                assert not znode(zk, s, ns)

                code, out, err = await admin_cli("namespaces", "create", ns, "--bundles", "2", url=url)
                assert code == 0, err
                assert "created" in out and f"{ns}/0x00000000_0x80000000" in out, out
                assert znode(zk, s, ns)
                code, out, err = await admin_cli("namespaces", "create", ns, url=url)
                assert code == 1 and "exists already" in err, (code, err)
                code, out, err = await admin_cli("namespaces", "create", "no-slash", url=url)
                assert code == 2 and "not a namespace TENANT/NS" in err, (code, err)

                for topic in topics.values():
                    assert (await agent.get("/v1/lookup", params={"topic": topic})).status_code == 200
                await until(
                    lambda: set(states(follower.channel.table, list(topics)).values()) == {"owned"},
                    what="the follower sees both bundles owned",
                )
                code, out, err = await admin_cli("-o", "json", "namespaces", "list", url=url)
                assert code == 0, err
                assert json.loads(out) == {"namespaces": {ns: {"bundles": 2, "owned": 2}}, "count": 1}
                code, out, err = await admin_cli("namespaces", "list", url=url)
                assert code == 0 and ns in out and "1 namespace" in out, (out, err)

                size = channel_size(log, s)
                code, out, err = await admin_cli("namespaces", "delete", ns, "--dry-run", url=url)
                assert code == 0, err
                assert "would unload" in out and "2 bundles" in out, out
                assert znode(zk, s, ns) and channel_size(log, s) == size

                code, out, err = await admin_cli("-o", "json", "namespaces", "delete", ns, url=url)
                assert code == 0, err
                assert json.loads(out)["unloaded"] == list(topics), out
                assert not znode(zk, s, ns)
                await until(
                    lambda: set(states(a.channel.table, list(topics)).values()) == {"free"},
                    what="both bundles freed",
                )
                code, out, err = await admin_cli("namespaces", "delete", ns, url=url)
                assert code == 1 and f"namespace {ns} does not exist" in err, (code, err)
                assert all(
                    rec is None or rec.state is State.FREE for rec in map(a.channel.table.get, topics)
                ), "nothing was assigned again"

    asyncio.run(scenario())
