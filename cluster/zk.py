"""ZooKeeper state (docs/design.md section 2): sessions, the broker registry and namespace layouts.

Layout under ``<root>/<cluster>``::

    brokers/<id>                     ephemeral, BrokerInfo JSON       liveness = this znode
    leader                           ephemeral, the elected controller (term, id, session)
    leader_term                      persistent counter, bumped by every new leader
    admin/namespaces/<tenant>/<ns>   NamespacePolicies JSON (bundle boundaries, policies)
    admin/failed_brokers/<id>        first-failure time of a vanished broker (survives failover)
    admin/reassignments/<task>       persisted healing chunks
    admin/...                        failure domains, isolation policies, dynamic config

Watches never run logic on kazoo's threads: they set events or enqueue work for a worker thread
(Patroni's rule), and blocking kazoo calls from asyncio code go through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, Protocol, TypeVar, cast

import msgspec
import structlog
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import EventType, WatchedEvent
from kazoo.retry import ForceRetryError, KazooRetry, RetryFailedError
from kazoo.security import ACL, make_acl, make_digest_acl

from trimtab.balance.assign import BrokerInfo
from trimtab.channel.bundles import BundleLayout, BundleRange, equal_boundaries, validate_namespace
from trimtab.channel.values import Refused, StrictDecoder
from trimtab.errors import (
    BundleError,
    NamespaceNotFound,
    NamespaceUnreadable,
    ZkAccessDenied,
    ZkConflict,
    ZkUnavailable,
    ZooKeeperError,
)

log = structlog.get_logger("trimtab.zk")

P = ParamSpec("P")
T = TypeVar("T")


#: ZooKeeper's default jute.maxbuffer: no znode trimtab reads can be longer.
ZNODE_MAX_BYTES = 1 << 20


def access_denied(path: str, authenticated: bool) -> ZkAccessDenied:
    """The error for a ``NoAuthError`` on ``path``: kazoo's own has no message at all, and the operator
    needs to know which znode and which setting."""
    who = (
        "the digest credentials of zookeeper.auth_digest (or auth_digest_file)"
        if authenticated
        else "an unauthenticated client (neither zookeeper.auth_digest nor auth_digest_file is set)"
    )
    return ZkAccessDenied(
        f"ZooKeeper refused {who} on {path}: its ACL grants another identity. Use the credentials the "
        "cluster's znodes were created with (docs/security.md), or remove the znodes of a cluster that is gone"
    )


# ------------------------------------------------------------------ the one boundary with kazoo
#: How every ZooKeeper command is retried (kazoo's own helper): a connection loss, an operation timeout or
#: an expired session (the client reconnects with a new one) is tried again after 0.1 s, then 0.2 s, then
#: given up on -- a few hundred ms, short enough for an HTTP request waiting on it. The sessions' clients
#: are built with it too. :func:`zk_call` runs a copy per call: an instance counts its attempts, so it
#: cannot be shared between threads.
COMMAND_RETRY = KazooRetry(max_tries=3, delay=0.1, max_delay=1.0)

#: kazoo's answers rather than failures: the caller of :func:`zk_call` acts on them (absent, taken, moved
#: on, not empty), so they pass unchanged.
ANSWERS: tuple[type[KazooException], ...] = (NoNodeError, NodeExistsError, BadVersionError, NotEmptyError)


def zk_failure(e: BaseException, op: str, path: str, *, authenticated: bool) -> ZooKeeperError:
    """kazoo's failure ``e`` of ``op`` on ``path`` as trimtab's error: refused credentials are
    :class:`ZkAccessDenied`, naming the znode and the setting (kazoo's ``NoAuthError`` has no message at
    all); anything else -- no connection, no answer, a session gone, a server error -- is
    :class:`ZkUnavailable`: the same request may succeed later."""
    if isinstance(e, NoAuthError):
        return access_denied(path or f"the znodes of {op}", authenticated)
    cause = e.__context__ if isinstance(e, RetryFailedError) and e.__context__ is not None else e
    tried = f" in {COMMAND_RETRY.max_tries} tries" if isinstance(e, RetryFailedError) else ""
    detail = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
    return ZkUnavailable(f"ZooKeeper did not answer {op} {path}".rstrip() + f"{tried} ({detail})")


def zk_call(client: KazooClient, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` -- one of ``client``'s operations on the znode ``args[0]``, or a short
    idempotent function of a few -- run the one way trimtab's ZooKeeper code runs kazoo: retried through
    :data:`COMMAND_RETRY`; kazoo's answers (:data:`ANSWERS`) passed to the caller; every other kazoo failure
    raised as trimtab's (:func:`zk_failure`). Blocking: callers on an event loop use a thread."""
    path = args[0] if args and isinstance(args[0], str) else ""  # (a function of a few names none)
    try:
        return cast(T, COMMAND_RETRY.copy()(fn, *args, **kwargs))
    except ANSWERS:
        raise
    except (KazooException, KazooTimeoutError) as e:
        op = getattr(fn, "__name__", "a call")
        raise zk_failure(e, op, path, authenticated=bool(client.auth_data)) from e


def versioned_write(client: KazooClient, path: str, data: bytes, version: int) -> None:
    """Write ``data`` to ``path`` if it is still at ``version`` (-1: if it does not exist yet), through
    :func:`zk_call`. When another writer got there first -- a newer version, the znode created or deleted
    meanwhile -- raise kazoo's ``ForceRetryError``: the :func:`compare_and_set` attempt it is part of reads
    again and decides again."""
    try:
        if version < 0:
            zk_call(client, client.create, path, data, makepath=True)
        else:
            zk_call(client, client.set, path, data, version=version)
    except (BadVersionError, NodeExistsError, NoNodeError):
        raise ForceRetryError(f"{path} changed meanwhile") from None


def compare_and_set(attempt: Callable[[], T], *, what: str, tries: int) -> T:
    """Run ``attempt`` -- read, decide, one :func:`versioned_write` -- until its write is not beaten by
    another writer. It stays a loop around a single versioned write that re-reads on every try (a change
    decided on what was read must be decided again on what is there now), run by kazoo's ``KazooRetry``
    retrying only ``ForceRetryError``, with a short jittered backoff so that writers racing for one znode
    spread out. :class:`ZkConflict` naming ``what`` after ``tries`` lost races: nothing was written, and
    the same request may succeed later."""
    retry = KazooRetry(max_tries=tries, delay=0.005, backoff=2, max_delay=0.1)
    retry.retry_exceptions = (ForceRetryError,)
    try:
        return cast(T, retry(attempt))
    except RetryFailedError:
        raise ZkConflict(f"{what} kept changing ({tries} writes lost to other writers); try again") from None


class ZkPaths:
    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")
        self.brokers = f"{self.base}/brokers"
        self.leader = f"{self.base}/leader"
        self.leader_term = f"{self.base}/leader_term"
        self.admin = f"{self.base}/admin"
        self.namespaces = f"{self.admin}/namespaces"
        self.failed_brokers = f"{self.admin}/failed_brokers"
        self.reassignments = f"{self.admin}/reassignments"
        self.failure_domains = f"{self.admin}/failure_domains"
        self.isolation = f"{self.admin}/isolation"
        self.anti_affinity = f"{self.admin}/anti_affinity"
        self.dynamic_config = f"{self.admin}/config"
        self.controller_state = f"{self.admin}/controller"

    def broker(self, broker_id: str) -> str:
        return f"{self.brokers}/{broker_id}"

    def namespace(self, namespace: str) -> str:
        validate_namespace(namespace)
        return f"{self.namespaces}/{namespace}"


class ZkSession:
    """A kazoo client plus the connection history safe mode needs.

    ``state`` is "connected", "suspended" (connection lost, session may survive) or "lost" (session
    expired: every ephemeral node of ours is gone). ``stable_for()`` is how long the session has been
    continuously connected since the last trouble.
    """

    def __init__(
        self,
        hosts: str,
        *,
        session_timeout_s: float,
        connect_timeout_s: float = 15.0,
        auth_digest: str | None = None,
    ) -> None:
        """``auth_digest`` (``user:password``): authenticate with the digest scheme, and create every znode
        with :func:`digest_acls` -- only that identity may change trimtab's state (docs/security.md)."""
        self.hosts = hosts
        self.connect_timeout_s = connect_timeout_s
        self.authenticated = auth_digest is not None
        self.client = KazooClient(
            hosts=hosts,
            timeout=session_timeout_s,
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, max_delay=2.0),
            command_retry=COMMAND_RETRY.copy(),
            default_acl=digest_acls(auth_digest) if auth_digest is not None else None,
            auth_data=[("digest", auth_digest)] if auth_digest is not None else None,
        )
        self.state = "new"
        self.trouble_at: float | None = None  # last SUSPENDED/LOST; None = never had trouble
        self.connected_at = 0.0
        self.sessions = 0  # how many distinct sessions we have had (a new one after each LOST)
        self._listeners: list[Callable[[str], object]] = []
        self.client.add_listener(self._on_state)
        self.requested_timeout_s = session_timeout_s
        # The server clamps the requested timeout into [minSessionTimeout, maxSessionTimeout]; broker
        # leases must fit the timeout it granted, which kazoo only logs. Read it where kazoo computes it.
        self.negotiated_timeout_s: float | None = None
        self._negotiated = threading.Event()
        conn = self.client._connection
        connect = conn._connect

        def connect_and_record(*args: Any) -> Any:
            read_timeout_ms, connect_timeout_ms = connect(*args)
            self.negotiated_timeout_s = round(read_timeout_ms * 1.5) / 1000.0  # kazoo: read = 2/3 session
            self._negotiated.set()
            return read_timeout_ms, connect_timeout_ms

        conn._connect = connect_and_record

        # One connection attempt may not use up the session. kazoo gives an attempt the session timeout
        # divided by the number of servers listed -- for the TCP connect and again for the server's answer
        # to the connect request -- so with one server listed, a server that accepts the connection and
        # then does not answer (a ZooKeeper still starting, a JVM paused, a half-open link) holds the only
        # attempt for the whole session, and the next attempt is told the session expired: every lease of
        # the broker lost to one slow answer. Capped at a third of the session, a silent server costs an
        # attempt, and the next one (kazoo's connection retry, at most 2 s later) still finds the session.
        self.connect_attempt_s = max(1.0, session_timeout_s / 3.0)
        invoke, create_connection = conn._invoke, self.client.handler.create_connection

        def capped_invoke(timeout: float, request: Any, xid: int | None = None) -> Any:
            return invoke(min(timeout, self.connect_attempt_s), request, xid)

        def capped_create_connection(*args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
            if timeout is not None:
                timeout = min(timeout, self.connect_attempt_s)
            return create_connection(*args, timeout=timeout, **kwargs)

        conn._invoke = capped_invoke
        self.client.handler.create_connection = capped_create_connection

    def add_listener(self, fn: Callable[[str], object]) -> None:
        """``fn(state)`` runs on kazoo's thread and must not block."""
        self._listeners.append(fn)

    def _on_state(self, st: KazooState) -> None:
        now = time.monotonic()
        if st == KazooState.CONNECTED:
            self.state = "connected"
            self.connected_at = now
        elif st == KazooState.SUSPENDED:
            self.state = "suspended"
            self.trouble_at = now
        else:
            self.state = "lost"
            self.trouble_at = now
        log.info("zk_state", state=self.state, hosts=self.hosts)
        for fn in self._listeners:
            try:
                fn(self.state)
            except Exception:
                log.exception("zk_listener_failed")

    def start(self) -> None:
        try:
            self.client.start(timeout=self.connect_timeout_s)
        except KazooTimeoutError as e:
            self.client.stop()
            raise ZkUnavailable(
                f"could not connect to ZooKeeper at {self.hosts} within {self.connect_timeout_s}s "
                "(check zookeeper.hosts and that the server is running)"
            ) from e
        self.state = "connected"
        self.connected_at = time.monotonic()

    def stop(self) -> None:
        try:
            self.client.stop()
            self.client.close()
        except KazooException:
            pass

    @property
    def connected(self) -> bool:
        return self.state == "connected"

    def granted_timeout_s(self, wait_s: float = 5.0) -> float:
        """The session timeout the server granted (kazoo's connection thread records it just after the
        CONNECTED event that ``start`` returns on, hence the short wait); the requested one if unknown."""
        self._negotiated.wait(wait_s)
        return self.negotiated_timeout_s or self.requested_timeout_s

    def confirm(self, timeout_s: float, path: str = "/") -> None:
        """One round trip to the ZooKeeper server on this session (``sync``): when it returns, the server
        heard from the session after this call began, so the session cannot expire before that moment plus
        the session timeout. Raises :class:`ZkUnavailable` otherwise. Broker leases rest on it.

        Not retried (:func:`zk_call`): a confirmation is one round trip within ``timeout_s``, and retrying
        it would prove nothing more. Its failures are mapped as every other (a ``sync`` needs no
        permission, so the mapping's answer is always :class:`ZkUnavailable`)."""
        if not self.connected:
            raise ZkUnavailable(f"ZooKeeper session is {self.state}")
        try:
            self.client.sync_async(path).get(timeout=timeout_s)
        except (KazooException, KazooTimeoutError) as e:
            raise zk_failure(
                e, "sync, confirming the session, on", path, authenticated=self.authenticated
            ) from e

    def stable_for(self) -> float:
        """Seconds connected since the last trouble; infinite if the session never had any (a fresh
        process is stable, as in Pulsar: only a reconnect calls for a settle period)."""
        if self.state != "connected":
            return 0.0
        if self.trouble_at is None:
            return float("inf")
        return time.monotonic() - max(self.connected_at, self.trouble_at)

    @property
    def session_id(self) -> int | None:
        cid = self.client.client_id
        return cid[0] if cid else None


def digest_acls(credentials: str) -> list[ACL]:
    """The ACLs of every znode a trimtab node with digest ``user:password`` creates: every right for that
    identity, read for everyone (tools, dashboards and operators may look, never change)."""
    user, _, password = credentials.partition(":")
    return [make_digest_acl(user, password, all=True), make_acl("world", "anyone", read=True)]


_info_dec = StrictDecoder(BrokerInfo, ZNODE_MAX_BYTES)
_enc = msgspec.json.Encoder()


class LiveBrokers(Protocol):
    """The registered brokers, as the leader's jobs read them: a :class:`BrokerRegistry`'s cache in the
    daemons, the simulated cluster's registrations in the simulator."""

    @property
    def brokers(self) -> Mapping[str, BrokerInfo]: ...


class Registration(LiveBrokers, Protocol):
    """The registered brokers, and this broker's own registration to update (the drain's flag)."""

    def update(self, info: BrokerInfo) -> None: ...


#: The broker registry reads every registration again at least this often (a safety net: the watches carry
#: every change, and a new session reads everything again).
FULL_REFRESH_S = 300.0


class BrokerRegistry:
    """Registers this broker (if any) and keeps a cache of every live broker.

    Registration heals itself: a worker thread re-creates our ephemeral node whenever it is missing
    while we are registered (session expiry, an operator deleting it), as Pulsar's BrokerRegistry does.
    The cache is refreshed on children changes and on data changes of each broker node -- reading only
    what changed: the children list, a new broker's registration, one whose data watch fired. Every agent
    keeps this cache, so re-reading every registration on every change (or on a timer) costs ZooKeeper
    brokers x brokers reads per membership change (a million at 1 000 brokers: docs/scaling.md). Everything
    is read again in a new session (its data watches are gone) and every ``FULL_REFRESH_S`` as a safety net.
    """

    def __init__(self, session: ZkSession, paths: ZkPaths) -> None:
        self.session = session
        self.zk = session.client
        self.paths = paths
        self.brokers: dict[str, BrokerInfo] = {}
        self.synced = threading.Event()
        self._mine: BrokerInfo | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._stale: set[str] = set()  # children whose data watch fired since the last refresh
        self._unreadable: set[str] = set()  # children whose registration was refused (until it changes)
        self._read_in: int | None = None  # the session of the last full read (its data watches are set)
        self._full_at = -math.inf  # time.monotonic() of the last full read
        self._listeners: list[Callable[[dict[str, BrokerInfo]], object]] = []
        self._thread: threading.Thread | None = None
        self.registrations = 0
        # The ZooKeeper session our node was last seen to belong to (None: not registered): an agent sets
        # its channel barrier for that session (agent/session_barrier.py).
        self.registered_session: int | None = None
        # Called on the registry's worker thread right after it registered again in a new session, before
        # it does anything else (the agent sets its channel barrier there: agent/session_barrier.py).
        self.on_reregistered: list[Callable[[int | None], object]] = []

    def add_listener(self, fn: Callable[[dict[str, BrokerInfo]], object]) -> None:
        """``fn(brokers)`` runs on the registry's worker thread after every cache change."""
        self._listeners.append(fn)

    def start(self) -> None:
        zk_call(self.zk, self.zk.ensure_path, self.paths.brokers)
        self.session.add_listener(lambda st: self._wake.set())
        self.zk.ChildrenWatch(self.paths.brokers, self._children_changed)
        self._thread = threading.Thread(target=self._run, name="zk-registry", daemon=True)
        self._thread.start()
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread:
            self._thread.join(5)

    def _children_changed(self, children: list[str]) -> bool:
        self._wake.set()
        return not self._stop.is_set()

    def _data_changed(self, event: Any) -> None:
        path = getattr(event, "path", None) or ""
        with self._lock:
            self._stale.add(path.rsplit("/", 1)[-1])
        self._wake.set()

    # ------------------------------------------------------------------ own registration
    def register(self, info: BrokerInfo, wait_s: float) -> None:
        """Create our ephemeral node. If a node with our id exists from another session (a previous
        incarnation that died within its session timeout), wait up to ``wait_s`` for it to expire;
        if it is still there, another live agent uses this id and we refuse to start.

        The wait is kazoo's ``KazooRetry`` too: an attempt that finds another session's node asks for
        another try (``ForceRetryError``), every 0.25 s until ``wait_s`` is up."""
        path = self.paths.broker(info.id)
        data = _enc.encode(info)

        def attempt() -> None:
            try:
                zk_call(self.zk, self.zk.create, path, data, ephemeral=True, makepath=True)
                return
            except NodeExistsError:
                pass
            stat = zk_call(self.zk, self.zk.exists, path)
            if stat is not None and stat.ephemeralOwner == self.session.session_id:
                zk_call(self.zk, self.zk.set, path, data)  # ours already (a retried create): up to date
                return
            log.info("waiting_for_previous_registration", broker=info.id, path=path)
            raise ForceRetryError(f"{path} belongs to another session")

        wait = KazooRetry(max_tries=-1, delay=0.25, backoff=1, max_jitter=0.0, deadline=wait_s)
        wait.retry_exceptions = (ForceRetryError,)
        try:
            wait(attempt)
        except RetryFailedError:
            raise ZkUnavailable(
                f"broker id {info.id} is registered by another live ZooKeeper session; "
                "is another agent running with the same broker.id?"
            ) from None
        self._mine = info
        self.registrations += 1
        self.registered_session = self.session.session_id
        log.info("broker_registered", broker=info.id, path=path)
        self._wake.set()

    def update(self, info: BrokerInfo) -> None:
        self._mine = info
        try:
            zk_call(self.zk, self.zk.set, self.paths.broker(info.id), _enc.encode(info))
        except NoNodeError:
            self._wake.set()  # the worker re-creates it

    def deregister(self) -> None:
        mine, self._mine = self._mine, None
        self.registered_session = None
        if mine is None:
            return
        with contextlib.suppress(NoNodeError, ZooKeeperError):  # the ephemeral node goes with the session
            zk_call(self.zk, self.zk.delete, self.paths.broker(mine.id))
        log.info("broker_deregistered", broker=mine.id)

    @property
    def registered(self) -> bool:
        mine = self._mine
        return mine is not None and mine.id in self.brokers

    # ------------------------------------------------------------------ worker
    def _run(self) -> None:
        while not self._stop.is_set():
            woken = self._wake.wait(5.0)
            if woken:  # (cleared only when seen: a wake-up set just after a timeout waits for the next turn)
                self._wake.clear()
            if self._stop.is_set():
                return
            if not self.session.connected:
                continue
            try:
                self._ensure_mine()  # every 5 s: one exists() of our own node
                if woken or self._full_read_due():
                    self._refresh()
            except (ZooKeeperError, NoNodeError) as e:  # (the brokers' znode deleted under us)
                log.warning("registry_refresh_failed", error=repr(e))
                time.sleep(0.2)
                self._wake.set()
            except Exception:
                # Whatever else goes wrong (a bug, a hostile registration that slipped past decoding), the
                # worker goes on: a dead worker would leave the registry frozen while it still says synced
                # -- the leader healing against a membership that never changes (Pulsar #23297's class).
                log.exception("registry_worker_failed", retry_in_s=1.0)
                time.sleep(1.0)
                self._wake.set()

    def _ensure_mine(self) -> None:
        mine = self._mine
        if mine is None:
            return
        path = self.paths.broker(mine.id)
        stat = zk_call(self.zk, self.zk.exists, path)
        if stat is not None and stat.ephemeralOwner == self.session.session_id:
            self.registered_session = self.session.session_id
            return
        if stat is not None:
            return  # a node of a previous session of ours: it expires soon, then the watch wakes us
        try:
            zk_call(self.zk, self.zk.create, path, _enc.encode(mine), ephemeral=True, makepath=True)
            self.registered_session = self.session.session_id
            self.registrations += 1
            log.warning("broker_reregistered", broker=mine.id, reason="registration node was missing")
            for fn in self.on_reregistered:
                try:
                    fn(self.registered_session)
                except Exception:
                    log.exception("reregistered_listener_failed")
        except NodeExistsError:
            pass

    def _read(self, stale: set[str], full: bool) -> dict[str, BrokerInfo]:
        children = zk_call(self.zk, self.zk.get_children, self.paths.brokers)
        known, fresh = self.brokers, {}
        unreadable = self._unreadable & set(children)
        for child in children:
            if not full and child not in stale:
                if (info := known.get(child)) is not None:
                    fresh[child] = info
                    continue
                if child in unreadable:
                    continue  # refused before and unchanged since: not read (nor logged) again
            try:
                data, _ = zk_call(self.zk, self.zk.get, self.paths.broker(child), watch=self._data_changed)
            except NoNodeError:
                continue
            decoded = _info_dec.decode(data)
            if isinstance(decoded, Refused):
                unreadable.add(child)
                log.warning(
                    "broker_registration_unreadable",
                    broker=child,
                    reason=decoded.reason,
                    detail=decoded.detail,
                )
                continue
            unreadable.discard(child)
            fresh[child] = decoded
        self._unreadable = unreadable
        return fresh

    def _full_read_due(self) -> bool:
        return self._read_in != self.session.session_id or time.monotonic() - self._full_at >= FULL_REFRESH_S

    def _refresh(self) -> None:
        """The children list, and the registrations that are new, changed (their data watch fired) or all
        of them when a full read is due (:meth:`_full_read_due`); the rest are kept from the cache."""
        full = self._full_read_due()
        session, started = self.session.session_id, time.monotonic()
        with self._lock:
            stale, self._stale = self._stale, set()
        try:
            fresh = self._read(stale, full)
        except BaseException:
            with self._lock:  # not read: they are still to be read
                self._stale |= stale
            raise
        if full:
            self._read_in, self._full_at = session, started
        changed = fresh != self.brokers
        self.brokers = fresh
        self.synced.set()
        if changed:
            for fn in self._listeners:
                try:
                    fn(dict(fresh))
                except Exception:
                    log.exception("registry_listener_failed")


class NamespacePolicies(msgspec.Struct, kw_only=True):
    """A namespace's znode: its bundle boundaries and (for the placement features) its policies."""

    schema: int = 1
    boundaries: list[str]
    anti_affinity_group: str | None = None

    def layout(self, namespace: str) -> BundleLayout:
        return BundleLayout(namespace, tuple(int(b, 16) for b in self.boundaries))


def _hex(b: int) -> str:
    return f"0x{b:08x}"


_pol_dec = StrictDecoder(NamespacePolicies, ZNODE_MAX_BYTES)


class NamespaceStore:
    """Bundle layouts per namespace (``admin/namespaces/<tenant>/<ns>``).

    Who may create one is decided by the callers, never here: the agent's lookups only where
    ``namespace.auto_create`` allows (balance/namespaces.py), the controller's admin API on an operator's
    request. ``on_deleted`` listeners hear of a namespace whose znode was deleted, from a ZooKeeper watch
    set by every read (on kazoo's thread: they must only mark or enqueue)."""

    def __init__(self, zk: KazooClient, paths: ZkPaths, default_bundles: int) -> None:
        self.zk = zk
        self.paths = paths
        self.default_bundles = default_bundles
        self._deleted_listeners: list[Callable[[str], object]] = []

    def on_deleted(self, fn: Callable[[str], object]) -> None:
        """Call ``fn(namespace)`` when the znode of a namespace this store has read is deleted."""
        self._deleted_listeners.append(fn)

    def _watched(self, event: WatchedEvent) -> None:
        """kazoo's data watch (its thread). One bound method for every znode, so kazoo keeps one watcher
        per path however often it is read."""
        prefix = self.paths.namespaces + "/"
        if event.type != EventType.DELETED or not event.path.startswith(prefix):
            return
        namespace = event.path[len(prefix) :]
        for fn in self._deleted_listeners:
            try:
                fn(namespace)
            except Exception:
                log.exception("namespace_listener_failed", namespace=namespace)

    def read(self, namespace: str) -> tuple[NamespacePolicies, int] | None:
        watch = self._watched if self._deleted_listeners else None
        try:
            data, stat = zk_call(self.zk, self.zk.get, self.paths.namespace(namespace), watch=watch)
        except NoNodeError:
            return None
        pol = _pol_dec.decode(data)
        if isinstance(pol, Refused):
            # Never guess a namespace's bundle boundaries: a default layout could overlap the real one.
            raise NamespaceUnreadable(
                f"namespace {namespace}: its policy znode is unreadable ({pol.reason}: {pol.detail}); "
                "fix or delete it with a ZooKeeper tool"
            )
        return pol, stat.version

    def exists(self, namespace: str) -> bool:
        """Whether ``namespace`` has a znode, readable or not."""
        return zk_call(self.zk, self.zk.exists, self.paths.namespace(namespace)) is not None

    def load(self, namespace: str, *, create: bool) -> BundleLayout:
        """The layout of ``namespace``; if it does not exist, created with ``default_bundles`` equal ranges
        when ``create``, else :class:`NamespaceNotFound`. The name is checked before ZooKeeper is asked."""
        got = self.read(namespace)
        if got is not None:
            return got[0].layout(namespace)
        if not create:
            raise NamespaceNotFound(namespace)
        self.create(namespace, self.default_bundles)
        got = self.read(namespace)
        if got is None:  # deleted again between our create and this read
            raise NamespaceNotFound(namespace)
        return got[0].layout(namespace)

    def ensure(self, namespace: str) -> BundleLayout:
        """The layout of ``namespace``, creating it if it does not exist (tools and tests; the lookups go
        through :meth:`load` with their policy's answer)."""
        return self.load(namespace, create=True)

    def create(self, namespace: str, bundles: int) -> bool:
        """Create ``namespace`` with ``bundles`` equal bundles; False if it exists already (then unchanged)."""
        pol = NamespacePolicies(boundaries=[_hex(b) for b in equal_boundaries(bundles)])
        try:
            zk_call(self.zk, self.zk.create, self.paths.namespace(namespace), _enc.encode(pol), makepath=True)
        except NodeExistsError:
            return False
        log.info("namespace_created", namespace=namespace, bundles=bundles)
        return True

    def delete(self, namespace: str) -> bool:
        """Delete the namespace's znode (whatever its version); False if there was none. Its tenant's znode
        stays: removing it could race a creation of another namespace of the tenant."""
        try:
            zk_call(self.zk, self.zk.delete, self.paths.namespace(namespace))
        except NoNodeError:
            return False
        log.info("namespace_deleted", namespace=namespace)
        return True

    def names(self) -> list[str]:
        """Every namespace that has a znode, sorted (children that are not valid names are skipped)."""
        out: list[str] = []
        try:
            tenants = zk_call(self.zk, self.zk.get_children, self.paths.namespaces)
        except NoNodeError:
            return out
        for t in tenants:
            try:
                children = zk_call(self.zk, self.zk.get_children, f"{self.paths.namespaces}/{t}")
            except NoNodeError:
                continue
            for n in children:
                try:
                    out.append(validate_namespace(f"{t}/{n}"))
                except BundleError:
                    continue
        return sorted(out)

    def apply_split(self, namespace: str, parent: BundleRange, children: list[BundleRange]) -> BundleLayout:
        """Replace ``parent`` by ``children`` in the namespace's layout (see :meth:`_change_layout`)."""

        def change(layout: BundleLayout) -> BundleLayout | None:
            have = set(layout.boundaries)
            if all(c.lower in have for c in children) and parent.upper in have:
                return None  # already applied
            return layout.with_split(parent, children)

        return self._change_layout(
            namespace,
            change,
            f"{parent.name} is not split",
            "namespace_split",
            parent=parent.name,
            children=[c.name for c in children],
        )

    def apply_merge(self, namespace: str, merged: BundleRange, inner: int) -> BundleLayout:
        """Replace the two bundles meeting at ``inner`` by ``merged`` in the namespace's layout (see
        :meth:`_change_layout`); :class:`BundleError` if ``merged`` is not (or no longer) those two bundles
        (:meth:`BundleLayout.with_merge`)."""
        if not merged.lower < inner < merged.upper:
            raise BundleError(f"0x{inner:08x} is not strictly inside {merged}")

        def change(layout: BundleLayout) -> BundleLayout | None:
            have = set(layout.boundaries)
            if inner not in have and merged.lower in have and merged.upper in have:
                return None  # already applied
            return layout.with_merge(merged, inner)

        parents = [BundleRange(merged.lower, inner).name, BundleRange(inner, merged.upper).name]
        return self._change_layout(
            namespace,
            change,
            f"{merged.name} is not merged",
            "namespace_merged",
            merged=merged.name,
            parents=parents,
        )

    def _change_layout(
        self,
        namespace: str,
        change: Callable[[BundleLayout], BundleLayout | None],
        not_done: str,
        event: str,
        **fields: Any,
    ) -> BundleLayout:
        """One :func:`compare_and_set` of the namespace's znode: read, ``change`` the layout (None: already
        applied), one versioned write (a concurrent change is read again, never overwritten); idempotent.
        :class:`NamespaceNotFound` if the namespace was deleted, :class:`ZkConflict` if the layout kept
        changing."""
        path = self.paths.namespace(namespace)

        def attempt() -> BundleLayout:
            got = self.read(namespace)
            if got is None:
                # Deleted by an operator (trimtab admin namespaces delete): never bring it back.
                raise NamespaceNotFound(namespace, f"namespace {namespace} was deleted; {not_done}")
            pol, version = got
            layout = pol.layout(namespace)
            new = change(layout)
            if new is None:
                return layout
            new_pol = msgspec.structs.replace(pol, boundaries=[_hex(b) for b in new.boundaries])
            versioned_write(self.zk, path, _enc.encode(new_pol), version)
            log.info(event, namespace=namespace, **fields)
            return new

        return compare_and_set(attempt, what=f"the bundle layout of {namespace} ({path})", tries=20)

    def all(self) -> dict[str, BundleLayout]:
        out: dict[str, BundleLayout] = {}
        try:
            tenants = zk_call(self.zk, self.zk.get_children, self.paths.namespaces)
        except NoNodeError:
            return out
        for t in tenants:
            for n in zk_call(self.zk, self.zk.get_children, f"{self.paths.namespaces}/{t}"):
                got = self.read(f"{t}/{n}")
                if got is not None:
                    out[f"{t}/{n}"] = got[0].layout(f"{t}/{n}")
        return out
