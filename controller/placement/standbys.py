"""Warm standbys, leader only (KIP-708; docs/placement.md "Warm standbys"): every
``placement.standby_interval_s`` the standby sets are brought up to date with the placement rules and the
sets that changed are written to the standby topic (cluster/placement/standbys.py), where agents read
what to pre-warm and healing reads whom to prefer. Not destructive -- nothing moves -- so it runs whenever
this controller leads, safe mode included.

Incremental: a round repairs only the bundles whose owner changed since the last one (a channel listener
collects them, with the owned counts they shift), keeping every standby that is still right -- one
ownership change costs one bundle's repair, not a pass over every bundle (docs/scaling.md). Every bundle
is checked when this controller becomes leader, when brokers or placement policies change, and every
:data:`FULL_PASS_S` (so counts that drifted are recounted).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import Counter
from collections.abc import Callable

import msgspec
import structlog

from trimtab.balance.placement.standby import StandbyLoads, StandbyRules, StandbySpec, repair_standbys
from trimtab.channel.transport import Transport
from trimtab.cluster.placement.standbys import StandbyIndex, StandbySet
from trimtab.cluster.placement.view import LivePlacement
from trimtab.controller.leadership import Leadership
from trimtab.controller.metrics import ControllerMetrics

log = structlog.get_logger("trimtab.controller")
_enc = msgspec.json.Encoder()
#: Every bundle is checked (and the loads recounted) at least this often, whatever changed.
FULL_PASS_S = 600.0


class StandbyJob:
    name = "standbys"

    def __init__(
        self,
        placement: LivePlacement,
        index: StandbyIndex,
        transport: Transport,
        topic: str,
        leadership: Leadership,
        metrics: ControllerMetrics,
        spec: StandbySpec,
        *,
        view_ready: Callable[[], bool] = lambda: True,
        ack_timeout_s: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``view_ready``: whether the standby topic has been read to its end -- until then what was
        published is unknown and every set would be rewritten."""
        self.placement = placement
        self.index = index
        self.transport = transport
        self.topic = topic
        self.leadership = leadership
        self.metrics = metrics
        self.spec = spec
        self.ack_timeout_s = ack_timeout_s
        self.view_ready = view_ready
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._dirty: dict[str, tuple[str | None, str | None]] = {}  # bundle -> (owner before, owner now)
        self._loads: StandbyLoads | None = None  # None: the next round is a full pass
        self._rules: tuple[StandbyRules, Callable[[str], frozenset[str]]] | None = None
        self._generation = -1
        self._full_at = 0.0
        self.full_passes = 0
        index.add_listener(self._read_back)
        # owned bundles with fewer standbys than wanted -> how many fewer
        self._short: dict[str, int] = {}
        # sets written and acknowledged that the standby view may not have read back yet: a repair starts
        # from them (counting the view's older set would skew the loads), and they are not written twice
        self._written: dict[str, tuple[str, ...]] = {}

    @property
    def pending(self) -> int:
        """Bundles whose owner changed and that the next round repairs."""
        with self._lock:
            return len(self._dirty)

    def owner_changed(self, bundle: str, before: str | None, after: str | None) -> None:
        """The placement index's owner listener (under its lock, on the channel's thread): remember the
        bundle and the owned counts it shifts."""
        if before == after:
            return
        with self._lock:
            first = self._dirty.get(bundle)
            self._dirty[bundle] = (first[0] if first is not None else before, after)

    def _full_pass(self) -> dict[str, list[str]]:
        """Every owned or published bundle, loads counted afresh (a worker thread)."""
        generation = self.placement.generation
        copy = self.placement.planning()
        with self._lock:
            # The copy holds every change heard before it (the owner listener runs under the index's lock):
            # what is noted counts from the copy's owner on -- a no-op for a change the copy has, a delta for
            # one heard after it -- never twice.
            self._dirty = {
                b: (was, now) for b, (_, now) in self._dirty.items() if (was := copy.owned.get(b)) != now
            }
        published = self.index.snapshot()
        with self._lock:
            overlay = dict(self._written)
        for b, written in overlay.items():  # acknowledged, perhaps not read back yet
            if written:
                published[b] = written
            else:
                published.pop(b, None)
        candidates, tags = self.placement.standby_rules()
        counts = Counter({b: copy.owned_count(b) for b in tags})
        counts.update(m for members in published.values() for m in members)
        self._loads = StandbyLoads(counts, tags)
        self._rules = StandbyRules(self.spec, tags), candidates
        sets = repair_standbys(
            {*copy.owned, *published},
            lambda b: published.get(b, ()),
            owner_of=copy.owned.get,
            candidates_of=candidates,
            rules=self._rules[0],
            loads=self._loads,
        )
        self._generation, self._full_at = generation, self.monotonic()
        self.full_passes += 1
        self._short.clear()
        return sets

    def _repair(self, loads: StandbyLoads) -> dict[str, list[str]]:
        """The bundles whose owner changed since the last round (a worker thread)."""
        with self._lock:
            dirty, self._dirty = self._dirty, {}
        if not dirty:
            return {}
        for before, after in dirty.values():
            loads.add(before, -1)
            loads.add(after, 1)
        assert self._rules is not None  # set with the loads
        rules, candidates = self._rules  # the rules have not changed since the full pass (the generation)
        return repair_standbys(
            dirty,
            self._current,
            owner_of=self.placement.owner,
            candidates_of=candidates,
            rules=rules,
            loads=loads,
        )

    def _current(self, bundle: str) -> tuple[str, ...]:
        """The bundle's set as last written: acknowledged by Kafka, or read back from the topic."""
        with self._lock:
            written = self._written.get(bundle)
        return written if written is not None else self.index.of(bundle)

    def _read_back(self, bundle: str) -> None:
        """The standby view read a record of ``bundle`` (its thread): from now on the view says what is
        published -- this job's write read back, or someone else's after it. (A record older than this
        job's last write, read first, ends the overlay early: the next round may write the set once more.)"""
        with self._lock:
            self._written.pop(bundle, None)

    async def run_once(self) -> int:
        """Bring the sets up to date and publish what changed; returns the number of records written."""
        if not self.leadership.is_leader or self.spec.replicas == 0:
            self._loads = None  # a new leadership starts with a full pass
            with self._lock:
                self._dirty.clear()  # bounded: nothing repairs them here, and the full pass counts afresh
                self._written.clear()  # another leader may write meanwhile: trust the topic again
        if not self.leadership.is_leader:
            return 0
        if self.spec.replicas == 0:
            sets: dict[str, list[str]] = {b: [] for b in self.index.snapshot()}
        else:
            loads = self._loads
            due = (
                loads is None
                or self.placement.generation != self._generation
                or self.monotonic() - self._full_at >= FULL_PASS_S
            )
            sets = await asyncio.to_thread(
                self._full_pass if due or loads is None else lambda: self._repair(loads)
            )
        self._observe(sets)
        if not self.view_ready():
            log.info("standbys_not_published", reason="the standby topic has not been read yet")
            self._loads = None  # what was published is unknown: start over once it is read
            return 0
        term = self.leadership.term()
        writes: list[tuple[str, bytes | None]] = []
        for b, brokers in sets.items():
            if tuple(brokers) == self._current(b):
                continue
            writes.append((b, _enc.encode(StandbySet(brokers=brokers, term=term)) if brokers else None))
        if not writes:
            return 0
        futs = [self.transport.produce(self.topic, b.encode(), value) for b, value in writes]
        await asyncio.to_thread(concurrent.futures.wait, futs, self.ack_timeout_s)
        ok = 0
        for (bundle, value), f in zip(writes, futs, strict=True):
            kind = "set" if value is not None else "tombstone"
            if f.done() and f.exception() is None:
                ok += 1
                with self._lock:
                    self._written[bundle] = tuple(sets[bundle])
                self.metrics.standby_writes.labels(kind, "ok").inc()
            else:
                self.metrics.standby_writes.labels(kind, "failed").inc()
                self._loads = None  # the published sets are not what was counted: recount next round
                log.warning(
                    "standby_write_failed", bundle=bundle, error=str(f.exception()) if f.done() else "timeout"
                )
        log.info("standbys_published", written=ok, bundles=len(sets), replicas=self.spec.replicas)
        return ok

    def _observe(self, sets: dict[str, list[str]]) -> None:
        """Coverage and missing standbys over every owned bundle, from the bundles short of standbys (kept
        across rounds: a round sees only the bundles it repaired)."""
        want = self.spec.replicas
        for b, members in sets.items():
            short = want - len(members) if self.placement.owner(b) is not None else 0
            if short > 0:
                self._short[b] = short
            else:
                self._short.pop(b, None)
        owned = self.placement.owned_total()
        self.metrics.standby_coverage.set((owned - len(self._short)) / owned if owned and want else 1.0)
        self.metrics.standby_missing.set(sum(self._short.values()) if want else 0)
