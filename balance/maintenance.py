"""Maintenance: planned work on a broker, not a failure (issue 32 point 4). Pure rules; the controller's
``Admin.maintenance_start`` / ``maintenance_end`` carry them out.

Why a budget per failure domain: Helix counts every offline host against one budget whatever the cause. A
rolling upgrade takes brokers out on purpose, one failure domain at a time; the budget keeps an operator (or
a script) from taking a whole rack out at once, and says so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping


def domain_key(broker: str, domains: Mapping[str, str | None]) -> str:
    """The failure domain ``broker`` counts in: its own, or -- without one -- itself alone."""
    d = domains.get(broker)
    return f"domain {d}" if d else f"broker {broker} (no failure domain)"


def budget_refusal(
    broker: str, domains: Mapping[str, str | None], in_maintenance: Iterable[str], max_per_domain: int
) -> str | None:
    """Why ``broker`` may not go into maintenance now (its failure domain's budget is used up), or None."""
    key = domain_key(broker, domains)
    busy = sorted(b for b in in_maintenance if b != broker and domain_key(b, domains) == key)
    if len(busy) >= max_per_domain:
        return (
            f"{key} has {len(busy)} broker(s) in maintenance already ({', '.join(busy)}); "
            f"operations.maintenance_max_per_domain is {max_per_domain}: end one first"
        )
    return None


#: The longest maintenance deadline accepted: a week.
MAX_DEADLINE_S = 7 * 24 * 3600.0


def deadline_refusal(deadline_s: float) -> str | None:
    if not (math.isfinite(deadline_s) and deadline_s <= MAX_DEADLINE_S):
        return f"the deadline must be a number of seconds up to {MAX_DEADLINE_S:g}, not {deadline_s:g}"
    if not deadline_s > 0:
        return f"the deadline must be a positive number of seconds, not {deadline_s:g}"
    return None
