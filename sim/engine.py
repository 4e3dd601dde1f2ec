"""The simulator's engine: one scenario under one shedding policy, on a virtual-time event loop.

What decides is the daemons' own code. The leader is :class:`~trimtab.sim.leader.SimController` -- the
controller's shedding, monitor and healing jobs on the daemon's schedules. Each agent is a
:class:`~trimtab.sim.agents.SimAgent` -- the agent's :class:`~trimtab.agent.reconciler.Reconciler` and
:class:`~trimtab.agent.lookup.LookupService` over its simulated broker (:mod:`trimtab.sim.broker`) -- and
runs its :class:`~trimtab.agent.reporter.LoadReporter` and :class:`~trimtab.agent.splits.SplitScheduler`,
and its :class:`~trimtab.agent.drain.Drainer` when told to stop. They publish through the production code
to the simulated Kafka (:mod:`trimtab.sim.transport`), and every ownership change is resolved by the
channel's own table (channel.table: first valid transition wins).

What this module keeps is the cluster and its model, between those decisions:

* the scenario's initial state (a balanced placement, :func:`~trimtab.sim.model.balanced_start`);
* the brokers: what each one serves, as its agent's operations change it (a bundle is unserved from the
  moment its broker fences it, or dies, until a broker acquired it again); the agents' processes, started,
  killed, paused and resumed;
* clients of an unserved bundle, which look one of its topics up at a live agent every
  ``model.lookup_retry_s`` (that is how a plain unload is repaired);
* the scenario's events and faults: brokers added, drained, restarted, killed, paused; load changes;
  ZooKeeper outages (sessions cannot be confirmed, the leader's gate closes), Kafka outages (every record
  held), channel records duplicated and reordered, lookups racing;
* leases: a paused agent's broker stops serving ``lease_s`` after the pause, its session expires after the
  session timeout; a ZooKeeper outage longer than a lease stops every broker;
* the recorder: load samples, moves (seen as records are produced), unserved episodes, violations.

Nothing here reads a real clock or a global random generator: same scenario, policy and seed, same run.
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec.structs import replace
from prometheus_client import CollectorRegistry

from trimtab.agent.adapters.base import BrokerSample
from trimtab.agent.drain import Drainer
from trimtab.agent.lookup import IndexedAssignment, LookupResult
from trimtab.agent.metrics import AgentMetrics
from trimtab.balance.assign import BrokerInfo
from trimtab.balance.heal import Override
from trimtab.balance.load import (
    BrokerLoadData,
    BundleStats,
    TopBundles,
    Usage,
)
from trimtab.balance.split import SplitLimits, over_limit
from trimtab.channel import intents
from trimtab.channel.bundles import BundleLayout, BundleRange
from trimtab.channel.client import ChannelClient
from trimtab.channel.records import Record, State, decode
from trimtab.cluster.events import EventPublisher
from trimtab.cluster.kvview import KeyValueView
from trimtab.config.settings import Settings
from trimtab.errors import LookupTimeout, RequestError
from trimtab.sim.agents import (
    Routes,
    SimAgent,
    SimRegistration,
    build_drainer,
)
from trimtab.sim.broker import BrokerModel, SimBroker
from trimtab.sim.clock import VirtualLoop
from trimtab.sim.leader import EVENTS_TOPIC, SimController, SimRegistry, job_failures
from trimtab.sim.logs import quiet_daemons
from trimtab.sim.model import LoadModel, Served, balanced_start
from trimtab.sim.policies import shedder_for
from trimtab.sim.scenario import BrokerSpec, Event, Scenario
from trimtab.sim.transport import Pending, SimTransport

CHANNEL = "trimtab-sim-channel"
LEADER = "sim-leader"
CORES = 4.0
BANDWIDTH = 125e6  # bytes/s each way, as the built-in simulated broker
_enc = msgspec.json.Encoder()


@dataclass
class Broker:
    id: str
    info: BrokerInfo
    capacity: float  # msg/s in+out at 100% CPU
    serving: Served
    registered: bool = True  # its ZooKeeper registration exists (the leader counts it live)
    agent_up: bool = True  # the agent reacts, reports, renews
    draining: bool = False
    leaving: bool = False  # remove/restart: gone once drained
    fenced: set[str] = field(default_factory=set)  # clients still connected, not served
    stop: asyncio.Event | None = None  # set when the process stops (kill, pause): a drain in progress ends
    agent: SimAgent | None = None  # this incarnation's agent process
    sample: tuple[tuple[int, tuple[float, ...]], BrokerSample] | None = None  # the last figures, and of what


@dataclass
class Move:
    t: float
    bundle: str
    src: str
    dst: str | None
    reason: str  # shed:<overloaded|underloaded> | heal | drain | split | merge
    throughput: float


@dataclass
class Sample:
    t: float
    loads: dict[str, float]  # live broker -> load fraction (max of cpu and bandwidth)
    std: float
    moves: int
    bundles: int = 0  # live bundles (splits add, merges remove)


@dataclass(frozen=True)
class Snapshot:
    """Who serves what, and how heavy each bundle is, at one instant (the exact optimum's input)."""

    t: float
    bundle_load: dict[str, float]  # msg/s in+out
    owner: dict[str, str]
    capacity: dict[str, float]  # live brokers


@dataclass
class RunResult:
    policy: str
    samples: list[Sample]
    moves: list[Move]
    unserved: list[tuple[float, float]]
    lookups: Counter[str]
    violations: Counter[str]
    shed_cycles: Counter[str]
    splits: int
    healed: int
    records: int
    channel_stats: dict[str, Any]
    end_owners: dict[str, str]
    event_times: list[float]
    virtual_s: float
    merges: int = 0


class Engine:
    def __init__(  # noqa: PLR0915
        self,
        scenario: Scenario,
        policy: str,
        settings: Settings | None = None,
        *,
        snapshot_at: float | None = None,
    ) -> None:
        self.sc = scenario
        self.policy = policy
        self.s = settings or scenario.settings()
        self.m = scenario.model
        self.shedder = shedder_for(policy)
        seed = scenario.seed
        self.rng_assign = random.Random(f"{seed}/assign")
        self.rng_events = random.Random(f"{seed}/events")
        self.rng_faults = random.Random(f"{seed}/faults")
        self.rng_phase = random.Random(f"{seed}/phase")
        self.load = LoadModel(scenario.namespaces, self.m, seed)
        self.split_limits = SplitLimits.from_settings(self.s)
        self.lease_s = self.s.lease_s()
        self.session_s = self.s.zookeeper.session_timeout_s

        self.loop = VirtualLoop()

        self.zk_down_until = -1.0
        self.kafka_down_until = -1.0
        # The simulated Kafka, and what every node reads from it: the channel's table (one for all nodes:
        # they all see a record at the same instant) and the leader's load views.
        self.transport = SimTransport(
            self.loop,
            delay_s=self.m.channel_s,
            held_until=lambda: self.kafka_down_until,
            channel_topic=CHANNEL,
            misbehave=self._misbehave,
        )
        self.channel = ChannelClient(self.transport, CHANNEL, packed_table=False)  # see TableView
        self.table = self.channel.table
        self.table.partitions = self.transport.partitions(CHANNEL)
        self.table.set_live()
        self.transport.follow(CHANNEL, self.table.apply_all)
        k = self.s.kafka
        self.loads: KeyValueView[BrokerLoadData] = KeyValueView(
            self.transport, k.broker_load_topic, BrokerLoadData
        )
        self.top: KeyValueView[TopBundles] = KeyValueView(self.transport, k.top_bundles_topic, TopBundles)
        self.transport.follow(k.broker_load_topic, self.loads.apply)
        self.transport.follow(k.top_bundles_topic, self.top.apply)
        self.registry = SimRegistry(self._live)
        self.leader = SimController(
            self.s,
            self.loop,
            me=LEADER,
            channel=self.channel,
            transport=self.transport,
            registry=self.registry,
            loads=self.loads,
            top=self.top,
            rng=self.rng_assign,
            shedder=self.shedder,
        )
        self.agent_metrics = AgentMetrics.create(CollectorRegistry())  # shared by every simulated agent
        # The agents' assignment index (agent/lookup.py): one for all, since it depends on the registered
        # brokers and the reports only, which every simulated agent shares
        dest = self.leader.destinations
        self.indexed = IndexedAssignment(
            self.s,
            self.loads.values,
            lambda: self.registry.brokers,
            open_to_all=lambda bundle: not dest.standbys.of(bundle) and dest.placement.open_to_all(bundle),
            clock=self.loop.time,
        )
        self.loads.add_listener(self.indexed.changed)
        self.events = EventPublisher(self.transport, EVENTS_TOPIC, source="sim-agents", role="agent")
        self.leader.on_overrides = self._overridden
        self.leader.on_heal_paused = lambda: self.shed_cycles.update(["healing_paused"])
        self.transport.observers.append(self._produced)
        # The agents whose process runs hear the channel's changes (agent.wiring's routing) and the
        # registry's.
        self.routes = Routes()
        self.table.add_listener(self.routes.changed)
        self.registry.listeners.append(self.routes.membership_changed)
        self.crashes: list[str] = []  # what an agent's task or a lookup raised that it must not

        self.brokers: dict[str, Broker] = {}
        self._next_broker = 0
        self.layouts = {n.name: BundleLayout.default(n.name, n.bundles) for n in scenario.namespaces}
        self.live_bundles: set[str] = {b for lay in self.layouts.values() for b in lay.bundles}
        self.servers: dict[str, set[str]] = defaultdict(set)
        self.unserved_since: dict[str, float] = {b: 0.0 for b in self.live_bundles}
        self.unserved: list[tuple[float, float]] = []  # (from, to) of every unserved episode
        self.lookups: Counter[str] = Counter()
        self._lookup_pending: set[str] = set()
        self.violations: Counter[str] = Counter()
        self.moves: list[Move] = []
        self.shed_moves = 0  # of self.moves, those the shedder made (counted as they come: sampled often)
        self.samples: list[Sample] = []
        self.shed_cycles: Counter[str] = Counter()
        self.splits = 0
        self.merges = 0
        self.healed = 0
        self.event_times = sorted({e.at_s for e in scenario.events})
        self.snapshot_at = snapshot_at
        self.snapshot: Snapshot | None = None
        self._over: dict[str, tuple[BundleStats, bool]] = {}

    # ------------------------------------------------------------------ the clock
    @property
    def now(self) -> float:
        return self.loop.time()

    @property
    def now_ms(self) -> int:
        return round(self.now * 1000)

    def at(self, t: float, fn: Callable[[], None]) -> None:
        self.loop.call_at(t, fn)

    def every(
        self, period: float, first: float, fn: Callable[[], None], alive: Callable[[], bool] = lambda: True
    ) -> None:
        def tick() -> None:
            if not alive():
                return
            fn()
            self.at(self.now + period, tick)

        self.at(first, tick)

    # ------------------------------------------------------------------ run
    def run(self) -> RunResult:
        for spec in self.sc.broker_specs():
            self._add_broker(spec, initial=True)
        self._publish_initial_state()
        self.every(self.sc.report.sample_s, 0.0, self._sample)
        self.loop.call_soon(self.leader.start)
        for e in self.sc.events:
            self.at(e.at_s, functools.partial(self._event, e))
        if self.snapshot_at is not None:
            self.at(self.snapshot_at, self._take_snapshot)  # after the events of that instant
        end = self.sc.duration_s
        try:
            with quiet_daemons() as logged:
                self.loop.run_until(end)
                self.loop.advance_to(end)
                self._stop_jobs()
        finally:
            self.loop.close()
        failures = self.leader.failures() + job_failures(self.agent_metrics.job_failures)
        failures += logged["reconcile_crashed"] + len(self.crashes)
        if failures:
            raise RuntimeError(
                f"{failures} runs of the daemons' jobs raised (job_failed or reconcile_crashed on stderr; "
                f"{self.crashes[:3]}): the simulation does not stand for the daemons"
            )
        self.shed_cycles.update(self.leader.shed_cycles())
        lost = [
            b for b, since in self.unserved_since.items() if b in self.live_bundles and end - since > 120.0
        ]
        self.unserved.extend(
            (since, end) for b, since in self.unserved_since.items() if b in self.live_bundles
        )
        if lost:
            self.violations["lost_bundles"] += len(lost)
        owners = {b: r.dst for b, r in self.table.items() if r.state is State.OWNED and r.dst is not None}
        return RunResult(
            policy=self.policy,
            samples=self.samples,
            moves=self.moves,
            unserved=self.unserved,
            lookups=self.lookups,
            violations=self.violations,
            shed_cycles=self.shed_cycles,
            splits=self.splits,
            merges=self.merges,
            healed=self.healed,
            records=self.transport.delivered,
            channel_stats=self.table.stats.as_dict(),
            end_owners=owners,
            event_times=self.event_times,
            virtual_s=end,
        )

    def _stop_jobs(self) -> None:
        """Cancel every job still running (a run in progress is cancelled, as at a daemon's shutdown)."""
        tasks = asyncio.all_tasks(self.loop)
        for t in tasks:
            t.cancel()
        self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))

    # ------------------------------------------------------------------ brokers
    def _new_id(self) -> str:
        while True:
            bid = f"broker-{self._next_broker:03d}"
            self._next_broker += 1
            if bid not in self.brokers:
                return bid

    def _add_broker(self, spec: BrokerSpec | None = None, *, initial: bool = False) -> Broker:
        spec = spec or BrokerSpec(id=self._new_id())
        info = BrokerInfo(
            id=spec.id,
            service_url=f"pulsar://{spec.id}",
            http_url=f"http://{spec.id}",
            tags=dict(spec.tags),
            failure_domain=spec.domain,
            start_time=self.now_ms,
        )
        b = Broker(spec.id, info, spec.capacity_msg_rate or self.m.capacity_msg_rate, Served(self.load))
        self.brokers[spec.id] = b
        self.registry.changed()
        self._start_agent(b, phase=initial)
        return b

    def _start_agent(self, b: Broker, *, phase: bool = False) -> None:
        """The agent process (agent.daemon): its reconciler and lookups start at once; its background jobs
        -- load reports and auto-splits, each with its schedule -- run while the agent stays (up,
        registered, not leaving), from the moment it registered (the first report at once). The brokers of
        the initial cluster were running before the scenario began, not started in lockstep at 0: their
        jobs start at a random ``phase`` within one report interval."""
        m = self.m
        model = BrokerModel(
            serve=functools.partial(self._serve, b),
            fence=functools.partial(self._unserve, b, fenced=True),
            close=functools.partial(self._unserve, b),
            split=functools.partial(self._split_on_broker, b),
            merge=functools.partial(self._merge_on_broker, b),
            serves=b.serving.__contains__,
            figures=functools.partial(self._broker_sample, b),
        )
        b.agent = SimAgent(
            self.s,
            self.loop,
            me=b.id,
            channel=self.channel,
            transport=self.transport,
            broker=SimBroker(model, acquire_s=m.acquire_s, release_s=m.release_s, split_s=m.split_s),
            registry=self.registry,
            zk_up=lambda: self.now >= self.zk_down_until,
            loads=self.loads,
            placement=self.leader.destinations.rule,
            indexed=self.indexed,
            rng=self.rng_assign,
            events=self.events,
            metrics=self.agent_metrics,
            routes=self.routes,
            layouts=lambda: self.layouts,
            apply_split=self._apply_split,
            apply_merge=self._apply_merge,
            leaving=lambda: b.leaving,
            failed=self.crashes.append,
        )
        delay = self.rng_phase.uniform(0, self.s.load.report_interval_s)
        if self.s.split.enabled:
            # Drawn and unused: the split cycle's first run is one interval after the jobs start, as the
            # daemon's. Kept so that every broker's phase is what it was when the engine drew one per job
            # (the same scenario and seed keep their report phases).
            self.rng_phase.uniform(0, self.s.split.interval_s)
        self.at(self.now, functools.partial(self._run_agent, b))
        self.at(self.now + (delay if phase else 0.0), functools.partial(self._agent_jobs, b))

    def _run_agent(self, b: Broker) -> None:
        if self.brokers.get(b.id) is b and b.agent_up and b.agent is not None:
            b.agent.start()
            self.routes.start(b.agent)

    def _halt(self, b: Broker) -> None:
        """The agent process stops doing anything (killed, stopped, exited)."""
        if b.agent is not None:
            self.routes.stop(b.agent)
            b.agent.halt()

    def _staying(self, b: Broker) -> bool:
        """The agent daemon's gate on its reports and splits, for this incarnation of the broker."""
        return self.brokers.get(b.id) is b and b.agent_up and b.registered and not b.leaving

    def _agent_jobs(self, b: Broker) -> None:
        """The agent's reports and splits run while it stays."""
        if b.agent is not None:
            b.agent.run_jobs(self._staying(b))

    def _stop_agent(self, b: Broker) -> None:
        """The agent process is gone."""
        if b.agent is not None:
            self.routes.stop(b.agent)
            b.agent.exit()

    def _broker_sample(self, b: Broker) -> BrokerSample:
        """What the simulated broker reports (the cluster model): CPU at ``2 x msg/s / capacity``, bandwidth
        both ways, no memory signal, and every bundle it serves (with its topics' loads when a split limit
        is exceeded -- what a split's algorithm needs). Kept while neither the bundles nor their loads
        change."""
        now = self.now
        key = (b.serving.version, tuple(self.load.multipliers(now).values()))
        if b.sample is not None and b.sample[0] == key:
            return b.sample[1]
        rate_in = b.serving.rate(now)
        t_in = rate_in * self.m.msg_size_bytes
        split = self.s.split.enabled
        stats = []
        for x in b.serving:
            st = self.load.stats(x, now)
            if split and self._over_limit(st):
                st = self.load.stats(x, now, topic_loads=True)
            stats.append(st)
        sample = BrokerSample(
            cpu=Usage(CORES * 2 * rate_in / b.capacity, CORES),
            memory=Usage(0.0, 8 << 30),
            bandwidth_in=Usage(t_in, BANDWIDTH),
            bandwidth_out=Usage(t_in, BANDWIDTH),
            bundles=stats,
        )
        b.sample = (key, sample)
        return sample

    def _over_limit(self, st: BundleStats) -> bool:
        """Whether a split limit is exceeded (kept per figures: the model's figures are kept while a
        namespace's load does not change)."""
        kept = self._over.get(st.bundle)
        if kept is None or kept[0] is not st:
            kept = self._over[st.bundle] = (st, over_limit(st, self.split_limits) is not None)
        return kept[1]

    def _live(self) -> dict[str, BrokerInfo]:
        """What the registry shows: registered brokers, with their draining flag."""
        out = {}
        for b in self.brokers.values():
            if b.registered:
                out[b.id] = replace(b.info, draining=True) if b.draining else b.info
        return out

    # ------------------------------------------------------------------ serving (the invariants)
    def _serve(self, b: Broker, bundle: str) -> None:
        """The broker took the bundle over (its agent's acquire)."""
        if bundle in b.serving:
            return
        b.serving.add(bundle)
        b.fenced.discard(bundle)
        holders = self.servers[bundle]
        holders.add(b.id)
        if len(holders) > 1:
            self.violations["double_serving"] += 1
        since = self.unserved_since.pop(bundle, None)
        if since is not None:
            self.unserved.append((since, self.now))

    def _unserve(self, b: Broker, bundle: str, *, fenced: bool = False) -> None:
        """The broker stops serving the bundle: fenced (its clients stay connected) or closed, or it died
        or its lease ran out; a bundle nobody serves has clients looking it up."""
        was = bundle in b.serving
        b.serving.discard(bundle)
        if fenced and was:
            b.fenced.add(bundle)
        elif not fenced:
            b.fenced.discard(bundle)
        if not was:
            return
        holders = self.servers[bundle]
        holders.discard(b.id)
        if not holders and bundle in self.live_bundles:
            self.unserved_since.setdefault(bundle, self.now)
            self._schedule_lookup(bundle)

    def _split_on_broker(self, b: Broker, bundle: str, children: Sequence[str]) -> None:
        """The broker splits ``bundle`` in place: whoever was served in it is served in its children (a
        split done already is done)."""
        if bundle not in self.live_bundles:
            return
        served = bundle in b.serving
        self.live_bundles.discard(bundle)
        self.unserved_since.pop(bundle, None)
        self.servers.pop(bundle, None)
        b.serving.discard(bundle)
        for c in children:
            self.live_bundles.add(c)
            if served:
                b.serving.add(c)
                self.servers[c].add(b.id)
            else:
                self.unserved_since.setdefault(c, self.now)
        self.splits += 1
        self.moves.append(Move(self.now, bundle, b.id, b.id, "split", 0.0))

    def _apply_split(self, namespace: str, parent: BundleRange, children: list[BundleRange]) -> None:
        """The namespace's layout as ZooKeeper holds it, after a split (the reconciler's UpdateLayout)."""
        lay = self.layouts[namespace]
        if parent.lower in lay.boundaries and parent.upper in lay.boundaries:
            self.layouts[namespace] = lay.with_split(parent, children)

    def _merge_on_broker(self, b: Broker, parents: Sequence[str], merged: str) -> None:
        """The broker merges ``parents`` into ``merged`` in place: whoever was served in both is served in
        the merged bundle (a merge grants no lease, so a parent not served leaves the merged bundle to be
        acquired, as agent.adapters.simulated does); a merge done already is done."""
        if not any(p in self.live_bundles for p in parents):
            return
        served = all(p in b.serving for p in parents)
        for p in parents:
            self.live_bundles.discard(p)
            self.unserved_since.pop(p, None)
            self.servers.pop(p, None)
            b.serving.discard(p)
        self.live_bundles.add(merged)
        if served:
            b.serving.add(merged)
            self.servers[merged].add(b.id)
        elif not self.servers.get(merged):
            self.unserved_since.setdefault(merged, self.now)
            self._schedule_lookup(merged)  # a parent's clients, if it was served, are disconnected
        self.merges += 1
        self.moves.append(Move(self.now, merged, b.id, b.id, "merge", 0.0))

    def _apply_merge(self, namespace: str, merged: BundleRange, inner: int) -> None:
        """The namespace's layout as ZooKeeper holds it, after a merge (the reconciler's UpdateLayoutMerge)."""
        lay = self.layouts[namespace]
        if inner in lay.boundaries:
            self.layouts[namespace] = lay.with_merge(merged, inner)

    # ------------------------------------------------------------------ the channel
    def _misbehave(self, batch: list[Pending]) -> list[Pending]:
        """The fault injector on the channel: in the scenario's fault window, records of a delivery are
        swapped with the next (``reorder_p``) or delivered twice (``duplicate_p``)."""
        f = self.sc.faults
        if f is None or not (f.from_s <= self.now < f.until_s):
            return batch
        dup, reorder = f.duplicate_p, f.reorder_p
        out = list(batch)
        r = self.rng_faults
        for i in range(len(out) - 1):
            if r.random() < reorder:
                out[i], out[i + 1] = out[i + 1], out[i]
        final: list[Pending] = []
        for item in out:
            final.append(item)
            if r.random() < dup:
                final.append(item)
        return final

    # ------------------------------------------------------------------ clients of unserved bundles
    def _schedule_lookup(self, bundle: str) -> None:
        if bundle not in self._lookup_pending:
            self._lookup_pending.add(bundle)
            self.at(self.now + self.m.lookup_retry_s, functools.partial(self._lookup, bundle))

    def _lookup(self, bundle: str) -> None:
        """A client of the unserved ``bundle`` looks one of its topics up at a live agent -- and, with the
        faults' ``race_p``, while the bundle is unowned, at a second one at once (two agents racing to
        assign it); it looks again ``lookup_retry_s`` after the answer while the bundle is unserved."""
        if bundle not in self.live_bundles or self.servers.get(bundle):
            self._lookup_pending.discard(bundle)
            return
        agents = [b.agent for b in self.brokers.values() if b.agent_up and b.registered and b.agent]
        if not agents:
            self._lookup_pending.discard(bundle)
            self._schedule_lookup(bundle)
            return
        self.lookups["total"] += 1
        asked = [self.rng_assign.choice(agents)]
        cur = self.table.get(bundle)
        f = self.sc.faults
        unowned = cur is None or cur.state is State.FREE
        if unowned and f is not None and f.race_p and self.rng_faults.random() < f.race_p:
            asked.append(self.rng_assign.choice(agents))
            self.lookups["raced"] += 1
        self.loop.create_task(self._client(bundle, asked))

    async def _client(self, bundle: str, asked: list[SimAgent]) -> None:
        topic = self.load.topic_of(bundle)
        answers = await asyncio.gather(*(a.ask(topic) for a in asked), return_exceptions=True)
        for answer in answers:
            self.lookups[self._outcome(answer)] += 1
        self._lookup_pending.discard(bundle)
        self._schedule_lookup(bundle)

    def _outcome(self, answer: LookupResult | BaseException) -> str:
        """A lookup's answer, as the client counts it: how it was resolved (owned, waited, assigned), or
        why not."""
        if isinstance(answer, LookupResult):
            return answer.how
        if isinstance(answer, LookupTimeout):
            return "timeout"
        if isinstance(answer, RequestError):
            return f"refused_{answer.status}"
        if isinstance(answer, asyncio.CancelledError):
            return "agent_stopped"
        self.crashes.append(f"lookup: {answer!r}")
        return "crashed"

    def _publish_initial_state(self) -> None:
        """The scenario's initial state, written before anything runs: every bundle ``Assigning`` to its
        broker in a balanced placement (:func:`~trimtab.sim.model.balanced_start`); the agents take them
        over as the run starts."""
        capacity = {b.id: b.capacity for b in self.brokers.values()}
        owners = balanced_start(self.live_bundles, capacity, lambda x: self.load.rate(x, 0.0))
        for bundle, dst in owners.items():
            self.channel.publish(bundle, intents.assign(None, dst, writer=LEADER, now_ms=0))

    # ------------------------------------------------------------------ load reports
    def broker_load(self, b: Broker) -> float:
        """True load fraction right now: max of CPU and bandwidth use (memory is not modelled)."""
        rate = b.serving.rate(self.now)
        cpu = 2 * rate / b.capacity
        bw = rate * self.m.msg_size_bytes / BANDWIDTH
        return max(cpu, bw)

    # ------------------------------------------------------------------ the recorder
    def _owner(self, bundle: str) -> str | None:
        r = self.table.get(bundle)
        return r.dst if r is not None and r.state is State.OWNED else None

    def _produced(self, topic: str, key: bytes, value: bytes | None) -> None:
        """Every record produced, as it is produced. A ``Releasing`` is a move: by the leader's shedding
        job (its reason and throughput are those of the job's decision), or by a draining agent."""
        if topic != CHANNEL or value is None:
            return
        rec = decode(value)
        if not isinstance(rec, Record) or rec.force or rec.state is not State.RELEASING or rec.src is None:
            return
        bundle = key.decode()
        if rec.writer == self.leader.leadership.writer():
            shedding = self.leader.shedding
            for u in shedding.last.decisions if shedding is not None and shedding.last is not None else []:
                if u.bundle == bundle:
                    self.moves.append(Move(self.now, bundle, u.src, u.dst, f"shed:{u.reason}", u.throughput))
                    self.shed_moves += 1
                    return
            return
        b = self.brokers.get(rec.writer)
        if b is not None and b.leaving and rec.writer == rec.src:
            self.moves.append(Move(self.now, bundle, rec.src, rec.dst, "drain", 0.0))

    def _overridden(self, overrides: list[Override]) -> None:
        """The forced records a round of healing or of the monitor published."""
        for o in overrides:
            if o.reason == "failed_broker":
                self.healed += 1
                self.moves.append(Move(self.now, o.bundle, o.broker or "", o.dst, "heal", 0.0))
            elif o.reason == "stuck":
                self.moves.append(Move(self.now, o.bundle, o.broker or "", o.dst, "stuck", 0.0))

    def _take_snapshot(self) -> None:
        owner = {}
        for bundle in sorted(self.live_bundles):
            holders = sorted(self.servers.get(bundle, ()))
            if holders:
                owner[bundle] = holders[0]
        cap = {b.id: b.capacity for b in self.brokers.values() if b.registered and not b.draining}
        loads = {b: 2 * self.load.rate(b, self.now) for b in owner if owner[b] in cap}
        self.snapshot = Snapshot(self.now, loads, {b: o for b, o in owner.items() if b in loads}, cap)

    # ------------------------------------------------------------------ samples
    def _sample(self) -> None:
        loads = {b.id: self.broker_load(b) for b in self.brokers.values() if b.registered}
        vals = list(loads.values())
        std = 0.0
        if vals:
            avg = math.fsum(vals) / len(vals)
            std = math.sqrt(max(0.0, math.fsum(v * v for v in vals) / len(vals) - avg * avg))
        self.samples.append(Sample(self.now, loads, std, self.shed_moves, len(self.live_bundles)))

    # ------------------------------------------------------------------ scenario events
    def _pick(self, n: int, pred: Callable[[Broker], bool]) -> list[Broker]:
        pool = sorted((b for b in self.brokers.values() if pred(b)), key=lambda b: b.id)
        return self.rng_events.sample(pool, min(n, len(pool)))

    def _event(self, e: Event) -> None:
        a = e.action
        if a == "add_brokers":
            for _ in range(e.add_brokers or 0):
                self._add_broker()
        elif a == "remove_brokers":
            for b in self._pick(e.remove_brokers or 0, lambda b: b.registered and not b.leaving):
                self._drain(b, back_after=None)
        elif a == "restart":
            victims = self._pick(e.restart or 0, lambda b: b.registered and not b.leaving)
            n = len(victims)
            for i, b in enumerate(victims):
                t = self.now + (e.within_s * i / n if n else 0.0)
                self.at(t, functools.partial(self._drain, b, e.down_s))
        elif a == "kill":
            for b in self._pick(e.kill or 0, lambda b: b.registered):
                self._kill(b)
        elif a == "pause":
            d = e.duration_s or 0.0
            for b in self._pick(e.pause or 0, lambda b: b.registered and b.agent_up):
                self._pause(b, d)
        elif a == "load_scale":
            for ns, f in (e.load_scale or {}).items():
                self.load.scale[ns] = f
        elif a == "zookeeper_outage":
            d = e.duration_s or 0.0
            self.zk_down_until = max(self.zk_down_until, self.now + d)
            self.leader.suspend(self.zk_down_until)
            if d > self.lease_s:
                # No agent can renew: every lease runs out lease_s after the outage began.
                self.at(self.now + self.lease_s, self._leases_run_out_everywhere)
            self.at(self.now + d, self._zk_back)
        elif a == "kafka_outage":
            self.kafka_down_until = max(self.kafka_down_until, self.now + (e.duration_s or 0.0))

    def _leases_run_out_everywhere(self) -> None:
        if self.now >= self.zk_down_until:
            return
        for b in self.brokers.values():
            for x in sorted({*b.serving, *b.fenced}):
                self._unserve(b, x)

    def _zk_back(self) -> None:
        # Sessions survived (the server was down, not the clients): each agent's lease renewer, at its next
        # round, finds what its broker stopped serving, and its reconciler acquires it again if it is
        # still the broker's.
        for agent in self.routes.running.values():
            agent.renew()

    def _drain(self, b: Broker, back_after: float | None) -> None:
        """SIGTERM: the agent's :class:`~trimtab.agent.drain.Drainer` marks the broker draining, transfers
        every owned bundle away and waits until the channel names it nowhere and the broker closed
        everything (or the drain timeout); then the broker is gone (and maybe back)."""
        if not b.registered or not b.agent_up or b.agent is None:
            return
        b.leaving = True
        self._agent_jobs(b)  # the reports and splits stop once the agent starts to leave
        b.stop = asyncio.Event()
        b.agent.drainer = drainer = build_drainer(
            self.s,
            self.loop,
            info=b.info,
            channel=self.channel,
            registration=SimRegistration(self.registry, functools.partial(self._registration_updated, b)),
            closing=b.agent.reconciler,
            loads=self.loads,
            placement=self.leader.destinations.rule,
            rng=self.rng_assign,
        )
        self.loop.create_task(self._drain_then_leave(b, drainer, b.stop, back_after))

    def _registration_updated(self, b: Broker, info: BrokerInfo) -> None:
        if self.brokers.get(b.id) is b and b.registered:
            b.draining = info.draining
            self.registry.changed()

    async def _drain_then_leave(
        self, b: Broker, drainer: Drainer, stop: asyncio.Event, back_after: float | None
    ) -> None:
        await drainer.drain(stop)
        if self.brokers.get(b.id) is b and b.agent_up:
            self._leave(b, back_after)

    def _leave(self, b: Broker, back_after: float | None) -> None:
        for x in sorted({*b.serving, *b.fenced}):
            self._unserve(b, x)
        b.registered = False
        b.agent_up = False
        self.registry.changed()
        self._stop_agent(b)
        if b.agent is not None:
            self.loop.create_task(b.agent.reporter.tombstone())  # the agent's graceful stop
        if back_after is not None:
            self.at(self.now + back_after, lambda: self._come_back(b))

    def _come_back(self, b: Broker) -> None:
        fresh = Broker(b.id, b.info, b.capacity, Served(self.load))
        self.brokers[b.id] = fresh
        self.registry.changed()
        self._start_agent(fresh)

    def _kill(self, b: Broker) -> None:
        """kill -9 of the broker and its agent (the machine died): clients drop at once; the registration
        lasts until the session times out."""
        b.agent_up = False
        if b.stop is not None:
            b.stop.set()
        self._stop_agent(b)
        for x in sorted({*b.serving, *b.fenced}):
            self._unserve(b, x)
        self.at(self.now + self.session_s, lambda: self._expire(b))

    def _expire(self, b: Broker) -> None:
        if self.brokers.get(b.id) is b and not b.agent_up:
            b.registered = False
            self.registry.changed()

    def _pause(self, b: Broker, duration: float) -> None:
        """SIGSTOP of the agent: its broker keeps serving until the leases it holds run out."""
        b.agent_up = False
        if b.stop is not None:
            b.stop.set()  # a stopped process drains nothing; it does not leave by itself either
        self._agent_jobs(b)
        self._halt(b)
        self.at(self.now + self.lease_s, lambda: self._lease_expiry(b))
        if duration >= self.session_s:
            self.at(self.now + self.session_s, lambda: self._expire(b))
        self.at(self.now + duration, lambda: self._resume(b))

    def _lease_expiry(self, b: Broker) -> None:
        if not b.agent_up:
            for x in sorted({*b.serving, *b.fenced}):
                self._unserve(b, x)

    def _resume(self, b: Broker) -> None:
        """SIGCONT. When the session expired meanwhile, the agent finds it lost (everything naming it is
        stale, what its broker serves is fenced) and registers in a new one."""
        agent = b.agent
        if agent is None:
            return
        b.agent_up = True
        if not b.registered:
            agent.session_lost()
            b.registered = True
            self.registry.changed()
            agent.registered()
        self._agent_jobs(b)
        self.routes.start(agent)
        agent.resume()
