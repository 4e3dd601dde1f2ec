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

:func:`min_moves_std` asks what the simulator's report calls balanced -- the std of the utilisations at most
a target, which a band of the same width implies but does not need -- by cutting planes over the same
MILP (see its docstring); :func:`brute_force_min_moves_std` checks it.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

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


def _assignment_model(
    bundles: list[str], brokers: list[str], owner: Mapping[str, str]
) -> tuple[Any, list[int], list[int], list[float]]:
    """The objective (bundles that leave their owner) and the rows "each bundle on exactly one broker" of the
    model over binaries ``x[i * len(brokers) + k]`` (bundle ``i`` on broker ``k``)."""
    import numpy as np

    nk = len(brokers)
    index = {b: k for k, b in enumerate(brokers)}
    c = np.zeros(len(bundles) * nk)
    for i, name in enumerate(bundles):
        k = index.get(owner.get(name, ""))
        if k is not None:
            c[i * nk + k] = -1.0  # moves = owned - sum of x[i, owner(i)] + the orphans
    rows, cols, vals = [], [], []
    for i in range(len(bundles)):
        for k in range(nk):
            rows.append(i)
            cols.append(i * nk + k)
            vals.append(1.0)
    return c, rows, cols, vals


def _solve(c: Any, a: Any, lo: Any, hi: Any, time_limit_s: float) -> Any:
    """HiGHS on the binary program ``min c.x, lo <= a.x <= hi``; its result (``status``: 0 optimal,
    1 time limit, 2 infeasible)."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp

    res = None
    for presolve in (True, False):
        with _native_stdout_silenced():
            res = milp(
                c,
                constraints=LinearConstraint(a, lo, hi),
                integrality=np.ones(len(c)),
                bounds=Bounds(0, 1),
                options={"time_limit": time_limit_s, "mip_rel_gap": 0.0, "presolve": presolve, "disp": False},
            )
        if res.status != 4:
            break
        # "Solve error": HiGHS 1.x (SciPy 1.17) ends some tiny infeasible instances this way after presolve;
        # the same model without presolve is answered (tests/unit/test_optimum.py keeps such cases).
    if res is None or res.status not in (0, 1, 2):
        raise RuntimeError(f"HiGHS: {getattr(res, 'message', '')} (status {getattr(res, 'status', None)})")
    return res


def _decode(res: Any, bundles: list[str], brokers: list[str]) -> dict[str, str]:
    import numpy as np

    if res.x is None:
        return {}
    x = np.asarray(res.x).reshape(len(bundles), len(brokers))
    return {name: brokers[int(np.argmax(x[i]))] for i, name in enumerate(bundles)}


def _outcome(res: Any, assignment: dict[str, str], owner: Mapping[str, str], seconds: float) -> Optimum:
    if res.status == 0:
        return Optimum(_moves(assignment, owner), "optimal", assignment, seconds)
    if res.status == 2:
        return Optimum(None, "infeasible", {}, seconds)
    # time (or iteration) limit: the best assignment found so far, not proven minimal
    return Optimum(_moves(assignment, owner) if assignment else None, "time_limit", assignment, seconds)


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
    from scipy.sparse import coo_array

    start = time.perf_counter()
    bundles, brokers, total, bounds = _bounds(bundle_load, capacity, band)
    nb, nk = len(bundles), len(brokers)
    if nb == 0:
        feasible = all(lo <= 0.0 <= hi for lo, hi in bounds.values())
        return Optimum(0 if feasible else None, "optimal" if feasible else "infeasible", {}, 0.0)
    scale = total if total > 0 else 1.0  # loads as fractions of the total: tolerances are absolute in HiGHS
    c, rows, cols, vals = _assignment_model(bundles, brokers, owner)
    for k in range(nk):  # the band, per broker
        for i, name in enumerate(bundles):
            rows.append(nb + k)
            cols.append(i * nk + k)
            vals.append(bundle_load[name] / scale)
    a = coo_array((vals, (rows, cols)), shape=(nb + nk, nb * nk)).tocsr()
    lo = np.concatenate([np.ones(nb), [bounds[b][0] / scale for b in brokers]])
    hi = np.concatenate([np.ones(nb), [bounds[b][1] / scale for b in brokers]])
    res = _solve(c, a, lo, hi, time_limit_s)
    return _outcome(res, _decode(res, bundles, brokers), owner, time.perf_counter() - start)


def utilisation_std(
    assignment: Mapping[str, str], bundle_load: Mapping[str, float], capacity: Mapping[str, float]
) -> float:
    """Population standard deviation of the brokers' utilisation (load / capacity) -- the simulator's
    balance measure (``Sample.std``) -- under ``assignment`` (bundles on unknown brokers are ignored)."""
    load = dict.fromkeys(capacity, 0.0)
    for i, b in assignment.items():
        if b in load:
            load[b] += bundle_load[i]
    u = [load[b] / capacity[b] for b in sorted(capacity)]
    avg = math.fsum(u) / len(u)
    return math.sqrt(math.fsum((x - avg) ** 2 for x in u) / len(u))


def min_moves_std(
    bundle_load: Mapping[str, float],
    owner: Mapping[str, str],
    capacity: Mapping[str, float],
    target_std: float,
    *,
    time_limit_s: float = 30.0,
    max_cuts: int = 500,
) -> Optimum:
    """The fewest bundles to move so that the std of the brokers' utilisation is at most ``target_std`` --
    the simulator's own "balanced" (:func:`min_moves` asks for a band, which is stricter).

    The variance of the utilisations is a convex quadratic of the assignment, so HiGHS (a MILP solver) gets
    it by outer approximation: solve without it, and while the answer's variance is above the target add
    the tangent plane at that answer as a linear cut and solve again. A tangent never cuts off an assignment
    that meets the target (convexity), and it always cuts off the answer it was made at, so the first answer
    that meets the target is the minimum. ``status`` is ``time_limit`` after ``time_limit_s`` in all or
    ``max_cuts`` cuts: ``moves`` is then None (no assignment meeting the target was proven minimal).
    """
    import numpy as np
    from scipy.sparse import coo_array

    start = time.perf_counter()
    if target_std < 0:
        raise ValueError("target_std must be >= 0")
    bundles, brokers, _, _ = _bounds(bundle_load, capacity, 0.0)
    nb, nk = len(bundles), len(brokers)
    limit = target_std * target_std + _TOL
    if nb == 0:
        ok = utilisation_std({}, bundle_load, capacity) ** 2 <= limit
        return Optimum(0 if ok else None, "optimal" if ok else "infeasible", {}, 0.0)
    c, rows, cols, vals = _assignment_model(bundles, brokers, owner)
    # u[k] = sum_i w[i, k] x[i, k]: broker k's utilisation
    w = np.array([[bundle_load[name] / capacity[b] for b in brokers] for name in bundles])
    cuts: list[np.ndarray] = []  # coefficients over x
    bounds: list[float] = []
    while True:
        elapsed = time.perf_counter() - start
        if elapsed > time_limit_s or len(cuts) > max_cuts:
            return Optimum(None, "time_limit", {}, elapsed)
        r, cl, v = list(rows), list(cols), list(vals)
        for j, coef in enumerate(cuts):
            nz = np.nonzero(coef)[0]
            r.extend([nb + j] * len(nz))
            cl.extend(nz.tolist())
            v.extend(coef[nz].tolist())
        a = coo_array((v, (r, cl)), shape=(nb + len(cuts), nb * nk)).tocsr()
        lo = np.concatenate([np.ones(nb), np.full(len(cuts), -np.inf)])
        hi = np.concatenate([np.ones(nb), np.asarray(bounds, dtype=float)])
        res = _solve(c, a, lo, hi, max(time_limit_s - elapsed, 0.1))
        if res.status == 2:
            return Optimum(None, "infeasible", {}, time.perf_counter() - start)
        if res.status != 0:
            return Optimum(None, "time_limit", {}, time.perf_counter() - start)
        assignment = _decode(res, bundles, brokers)
        x = np.zeros((nb, nk))
        for i, name in enumerate(bundles):
            x[i, brokers.index(assignment[name])] = 1.0
        u = (w * x).sum(axis=0)
        dev = u - u.mean()
        var = float(dev @ dev) / nk
        if var <= limit:
            return Optimum(_moves(assignment, owner), "optimal", assignment, time.perf_counter() - start)
        # Tangent of var(u) = |u - mean(u)|^2 / n at u*: var(u*) + (2/n) dev* . (u - u*) <= target^2,
        # i.e. (2/n) dev* . u <= target^2 - var(u*) + (2/n) dev* . u*, with u linear in x.
        g = 2.0 * dev / nk
        cuts.append((w * g).ravel())
        bounds.append(limit - var + float(g @ u))


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
    _, brokers, _, bounds = _bounds(bundle_load, capacity, band)

    def fits(assignment: Mapping[str, str]) -> bool:
        load = dict.fromkeys(brokers, 0.0)
        for i, b in assignment.items():
            load[b] += bundle_load[i]
        return all(bounds[b][0] <= load[b] <= bounds[b][1] for b in brokers)

    return _brute_force(bundle_load, owner, capacity, fits)


def brute_force_min_moves_std(
    bundle_load: Mapping[str, float],
    owner: Mapping[str, str],
    capacity: Mapping[str, float],
    target_std: float,
) -> Optimum:
    """:func:`min_moves_std` by enumeration, for tests on tiny instances only."""
    limit = target_std * target_std + _TOL
    return _brute_force(
        bundle_load, owner, capacity, lambda a: utilisation_std(a, bundle_load, capacity) ** 2 <= limit
    )


def _brute_force(
    bundle_load: Mapping[str, float],
    owner: Mapping[str, str],
    capacity: Mapping[str, float],
    fits: Callable[[Mapping[str, str]], bool],
) -> Optimum:
    start = time.perf_counter()
    bundles, brokers = sorted(bundle_load), sorted(capacity)
    if len(brokers) ** len(bundles) > _BRUTE_FORCE_LIMIT:
        raise ValueError(f"{len(bundles)} bundles on {len(brokers)} brokers: too many to enumerate")
    forced = [i for i in bundles if owner.get(i) not in capacity]  # owner gone: they move whatever we do
    free = [i for i in bundles if owner.get(i) in capacity]
    for k in range(len(free) + 1):
        for movers in itertools.combinations(free, k):
            stay = {i: owner[i] for i in free if i not in movers}
            choices = [[b for b in brokers if b != owner[i]] for i in movers] + [brokers for _ in forced]
            for targets in itertools.product(*choices):
                assignment = {**stay, **dict(zip([*movers, *forced], targets, strict=True))}
                if fits(assignment):
                    return Optimum(k + len(forced), "optimal", assignment, time.perf_counter() - start)
    return Optimum(None, "infeasible", {}, time.perf_counter() - start)
