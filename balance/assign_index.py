"""The assignment decision kept up to date as reports arrive, instead of recomputed per lookup.

:func:`~trimtab.balance.assign.select_broker` with the default filters and no placement rule makes three
passes over every broker per decision -- freshness and the topic limit, the scores and their average, the
sort of the "best" brokers -- which is 5 - 8 ms at 10 000 brokers (docs/benchmarks.md). An agent answers
that for every unowned bundle a client asks about, so the decision has to cost what changed since the last
one, not what the cluster holds.

:class:`AssignIndex` keeps, over the non-draining registered brokers:

* the fresh scores sorted by score (``(ema, id)``), their count and their **exact** sum (an integer in
  units of 2**-1074, the smallest double step), so the average is ``math.fsum``'s correctly rounded sum
  divided by the count -- bit for bit what the scan computes;
* the brokers below the last decision's cut (``ema + diff <= average + 1e-9``) as bits of a Fenwick tree
  ordered by broker id: "the j-th best broker by id" -- what ``rng.choice(sorted(best))`` returns -- is a
  walk down the tree;
* report ages in a heap, so a report that turns stale leaves the scores when its time comes.

A decision then moves the cut by the brokers whose score crossed it, and draws the same random number the
scan would (``rng.choice`` over a sequence of the same length): the index and the scan pick the same
broker from the same random state, which the property tests check over random histories
(tests/property/test_assign_index_props.py).

What it does not index, answering ``None`` so the caller falls back to the scan: a fresh broker at the
topic limit (the filter would change the candidates), several broker versions while
``prefer_later_versions`` is on, and a score that is not a finite number. A change of the registered
brokers (the registry replaces its mapping) or of the settings, or a clock that went back, rebuilds it
(O(brokers log brokers)). Reports are read from the live mapping the caller passes in; a report's arrival
is announced by :meth:`AssignIndex.load_changed`, from any thread.
"""

from __future__ import annotations

import heapq
import math
import random
import threading
from bisect import bisect_left, insort
from collections.abc import Mapping

from trimtab.balance.assign import BrokerInfo, Selection, version_key
from trimtab.balance.load import BrokerLoadData

#: Every finite double is an integer multiple of 2**-1074: sums in these units are exact.
_SCALE_BITS = 1074
_SCALE = 1 << _SCALE_BITS
#: The tolerance :func:`~trimtab.balance.assign.least_resource_usage` puts on the average.
_TOLERANCE = 1e-9


def _units(x: float) -> int:
    """``x`` in units of 2**-1074, exactly."""
    num, den = x.as_integer_ratio()
    return num * (_SCALE // den)


class _Fenwick:
    """Counts by position (broker id rank); prefix sums and "the position of the k-th one"."""

    __slots__ = ("_t", "_top")

    def __init__(self, n: int) -> None:
        self._t = [0] * (n + 1)
        self._top = 1 << n.bit_length() if n else 0

    def add(self, i: int, delta: int) -> None:
        t, i = self._t, i + 1
        while i < len(t):
            t[i] += delta
            i += i & -i

    def kth(self, k: int) -> int:
        """The position of the ``k``-th (0-based) counted one; ``k`` < the total."""
        t, pos, step = self._t, 0, self._top
        while step:
            nxt = pos + step
            if nxt < len(t) and t[nxt] <= k:
                pos, k = nxt, k - t[nxt]
            step >>= 1
        return pos


class AssignIndex:
    """See the module docstring. :meth:`select` is called from one thread (the agent's event loop);
    :meth:`load_changed` from any."""

    def __init__(self, loads: Mapping[str, BrokerLoadData]) -> None:
        """``loads``: the live reports by broker id (a dict another thread updates; one ``get`` at a time
        is all the index does with it)."""
        self._loads = loads
        self._lock = threading.Lock()
        self._dirty: set[str] = set()
        self._brokers: Mapping[str, BrokerInfo] | None = None
        self._settings: tuple[float, int, bool] | None = None
        self._now = 0
        self.rebuilds = 0
        self._clear([])

    def load_changed(self, broker: str) -> None:
        """A report of ``broker`` arrived or was removed (a key-value view listener)."""
        with self._lock:
            self._dirty.add(broker)

    # ------------------------------------------------------------------ state
    def _clear(self, names: list[str]) -> None:
        self._names = names  # non-draining registered brokers, by id
        self._rank = {b: i for i, b in enumerate(names)}
        self._fen = _Fenwick(len(names))
        self._scored: dict[str, tuple[float, int, int, int]] = {}  # id -> (ema, updated_at, topics, units)
        self._by_ema: list[tuple[float, str]] = []
        self._sum = 0
        self._members: set[str] = set()  # counted in the Fenwick tree: below the cut
        self._cut: tuple[float, str] | None = None  # None: everyone is below it
        self._full: set[str] = set()  # fresh and at the topic limit
        self._odd: set[str] = set()  # a score that is not a finite number
        self._expiry: list[tuple[int, str]] = []

    def _rebuild(self, brokers: Mapping[str, BrokerInfo], now_ms: int, prefer_later_versions: bool) -> None:
        self.rebuilds += 1
        self._brokers = None  # until this rebuild is complete: a failure half-way rebuilds again next time
        with self._lock:
            self._dirty.clear()
        self._clear(sorted(b for b, info in brokers.items() if not info.draining))
        self._now = now_ms
        # Versions matter only while later ones are preferred (the scan reads them then only, too).
        self._versions = (
            {version_key(brokers[b].version) for b in self._names} if prefer_later_versions else set()
        )
        for b in self._names:
            self._score(b)
        self._brokers = brokers

    def _below_cut(self, key: tuple[float, str]) -> bool:
        return self._cut is None or key < self._cut

    def _unscore(self, b: str) -> None:
        got = self._scored.pop(b, None)
        if got is None:
            return
        ema, _, _, units = got
        self._full.discard(b)
        self._odd.discard(b)
        if units >= 0:
            self._sum -= units
            key = (ema, b)
            del self._by_ema[bisect_left(self._by_ema, key)]
            if b in self._members:
                self._members.discard(b)
                self._fen.add(self._rank[b], -1)

    def _score(self, b: str) -> None:
        """(Re)index ``b``'s current report: scored if it is fresh."""
        self._unscore(b)
        if b not in self._rank:
            return
        load = self._loads.get(b)
        ttl_ms, max_topics, _ = self._settings or (0.0, 0, False)
        if load is None or not self._now - load.updated_at <= ttl_ms:
            return
        ema = load.weighted_max_ema
        if not math.isfinite(ema):
            self._scored[b] = (ema, load.updated_at, load.topics, -1)
            self._odd.add(b)
        else:
            units = _units(ema)
            self._scored[b] = (ema, load.updated_at, load.topics, units)
            self._sum += units
            key = (ema, b)
            insort(self._by_ema, key)
            if self._below_cut(key):
                self._members.add(b)
                self._fen.add(self._rank[b], 1)
        if load.topics >= max_topics:
            self._full.add(b)
        heapq.heappush(self._expiry, (load.updated_at, b))

    def _expire(self, ttl_ms: float) -> None:
        heap, now = self._expiry, self._now
        while heap and not now - heap[0][0] <= ttl_ms:
            at, b = heapq.heappop(heap)
            got = self._scored.get(b)
            if got is not None and got[1] == at:
                self._unscore(b)
        if len(heap) > 2 * len(self._scored) + 1024:  # replaced reports' entries: drop them
            self._expiry = [(s[1], b) for b, s in self._scored.items()]
            heapq.heapify(self._expiry)

    def _move_cut(self, new: tuple[float, str] | None) -> None:
        """Make the Fenwick tree count exactly the scores below ``new`` (None: all of them)."""
        old, by_ema = self._cut, self._by_ema
        lo = bisect_left(by_ema, old) if old is not None else len(by_ema)
        hi = bisect_left(by_ema, new) if new is not None else len(by_ema)
        for _, b in by_ema[min(lo, hi) : max(lo, hi)]:
            if hi > lo:
                self._members.add(b)
                self._fen.add(self._rank[b], 1)
            else:
                self._members.discard(b)
                self._fen.add(self._rank[b], -1)
        self._cut = new

    # ------------------------------------------------------------------ the decision
    def select(
        self,
        brokers: Mapping[str, BrokerInfo],
        rng: random.Random,
        *,
        now_ms: int,
        load_ttl_s: float,
        max_topics: int,
        prefer_later_versions: bool,
        exclude: frozenset[str],
        diff: float,
    ) -> Selection | None:
        """What ``select_broker(bundle, brokers, ctx, rng, diff=diff)`` answers -- the default filters, no
        placement rule, ``ctx`` built of these arguments and the live loads -- drawing the same random
        numbers; None when this case is not indexed (see the module docstring) and nothing was drawn."""
        settings = (load_ttl_s * 1000, max_topics, prefer_later_versions)
        if brokers is not self._brokers or settings != self._settings or now_ms < self._now:
            self._settings = settings
            self._rebuild(brokers, now_ms, prefer_later_versions)
        else:
            self._now = now_ms
            with self._lock:
                dirty, self._dirty = self._dirty, set()
            for b in dirty:
                self._score(b)
            self._expire(settings[0])
        if prefer_later_versions and len(self._versions) > 1:
            return None
        rank = self._rank
        out = sorted(rank[b] for b in exclude if b in rank)
        candidates = len(self._names) - len(out)
        if candidates <= 0:
            return Selection(None, 0, [], "no_brokers")
        if self._odd or not self._full.issubset(exclude):
            return None
        scored = self._scored
        gone = [b for b in exclude if b in scored]
        n = len(scored) - len(gone)
        if n > 0:
            total = self._sum - sum(scored[b][3] for b in gone)
            limit = total / _SCALE / n + _TOLERANCE  # fsum(scores) / n + tolerance, bit for bit
            by_ema, lo, hi = self._by_ema, 0, len(self._by_ema)
            while lo < hi:  # the first score not in the best set (ema + diff grows with ema)
                mid = (lo + hi) // 2
                if by_ema[mid][0] + diff <= limit:
                    lo = mid + 1
                else:
                    hi = mid
            self._move_cut(by_ema[lo] if lo < len(by_ema) else None)
            hidden = [b for b in gone if b in self._members]
            best = len(self._members) - len(hidden)
            if best > 0:
                for b in hidden:
                    self._fen.add(rank[b], -1)
                try:
                    pick = self._names[self._fen.kth(rng.choice(range(best)))]
                finally:
                    for b in hidden:
                        self._fen.add(rank[b], 1)
                return Selection(pick, candidates, [], "selected")
        j = rng.choice(range(candidates))
        for r in out:  # the j-th id of those not excluded
            if r <= j:
                j += 1
        return Selection(self._names[j], candidates, [], "selected")
