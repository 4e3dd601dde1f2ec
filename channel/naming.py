"""The bundles whose record names one broker, kept as the table changes.

An agent asks often which bundles concern its own broker -- each split cycle (what it owns), every 50 ms
of a drain (what still names it), each pre-warming round -- and the table holds every bundle of the
cluster: a scan per question costs a million record checks at a million bundles (the simulator, which
runs a hundred agents' jobs, spent half its time in those scans). :class:`NamingIndex` answers from the
few keys that name the broker instead, kept by a table listener.

Consistency: the listener and a rescan share one lock, and the index rescans whenever the table was
replaced whole (:attr:`TableView.generation`: a snapshot or a history gap), because listeners hear nothing
then. Until the table is live (replaying its bootstrap, when listeners are silent too) every question is
answered by a scan, as before.
"""

from __future__ import annotations

import threading

from trimtab.channel.records import Record
from trimtab.channel.table import TableView


class NamingIndex:
    def __init__(self, table: TableView, broker: str) -> None:
        self.table = table
        self.broker = broker
        self._lock = threading.Lock()
        self._keys: set[str] = set()
        self._generation: int | None = None  # of the table at the last scan; None: not scanned yet
        table.add_listener(self._changed)

    def _changed(self, key: str, old: Record | None, new: Record | None) -> None:
        """A table listener (the follower's thread)."""
        with self._lock:
            if new is not None and new.names(self.broker):
                self._keys.add(key)
            else:
                self._keys.discard(key)

    def records(self) -> dict[str, Record]:
        """Every bundle whose current record names the broker (as ``dst`` or ``src``), with that record."""
        table, broker = self.table, self.broker
        with self._lock:
            # The generation first, then whether the table is live: load() makes it not live and then
            # moves the generation on, so a load at any point of this is seen by one check or the other.
            generation = table.generation
            if not table.live:
                return {k: r for k, r in table.items() if r.names(broker)}
            if self._generation != generation:
                keys = {k for k, r in table.items() if r.names(broker)}
                if not (table.live and table.generation == generation):
                    # Replaced while it was scanned (a history gap): what was seen is no index of it.
                    return {k: r for k in keys if (r := table.get(k)) is not None and r.names(broker)}
                self._keys, self._generation = keys, generation
            keys_now = list(self._keys)
        get = table.get
        return {k: r for k in keys_now if (r := get(k)) is not None and r.names(broker)}
