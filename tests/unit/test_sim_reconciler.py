"""The simulator's agents are the daemon's own: each broker's agent is the production ``Reconciler`` (with
its ``LeaseGuard``) and ``LookupService``, over the simulated broker, on the virtual loop. These tests prove
that those classes ran and decided, that the rule "no lease without a confirmed ZooKeeper session" comes
from the lease guard, that a killed or stopped agent's process does nothing more, and that the runs stay
byte-identical -- across string hash seeds too."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.unit.test_sim_jobs import document
from trimtab.agent.leases import LeaseGuard
from trimtab.agent.lookup import LookupService
from trimtab.agent.metrics import AgentMetrics
from trimtab.agent.ownjobs import OwnerJobs
from trimtab.agent.reconciler import Reconciler
from trimtab.agent.splits import SplitScheduler
from trimtab.channel.memory import MemoryTransport
from trimtab.channel.records import State, make
from trimtab.config.loader import load_settings
from trimtab.errors import LeaseUnavailable
from trimtab.sim import engine as engine_mod
from trimtab.sim.agents import Routes, SimSession
from trimtab.sim.clock import Process, VirtualLoop
from trimtab.sim.engine import Engine
from trimtab.sim.run import main_json, simulate
from trimtab.sim.scenario import Scenario, parse_scenario
from trimtab.sim.transport import SimTransport

ROOT = Path(__file__).resolve().parents[2]


def scenario(**over: Any) -> Scenario:
    """test_sim_jobs's small scenario, under legacy-uniform: its unloads are repaired by lookups."""
    return parse_scenario(document(**{"policies": ["legacy-uniform"], **over}))


#: Every kind of fault the engine models, in a run short enough to be run twice in a test: duplicated and
#: reordered records, racing lookups, a ZooKeeper outage longer than a lease, a Kafka outage, an agent
#: paused past its session, one killed, one drained and restarted, and unloads (legacy-uniform) that the
#: lookups repair.
FAULTS: dict[str, Any] = {
    "duration_s": 420,
    "events": [
        {"at_s": 60, "add_brokers": 2},
        {"at_s": 150, "zookeeper_outage": True, "duration_s": 15},
        {"at_s": 200, "kafka_outage": True, "duration_s": 10},
        {"at_s": 240, "pause": 1, "duration_s": 20},
        {"at_s": 300, "restart": 1, "down_s": 5},
        {"at_s": 340, "kill": 1},
    ],
    "faults": {"duplicate_p": 0.2, "reorder_p": 0.2, "race_p": 0.5},
    "policies": ["legacy-uniform", "transfer"],
}


# ------------------------------------------------------------------------------------------ the agents
def test_each_agent_is_the_production_reconciler_and_lookup_service(monkeypatch: pytest.MonkeyPatch) -> None:
    handled: Counter[str] = Counter()
    assigned: list[tuple[str, str]] = []
    real_handle, real_assign = Reconciler._handle, LookupService._assign

    async def handle(self: Reconciler, bundle: str) -> None:
        handled[self.me] += 1
        await real_handle(self, bundle)

    def assign(self: LookupService, bundle: str, cur: Any) -> None:
        assigned.append((self.me, bundle))
        real_assign(self, bundle, cur)

    monkeypatch.setattr(Reconciler, "_handle", handle)
    monkeypatch.setattr(LookupService, "_assign", assign)
    eng = Engine(scenario(), "legacy-uniform")
    run = eng.run()
    assert all(isinstance(b.agent.reconciler, Reconciler) for b in eng.brokers.values() if b.agent)
    assert all(isinstance(b.agent.lookups, LookupService) for b in eng.brokers.values() if b.agent)
    # Every broker's own reconciler took its bundles over (the initial ones, and the new brokers theirs).
    assert set(handled) == set(eng.brokers)
    # legacy-uniform unloads; the lookups of the unloaded bundles' clients reassigned them, each through
    # an agent's LookupService (a counter of the engine's own would not have gone through the spy).
    unloads = [m for m in run.moves if m.reason.startswith("shed")]
    assert unloads and assigned
    assert run.lookups["assigned"] == len(assigned)
    assert {b for _, b in assigned} <= {m.bundle for m in unloads}
    assert run.violations.total() == 0


def test_the_engine_keeps_no_reconciler_or_assignment_of_its_own() -> None:
    source = inspect.getsource(engine_mod)
    for needle in (
        "balance.roles",
        "plan(",
        "intents.place",
        "select_broker",
        "balance.assign import Assign",
    ):
        assert needle not in source, needle
    for gone in ("_mark", "_step", "_duration", "_assign", "_choose", "_changed"):
        assert not hasattr(Engine, gone), gone


def test_no_lease_is_granted_long_after_zookeeper_went_away(monkeypatch: pytest.MonkeyPatch) -> None:
    """A drain during a ZooKeeper outage: the destinations' acquires are refused by their LeaseGuard -- the
    rule the daemon follows -- once the last confirmation of their session is too old, and succeed after
    ZooKeeper is back. The same run with sessions that confirm regardless acquires during the outage: the
    check can fail."""
    outage = (100.0, 120.0)
    sc = scenario(
        events=[
            {"at_s": outage[0], "zookeeper_outage": True, "duration_s": outage[1] - outage[0]},
            {"at_s": 106, "remove_brokers": 1},
        ],
        policies=["none"],
        duration_s=200,
    )

    def acquires(confirm_always: bool) -> tuple[list[float], Counter[str]]:
        served: list[float] = []
        results: Counter[str] = Counter()
        real_serve, real_lease = Engine._serve, LeaseGuard.lease_for_acquire

        def serve(self: Engine, b: Any, bundle: str) -> None:
            served.append(self.now)
            real_serve(self, b, bundle)

        async def lease(self: LeaseGuard, limit: Any = lambda: float("inf")) -> Any:
            try:
                got = await real_lease(self, limit)
            except LeaseUnavailable:
                results["refused"] += 1
                raise
            results["granted"] += 1
            return got

        with monkeypatch.context() as m:
            m.setattr(Engine, "_serve", serve)
            m.setattr(LeaseGuard, "lease_for_acquire", lease)
            if confirm_always:
                m.setattr(SimSession, "confirm", lambda self, timeout_s, path="/": None)
            run = Engine(sc, "none").run()
        assert run.violations.total() == 0
        return served, results

    served, results = acquires(confirm_always=False)
    # The guard grants while the last confirmation allows half a lease (4 s here), then refuses.
    late = [t for t in served if outage[0] + 4.0 + 0.2 < t < outage[1]]
    assert results["refused"] > 0 and not late
    assert [t for t in served if t >= outage[1]]  # acquired once ZooKeeper is back
    served, results = acquires(confirm_always=True)
    assert results["refused"] == 0 and [t for t in served if outage[0] + 4.2 < t < outage[1]]


# ------------------------------------------------------------------------------------------ processes
def test_a_killed_process_does_nothing_more_and_leaves_no_half_cancelled_confirmation() -> None:
    """Kill -9 (or SIGSTOP) of an agent cancels every task of its process, wherever it was: an acquire
    half done is not done. The tasks go newest first, so a confirmation of the session that several
    acquires share is not left behind cancelled for the next caller once the process resumes."""

    class SlowRoundTrip(LeaseGuard):
        async def _confirm(self, epoch: int) -> None:
            await asyncio.sleep(0.1)  # a round trip to ZooKeeper, in virtual time
            await super()._confirm(epoch)

    loop = VirtualLoop()
    proc = Process(loop, "a")
    metrics = AgentMetrics.create(CollectorRegistry())
    session = SimSession(10.0, lambda: True)
    guard = SlowRoundTrip(session, lease_s=8.0, margin_s=2.0, metrics=metrics, mono=loop.time, wall=loop.time)
    done: list[str] = []

    async def acquire(name: str) -> None:
        await guard.lease_for_acquire()
        await asyncio.sleep(0.2)
        done.append(name)

    async def not_the_process() -> None:
        await asyncio.sleep(1.0)
        done.append("outside")

    def start() -> None:
        proc.spawn(acquire("a"))
        proc.spawn(acquire("b"))
        loop.create_task(not_the_process())

    loop.call_soon(start)
    loop.call_at(0.05, proc.kill)  # while both wait for the one confirmation they share
    loop.run_until(5.0)
    assert done == ["outside"] and not proc.tasks  # the other task was not the process's: it ran on
    loop.call_soon(lambda: proc.spawn(acquire("c")))
    loop.run_until(10.0)
    loop.close()
    assert done == ["outside", "c"]  # the guard confirms again for the resumed process


# ------------------------------------------------------------------------------------------ determinism
def test_routing_a_change_only_to_the_agents_it_can_concern_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine hands each channel change to the agents it can concern (:class:`Routes`); handing every
    change to every running agent, as each daemon hears it, gives the same run to the byte."""
    sc = scenario(**FAULTS)
    routed = main_json(simulate(sc)[0])

    def everyone(self: Routes, key: str, old: Any, new: Any) -> None:
        for agent in list(self.running.values()):
            agent.on_change(key, old, new)

    monkeypatch.setattr(Routes, "changed", everyone)
    assert main_json(simulate(sc)[0]) == routed


def test_a_change_goes_to_the_agents_it_names_serve_it_or_wait_for_it_in_start_order() -> None:
    heard: list[tuple[str, str]] = []

    class Agent:
        def __init__(self, me: str) -> None:
            self.me = me
            self.reconciler = SimpleNamespace(served=set())

        def on_change(self, key: str, old: Any, new: Any) -> None:
            heard.append((self.me, key))

    def serve(agent: Any, bundle: str, serving: bool = True) -> None:
        (agent.reconciler.served.add if serving else agent.reconciler.served.discard)(bundle)
        routes.served(agent, bundle, serving)

    routes = Routes()
    a, b, c, d, e = (Agent(x) for x in "abcde")
    for agent in (e, d, c, b, a):  # started in this order
        routes.start(agent)  # type: ignore[arg-type]
    serve(c, "k")
    routes.stop(c)  # type: ignore[arg-type]  # killed or stopped: hears nothing, whatever it serves
    serve(d, "k")
    serve(d, "k2")
    serve(d, "k2", False)
    routes.asking.add(b)  # type: ignore[arg-type]
    old = make(State.RELEASING, src="a", dst="x", version=2, ts=0, writer="l")
    new = make(State.ASSIGNING, src="a", dst="e", version=3, ts=0, writer="a")
    routes.changed("k", old, new)
    assert heard == [("e", "k"), ("d", "k"), ("b", "k"), ("a", "k")]
    heard.clear()
    routes.changed("k2", None, make(State.OWNED, dst="zz", version=1, ts=0, writer="l"))
    assert heard == [("b", "k2")]  # only the lookup being answered
    heard.clear()
    routes.asking.clear()
    routes.start(c)  # type: ignore[arg-type]  # resumed: what its reconciler serves counts again, last
    routes.changed("k", new, make(State.OWNED, src="a", dst="e", version=4, ts=0, writer="e"))
    assert heard == [("e", "k"), ("d", "k"), ("a", "k"), ("c", "k")]
    heard.clear()
    routes.changed("k2", old, make(State.DELETED, src="zz", version=4, ts=0, writer="zz"))
    assert [m for m, _ in heard] == ["e", "d", "b", "a", "c"]  # a split parent deleted: every lookup cache


def test_a_run_is_byte_identical_whatever_the_string_hash_seed() -> None:
    """Sets of bundle names iterate in an order that depends on PYTHONHASHSEED; nothing a run decides or
    records may. Two interpreters with different seeds, the faults scenario: the same bytes."""
    code = (
        "import sys, json\n"
        "from trimtab.sim.run import main_json, simulate\n"
        "from trimtab.sim.scenario import parse_scenario\n"
        "sys.stdout.buffer.write(main_json(simulate(parse_scenario(json.loads(sys.argv[1])))[0]))\n"
    )
    doc = json.dumps(document(**{"policies": ["legacy-uniform"], **FAULTS}))

    def run(seed: str) -> bytes:
        env = {**os.environ, "PYTHONHASHSEED": seed}
        cmd = [sys.executable, "-c", code, doc]
        return subprocess.run(cmd, env=env, capture_output=True, check=True, timeout=600).stdout

    a, b = run("1"), run("4242")
    assert a and a == b


# ------------------------------------------------------------------------------------------ the shared parts
def test_the_simulated_kafka_is_the_memory_transport_but_for_produce_and_send() -> None:
    own = {k for k, v in vars(SimTransport).items() if callable(v) and k in vars(MemoryTransport)}
    assert issubclass(SimTransport, MemoryTransport)
    assert own == {"__init__", "produce", "send"}


def test_the_split_scheduler_has_one_construction_from_the_settings() -> None:
    s = load_settings(
        None, {"split": {"interval_s": 17, "auto_unload": True, "max_topics": 123}}, environ=False
    )
    own = OwnerJobs(
        "me:1",
        MemoryChannel(),  # type: ignore[arg-type]
        reporter=None,  # type: ignore[arg-type]
        adapter=None,  # type: ignore[arg-type]
        events=None,  # type: ignore[arg-type]
        metrics=None,  # type: ignore[arg-type]
        paused=lambda: False,
    )
    sched = SplitScheduler.from_settings(s, own, layouts=None)  # type: ignore[arg-type]
    assert (sched.interval_s, sched.auto_unload, sched.enabled) == (17, True, s.split.enabled)
    assert sched.limits.max_topics == 123
    wiring = (ROOT / "agent" / "wiring.py").read_text()
    assert "SplitScheduler.from_settings(" in wiring and "SplitScheduler(" not in wiring
    assert "MergeScheduler.from_settings(" in wiring and "MergeScheduler(" not in wiring


class MemoryChannel:
    """What the split scheduler's constructor touches of its channel: the table's listeners."""

    class _Table:
        def add_listener(self, fn: Any) -> None: ...

    table = _Table()
