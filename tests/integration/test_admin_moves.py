"""Operators' moves through the controller's HTTP API, in-process: a real ZooKeeper server, the in-memory
channel, a controller built by the production wiring and running its whole lifecycle, and agents (each
beside its simulated broker) built by :func:`trimtab.agent.wiring.build` -- real HTTP servers on free
ports, one event loop, no subprocesses. Synchronisation is by waiting on conditions with deadlines.

* Dry runs of transfer, unload and split publish nothing and say what would be published; each refusal is
  exactly the real call's (404 unknown, 409 not owned, 400 bad destination, 409 placement); a follower
  answers a dry run itself and redirects the real call to the leader.
* Drain: the broker's agent marks itself draining and keeps running, registered as draining; the leader
  moves every bundle it owns to another agent as an operation, which ends ``done`` (``/v1/admin/ops``); a
  dry run moves nothing and says where each bundle would go; a second drain is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import pytest
from kazoo.client import KazooClient
from prometheus_client import CollectorRegistry

from tests.integration.test_agent_inprocess import (
    NS,
    agent_settings,
    layout,
    owned_by,
    running_agent,
    started,
    topic_of,
    until,
)
from trimtab.agent.wiring import WiredAgent
from trimtab.balance.assign import BrokerInfo
from trimtab.channel.bundles import parse_bundle
from trimtab.channel.memory import MemoryLog, MemoryTransport
from trimtab.channel.records import State
from trimtab.cluster.placement.store import IsolationPolicies, IsolationPolicyDoc, PlacementStore
from trimtab.cluster.zk import ZkPaths
from trimtab.config.settings import Settings
from trimtab.controller.daemon import Controller
from trimtab.controller.wiring import build_controller

pytestmark = pytest.mark.integration

UNKNOWN = f"{NS}/0x00000000_0x00000001"  # a valid name nobody ever used


@pytest.fixture
def settings(zk_hosts: str) -> Settings:
    # Only the tests move bundles; the controller decides at once (no settling after connecting).
    return agent_settings(zk_hosts, healing={"safe_mode_settle_s": 0}, shedding={"enabled": False})


@contextlib.asynccontextmanager
async def running_controller(
    s: Settings, log: MemoryLog, prom: CollectorRegistry | None = None
) -> AsyncIterator[Controller]:
    """A controller built by the wiring, its lifecycle running as a task; stopped at the end."""
    ctl = build_controller(s, transport=MemoryTransport(log), prom=prom or CollectorRegistry())
    task = asyncio.create_task(ctl.run(), name="controller")
    try:
        await started(task, lambda: ctl.liveness.ready, "the controller to be warm")
        yield ctl
    finally:
        ctl.stop_event.set()
        await asyncio.wait_for(task, 30)


async def leading(ctl: Controller) -> None:
    await until(
        lambda: ctl.leadership.is_leader and ctl.leadership.safe_mode() is None, 30, "the controller to lead"
    )


def channel_size(log: MemoryLog, s: Settings) -> int:
    return len(log.messages(s.kafka.channel_topic))


def registration(zk: KazooClient, s: Settings, broker: str) -> BrokerInfo | None:
    path = ZkPaths(s.zk_path).broker(broker)
    if zk.exists(path) is None:
        return None
    return msgspec.json.decode(zk.get(path)[0], type=BrokerInfo)


async def assign(w: WiredAgent, bundle: str) -> str:
    """Look a topic of ``bundle`` up on agent ``w``; the owner it names."""
    return (await asyncio.wait_for(w.lookups.lookup(topic_of(bundle)), 15)).owner


async def same_refusal(http: httpx.AsyncClient, path: str, body: dict[str, Any], status: int) -> str:
    """The real call and its dry run are refused alike, with ``status``; returns the message."""
    real = await http.post(path, json=body)
    dry = await http.post(path, json={**body, "dry_run": True})
    assert real.status_code == status, (path, body, real.status_code, real.text)
    assert (dry.status_code, dry.json()) == (real.status_code, real.json()), (path, body, dry.text)
    message: str = real.json()["error"]
    return message


@dataclass
class Cluster:
    """A leading controller, two agents (a and b) and an HTTP client on the controller."""

    ctl: Controller
    a: WiredAgent
    b: WiredAgent
    http: httpx.AsyncClient
    prom: CollectorRegistry

    @property
    def ids(self) -> set[str]:
        return {self.a.identity.id, self.b.identity.id}

    def other(self, broker: str) -> str:
        return next(iter(self.ids - {broker}))

    def owned(self, bundle: str, broker: str) -> bool:
        return owned_by_in(self.ctl.channel.table, bundle, broker)

    async def assign(self, *bundles: str) -> dict[str, str]:
        """Assign ``bundles`` (lookups on agent a) and wait until the controller sees them owned."""
        owners = {x: await assign(self.a, x) for x in bundles}
        await until(
            lambda: all(self.owned(x, o) for x, o in owners.items()), what="the controller sees them owned"
        )
        return owners


@contextlib.asynccontextmanager
async def cluster(s: Settings, log: MemoryLog) -> AsyncIterator[Cluster]:
    prom = CollectorRegistry()
    async with (
        running_controller(s, log, prom) as ctl,
        running_agent(s, log) as a,
        running_agent(s, log) as b,
        httpx.AsyncClient(base_url=ctl.election.http_url, timeout=30) as http,
    ):
        await leading(ctl)
        c = Cluster(ctl, a, b, http, prom)
        await until(lambda: set(ctl.registry.brokers) == c.ids, what="the controller sees both agents")
        await until(lambda: set(a.registry.brokers) == c.ids, what="agent a sees both agents")
        yield c


# ---------------------------------------------------------------------------------------------- dry runs


def test_dry_runs_publish_nothing_and_say_what_would_be_published(settings: Settings, log: MemoryLog) -> None:
    s = settings
    moved, split_me = layout().bundles[:2]

    async def scenario() -> None:
        async with cluster(s, log) as c:
            owners = await c.assign(moved, split_me)
            src = owners[moved]
            dst = c.other(src)
            rec = c.ctl.channel.table.get(moved)
            assert rec is not None
            size = channel_size(log, s)

            # A dry-run transfer: the record it would publish, and why it may.
            r = await c.http.post(
                "/v1/admin/transfer", json={"bundle": moved, "broker": dst, "dry_run": True}
            )
            assert r.status_code == 200, r.text
            out = r.json()
            want = {"state": "releasing", "src": src, "dst": dst, "version": rec.version + 1}
            assert (out["bundle"], out["dry_run"], out["would"]) == (moved, True, want)
            assert f"owned by {src}" in out["why"] and "placement allows" in out["why"], out["why"]

            # A dry-run unload: no destination; the next lookup chooses among the candidates.
            r = await c.http.post("/v1/admin/unload", json={"bundle": moved, "dry_run": True})
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["would"] == {**want, "dst": None}
            assert "next lookup assigns it to one of" in out["why"] and dst in out["why"], out["why"]

            # A dry-run split: the owner's agent computes the children and publishes nothing.
            ns, rng = parse_bundle(split_me)
            mid = rng.lower + (rng.upper - rng.lower) // 2
            body = {"bundle": split_me, "boundaries": [f"{mid:#010x}"], "dry_run": True}
            r = await c.http.post("/v1/admin/split", json=body)
            assert r.status_code == 200, r.text
            children = [f"{ns}/{rng.lower:#010x}_{mid:#010x}", f"{ns}/{mid:#010x}_{rng.upper:#010x}"]
            assert r.json() == {"bundle": split_me, "children": children, "reason": "admin", "dry_run": True}

            assert channel_size(log, s) == size, "a dry run publishes nothing"
            assert c.ctl.channel.table.get(moved) == rec and c.owned(split_me, owners[split_me])
            counted = {"op": "transfer", "result": "dry_run"}
            assert c.prom.get_sample_value("trimtab_admin_requests_total", counted) == 1

    asyncio.run(scenario())


def test_dry_runs_are_refused_exactly_like_the_real_calls(settings: Settings, log: MemoryLog) -> None:
    s = settings
    moved = layout().bundles[0]
    transfer, unload = "/v1/admin/transfer", "/v1/admin/unload"

    async def scenario() -> None:
        async with cluster(s, log) as c:
            src = (await c.assign(moved))[moved]
            dst = c.other(src)
            size = channel_size(log, s)
            http = c.http
            assert "already owned by" in await same_refusal(
                http, transfer, {"bundle": moved, "broker": src}, 400
            )
            assert "not a live broker" in await same_refusal(
                http, transfer, {"bundle": moved, "broker": "127.0.0.1:1"}, 400
            )
            assert "is not owned" in await same_refusal(
                http, transfer, {"bundle": UNKNOWN, "broker": dst}, 404
            )
            assert "is not owned" in await same_refusal(http, unload, {"bundle": UNKNOWN}, 404)
            await same_refusal(http, unload, {"bundle": "not a bundle"}, 400)
            assert "no live owner" in await same_refusal(
                http, "/v1/admin/split", {"bundle": UNKNOWN, "boundaries": []}, 409
            )
            assert channel_size(log, s) == size, "refusals publish nothing"

            # Not owned (unloaded: Free): 409 either way.
            r = await http.post(unload, json={"bundle": moved})
            assert r.status_code == 202 and r.json()["record"]["state"] == "releasing", r.text
            table = c.ctl.channel.table
            await until(
                lambda: (x := table.get(moved)) is not None and x.state is State.FREE, what="the bundle Free"
            )
            size = channel_size(log, s)
            assert "state free" in await same_refusal(http, transfer, {"bundle": moved, "broker": dst}, 409)
            assert "state free" in await same_refusal(http, unload, {"bundle": moved}, 409)
            assert channel_size(log, s) == size

    asyncio.run(scenario())


def test_a_placement_refusal_is_the_same_for_a_dry_run(
    settings: Settings, log: MemoryLog, zk: KazooClient
) -> None:
    s = settings
    fenced = layout().bundles[0]
    transfer = "/v1/admin/transfer"

    async def scenario() -> None:
        async with cluster(s, log) as c:
            owner = (await c.assign(fenced))[fenced]
            other = c.other(owner)
            # An isolation policy that allows no live broker for the namespace.
            nowhere = IsolationPolicies(
                policies={"nowhere": IsolationPolicyDoc(namespaces=[NS], primary=["nobody-here"])}
            )
            PlacementStore(zk, ZkPaths(s.zk_path)).update("isolation", lambda _old: nowhere)

            async def placement_refuses() -> bool:
                body = {"bundle": fenced, "broker": other, "dry_run": True}
                return (await c.http.post(transfer, json=body)).status_code == 409

            await until_async(placement_refuses, what="the controller applying the policy")
            size = channel_size(log, s)
            msg = await same_refusal(c.http, transfer, {"bundle": fenced, "broker": other}, 409)
            assert "placement forbids" in msg and "'nowhere'" in msg, msg
            msg = await same_refusal(c.http, "/v1/admin/unload", {"bundle": fenced}, 409)
            assert "placement forbids unloading" in msg, msg
            assert channel_size(log, s) == size and c.owned(fenced, owner)

    asyncio.run(scenario())


def test_a_follower_answers_a_dry_run_itself_and_redirects_the_real_call(
    settings: Settings, log: MemoryLog
) -> None:
    s = settings
    x = layout().bundles[0]

    async def scenario() -> None:
        async with (
            running_controller(s, log) as leader,
            running_agent(s, log) as a,
            running_agent(s, log) as b,
        ):
            await leading(leader)
            owner = await assign(a, x)
            dst = b.identity.id if owner == a.identity.id else a.identity.id
            async with running_controller(s, log) as follower:
                await until(
                    lambda: (
                        set(follower.registry.brokers) == {a.identity.id, b.identity.id}
                        and owned_by_in(follower.channel.table, x, owner)
                    ),
                    what="the follower's replica caught up",
                )
                assert not follower.leadership.is_leader
                body = {"bundle": x, "broker": dst}
                async with httpx.AsyncClient(base_url=follower.election.http_url, timeout=30) as http:
                    r = await http.post("/v1/admin/transfer", json={**body, "dry_run": True})
                    assert r.status_code == 200 and r.json()["would"]["dst"] == dst, r.text
                    size = channel_size(log, s)
                    r = await http.post("/v1/admin/transfer", json=body)  # not followed
                    assert r.status_code == 307, r.text
                    assert r.headers["location"] == leader.election.http_url + "/v1/admin/transfer"
                    assert channel_size(log, s) == size

    asyncio.run(scenario())


# ---------------------------------------------------------------------------------------------- drain


def test_drain_moves_every_bundle_off_the_agent_which_keeps_running_as_draining(
    settings: Settings, log: MemoryLog, zk: KazooClient
) -> None:
    s = settings
    owned = layout().bundles[:3]
    later = layout().bundles[3]

    async def scenario() -> None:
        async with running_controller(s, log) as ctl, running_agent(s, log) as a:
            await leading(ctl)
            me = a.identity.id
            for x in owned:  # the only broker yet: it gets them all
                assert await assign(a, x) == me
            sim = a.sim
            assert sim is not None
            await until(lambda: set(owned) <= sim.serving, what="a serving its bundles")
            async with running_agent(s, log) as b:
                peer = b.identity.id
                both = {me, peer}
                await until(lambda: set(ctl.registry.brokers) == both, what="the controller sees both")
                await until(lambda: set(a.registry.brokers) == both, what="a sees b")
                size = channel_size(log, s)
                async with httpx.AsyncClient(base_url=ctl.election.http_url, timeout=30) as http:
                    # Dry run: where each bundle would go; nothing moves, nothing is marked.
                    r = await http.post("/v1/admin/drain", json={"broker": me, "dry_run": True})
                    assert r.status_code == 200, r.text
                    plan = r.json()
                    assert (plan["broker"], plan["dry_run"], plan["count"]) == (me, True, len(owned))
                    assert plan["planned_by"] == "leader"  # the operation's moves, not the agent's own plan
                    assert {k: v["dst"] for k, v in plan["bundles"].items()} == dict.fromkeys(owned, peer)
                    assert channel_size(log, s) == size
                    assert not a.agent.draining and not a.drainer.draining
                    reg = registration(zk, s, me)
                    assert reg is not None and not reg.draining

                    assert "not a live broker" in await same_refusal(
                        http, "/v1/admin/drain", {"broker": "127.0.0.1:1"}, 404
                    )

                    # The drain: accepted at once; the agent marks itself draining and the leader moves
                    # everything to b as an operation; the agent stays up.
                    r = await http.post("/v1/admin/drain", json={"broker": me})
                    assert r.status_code == 202, r.text
                    want = {"broker": me, "dry_run": False, "draining": True, "by": "leader_operation"}
                    answer = r.json()
                    assert answer["agent"].items() >= {**want, "owned_at_start": len(owned)}.items(), r.text
                    await drain_operation_done(ctl, http, answer["operation"], len(owned))
                    assert all(owned_by(b, x, peer) for x in owned)
                    await until(lambda: not sim.serving and not sim.fenced, what="a closed them all")

                    # Still running, still registered -- as draining; nothing new comes here.
                    assert a.agent.ready and a.registry.registered
                    reg = registration(zk, s, me)
                    assert reg is not None and reg.draining
                    await until(
                        lambda: (i := ctl.registry.brokers.get(me)) is not None and i.draining,
                        what="the controller sees a draining",
                    )
                    assert await assign(a, later) == peer
                    async with httpx.AsyncClient(base_url=a.identity.http_url, timeout=30) as agent_http:
                        st = (await agent_http.get("/v1/status")).json()
                    done = {"draining": True, "by": "leader_operation", "owned": 0, "in_flight": 0}
                    assert st["draining"] is True and st["drain"].items() >= done.items(), st

                    # A second drain, and its dry run, are refused.
                    msg = await same_refusal(http, "/v1/admin/drain", {"broker": me}, 409)
                    assert "draining already" in msg, msg

    asyncio.run(scenario())


async def drain_operation_done(ctl: Controller, http: httpx.AsyncClient, op: dict[str, Any], n: int) -> None:
    """The drain's operation ends done with every move made, as the ops API shows it."""
    assert (op["kind"], op["progress"]) == ("drain", {"done": 0, "total": n}), op
    await until(
        lambda: (o := ctl.operations.ops.get(op["id"])) is not None and o.state.terminal,
        30,
        "the drain operation to end",
    )
    shown = (await http.get(f"/v1/admin/ops/{op['id']}")).json()
    assert (shown["state"], shown["outcomes"]) == ("done", {"moved": n}), shown
    assert [o["id"] for o in (await http.get("/v1/admin/ops")).json()] == [op["id"]]


def test_the_agent_refuses_a_second_drain_while_the_first_runs(settings: Settings, log: MemoryLog) -> None:
    """Straight to the agent's own endpoint (the controller's 409 needs the registration seen first)."""

    async def scenario() -> None:
        async with (
            running_agent(settings, log) as a,
            httpx.AsyncClient(base_url=a.identity.http_url, timeout=30) as http,
        ):
            plan = (await http.post("/v1/admin/drain", json={"dry_run": True})).json()
            assert plan["bundles"] == {} and plan["count"] == 0
            first, second = await asyncio.gather(
                http.post("/v1/admin/drain", json={}), http.post("/v1/admin/drain", json={})
            )
            assert sorted([first.status_code, second.status_code]) == [202, 409]
            await until(lambda: a.agent.drain_status().get("result") == "complete", what="drained")
            assert a.agent.ready and a.agent.draining
            r = await http.post("/v1/admin/drain", json={"dry_run": True})
            assert r.status_code == 409, r.text

    asyncio.run(scenario())


# ---------------------------------------------------------------------------------------------- helpers


def owned_by_in(table: Any, bundle: str, broker: str) -> bool:
    rec = table.get(bundle)
    return rec is not None and rec.state is State.OWNED and rec.dst == broker


async def until_async(check: Any, timeout: float = 10.0, what: str = "") -> None:
    """Await the coroutine function ``check()`` returning True, re-checking every 20 ms."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for: {what}")
        await asyncio.sleep(0.02)


# ---------------------------------------------------------------------------------------------- maintenance


def test_maintenance_drains_before_the_deadline_keeps_the_broker_out_and_ends(
    settings: Settings, log: MemoryLog, zk: KazooClient
) -> None:
    """Issue 32 point 4: ``maintenance start`` drains the broker as an operation with a deadline and keeps
    it out of service; bad requests are refused with the reason and change nothing; ``maintenance end``
    returns it to service (its agent registers as not draining)."""
    s = settings
    owned = layout().bundles[:3]
    later = layout().bundles[3]

    async def scenario() -> None:
        async with running_controller(s, log) as ctl, running_agent(s, log) as a:
            await leading(ctl)
            me = a.identity.id
            for x in owned:
                assert await assign(a, x) == me
            async with running_agent(s, log) as b:
                peer = b.identity.id
                await until(lambda: set(ctl.registry.brokers) == {me, peer}, what="the controller sees both")
                await until(lambda: set(a.registry.brokers) == {me, peer}, what="a sees b")
                async with httpx.AsyncClient(base_url=ctl.election.http_url, timeout=30) as http:
                    for body, status, words in (
                        ({"broker": me, "deadline_s": 0}, 400, "positive"),
                        ({"broker": "127.0.0.1:1", "deadline_s": 60}, 404, "not a live broker"),
                    ):
                        r = await http.post("/v1/admin/maintenance", json=body)
                        assert r.status_code == status and words in r.json()["error"], r.text
                    assert (await http.get("/v1/admin/maintenance")).json() == {"brokers": {}}
                    r = await http.post(
                        "/v1/admin/maintenance",
                        json={"broker": me, "deadline_s": 60, "reason": "kernel upgrade"},
                    )
                    assert r.status_code == 202, r.text
                    op = r.json()["operation"]
                    assert (op["kind"], op["reason"], op["progress"]["total"]) == (
                        "maintenance",
                        "kernel upgrade",
                        len(owned),
                    )
                    await until(
                        lambda: (o := ctl.operations.ops.get(op["id"])) is not None and o.state.terminal,
                        30,
                        "the maintenance drain to end",
                    )
                    assert ctl.operations.ops[op["id"]].state.value == "done"
                    assert all(owned_by(b, x, peer) for x in owned)
                    listed = (await http.get("/v1/admin/maintenance")).json()["brokers"]
                    assert listed[me]["operation"] == op["id"] and listed[me]["reason"] == "kernel upgrade"
                    again = await http.post("/v1/admin/maintenance", json={"broker": me, "deadline_s": 60})
                    assert again.status_code == 409 and "already" in again.json()["error"], again.text
                    await until(
                        lambda: (i := ctl.registry.brokers.get(me)) is not None and i.draining,
                        what="the controller sees a draining",
                    )
                    assert await assign(a, later) == peer  # out of service: nothing new comes to it

                    r = await http.post(f"/v1/admin/maintenance/{me}/end")
                    assert r.status_code == 200, r.text
                    await until(
                        lambda: (reg := registration(zk, s, me)) is not None and not reg.draining,
                        what="a registered as not draining",
                    )
                    assert (await http.get("/v1/admin/maintenance")).json() == {"brokers": {}}
                    gone = await http.post(f"/v1/admin/maintenance/{me}/end")
                    assert gone.status_code == 404, gone.text

    asyncio.run(scenario())
