"""The leader's operations job (controller/operations.py) over the in-memory store: a drain carried out and
finished, a leader "killed" after it stored a pass and before publishing it (the next one proposes the same
records, never a second move), safe mode, limits read on every pass, the verbs' refusals, and the
retention of finished operations."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from trimtab.balance import operations as ops
from trimtab.channel import intents
from trimtab.channel.records import Record, State, make
from trimtab.config.settings import OperationSettings
from trimtab.controller.metrics import ControllerMetrics
from trimtab.controller.operation_store import MemoryOperations
from trimtab.controller.operations import HealPlan, OperationsJob, heal_id
from trimtab.errors import RequestError

T0 = 1_800_000_000.0
A, B = "a:1", "b:1"


def bundle(i: int) -> str:
    lo = i * 0x1000000
    return f"t/ns/0x{lo:08x}_0x{lo + 0x1000000:08x}"


class Table(dict[str, Record]):
    """The channel's table as the job reads it: a dict whose listeners hear each change (as TableView's)."""

    live = True
    generation = 0

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.listeners: list[Any] = []

    def add_listener(self, fn: Any) -> None:
        self.listeners.append(fn)

    def unsettled(self) -> list[tuple[str, Record]]:  # a table that packs nothing: every record
        return list(self.items())

    def __setitem__(self, b: str, rec: Record) -> None:
        old = self.get(b)
        super().__setitem__(b, rec)
        for fn in self.listeners:
            fn(b, old, rec)

    def __delitem__(self, b: str) -> None:
        old = self.get(b)
        super().__delitem__(b)
        for fn in self.listeners:
            fn(b, old, None)


@dataclass
class Writes:
    table: Table
    published: list[tuple[str, Record]] = field(default_factory=list)
    fail: bool = False

    async def publish(self, b: str, rec: Record) -> None:
        self.published.append((b, rec))
        if self.fail:
            raise TimeoutError("Kafka did not acknowledge")
        cur = self.table.get(b)
        if cur is None or rec.version == cur.version + 1:  # the channel: first valid transition
            self.table[b] = rec


@dataclass
class Leadership:
    safe: str | None = None

    def safe_mode(self) -> str | None:
        return self.safe

    async def confirm(self) -> bool:
        return True

    def writer(self) -> str:
        return "leader"


@dataclass
class Journal:
    events: list[dict[str, Any]] = field(default_factory=list)

    def record(self, kind: str, **fields: Any) -> None:
        self.events.append({"kind": kind, **fields})


class Cluster:
    def __init__(self, n: int, settings: OperationSettings | None = None) -> None:
        self.table = Table(
            {bundle(i): make(State.OWNED, dst=A, version=2, ts=0, writer="x") for i in range(n)}
        )
        self.store = MemoryOperations()
        self.settings = settings or OperationSettings()
        self.now = T0
        self.writes = Writes(self.table)
        self.leadership = Leadership()
        self.journal = Journal()
        self.metrics = ControllerMetrics.create(CollectorRegistry())
        self.job = self.leader()

    def leader(
        self, load: bool = True, heal_plans: Callable[[], Mapping[str, HealPlan]] | None = None
    ) -> OperationsJob:
        """A new leader's job over the same store (what a failover gives); ``load``: it has read them;
        ``heal_plans``: the healing job's plans it follows."""
        job = OperationsJob(
            lambda: self.settings,
            self.store,
            self.table,  # type: ignore[arg-type]
            self.leadership,  # type: ignore[arg-type]
            self.writes,  # type: ignore[arg-type]
            self.journal,  # type: ignore[arg-type]
            self.metrics,
            clock=lambda: self.now,
            heal_plans=heal_plans,
        )
        if load:
            job.load()
        return job

    def brokers_finish(self) -> None:
        """Every transfer in flight carried through by its brokers."""
        for b, rec in list(self.table.items()):
            if rec.state is State.RELEASING and rec.src is not None and rec.dst is not None:
                self.table[b] = intents.take(intents.hand_over(rec, rec.src, now_ms=0), rec.dst, now_ms=0)

    def drain(self, n: int) -> ops.Operation:
        moves = [(bundle(i), A, B) for i in range(n)]
        return asyncio.run(self.job.submit(ops.OpKind.DRAIN, moves, reason="drain a", requested_by="ops"))


def test_a_drain_runs_to_done_and_says_so() -> None:
    c = Cluster(5)
    op = c.drain(5)
    assert [e["state"] for e in c.journal.events] == ["pending"]
    asyncio.run(c.job.run_once())
    assert len(c.writes.published) == 5 and c.job.get(op.id).state is ops.OpState.RUNNING
    c.brokers_finish()
    asyncio.run(c.job.run_once())
    done = c.job.get(op.id)
    assert done.state is ops.OpState.DONE and done.progress() == (5, 5)
    assert [e["state"] for e in c.journal.events] == ["pending", "running", "done"]
    assert c.metrics.operation_moves.labels("drain", "moved")._value.get() == 5
    assert c.store.list() == [done]


def test_a_leader_killed_between_storing_and_publishing_never_moves_a_bundle_twice() -> None:
    c = Cluster(3, OperationSettings(republish_after_s=10))
    op = c.drain(3)
    c.writes.fail = True  # the publishes of this pass are lost: as if the leader died right after storing
    asyncio.run(c.job.run_once())
    stored = c.store.list()[0]
    assert all(m.started_version == 3 for m in stored.moves)  # stored before publishing
    c.writes.fail = False
    c.writes.published.clear()
    c.job = c.leader()  # the next leader
    asyncio.run(c.job.run_once())
    assert c.writes.published == []  # not yet: the records may still be on their way
    c.now += 10
    asyncio.run(c.job.run_once())
    assert sorted((b, r.version) for b, r in c.writes.published) == [(bundle(i), 3) for i in range(3)]
    c.brokers_finish()
    asyncio.run(c.job.run_once())
    assert c.job.get(op.id).state is ops.OpState.DONE


def test_nothing_starts_in_safe_mode_and_the_wait_is_counted() -> None:
    c = Cluster(2)
    c.drain(2)
    c.leadership.safe = "zookeeper_reconnected"
    asyncio.run(c.job.run_once())
    assert c.writes.published == [] and c.job.status()["waiting"] == {"safe_mode": 2}
    assert c.metrics.operation_waits.labels("safe_mode")._value.get() == 2


def test_limits_are_read_on_every_pass() -> None:
    c = Cluster(10, OperationSettings(max_in_flight=2))
    c.drain(10)
    asyncio.run(c.job.run_once())
    assert len(c.writes.published) == 2
    assert c.job.status()["waiting"] == {"throttled_cluster": 8}
    c.settings = OperationSettings(max_in_flight=6)  # changed at run time
    asyncio.run(c.job.run_once())
    assert len(c.writes.published) == 6


def test_verbs_refuse_what_does_not_apply_and_unknown_ids() -> None:
    c = Cluster(2)
    op = c.drain(2)
    with pytest.raises(RequestError) as e:
        asyncio.run(c.job.verb("nope", "pause"))
    assert e.value.status == 404
    assert asyncio.run(c.job.verb(op.id, "pause")).state is ops.OpState.PAUSED
    asyncio.run(c.job.run_once())
    assert c.writes.published == []  # paused: nothing starts
    assert asyncio.run(c.job.verb(op.id, "cancel")).state is ops.OpState.CANCELLED
    asyncio.run(c.job.run_once())
    assert c.job.get(op.id).progress() == (2, 2)
    with pytest.raises(RequestError) as e:
        asyncio.run(c.job.verb(op.id, "resume"))
    assert e.value.status == 409 and "finished" in str(e.value)
    with pytest.raises(RequestError) as e:
        asyncio.run(c.job.verb(op.id, "restart"))
    assert e.value.status == 400


def test_only_the_newest_finished_operations_are_kept() -> None:
    c = Cluster(4, OperationSettings(keep_finished=2))
    for i in range(4):
        c.now += 1
        asyncio.run(
            c.job.submit(ops.OpKind.TRANSFER, [(bundle(i), A, B)], reason=f"t{i}", requested_by="ops")
        )
    asyncio.run(c.job.run_once())
    c.brokers_finish()
    c.now += 1
    asyncio.run(c.job.run_once())
    assert [op.reason for op in c.job.list()] == ["t2", "t3"]
    assert len(c.store.list()) == 2


def test_nothing_is_done_before_the_store_was_read() -> None:
    c = Cluster(1)
    job = c.leader(load=False)
    assert asyncio.run(job.run_once()) is None
    with pytest.raises(RequestError) as e:
        asyncio.run(job.submit(ops.OpKind.DRAIN, [], reason="r", requested_by="x"))
    assert e.value.status == 503


def test_a_verb_during_a_pass_is_not_overwritten_by_the_pass() -> None:
    """Review finding: a cancel answered while a pass waited for leadership was overwritten by the pass's
    own copy (RUNNING), and the next pass moved more bundles. Now a verb waits for the pass to end."""

    class SlowLeadership(Leadership):
        gate: asyncio.Event

        async def confirm(self) -> bool:
            await self.gate.wait()
            return True

    async def main() -> None:
        c = Cluster(6, OperationSettings(max_in_flight=2))
        c.leadership = SlowLeadership()
        c.leadership.gate = asyncio.Event()
        c.job = c.leader()
        op = await c.job.submit(
            ops.OpKind.DRAIN, [(bundle(i), A, B) for i in range(6)], reason="r", requested_by="x"
        )
        first = asyncio.ensure_future(c.job.run_once())
        await asyncio.sleep(0)  # the pass is waiting on leadership
        cancel = asyncio.ensure_future(c.job.verb(op.id, "cancel"))
        await asyncio.sleep(0)
        c.leadership.gate.set()
        await first
        assert (await cancel).state is ops.OpState.CANCELLED
        c.brokers_finish()
        await c.job.run_once()
        assert len(c.writes.published) == 2  # the first pass's two, nothing after the cancel
        final = c.job.get(op.id)
        assert final.state is ops.OpState.CANCELLED and c.store.list()[0].state is ops.OpState.CANCELLED

    asyncio.run(main())


def test_bundles_that_reach_a_drained_broker_later_join_its_drain() -> None:
    c = Cluster(2)
    c.job.planner = lambda broker, bundles: dict.fromkeys(bundles, B)
    op = asyncio.run(
        c.job.submit(ops.OpKind.DRAIN, [(bundle(0), A, B)], reason="r", requested_by="x", target=A)
    )
    asyncio.run(c.job.run_once())  # bundle(1) is A's too, but not in the plan: it joins
    grown = c.job.get(op.id)
    assert [m.bundle for m in grown.moves] == [bundle(0), bundle(1)]
    c.brokers_finish()
    asyncio.run(c.job.run_once())
    assert c.job.get(op.id).state is ops.OpState.DONE and c.table[bundle(1)].dst == B


def test_an_operators_transfer_is_an_operation_started_at_once_and_followed_to_its_end() -> None:
    c = Cluster(2)
    op, rec = asyncio.run(
        c.job.start_now(
            ops.OpKind.TRANSFER, bundle(0), src=A, dst=B, version=2, reason="hot", requested_by="alice"
        )
    )
    # Stored before it was published, started at the version of the record it published.
    stored = c.store.list()
    assert stored == [op] and op.state is ops.OpState.RUNNING and op.requested_by == "alice"
    assert op.moves[0].started_version == rec.version == 3
    assert c.writes.published == [(bundle(0), rec)] and rec.state is State.RELEASING and rec.dst == B
    assert c.journal.events[-1]["state"] == "running" and c.journal.events[-1]["op_kind"] == "transfer"
    asyncio.run(c.job.run_once())
    assert c.job.get(op.id).state is ops.OpState.RUNNING  # on its way: the brokers have not finished
    c.brokers_finish()
    asyncio.run(c.job.run_once())
    assert (
        c.job.get(op.id).state is ops.OpState.DONE and c.job.get(op.id).moves[0].outcome is ops.Outcome.MOVED
    )


def test_an_operators_unload_whose_record_was_lost_is_proposed_again_at_the_same_version() -> None:
    c = Cluster(1, OperationSettings(republish_after_s=5))
    c.writes.fail = True
    with pytest.raises(TimeoutError):
        asyncio.run(
            c.job.start_now(
                ops.OpKind.UNLOAD, bundle(0), src=A, dst=None, version=2, reason="", requested_by="x"
            )
        )
    c.writes.fail = False
    c.writes.published.clear()
    c.job = c.leader()  # even a new leader
    c.now += 5
    asyncio.run(c.job.run_once())
    assert [(b, r.version, r.state, r.dst) for b, r in c.writes.published] == [
        (bundle(0), 3, State.RELEASING, None)
    ]


def test_an_operators_move_of_a_bundle_that_changed_is_refused_and_nothing_is_stored() -> None:
    c = Cluster(1)
    with pytest.raises(intents.IntentRefused):
        asyncio.run(
            c.job.start_now(
                ops.OpKind.TRANSFER, bundle(0), src=A, dst=B, version=1, reason="", requested_by="x"
            )
        )
    assert c.store.list() == [] and c.writes.published == []
    not_loaded = c.leader(load=False)
    with pytest.raises(RequestError) as e:
        asyncio.run(
            not_loaded.start_now(
                ops.OpKind.TRANSFER, bundle(0), src=A, dst=B, version=2, reason="", requested_by="x"
            )
        )
    assert e.value.status == 503


# ---------------------------------------------------------------------------------------------- followed
def test_a_split_seen_in_the_channel_is_recorded_and_followed_to_its_end_also_by_a_new_leader() -> None:
    c = Cluster(2)
    parent = bundle(0)
    lo = "0x00000000_0x00800000"
    hi = "0x00800000_0x01000000"
    c.table[parent] = intents.split(c.table[parent], A, [lo, hi], writer="agent-a", now_ms=0)
    asyncio.run(c.job.run_once())
    (op,) = c.job.list()
    assert op.kind is ops.OpKind.SPLIT and op.state is ops.OpState.RUNNING and op.requested_by == "agent-a"
    assert c.writes.published == []  # followed, never carried out by the leader
    c.job = c.leader()  # a failover: the new leader reads it and does not record the split twice
    asyncio.run(c.job.run_once())
    assert [o.id for o in c.job.list()] == [op.id]
    c.table[parent] = intents.retire(c.table[parent], A, now_ms=0)
    asyncio.run(c.job.run_once())
    done = c.job.get(op.id)
    assert done.state is ops.OpState.DONE and done.moves[0].outcome is ops.Outcome.SPLIT
    assert c.metrics.operation_moves.labels("split", "split")._value.get() == 1
    assert [e["state"] for e in c.journal.events if e["kind"] == "operation"][-1] == "done"
    with pytest.raises(RequestError) as e:
        asyncio.run(c.job.verb(op.id, "cancel"))
    assert e.value.status == 409


def test_a_healing_plan_is_one_heal_operation_an_operator_can_hold() -> None:
    c = Cluster(3)
    plans: dict[str, HealPlan] = {A: HealPlan(5000, {bundle(0): B, bundle(1): B, bundle(2): None})}
    c.job = c.leader(heal_plans=lambda: plans)
    asyncio.run(c.job.run_once())
    (op,) = c.job.list()
    assert op.kind is ops.OpKind.HEAL and op.target == A and op.progress() == (0, 3)
    assert op.requested_by == "healing" and "first failure" in op.reason
    asyncio.run(c.job.verb(op.id, "pause"))
    assert c.job.held_heals() == {A}  # the healing job skips A while held
    asyncio.run(c.job.verb(op.id, "resume"))
    assert c.job.held_heals() == frozenset()
    c.table[bundle(0)] = make(State.OWNED, dst=B, src=A, version=3, ts=0, writer="leader")
    c.table[bundle(1)] = make(State.OWNED, dst=B, src=A, version=3, ts=0, writer="leader")
    c.table[bundle(2)] = make(State.OWNED, dst="c:1", src=A, version=3, ts=0, writer="leader")
    asyncio.run(c.job.run_once())
    done = c.job.get(op.id)
    assert done.state is ops.OpState.DONE and done.progress() == (3, 3)
    asyncio.run(c.job.run_once())  # the plan is still held until A is forgotten: no second heal
    assert [o.id for o in c.job.list()] == [op.id]


def test_a_heal_whose_broker_came_back_is_cancelled_with_the_reason() -> None:
    c = Cluster(1)
    plans: dict[str, HealPlan] = {A: HealPlan(5000, {bundle(0): B})}
    c.job = c.leader(heal_plans=lambda: plans)
    asyncio.run(c.job.run_once())
    plans.clear()  # the healing job's bookkeeping: A registered again
    asyncio.run(c.job.run_once())
    (op,) = c.job.list()
    assert op.state is ops.OpState.CANCELLED and op.state_reason == "the broker came back"
    assert op.moves[0].outcome is ops.Outcome.CANCELLED


def test_a_split_completed_between_two_passes_is_recorded_done() -> None:
    """Agents publish a split and its children within milliseconds: the pass after sees it settled."""
    c = Cluster(1)
    parent = bundle(0)
    c.table[parent] = intents.split(c.table[parent], A, ["0x00000000_0x00800000"], writer="agent-a", now_ms=0)
    c.table[parent] = intents.retire(c.table[parent], A, now_ms=0)
    del c.table[parent]  # tombstoned
    asyncio.run(c.job.run_once())
    (op,) = c.job.list()
    assert (op.kind, op.state, op.target) == (ops.OpKind.SPLIT, ops.OpState.DONE, parent)
    asyncio.run(c.job.run_once())
    assert len(c.job.list()) == 1  # recorded once


def test_a_heal_of_more_bundles_than_an_operation_holds_follows_the_first_and_says_so() -> None:
    c = Cluster(0)
    n = ops.MAX_MOVES + 5
    plans = {A: HealPlan(5000, {f"t/ns/0x{i:08x}_0x{i + 1:08x}": B for i in range(n)})}
    c.job = c.leader(heal_plans=lambda: plans)
    asyncio.run(c.job.run_once())
    (op,) = c.job.list()
    assert len(op.moves) == ops.MAX_MOVES and f"{ops.MAX_MOVES} of {n} followed" in op.reason


def test_a_failure_to_record_what_others_do_does_not_stop_the_leaders_own_operations() -> None:
    """ZooKeeper refuses the split's record: the drain advances all the same (follow_failed counted), and
    the split seen is given back -- recorded by the next pass that can store it, not lost."""
    c = Cluster(4)
    op = c.drain(3)
    parent = bundle(3)
    c.table[parent] = intents.split(c.table[parent], A, ["0x03000000_0x03800000"], writer="agent-a", now_ms=0)
    create = c.store.create

    def refuse_splits(o: ops.Operation) -> None:
        if o.kind is ops.OpKind.SPLIT:
            raise ConnectionError("ZooKeeper away")
        create(o)

    c.store.create = refuse_splits  # type: ignore[method-assign]
    asyncio.run(c.job.run_once())
    assert len(c.writes.published) == 3 and c.job.get(op.id).state is ops.OpState.RUNNING
    assert c.metrics.operation_waits.labels("follow_failed")._value.get() == 1
    assert [o.kind for o in c.job.list()] == [ops.OpKind.DRAIN]
    c.table[parent] = intents.retire(c.table[parent], A, now_ms=0)  # completed meanwhile
    c.store.create = create  # type: ignore[method-assign]
    asyncio.run(c.job.run_once())
    (split,) = [o for o in c.job.list() if o.kind is ops.OpKind.SPLIT]
    assert split.state is ops.OpState.DONE and split.target == parent


# ---------------------------------------------------------------------------------------------- review
LO, HI = "0x00000000_0x00800000", "0x00800000_0x01000000"


def run(c: Cluster) -> None:
    asyncio.run(c.job.run_once())


def test_a_split_of_a_key_made_again_is_a_new_split_though_its_version_is_the_same() -> None:
    """A key deleted and made again counts its versions from 1 again: the split's time stamp tells the
    second split (an hour or more later) from the first."""
    c = Cluster(1)
    x = bundle(0)
    c.table[x] = make(State.OWNED, dst=A, version=1, ts=0, writer="x")
    c.table[x] = intents.split(c.table[x], A, [LO, HI], writer="agent-a", now_ms=1000)
    run(c)
    c.table[x] = intents.retire(c.table[x], A, now_ms=1001)
    del c.table[x]
    run(c)
    c.table[x] = make(State.OWNED, dst=A, version=1, ts=3_700_000, writer="merge")  # merged back, later
    c.table[x] = intents.split(c.table[x], A, [LO, HI], writer="agent-a", now_ms=3_800_000)
    run(c)
    assert [o.state for o in c.job.list()] == [ops.OpState.DONE, ops.OpState.RUNNING]


def test_a_heal_whose_broker_was_forgotten_as_healed_is_followed_to_its_end_not_cancelled() -> None:
    """The healing job forgets a failed broker once nothing names it -- with its last override still in
    flight (Assigning{src=dead, dst=live} names only the live one). That is no return of the broker."""
    c = Cluster(1)
    c.table[bundle(0)] = make(State.OWNED, dst="dead:1", version=2, ts=0, writer="x")
    plans = {"dead:1": HealPlan(5000, {bundle(0): B})}
    c.job = c.leader(heal_plans=lambda: plans)
    c.job.registered = lambda broker: broker != "dead:1"
    run(c)
    c.table[bundle(0)] = make(State.ASSIGNING, dst=B, src="dead:1", version=3, ts=0, writer="l", force=True)
    plans.clear()  # forgotten as healed
    run(c)
    (op,) = c.job.list()
    assert op.state is ops.OpState.RUNNING
    c.table[bundle(0)] = make(State.OWNED, dst=B, src="dead:1", version=4, ts=0, writer=B)
    run(c)
    assert (
        c.job.get(op.id).state is ops.OpState.DONE and c.job.get(op.id).moves[0].outcome is ops.Outcome.MOVED
    )


def test_a_finished_heal_is_kept_while_its_plan_is_and_never_recorded_twice() -> None:
    c = Cluster(3, OperationSettings(keep_finished=0))
    plans = {"z:1": HealPlan(5000, {bundle(0): B})}
    c.job = c.leader(heal_plans=lambda: plans)
    c.table[bundle(0)] = make(State.OWNED, dst=B, src="z:1", version=3, ts=0, writer="l")  # healed already
    c.drain(2)  # the leader's own operation: its passes forget finished operations
    for _ in range(4):
        run(c)
        c.brokers_finish()
    assert len([e for e in c.journal.events if e.get("op_kind") == "heal"]) == 1  # recorded (done) once
    assert heal_id("z:1", 5000) in c.job.ops


def test_a_pause_of_an_earlier_failure_does_not_hold_the_next_one() -> None:
    c = Cluster(2)
    plans = {A: HealPlan(5000, {bundle(0): B})}
    c.job = c.leader(heal_plans=lambda: plans)
    c.job.registered = lambda broker: False  # A failed again: not registered
    run(c)
    (h1,) = c.job.list()
    asyncio.run(c.job.verb(h1.id, "pause"))
    assert c.job.held_heals() == {A}
    plans[A] = HealPlan(9000, {bundle(0): B, bundle(1): B})  # came back and failed again between passes
    assert c.job.held_heals() == frozenset()  # the pause was for the earlier failure
    run(c)
    old, new = c.job.get(h1.id), c.job.get(heal_id(A, 9000))
    assert old.state is ops.OpState.CANCELLED and "failed again" in (old.state_reason or "")
    assert new.state is ops.OpState.RUNNING and new.progress() == (0, 2)


def test_a_heal_that_would_not_read_back_is_not_stored_and_following_goes_on() -> None:
    c = Cluster(1)
    x = bundle(0)
    far = "f" * 600  # a broker name from a channel record, longer than a stored operation's field
    plans = {far: HealPlan(5000, {bundle(5): B})}
    c.table[x] = intents.split(c.table[x], A, [LO, HI], writer="agent-a", now_ms=0)
    c.job = c.leader(heal_plans=lambda: plans)
    run(c)
    assert [o.kind for o in c.job.list()] == [ops.OpKind.SPLIT] and len(c.store.list()) == 1
    assert c.metrics.operation_waits.labels("not_recordable")._value.get() == 1
    c.table[x] = intents.retire(c.table[x], A, now_ms=0)
    del c.table[x]
    run(c)
    run(c)
    (split,) = c.job.list()
    assert split.state is ops.OpState.DONE
    assert c.metrics.operation_waits.labels("not_recordable")._value.get() == 1  # not tried every pass


def test_a_table_replaced_whole_is_scanned_again_for_splits_its_listeners_did_not_hear() -> None:
    c = Cluster(1)
    x = bundle(0)
    run(c)
    # A history gap: the table is replaced (TableView.load); its listeners hear nothing.
    dict.__setitem__(c.table, x, intents.split(c.table[x], A, [LO, HI], writer="agent-a", now_ms=0))
    c.table.generation += 1
    run(c)
    (op,) = c.job.list()
    assert op.kind is ops.OpKind.SPLIT and op.target == x
