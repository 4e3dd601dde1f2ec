"""The shedding benchmark (docs/design.md sections 5.2 and 11): one shedding decision over 1 000 brokers x
100 000 bundles in < 50 ms.

Inputs are generated (seeded) the way a leader holds them:

* 100 000 bundles (``BundleLayout.default`` of 1 000 namespaces x 100) with log-normal throughputs, placed
  on brokers with a skew (hot brokers hold more and heavier bundles); each one an ``Owned`` record
  (``channel.records.make``) in a dict -- the channel table the ``owner()`` callback reads;
* a ``BrokerLoadData`` per broker: throughput = the sum of its bundles, ``weighted_max_ema`` = throughput
  over a per-broker capacity (so the loads are skewed), fresh report timestamps;
* a ``TopBundles`` report per broker: its 10 heaviest bundles (``balance.load.top_k``), ~1% of entries stale
  (the bundle has moved to another broker since the report: the shedder must skip it);
* a ``ShedState`` whose hit count is already above the threshold (so the cycle decides), ~1% of brokers
  cooling down after a recent move, recently moved bundles (inside the grace period, among the hottest
  brokers' top bundles) and expired ones (outside it, dropped by the cycle); a few draining brokers.

Figures: ``decision_ms`` (TransferShedder, median of ``runs``, each on a fresh copy of the state),
``threshold_decision_ms`` (ThresholdShedder on the same data) and ``decision_with_inputs_ms``: what
``controller.daemon.Controller.shed_once`` spends around the call -- copying the live broker registry,
``KeyValueView.snapshot()`` of the load and top-bundles views (1 000 entries each) and an ``owner()`` over
a real ``TableView`` holding the 100 000 records. Every run's decisions are checked (see
:func:`check_transfer` / :func:`check_threshold`); a wrong result raises :class:`BenchError`.
"""

from __future__ import annotations

import copy
import gc
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from trimtab.balance.assign import AssignContext, BrokerInfo, select_broker
from trimtab.balance.assign_index import AssignIndex
from trimtab.balance.heal import plan_destinations
from trimtab.balance.load import BrokerLoadData, BundleStats, TopBundles, Usage, top_k
from trimtab.balance.placement.core import Placement, PlacementPolicy
from trimtab.balance.placement.model import Broker as PlacementBroker
from trimtab.balance.placement.standby import StandbyLoads, StandbyRules, StandbySpec, repair_standbys
from trimtab.balance.shed import ShedConfig, ShedResult, ShedState, threshold_shedder, transfer_shedder
from trimtab.channel.bundles import BundleLayout
from trimtab.channel.memory import MemoryTransport
from trimtab.channel.records import Record, State, make
from trimtab.channel.table import TableView
from trimtab.cluster.kvview import KeyValueView
from trimtab.cluster.placement.standbys import prefer_standby_set
from trimtab.devkit.bench.common import (
    BenchError,
    Progress,
    environment,
    loadavg,
    percentile,
    progress_printer,
)

DECISION_TARGET_MS = 50.0  # at 1 000 brokers x 100 000 bundles
DECISION_TARGET_MS_10K = 100.0  # at 10 000 brokers x 1 000 000 bundles and beyond (issue 33)
NOW_MS = 1_800_000_000_000
TOP_K = 10
MSG_SIZE = 1024.0


@dataclass
class ShedInputs:
    brokers: dict[str, bool]  # live broker -> may receive load (False: draining)
    infos: dict[str, BrokerInfo]
    loads: dict[str, BrokerLoadData]
    top: dict[str, TopBundles]
    records: dict[str, Record]  # bundle -> Owned record
    state: ShedState
    cfg: ShedConfig
    now_ms: int
    bundles_per_broker: dict[str, int]
    stale_top_entries: int
    recent_in_grace: int
    recent_expired: int

    def owner(self) -> Callable[[str], str | None]:
        get = self.records.get

        def owner(bundle: str) -> str | None:
            r = get(bundle)
            return r.dst if r is not None and r.state is State.OWNED else None

        return owner


def build_inputs(brokers: int, bundles: int, *, seed: int = 1, cfg: ShedConfig | None = None) -> ShedInputs:
    """The seeded inputs of one shedding decision (see the module docstring), built in steps.

    Every step draws from the one ``rng`` in turn, so the steps run in a fixed order and each draws exactly
    what it draws: the same seed must give the same inputs, or runs could not be compared.
    """
    if brokers < 4 or bundles < brokers * 2:
        raise ValueError("need at least 4 brokers and 2 bundles per broker")
    cfg = cfg or ShedConfig()
    rng = random.Random(seed)
    now = NOW_MS
    ids = [f"10.{i // 250}.{i % 250}.{1 + i % 7}:8080" for i in range(brokers)]
    names = _bundle_names(bundles)
    weights, owner_of, by_broker = _skewed_placement(rng, ids, names)
    tput = _bundle_throughputs(rng, owner_of, dict(zip(ids, weights, strict=True)))
    loads = _broker_loads(rng, ids, by_broker, tput, now)
    top = {b: _top_bundles(b, by_broker[b], tput, loads[b].reported_at) for b in ids}
    records, stale = _owned_records(rng, ids, owner_of, top, now)
    live, infos = _broker_registry(rng, ids, now)
    state, in_grace, expired = _shed_state(rng, ids, names, loads, top, cfg, now)
    return ShedInputs(
        brokers=live,
        infos=infos,
        loads=loads,
        top=top,
        records=records,
        state=state,
        cfg=cfg,
        now_ms=now,
        bundles_per_broker={b: len(v) for b, v in by_broker.items()},
        stale_top_entries=stale,
        recent_in_grace=in_grace,
        recent_expired=expired,
    )


def _bundle_names(bundles: int) -> list[str]:
    """``bundles`` bundle names: default layouts of 100 bundles per namespace (fewer for small runs)."""
    per_ns = 100 if bundles >= 100 * 10 else max(1, bundles // 10)
    names: list[str] = []
    ns = 0
    while len(names) < bundles:
        names.extend(BundleLayout.default(f"tenant-{ns % 50}/ns-{ns}", per_ns).bundles)
        ns += 1
    return names[:bundles]


def _skewed_placement(
    rng: random.Random, ids: list[str], names: list[str]
) -> tuple[list[float], dict[str, str], dict[str, list[str]]]:
    """Skewed placement: a broker's share of bundles ~ log-normal weight; every broker gets at least one.
    Returns (each broker's weight, bundle -> broker, broker -> its bundles)."""
    weights = [rng.lognormvariate(0.0, 0.5) for _ in ids]
    owner_of: dict[str, str] = {}
    by_broker: dict[str, list[str]] = {b: [] for b in ids}
    for i, b in enumerate(ids):
        owner_of[names[i]] = b
        by_broker[b].append(names[i])
    rest = rng.choices(ids, weights=weights, k=len(names) - len(ids))
    for name, b in zip(names[len(ids) :], rest, strict=True):
        owner_of[name] = b
        by_broker[b].append(name)
    return weights, owner_of, by_broker


def _bundle_throughputs(
    rng: random.Random, owner_of: dict[str, str], weight_of: dict[str, float]
) -> dict[str, float]:
    """Bundle traffic: log-normal, heavier on hot brokers (their weight scales the median)."""
    tput: dict[str, float] = {}
    for name, b in owner_of.items():
        tput[name] = rng.lognormvariate(math.log(200_000.0), 1.2) * (0.75 + 0.25 * weight_of[b])
    return tput


def _broker_loads(
    rng: random.Random,
    ids: list[str],
    by_broker: dict[str, list[str]],
    tput: dict[str, float],
    now: int,
) -> dict[str, BrokerLoadData]:
    """Each broker's load report: its bundles' throughput over a capacity around mean/0.45 (+-20%), so
    loads average ~45%, hot brokers saturate and cold ones idle; reported 1-60 s ago."""
    broker_tput = {b: sum(tput[n] for n in by_broker[b]) for b in ids}
    mean_tput = sum(broker_tput.values()) / len(ids)
    loads: dict[str, BrokerLoadData] = {}
    for b in ids:
        capacity = mean_tput / 0.45 * rng.uniform(0.8, 1.2)
        t = broker_tput[b]
        wm = min(0.99, max(0.005, t / capacity))
        ema = min(0.99, max(0.005, wm * rng.uniform(0.95, 1.05)))
        rate = t / MSG_SIZE
        updated = now - rng.randint(1_000, 60_000)
        loads[b] = BrokerLoadData(
            broker=b,
            cpu=Usage(wm * 0.8 * 16, 16.0),
            memory=Usage(0.3 * (64 << 30), float(64 << 30)),
            bandwidth_in=Usage(t / 2, capacity / 2),
            bandwidth_out=Usage(t / 2, capacity / 2),
            msg_rate_in=rate / 2,
            msg_rate_out=rate / 2,
            msg_throughput_in=t / 2,
            msg_throughput_out=t / 2,
            bundles=len(by_broker[b]),
            topics=len(by_broker[b]) * 8,
            max_resource_usage=wm,
            weighted_max=wm,
            weighted_max_ema=ema,
            msg_throughput_ema=t * rng.uniform(0.95, 1.05),
            updated_at=updated,
            reported_at=updated,
        )
    return loads


def _top_bundles(broker: str, bundles: list[str], tput: dict[str, float], reported_at: int) -> TopBundles:
    """The broker's top-bundles report: its ``TOP_K`` heaviest bundles, as of its load report."""
    stats = [
        BundleStats(
            bundle=n,
            msg_rate_in=tput[n] / 2 / MSG_SIZE,
            msg_rate_out=tput[n] / 2 / MSG_SIZE,
            msg_throughput_in=tput[n] / 2,
            msg_throughput_out=tput[n] / 2,
            topics=8,
            producers=8,
            consumers=8,
        )
        for n in bundles
    ]
    return TopBundles(broker=broker, bundles=top_k(stats, TOP_K), reported_at=reported_at)


def _owned_records(
    rng: random.Random, ids: list[str], owner_of: dict[str, str], top: dict[str, TopBundles], now: int
) -> tuple[dict[str, Record], int]:
    """The channel table: an ``Owned`` record per bundle, where ~1% of the top-k entries are stale (the
    bundle moved to another broker after the report). Returns (the records, how many entries are stale)."""
    records: dict[str, Record] = {}
    stale = 0
    for name, b in owner_of.items():
        records[name] = make(State.OWNED, dst=b, version=2, ts=now - 3_600_000, writer=b)
    for b in ids:
        for s in top[b].bundles:
            if rng.random() < 0.01:
                other = rng.choice(ids)
                if other != b:
                    records[s.bundle] = make(
                        State.OWNED, dst=other, src=b, version=6, ts=now - 60_000, writer=other
                    )
                    stale += 1
    return records, stale


def _broker_registry(
    rng: random.Random, ids: list[str], now: int
) -> tuple[dict[str, bool], dict[str, BrokerInfo]]:
    """The live brokers (0.5% of them draining: they take no load) and their registrations."""
    live = {b: True for b in ids}
    for b in rng.sample(ids, max(1, len(ids) // 200)):
        live[b] = False  # draining: takes no load
    infos = {
        b: BrokerInfo(
            id=b,
            service_url=f"pulsar://{b}",
            http_url=f"http://{b}",
            tags={"zone": f"z{i % 3}"},
            start_time=now - 86_400_000,
            draining=not live[b],
        )
        for i, b in enumerate(ids)
    }
    return live, infos


def _shed_state(
    rng: random.Random,
    ids: list[str],
    names: list[str],
    loads: dict[str, BrokerLoadData],
    top: dict[str, TopBundles],
    cfg: ShedConfig,
    now: int,
) -> tuple[ShedState, int, int]:
    """A leader's shedding state that makes the cycle decide, with the constraints it must honour: ~1% of
    brokers cooling down, recently moved bundles inside the grace period (among the hottest brokers' top
    bundles) and expired ones the cycle drops. Returns (the state, bundles in grace, bundles expired)."""
    state = ShedState(hit_count=cfg.hit_count_threshold + 1)
    for b in rng.sample(ids, max(1, len(ids) // 100)):
        # Moved 100 s ago (inside the cool-down); its report (< 60 s old) already reflects the move.
        state.recent_brokers[b] = now - 100_000
    hottest = sorted(ids, key=lambda x: -loads[x].weighted_max_ema)[: max(2, len(ids) // 20)]
    in_grace = 0
    for b in hottest:
        for s in top[b].bundles[1::3]:
            state.recent_bundles[s.bundle] = now - rng.randint(60_000, int(cfg.bundle_grace_s * 1000) - 1)
            in_grace += 1
    expired = 0
    for n in rng.sample(names, min(len(names), max(10, len(names) // 50))):
        if n not in state.recent_bundles:
            state.recent_bundles[n] = now - int(cfg.bundle_grace_s * 1000) - rng.randint(1_000, 3_600_000)
            expired += 1
    return state, in_grace, expired


# ---------------------------------------------------------------------------------------------- checks


def _common_checks(inp: ShedInputs, res: ShedResult, before: ShedState, what: str) -> float:
    if res.result != "success" or not res.decisions:
        raise BenchError(f"{what}: the cycle decided nothing ({res.result}/{res.reason}): inputs not skewed?")
    loads = {b: d.weighted_max_ema for b, d in inp.loads.items()}
    avg = sum(loads.values()) / len(loads)
    if abs(res.avg - avg) > 1e-9:
        raise BenchError(f"{what}: average load {res.avg} != {avg} computed from the inputs")
    seen = Counter(u.bundle for u in res.decisions)
    twice = [b for b, n in seen.items() if n > 1]
    if twice:
        raise BenchError(f"{what}: bundles decided twice: {twice[:5]}")
    owner = inp.owner()
    for u in res.decisions:
        if owner(u.bundle) != u.src:
            raise BenchError(f"{what}: {u.bundle} is owned by {owner(u.bundle)}, not by its src {u.src}")
        if u.bundle in before.recent_bundles and inp.now_ms - before.recent_bundles[u.bundle] <= (
            inp.cfg.bundle_grace_s * 1000
        ):
            raise BenchError(f"{what}: {u.bundle} moved within the grace period and was moved again")
        if u.src in before.recent_brokers or (u.dst is not None and u.dst in before.recent_brokers):
            raise BenchError(f"{what}: {u.src}->{u.dst} involves a broker in its cool-down")
        if u.dst is not None and not inp.brokers.get(u.dst, False):
            raise BenchError(f"{what}: {u.bundle} sent to draining broker {u.dst}")
        if u.src == u.dst:
            raise BenchError(f"{what}: {u.bundle} transferred to its own owner")
        if not loads[u.src] > avg:
            raise BenchError(f"{what}: source {u.src} load {loads[u.src]:.3f} is not above average {avg:.3f}")
        if u.dst is not None and not loads[u.dst] < avg:
            raise BenchError(
                f"{what}: destination {u.dst} load {loads[u.dst]:.3f} is not below average {avg:.3f}"
            )
    for b, moved in Counter(u.src for u in res.decisions).items():
        if moved >= len(inp.top[b].bundles):
            raise BenchError(f"{what}: {b} would lose all {moved} of its top bundles (must keep one)")
    return avg


def check_transfer(inp: ShedInputs, res: ShedResult, before: ShedState) -> None:
    what = "transfer_shedder"
    _common_checks(inp, res, before, what)
    # max_broker_pairs bounds the brokers that shed (Pulsar's MaxNumberOfBrokerSheddingPerCycle); the
    # to_target plan may spread one source over several destinations, and so may half_gap (Pulsar's
    # TransferShedder: one destination per source, plus swaps back from it).
    srcs = {u.src for u in res.decisions}
    if len(srcs) > inp.cfg.max_broker_pairs:
        raise BenchError(
            f"{what}: {len(srcs)} shedding brokers > max_broker_pairs {inp.cfg.max_broker_pairs}"
        )
    if srcs & {u.dst for u in res.decisions}:
        raise BenchError(f"{what}: a broker is both a source and a destination")
    if any(u.dst is None for u in res.decisions) and inp.cfg.transfer:
        raise BenchError(f"{what}: a plain unload although transfer is enabled")
    for src in {u.src for u in res.decisions}:
        # About half the load gap: never more than the source's budget in bytes/s.
        moved = sum(u.throughput for u in res.decisions if u.src == src)
        if moved > inp.loads[src].throughput:
            raise BenchError(f"{what}: {src} sheds {moved:.0f} B/s, more than its throughput")
    if res.hit_count != 0:
        raise BenchError(f"{what}: hit count not reset after a successful cycle ({res.hit_count})")


def check_threshold(inp: ShedInputs, res: ShedResult, before: ShedState) -> None:
    what = "threshold_shedder"
    avg = _common_checks(inp, res, before, what)
    for u in res.decisions:
        if not inp.loads[u.src].weighted_max_ema >= avg + inp.cfg.threshold:
            raise BenchError(f"{what}: {u.src} is not above avg + threshold")


# ---------------------------------------------------------------------------------------------- timing


Shedder = Callable[..., ShedResult]
Decisions = list[tuple[str, str, str | None]]


def _fresh_state(inp: ShedInputs) -> tuple[ShedState, ShedState]:
    """A run's own shed state (the decision changes it) and an untouched copy for the checks; garbage is
    collected first, so that no collection lands in the timed part."""
    state, before = copy.deepcopy(inp.state), copy.deepcopy(inp.state)
    gc.collect()
    return state, before


def _same_as_first(first: Decisions | None, res: ShedResult, differs: str) -> Decisions:
    """Identical inputs must give identical decisions: every run's are compared with run 1's (``first``,
    None in run 1); ``differs`` is the failure otherwise."""
    got = [(u.bundle, u.src, u.dst) for u in res.decisions]
    if first is not None and got != first:
        raise BenchError(differs)
    return got


def time_decisions(
    inp: ShedInputs,
    fn: Shedder,
    check: Callable[[ShedInputs, ShedResult, ShedState], None],
    runs: int,
    progress: Progress,
    label: str,
) -> tuple[list[float], ShedResult]:
    owner = inp.owner()
    times: list[float] = []
    res: ShedResult | None = None
    first: Decisions | None = None
    for i in range(runs):
        state, before = _fresh_state(inp)
        t0 = time.perf_counter()
        res = fn(inp.brokers, inp.loads, inp.top, owner, state, inp.cfg, inp.now_ms)
        times.append(time.perf_counter() - t0)
        check(inp, res, before)
        first = _same_as_first(
            first, res, f"{label}: run {i + 1} decided differently from run 1 on identical inputs"
        )
    assert res is not None
    progress(
        f"{label}: median {statistics.median(times) * 1000:.2f} ms over {runs} runs, "
        f"{len(res.decisions)} decisions (checked)"
    )
    return times, res


def time_with_inputs(
    inp: ShedInputs, runs: int, progress: Progress
) -> tuple[list[float], list[float], list[float]]:
    """``shed_once`` minus the channel publishing: registry copy, view snapshots, owner over a real
    TableView, the decision; then (third list) the whole cycle including the per-broker load gauges and
    the ``shed`` event that ``shed_once`` writes after deciding."""
    from prometheus_client import CollectorRegistry

    from trimtab.cluster.events import EventPublisher
    from trimtab.controller.metrics import ControllerMetrics
    from trimtab.controller.shedding import observe_shed_cycle, shed_event

    metrics = ControllerMetrics.create(CollectorRegistry())
    transport = MemoryTransport()
    events = EventPublisher(transport, "events", source="bench", role="controller")
    loads_view: KeyValueView[BrokerLoadData] = KeyValueView(transport, "loads", BrokerLoadData)
    top_view: KeyValueView[TopBundles] = KeyValueView(transport, "top", TopBundles)
    loads_view.values = dict(inp.loads)
    top_view.values = dict(inp.top)
    table = TableView(partitions=4)
    table.load(dict(inp.records), {p: 0 for p in range(4)})
    registry = dict(inp.infos)
    totals: list[float] = []
    inputs_only: list[float] = []
    cycles: list[float] = []
    first: Decisions | None = None
    for i in range(runs):
        state, before = _fresh_state(inp)
        t0 = time.perf_counter()
        live = dict(registry)  # Controller.live_brokers()
        brokers = {b: not info.draining for b, info in live.items()}

        def owner(bundle: str, table: TableView = table) -> str | None:
            r = table.get(bundle)
            return r.dst if r is not None and r.state is State.OWNED else None

        loads = loads_view.snapshot()
        top = top_view.snapshot()
        t1 = time.perf_counter()
        res = transfer_shedder(brokers, loads, top, owner, state, inp.cfg, inp.now_ms)
        for u in res.decisions:  # shed_once re-reads each decision's record before publishing
            cur = table.get(u.bundle)
            assert cur is not None and cur.dst == u.src
        t2 = time.perf_counter()
        # What shed_once does after deciding (minus the channel writes and the log line).
        observe_shed_cycle(metrics, res, t2 - t1)
        events.publish("shed", **shed_event(res))
        t3 = time.perf_counter()
        totals.append(t2 - t0)
        inputs_only.append(t1 - t0)
        cycles.append(t3 - t0)
        check_transfer(inp, res, before)
        first = _same_as_first(
            first, res, f"decision with inputs: run {i + 1} decided differently from run 1"
        )
    if events.failed or events.published != runs:
        raise BenchError(f"shed events: {events.published} published, {events.failed} failed, want {runs}")
    progress(f"decision with inputs: median {statistics.median(totals) * 1000:.2f} ms over {runs} runs")
    return totals, inputs_only, cycles


def _stats_ms(times: list[float]) -> dict[str, Any]:
    ms = [t * 1000 for t in times]
    return {
        "median": round(statistics.median(ms), 3),
        "p99": round(percentile(ms, 99), 3),
        "min": round(min(ms), 3),
        "max": round(max(ms), 3),
        "runs": [round(x, 3) for x in ms],
    }


def _decisions_summary(res: ShedResult, inp: ShedInputs) -> dict[str, Any]:
    pairs = sorted({f"{u.src}->{u.dst}" for u in res.decisions})
    src_loads = sorted({round(inp.loads[u.src].weighted_max_ema, 4) for u in res.decisions})
    dst_loads = sorted({round(inp.loads[u.dst].weighted_max_ema, 4) for u in res.decisions if u.dst})
    return {
        "count": len(res.decisions),
        "result": res.result,
        "reason": res.reason,
        "broker_pairs": len(pairs),
        "pairs_first_10": pairs[:10],
        "moved_throughput_bytes_per_s": round(sum(u.throughput for u in res.decisions)),
        "skipped_bundles_by_reason": dict(sorted(Counter(r for _, r in res.skipped_bundles).items())),
        "avg_load": round(res.avg, 4),
        "std_load": round(res.std, 4),
        "src_loads": {"n": len(src_loads), "min": src_loads[0], "max": src_loads[-1]} if src_loads else None,
        "dst_loads": {"n": len(dst_loads), "min": dst_loads[0], "max": dst_loads[-1]} if dst_loads else None,
    }


HEAL_PLAN_BUNDLES = 100_000
HEAL_PLAN_TARGET_MS = 1000.0


def time_heal_plan(brokers: int, runs: int, progress: Progress) -> dict[str, Any]:
    """The healing plan of one failed broker owning :data:`HEAL_PLAN_BUNDLES` bundles (20 namespaces, no
    policies) over the other ``brokers - 1``, as the leader makes it (controller/healing.py): a private
    copy of the placement index, the placement rules with standby preference, ``plan_destinations`` with
    each pick recorded. Checked: every bundle planned to a live broker, spread within one bundle of even."""
    ids = [f"10.{i // 250}.{i % 250}.{1 + i % 7}:8080" for i in range(brokers)]
    policy = PlacementPolicy([PlacementBroker(id=i) for i in ids])
    dead, live = ids[0], ids[1:]
    names = [f"t/ns{i % 20}/0x{i:08x}_0x{i + 1:08x}" for i in range(HEAL_PLAN_BUNDLES)]
    owned = dict.fromkeys(names, dead)
    loads = {b: 0.45 for b in live}  # equal headroom: the even spread is the check
    times: list[float] = []
    for _ in range(runs):
        gc.collect()
        t0 = time.perf_counter()
        copy = Placement(policy, owned)
        rules = prefer_standby_set(lambda b: (), copy.candidate_set)
        plan = plan_destinations(names, loads, None, rules, copy.set_owner)
        times.append(time.perf_counter() - t0)
        per = Counter(plan.values())
        if None in per or not set(per) <= set(live):
            raise BenchError(f"heal plan: {per.get(None, 0)} bundles planned nowhere or to a dead broker")
        if max(per.values()) - min(per.get(b, 0) for b in live) > 1:
            raise BenchError("heal plan: not spread within one bundle of even over equal brokers")
    stats = _stats_ms(times)
    progress(
        f"heal plan: {HEAL_PLAN_BUNDLES} bundles over {brokers - 1} brokers, median {stats['median']:.1f} ms "
        "(checked)"
    )
    return stats


STANDBY_CHANGE_TARGET_MS = 1.0
STANDBY_CHANGES = 200


def time_standby_changes(brokers: int, progress: Progress) -> dict[str, Any]:
    """Standby sets kept up to date incrementally, as the leader's standby job does: a full pass over
    :data:`HEAL_PLAN_BUNDLES` owned bundles (one standby each, zone-aware over three zones) -- what a new
    leader or a change of brokers or policies costs -- then :data:`STANDBY_CHANGES` ownership changes, each
    repaired alone (the bundle moves onto its own standby, which must be replaced). Checked: every set
    keeps the rules (a live broker, never the owner, another zone than the owner's when one exists)."""
    ids = [f"10.{i // 250}.{i % 250}.{1 + i % 7}:8080" for i in range(brokers)]
    tags = {b: {"zone": f"z{i % 3}"} for i, b in enumerate(ids)}
    rules = StandbyRules(StandbySpec(1, ("zone",)), tags)
    owners = {f"t/ns{i % 20}/0x{i:08x}_0x{i + 1:08x}": ids[i % brokers] for i in range(HEAL_PLAN_BUNDLES)}
    everyone = frozenset(ids)
    published: dict[str, list[str]] = {}
    loads = StandbyLoads(Counter(owners.values()), ids)

    def repair(bundles: list[str] | dict[str, str]) -> dict[str, list[str]]:
        got = repair_standbys(
            bundles,
            lambda b: published.get(b, ()),
            owner_of=owners.get,
            candidates_of=lambda b: everyone,
            rules=rules,
            loads=loads,
        )
        published.update(got)
        return got

    def check(bundle: str) -> None:
        picks, owner = published[bundle], owners[bundle]
        if brokers < 3:  # no other zone (or no other broker) to stand by in
            return
        if len(picks) != 1 or picks[0] == owner or tags[picks[0]]["zone"] == tags[owner]["zone"]:
            raise BenchError(f"standby set {picks} of {bundle} (owner {owner}) breaks the rules")

    gc.collect()
    t0 = time.perf_counter()
    repair(owners)
    full_s = time.perf_counter() - t0
    rng = random.Random(3)
    names = sorted(owners)
    times: list[float] = []
    for _ in range(STANDBY_CHANGES):
        bundle = rng.choice(names)
        old, new = owners[bundle], published[bundle][0]
        owners[bundle] = new  # what the job's channel listener notes: the owned counts it shifts
        t0 = time.perf_counter()
        loads.add(old, -1)
        loads.add(new, 1)
        got = repair([bundle])
        times.append(time.perf_counter() - t0)
        if set(got) != {bundle}:
            raise BenchError(f"one ownership change repaired {len(got)} bundles")
        check(bundle)
    for bundle in rng.sample(names, 1000):
        check(bundle)
    stats = _stats_ms(times)
    progress(
        f"standbys: full pass over {HEAL_PLAN_BUNDLES} bundles {full_s:.2f} s; one ownership change p50 "
        f"{stats['median']:.3f} ms, p99 {stats['p99']:.3f} ms over {STANDBY_CHANGES} (checked)"
    )
    return {**stats, "full_pass_s": round(full_s, 3)}


ASSIGN_TARGET_MS = 1.0
ASSIGN_RUNS = 200
#: Reports arriving between two decisions: 10 000 brokers reporting every 10 s, 100 assignments/s.
ASSIGN_REPORTS_BETWEEN = 10


def time_assign(inp: ShedInputs, progress: Progress) -> dict[str, Any]:
    """One assignment decision of an unowned bundle over the live brokers of the inputs, as an agent makes
    it -- the default filters, no placement rule, through the incremental index kept as reports arrive
    (balance/assign_index.py) -- :data:`ASSIGN_RUNS` times, with :data:`ASSIGN_REPORTS_BETWEEN` new reports
    before each (their cost counted in the decision that absorbs them). Building the index -- once, and again
    at each change of the registered brokers -- is timed apart (``index_build_ms``). Checked every time: the same broker the scan (``select_broker``) picks from the
    same random state. The scan is timed too, on the same inputs, for comparison."""
    loads = dict(inp.loads)
    index = AssignIndex(loads)
    seed_rng = random.Random(2)
    live = sorted(inp.infos)
    now = inp.now_ms
    times: list[float] = []
    scans: list[float] = []
    kw: dict[str, Any] = {"load_ttl_s": 1800.0, "max_topics": 50_000, "prefer_later_versions": False}
    t0 = time.perf_counter()
    if index.select(inp.infos, random.Random(0), now_ms=now, exclude=frozenset(), diff=0.10, **kw) is None:
        raise BenchError("the assignment index declined the bench's inputs (a broker at the topic limit?)")
    build_ms = (time.perf_counter() - t0) * 1000
    for i in range(ASSIGN_RUNS):
        for b in seed_rng.sample(live, ASSIGN_REPORTS_BETWEEN):
            old = loads.get(b)
            if old is not None:
                ema = old.weighted_max_ema * seed_rng.uniform(0.8, 1.2)
                loads[b] = msgspec.structs.replace(old, weighted_max_ema=ema, updated_at=now)
                index.load_changed(b)
        now += 10
        seed = seed_rng.getrandbits(32)
        t0 = time.perf_counter()
        sel = index.select(inp.infos, random.Random(seed), now_ms=now, exclude=frozenset(), diff=0.10, **kw)
        times.append(time.perf_counter() - t0)
        ctx = AssignContext(loads=loads, now_ms=now)
        t0 = time.perf_counter()
        want = select_broker(f"bench/assign/0x{i:08x}_0x{i + 1:08x}", inp.infos, ctx, random.Random(seed))
        scans.append(time.perf_counter() - t0)
        if sel is None or sel.broker != want.broker:
            raise BenchError(f"assignment index chose {sel and sel.broker!r}, the scan {want.broker!r}")
        info = inp.infos.get(sel.broker or "")
        if info is None or info.draining:
            raise BenchError(
                f"assignment chose {sel.broker!r} ({sel.reason}): not a live, non-draining broker"
            )
    stats, scan = _stats_ms(times), _stats_ms(scans)
    progress(
        f"assignment: p50 {stats['median']:.3f} ms, p99 {stats['p99']:.3f} ms over {ASSIGN_RUNS} through the "
        f"index, built in {build_ms:.1f} ms (the scan: p50 {scan['median']:.2f}, p99 {scan['p99']:.2f} ms); every "
        "pick the scan's (checked)"
    )
    return {**stats, "scan": scan, "index_build_ms": round(build_ms, 3), "index_rebuilds": index.rebuilds}


def run(
    *,
    brokers: int = 1000,
    bundles: int = 100_000,
    runs: int = 20,
    seed: int = 1,
    progress: Progress | None = None,
) -> dict[str, Any]:
    progress = progress or progress_printer("shed")
    load_start = loadavg()
    progress(f"building inputs: {brokers} brokers x {bundles} bundles (seed {seed})...")
    t0 = time.perf_counter()
    inp = build_inputs(brokers, bundles, seed=seed)
    build_s = time.perf_counter() - t0
    progress(f"built in {build_s:.1f} s")

    loads = [d.weighted_max_ema for d in inp.loads.values()]
    gc.freeze()  # the inputs are long-lived leader state, not garbage
    try:
        t_times, t_res = time_decisions(
            inp, transfer_shedder, check_transfer, runs, progress, "transfer_shedder"
        )
        h_times, h_res = time_decisions(
            inp, threshold_shedder, check_threshold, runs, progress, "threshold_shedder"
        )
        w_times, w_inputs, w_cycles = time_with_inputs(inp, runs, progress)
    finally:
        gc.unfreeze()
    heal = time_heal_plan(brokers, min(runs, 5), progress)
    assign = time_assign(inp, progress)
    standby = time_standby_changes(brokers, progress)
    target = DECISION_TARGET_MS_10K if brokers >= 10_000 else DECISION_TARGET_MS

    t_stats, h_stats, w_stats = _stats_ms(t_times), _stats_ms(h_times), _stats_ms(w_times)
    out: dict[str, Any] = {
        "bench": "shed",
        "decision_ms": t_stats["median"],
        "decision_ms_p99": t_stats["p99"],
        "decision_ms_target": target,
        "threshold_decision_ms": h_stats["median"],
        "threshold_decision_ms_p99": h_stats["p99"],
        "decision_with_inputs_ms": w_stats["median"],
        "decision_with_inputs_ms_p99": w_stats["p99"],
        "inputs_only_ms": round(statistics.median(w_inputs) * 1000, 3),
        "shed_cycle_ms": round(statistics.median(w_cycles) * 1000, 3),
        "decisions": len(t_res.decisions),
        "threshold_decisions": len(h_res.decisions),
        "assign_decision_ms": assign["median"],
        "assign_decision_ms_p99": assign["p99"],
        "assign_decision_ms_p99_target": ASSIGN_TARGET_MS,
        "assign_scan_ms_p99": assign["scan"]["p99"],
        "standby_change_ms_p99": standby["p99"],
        "standby_change_ms_p99_target": STANDBY_CHANGE_TARGET_MS,
        "standby_full_pass_s": standby["full_pass_s"],
        "standby": {
            "timing_ms": {k: v for k, v in standby.items() if k != "full_pass_s"},
            "what": f"standby sets of {HEAL_PLAN_BUNDLES} bundles (1 replica, zone-aware): the full pass, then "
            f"{STANDBY_CHANGES} ownership changes each repaired alone (repair_standbys, StandbyLoads)",
        },
        "assign": {
            "timing_ms": {k: v for k, v in assign.items() if k != "scan"},
            "scan_timing_ms": assign["scan"],
            "what": f"one select of an unowned bundle through the agent's incremental index, "
            f"{ASSIGN_REPORTS_BETWEEN} reports absorbed before each; checked against select_broker's pick",
        },
        "heal_plan_ms": heal["median"],
        "heal_plan_ms_target": HEAL_PLAN_TARGET_MS,
        "heal_plan": {
            "timing_ms": heal,
            "what": f"the healing plan of one failed broker owning {HEAL_PLAN_BUNDLES} bundles (20 namespaces, "
            "no policies) over the other brokers: placement index copy, rules, plan_destinations",
        },
        "meets_targets": {
            "heal_plan_ms": heal["median"] < HEAL_PLAN_TARGET_MS,
            "assign_decision_ms_p99": assign["p99"] < ASSIGN_TARGET_MS,
            "standby_change_ms_p99": standby["p99"] < STANDBY_CHANGE_TARGET_MS,
            "decision_ms": t_stats["median"] < target,
            "decision_ms_p99": t_stats["p99"] < target,
            "decision_with_inputs_ms": w_stats["median"] < target,
        },
        "transfer_shedder": {"timing_ms": t_stats, "decisions": _decisions_summary(t_res, inp)},
        "threshold_shedder": {"timing_ms": h_stats, "decisions": _decisions_summary(h_res, inp)},
        "decision_with_inputs": {
            "timing_ms": w_stats,
            "inputs_only_ms": _stats_ms(w_inputs),
            "shed_cycle_ms": _stats_ms(w_cycles),
            "shed_cycle_what": (
                "decision_with_inputs plus what shed_once does after deciding, minus the channel writes and "
                "the log line: the load gauges of every broker (prometheus_client) and the 'shed' event "
                "(orjson, produced to an in-memory transport)"
            ),
            "what": (
                "Controller.shed_once without publishing: dict(registry) of live brokers, the "
                "{broker: not draining} map, KeyValueView.snapshot() of the load and top-bundles views, an "
                "owner() over a real TableView with every bundle, the transfer_shedder call, and the re-read "
                "of each decision's record"
            ),
        },
        "inputs": {
            "brokers": brokers,
            "bundles": bundles,
            "top_k": TOP_K,
            "seed": seed,
            "build_s": round(build_s, 2),
            "draining_brokers": sum(1 for v in inp.brokers.values() if not v),
            "cooling_brokers": len(inp.state.recent_brokers),
            "recent_bundles_in_grace": inp.recent_in_grace,
            "recent_bundles_expired": inp.recent_expired,
            "stale_top_k_entries": inp.stale_top_entries,
            "hit_count_before": inp.state.hit_count,
            "load": {
                "min": round(min(loads), 4),
                "avg": round(sum(loads) / len(loads), 4),
                "max": round(max(loads), 4),
                "std": round(statistics.pstdev(loads), 4),
            },
            "bundles_per_broker": {
                "min": min(inp.bundles_per_broker.values()),
                "median": statistics.median(inp.bundles_per_broker.values()),
                "max": max(inp.bundles_per_broker.values()),
            },
            "config": {k: getattr(inp.cfg, k) for k in inp.cfg.__dataclass_fields__},
            "how": (
                "seeded: log-normal bundle throughputs placed on brokers with log-normal weights; load = "
                "throughput / per-broker capacity (mean ~45%); top-k = balance.load.top_k of each broker's "
                "bundles; owner() = dict of Owned records (channel.records.make)"
            ),
        },
        "method": (
            "time.perf_counter around one shedder call; each run on a deep copy of the ShedState (copied "
            "outside the timing); gc.collect() before each run, gc.freeze() over the inputs; the median is "
            "the headline, p99 of so few runs is their maximum"
        ),
        "checks": {
            "every_run_decides": True,
            "runs_agree": True,
            "src_above_average": True,
            "dst_below_average_and_not_draining": True,
            "no_bundle_twice": True,
            "bundle_owned_by_src": True,
            "grace_and_cooldown_respected": True,
            "keeps_one_top_bundle": True,
            "max_broker_pairs": True,
            "source_never_destination": True,
            "note": "any failed check aborts the bench with a non-zero exit before this JSON is printed",
        },
        "env": environment(load_start, "msgspec"),
    }
    return out
