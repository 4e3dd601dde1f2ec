"""Self-healing and the ownership monitor (docs/design.md section 5.4), leader only. Pure.

* **Failed brokers** (KIP-46): a broker whose registration vanished gets a persisted first-failure time.
  After the grace period (-1 disables healing) its bundles are reassigned by forced overrides, unless the
  mass-failure guard says too many brokers are gone at once (then healing pauses and an alert fires).
* **Overrides** go to ``Assigning{dst=new, src=dead, force}`` rather than straight to Owned, so the new
  owner acquires the bundle and confirms with Owned: a lookup never sees an owner that is not serving yet,
  and "in flight" is visible in the channel for throttling.
* **Throttling**: at most ``max_in_flight`` bundles in Assigning cluster-wide and
  ``max_in_flight_per_broker`` into one broker; the rest wait for the next round.
* **Monitor**: in-flight states older than the in-flight timeout while their brokers are alive are
  stuck and get forced onward (a split or a merge always forward, to a new source); Free/Deleted entries are tombstoned after the tombstone delay. (A split
  parent stays Deleted that long on purpose: a lookup with an outdated layout that lands on it re-reads
  the layout, whereas a tombstoned parent would look unowned and could be assigned a second time.)
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from trimtab.channel import intents
from trimtab.channel.records import IN_FLIGHT, Record, State
from trimtab.config.settings import Settings

Choose = Callable[[str, frozenset[str]], str | None]  # (bundle, exclude) -> broker or None


@dataclass(frozen=True)
class HealConfig:
    grace_s: float = 0.0  # -1 disables auto-healing
    max_in_flight: int = 10_000
    max_in_flight_per_broker: int = 5000
    mass_failure_max_brokers: int = 10
    mass_failure_max_fraction: float = 0.4
    in_flight_timeout_s: float = 30.0
    tombstone_delay_s: float = 3600.0
    alert_after_s: float = 600.0  # the failed-broker alert: see overdue()

    @classmethod
    def from_settings(cls, s: Settings) -> HealConfig:
        h = s.healing
        return cls(
            grace_s=h.grace_s,
            max_in_flight=h.max_in_flight,
            max_in_flight_per_broker=h.max_in_flight_per_broker,
            mass_failure_max_brokers=h.mass_failure_max_brokers,
            mass_failure_max_fraction=h.mass_failure_max_fraction,
            in_flight_timeout_s=s.channel.in_flight_timeout_s,
            tombstone_delay_s=s.channel.tombstone_delay_s,
            alert_after_s=h.alert_after_s,
        )


@dataclass(frozen=True)
class Override:
    bundle: str
    record: Record | None  # None: a tombstone
    reason: str  # failed_broker | stuck | tombstone
    broker: str | None  # the failed or stuck broker this is about
    dst: str | None


def names_broker(rec: Record, broker: str) -> bool:
    """Pulsar's cleanup test: owner (or split source) is the broker, or it is part of an in-flight move."""
    if rec.owner() == broker:
        return True
    return rec.state in IN_FLIGHT and broker in (rec.src, rec.dst)


def dependents(rec: Record) -> frozenset[str]:
    """Brokers this record needs in order to make progress (or to be served).

    ``Owned{dst=B, src=A}`` depends on B only: A is history. ``Assigning{dst=live, src=dead}`` depends on
    the live destination only -- that is a reassignment in progress, and counting it would make a new
    leader reassign bundles twice.
    """
    s = rec.state
    if s is State.OWNED or s is State.ASSIGNING:
        return frozenset({rec.dst}) if rec.dst else frozenset()
    if s is State.RELEASING:
        return frozenset(b for b in (rec.src, rec.dst) if b)
    if s is State.SPLITTING or s is State.MERGING:
        return frozenset({rec.src}) if rec.src else frozenset()
    return frozenset()  # Free, Deleted: nobody has work left to do (the leader tombstones them later)


def named_brokers(items: Iterable[tuple[str, Record]]) -> set[str]:
    """Every broker some record depends on (:func:`dependents`): those the table still needs."""
    named: set[str] = set()
    for _, r in items:
        named |= dependents(r)
    return named


def needs_healing(rec: Record, gone: frozenset[str]) -> bool:
    """Whether ``rec`` depends on a broker in ``gone`` (:func:`dependents`, without allocating: the leader
    runs this over the whole table in every healing round)."""
    s = rec.state
    if s is State.OWNED or s is State.ASSIGNING:
        return rec.dst in gone
    if s is State.RELEASING:
        return rec.src in gone or rec.dst in gone
    if s is State.SPLITTING or s is State.MERGING:
        return rec.src in gone
    return False


def orphaned(items: Iterable[tuple[str, Record]], gone: frozenset[str]) -> list[tuple[str, Record]]:
    """Bundles that need healing because of ``gone``, in name order (the persisted plan's order)."""
    return sorted(((b, r) for b, r in items if needs_healing(r, gone)), key=lambda x: x[0])


def plan_destinations(
    bundles: list[str],
    candidates: Mapping[str, float],
    existing: Mapping[str, int] | None = None,
    allowed: Callable[[str], Collection[str]] | None = None,
    placed: Callable[[str, str], None] | None = None,
) -> dict[str, str | None]:
    """Spread many orphaned bundles over ``candidates`` (broker -> load EMA, a fraction).

    Greedy by spare capacity: each bundle goes to the broker with the fewest planned bundles per unit of
    headroom, so 10 000 bundles of a dead broker do not all land on the single least loaded one.
    ``existing`` adds bundles each broker already owns, in the same currency. ``allowed(bundle)`` (the
    placement rules) narrows each bundle's choice; a bundle nobody may take is planned nowhere (None).
    ``placed(bundle, broker)`` is told each pick before the next bundle is asked about, so rules that
    count placements (anti-affinity) see the plan so far -- not only the ownership it started from.
    """
    if not candidates:
        return {b: None for b in bundles}
    planned = {c: float((existing or {}).get(c, 0)) for c in candidates}
    room = {c: max(0.05, 1.0 - load) for c, load in candidates.items()}

    def cost(c: str) -> tuple[float, str]:
        return ((planned[c] + 1) / room[c], c)

    # The least cost of a pool, from a heap of (cost, broker): a pick raises only its broker's cost, so an
    # entry whose cost is out of date is pushed again with the right one when it comes up -- the same pick
    # as a scan of the pool (10 000 brokers x 1 000 bundles: 1.8 s scanned). The heap is kept while the pool
    # is: the candidates, or the same frozen ``allowed`` set given again (the rules of one namespace).
    out: dict[str, str | None] = {}
    last: Collection[str] | None = None
    heap: list[tuple[float, str]] = []
    for b in bundles:
        ok: Collection[str] = candidates if allowed is None else allowed(b)
        if ok is not last or not (ok is candidates or isinstance(ok, frozenset)):
            if ok is candidates:
                heap = [cost(c) for c in candidates]
            elif len(ok) < len(candidates):  # a few warm standbys: not a pass over every broker
                heap = [cost(c) for c in ok if c in candidates]
            else:
                heap = [cost(c) for c in candidates if c in ok]
            heapq.heapify(heap)
            last = ok
        if not heap:
            out[b] = None
            continue
        while (now := cost(heap[0][1])) != heap[0]:
            heapq.heapreplace(heap, now)
        dst = heap[0][1]
        out[b] = dst
        planned[dst] += 1
        heapq.heapreplace(heap, cost(dst))
        if placed is not None:
            placed(b, dst)
    return out


def mass_failure(failed: int, live: int, cfg: HealConfig) -> str | None:
    """The guard: too many brokers lost at once means something bigger is wrong; page a human."""
    if failed > cfg.mass_failure_max_brokers:
        return f"{failed} failed brokers > {cfg.mass_failure_max_brokers}"
    total = failed + live
    if total and failed / total > cfg.mass_failure_max_fraction:
        return f"{failed}/{total} brokers failed > {cfg.mass_failure_max_fraction:.0%}"
    return None


def due(failed: Mapping[str, int], cfg: HealConfig, now_ms: int) -> list[str]:
    """Failed brokers whose grace has passed (none when healing is disabled)."""
    if cfg.grace_s < 0:
        return []
    return sorted(b for b, t in failed.items() if now_ms - t >= cfg.grace_s * 1000)


def overdue(
    failed: Mapping[str, int], needing: Iterable[Record], cfg: HealConfig, now_ms: int
) -> dict[str, int]:
    """The failed-broker alert (Cruise Control's ``broker.failure.alert.threshold.ms``): each failed broker
    (``failed``: broker -> first failure, ms) whose bundles are not all reassigned ``alert_after_s`` after
    its first failure, with how many of ``needing`` (records that still need healing) still depend on it.

    Whatever held them back counts -- a grace period longer than the alert delay, healing disabled or
    paused by the mass-failure guard, no broker the placement rules allow -- since each leaves bundles
    unserved that an operator has to hear about. A broker whose bundles all moved is not overdue, however
    long ago it failed."""
    late = {b for b, t in failed.items() if now_ms - t >= cfg.alert_after_s * 1000}
    if not late:
        return {}
    counts: Counter[str] = Counter()
    for r in needing:
        counts.update(b for b in dependents(r) if b in late)
    return dict(sorted(counts.items()))


def override_for(
    bundle: str, cur: Record, gone: frozenset[str], choose: Choose, now_ms: int, writer: str
) -> tuple[Record | None, str | None] | None:
    """The forced record that takes ``bundle`` off the brokers in ``gone``; None if nothing to do.

    Returns (record, chosen destination). Pulsar's overrideOwnership, adapted to the Assigning handshake.
    """
    if not needs_healing(cur, gone):
        return None
    s = cur.state

    def force(
        state: State, *, dst: str | None, src: str | None, children: dict[str, str | None] | None = None
    ) -> Record:
        return intents.force(cur, state, dst=dst, src=src, writer=writer, now_ms=now_ms, children=children)

    if s is State.SPLITTING:
        new_src = choose(bundle, gone)
        if new_src is None:
            return force(State.FREE, dst=None, src=cur.src), None
        kids: dict[str, str | None] = {k: new_src for k in (cur.children or {})}
        return force(State.SPLITTING, dst=None, src=new_src, children=kids), new_src
    if s is State.MERGING:
        return _roll_merge_forward(bundle, cur, gone, choose, force)
    if s is State.RELEASING and cur.src not in gone and cur.dst in gone:
        dst = choose(bundle, gone)  # the source is fenced; someone (maybe the source again) takes it
    elif s is State.RELEASING and cur.src in gone and cur.dst is not None and cur.dst not in gone:
        dst = cur.dst  # the transfer target is alive: finish the transfer for the dead source
    else:
        dst = choose(bundle, gone)
    src = cur.dst if s is State.OWNED else cur.src
    if dst is None:
        return force(State.FREE, dst=None, src=src), None
    return force(State.ASSIGNING, dst=dst, src=src if src != dst else None), dst


def _roll_merge_forward(
    bundle: str,
    cur: Record,
    gone: frozenset[str],
    choose: Choose,
    force: Callable[..., Record],
) -> tuple[Record | None, str | None] | None:
    """A merge is only ever pushed forward, to a new source (``Merging{src=new, {X: new}}``), never rolled
    back by an override: the partner may already have created the merged bundle X, and a parent forced
    back to a broker would overlap it. The new source finishes the merge if it committed, and aborts it
    (the parent Owned by itself) if the partner never followed (``balance.roles.plan_merge``). With no
    broker to take it over, the record stays as it is (no Free: a Free parent could be assigned while X
    is owned): the failed-broker alert counts it until a broker can."""
    new_src = choose(bundle, gone)
    if new_src is None:
        return None
    merged: dict[str, str | None] = {k: new_src for k in (cur.children or {})}
    return force(State.MERGING, dst=None, src=new_src, children=merged), new_src


def in_flight_by_broker(items: Iterable[tuple[str, Record]]) -> Counter[str]:
    """Bundles currently Assigning into each broker: the throttle's measure of work in progress."""
    c: Counter[str] = Counter()
    for _, r in items:
        if r.state is State.ASSIGNING and r.dst is not None:
            c[r.dst] += 1
    return c


def throttle(
    candidates: list[tuple[str, Record]],
    gone: frozenset[str],
    choose: Choose,
    in_flight: Counter[str],
    cfg: HealConfig,
    now_ms: int,
    writer: str,
    reason: str,
    broker: str | None,
    *,
    planned: Mapping[str, str | None] | None = None,
    live: Collection[str] | None = None,
) -> tuple[list[Override], int]:
    """Overrides for ``candidates`` in order, within the in-flight limits. Returns (overrides, deferred).

    ``planned`` gives each bundle's destination from a persisted plan; it is used while that broker is in
    ``live``, not gone and not full, otherwise ``choose`` picks another. ``in_flight`` is updated with the
    Assigning records produced, so successive calls share the budget.
    """
    total = sum(in_flight.values())
    out: list[Override] = []
    deferred = 0
    per_broker = cfg.max_in_flight_per_broker
    # Kept as the loop adds to in_flight (a failover round asks about thousands of bundles, a few brokers).
    full = frozenset(b for b, n in in_flight.items() if n >= per_broker)
    excluded = gone | full
    plan = planned or {}
    for bundle, cur in candidates:
        if total >= cfg.max_in_flight:
            deferred += 1
            continue
        target = plan.get(bundle)

        def pick(b: str, exclude: frozenset[str], target: str | None = target) -> str | None:
            if target is not None and (live is None or target in live) and target not in exclude:
                return target
            return choose(b, exclude)

        got = override_for(bundle, cur, excluded, pick, now_ms, writer)
        if got is None:
            continue
        rec, dst = got
        if rec is not None and rec.state is State.FREE and full:
            deferred += 1  # every broker with room is full right now; try again next round
            continue
        out.append(Override(bundle, rec, reason, broker, dst))
        if rec is not None and rec.state is State.ASSIGNING and dst is not None:
            in_flight[dst] += 1
            total += 1
            if in_flight[dst] >= per_broker and dst not in full:
                full = full | {dst}
                excluded = gone | full
    return out, deferred


def monitor(
    items: Iterable[tuple[str, Record]],
    live: frozenset[str],
    choose: Choose,
    cfg: HealConfig,
    now_ms: int,
    writer: str,
    seen_age_s: Callable[[str, Record], float] | None = None,
) -> list[Override]:
    """Stuck in-flight states and semi-terminal entries due for a tombstone.

    An in-flight record is stuck once it is older than the timeout by its writer's clock **and**, when
    ``seen_age_s`` is given, by how long ago this node saw it (its monotonic clock,
    :class:`~trimtab.channel.inflight.InFlightClock`): a writer whose clock is behind, or a leader whose
    clock is ahead, cannot make the monitor force a record onward before the timeout really passed."""
    out: list[Override] = []
    timeout = cfg.in_flight_timeout_s * 1000
    delay = cfg.tombstone_delay_s * 1000
    for bundle, r in items:
        age: float = now_ms - r.ts
        if r.state in IN_FLIGHT:
            if seen_age_s is not None:
                age = min(age, seen_age_s(bundle, r) * 1000)
            # dependents, not every named broker: Assigning{dst=live, src=dead} is not healing's (see
            # dependents), so if its destination never confirms, only this monitor can move it on.
            if age <= timeout or not dependents(r) <= live:
                continue  # young, or a failed broker's (healing handles those, with its grace)
            # Stuck with live brokers: push it on, away from the broker that did not act.
            stuck = frozenset(
                {r.dst} if r.state is State.ASSIGNING and r.dst else {r.src} if r.src else set()
            )
            got = override_for(bundle, r, stuck, choose, now_ms, writer)
            if got is not None:
                out.append(Override(bundle, got[0], "stuck", next(iter(stuck), None), got[1]))
        elif r.state in (State.FREE, State.DELETED) and age > delay:
            out.append(Override(bundle, None, "tombstone", r.src, None))
    return out
