"""Broker leases: how long the broker may serve a bundle without hearing from this agent again.

Why: the channel records one owner, but a broker is a separate process that keeps serving while its agent
is paused, partitioned or dead. The leader gives a failed agent's bundles to other brokers once the agent's
ZooKeeper session expired. So every lease this agent grants must end before that can happen:

    lease end  <=  (last time the ZooKeeper server heard this session) + session timeout - margin

The agent learns "the server heard us at or after t0" from a ``sync`` round trip begun at t0
(:meth:`cluster.zk.ZkSession.confirm`). The lease a broker holds ends ``lease_s`` after it *received* the
request, and a request carries ``apply_by_ms`` = sent + margin/2, after which the broker refuses it; the
margin covers that delivery time and the drift of clock rates. Hence the start-up rule
``session_timeout >= lease_s + lease_margin_s`` (:class:`config.settings.Settings`), checked again against
the timeout the ZooKeeper server actually granted.

Which bundles the agent vouches for is a pure function of the bundle's channel record
(:func:`lease_bound`): owned by this broker, or in flight towards or out of it but younger than the
leader's in-flight timeout (the leader's monitor forces a stuck in-flight record onward after that). The
renewer stops renewing anything else, so a broker whose close or fence keeps failing stops serving on its
own at the lease's end.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import structlog

from trimtab.agent.adapters.base import BrokerAdapter, Lease
from trimtab.agent.metrics import AgentMetrics
from trimtab.channel.inflight import InFlightClock, wall_age_s
from trimtab.channel.records import Record, State
from trimtab.cluster.runner import Schedule
from trimtab.errors import AdapterError, LeaseUnavailable, StartupError, ZkUnavailable

log = structlog.get_logger("trimtab.agent")

#: A lease shorter than this is not worth granting (the broker would stop serving before it could be renewed).
MIN_LEASE_S = 0.2


def lease_bound(
    me: str,
    rec: Record | None,
    *,
    now_ms: int,
    in_flight_timeout_s: float,
    margin_s: float,
    stale: bool,
    seen_age_s: float = 0.0,
) -> float | None:
    """Seconds from now a lease on this bundle may last given its channel record: ``inf`` when this broker
    owns it, the time left before the leader's monitor may force an in-flight record onward (minus the
    margin) when it is on its way to or out of this broker, None when this agent must not vouch for it
    (somebody else's, released, or owned under a lost session -- ``stale``).

    The in-flight record's age is the greater of its age by the writer's clock (``ts`` against
    ``now_ms``) and ``seen_age_s``, how long ago this agent saw it by its monotonic clock
    (:class:`~trimtab.channel.inflight.InFlightClock`): a writer whose clock runs ahead makes its records
    look young, and must not lengthen a lease past what the monitor waits."""
    if rec is None or stale:
        return None
    s = rec.state
    if s is State.OWNED:
        return math.inf if rec.dst == me else None
    if (s is State.ASSIGNING and rec.dst == me) or (s in (State.SPLITTING, State.MERGING) and rec.src == me):
        return in_flight_timeout_s - margin_s - max(wall_age_s(rec, now_ms), seen_age_s)
    return None


class LeaseSession(Protocol):
    """What :class:`LeaseGuard` asks of the agent's ZooKeeper session: a :class:`~trimtab.cluster.zk.ZkSession`
    in the daemon; the simulator's agents have sessions in memory (``trimtab.sim``), whose confirmations
    fail while the scenario's ZooKeeper is down -- so that the rule "no lease without a confirmed session"
    comes from this guard there too."""

    requested_timeout_s: float

    @property
    def connected(self) -> bool: ...

    def granted_timeout_s(self, wait_s: float = 5.0) -> float: ...

    def confirm(self, timeout_s: float, path: str = "/") -> None: ...


class LeaseGuard:
    """The longest lease this agent may grant right now, from the last confirmation of its ZooKeeper
    session.

    A heartbeat thread (:meth:`start_heartbeat`) confirms the session every quarter of a lease, so renewals
    and acquisitions find a fresh confirmation instead of waiting for a round trip. Why a thread: during a
    failover the agent's event loop is busy with thousands of bundles, and on a crowded machine a round trip
    scheduled on the loop came back seconds late -- longer than a short lease (measured: survivors of the
    failover benchmark lost hundreds of leases that way). A plain thread only needs the GIL, which Python
    hands over every few milliseconds. On-demand confirmations (:meth:`confirm`) remain for when the
    heartbeat has fallen behind; they are single-flight: a failover acquiring thousands of bundles shares
    one."""

    def __init__(
        self,
        zk: LeaseSession,
        *,
        lease_s: float,
        margin_s: float,
        metrics: AgentMetrics,
        mono: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        in_flight: InFlightClock | None = None,
    ) -> None:
        """``in_flight``: when this agent saw each in-flight record (a listener of its channel table), on
        ``mono`` unless given."""
        self.zk = zk
        self.in_flight = in_flight if in_flight is not None else InFlightClock(mono)
        self.lease_s = lease_s
        self.margin_s = margin_s
        self.metrics = metrics
        self.mono = mono
        self.wall = wall
        self.confirmed_at: float | None = None  # mono time at which the last good confirmation began
        self.heartbeat_s = lease_s / 4
        self._confirming: asyncio.Future[None] | None = None
        self._confirming_epoch = 0
        self._lock = threading.Lock()
        self._epoch = 0  # bumped by forget(): a confirmation begun before a session loss does not count
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def session_timeout_s(self) -> float:
        return self.zk.granted_timeout_s(wait_s=0)

    def lease(self, seconds: float) -> Lease:
        """A lease of ``seconds`` that the broker must refuse once half the margin has passed."""
        return Lease(seconds, int((self.wall() + self.margin_s / 2) * 1000))

    def check_session_timeout(self) -> None:
        """After connecting: the server may have granted a shorter session than requested (it clamps to its
        minSessionTimeout/maxSessionTimeout); leases must still fit inside it."""
        st = self.zk.granted_timeout_s()
        if self.lease_s + self.margin_s > st:
            raise StartupError(
                f"ZooKeeper granted a {st:g}s session timeout (asked for {self.zk.requested_timeout_s:g}s): "
                f"broker leases of {self.lease_s:g}s + {self.margin_s:g}s margin do not fit inside it. Raise the "
                "server's maxSessionTimeout, or shorten broker.adapter.lease_s."
            )

    def limit(
        self, me: str, bundle: str, rec: Record | None, *, in_flight_timeout_s: float, stale: bool
    ) -> float | None:
        """:func:`lease_bound` for ``bundle`` now, by this guard's clocks: its wall clock against the
        writer's, and how long ago this agent saw an in-flight record."""
        seen = self.in_flight.age_s(bundle, rec) if rec is not None and rec.state.in_flight else 0.0
        return lease_bound(
            me,
            rec,
            now_ms=int(self.wall() * 1000),
            in_flight_timeout_s=in_flight_timeout_s,
            margin_s=self.margin_s,
            stale=stale,
            seen_age_s=seen,
        )

    def bound(self) -> float:
        """Seconds a lease granted now may run (<= 0: none)."""
        if self.confirmed_at is None:
            return 0.0
        return self.confirmed_at + self.session_timeout_s() - self.margin_s - self.mono()

    def forget(self) -> None:
        """The session was lost: nothing it confirmed counts any more."""
        with self._lock:
            self._epoch += 1
            self.confirmed_at = None

    def start_heartbeat(self) -> None:
        """Confirm the session every ``heartbeat_s`` on a thread of its own, until :meth:`stop_heartbeat`."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
            self._thread.start()

    def stop_heartbeat(self) -> None:
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join(timeout=self.margin_s)

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            if not self.zk.connected:
                continue  # suspended or lost: nothing to confirm; leases run down on their own
            try:
                self.confirm_blocking()
            except ZkUnavailable:
                pass  # counted; the renewer logs when it has to skip a round
            except Exception:  # never let the heartbeat die: leases would silently shorten
                log.exception("lease_heartbeat_crashed")

    def confirm_blocking(self, epoch: int | None = None) -> None:
        """One ZooKeeper round trip on the current session, on the calling thread. It counts only if no
        session was lost since ``epoch`` (default: now) -- when it was asked for, not when a busy thread
        pool got round to it."""
        with self._lock:
            if epoch is None:
                epoch = self._epoch
        t0 = self.mono()
        try:
            self.zk.confirm(self.margin_s / 2)
        except ZkUnavailable:
            self.metrics.lease_confirmations.labels("failed").inc()
            raise
        with self._lock:
            if epoch == self._epoch and (self.confirmed_at is None or t0 > self.confirmed_at):
                self.confirmed_at = t0
        self.metrics.lease_confirmations.labels("ok").inc()

    async def confirm(self) -> None:
        """One ZooKeeper round trip on the current session (shared by concurrent callers of one session).

        The session epoch is taken here, when the round trip is asked for: on a busy machine the thread
        pool may run it only after the session was lost and a new one connected, and confirming the new
        session says nothing about what the callers planned under the old one."""
        with self._lock:
            epoch = self._epoch
        if self._confirming is None or self._confirming_epoch != epoch:
            self._confirming = asyncio.ensure_future(self._confirm(epoch))
            self._confirming_epoch = epoch
        fut = self._confirming
        try:
            await asyncio.shield(fut)
        finally:
            if self._confirming is fut and fut.done():
                self._confirming = None

    async def _confirm(self, epoch: int) -> None:
        await asyncio.to_thread(self.confirm_blocking, epoch)

    def grant(self, limit_s: float = math.inf) -> Lease:
        """A lease as long as allowed now, capped by ``limit_s``; :class:`LeaseUnavailable` if too short."""
        seconds = min(self.lease_s, self.bound(), limit_s)
        if seconds < MIN_LEASE_S:
            raise LeaseUnavailable(
                f"cannot grant a broker lease ({seconds:.2f}s allowed): the ZooKeeper session was not "
                "confirmed recently enough, or the bundle's in-flight record is about to time out"
            )
        return self.lease(round(seconds, 3))

    async def ensure_fresh(self) -> None:
        """Confirm the session now unless a recent confirmation (normally the heartbeat's) still allows at
        least half the configured lease; :class:`ZkUnavailable` if that fails."""
        if self.bound() < self.lease_s / 2:
            await self.confirm()

    async def lease_for_acquire(self, limit: Callable[[], float | None] = lambda: math.inf) -> Lease | None:
        """A lease for an acquire: at least half the configured one (renewals extend it within a third);
        None when ``limit`` -- the bundle's :meth:`limit`, read *after* the session was confirmed -- says
        this agent no longer vouches for the bundle.

        Why read the limit after the confirmation: a confirmation can wait for seconds on a loaded machine,
        or across a whole lost session. Found by the long chaos run: an acquire planned under the agent's
        old session waited for a confirmation while the agent was cut off from ZooKeeper; the leader gave
        the bundle to another broker; the confirmation came back on the *new* session and the lease was
        granted from the old record -- two brokers served the bundle for a second, until the next plan
        closed it."""
        try:
            await self.ensure_fresh()
        except ZkUnavailable as e:
            raise LeaseUnavailable(f"no lease without a confirmed ZooKeeper session: {e}") from e
        limit_s = limit()
        if limit_s is None:
            return None
        return self.grant(limit_s)


class LeaseRenewer:
    """Every third of a lease: extend the lease of every bundle the broker serves and this agent still
    vouches for, as far as the last confirmation of the session allows (the heartbeat keeps it fresh; the
    renewer confirms itself only when the heartbeat has fallen behind). Bundles the broker says it no longer serves (their lease ran out while
    renewals failed, or the broker restarted) go back to the reconciler, which acquires them again if they
    are still this broker's."""

    def __init__(
        self,
        me: str,
        guard: LeaseGuard,
        adapter: BrokerAdapter,
        *,
        served: Callable[[], Iterable[str]],
        record: Callable[[str], Record | None],
        is_stale: Callable[[str], bool],
        lost: Callable[[list[str]], None],
        metrics: AgentMetrics,
        in_flight_timeout_s: float,
    ) -> None:
        self.me = me
        self.guard = guard
        self.adapter = adapter
        self.served = served
        self.record = record
        self.is_stale = is_stale
        self.lost = lost
        self.metrics = metrics
        self.in_flight_timeout_s = in_flight_timeout_s
        self.interval_s = guard.lease_s / 3
        self.rounds = 0

    def groups(self) -> Mapping[float, list[str]]:
        """Bundles to renew, grouped by the lease each may get (most get the full one)."""
        full = min(self.guard.lease_s, self.guard.bound())
        out: dict[float, list[str]] = defaultdict(list)
        for bundle in self.served():
            limit = self.guard.limit(
                self.me,
                bundle,
                self.record(bundle),
                in_flight_timeout_s=self.in_flight_timeout_s,
                stale=self.is_stale(bundle),
            )
            if limit is None:
                continue
            seconds = round(min(full, limit), 1)
            if seconds >= MIN_LEASE_S:
                out[seconds].append(bundle)
        return out

    async def run_once(self) -> str:
        """One round; returns its result label (also counted in a metric)."""
        self.rounds += 1
        try:
            await self.guard.ensure_fresh()
        except ZkUnavailable as e:
            log.warning("lease_renewal_skipped", reason="zookeeper", error=str(e))
            return self._count("zk_unconfirmed")
        result = "ok"
        for seconds, bundles in self.groups().items():
            # Each group's renewal waits for the one before: what the session still allows is read again
            # now, or a slow broker would let a later group's lease outlast the confirmation it relies on.
            seconds = min(seconds, round(self.guard.bound(), 1))
            if seconds < MIN_LEASE_S:
                result = "zk_unconfirmed"
                break
            lease = self.guard.lease(seconds)
            try:
                gone = await self.adapter.renew(bundles, lease)
            except AdapterError as e:
                log.warning("lease_renewal_failed", bundles=len(bundles), error=str(e))
                result = "failed"
                continue
            if gone:
                self.metrics.leases_lost.inc(len(gone))
                log.warning("leases_lost", bundles=len(gone), sample=gone[:5])
                self.lost(gone)
        self.metrics.lease_remaining.set(max(0.0, self.guard.bound()))
        return self._count(result)

    def _count(self, result: str) -> str:
        self.metrics.lease_renewals.labels(result).inc()
        return result

    def schedule(self) -> Schedule:
        """Every third of a lease, from start until shutdown -- a drain too keeps serving (and renewing)
        until its bundles moved."""
        return Schedule(self.interval_s)
