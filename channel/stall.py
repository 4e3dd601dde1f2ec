"""When a reader has stalled: records to read, none read, for long enough that no fetch is on its way.

A client library can stop fetching a partition it was assigned and report nothing -- librdkafka has done
so after every broker of a cluster restarted (its issues 4492 and 5153; here a node that stopped reading the
channel while the others went on, and lookups that waited for records it never read). No error reaches the
follower, so it must see the stall itself, from two facts it can read: its own positions, and the
partition's end.

The rule (:class:`StallWatch`): a partition whose position has not moved for :data:`STALL_AFTER_S` is asked
for its end; when that end is beyond the position, and :data:`STALL_AFTER_S` later the position still has
not moved, the partition is stalled -- records that were in the log all that time were not fetched. A
partition read to its end is idle, not stalled, and is asked again only after another
:data:`STALL_AFTER_S`; an end that cannot be read (the log unreachable) is no stall either, and the others'
ends are not asked in that round, so an outage costs one bounded query per interval. Pure: the clock and
the end query are passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

#: How long a partition's position must stay unmoved, twice over (before its end is asked, and after an
#: end beyond it was read), before its reader counts as stalled.
STALL_AFTER_S = 10.0
#: How often a following reader runs the watch (a clock read per poll otherwise).
STALL_CHECK_S = 2.5


class StallWatch:
    def __init__(self, after_s: float = STALL_AFTER_S) -> None:
        self.after_s = after_s
        # partition -> (position last seen, since when it has been that, or since it was last found idle)
        self._seen: dict[int, tuple[int, float]] = {}
        # partition -> (an end read beyond the position, when it was read)
        self._behind: dict[int, tuple[int, float]] = {}

    def check(
        self, positions: Mapping[int, int], now: float, end_of: Callable[[int], int | None]
    ) -> dict[int, tuple[int, int]]:
        """The stalled partitions: partition -> (position, the end it has not reached). ``end_of(p)`` is
        the partition's end now, or None when it cannot be read."""
        idle: list[int] = []
        for p, pos in positions.items():
            seen = self._seen.get(p)
            if seen is None or seen[0] != pos:
                self._seen[p] = (pos, now)
                self._behind.pop(p, None)
            elif now - seen[1] >= self.after_s:
                idle.append(p)
        stalled: dict[int, tuple[int, int]] = {}
        asking = True
        for p in idle:
            pos = positions[p]
            behind = self._behind.get(p)
            if behind is not None:
                if now - behind[1] >= self.after_s:
                    stalled[p] = (pos, behind[0])
                continue
            end = end_of(p) if asking else None
            if end is None:
                asking = False  # unreachable: the others are not asked this round
                self._seen[p] = (pos, now)
            elif end > pos:
                self._behind[p] = (end, now)
            else:
                self._seen[p] = (pos, now)  # read to its end: idle; asked again after after_s
        return stalled

    def reset(self) -> None:
        """A new reader: every partition's clock starts again."""
        self._seen.clear()
        self._behind.clear()
