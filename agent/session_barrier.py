"""Which channel records predate this broker's current registration (issue 31's partition faults).

The leader may give a failed broker's bundles to others from the moment the broker's ZooKeeper session
expired until it registers again -- and may publish those overrides a little after it registered (the
decision was taken before). A record naming this broker that entered the channel in that window, or before
it, was decided while the leader may have counted the broker dead: acting on it at once (acquiring for an
``Assigning{dst=me}``) could make two brokers serve one bundle until this agent reads the override. Such a
record is *stale* and is settled through the channel first (:mod:`trimtab.balance.roles`), where the
version check orders it against any override.

Found by the chaos suite: an agent cut off from a ZooKeeper member past its session timeout lost its
session; a lookup had put an ``Assigning`` to it in the channel meanwhile; the leader healed the bundle to
another broker; the agent's new session acquired it under the ``Assigning`` half a second after the other
broker did (double serving for 43 ms, until it read the override).

The barrier is a position in the channel: the end offset of every partition, read after the broker
registered in its current session. A record at an offset below it predates the registration. Until the
barrier is set -- from a session's loss until the registry registers again, whose worker sets it at once
(the agent's tick tries again if Kafka did not answer) -- every record predates it; so does everything
before the first registration at start-up. That window is the time without a session, when nothing can be
acquired anyway: a shorter one would miss records of that time, a longer one would take the agent's own
fresh decisions for stale and give its new bundles away (as the first version of this did, caught by
tests/integration/test_controller.py's ZooKeeper tests). The check runs on the channel follower's
thread as each record is applied (the exact offset is known only there) and travels with the change to the
reconciler.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from trimtab.channel.table import TableView, partition_for


class SessionBarrier:
    """Thread-safe: ``lost`` and ``set`` on the loop, ``predates`` on the follower thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ends: dict[int, int] | None = None  # None: not registered in the current session yet
        self.session: int | None = None  # the session the barrier was set in

    @property
    def open(self) -> bool:
        return self._ends is not None

    def lost(self) -> None:
        """The session is gone: everything from here on predates the next registration."""
        with self._lock:
            self._ends = None
            self.session = None

    def set(self, ends: Mapping[int, int], session: int | None) -> None:
        """Registered in ``session``, and the channel's partitions ended at ``ends`` (partition -> the
        offset the next record will get) after that."""
        with self._lock:
            self._ends = dict(ends)
            self.session = session

    def predates(self, table: TableView, bundle: str) -> bool:
        """Whether the record of ``bundle`` being applied to ``table`` right now predates the barrier."""
        with self._lock:
            ends = self._ends
        if ends is None:
            return True
        if not table.partitions:
            return False  # a table fed without partitions (tests): no positions to compare
        p = partition_for(bundle.encode(), table.partitions)
        offset = table.positions.get(p, 0) - 1  # the record being applied
        return offset < ends.get(p, 0)
