"""Topic lookups (docs/design.md section 3.5): "who owns topic T", answered by any agent.

* Owned (or splitting) by a live broker -> that broker, at once.
* In flight -> wait (bounded by ``channel.in_flight_timeout_s``) for the outcome.
* Unowned (Init/Free) -> choose a broker through the filter chain, publish ``Assigning``, wait for Owned.
* Deleted (the bundle was split) -> re-read the namespace layout and look up the child.
* A namespace that does not exist -> 404, unless ``namespace.auto_create`` lets lookups create it
  (:class:`NamespaceLoader`): nothing is written for a namespace nobody created.

Concurrent lookups of one bundle share one resolution task. A timeout is a retryable error (HTTP 503);
a lookup never answers with an owner the channel does not name.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from trimtab.agent.metrics import AgentMetrics
from trimtab.balance.assign import (
    AssignContext,
    BrokerFilter,
    BrokerInfo,
    PlacementRule,
    Selection,
    select_broker,
)
from trimtab.balance.assign_index import AssignIndex
from trimtab.balance.load import BrokerLoadData
from trimtab.balance.namespaces import AutoCreatePolicy, not_found_message
from trimtab.channel import intents
from trimtab.channel.bundles import BundleLayout, TopicName, parse_bundle
from trimtab.channel.client import ChannelClient
from trimtab.channel.records import Record, State
from trimtab.cluster.events import EventPublisher
from trimtab.config.settings import Settings
from trimtab.errors import (
    BundleError,
    LookupTimeout,
    NamespaceNotFound,
    RequestError,
    TransportError,
    TrimtabError,
)

log = structlog.get_logger("trimtab.lookup")
#: The states in which a bundle has an owner that serves it (a split or merge in progress still serves).
_OWNING = frozenset({State.OWNED, State.SPLITTING, State.MERGING})


class _Moved(TrimtabError):
    """The bundle was split while we waited: the topic now lives in a child bundle."""


@dataclass(frozen=True)
class LookupResult:
    topic: str
    bundle: str
    owner: str
    url: str | None
    state: str
    version: int
    how: str  # owned | assigned | waited


class LayoutCache:
    """Namespace layouts from ZooKeeper, kept for ``ttl_s`` and then refreshed in the background.

    A cached layout is always answered at once (stale-while-revalidate): lookups keep working while
    ZooKeeper is away. Only a namespace never seen before, or an explicit ``force`` after a split, waits
    for ZooKeeper -- at most ``wait_s``, then the lookup fails as retryable (or uses the cache).

    A namespace that does not exist (``load`` raises :class:`NamespaceNotFound`: deleted, or never created
    and not allowed to be) is never answered from the cache: its entry is dropped, so a deleted namespace's
    layout cannot keep lookups assigning its bundles. :meth:`invalidate` (a split, or the ZooKeeper watch
    that reports a deletion) makes the next lookup read ZooKeeper.
    """

    def __init__(
        self,
        load: Callable[[str], BundleLayout],
        ttl_s: float,
        wait_s: float = 5.0,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load = load
        self.ttl_s = ttl_s
        self.wait_s = wait_s
        self._monotonic = monotonic
        self._cache: dict[str, tuple[BundleLayout, float]] = {}
        self._inflight: dict[str, asyncio.Task[BundleLayout]] = {}
        # invalidate() runs on the channel follower's thread: it marks a namespace's layout as outdated
        # (a bundle of it was split) and bumps its generation, so that a read which started before the
        # split cannot put the pre-split layout back.
        self._generation: dict[str, int] = {}
        self._invalid: set[str] = set()
        self._lock = threading.Lock()

    def _refresh(self, namespace: str) -> asyncio.Task[BundleLayout]:
        task = self._inflight.get(namespace)
        if task is None:
            started = self._generation.get(namespace, 0)
            task = asyncio.create_task(asyncio.to_thread(self._load, namespace))
            self._inflight[namespace] = task

            def done(t: asyncio.Task[BundleLayout]) -> None:
                if self._inflight.get(namespace) is t:
                    self._inflight.pop(namespace, None)
                if t.cancelled():
                    return
                err = t.exception()
                if err is None:
                    with self._lock:
                        if self._generation.get(namespace, 0) == started:
                            self._cache[namespace] = (t.result(), self._monotonic())
                            self._invalid.discard(namespace)
                elif isinstance(err, NamespaceNotFound):
                    with self._lock:  # gone: never answer its old layout again
                        self._cache.pop(namespace, None)
                        self._invalid.discard(namespace)

            task.add_done_callback(done)
        return task

    def invalidate(self, namespace: str) -> None:
        """The cached layout of ``namespace`` is outdated (a bundle of it was split, or its znode was deleted):
        the next lookup reads ZooKeeper. Thread-safe; called on the channel follower's thread, in log order,
        before the split parent's Deleted record (or tombstone) is visible to any lookup, and on kazoo's
        thread by the deletion watch."""
        with self._lock:
            self._generation[namespace] = self._generation.get(namespace, 0) + 1
            self._invalid.add(namespace)
            self._inflight.pop(namespace, None)  # a read in progress may predate the split

    def on_channel_change(self, bundle: str, old: Record | None, new: Record | None) -> None:
        """A channel listener, on the follower thread: when a split parent turns Deleted (or its Deleted
        entry is tombstoned), cached layouts of its namespace are stale from here on -- its owner updated
        ZooKeeper before publishing Deleted, and no lookup can see the record before this runs."""
        if (new is not None and new.state is State.DELETED) or (
            new is None and old is not None and old.state is State.DELETED
        ):
            self.invalidate(bundle.rsplit("/", 1)[0])

    def holds(self, bundle: str) -> bool:
        """Whether the current (not outdated) cached layout has ``bundle`` as one of its bundles."""
        try:
            namespace, rng = parse_bundle(bundle)
        except BundleError:
            return False
        hit = self._cache.get(namespace)
        if hit is None or namespace in self._invalid:
            return False
        b = hit[0].boundaries
        i = bisect.bisect_left(b, rng.lower)
        return i + 1 < len(b) and b[i] == rng.lower and b[i + 1] == rng.upper

    async def get(self, namespace: str, *, force: bool = False) -> BundleLayout:
        hit = self._cache.get(namespace)
        if hit is not None and not force and namespace not in self._invalid:
            if self._monotonic() - hit[1] >= self.ttl_s:
                self._refresh(namespace)  # answer from the cache now, refresh behind it
            return hit[0]
        task = self._refresh(namespace)
        try:
            async with asyncio.timeout(self.wait_s):
                return await asyncio.shield(task)
        except NamespaceNotFound:
            raise  # it does not exist: a cached layout of it is history, not a fallback
        except Exception:
            if hit is not None:
                return hit[0]  # ZooKeeper trouble: the last known layout keeps lookups working
            raise

    def cached(self) -> dict[str, BundleLayout]:
        """The last layout read of every namespace (possibly outdated)."""
        return {ns: v[0] for ns, v in self._cache.items()}


class NamespaceLoader:
    """How a lookup gets a namespace's layout (:class:`LayoutCache`'s ``load``, on a worker thread): read
    from ZooKeeper; a namespace that does not exist is created only where ``namespace.auto_create`` allows
    it (balance/namespaces.py; nothing by default, as in Pulsar), else the lookup answers 404 saying how an
    operator creates it -- and nothing is written to ZooKeeper or the channel."""

    def __init__(self, load: Callable[..., BundleLayout], policy: AutoCreatePolicy) -> None:
        """``load(namespace, create=...)``: :meth:`trimtab.cluster.zk.NamespaceStore.load`."""
        self._load = load
        self.policy = policy

    def __call__(self, namespace: str) -> BundleLayout:
        try:
            return self._load(namespace, create=self.policy.allows(namespace))
        except NamespaceNotFound:
            raise NamespaceNotFound(namespace, not_found_message(namespace)) from None


class IndexedAssignment:
    """An assignment that load alone decides, through the incremental index (balance/assign_index.py):
    the bundle's placement allows every live broker (``open_to_all``: no isolation policy, no anti-affinity
    group for its namespace, no warm standby) and the filters are the defaults. Then the index answers
    what :func:`select_broker` would -- the same broker from the same random state -- in what changed since
    the last decision instead of three passes over every broker (docs/scaling.md). ``None`` otherwise, and
    the filter chain decides. Feed it the load view's changes with :meth:`changed`."""

    def __init__(
        self,
        s: Settings,
        loads: Mapping[str, BrokerLoadData],
        brokers: Callable[[], Mapping[str, BrokerInfo]],
        *,
        open_to_all: Callable[[str], bool],
        clock: Callable[[], float],
    ) -> None:
        """``loads``: the live reports by broker (the load view's own mapping, which its thread updates)."""
        self.settings = s
        self.loads = loads
        self.index = AssignIndex(loads)
        self._brokers = brokers
        self._open_to_all = open_to_all
        self.clock = clock

    def changed(self, broker: str, _value: object) -> None:
        """A load view listener (any thread)."""
        self.index.load_changed(broker)

    def select(
        self, bundle: str, exclude: frozenset[str], rng: random.Random, diff: float
    ) -> Selection | None:
        if not self._open_to_all(bundle):
            return None
        a = self.settings.assignment
        return self.index.select(
            self._brokers(),
            rng,
            now_ms=int(self.clock() * 1000),
            load_ttl_s=self.settings.load.ttl_s,
            max_topics=a.broker_max_topics,
            prefer_later_versions=a.prefer_later_versions,
            exclude=exclude,
            diff=diff,
        )


class LookupService:
    """Answers lookups from the replicated table; assigns unowned bundles through the filter chain."""

    def __init__(
        self,
        me: str,
        channel: ChannelClient,
        layouts: LayoutCache,
        *,
        brokers: Callable[[], Mapping[str, BrokerInfo]],
        brokers_trusted: Callable[[], bool],
        filters: Sequence[BrokerFilter],
        placement: PlacementRule,
        timeout_s: float,
        assign_context: Callable[[frozenset[str]], AssignContext],
        diff: float,
        rng: random.Random,
        events: EventPublisher,
        metrics: AgentMetrics,
        draining: Callable[[], bool],
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        indexed: IndexedAssignment | None = None,
    ) -> None:
        """``brokers_trusted``: whether ``brokers`` is current (ZooKeeper connected and the registry
        synced); while it is not, an owner missing from it is not taken for dead. ``draining``: while true,
        this broker never assigns a bundle to itself. ``indexed``: decides an assignment that load alone
        decides (the same pick, see :class:`IndexedAssignment`); the filter chain decides the rest."""
        self.me = me
        self.channel = channel
        self.layouts = layouts
        self._brokers = brokers
        self._brokers_trusted = brokers_trusted
        self.filters = filters
        self.placement = placement
        self.timeout_s = timeout_s
        self._assign_context = assign_context
        self.diff = diff
        self.rng = rng
        self.events = events
        self.metrics = metrics
        self._draining = draining
        self.clock = clock
        self._monotonic = monotonic
        self.indexed = indexed
        self._tasks: dict[str, asyncio.Task[LookupResult]] = {}
        self._events: dict[str, asyncio.Event] = {}

    # ------------------------------------------------------------------ events (loop thread)
    def on_change(self, bundle: str) -> None:
        ev = self._events.pop(bundle, None)
        if ev is not None:
            ev.set()

    def wake_all(self) -> None:
        """Broker membership changed (or the table was rebuilt): every waiter re-checks."""
        events, self._events = self._events, {}
        for ev in events.values():
            ev.set()

    def waiting(self) -> frozenset[str]:
        """Bundles whose resolution is waiting for the channel to change them (in flight, or owned by a
        broker that is gone)."""
        return frozenset(self._events)

    async def _changed(self, bundle: str, timeout: float) -> None:
        ev = self._events.get(bundle)
        if ev is None:
            ev = self._events[bundle] = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await ev.wait()

    # ------------------------------------------------------------------ lookups
    async def lookup(self, topic: str) -> LookupResult:
        try:
            t = TopicName.parse(topic)
        except BundleError as e:
            raise RequestError(400, str(e), retryable=False) from None
        deadline = self._monotonic() + self.timeout_s
        force = False
        while True:
            try:
                layout = await self.layouts.get(t.namespace, force=force)
            except NamespaceNotFound:
                raise  # 404: not created, and this lookup may not create it
            except Exception as e:
                raise RequestError(
                    503, f"namespace layout of {t.namespace} unavailable: {e}", retryable=True
                ) from None
            bundle = layout.bundle_for_topic(t)
            task = self._tasks.get(bundle)
            if task is None:
                # Owned now (the common case): answered here, as _resolve's first look would answer it,
                # without a task, a shield and a turn of the loop per lookup.
                cur = self.channel.table.get(bundle)
                if cur is not None and (owner := self._serving_owner(cur)) is not None:
                    return LookupResult(
                        topic, bundle, owner, self._url(owner), cur.state.value, cur.version, "owned"
                    )
                task = asyncio.create_task(self._resolve(bundle, deadline))
                self._tasks[bundle] = task
                task.add_done_callback(functools.partial(self._resolved, bundle))
            try:
                res = await asyncio.shield(task)
            except _Moved:
                if self._monotonic() >= deadline:
                    raise RequestError(503, f"{bundle} was split; retry the lookup", retryable=True) from None
                force = True
                continue
            return LookupResult(topic, res.bundle, res.owner, res.url, res.state, res.version, res.how)

    def _resolved(self, bundle: str, task: asyncio.Task[LookupResult]) -> None:
        if self._tasks.get(bundle) is task:
            del self._tasks[bundle]

    def _url(self, broker: str) -> str | None:
        info = self._brokers().get(broker)
        return info.service_url if info is not None else None

    async def _resolve(self, bundle: str, deadline: float) -> LookupResult:
        published_for: int | None = None
        waited = False
        while True:
            cur: Record | None = self.channel.table.get(bundle)
            if cur is not None and cur.state in _OWNING:
                owner = self._serving_owner(cur)
                if owner is not None:
                    how = "assigned" if published_for is not None else ("waited" if waited else "owned")
                    return LookupResult(
                        "", bundle, owner, self._url(owner), cur.state.value, cur.version, how
                    )
                # The owner is gone (its registration vanished): the leader reassigns; wait for that.
            elif cur is None or cur.state is State.FREE:
                version = 1 if cur is None else cur.version + 1
                if published_for != version and not self.layouts.holds(bundle):
                    # The layout this lookup used is gone: the namespace was split since (a split parent the
                    # leader tombstoned after the delay reads as Init). Assigning it would give its topics
                    # a second owner.
                    raise _Moved(bundle)
                if published_for != version:
                    self._assign(bundle, cur)
                    published_for = version
            elif cur.state is State.DELETED:
                raise _Moved(bundle)
            remaining = deadline - self._monotonic()
            if remaining <= 0:
                state = cur.state.value if cur is not None else "init"
                raise LookupTimeout(
                    f"{bundle} did not settle within {self.timeout_s:g}s (state {state}); retry the lookup"
                )
            waited = True
            await self._changed(bundle, remaining)

    def _serving_owner(self, cur: Record) -> str | None:
        """The owner a lookup answers with for ``cur``: an owning record's owner while it is registered
        (or while the registrations cannot be trusted); None otherwise -- not owned, or its owner gone
        (the leader reassigns it: a lookup waits for that)."""
        if cur.state not in _OWNING:
            return None
        owner = cur.owner()
        assert owner is not None
        return owner if owner in self._brokers() or not self._brokers_trusted() else None

    def _assignment_delivered(self, bundle: str, dst: str, err: TransportError | None) -> None:
        """The producer's report on an Assigning record (its thread). A lost one leaves the lookup waiting
        until its timeout, and the next lookup of the bundle tries again: say why meanwhile."""
        if err is not None:
            self.metrics.assignments.labels("failed").inc()
            log.warning("assignment_publish_failed", bundle=bundle, dst=dst, error=str(err))

    def _assign(self, bundle: str, cur: Record | None) -> None:
        exclude = frozenset({self.me}) if self._draining() else frozenset()
        sel = None if self.indexed is None else self.indexed.select(bundle, exclude, self.rng, self.diff)
        if sel is not None:
            loads = self.indexed.loads if self.indexed is not None else {}
        else:
            ctx = self._assign_context(exclude)
            loads = ctx.loads
            sel = select_broker(
                bundle,
                self._brokers(),
                ctx,
                self.rng,
                filters=self.filters,
                diff=self.diff,
                placement=self.placement,
            )
        if sel.broker is None:
            raise RequestError(503, f"no broker available for {bundle} ({sel.reason})", retryable=True)
        rec = intents.assign(cur, sel.broker, writer=self.me, now_ms=int(self.clock() * 1000))
        self.channel.send(bundle, rec, functools.partial(self._assignment_delivered, bundle, sel.broker))
        self.metrics.assignments.labels("published").inc()
        load = loads.get(sel.broker)
        self.events.publish(
            "assign",
            bundle=bundle,
            dst=sel.broker,
            candidates=sel.candidates,
            dst_load=round(load.weighted_max_ema, 4) if load else None,
        )
        log.debug(
            "assigning",
            bundle=bundle,
            dst=sel.broker,
            version=rec.version,
            candidates=sel.candidates,
            skipped=sel.skipped_filters,
        )
