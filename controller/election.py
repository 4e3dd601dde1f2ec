"""Leader election through ZooKeeper, with a term.

Taking leadership is one ZooKeeper transaction: bump the persistent ``leader_term`` counter (a
compare-and-set on its version) *and* create the ephemeral ``leader`` node holding ``{id, term, session}``.
Either both happen or neither, so every leadership has a distinct, increasing term that is bound to every
decision, event and log line.

Leadership is a property of the session: SUSPENDED pauses the leader at once (it may still hold the node
but must not decide), LOST ends it (the ephemeral node is gone with the session). After a reconnect with
the same session the node is still ours and the leader resumes -- destructive work waits for the safe-mode
settle period (see controller.daemon). Watches only wake the worker thread (Patroni's rule).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

import msgspec
import structlog
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from trimtab.channel.values import Refused, StrictDecoder
from trimtab.cluster.zk import ZNODE_MAX_BYTES, ZkPaths, ZkSession, zk_call
from trimtab.errors import ZooKeeperError

log = structlog.get_logger("trimtab.election")


class LeaderInfo(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    term: int
    session: int
    http_url: str
    since: int  # ms


_enc = msgspec.json.Encoder()
_dec = StrictDecoder(LeaderInfo, ZNODE_MAX_BYTES)


#: The largest term a leader may take: it is written into every record's writer fields as a 64-bit integer.
MAX_TERM = (1 << 63) - 2


def parse_term(raw: bytes | None) -> int | None:
    """The term in ``leader_term`` (decimal digits: :meth:`LeaderElection.start` creates it as ``0``). None
    when the znode holds anything else -- nothing, a sign, spaces, an exponent, a term too large to follow:
    the last term is then unknown."""
    if raw is None or len(raw) > 19 or not raw.isdigit():
        return None
    term = int(raw)
    return term if term <= MAX_TERM else None


class LeaderElection:
    def __init__(
        self,
        session: ZkSession,
        paths: ZkPaths,
        me: str,
        http_url: str,
    ) -> None:
        self.session = session
        self.zk = session.client
        self.paths = paths
        self.me = me
        self.http_url = http_url
        self._listeners: list[Callable[[bool, int | None], object]] = []
        self.term: int | None = None  # our term while we hold the leader node
        self.current: LeaderInfo | None = None  # whoever leads, as last read
        self.candidate = True
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.elections_won = 0
        self.unreadable_term = False  # leader_term does not hold a term: no campaign until it does
        self.steps = 0  # election rounds run (a test's proof that the thread is alive)

    def add_listener(self, fn: Callable[[bool, int | None], object]) -> None:
        """``fn(leading, term)`` on every change of our leadership, on the election's thread."""
        self._listeners.append(fn)

    # ------------------------------------------------------------------ state
    @property
    def is_leader(self) -> bool:
        """We hold the leader node and our session is connected (not merely not-yet-expired)."""
        return self.term is not None and self.session.connected

    def start(self) -> None:
        for path, value in ((self.paths.leader_term, b"0"),):
            with contextlib.suppress(NodeExistsError):
                zk_call(self.zk, self.zk.create, path, value, makepath=True)
        self.session.add_listener(self._on_session)
        self.zk.DataWatch(self.paths.leader, self._leader_changed)
        self._thread = threading.Thread(target=self._run, name="zk-election", daemon=True)
        self._thread.start()
        self._wake.set()

    def stop(self, resign: bool = True) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)
        if resign:
            self.resign()

    def resign(self) -> None:
        """Give up leadership (graceful stop): delete our node so a follower takes over at once."""
        if self.term is None:
            return
        if not self.session.connected:
            # Nothing to delete through a dead connection (a request would wait for the reconnect, maybe
            # forever): the node is ephemeral and goes with the session.
            self._set(None)
            return
        try:
            _data, stat = zk_call(self.zk, self.zk.get, self.paths.leader)
            if stat.ephemeralOwner == self.session.session_id:
                zk_call(self.zk, self.zk.delete, self.paths.leader, version=stat.version)
                log.info("leader_resigned", term=self.term)
        except (NoNodeError, BadVersionError, ZooKeeperError):
            pass  # gone already, or unreachable: the ephemeral node goes with the session
        self._set(None)

    # ------------------------------------------------------------------ events
    def _on_session(self, state: str) -> None:
        if state == "lost" and self.term is not None:
            log.warning("leadership_lost", term=self.term, reason="ZooKeeper session expired")
            self._set(None)
        self._wake.set()

    def _leader_changed(self, data: bytes | None, stat: object) -> bool:
        self._wake.set()
        return not self._stop.is_set()

    def _set(self, term: int | None) -> None:
        changed = term != self.term
        self.term = term
        if not changed:
            return
        for fn in self._listeners:
            try:
                fn(term is not None, term)
            except Exception:
                log.exception("leadership_listener_failed")

    # ------------------------------------------------------------------ worker
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(2.0)
            self._wake.clear()
            if self._stop.is_set() or not self.session.connected:
                continue
            try:
                self._step()
            except ZooKeeperError as e:
                log.warning("election_step_failed", error=str(e))
                time.sleep(0.2)
                self._wake.set()
            except Exception:  # never let the election die: this controller could never lead again
                log.exception("election_step_crashed")
                time.sleep(1.0)
                self._wake.set()
            self.steps += 1

    def _step(self) -> None:
        try:
            data, stat = zk_call(self.zk, self.zk.get, self.paths.leader)
        except NoNodeError:
            self.current = None
            if self.term is not None:
                self._set(None)  # somebody deleted our node: we are not leader any more
            if self.candidate:
                self._campaign()
            return
        info = _dec.decode(data)
        ours = stat.ephemeralOwner == self.session.session_id
        if isinstance(info, Refused):
            # Who leads is unknown, but whether it is us is in the node's owner, not its bytes.
            log.error("leader_node_unreadable", reason=info.reason, detail=info.detail, ours=ours)
            self.current = None
            if not ours and self.term is not None:
                log.warning("leadership_lost", term=self.term, new_leader=None, new_term=None)
                self._set(None)
            return
        self.current = info
        if ours and self.term is None:
            self._set(info.term)  # same session survived a suspension: still ours
        elif not ours and self.term is not None:
            log.warning("leadership_lost", term=self.term, new_leader=info.id, new_term=info.term)
            self._set(None)

    def _campaign(self) -> None:
        raw, stat = zk_call(self.zk, self.zk.get, self.paths.leader_term)
        last = parse_term(raw)
        if last is None:
            # Every leader's writes are fenced by its term: a guessed one could go backwards. Stay without
            # a leader (TrimtabNoLeader pages) until an operator writes the last term back.
            if not self.unreadable_term:
                log.error(
                    "leader_term_unreadable",
                    path=self.paths.leader_term,
                    length=None if raw is None else len(raw),
                    action="not campaigning until it holds a term (decimal digits)",
                )
            self.unreadable_term = True
            return
        self.unreadable_term = False
        term = last + 1
        info = LeaderInfo(
            id=self.me,
            term=term,
            session=self.session.session_id or 0,
            http_url=self.http_url,
            since=int(time.time() * 1000),
        )

        def commit() -> list[object]:
            # A fresh transaction per attempt (kazoo commits one only once). An attempt retried after a
            # lost connection may find its own first attempt committed: that reads as a lost race, and the
            # next step sees the leader node is this session's and takes the term.
            tx = self.zk.transaction()
            tx.set_data(self.paths.leader_term, str(term).encode(), version=stat.version)
            tx.create(self.paths.leader, _enc.encode(info), ephemeral=True)
            return list(tx.commit())

        results = zk_call(self.zk, commit)
        if any(isinstance(r, Exception) for r in results):
            self._wake.set()  # lost the race; re-read who won
            return
        self.current = info
        self.elections_won += 1
        log.info("leader_elected", term=term, leader=self.me)
        self._set(term)

    def leader(self) -> LeaderInfo | None:
        return self.current

    def confirm(self) -> bool:
        """One ZooKeeper round trip: do we still hold the leader node, in this very session?

        Called right before each round of destructive writes. A leader process that was paused past its
        session timeout (a long GC, SIGSTOP) still believes it leads until kazoo notices; the read fails
        on an expired session, or shows the node now belongs to another session, and the round is
        skipped. (The channel would stay single-owner either way -- the first valid record wins -- but a
        stale leader could make moves a new leader then has to undo.)
        """
        if self.term is None:
            return False
        try:
            _, stat = zk_call(self.zk, self.zk.get, self.paths.leader)
        except (NoNodeError, ZooKeeperError):
            self._wake.set()
            return False
        if stat.ephemeralOwner != self.session.session_id:
            self._wake.set()
            return False
        return True
