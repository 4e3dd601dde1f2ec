"""When this node first saw each in-flight record, by its own monotonic clock.

An in-flight record (``Assigning``, ``Releasing``, ``Splitting``) has a deadline: the leader's monitor
forces it onward once it is older than ``channel.in_flight_timeout_s``, and the broker it is on its way to
may serve it under a lease only until shortly before then. "Older" was measured from the record's ``ts``,
stamped by its writer's wall clock and read against the reader's -- so a writer or reader whose clock is
stepped moves every deadline by the size of the step:

* a writer 30 s **ahead** makes its records look 30 s younger: an agent would grant its broker a lease 30 s
  longer than the monitor waits (two brokers serving);
* a writer 30 s **behind**, or a leader ahead, makes them look 30 s older: the monitor would force them
  onward at once (a bundle moved away from a broker that was taking it over).

Each reader therefore also measures the age from when it saw the record, on a clock no step moves, and
takes the side that is safe for what it decides: the monitor acts only when **both** ages passed the
timeout (it never waits less than the timeout after seeing the record, whatever the writer's clock); an
agent bounds its broker's lease by the **greater** age (the writer's clock ahead cannot lengthen it). The
remaining exposure needs two faults at once: an agent both lagging the leader and behind the writer's
clock by more than ``broker.adapter.lease_margin_s`` (docs/reliability.md).

Records first met while the table was not live (bootstrap, a history gap) count as seen when first asked
about: later than they were written, which is the monitor's safe side; for the agent, the writer's age
still bounds the lease.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from trimtab.channel.records import Record


class InFlightClock:
    """First-seen monotonic times of in-flight records, by bundle; a table listener keeps it current.

    Only in-flight records are remembered (a record that settles is forgotten), so it holds as many entries
    as there are moves under way. Read from any thread; written by the table's feeder (single dict
    operations, atomic under the GIL)."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.monotonic = monotonic
        self._seen: dict[str, tuple[int, float]] = {}

    def on_change(self, bundle: str, old: Record | None, new: Record | None) -> None:
        """The table's listener: a new in-flight version is seen now; anything else is forgotten."""
        if new is not None and new.state.in_flight:
            self._seen[bundle] = (new.version, self.monotonic())
        else:
            self._seen.pop(bundle, None)

    def age_s(self, bundle: str, rec: Record) -> float:
        """Seconds since this node first saw ``rec`` (this version of ``bundle``); 0 the first time."""
        now = self.monotonic()
        seen = self._seen.get(bundle)
        if seen is None or seen[0] != rec.version:
            self._seen[bundle] = (rec.version, now)
            return 0.0
        return max(0.0, now - seen[1])

    def __len__(self) -> int:
        return len(self._seen)


def wall_age_s(rec: Record, now_ms: int) -> float:
    """The record's age by its writer's wall clock read against ours (negative: the writer is ahead)."""
    return (now_ms - rec.ts) / 1000.0
