"""The simulator's engine: one scenario under one shedding policy, in virtual time.

What runs is the production decision code -- the agent's role plans (balance.roles), broker selection with
its filters (balance.assign), the shedders (balance.shed, sim.legacy), split decisions (balance.split),
healing and the stuck-state monitor (balance.heal), load EMAs and report thresholds (balance.load) -- and
every ownership change is a record produced to the in-memory transport and resolved by the channel's own
table (channel.table: first valid transition wins). What is modelled is what happens between decisions:

* brokers take ``model.acquire_s`` to take a bundle over and ``model.release_s`` to fence or close one;
  records take ``model.channel_s`` to reach every node; a bundle is unserved from the moment its broker
  fences it (or dies) until a broker acquired it again;
* clients of an unserved bundle look it up every ``model.lookup_retry_s``; a lookup of an unowned bundle
  makes an agent choose a broker and publish ``Assigning`` (a plain unload is repaired this way);
* agents sample their broker every ``load.report_interval_s`` and publish when ``publish_reason`` says so;
  the leader sheds every ``shedding.interval_s``, heals after ``zookeeper.session_timeout_s`` (+ grace),
  and pushes stuck states on every ``channel.monitor_interval_s``; agents check splits every
  ``split.interval_s``;
* leases: a paused agent's broker stops serving ``lease_s`` after the pause, its session expires after the
  session timeout; a ZooKeeper outage stops every lease renewal; a Kafka outage holds every record.

Nothing here reads a clock or a global random generator: same scenario, policy and seed, same run.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from msgspec.structs import replace

from trimtab.balance.assign import AssignContext, BrokerInfo, BurstPicks, headed_to, select_broker
from trimtab.balance.heal import (
    HealConfig,
    in_flight_by_broker,
    mass_failure,
    monitor,
    orphaned,
    plan_destinations,
    throttle,
)
from trimtab.balance.load import (
    BrokerLoadData,
    TopBundles,
    Usage,
    Weights,
    next_report,
    top_k,
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
from trimtab.balance.shed import ShedConfig, ShedResult, ShedState
from trimtab.balance.split import SplitLimits, decide_splits, over_limit
from trimtab.channel import intents
from trimtab.channel.bundles import BundleLayout, parse_bundle
from trimtab.channel.memory import MemoryLog, MemoryTransport
from trimtab.channel.records import Record, State, encode
from trimtab.channel.table import TableView
from trimtab.config.settings import Settings
from trimtab.sim.model import LoadModel, Served
from trimtab.sim.policies import shedder_for
from trimtab.sim.scenario import BrokerSpec, Event, Scenario

CHANNEL = "trimtab-sim-channel"
LEADER = "sim-leader"
CORES = 4.0
BANDWIDTH = 125e6  # bytes/s each way, as the built-in simulated broker


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
    again: set[str] = field(default_factory=set)
    done: dict[str, tuple[int, str]] = field(default_factory=dict)
    stale: set[str] = field(default_factory=set)
    epoch: int = 0  # bumped when the agent stops (pending steps are dropped)
    current: BrokerLoadData | None = None
    published: BrokerLoadData | None = None
    fresh: bool = True
    force: bool = False
    split_hits: dict[str, int] = field(default_factory=dict)
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
        self.weights = Weights.from_settings(self.s)
        self.shed_cfg = ShedConfig.from_settings(self.s)
        self.shed_state = ShedState()
        self.heal_cfg = HealConfig.from_settings(self.s)
        self.split_limits = SplitLimits.from_settings(self.s)
        self.lease_s = self.s.lease_s()
        self.session_s = self.s.zookeeper.session_timeout_s

        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

        self.log = MemoryLog(default_partitions=8)
        self.transport = MemoryTransport(self.log)
        self.transport.partitions(CHANNEL)
        self.reader = self.transport.reader(CHANNEL, {})
        self.table = TableView(partitions=8)
        self.table.set_live()
        self._changes: list[str] = []
        self.table.add_listener(lambda name, old, new: self._changes.append(name))
        self._pending: list[tuple[str, Record | None]] = []
        self._delivery_scheduled = False
        self.records = 0

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
        self.loads_view: dict[str, BrokerLoadData] = {}
        self.top_view: dict[str, TopBundles] = {}
        self.failed: dict[str, int] = {}  # broker -> first failure (ms): the leader's record
        self.splits = 0
        self.healed = 0
        self.zk_down_until = -1.0
        self.kafka_down_until = -1.0
        self.event_times = sorted({e.at_s for e in scenario.events})
        self.snapshot_at = snapshot_at
        self._heal_woken = False
        self._overridden: set[tuple[str, int]] = set()
        self.snapshot: Snapshot | None = None

    # ------------------------------------------------------------------ the clock
    @property
    def now_ms(self) -> int:
        return round(self.now * 1000)

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), fn))

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
            self._add_broker(spec)
        self._initial_assignment()
        s = self.s
        self.every(self.sc.report.sample_s, 0.0, self._sample)
        self.every(s.shedding.interval_s, s.shedding.interval_s, self._shed)
        self.every(s.channel.monitor_interval_s, s.channel.monitor_interval_s, self._monitor)
        self.every(1.0, 1.0, self._heal)
        for e in self.sc.events:
            self.at(e.at_s, functools.partial(self._event, e))
        if self.snapshot_at is not None:
            self.at(self.snapshot_at, self._take_snapshot)  # after the events of that instant
        end = self.sc.duration_s
        while self._heap and self._heap[0][0] <= end:
            t, _, fn = heapq.heappop(self._heap)
            self.now = t
            fn()
        self.now = end
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
            records=self.records,
            channel_stats=self.table.stats.as_dict(),
            end_owners=owners,
            event_times=self.event_times,
            virtual_s=end,
        )

    # ------------------------------------------------------------------ brokers
    def _new_id(self) -> str:
        while True:
            bid = f"broker-{self._next_broker:03d}"
            self._next_broker += 1
            if bid not in self.brokers:
                return bid

    def _add_broker(self, spec: BrokerSpec | None = None) -> Broker:
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
        self.failed.pop(spec.id, None)
        self._start_agent(b)
        return b

    def _start_agent(self, b: Broker) -> None:
        """The agent's periodic jobs, for as long as this incarnation of the broker is the current one."""

        def current() -> bool:
            return self.brokers.get(b.id) is b

        phase = self.rng_phase.uniform(0, self.s.load.report_interval_s)
        self.every(self.s.load.report_interval_s, self.now + phase, lambda: self._report(b), current)
        if self.s.split.enabled:
            sp = self.rng_phase.uniform(0, self.s.split.interval_s)
            self.every(self.s.split.interval_s, self.now + sp, lambda: self._split_check(b), current)
        self._report(b)

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
        b.fresh = b.force = True

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
        b.fresh = b.force = True

    # ------------------------------------------------------------------ the channel
    def publish(self, bundle: str, rec: Record | None) -> None:
        self._pending.append((bundle, rec))
        if not self._delivery_scheduled:
            self._delivery_scheduled = True
            self.at(max(self.now + self.m.channel_s, self.kafka_down_until), self._deliver)

    def _deliver(self) -> None:
        if self.now < self.kafka_down_until:
            self.at(self.kafka_down_until, self._deliver)
            return
        self._delivery_scheduled = False
        batch, self._pending = self._pending, []
        f = self.sc.faults
        if f is not None and f.from_s <= self.now < f.until_s:
            batch = self._misbehave(batch, f.duplicate_p, f.reorder_p)
        for bundle, rec in batch:
            self.transport.produce(CHANNEL, bundle.encode(), encode(rec))
            self.records += 1
        msgs = self.reader.poll(1 << 30, 0)
        self.table.apply_all((m.key, m.value, m.partition, m.offset) for m in msgs)
        changes, self._changes = self._changes, []
        for bundle in dict.fromkeys(changes):
            self._changed(bundle)

    def _misbehave(
        self, batch: list[tuple[str, Record | None]], dup: float, reorder: float
    ) -> list[tuple[str, Record | None]]:
        out = list(batch)
        r = self.rng_faults
        for i in range(len(out) - 1):
            if r.random() < reorder:
                out[i], out[i + 1] = out[i + 1], out[i]
        final: list[tuple[str, Record | None]] = []
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
        return AssignContext.from_settings(self.s, self.loads_view, self.now_ms, exclude)

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

    def _report(self, b: Broker) -> None:
        if not b.agent_up or not b.registered:
            return
        now_ms = self.now_ms
        rate_in = b.serving.rate(self.now)
        t_in = rate_in * self.m.msg_size_bytes
        topics = b.serving.topics()
        # Only the heaviest bundles can be in the top-k report: build figures for a few more than k (ties in
        # rate are broken by the production ordering, balance.load.top_k, on what is built).
        k = self.s.load.top_k
        stats = [self.load.stats(x, self.now) for x in sorted(b.serving.heaviest(2 * k + 8, self.now))]
        raw = BrokerLoadData(
            broker=b.id,
            cpu=Usage(CORES * 2 * rate_in / b.capacity, CORES),
            memory=Usage(0.0, 8 << 30),
            bandwidth_in=Usage(t_in, BANDWIDTH),
            bandwidth_out=Usage(t_in, BANDWIDTH),
            msg_rate_in=rate_in,
            msg_rate_out=rate_in,
            msg_throughput_in=t_in,
            msg_throughput_out=t_in,
            bundles=len(b.serving),
            topics=topics,
            updated_at=now_ms,
        )
        step = next_report(
            raw,
            current=b.current,
            published=b.published,
            fresh=b.fresh,
            force=b.force,
            weights=self.weights,
            settings=self.s,
            now_ms=now_ms,
        )
        b.fresh = b.force = False
        b.current = step.current
        load = step.published
        if load is None:
            return
        b.published = load
        top = TopBundles(broker=b.id, bundles=top_k(stats, self.s.load.top_k), reported_at=now_ms)
        delay = max(self.m.channel_s, self.kafka_down_until - self.now)
        self.at(self.now + delay, lambda: self._receive_report(load, top))

    def _receive_report(self, load: BrokerLoadData, top: TopBundles) -> None:
        b = self.brokers.get(load.broker)
        if b is None or not b.registered:
            return
        self.loads_view[load.broker] = load
        self.top_view[load.broker] = top

    # ------------------------------------------------------------------ the leader
    def _leader_ok(self) -> bool:
        return self.now >= self.zk_down_until

    def _owner(self, bundle: str) -> str | None:
        r = self.table.get(bundle)
        return r.dst if r is not None and r.state is State.OWNED else None

    def _owned_by(self, bundle: str, broker: str) -> Record | None:
        """The bundle's record if ``broker`` owns it (the check before building on an earlier decision)."""
        r = self.table.get(bundle)
        return r if r is not None and r.state is State.OWNED and r.dst == broker else None

    def _shed(self) -> None:
        if self.shedder is None or not self.s.shedding.enabled:
            return
        if not self._leader_ok():
            self.shed_cycles["leader_unconfirmed"] += 1
            return
        live = {k: not i.draining for k, i in self._live().items()}
        if len(live) < 2:
            return
        loads = {k: v for k, v in self.loads_view.items() if k in live}
        top = {k: v for k, v in self.top_view.items() if k in live}
        res: ShedResult = self.shedder(
            live, loads, top, self._owner, self.shed_state, self.shed_cfg, self.now_ms, lambda b, s, d: True
        )
        self.shed_cycles[f"{res.result}:{res.reason}"] += 1
        for u in res.decisions:
            cur = self._owned_by(u.bundle, u.src)
            if cur is None:
                continue  # moved since the decision's inputs were read
            self.publish(
                u.bundle,
                intents.release(cur, src=u.src, dst=u.dst, writer=LEADER, now_ms=self.now_ms),
            )
            self.moves.append(Move(self.now, u.bundle, u.src, u.dst, f"shed:{u.reason}", u.throughput))

    def _wake_healing(self) -> None:
        """The leader is woken by registration changes; several at one instant make one healing round."""
        if not self._heal_woken:
            self._heal_woken = True
            self.at(self.now, self._woken_heal)

    def _woken_heal(self) -> None:
        self._heal_woken = False
        self._heal()

    def _heal(self) -> None:
        if not self._leader_ok():
            return
        live = self._live()
        gone = frozenset(self.failed)
        if not gone:
            return
        guard = mass_failure(len(gone), len(live), self.heal_cfg)
        if guard is not None:
            self.shed_cycles["healing_paused"] += 1
            return
        now_ms = self.now_ms
        due = [
            b
            for b, t in self.failed.items()
            if now_ms - t >= self.heal_cfg.grace_s * 1000 and self.heal_cfg.grace_s >= 0
        ]
        if not due:
            return
        items = self.table.items()
        # Not again for a record this leader already overrode (its override is still on the way): the
        # controller's healing plan remembers what it published in the same way.
        needs = orphaned(items, frozenset(due))
        if not needs:
            for b in due:
                del self.failed[b]  # healed: nothing of it is left to move
            return
        todo = [(b, r) for b, r in needs if (b, r.version) not in self._overridden]
        loads = {
            k: (self.loads_view[k].weighted_max_ema if k in self.loads_view else 0.0)
            for k, i in live.items()
            if not i.draining
        }
        planned = plan_destinations([b for b, _ in todo], loads)
        overrides, _ = throttle(
            todo,
            frozenset(due),
            self._choose,
            in_flight_by_broker(items),
            self.heal_cfg,
            now_ms,
            LEADER,
            "failed_broker",
            None,
            planned=planned,
            live=frozenset(live),
        )
        for o in overrides:
            if o.record is not None:
                self._overridden.add((o.bundle, o.record.version - 1))
            self.publish(o.bundle, o.record)
            self.healed += 1
            self.moves.append(Move(self.now, o.bundle, o.broker or "", o.dst, "heal", 0.0))

    def _monitor(self) -> None:
        if not self._leader_ok():
            return
        live = frozenset(self._live())
        for o in monitor(
            self.table.items(),
            live,
            self._choose,
            self.heal_cfg,
            self.now_ms,
            LEADER,
        ):
            self.publish(o.bundle, o.record)
            if o.reason == "stuck":
                self.moves.append(Move(self.now, o.bundle, o.broker or "", o.dst, "stuck", 0.0))

    # ------------------------------------------------------------------ splits (agent side)
    def _split_check(self, b: Broker) -> None:
        if not b.agent_up or not b.registered or not self.s.split.enabled:
            return
        owned = {x for x in b.serving if self._owner(x) == b.id}
        stats = []
        for x in sorted(owned):
            s = self.load.stats(x, self.now)
            if over_limit(s, self.split_limits) is not None:
                s = self.load.stats(x, self.now, topic_loads=True)
            stats.append(s)
        counts = {ns: len(lay) for ns, lay in self.layouts.items()}
        cycle = decide_splits(stats, b.split_hits, self.split_limits, namespace_bundles=counts, owned=owned)
        b.split_hits = cycle.hits
        for d in cycle.decisions:
            cur = self._owned_by(d.bundle, b.id)
            if cur is None:
                continue
            self.publish(
                d.bundle,
                intents.split(cur, b.id, [c.name for c in d.children], writer=b.id, now_ms=self.now_ms),
            )

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
            for b in self._pick(e.remove_brokers or 0, lambda b: b.registered and not b.draining):
                self._drain(b, back_after=None)
        elif a == "restart":
            victims = self._pick(e.restart or 0, lambda b: b.registered and not b.draining)
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
        """SIGTERM: marked draining, every owned bundle transferred away, then gone (and maybe back)."""
        if not b.registered or not b.agent_up:
            return
        b.draining = True
        b.leaving = True
        records = [r for _, r in self.table.items()]
        owned = sum(1 for r in records if r.state is State.OWNED and r.dst == b.id)
        picks = BurstPicks.for_drain(self.loads_view, b.id, owned, headed_to(records))
        self._drain_round(b, back_after, self.now + self.s.agent.drain_timeout_s, {}, picks)

    def _drain_round(
        self,
        b: Broker,
        back_after: float | None,
        deadline: float,
        requested: dict[str, int],
        picks: BurstPicks,
    ) -> None:
        """One pass of the drainer (agent.drain): transfer what the channel still gives this broker -- a
        bundle can arrive while draining (another broker's drain chose it before it was marked) -- and leave
        once the channel names it nowhere and the broker closed everything, or at the drain timeout."""
        if self.brokers.get(b.id) is not b or not b.agent_up:
            return
        named = False
        for bundle, rec in self.table.items():
            if (rec.state is State.OWNED and rec.dst == b.id) or (rec.state.in_flight and rec.names(b.id)):
                named = True
            if rec.state is State.OWNED and rec.dst == b.id and requested.get(bundle) != rec.version:
                requested[bundle] = rec.version
                dst = self._choose(bundle, frozenset({b.id}), picks)
                self.publish(
                    bundle,
                    intents.release(rec, src=b.id, dst=dst, writer=b.id, now_ms=self.now_ms),
                )
                self.moves.append(Move(self.now, bundle, b.id, dst, "drain", 0.0))
        if (named or b.serving or b.fenced) and self.now < deadline:
            self.at(self.now + 0.5, lambda: self._drain_round(b, back_after, deadline, requested, picks))
            return
        self._leave(b, back_after)

    def _leave(self, b: Broker, back_after: float | None) -> None:
        for x in sorted({*b.serving, *b.fenced}):
            self._unserve(b, x)
        b.registered = False
        b.agent_up = False
        b.epoch += 1
        self.loads_view.pop(b.id, None)
        self.top_view.pop(b.id, None)
        if back_after is not None:
            self.at(self.now + back_after, lambda: self._come_back(b))

    def _come_back(self, b: Broker) -> None:
        fresh = Broker(b.id, b.info, b.capacity, Served(self.load))
        fresh.epoch = b.epoch + 1
        self.brokers[b.id] = fresh
        self.failed.pop(b.id, None)
        self._start_agent(fresh)

    def _kill(self, b: Broker) -> None:
        """kill -9 of the broker and its agent (the machine died): clients drop at once; the registration
        lasts until the session times out."""
        b.agent_up = False
        b.epoch += 1
        for x in sorted({*b.serving, *b.fenced}):
            self._unserve(b, x)
        b.busy.clear()
        self.at(self.now + self.session_s, lambda: self._expire(b))

    def _expire(self, b: Broker) -> None:
        if self.brokers.get(b.id) is b and not b.agent_up:
            b.registered = False
            self.failed.setdefault(b.id, self.now_ms)  # the leader records the first failure
            self.loads_view.pop(b.id, None)
            self.top_view.pop(b.id, None)
            self._wake_healing()

    def _pause(self, b: Broker, duration: float) -> None:
        """SIGSTOP of the agent: its broker keeps serving until the leases it holds run out."""
        b.agent_up = False
        b.epoch += 1
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
            self.failed.pop(b.id, None)
            for x in sorted({*b.serving, *b.fenced}):
                self._unserve(b, x)
            b.stale = {bundle for bundle, r in self.table.items() if r.names(b.id)}
            b.done.clear()
        b.fresh = b.force = True
        self._rescan(b)
