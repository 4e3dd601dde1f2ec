"""The bundles whose record names one broker, kept as the table changes.

An agent asks often which bundles concern its own broker -- each split cycle (what it owns), every 50 ms
of a drain (what still names it), each pre-warming round -- and the table holds every bundle of the
cluster: a scan per question costs a million record checks at a million bundles (the simulator, which
runs a hundred agents' jobs, spent half its time in those scans). :class:`NamingIndex` answers from the
few keys that name the broker instead, kept by one table listener for every broker asked about.

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
    """The bundles naming each broker asked about, by one table listener whatever their number (the
    simulator's hundred agents share a table: a listener each cost a hundred calls per record)."""

    def __init__(self, table: TableView) -> None:
        self.table = table
        self._lock = threading.Lock()
        self._keys: dict[str, set[str]] = {}  # broker -> keys naming it (brokers asked about only)
        self._generation: dict[str, int] = {}  # broker -> the table's generation at its last scan
        table.add_listener(self._changed)

    def _changed(self, key: str, old: Record | None, new: Record | None) -> None:
        """A table listener (the follower's thread)."""
        with self._lock:
            keys = self._keys
            if old is not None:
                for b in (old.dst, old.src):
                    if b is not None and b in keys and (new is None or not new.names(b)):
                        keys[b].discard(key)
            if new is not None:
                for b in (new.dst, new.src):
                    if b is not None and b in keys:
                        keys[b].add(key)

    def records(self, broker: str) -> dict[str, Record]:
        """Every bundle whose current record names ``broker`` (as ``dst`` or ``src``), with that record."""
        table = self.table
        with self._lock:
            # The generation first, then whether the table is live: load() makes it not live and then
            # moves the generation on, so a load at any point of this is seen by one check or the other.
            generation = table.generation
            if not table.live:
                return {k: r for k, r in table.items() if r.names(broker)}
            if self._generation.get(broker) != generation:
                keys = {k for k, r in table.items() if r.names(broker)}
                if not (table.live and table.generation == generation):
                    # Replaced while it was scanned (a history gap): what was seen is no index of it.
                    return {k: r for k in keys if (r := table.get(k)) is not None and r.names(broker)}
                self._keys[broker], self._generation[broker] = keys, generation
            keys_now = list(self._keys[broker])
        get = table.get
        return {k: r for k in keys_now if (r := get(k)) is not None and r.names(broker)}
