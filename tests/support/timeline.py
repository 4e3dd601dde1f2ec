"""Merged simulated-broker timelines and the single-owner check, for the integration tests.

The logic lives in :mod:`trimtab.devkit.chaos.history` (the chaos suite's history checker, which also
measures double-serving windows and unserved gaps); this module keeps the names the tests import.
"""

from trimtab.devkit.chaos.history import (
    INTERVAL_ENDS,
    KILLED,
    OPEN_END,
    Event,
    Interval,
    check_single_owner,
    first,
    last,
    merged,
    overlaps,
    serving_intervals,
)

__all__ = [
    "INTERVAL_ENDS",
    "KILLED",
    "OPEN_END",
    "Event",
    "Interval",
    "check_single_owner",
    "first",
    "last",
    "merged",
    "overlaps",
    "serving_intervals",
]
