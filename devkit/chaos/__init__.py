"""The chaos suite's product code: the history checker and the run report.

Faults are injected into a local cluster while clients keep looking bundles up; afterwards the simulated
brokers' timelines are the ground truth. :mod:`.history` merges them and measures what matters (no bundle
ever served twice at once, how long bundles went unserved, which were lost); :mod:`.report` wraps one run's
verdict as JSON and as the markdown tables of docs/reliability.md.
"""

from trimtab.devkit.chaos.history import (
    KILLED,
    OPEN_END,
    DoubleServing,
    Gap,
    History,
    Interval,
    Summary,
    coverage,
    double_serving,
    load_history,
    lost_bundles,
    nearest_rank,
    summarize,
    unserved_gaps,
)
from trimtab.devkit.chaos.report import ChaosReport, Fault, markdown_table

__all__ = [
    "KILLED",
    "OPEN_END",
    "ChaosReport",
    "DoubleServing",
    "Fault",
    "Gap",
    "History",
    "Interval",
    "Summary",
    "coverage",
    "double_serving",
    "load_history",
    "lost_bundles",
    "markdown_table",
    "nearest_rank",
    "summarize",
    "unserved_gaps",
]
