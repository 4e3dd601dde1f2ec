"""When the leader's jobs run: one place for the controller daemon and the simulator, which runs the same
jobs on the same :class:`~trimtab.cluster.runner.Schedule` (a tuning answer is only as good as this match).
"""

from __future__ import annotations

import asyncio

from trimtab.cluster.runner import Schedule

#: Healing's resync when nothing wakes it, and the pause after a round that coalesces a burst of channel
#: events into the next one.
HEALING_EVERY_S = 1.0
HEALING_PAUSE_S = 0.1


def periodic(every_s: float) -> Schedule:
    """A periodic leader job (snapshots, monitor, shedding, standbys): the first run one interval after
    taking over, as Pulsar's ``UnloadScheduler`` does."""
    return Schedule(every_s, first="after")


def healing(wake: asyncio.Event) -> Schedule:
    """Healing runs when membership or the channel changes (``wake``), and at least every second."""
    return Schedule(HEALING_EVERY_S, wake=wake, pause_s=HEALING_PAUSE_S)
