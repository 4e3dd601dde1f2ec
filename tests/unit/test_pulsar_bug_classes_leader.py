"""Leader-side bug classes from Apache Pulsar's load manager issue tracker, each pinned as a rule trimtab
keeps (issue 31; docs/reliability.md lists them with what trimtab does instead): orphan cleanup acting on
a stale view (apache/pulsar#23064, #23382).

Pulsar's leader cleaned up "orphan" bundles from a view it should not have trusted: bundles whose *source*
broker was inactive although their owner was alive and serving them (#23064), and bundles of brokers it
had out-dated registry notifications about -- brokers that were in fact registered again (#23382, whose
fix checks health before a cleanup and cancels the cleanups of brokers that came back). trimtab's leader
decides from its replicas only through the gates of :class:`~trimtab.controller.leadership.Leadership` --
leading, ZooKeeper connected and settled after any reconnect, the broker registry read, the channel
replica caught up -- asked before a job decides and again (with ZooKeeper) right before it writes; what a
record needs in order to make progress is :func:`~trimtab.balance.heal.dependents`, never every broker it
names; a registered broker is never a failed one; and whatever a stale decision still writes is a record
built on the version it saw, which every replica refuses once the bundle moved on.

The jobs are the controller's own classes (monitor, healing, shedding, their channel writes, the real
``Leadership``, ``Destinations`` and table view); only what would reach ZooKeeper or Kafka is a stand-in:
the election, the session, the registry's cache and the channel client, whose writes are recorded.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from tests.support.acked import AckedPublish
from tests.support.clock import ManualClock
from trimtab.balance.assign import BrokerInfo
from trimtab.balance.heal import HealConfig, dependents, due, needs_healing, orphaned, override_for
from trimtab.balance.load import BrokerLoadData, BundleStats, TopBundles
from trimtab.balance.shed import ShedConfig
from trimtab.channel import intents
from trimtab.channel.bundles import parse_bundle
from trimtab.channel.records import Record, State, encode, make
from trimtab.channel.resolve import ACCEPT, Verdict, resolve
from trimtab.channel.table import TableView
from trimtab.cluster.placement.standbys import StandbyIndex
from trimtab.cluster.placement.view import LivePlacement
from trimtab.config.settings import Settings, SheddingSettings
from trimtab.controller.healing import Healer, HealingJob
from trimtab.controller.journal import DecisionJournal
from trimtab.controller.leadership import Leadership
from trimtab.controller.memory_stores import MemoryFailedBrokers, MemoryReassignments
from trimtab.controller.metrics import ControllerMetrics
from trimtab.controller.monitor import MonitorJob
from trimtab.controller.operation_store import MemoryOperations
from trimtab.controller.operations import OperationsJob
from trimtab.controller.placement.destinations import Destinations
from trimtab.controller.shedding import SheddingJob
from trimtab.controller.writes import ChannelWrites

A, B, DEAD = "a:1", "b:1", "dead:1"
T0_S = 1_700_000_000.0  # the leader's wall clock at the start, seconds
HOUR_MS = 3_600_000
SETTLE_S = 10.0
IN_FLIGHT_TIMEOUT_S = 30.0

HOT = [f"t/hot/0x{i << 28:08x}_0x{(i + 1) << 28:08x}" for i in range(4)]  # A's, and A is loaded
COLD = "t/cold/0x00000000_0xffffffff"  # B's, and B is idle
ORPHAN = "t/orph/0x00000000_0x80000000"  # DEAD's, and DEAD is not registered
FREED = "t/orph/0x80000000_0xffffffff"  # Free for an hour: due for its tombstone
MOVED = "t/moved/0x00000000_0xffffffff"  # owned by A, which took it over from DEAD


def now_ms() -> int:
    return int(T0_S * 1000)


def owned(by: str, v: int, src: str | None = None) -> Record:
    return make(State.OWNED, dst=by, src=src, version=v, ts=now_ms() - HOUR_MS, writer=by)


# ---------------------------------------------------------------------------------------------- stand-ins


class Session:
    """The controller's ZooKeeper session as the gates read it."""

    def __init__(self) -> None:
        self.state = "connected"
        self.stable = math.inf  # seconds since the last reconnect (inf: never had trouble)

    @property
    def connected(self) -> bool:
        return self.state == "connected"

    def stable_for(self) -> float:
        return self.stable if self.connected else 0.0


class Election:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.term: int | None = 7
        self.confirms = 0

    @property
    def is_leader(self) -> bool:
        return self.term is not None and self.session.connected

    def confirm(self) -> bool:
        """The ZooKeeper round trip: the leader node is still this session's."""
        self.confirms += 1
        return self.term is not None and self.session.connected

    def leader(self) -> None:
        return None


class Registry:
    """The broker registry's cache: who is registered, and whether it was ever read."""

    def __init__(self, *brokers: str) -> None:
        self.brokers: dict[str, BrokerInfo] = {}
        self.synced = threading.Event()
        self.synced.set()
        self.register(*brokers)

    def register(self, *brokers: str) -> None:
        for b in brokers:
            self.brokers[b] = BrokerInfo(id=b, service_url=f"pulsar://{b}", http_url=f"http://{b}")


class Channel(AckedPublish):
    """The channel client: the table it feeds, whether that table is caught up, what the leader wrote."""

    def __init__(self, table: TableView) -> None:
        self.table = table
        self.ready = True
        self.written: list[tuple[str, Record | None]] = []

    def publish(self, bundle: str, record: Record | None) -> Future[None]:
        self.written.append((bundle, record))
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def send(self, bundle: str, record: Record | None, on_done: Callable[[Exception | None], None]) -> None:
        self.written.append((bundle, record))
        on_done(None)


class Events:
    def publish(self, kind: str, **fields: Any) -> None:
        pass


@dataclass
class View:
    """A latest-value view (load reports, top bundles); ``on_read`` runs each time a job reads it."""

    values: dict[str, Any] = field(default_factory=dict)
    on_read: Callable[[], None] = lambda: None

    def snapshot(self) -> dict[str, Any]:
        self.on_read()
        return dict(self.values)


class Leader:
    """A controller that has won an election, with its monitor, healing and shedding jobs built as the
    wiring builds them, over a table of ``records``. ``caught_up=False``: the channel replica is still
    replaying (the table holds what the snapshot and the first part of the tail said, and is not live)."""

    def __init__(
        self,
        records: dict[str, Record],
        *,
        registered: tuple[str, ...] = (A, B),
        grace_s: float = 0.0,
        caught_up: bool = True,
    ) -> None:
        self.clock = ManualClock(T0_S)
        self.mono = ManualClock(100.0)
        self.session = Session()
        self.election = Election(self.session)
        self.registry = Registry(*registered)
        self.table = TableView()
        self.table.load(dict(records), {})
        self.channel = Channel(self.table)
        self.channel.ready = False
        self.leadership = Leadership(
            self.election,  # type: ignore[arg-type]
            self.session,  # type: ignore[arg-type]
            self.registry,  # type: ignore[arg-type]
            self.channel,  # type: ignore[arg-type]
            me="c1",
            settle_s=SETTLE_S,
        )
        s = Settings(shedding=SheddingSettings(hit_count_threshold=0))
        heal = HealConfig(grace_s=grace_s, in_flight_timeout_s=IN_FLIGHT_TIMEOUT_S, tombstone_delay_s=60)
        self.prom = CollectorRegistry()
        metrics = ControllerMetrics.create(self.prom)
        at = now_ms() - 1
        self.loads = View(
            {
                A: BrokerLoadData(broker=A, weighted_max_ema=0.9, msg_throughput_in=1000, updated_at=at),
                B: BrokerLoadData(broker=B, weighted_max_ema=0.1, msg_throughput_in=10, updated_at=at),
            }
        )
        top = View(
            {
                A: TopBundles(
                    broker=A,
                    bundles=[
                        BundleStats(bundle=b, msg_throughput_in=x)
                        for b, x in zip(HOT, (400, 300, 200, 100), strict=True)
                    ],
                ),
                B: TopBundles(broker=B, bundles=[BundleStats(bundle=COLD, msg_throughput_in=10)]),
            }
        )
        # As the replica wires it: the placement view hears the channel, and reads the table on catch-up.
        self.placement = placement = LivePlacement(
            lambda: self.registry.brokers, failure_domains_enabled=False, table=self.table
        )
        self.table.add_listener(placement.record_changed)
        destinations = Destinations(
            s,
            self.registry,
            self.loads,  # type: ignore[arg-type]
            placement,
            StandbyIndex(),
            rng=random.Random(0),
            clock=self.clock,
        )
        writes = ChannelWrites(self.channel, self.leadership, metrics)  # type: ignore[arg-type]
        journal = DecisionJournal(Events(), clock=self.clock)  # type: ignore[arg-type]
        self.monitor = MonitorJob(
            self.table,
            self.leadership,
            destinations,
            writes,
            journal,
            metrics,
            heal,
            clock=self.clock,
            mono=self.mono,
        )
        self.healer = Healer(
            MemoryFailedBrokers(),
            MemoryReassignments(clock=self.clock),
            heal,
            chunk_size=100,
            writer=self.leadership.writer,
            term=self.leadership.term,
            clock=self.clock,
        )
        self.healing = HealingJob(
            self.healer,
            self.table,
            self.leadership,
            destinations,
            self.loads,  # type: ignore[arg-type]
            writes,
            journal,
            metrics,
            clock=self.clock,
            mono=self.mono,
        )
        operations = OperationsJob(
            lambda: s.operations, MemoryOperations(), self.table, self.leadership, writes, journal, metrics,
            clock=self.clock,
        )  # fmt: skip
        operations.load()
        self.shedding = SheddingJob(
            s.shedding,
            self.table,
            self.leadership,
            destinations,
            self.loads,  # type: ignore[arg-type]
            top,  # type: ignore[arg-type]
            journal,
            metrics,
            ShedConfig.from_settings(s),
            clock=self.clock,
            operations=operations,
        )
        asyncio.run(self.healing.on_lead())  # what a new leader reads first (no failures persisted here)
        if caught_up:
            self.catch_up()

    def catch_up(self, tail: list[tuple[str, Record]] | None = None) -> None:
        """Replay the rest of the channel (``tail``), then turn live, as the channel client does."""
        for bundle, rec in tail or []:
            assert self.table.apply(bundle.encode(), encode(rec)) == "accepted", (bundle, rec)
        self.table.set_live()
        self.placement.load_table()
        self.channel.ready = True

    def run_jobs(self) -> list[str]:
        """One run of shedding, the monitor and healing, in that order; the bundles they wrote."""

        async def run() -> None:
            await self.shedding.run_once()
            await self.monitor.run_once()
            await self.healing.run_once()

        asyncio.run(run())
        return [b for b, _ in self.channel.written]

    def metric(self, name: str, **labels: str) -> float:
        return self.prom.get_sample_value(name, labels) or 0.0


def world() -> dict[str, Record]:
    """What every destructive job would act on: A overloaded and B idle (shedding), a bundle of an
    unregistered broker (healing), a bundle Free for an hour (the monitor's tombstone), and a bundle owned
    by A that A took over from that unregistered broker (nobody's orphan)."""
    recs = {b: owned(A, 2) for b in HOT}
    recs[COLD] = owned(B, 2)
    recs[ORPHAN] = owned(DEAD, 2)
    recs[FREED] = make(State.FREE, src=A, version=3, ts=now_ms() - HOUR_MS, writer=A)
    recs[MOVED] = owned(A, 5, src=DEAD)
    return recs


# ---------------------------------------------------------------------------------------------- the gates


def test_a_leader_still_replaying_the_channel_cleans_up_nothing_apache_pulsar_23064_23382() -> None:
    """apache/pulsar#23064, #23382: the leader's orphan cleanup acted on a view it should not have trusted
    and moved bundles that were in fact owned. In trimtab a leader whose channel replica is still replaying
    (it just took over, or its follower was restarted) is in safe mode ("warming_up"): its monitor, healing
    and shedding publish nothing. Here
    the snapshot it bootstrapped from names a dead broker as the owner -- a view the cleanup would act on --
    and the tail it has not replayed yet says a live broker took the bundle over; once caught up there is
    nothing to clean up."""
    leader = Leader({MOVED: owned(DEAD, 2)}, caught_up=False)
    assert orphaned(leader.table.items(), frozenset({DEAD})), "the partial view shows an orphan"
    assert leader.leadership.safe_mode() == "warming_up"
    assert leader.run_jobs() == []
    assert leader.metric("trimtab_shedding_cycles_total", result="skip", reason="safe_mode") == 1
    assert leader.metric("trimtab_monitor_runs_total", result="safe_mode") == 1
    assert leader.metric("trimtab_broker_failures_total", event="recorded") == 0

    # The tail: DEAD handed the bundle to A before it died (Releasing, Assigning, Owned{dst=A, src=DEAD}).
    tail = [
        (MOVED, make(State.RELEASING, src=DEAD, dst=A, version=3, ts=now_ms(), writer=DEAD)),
        (MOVED, make(State.ASSIGNING, src=DEAD, dst=A, version=4, ts=now_ms(), writer=DEAD)),
        (MOVED, make(State.OWNED, src=DEAD, dst=A, version=5, ts=now_ms(), writer=A)),
    ]
    leader.catch_up(tail)
    assert leader.leadership.safe_mode() is None
    assert leader.run_jobs() == []  # caught up: A owns it, and DEAD is nobody's dependency
    assert leader.metric("trimtab_broker_failures_total", event="recorded") == 0
    assert leader.table.get(MOVED) == tail[-1][1]


GATE_NAMES = ("leading", "zookeeper_connected", "settled", "registry_read", "channel_caught_up")


@st.composite
def gates(draw: st.DrawFn) -> dict[str, Any]:
    """Which gates are closed (any subset, the empty one and single gates included) and how."""
    closed = draw(st.sets(st.sampled_from(GATE_NAMES)))
    return {
        "closed": closed,
        "zookeeper": draw(st.sampled_from(["suspended", "lost"]))
        if "zookeeper_connected" in closed
        else "connected",
        "stable_s": draw(
            st.floats(0, SETTLE_S, exclude_max=True)
            if "settled" in closed
            else st.one_of(st.just(math.inf), st.floats(SETTLE_S, 100 * SETTLE_S))
        ),
    }


def closing(*names: str) -> dict[str, Any]:
    return {
        "closed": set(names),
        "zookeeper": "suspended" if "zookeeper_connected" in names else "connected",
        "stable_s": 0.0 if "settled" in names else math.inf,
    }


@settings(max_examples=40, deadline=None)
@given(gates())
@example(closing())
@example(closing("leading"))
@example(closing("zookeeper_connected"))
@example(closing("settled"))
@example(closing("registry_read"))
@example(closing("channel_caught_up"))
def test_every_closed_gate_holds_every_destructive_job_apache_pulsar_23064_23382(g: dict[str, Any]) -> None:
    """apache/pulsar#23064, #23382: the leader's cleanup acted on a view it should not have trusted. In
    trimtab monitor, healing and shedding write only while every gate is open: leading, the ZooKeeper
    session connected and settled ``healing.safe_mode_settle_s`` after any reconnect (registrations are
    not trustworthy while sessions re-establish), the broker registry read, the channel replica caught up.
    With any gate closed nothing is written, over a table where each of them has work to do; with all open
    each of them writes."""
    leader = Leader(world())
    closed = g["closed"]
    if "leading" in closed:
        leader.election.term = None
    leader.session.state = g["zookeeper"]
    leader.session.stable = g["stable_s"]
    if "registry_read" in closed:
        leader.registry.synced.clear()
    leader.channel.ready = "channel_caught_up" not in closed
    gated = leader.leadership.safe_mode() is not None
    assert gated == bool(closed)
    written = leader.run_jobs()
    if closed:
        assert written == []
        return
    assert ORPHAN in written  # healing: the unregistered broker's bundle
    assert FREED in written  # the monitor: the tombstone
    assert set(written) & set(HOT)  # shedding: off the loaded broker
    assert MOVED not in written  # owned by a live broker: nobody's orphan (#23064, below)


def test_a_view_that_goes_stale_while_a_round_is_decided_writes_nothing_apache_pulsar_23064() -> None:
    """apache/pulsar#23064: cleanup decided from a view that stopped being trustworthy. In trimtab the
    gates are asked again, with leadership, right before a round's first write: a channel replica that
    stopped while the round was being decided (its follower failed; the table is rebuilt from a snapshot)
    lets nothing of that round out."""
    leader = Leader(world())
    leader.loads.on_read = lambda: setattr(leader.channel, "ready", False)  # stops mid-round
    assert leader.leadership.safe_mode() is None
    decided = asyncio.run(leader.healing.run_once())
    assert [o.bundle for o in decided] == [ORPHAN]  # decided while the view could be trusted...
    assert leader.channel.written == []  # ...and none of it written: it no longer can
    assert leader.metric("trimtab_overrides_total", reason="failed_broker", result="published") == 0
    # The same round with the replica staying caught up writes the orphan's override.
    again = Leader(world())
    assert [o.bundle for o in asyncio.run(again.healing.run_once())] == [ORPHAN]
    assert [b for b, _ in again.channel.written] == [ORPHAN]
    assert again.metric("trimtab_overrides_total", reason="failed_broker", result="published") == 1


def test_a_new_leader_does_not_force_on_at_once_what_it_has_just_seen_apache_pulsar_23064() -> None:
    """apache/pulsar#23064: the ownership monitor acted on what it had just read as if it had watched it
    all along. In trimtab an in-flight record met while the table was not live (bootstrap, a history gap)
    counts as seen when the monitor first asks about it: however old its writer's timestamp, a new leader
    waits the whole in-flight timeout on its own monotonic clock before forcing it onward."""
    stuck = make(State.ASSIGNING, dst=A, version=1, ts=now_ms() - HOUR_MS, writer="lookup")
    leader = Leader({MOVED: stuck}, caught_up=False)
    leader.catch_up()
    assert asyncio.run(leader.monitor.run_once()) == []
    leader.mono.now += IN_FLIGHT_TIMEOUT_S
    assert asyncio.run(leader.monitor.run_once()) == []  # not past it yet
    leader.mono.now += 0.5
    assert [(o.bundle, o.reason) for o in asyncio.run(leader.monitor.run_once())] == [(MOVED, "stuck")]


# ------------------------------------------------------------------------------------ who is an orphan

BROKERS = st.sampled_from([A, B, DEAD, "c:1"])
RECORDS = st.builds(
    lambda state, dst, src, v: make(state, dst=dst, src=src, version=v, ts=0, writer="w"),
    st.sampled_from(list(State)),
    st.one_of(st.none(), BROKERS),
    st.one_of(st.none(), BROKERS),
    st.integers(1, 50),
)


@given(RECORDS, st.frozensets(BROKERS))
def test_an_inactive_source_never_makes_an_owned_bundle_an_orphan_apache_pulsar_23064(
    rec: Record, gone: frozenset[str]
) -> None:
    """apache/pulsar#23064: the ownership monitor cleaned owned bundles whose *source* broker was inactive,
    although their owner was alive. In trimtab a record needs healing only for the brokers it needs to make
    progress (:func:`dependents`): ``Owned`` and ``Assigning`` need their destination alone -- the source
    is history, or a dead broker a reassignment is already taking the bundle away from."""
    assert needs_healing(rec, gone) is bool(dependents(rec) & gone)
    if rec.state in (State.OWNED, State.ASSIGNING):
        assert needs_healing(rec, gone) is (rec.dst in gone)
    if not needs_healing(rec, gone):
        assert override_for("t/ns/0x00000000_0xffffffff", rec, gone, lambda b, x: A, 0, "w") is None


def test_healing_leaves_a_bundle_owned_by_a_live_broker_whatever_its_source_apache_pulsar_23064() -> None:
    """apache/pulsar#23064, end to end through a healing round: ``Owned{dst=A, src=DEAD}`` with DEAD gone
    is neither moved nor a reason to record DEAD as failed."""
    leader = Leader({MOVED: owned(A, 5, src=DEAD), COLD: owned(B, 2)})
    assert asyncio.run(leader.healing.run_once()) == []
    assert leader.channel.written == []
    assert leader.healer.failed == {}
    assert leader.metric("trimtab_broker_failures_total", event="recorded") == 0


def test_a_registered_broker_is_never_treated_as_failed_apache_pulsar_23382() -> None:
    """apache/pulsar#23382: the leader started orphan cleanups on out-dated registry notifications, for
    brokers that were in fact registered again. In trimtab the leader trusts the registry only once it was
    read and settled (the gates above), and a broker that is registered is never a failed one: a failure
    recorded when its registration vanished is cancelled, once it is registered again, before any round
    acts on it -- even when the registry's change notification has not reached the healing job yet (the
    cache is updated on ZooKeeper's thread, the job hears of it on the event loop; between the two, a round
    must not move the broker's bundles)."""
    leader = Leader({ORPHAN: owned(B, 2), COLD: owned(A, 2)}, registered=(A, "c:1"), grace_s=30)
    assert asyncio.run(leader.healing.run_once()) == []  # B's registration is gone: recorded, in its grace
    assert set(leader.healer.failed) == {B}
    leader.registry.register(B)  # back, in the cache; the membership change is not delivered yet
    leader.clock.now += 31  # past the grace
    assert asyncio.run(leader.healing.run_once()) == []
    assert leader.channel.written == []
    assert leader.healer.failed == {}
    assert leader.metric("trimtab_broker_failures_total", event="cancelled") == 1


@given(
    st.dictionaries(BROKERS, st.integers(0, 100_000)),
    st.floats(-1, 120, allow_nan=False),
    st.integers(0, 200_000),
)
def test_a_failed_broker_keeps_its_bundles_for_its_grace_apache_pulsar_23064(
    failed: dict[str, int], grace_s: float, now: int
) -> None:
    """apache/pulsar#23064: cleanup acting at once on a broker that was only briefly away. In trimtab a
    failed broker's bundles are moved only once ``healing.grace_s`` has passed since its first recorded
    failure (persisted, so a new leader keeps the original time), and never with a negative grace (healing
    disabled)."""
    cfg = HealConfig(grace_s=grace_s)
    ripe = due(failed, cfg, now)
    if grace_s < 0:
        assert ripe == []
    else:
        assert ripe == sorted(b for b, t in failed.items() if now - t >= grace_s * 1000)


# ---------------------------------------------------------------------------------------------- the backstop

BUNDLE = "t/ns/0x00000000_0xffffffff"


@given(RECORDS, RECORDS, st.sampled_from(list(State)), st.one_of(st.none(), BROKERS))
def test_a_decision_built_on_a_stale_view_is_refused_by_every_replica_apache_pulsar_23064(
    seen: Record, cur: Record, state: State, dst: str | None
) -> None:
    """apache/pulsar#23064: what a cleanup decided from an outdated view was applied over newer ownership.
    In trimtab whatever a stale decision still writes cannot take effect: a forced override is built on the
    version it saw and refused once the bundle moved on (the channel's version check, which ``force``
    never skips), and a tombstone -- which carries no version -- is refused unless the bundle is Free or
    Deleted now, so it cannot erase an assignment or an ownership that happened since."""
    rng = parse_bundle(BUNDLE)[1]
    if seen.version < cur.version:
        forced = intents.force(seen, state, dst=dst or A, src=DEAD, writer="leader", now_ms=0)
        assert resolve(rng, cur, forced) is Verdict.STALE_VERSION
    tombstone = resolve(rng, cur, None)
    assert (tombstone is ACCEPT) is (cur.state in (State.FREE, State.DELETED))
