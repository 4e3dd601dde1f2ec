"""The simulator's engine: one scenario under one shedding policy, on a virtual-time event loop.

What decides is the daemons' own code. The leader is :class:`~trimtab.sim.leader.SimController` -- the
controller's shedding, monitor and healing jobs on the daemon's schedules; each agent runs its
:class:`~trimtab.agent.reporter.LoadReporter` and :class:`~trimtab.agent.splits.SplitScheduler`, and its
:class:`~trimtab.agent.drain.Drainer` when told to stop (:mod:`trimtab.sim.agents`). They publish through
the production code to the simulated Kafka (:mod:`trimtab.sim.transport`), and every ownership change is
resolved by the channel's own table (channel.table: first valid transition wins).

What this module keeps is the cluster and its model, between those decisions:

* the brokers: each agent's reconciler acts on the role plans (balance.roles) -- a broker takes
  ``model.acquire_s`` to take a bundle over and ``model.release_s`` to fence or close one; a bundle is
  unserved from the moment its broker fences it (or dies) until a broker acquired it again;
* clients of an unserved bundle look it up every ``model.lookup_retry_s``; a lookup of an unowned bundle
  makes an agent choose a broker (balance.assign) and publish ``Assigning`` (a plain unload is repaired this
  way);
* the scenario's events and faults: brokers added, drained, restarted, killed, paused; load changes;
  ZooKeeper outages (leases stop renewing, the leader's gate closes), Kafka outages (every record held),
  channel records duplicated and reordered, lookups racing;
* leases: a paused agent's broker stops serving ``lease_s`` after the pause, its session expires after the
  session timeout;
* the recorder: load samples, moves (seen as records are produced), unserved episodes, violations.

Nothing here reads a real clock or a global random generator: same scenario, policy and seed, same run.
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec.structs import replace
from prometheus_client import CollectorRegistry

from trimtab.agent.adapters.base import BrokerSample
from trimtab.agent.drain import Drainer
from trimtab.agent.metrics import AgentMetrics
from trimtab.agent.reporter import LoadReporter
from trimtab.agent.splits import SplitScheduler
from trimtab.balance.assign import AssignContext, BrokerInfo, BurstPicks, select_broker
from trimtab.balance.heal import Override
from trimtab.balance.load import (
    BrokerLoadData,
    BundleStats,
    TopBundles,
    Usage,
)
from trimtab.balance.roles import (
    Acquire,
    Close,
    Fence,
    Forget,
    Publish,
    PublishChildren,
    SplitOnBroker,
    Step,
    UpdateLayout,
    plan,
)
from trimtab.balance.split import SplitLimits, over_limit
from trimtab.channel import intents
from trimtab.channel.bundles import BundleLayout, parse_bundle
from trimtab.channel.client import ChannelClient
from trimtab.channel.records import Record, State, decode
from trimtab.channel.transport import Message
from trimtab.cluster.events import EventPublisher
from trimtab.cluster.kvview import KeyValueView
from trimtab.cluster.runner import JobRunner
from trimtab.config.settings import Settings
from trimtab.sim.agents import (
    SimClosing,
    SimLayouts,
    SimRegistration,
    SimSampler,
    build_drainer,
    build_reporter,
    build_splitter,
)
from trimtab.sim.clock import VirtualLoop
from trimtab.sim.leader import EVENTS_TOPIC, SimController, SimRegistry, job_failures
from trimtab.sim.logs import quiet_daemons
from trimtab.sim.model import LoadModel, Served
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
    fenced: set[str] = field(default_factory=set)
    busy: set[str] = field(default_factory=set)
    stop: asyncio.Event | None = None  # set when the process stops (kill, pause): a drain in progress ends
    again: set[str] = field(default_factory=set)
    done: dict[str, tuple[int, str]] = field(default_factory=dict)
    stale: set[str] = field(default_factory=set)
    epoch: int = 0  # bumped when the agent stops (pending steps are dropped)
    jobs: JobRunner | None = None  # this incarnation's agent jobs (load reports, auto-splits)
    reporter: LoadReporter | None = None
    splitter: SplitScheduler | None = None
    sample: tuple[tuple[int, tuple[float, ...]], BrokerSample] | None = None  # the last figures, and of what
    paused_at: float | None = None


@dataclass
class Move:
    t: float
    bundle: str
    src: str
    dst: str | None
    reason: str  # shed:<overloaded|underloaded> | heal | drain | split
    throughput: float


@dataclass
class Sample:
    t: float
    loads: dict[str, float]  # live broker -> load fraction (max of cpu and bandwidth)
    std: float
    moves: int


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
        self.channel = ChannelClient(self.transport, CHANNEL)
        self.table = self.channel.table
        self.table.partitions = self.transport.partitions(CHANNEL)
        self.table.set_live()
        self._changes: list[str] = []
        self.table.add_listener(lambda name, old, new: self._changes.append(name))
        self.transport.follow(CHANNEL, self._apply_channel)
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
        self.events = EventPublisher(self.transport, EVENTS_TOPIC, source="sim-agents", role="agent")
        self.leader.on_overrides = self._overridden
        self.leader.on_heal_paused = lambda: self.shed_cycles.update(["healing_paused"])
        self.transport.observers.append(self._produced)

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
        self.samples: list[Sample] = []
        self.shed_cycles: Counter[str] = Counter()
        self.splits = 0
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
        self._initial_assignment()
        self.every(self.sc.report.sample_s, 0.0, self._sample)
        self.loop.call_soon(self.leader.start)
        for e in self.sc.events:
            self.at(e.at_s, functools.partial(self._event, e))
        if self.snapshot_at is not None:
            self.at(self.snapshot_at, self._take_snapshot)  # after the events of that instant
        end = self.sc.duration_s
        try:
            with quiet_daemons():
                self.loop.run_until(end)
                self.loop.advance_to(end)
                self._stop_jobs()
        finally:
            self.loop.close()
        failures = self.leader.failures() + job_failures(self.agent_metrics.job_failures)
        if failures:
            raise RuntimeError(
                f"{failures} runs of the daemons' jobs raised (job_failed on stderr): the simulation does "
                "not stand for the daemons"
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
        """The agent's background jobs (agent.daemon): load reports and auto-splits, each with its
        schedule, run while the agent stays (up, registered, not leaving), from the moment it registered
        (the first report at once). The brokers of the initial cluster were running before the scenario
        began, not started in lockstep at 0: theirs start at a random ``phase`` within one report
        interval."""
        sampler = SimSampler(functools.partial(self._broker_sample, b))
        b.reporter = build_reporter(
            self.s, self.loop, me=b.id, sampler=sampler, transport=self.transport, metrics=self.agent_metrics
        )
        if self.s.split.enabled:
            b.splitter = build_splitter(
                self.s,
                self.loop,
                me=b.id,
                channel=self.channel,
                reporter=b.reporter,
                sampler=sampler,
                layouts=SimLayouts(lambda: self.layouts),
                events=self.events,
                metrics=self.agent_metrics,
                paused=lambda: b.leaving,
            )
        delay = self.rng_phase.uniform(0, self.s.load.report_interval_s)
        if self.s.split.enabled:
            # Drawn and unused: the split cycle's first run is one interval after the jobs start, as the
            # daemon's. Kept so that every broker's phase is what it was when the engine drew one per job
            # (the same scenario and seed keep their report phases).
            self.rng_phase.uniform(0, self.s.split.interval_s)
        self.at(self.now + (delay if phase else 0.0), functools.partial(self._agent_jobs, b))

    def _staying(self, b: Broker) -> bool:
        """The agent daemon's gate on its reports and splits, for this incarnation of the broker."""
        return self.brokers.get(b.id) is b and b.agent_up and b.registered and not b.leaving

    def _agent_jobs(self, b: Broker) -> None:
        """Start or stop the agent's job runner as its gate opens or closes. The daemon's runner polls the
        gate every 0.25 s; the engine knows the instants the gate changes, so it starts a runner when the
        gate opens and stops it when it closes -- a hundred agents polling would be most of a run's time.
        A gate that closes and opens again restarts the jobs' first-run clocks either way."""
        if not self._staying(b):
            if b.jobs is not None:
                self.loop.create_task(b.jobs.stop())
                b.jobs = None
            return
        if b.jobs is not None or b.reporter is None:
            return
        b.jobs = jobs = JobRunner(self.agent_metrics.job_failures, mono=self.loop.time)
        jobs.add("load_report", b.reporter.run_once, b.reporter.schedule())
        if b.splitter is not None:  # its gate adds splitter.active(): enabled, and not leaving
            splitter = b.splitter
            jobs.add("auto_split", splitter.split_cycle, splitter.schedule())
        jobs.start()

    def _stop_agent(self, b: Broker) -> None:
        """The agent process is gone: its jobs end, its split scheduler stops listening to the channel."""
        self._agent_jobs(b)
        if b.splitter is not None:
            self.table.remove_listener(b.splitter._record_changed)
            b.splitter = None

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

    def _load_moved(self, b: Broker) -> None:
        if b.reporter is not None:
            b.reporter.load_moved()

    def _live(self) -> dict[str, BrokerInfo]:
        """What the registry shows: registered brokers, with their draining flag."""
        out = {}
        for b in self.brokers.values():
            if b.registered:
                out[b.id] = replace(b.info, draining=True) if b.draining else b.info
        return out

    def _up(self, broker: str | None) -> Broker | None:
        b = self.brokers.get(broker) if broker else None
        return b if b is not None and b.agent_up and b.registered else None

    # ------------------------------------------------------------------ serving (the invariants)
    def _serve(self, b: Broker, bundle: str) -> None:
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
        self._load_moved(b)

    def _unserve(self, b: Broker, bundle: str, *, fenced: bool = False) -> None:
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
        self._load_moved(b)

    # ------------------------------------------------------------------ the channel
    def publish(self, bundle: str, rec: Record | None) -> None:
        """A record written by a simulated agent's reconciler or lookup (the leader's jobs publish theirs
        through the production ChannelWrites, to the same simulated Kafka)."""
        self.channel.publish(bundle, rec)

    def _apply_channel(self, msgs: list[Message]) -> None:
        """A delivery of channel records: the table resolves them, then every agent named reacts."""
        self.table.apply_all(msgs)
        changes, self._changes = self._changes, []
        for bundle in dict.fromkeys(changes):
            self._changed(bundle)

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

    def _changed(self, bundle: str) -> None:
        rec = self.table.get(bundle)
        names: set[str] = set(self.servers.get(bundle, ()))
        for b in self.brokers.values():
            if bundle in b.fenced or bundle in b.serving:
                names.add(b.id)
        if rec is not None:
            names.update(x for x in (rec.dst, rec.src) if x)
            if rec.children:
                names.update(x for x in rec.children.values() if x)
        for name in sorted(names):
            up = self._up(name)
            if up is not None:
                self._mark(up, bundle)

    # ------------------------------------------------------------------ agents: the role plans
    def _mark(self, b: Broker, bundle: str) -> None:
        if bundle in b.busy:
            b.again.add(bundle)
            return
        cur = self.table.get(bundle)
        p = plan(
            b.id,
            bundle,
            cur,
            serving=bundle in b.serving,
            fenced=bundle in b.fenced,
            now_ms=self.now_ms,
            stale=bundle in b.stale,
        )
        if p is None:
            return
        version = cur.version if cur is not None else 0
        if b.done.get(bundle) == (version, p.kind) and any(isinstance(s, Publish) for s in p.steps):
            return  # handled; our record is on its way
        b.busy.add(bundle)
        self._step(b, bundle, list(p.steps), version, p.kind, b.epoch, waited=False)

    def _duration(self, step: Step) -> float:
        if isinstance(step, Acquire):
            return self.m.acquire_s
        if isinstance(step, (Fence, Close)):
            return self.m.release_s
        if isinstance(step, SplitOnBroker):
            return self.m.split_s
        return 0.0

    def _step(
        self, b: Broker, bundle: str, steps: list[Step], version: int, kind: str, epoch: int, *, waited: bool
    ) -> None:
        if b.epoch != epoch:
            return  # the agent stopped meanwhile; it re-plans everything when it comes back
        while steps:
            step = steps[0]
            d = self._duration(step)
            if d > 0 and not waited:
                self.at(
                    self.now + d,
                    functools.partial(self._step, b, bundle, steps, version, kind, epoch, waited=True),
                )
                return
            waited = False
            if isinstance(step, Acquire):
                if self.now < self.zk_down_until:
                    # No lease without a confirmed ZooKeeper session: retry once it is back.
                    b.busy.discard(bundle)
                    self.at(self.zk_down_until + 0.5, lambda: self._mark(b, bundle))
                    return
                self._serve(b, bundle)
            elif isinstance(step, Fence):
                self._unserve(b, bundle, fenced=True)
            elif isinstance(step, Close):
                self._unserve(b, bundle)
                b.fenced.discard(bundle)
            elif isinstance(step, Forget):
                b.serving.discard(bundle)
                b.fenced.discard(bundle)
                self.servers[bundle].discard(b.id)
            elif isinstance(step, SplitOnBroker):
                self._split_on_broker(b, bundle, step.children)
            elif isinstance(step, PublishChildren):
                for child in step.children:
                    if self.table.get(child) is None:
                        self.publish(child, intents.place(None, step.owner, writer=b.id, now_ms=self.now_ms))
            elif isinstance(step, UpdateLayout):
                pass  # done with the broker-side split (one instant in this model)
            elif isinstance(step, Publish):
                self.publish(bundle, step.record)
            steps = steps[1:]
        b.busy.discard(bundle)
        b.done[bundle] = (version, kind)
        b.stale.discard(bundle)
        if bundle in b.again:
            b.again.discard(bundle)
            self._mark(b, bundle)
        cur = self.table.get(bundle)
        if (cur.version if cur is not None else 0) != version:
            self._mark(b, bundle)

    def _split_on_broker(self, b: Broker, bundle: str, children: tuple[str, ...]) -> None:
        ns, parent = parse_bundle(bundle)
        kids = sorted(parse_bundle(c)[1] for c in children)
        lay = self.layouts[ns]
        if parent.lower in lay.boundaries and parent.upper in lay.boundaries:
            self.layouts[ns] = lay.with_split(parent, kids)
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

    # ------------------------------------------------------------------ lookups and assignment
    def _schedule_lookup(self, bundle: str) -> None:
        if bundle not in self._lookup_pending:
            self._lookup_pending.add(bundle)
            self.at(self.now + self.m.lookup_retry_s, lambda: self._lookup(bundle))

    def _lookup(self, bundle: str) -> None:
        self._lookup_pending.discard(bundle)
        if bundle not in self.live_bundles or self.servers.get(bundle):
            return
        self.lookups["total"] += 1
        cur = self.table.get(bundle)
        if cur is None or cur.state is State.FREE:
            agents = [b for b in self.brokers.values() if b.agent_up and b.registered]
            if agents:
                self._assign(self.rng_assign.choice(agents), bundle, cur)
                f = self.sc.faults
                if f is not None and f.race_p and self.rng_faults.random() < f.race_p:
                    self._assign(self.rng_assign.choice(agents), bundle, cur)  # a second agent races
            self.lookups["assigned"] += 1
        elif cur.state.in_flight:
            self.lookups["deferred_in_flight"] += 1
        else:
            self.lookups["retried"] += 1
        self._schedule_lookup(bundle)

    def _ctx(self, exclude: frozenset[str] = frozenset()) -> AssignContext:
        return AssignContext.from_settings(self.s, self.loads.snapshot(), self.now_ms, exclude)

    def _choose(
        self, bundle: str, exclude: frozenset[str] = frozenset(), picks: BurstPicks | None = None
    ) -> str | None:
        select = select_broker if picks is None else picks.select
        sel = select(
            bundle,
            self._live(),
            self._ctx(exclude),
            self.rng_assign,
            diff=self.s.assignment.average_usage_diff_threshold_pct / 100,
        )
        return sel.broker

    def _assign(self, agent: Broker, bundle: str, cur: Record | None) -> None:
        exclude = frozenset({agent.id}) if agent.draining else frozenset()
        dst = self._choose(bundle, exclude)
        if dst is None:
            return
        self.publish(bundle, intents.assign(cur, dst, writer=agent.id, now_ms=self.now_ms))

    def _initial_assignment(self) -> None:
        """Every bundle placed before the run, greedily by load (largest first onto the least loaded broker):
        the scenario starts from a balanced cluster, as Pulsar's published tests do."""
        loads = {b: 0.0 for b in self.brokers}
        for bundle in sorted(self.live_bundles, key=lambda x: (-self.load.rate(x, 0.0), x)):
            dst = min(loads, key=lambda x: (loads[x] / self.brokers[x].capacity, x))
            loads[dst] += self.load.rate(bundle, 0.0) * 2
            self.publish(bundle, intents.assign(None, dst, writer=LEADER, now_ms=0))

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

    def _owned_by(self, bundle: str, broker: str) -> Record | None:
        """The bundle's record if ``broker`` owns it (the check before building on an earlier decision)."""
        r = self.table.get(bundle)
        return r if r is not None and r.state is State.OWNED and r.dst == broker else None

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
        shed_moves = sum(1 for mv in self.moves if mv.reason.startswith("shed"))
        self.samples.append(Sample(self.now, loads, std, shed_moves))

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
        # Sessions survived (the server was down, not the clients); renewers find the lost leases and the
        # reconcilers acquire what the channel still gives each broker.
        for b in self.brokers.values():
            if b.agent_up and b.registered:
                self._rescan(b)

    def _rescan(self, b: Broker) -> None:
        for bundle, rec in self.table.items():
            if rec.names(b.id) or bundle in b.serving or bundle in b.fenced:
                self._mark(b, bundle)

    def _drain(self, b: Broker, back_after: float | None) -> None:
        """SIGTERM: the agent's :class:`~trimtab.agent.drain.Drainer` marks the broker draining, transfers
        every owned bundle away and waits until the channel names it nowhere and the broker closed
        everything (or the drain timeout); then the broker is gone (and maybe back)."""
        if not b.registered or not b.agent_up:
            return
        b.leaving = True
        self._agent_jobs(b)  # the reports and splits stop once the agent starts to leave
        b.stop = asyncio.Event()
        drainer = build_drainer(
            self.s,
            self.loop,
            info=b.info,
            channel=self.channel,
            registration=SimRegistration(self.registry, functools.partial(self._registration_updated, b)),
            closing=SimClosing(lambda: set(b.serving), lambda: b.fenced),
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
        b.epoch += 1
        self.registry.changed()
        self._stop_agent(b)
        if b.reporter is not None:
            self.loop.create_task(b.reporter.tombstone())  # the agent's graceful stop
        if back_after is not None:
            self.at(self.now + back_after, lambda: self._come_back(b))

    def _come_back(self, b: Broker) -> None:
        fresh = Broker(b.id, b.info, b.capacity, Served(self.load))
        fresh.epoch = b.epoch + 1
        self.brokers[b.id] = fresh
        self.registry.changed()
        self._start_agent(fresh)

    def _kill(self, b: Broker) -> None:
        """kill -9 of the broker and its agent (the machine died): clients drop at once; the registration
        lasts until the session times out."""
        b.agent_up = False
        b.epoch += 1
        if b.stop is not None:
            b.stop.set()
        self._stop_agent(b)
        for x in sorted({*b.serving, *b.fenced}):
            self._unserve(b, x)
        b.busy.clear()
        self.at(self.now + self.session_s, lambda: self._expire(b))

    def _expire(self, b: Broker) -> None:
        if self.brokers.get(b.id) is b and not b.agent_up:
            b.registered = False
            self.registry.changed()

    def _pause(self, b: Broker, duration: float) -> None:
        """SIGSTOP of the agent: its broker keeps serving until the leases it holds run out."""
        b.agent_up = False
        b.epoch += 1
        if b.stop is not None:
            b.stop.set()  # a stopped process drains nothing; it does not leave by itself either
        self._agent_jobs(b)
        b.busy.clear()
        b.again.clear()
        b.paused_at = self.now
        self.at(self.now + self.lease_s, lambda: self._lease_expiry(b))
        if duration >= self.session_s:
            self.at(self.now + self.session_s, lambda: self._expire(b))
        self.at(self.now + duration, lambda: self._resume(b))

    def _lease_expiry(self, b: Broker) -> None:
        if not b.agent_up:
            for x in sorted({*b.serving, *b.fenced}):
                self._unserve(b, x)

    def _resume(self, b: Broker) -> None:
        b.agent_up = True
        b.paused_at = None
        if not b.registered:
            # The session expired while paused: a new session, everything naming us is stale.
            b.registered = True
            self.registry.changed()
            for x in sorted({*b.serving, *b.fenced}):
                self._unserve(b, x)
            b.stale = {bundle for bundle, r in self.table.items() if r.names(b.id)}
            b.done.clear()
        self._load_moved(b)
        self._agent_jobs(b)
        self._rescan(b)
