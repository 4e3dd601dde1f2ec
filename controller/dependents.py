"""Which bundles depend on each broker, kept as the channel changes -- the leader's healing reads this
instead of copying the whole table.

Healing asks, after every membership change and in every round while a broker is failed, which brokers the
table still needs (:func:`~trimtab.balance.heal.dependents`), which records depend on the failed ones, and
how many bundles are ``Assigning`` into each broker (its throttle). Each used to be a pass over a copy of
the whole table: a million records per question at a million bundles, and in the simulator's rolling
restart of 100 brokers a third of all the time. :class:`DependentsIndex` keeps the answers by a table
listener: the keys depending on each broker, the keys ``Assigning`` into each.

Consistency is :mod:`channel.naming`'s: listener and rescan share a lock; the index rescans when the table
was replaced whole (:attr:`TableView.generation`), and answers by a scan while the table is not live
(listeners are silent then). The index holds sets of keys, so a listener's delta applied on top of a scan
that already saw its record leaves the same sets.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Collection, Iterable

from trimtab.balance.heal import dependents
from trimtab.channel.records import Record, State
from trimtab.channel.table import TableView


class DependentsIndex:
    def __init__(self, table: TableView) -> None:
        self.table = table
        self._lock = threading.Lock()
        self._by: dict[str, set[str]] = {}  # broker -> keys whose record depends on it
        self._assigning: dict[str, set[str]] = {}  # broker -> keys Assigning into it
        self._generation: int | None = None  # of the table at the last scan; None: not scanned yet
        self.scans = 0
        table.add_listener(self._changed)

    # ------------------------------------------------------------------ upkeep
    @staticmethod
    def _into(index: dict[str, set[str]], brokers: Iterable[str], key: str) -> None:
        for b in brokers:
            got = index.get(b)
            if got is None:
                index[b] = {key}
            else:
                got.add(key)

    @staticmethod
    def _out_of(index: dict[str, set[str]], brokers: Iterable[str], key: str) -> None:
        for b in brokers:
            got = index.get(b)
            if got is not None:
                got.discard(key)
                if not got:
                    del index[b]

    @staticmethod
    def _assigning_into(rec: Record) -> tuple[str, ...]:
        return (rec.dst,) if rec.state is State.ASSIGNING and rec.dst is not None else ()

    def _changed(self, key: str, old: Record | None, new: Record | None) -> None:
        """A table listener (the follower's thread)."""
        with self._lock:
            if old is not None:
                self._out_of(self._by, dependents(old), key)
                self._out_of(self._assigning, self._assigning_into(old), key)
            if new is not None:
                self._into(self._by, dependents(new), key)
                self._into(self._assigning, self._assigning_into(new), key)

    @classmethod
    def _scan(cls, items: Iterable[tuple[str, Record]]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
        by: dict[str, set[str]] = {}
        assigning: dict[str, set[str]] = {}
        for key, rec in items:
            cls._into(by, dependents(rec), key)
            cls._into(assigning, cls._assigning_into(rec), key)
        return by, assigning

    def _current(self) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
        """The two indexes, up to date (called with the lock held): the kept ones, or a scan's."""
        table = self.table
        # The generation first, then whether the table is live: load() makes it not live and then moves
        # the generation on, so a load at any point of this is seen by one check or the other.
        generation = table.generation
        if not table.live:
            return self._scan(table.items())
        if self._generation != generation:
            self.scans += 1
            scanned = self._scan(table.items())
            if not (table.live and table.generation == generation):
                return scanned  # replaced while it was scanned (a history gap): no index of it
            (self._by, self._assigning), self._generation = scanned, generation
        return self._by, self._assigning

    # ------------------------------------------------------------------ questions (any thread)
    def named(self) -> set[str]:
        """Every broker some record depends on."""
        with self._lock:
            return set(self._current()[0])

    def depending_on(self, brokers: Collection[str]) -> list[tuple[str, Record]]:
        """The bundles whose current record depends on one of ``brokers``, with that record, by name."""
        with self._lock:
            by = self._current()[0]
            keys = set().union(*(by.get(b, ()) for b in brokers)) if brokers else set()
        get, wanted = self.table.get, frozenset(brokers)
        got = [(k, r) for k in keys if (r := get(k)) is not None and not wanted.isdisjoint(dependents(r))]
        got.sort(key=lambda kr: kr[0])
        return got

    def assigning(self) -> Counter[str]:
        """Bundles ``Assigning`` into each broker (healing's throttle: work in progress)."""
        with self._lock:
            return Counter({b: len(keys) for b, keys in self._current()[1].items()})
