"""Leadership and the gates on a leader's writes.

Only the leader decides, and only while its view can be trusted: a leader whose ZooKeeper session is
suspended decides nothing (it keeps the leadership and resumes if the session survives); one that lost it
is no longer leader. Destructive work additionally waits ``healing.safe_mode_settle_s`` after any reconnect
("safe mode"), because broker registrations are not trustworthy while sessions re-establish, and until the
registry and the channel have caught up. Every job asks :meth:`Leadership.safe_mode` before it acts and
:meth:`Leadership.confirm` before it writes, so the gates live here once.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import structlog

from trimtab.channel.client import ChannelClient
from trimtab.cluster.zk import BrokerRegistry, ZkSession
from trimtab.controller.election import LeaderElection
from trimtab.errors import NotLeader

log = structlog.get_logger("trimtab.controller")


class LeaderGates(Protocol):
    """What a leader's job asks before it decides and writes: :class:`Leadership` in the controller, an
    in-memory leadership in the simulator (whose ZooKeeper is a fault it injects)."""

    def term(self) -> int: ...

    def writer(self) -> str: ...

    def safe_mode(self) -> str | None: ...

    async def confirm(self) -> bool: ...

    def confirm_blocking(self) -> bool: ...


class Leadership:
    def __init__(
        self,
        election: LeaderElection,
        zk: ZkSession,
        registry: BrokerRegistry,
        channel: ChannelClient,
        *,
        me: str,
        settle_s: float,
    ) -> None:
        self.election = election
        self.zk = zk
        self.registry = registry
        self.channel = channel
        self.me = me
        self.settle_s = settle_s

    def term(self) -> int:
        """The leader term (0 while not leading); bound to every record this controller writes."""
        return self.election.term or 0

    def writer(self) -> str:
        """The ``writer`` field of this controller's records: who, and under which term."""
        return f"controller:{self.me}:t{self.term()}"

    @property
    def is_leader(self) -> bool:
        return self.election.is_leader

    def safe_mode(self) -> str | None:
        """Why destructive work must wait right now, or None."""
        # A leader whose session is suspended still holds the leadership (it resumes if the session
        # survives): say that it is paused by ZooKeeper, not that it is a follower.
        if self.election.term is None:
            return "not_leader"
        if not self.zk.connected:
            return "zookeeper_" + self.zk.state
        stable = self.zk.stable_for()
        if stable < self.settle_s:
            return f"settling ({stable:.0f}s of {self.settle_s:.0f}s since ZooKeeper reconnected)"
        if not self.registry.synced.is_set() or not self.channel.ready:
            return "warming_up"
        return None

    async def confirm(self) -> bool:
        """Confirm leadership with ZooKeeper before destructive writes (see LeaderElection.confirm)."""
        return await asyncio.to_thread(self.confirm_blocking)

    def confirm_blocking(self) -> bool:
        """:meth:`confirm` on the calling thread (a worker thread: it waits for a ZooKeeper round trip).

        The gates of :meth:`safe_mode` are asked again after the round trip: a view that stopped being
        trustworthy while the round was decided (the channel replica stopped and is being rebuilt, the
        session was suspended) lets nothing of it out (Pulsar's cleanup acting on a stale view, #23064)."""
        if not self.election.confirm():
            log.warning("leadership_not_confirmed", action="skipping this round of writes")
            return False
        why = self.safe_mode()
        if why is not None:
            log.warning("leadership_not_confirmed", safe_mode=why, action="skipping this round of writes")
            return False
        return True

    def require_leader(self) -> None:
        """For admin requests: raise :class:`NotLeader` naming the leader to redirect to, if any."""
        if not self.is_leader:
            cur = self.election.leader()
            # A leader paused by a suspended session still names itself as leader: redirecting to that
            # would loop. Nobody can lead right now: a retryable 503.
            raise NotLeader(cur.http_url if cur is not None and cur.id != self.me else None)
