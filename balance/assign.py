"""Choosing a broker for an unowned bundle (docs/design.md section 5.1), decided locally by any agent.

A chain of filters narrows the candidates -- each filter narrows, never empties: a filter that would
leave nobody is skipped and the skip is reported -- then *least resource usage with weight* picks at
random among brokers whose EMA is at least ``diff`` below the average (else among all candidates).
Randomness is injected so the simulator and the tests replay decisions exactly.

Filters are plain objects with a ``name`` and ``apply(bundle, candidates, ctx)``; the placement issue adds
failure-domain, anti-affinity and isolation filters to the same chain.
"""

from __future__ import annotations

import math
import random
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import msgspec

from trimtab.balance.load import BrokerLoadData
from trimtab.channel.records import Record, State
from trimtab.config.settings import Settings


class BrokerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A broker's static registration (the ephemeral ``brokers/<id>`` znode)."""

    schema: int = 1
    id: str
    service_url: str
    http_url: str
    tags: dict[str, str] = msgspec.field(default_factory=dict)
    failure_domain: str | None = None
    version: str = "1.0.0"
    start_time: int = 0  # ms
    draining: bool = False


@dataclass(frozen=True)
class AssignContext:
    """Everything a filter may consult; all of it replicated state, none of it local I/O."""

    loads: Mapping[str, BrokerLoadData]
    now_ms: int
    load_ttl_s: float = 1800.0
    max_topics: int = 50_000
    prefer_later_versions: bool = False
    exclude: frozenset[str] = frozenset()
    extra: Mapping[str, object] = field(default_factory=dict)

    @classmethod
    def from_settings(
        cls,
        s: Settings,
        loads: Mapping[str, BrokerLoadData],
        now_ms: int,
        exclude: frozenset[str] = frozenset(),
    ) -> AssignContext:
        return cls(
            loads=loads,
            now_ms=now_ms,
            load_ttl_s=s.load.ttl_s,
            max_topics=s.assignment.broker_max_topics,
            prefer_later_versions=s.assignment.prefer_later_versions,
            exclude=exclude,
        )


PlacementRule = Callable[[str, dict[str, BrokerInfo]], dict[str, BrokerInfo]]
"""(bundle, candidates) -> the candidates the placement rules allow."""


class BrokerFilter(Protocol):
    name: str

    def apply(
        self, bundle: str, candidates: dict[str, BrokerInfo], ctx: AssignContext
    ) -> dict[str, BrokerInfo]: ...


_Core = tuple[tuple[int, int, str], ...]
_Pre = tuple[tuple[int, int, str], ...]


def _number(p: str) -> tuple[int, str]:
    """A decimal identifier as (digits, digits without leading zeros): ordered as its number, without
    int() -- which refuses more than 4 300 digits, or fewer, as the interpreter's settings decide
    (``PYTHONINTMAXSTRDIGITS``), and a version is the broker's own word. Non-ASCII decimals ("٣") are read
    as their digit value, as int() would."""
    d = (p if p.isascii() else "".join(str(unicodedata.decimal(c)) for c in p)).lstrip("0")
    return len(d), d


def version_key(v: str) -> tuple[_Core, int, _Pre]:
    """A broker version as a sortable key in semver 2.0.0 precedence (section 11): release numbers
    compared as numbers; a pre-release (``2.0.0-rc.1``) before its release; within a pre-release, numeric
    identifiers below alphanumeric ones and a longer set above its prefix. A release part that is not a
    number ranks below every number. isdecimal, not isdigit: "²" is a digit that is not a decimal."""
    core, sep, pre = v.partition("-")
    core_key = tuple((1, *_number(p)) if p.isdecimal() else (0, 0, p) for p in core.split("."))
    pre_key = tuple((0, *_number(p)) if p.isdecimal() else (1, 0, p) for p in pre.split(".")) if sep else ()
    return (core_key, 0 if sep else 1, pre_key)


class VersionFilter:
    """Only the brokers on the newest version, when ``prefer_later_versions`` is on. [broker_version_filter]"""

    name = "version"

    def apply(
        self, bundle: str, candidates: dict[str, BrokerInfo], ctx: AssignContext
    ) -> dict[str, BrokerInfo]:
        if not ctx.prefer_later_versions or not candidates:
            return candidates
        newest = max(version_key(b.version) for b in candidates.values())
        return {k: b for k, b in candidates.items() if version_key(b.version) == newest}


class MaxTopicsFilter:
    """Drop brokers already at the topic limit (by their last fresh report). [broker_max_topic_count_filter]"""

    name = "max_topics"

    def apply(
        self, bundle: str, candidates: dict[str, BrokerInfo], ctx: AssignContext
    ) -> dict[str, BrokerInfo]:
        # Run on every assignment over every broker: freshness inlined (is_fresh), and the candidates
        # returned as given when none is at the limit (the common case) rather than copied.
        get, now, ttl_ms, limit = ctx.loads.get, ctx.now_ms, ctx.load_ttl_s * 1000, ctx.max_topics
        full = [
            k
            for k in candidates
            if (load := get(k)) is not None and now - load.updated_at <= ttl_ms and load.topics >= limit
        ]
        if not full:
            return candidates
        drop = set(full)
        return {k: b for k, b in candidates.items() if k not in drop}


DEFAULT_FILTERS: tuple[BrokerFilter, ...] = (VersionFilter(), MaxTopicsFilter())
_OWN_FILTERS = (VersionFilter, MaxTopicsFilter)


@dataclass
class Selection:
    broker: str | None
    candidates: int
    skipped_filters: list[str]
    reason: str


def least_resource_usage(
    candidates: Sequence[str],
    loads: Mapping[str, BrokerLoadData],
    diff: float,
    rng: random.Random,
    now_ms: int,
    ttl_s: float,
) -> str | None:
    """Random among brokers with ``ema + diff <= average``; else random among all candidates.

    Brokers without a fresh report never count as "best" (they may be overloaded and silent).
    """
    if not candidates:
        return None
    # is_fresh, inlined: this runs over every broker on every assignment
    get, ttl_ms = loads.get, ttl_s * 1000
    scored = {
        b: load.weighted_max_ema
        for b in candidates
        if (load := get(b)) is not None and now_ms - load.updated_at <= ttl_ms
    }
    if scored:
        # fsum: the average must not depend on the candidates' order; the tolerance keeps a broker that
        # sits exactly on the line (the documented 10%/30%/80% example) on the right side of it.
        avg = math.fsum(scored.values()) / len(scored)
        best = sorted(b for b, s in scored.items() if s + diff <= avg + 1e-9)
        if best:
            return rng.choice(best)
    return rng.choice(sorted(candidates))


def select_broker(
    bundle: str,
    brokers: Mapping[str, BrokerInfo],
    ctx: AssignContext,
    rng: random.Random,
    *,
    filters: Sequence[BrokerFilter] = DEFAULT_FILTERS,
    diff: float = 0.10,
    placement: PlacementRule | None = None,
) -> Selection:
    """Pick a broker for ``bundle`` among live, non-draining, non-excluded ``brokers``.

    ``placement`` (isolation and anti-affinity, docs/placement.md) is a hard rule, applied first: when it
    allows none of the brokers the selection fails (``reason="placement"``) rather than break a policy.
    The ``filters`` after it are soft: one that would leave nobody is skipped."""
    candidates = {k: b for k, b in brokers.items() if k not in ctx.exclude and not b.draining}
    if not candidates:
        return Selection(None, 0, [], "no_brokers")
    if placement is not None:
        candidates = placement(bundle, candidates)
        if not candidates:
            return Selection(None, 0, [], "placement")
    skipped: list[str] = []
    for f in filters:
        # A filter of someone else's gets a copy (it may mutate it); these two never do (10 000 brokers).
        narrowed = f.apply(bundle, candidates if isinstance(f, _OWN_FILTERS) else dict(candidates), ctx)
        if narrowed:
            candidates = narrowed
        else:
            skipped.append(f.name)
    choice = least_resource_usage(list(candidates), ctx.loads, diff, rng, ctx.now_ms, ctx.load_ttl_s)
    return Selection(choice, len(candidates), skipped, "selected")


def headed_to(records: Iterable[Record]) -> Counter[str]:
    """How many bundles the channel gives each broker right now: those it owns, those on their way to it
    (``Assigning`` or ``Releasing`` with it as destination), and a splitting or merging parent at its source.

    Compared with a broker's last report (:attr:`BrokerLoadData.bundles`) this says what the report has
    not seen yet: the picks of every drain and assignment since it was sampled."""
    counts: Counter[str] = Counter()
    for rec in records:
        broker = rec.src if rec.state is State.SPLITTING or rec.state is State.MERGING else rec.dst
        if broker is not None and rec.state is not State.FREE and rec.state is not State.DELETED:
            counts[broker] += 1
    return counts


def per_bundle_load(loads: Mapping[str, BrokerLoadData]) -> float:
    """The cluster's mean load per bundle by the last reports (0 when no report counts a bundle)."""
    bundles = sum(d.bundles for d in loads.values() if d.bundles > 0)
    if bundles <= 0:
        return 0.0
    return math.fsum(d.weighted_max_ema for d in loads.values() if d.bundles > 0) / bundles


@dataclass
class BurstPicks:
    """The picks one burst of selections (a drain) has made, so each later pick sees the earlier ones.

    Load reports lag: while an agent drains 100 bundles, every broker's EMA stays what it last reported,
    so :func:`least_resource_usage` would choose among the same few "best" brokers a hundred times and
    pile the whole drain onto them (the simulator's rolling restart left one broker at 179 %). Each pick
    adds ``share`` -- the drained broker's load per bundle, the best estimate without per-bundle reports
    -- to its destination in the loads the next pick reads; a destination drops out of the best set once
    it is no longer ``diff`` below the average. Pulsar's modular load manager keeps the same kind of
    ledger (``preallocatedBundleData``) between reports.

    Several brokers drain at once in a rolling restart, and each ledger alone sees only its own picks:
    :meth:`for_drain` therefore starts from what the channel already gives each broker beyond its last
    report (:func:`headed_to`) -- the other drains' picks and any bundle moved since -- at the cluster's
    mean load per bundle, and from what a broker has lost since, which makes it look lighter."""

    share: float
    picked: dict[str, float] = field(default_factory=dict)

    @classmethod
    def for_drain(
        cls,
        loads: Mapping[str, BrokerLoadData],
        me: str,
        bundles: int,
        headed: Mapping[str, int] | None = None,
    ) -> BurstPicks:
        """``me`` is draining ``bundles`` bundles: each carries about its report's EMA over their number
        (nothing is added when ``me`` has no report). ``headed`` (:func:`headed_to` of the channel) seeds
        the ledger with every other broker's unreported gains and losses."""
        mine = loads.get(me)
        share = mine.weighted_max_ema / max(bundles, 1) if mine is not None else 0.0
        picked: dict[str, float] = {}
        if headed is not None and (per := per_bundle_load(loads)) > 0:
            for broker, data in loads.items():
                if broker != me and (delta := headed.get(broker, 0) - data.bundles):
                    # A loss takes a broker down to 0 at most, so later picks always raise it: a report
                    # counting bundles the channel does not know cannot make it absorb a whole drain.
                    picked[broker] = max(-data.weighted_max_ema, delta * per)
        return cls(share=share, picked=picked)

    def context(self, ctx: AssignContext) -> AssignContext:
        """``ctx`` with every destination's EMA raised by what this burst has sent it so far (and lowered
        by what the channel says it lost since its report: to 0 at most, :meth:`for_drain` caps that)."""
        if not self.picked:
            return ctx
        loads = dict(ctx.loads)
        for broker, added in self.picked.items():
            if added and (data := loads.get(broker)) is not None:
                ema = data.weighted_max_ema + added
                loads[broker] = msgspec.structs.replace(data, weighted_max_ema=ema)
        return replace(ctx, loads=loads)

    def record(self, broker: str | None) -> None:
        if broker is not None and self.share > 0:
            self.picked[broker] = self.picked.get(broker, 0.0) + self.share

    def select(
        self,
        bundle: str,
        brokers: Mapping[str, BrokerInfo],
        ctx: AssignContext,
        rng: random.Random,
        **kw: Any,
    ) -> Selection:
        """:func:`select_broker` on the loads this burst has raised so far (keywords pass through), and
        the pick recorded for the next one."""
        sel = select_broker(bundle, brokers, self.context(ctx), rng, **kw)
        self.record(sel.broker)
        return sel
