"""The simulator runs the daemons' own jobs (shedding, monitor, healing with its persisted plan, drain, load
reports, splits) on a virtual-time event loop: these tests prove that the production classes ran, that the
healing plan's chunks live in the in-memory store and are carried on from there, and that the loop is
deterministic, ordered and never sleeps in real time."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from trimtab.agent.drain import Drainer
from trimtab.agent.reporter import LoadReporter
from trimtab.agent.splits import SplitScheduler
from trimtab.balance.heal import HealConfig, named_brokers
from trimtab.channel import intents
from trimtab.channel.records import Record, State
from trimtab.config.loader import load_settings
from trimtab.controller.healing import Healer
from trimtab.controller.memory_stores import MemoryFailedBrokers, MemoryReassignments
from trimtab.controller.monitor import MonitorJob
from trimtab.controller.shedding import SheddingJob
from trimtab.sim.clock import VirtualLoop
from trimtab.sim.engine import Engine
from trimtab.sim.scenario import Scenario, parse_scenario


def document(**over: Any) -> dict[str, Any]:
    """A small scenario (3 brokers, 2 added at 100 s), as a scenario file would hold it."""
    doc: dict[str, Any] = {
        "seed": 3,
        "duration_s": 400,
        "brokers": {"count": 3},
        "namespaces": [{"name": "t/a", "bundles": 24, "topics": 2400, "msg_rate": 50000, "skew": 0.8}],
        "events": [{"at_s": 100, "add_brokers": 2}],
        "policies": ["transfer"],
        "config": {"shedding": {"interval_s": 30, "hit_count_threshold": 1}},
        "report": {"optimum": False},
    }
    doc.update(over)
    return doc


def scenario(**over: Any) -> Scenario:
    return parse_scenario(document(**over))


# ------------------------------------------------------------------------------------------ the virtual loop
def test_the_virtual_loop_jumps_time_and_never_sleeps_in_real_time() -> None:
    loop = VirtualLoop()
    seen: list[float] = []

    async def main() -> None:
        for _ in range(3):
            await asyncio.sleep(3600)
            seen.append(loop.time())

    t0 = time.perf_counter()
    loop.call_soon(lambda: loop.create_task(main()))
    loop.run_until(100_000)
    loop.close()
    assert seen == [3600.0, 7200.0, 10800.0]
    assert time.perf_counter() - t0 < 1.0  # three virtual hours, no real sleep


def test_work_handed_to_a_thread_runs_inline_and_the_loop_stops_at_its_horizon() -> None:
    loop = VirtualLoop()
    threads: list[int] = []
    ran: list[float] = []

    async def main() -> None:
        await asyncio.to_thread(lambda: threads.append(threading.get_ident()))
        ran.append(loop.time())

    loop.call_at(5.0, lambda: loop.create_task(main()))
    loop.call_at(50.0, lambda: ran.append(-1.0))  # past the horizon: never runs
    loop.run_until(10.0)
    loop.close()
    assert threads == [threading.get_ident()]
    assert ran == [5.0]
    assert loop.time() == 5.0


def test_a_wait_computed_from_the_clock_lands_exactly_on_time() -> None:
    """A timer a few ulps ahead must not run early: the JobRunner's ``due - mono()`` would schedule it
    again for ever without time moving (a run of the faults scenario once hung this way)."""
    loop = VirtualLoop()
    due = 61.29296753228055
    fired: list[float] = []

    async def main() -> None:
        await asyncio.sleep(61.292967532280535)
        while (wait := due - loop.time()) > 0:  # noqa: ASYNC110 -- the JobRunner's own pattern
            await asyncio.sleep(wait)
        fired.append(loop.time())

    loop.call_soon(lambda: loop.create_task(main()))
    loop.run_until(100.0)
    loop.close()
    assert fired == [due]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.booleans()), min_size=1, max_size=40))
def test_callbacks_run_in_time_then_scheduling_order(plan: list[tuple[int, bool]]) -> None:
    """Whatever is scheduled, in whatever order, callbacks run by (time, order scheduled), each at its time,
    and a callback may schedule more at the same instant (run after those already due)."""
    loop = VirtualLoop()
    ran: list[tuple[float, int]] = []
    expected: list[tuple[float, int]] = []
    n = 0

    def cb(when: float, i: int, again: bool) -> None:
        nonlocal n
        assert loop.time() == when
        ran.append((when, i))
        if again:
            j = n = n + 1
            loop.call_at(when, cb, when, 1000 + j, False)

    for i, (t, again) in enumerate(plan):
        loop.call_at(float(t), cb, float(t), i, again)
    loop.run_until(20.0)
    loop.close()
    for i, (t, _) in enumerate(plan):
        expected.append((float(t), i))
    # The ones scheduled before the run, in (time, order); each follow-up right after its instant's batch.
    assert [r for r in ran if r[1] < 1000] == sorted(expected)
    assert [r[0] for r in ran] == sorted(r[0] for r in ran)
    assert len(ran) == len(plan) + sum(1 for _, again in plan if again)


# ------------------------------------------------------------------------------------------ the jobs
def test_the_shedding_is_the_leaders_shedding_job(monkeypatch: pytest.MonkeyPatch) -> None:
    decided: list[str] = []
    real = SheddingJob.decide

    def spy(self: SheddingJob, brokers: dict[str, bool]) -> Any:
        res = real(self, brokers)
        decided.extend(u.bundle for u in res.decisions)
        return res

    monkeypatch.setattr(SheddingJob, "decide", spy)
    run = Engine(scenario(), "transfer").run()
    shed = [m.bundle for m in run.moves if m.reason.startswith("shed")]
    assert shed, "the scale-out should make the shedder move bundles"
    assert set(shed) <= set(decided)  # every move the recorder saw was a decision of the production job
    cycles = sum(n for k, n in run.shed_cycles.items() if not k.startswith("skip:") or k == "skip:balanced")
    assert cycles > 0


def test_a_legacy_shedder_runs_inside_the_same_job(monkeypatch: pytest.MonkeyPatch) -> None:
    shedders: list[str] = []
    real = SheddingJob.decide

    def spy(self: SheddingJob, brokers: dict[str, bool]) -> Any:
        shedders.append(getattr(self.shedder, "__name__", "?"))
        return real(self, brokers)

    monkeypatch.setattr(SheddingJob, "decide", spy)
    Engine(scenario(duration_s=200), "legacy-threshold").run()
    assert shedders and set(shedders) == {"shed"}  # the adapter around sim.legacy's shedder


def test_a_failing_job_fails_the_run_instead_of_being_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    async def boom(self: MonitorJob) -> list[Any]:
        raise RuntimeError("boom")

    monkeypatch.setattr(MonitorJob, "run_once", boom)
    with pytest.raises(RuntimeError, match="jobs raised"):
        Engine(scenario(duration_s=200), "none").run()


def test_the_leader_waits_in_safe_mode_after_a_zookeeper_outage() -> None:
    sc = scenario(
        events=[{"at_s": 100, "add_brokers": 2}, {"at_s": 170, "zookeeper_outage": True, "duration_s": 5}],
        config={
            "shedding": {"interval_s": 10, "hit_count_threshold": 1},
            "healing": {"safe_mode_settle_s": 30},
        },
    )
    run = Engine(sc, "transfer").run()
    assert run.shed_cycles["skip:safe_mode"] >= 2  # 10 s cycles during the 30 s settle
    assert not [m for m in run.moves if m.reason.startswith("shed") and 170 <= m.t < 205]


def test_healing_persists_its_plan_in_chunks_and_carries_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[tuple[str, int]] = []
    real = MemoryReassignments.write_plan

    def spy(self: MemoryReassignments, broker: str, chunks: list[dict[str, str | None]], term: int) -> Any:
        written.append((broker, len(chunks)))
        return real(self, broker, chunks, term)

    monkeypatch.setattr(MemoryReassignments, "write_plan", spy)
    sc = scenario(
        events=[{"at_s": 100, "kill": 1}],
        policies=["none"],
        config={"healing": {"chunk_size": 3}},
        duration_s=200,
    )
    eng = Engine(sc, "none")
    run = eng.run()
    assert len(written) == 1
    broker, chunks = written[0]
    heals = [m for m in run.moves if m.reason == "heal"]
    assert heals and {m.src for m in heals} == {broker}
    assert chunks == -(-len(heals) // 3)  # the failed broker's bundles, three to a chunk
    assert eng.leader.plans.read(broker) == {}  # every chunk satisfied, so deleted


def test_a_new_healer_carries_on_the_persisted_chunks_without_planning_again() -> None:
    """What a new leader does with the in-memory stores: the same chunks, the same destinations, nothing
    planned twice, and a chunk whose bundles moved is deleted."""
    s = load_settings(None, {"healing": {"grace_s": 0, "chunk_size": 2}}, environ=False)
    cfg = HealConfig.from_settings(s)
    failed, plans = MemoryFailedBrokers(), MemoryReassignments(clock=lambda: 0.0)
    # Owned by the dead broker, as the channel resolved them.
    table: dict[str, Record] = {
        f"t/a/0x{i:08x}_0x{i + 1:08x}": replace(
            intents.assign(None, "dead", writer="x", now_ms=0), state=State.OWNED
        )
        for i in range(5)
    }
    items = sorted(table.items())

    def healer() -> Healer:
        return Healer(failed, plans, cfg, chunk_size=2, writer=lambda: "controller:c:t1", term=lambda: 1)

    first = healer()
    first.load()
    first.bookkeeping({"a", "b"}, named_brokers(items), now_ms=1000)
    out, _ = first.round({"a": 0.1, "b": 0.2}, table.get, items, lambda b, ex: "a", 1000)
    assert plans.written == 1 and len(plans.read("dead")) == 3
    planned = {b: d for c in plans.read("dead").values() for b, d in c.bundles.items()}
    assert {o.bundle for o in out} == set(table)

    # Chunk 0's bundles moved meanwhile; a new leader reads the plan and carries on.
    moved = sorted(plans.read("dead")[0].bundles)
    for b in moved:
        table[b] = replace(table[b], dst="a", version=table[b].version + 2)
    items = sorted(table.items())
    second = healer()
    second.load()
    out2, _ = second.round({"a": 0.1, "b": 0.2}, table.get, items, lambda b, ex: "b", 2000)
    assert plans.written == 1  # not planned again
    assert 0 not in plans.read("dead")  # satisfied, deleted
    assert {o.bundle for o in out2} == set(table) - set(moved)
    assert all(o.dst == planned[o.bundle] for o in out2)  # the persisted destinations, not re-chosen


def test_the_drain_reports_and_splits_are_the_agents_own(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, int] = {"drain": 0, "report": 0, "split": 0}

    def count(cls: type, name: str, key: str) -> None:
        real = getattr(cls, name)

        async def spy(self: Any, *a: Any, **kw: Any) -> Any:
            calls[key] += 1
            return await real(self, *a, **kw)

        monkeypatch.setattr(cls, name, spy)

    count(Drainer, "drain", "drain")
    count(LoadReporter, "report_once", "report")
    count(SplitScheduler, "split_cycle", "split")
    sc = scenario(
        brokers={"count": 4},
        namespaces=[{"name": "t/hot", "bundles": 2, "topics": 2000, "msg_rate": 30000, "skew": 0.3}],
        events=[{"at_s": 150, "restart": 2, "within_s": 10, "down_s": 5}],
        config={"split": {"max_topics": 300, "hit_count_threshold": 0, "interval_s": 20}},
        duration_s=300,
    )
    run = Engine(sc, "none").run()
    assert calls["drain"] == 2
    assert calls["report"] > 4 * 300 / 5 / 2  # every agent, every report interval (not while away)
    assert calls["split"] > 0 and run.splits > 0
    assert sum(1 for m in run.moves if m.reason == "drain") > 0
