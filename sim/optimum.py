"""The exact minimum number of bundle moves that balances a cluster: the yardstick for the shedders (issue 11).

Every broker ``b`` must end with a utilisation ``sum(load of its bundles) / capacity[b]`` within
``[avg - band, avg + band]``, where ``avg = total load / total capacity``. ``avg`` does not depend on the
assignment, so this is a linear problem: a MILP over binaries ``x[i, b]`` (bundle ``i`` on broker ``b``)::

    minimise    sum_i (1 - x[i, owner(i)])                      (bundles that leave their owner)
    subject to  sum_b x[i, b] = 1                               for every bundle
                (avg - band) cap_b <= sum_i load_i x[i, b] <= (avg + band) cap_b    for every broker

solved with SciPy's HiGHS (``scipy.optimize.milp``; SciPy is the ``sim`` extra and is imported only when
:func:`min_moves` runs). A bundle whose owner is not among the brokers (a dead broker's) always counts as a
move. :func:`brute_force_min_moves` answers the same question by enumeration, for tests on tiny instances.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

# Slack on each band bound, as a fraction of the total load: a utilisation exactly on the band's edge counts
# as inside for both solvers despite rounding (HiGHS's own feasibility tolerance is 1e-7 on top of it).
_TOL = 1e-9
_BRUTE_FORCE_LIMIT = 10**6


@dataclass(frozen=True)
class Optimum:
    moves: int | None  # None: no assignment satisfies the band (or none was found in time)
    status: str  # optimal | infeasible | time_limit
    assignment: dict[str, str] = field(default_factory=dict)  # bundle -> broker; empty if none
    seconds: float = 0.0  # wall-clock solve time: not deterministic, keep it out of compared output


def _bounds(
    bundle_load: Mapping[str, float], capacity: Mapping[str, float], band: float
) -> tuple[list[str], list[str], float, dict[str, tuple[float, float]]]:
    """(bundles, brokers, total load, broker -> (lo, hi) bound on its load, widened by the tolerance)."""
    if not capacity:
        raise ValueError("no brokers")
    if any(c <= 0 for c in capacity.values()):
        raise ValueError("every broker needs a positive capacity")
    if band < 0:
        raise ValueError("band must be >= 0")
    if any(v < 0 for v in bundle_load.values()):
        raise ValueError("bundle loads must be >= 0")
    bundles, brokers = sorted(bundle_load), sorted(capacity)
    total = sum(bundle_load[i] for i in bundles)
    avg = total / sum(capacity[b] for b in brokers)
    slack = _TOL * max(total, 1.0)
    return (
        bundles,
        brokers,
        total,
        {b: ((avg - band) * capacity[b] - slack, (avg + band) * capacity[b] + slack) for b in brokers},
    )


def _moves(assignment: Mapping[str, str], owner: Mapping[str, str]) -> int:
    return sum(1 for i, b in assignment.items() if owner.get(i) != b)


def min_moves(
    bundle_load: Mapping[str, float],
    owner: Mapping[str, str],
    capacity: Mapping[str, float],
    band: float,
    *,
    time_limit_s: float = 10.0,
) -> Optimum:
    """The fewest bundles to move so that every broker's utilisation is within ``avg +- band`` (HiGHS MILP).

    ``bundle_load``: bundle -> load (any unit, the same as ``capacity``); ``owner``: bundle -> its broker now;
    ``capacity``: broker -> capacity (> 0); ``band``: allowed deviation of utilisation from the average.
    ``status`` is ``time_limit`` when HiGHS stopped early: ``moves`` is then the best assignment found so far
    (not proven minimal), or None.
    """
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_array

    start = time.perf_counter()
    bundles, brokers, total, bounds = _bounds(bundle_load, capacity, band)
    nb, nk = len(bundles), len(brokers)
    if nb == 0:
        feasible = all(lo <= 0.0 <= hi for lo, hi in bounds.values())
        return Optimum(0 if feasible else None, "optimal" if feasible else "infeasible", {}, 0.0)
    scale = total if total > 0 else 1.0  # loads as fractions of the total: tolerances are absolute in HiGHS

    # variable i * nk + k: bundle i on broker k
    index = {b: k for k, b in enumerate(brokers)}
    c = np.zeros(nb * nk)
    for i, name in enumerate(bundles):
        k = index.get(owner.get(name, ""))
        if k is not None:
            c[i * nk + k] = -1.0  # moves = owned - sum of x[i, owner(i)] + the orphans
    rows, cols, vals = [], [], []
    for i in range(nb):  # each bundle on exactly one broker
        for k in range(nk):
            rows.append(i)
            cols.append(i * nk + k)
            vals.append(1.0)
    for k in range(nk):  # the band, per broker
        for i, name in enumerate(bundles):
            rows.append(nb + k)
            cols.append(i * nk + k)
            vals.append(bundle_load[name] / scale)
    a = coo_array((vals, (rows, cols)), shape=(nb + nk, nb * nk)).tocsr()
    lo = np.concatenate([np.ones(nb), [bounds[b][0] / scale for b in brokers]])
    hi = np.concatenate([np.ones(nb), [bounds[b][1] / scale for b in brokers]])
    for presolve in (True, False):
        with _native_stdout_silenced():
            res = milp(
                c,
                constraints=LinearConstraint(a, lo, hi),
                integrality=np.ones(nb * nk),
                bounds=Bounds(0, 1),
                options={"time_limit": time_limit_s, "mip_rel_gap": 0.0, "presolve": presolve, "disp": False},
            )
        if res.status != 4:
            break
        # "Solve error": HiGHS 1.x (SciPy 1.17) ends some tiny infeasible instances this way after presolve;
        # the same model without presolve is answered (tests/unit/test_optimum.py keeps such cases).
    seconds = time.perf_counter() - start
    assignment: dict[str, str] = {}
    if res.x is not None:
        x = np.asarray(res.x).reshape(nb, nk)
        assignment = {name: brokers[int(np.argmax(x[i]))] for i, name in enumerate(bundles)}
    if res.status == 0:
        return Optimum(_moves(assignment, owner), "optimal", assignment, seconds)
    if res.status == 2:
        return Optimum(None, "infeasible", {}, seconds)
    if res.status == 1:  # time (or iteration) limit
        return Optimum(_moves(assignment, owner) if assignment else None, "time_limit", assignment, seconds)
    raise RuntimeError(f"HiGHS: {res.message} (status {res.status})")


@contextmanager
def _native_stdout_silenced() -> Iterator[None]:
    """Send file descriptor 1 to /dev/null meanwhile: HiGHS prints a stray debug line
    ("HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();", ERGO-Code/HiGHS#2783) with
    printf whatever its options say, and ``trimtab sim --json`` owns stdout. C's buffer is flushed before the
    descriptor is given back, so the line cannot surface later."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no real stdout (captured, closed): nothing to guard
        yield
        return
    sys.stdout.flush()
    saved = os.dup(fd)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), fd)
        try:
            yield
        finally:
            _flush_c_stdio()
            os.dup2(saved, fd)
    finally:
        os.close(saved)


def _flush_c_stdio() -> None:
    # No C runtime to reach this way (not Linux/macOS): then there is nothing we could flush either.
    with suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(None).fflush(None)


def brute_force_min_moves(
    bundle_load: Mapping[str, float],
    owner: Mapping[str, str],
    capacity: Mapping[str, float],
    band: float,
) -> Optimum:
    """:func:`min_moves` by enumeration, fewest moves first: for tests on tiny instances only (it refuses
    more than a million assignments; 7 bundles on 3 brokers are 2187)."""
    start = time.perf_counter()
    bundles, brokers, _, bounds = _bounds(bundle_load, capacity, band)
    if len(brokers) ** len(bundles) > _BRUTE_FORCE_LIMIT:
        raise ValueError(f"{len(bundles)} bundles on {len(brokers)} brokers: too many to enumerate")
    forced = [i for i in bundles if owner.get(i) not in capacity]  # owner gone: they move whatever we do
    free = [i for i in bundles if owner.get(i) in capacity]

    def fits(assignment: Mapping[str, str]) -> bool:
        load = dict.fromkeys(brokers, 0.0)
        for i, b in assignment.items():
            load[b] += bundle_load[i]
        return all(bounds[b][0] <= load[b] <= bounds[b][1] for b in brokers)

    for k in range(len(free) + 1):
        for movers in itertools.combinations(free, k):
            stay = {i: owner[i] for i in free if i not in movers}
            choices = [[b for b in brokers if b != owner[i]] for i in movers] + [brokers for _ in forced]
            for targets in itertools.product(*choices):
                assignment = {**stay, **dict(zip([*movers, *forced], targets, strict=True))}
                if fits(assignment):
                    return Optimum(k + len(forced), "optimal", assignment, time.perf_counter() - start)
    return Optimum(None, "infeasible", {}, time.perf_counter() - start)
