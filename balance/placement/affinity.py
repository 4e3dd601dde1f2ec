"""Anti-affinity groups and failure domains (PIP-7): spread a group's bundles over domains, then brokers.

The filter is a pure function of the candidates, the group's per-broker counts and (when failure domains
are on) each broker's domain, so the shedder's "may this bundle move" questions reuse it unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import compress, repeat

from trimtab.balance.placement.model import DEFAULT_DOMAIN


def group_key(group: str | None) -> str | None:
    """The comparable form of an anti-affinity group: case-folded, or None for no group.

    Pulsar compares groups with ``equalsIgnoreCase`` and treats a blank group as none; case-folding once
    here lets every later comparison be a plain dict lookup.
    """
    if group is None or not group.strip():
        return None
    return group.casefold()


def anti_affinity_filter(
    candidates: Sequence[str],
    counts: Mapping[str, int],
    domain_of: Mapping[str, str | None] | None,
) -> list[str]:
    """Keep the candidates that hold the fewest of the group's bundles -- per domain, then per broker.

    ``counts`` is the group's bundles per broker (absent = 0), *excluding* the bundle being placed or moved.
    ``domain_of`` is None when the domain step is off (failure domains disabled, or no broker in any
    domain); otherwise brokers it does not map (or maps to None) pool in :data:`DEFAULT_DOMAIN`.

    Domain totals are summed over the *candidates only* (Pulsar: a domain whose brokers were filtered out
    does not compete), and ties survive at both levels -- the load-based choice breaks them. The input
    order is kept, and a non-empty input never comes back empty.
    """
    if not candidates:
        return []
    kept = list(candidates)
    if domain_of is not None:
        totals: dict[str, int] = {}
        dom = {}
        for b in kept:
            d = domain_of.get(b) or DEFAULT_DOMAIN
            dom[b] = d
            totals[d] = totals.get(d, 0) + counts.get(b, 0)
        least_domain = min(totals.values())
        kept = [b for b in kept if totals[dom[b]] == least_domain]
    least = min(counts.get(b, 0) for b in kept)
    return [b for b in kept if counts.get(b, 0) == least]


class CandidateLayout:
    """One isolation candidate set laid out by failure domain, so the filter above runs at C speed.

    Built once per (policy, candidate set): brokers sorted by (domain, id) so each domain is a contiguous
    slice. :meth:`filter` then reads the counts with one ``map``, sums each domain's slice and keeps the
    minimum with ``compress`` -- the same answer as :func:`anti_affinity_filter` (the property tests hold
    both to one reference), about five times faster for 64 brokers, which is what lets a placement pass
    that moves a bundle between every question stay under a second for 100 000 bundles.
    """

    __slots__ = ("_order", "_pos", "_slices")

    def __init__(self, candidates: Sequence[str], domain_of: Mapping[str, str | None] | None) -> None:
        if domain_of is None:
            order = sorted(candidates)
            slices = [(0, len(order))]
        else:
            keyed = sorted((domain_of.get(b) or DEFAULT_DOMAIN, b) for b in candidates)
            order = [b for _, b in keyed]
            slices = []
            start = 0
            for i in range(1, len(keyed) + 1):
                if i == len(keyed) or keyed[i][0] != keyed[start][0]:
                    slices.append((start, i))
                    start = i
        self._order = tuple(order)
        self._slices = tuple(slices)
        self._pos = {b: i for i, b in enumerate(order)}

    def filter(self, counts: Mapping[str, int], minus: str | None = None) -> tuple[str, ...]:
        """The survivors, sorted by id; ``minus`` (the bundle's own owner) counts one bundle less."""
        order = self._order
        if not order:
            return ()
        cs = list(map(counts.get, order, repeat(0)))
        if minus is not None:
            i = self._pos.get(minus)
            if i is not None:
                cs[i] -= 1
        slices = self._slices
        if len(slices) == 1:  # no domain step
            least = min(cs)
            return tuple(compress(order, map(least.__eq__, cs)))
        totals = [sum(cs[s:e]) for s, e in slices]
        least_total = min(totals)
        if totals.count(least_total) == 1:  # one emptiest domain: its slice is already in id order
            s, e = slices[totals.index(least_total)]
            sub = cs[s:e]
            least = min(sub)
            return tuple(compress(order[s:e], map(least.__eq__, sub)))
        kept = [sl for sl, t in zip(slices, totals, strict=True) if t == least_total]
        least = min(min(cs[s:e]) for s, e in kept)
        return tuple(sorted(b for s, e in kept for b in compress(order[s:e], map(least.__eq__, cs[s:e]))))
