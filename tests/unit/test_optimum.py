"""The exact minimum number of moves (sim/optimum.py): the HiGHS MILP against brute force and by hand."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trimtab.sim.optimum import (
    Optimum,
    brute_force_min_moves,
    brute_force_min_moves_std,
    min_moves,
    min_moves_std,
    utilisation_std,
)


def assert_valid(
    opt: Optimum, load: Mapping[str, float], owner: Mapping[str, str], cap: Mapping[str, float], band: float
) -> None:
    """A solution's assignment places every bundle, keeps every broker in the band, and has ``moves`` moves."""
    assert opt.status == "optimal" and opt.moves is not None
    assert set(opt.assignment) == set(load)
    assert sum(1 for i, b in opt.assignment.items() if owner.get(i) != b) == opt.moves
    avg = sum(load.values()) / sum(cap.values())
    for b, c in cap.items():
        u = sum(load[i] for i, x in opt.assignment.items() if x == b) / c
        assert avg - band - 1e-6 <= u <= avg + band + 1e-6


# ----------------------------------------------------------------------------------------------- by hand


def test_already_balanced_needs_no_move() -> None:
    # a: 3 + 3 on capacity 1, b: 6 on capacity 1; avg 6, both exactly on it
    load = {"x": 3.0, "y": 3.0, "z": 6.0}
    owner = {"x": "a", "y": "a", "z": "b"}
    cap = {"a": 1.0, "b": 1.0}
    for solve in (min_moves, brute_force_min_moves):
        opt = solve(load, owner, cap, 0.0)
        assert (opt.moves, opt.status, opt.assignment) == (0, "optimal", owner)


def test_one_obvious_move() -> None:
    # a holds 4 x 1, b nothing: avg 2; band .5 -> each needs a load in [1.5, 2.5]: exactly two bundles each.
    # Moving two bundles is the minimum (one leaves a at 3).
    load = {f"t{i}": 1.0 for i in range(4)}
    owner = dict.fromkeys(load, "a")
    cap = {"a": 1.0, "b": 1.0}
    opt = min_moves(load, owner, cap, 0.5)
    assert opt.moves == 2
    assert_valid(opt, load, owner, cap, 0.5)
    # a heavy bundle on a, a light one on b, a medium one on a: a 7 (5 + 2), b 1; avg 4, band 1 ->
    # [3, 5] each: moving the 2 to b gives a 5, b 3. One move.
    load = {"heavy": 5.0, "medium": 2.0, "light": 1.0}
    owner = {"heavy": "a", "medium": "a", "light": "b"}
    opt = min_moves(load, owner, cap, 1.0)
    assert opt.moves == 1 and opt.assignment == {"heavy": "a", "medium": "b", "light": "b"}


def test_capacities_weight_the_utilisation() -> None:
    # total 6 on capacity 3: avg 2. a (capacity 2) must carry [3.8, 4.2], b (capacity 1) [1.9, 2.1]
    load = {"p": 4.0, "q": 2.0}
    cap = {"a": 2.0, "b": 1.0}
    assert min_moves(load, {"p": "b", "q": "a"}, cap, 0.1).moves == 2
    assert min_moves(load, {"p": "a", "q": "a"}, cap, 0.1).moves == 1


def test_infeasible() -> None:
    # one bundle of 10 and two brokers: one of them is at 0, avg 5, band 1 -> impossible
    opt = min_moves({"x": 10.0}, {"x": "a"}, {"a": 1.0, "b": 1.0}, 1.0)
    assert (opt.moves, opt.status, opt.assignment) == (None, "infeasible", {})
    assert brute_force_min_moves({"x": 10.0}, {"x": "a"}, {"a": 1.0, "b": 1.0}, 1.0).status == "infeasible"


def test_orphans_always_count_as_moves() -> None:
    # "x" belonged to a broker that is gone: placing it anywhere is a move
    load = {"x": 1.0, "y": 1.0}
    owner = {"x": "dead", "y": "a"}
    cap = {"a": 1.0, "b": 1.0}
    for solve in (min_moves, brute_force_min_moves):
        opt = solve(load, owner, cap, 0.0)
        assert opt.moves == 1 and opt.assignment == {"x": "b", "y": "a"}


def test_edge_inputs() -> None:
    assert min_moves({}, {}, {"a": 1.0}, 0.0).moves == 0
    with pytest.raises(ValueError, match="capacity"):
        min_moves({"x": 1.0}, {"x": "a"}, {"a": 0.0}, 0.1)
    with pytest.raises(ValueError, match="too many"):
        brute_force_min_moves({f"t{i}": 1.0 for i in range(20)}, {}, {"a": 1.0, "b": 1.0}, 0.1)


def test_import_does_not_need_scipy() -> None:
    # The daemons and the CLI import trimtab.sim modules without the sim extra: scipy loads on first solve.
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['scipy'] = None; import trimtab.sim.optimum as o; "
        "print(o.brute_force_min_moves({'x': 1.0}, {'x': 'a'}, {'a': 1.0}, 0.0).moves)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"


def test_stdout_stays_clean() -> None:
    # HiGHS printf()s a stray debug line on some instances (this one, with SciPy 1.17) whatever its options;
    # `trimtab sim --json` prints its JSON on stdout, so min_moves keeps file descriptor 1 clean.
    import subprocess
    import sys

    code = """
from trimtab.sim.optimum import min_moves
print("before", flush=False)
load = {"u0": 3.0, "u1": 7.0, "u2": 3.0, "u3": 6.0, "u4": 3.0, "u5": 5.0, "u6": 9.0}
owner = {"u0": "k0", "u1": "k1", "u2": "k0", "u3": "k0", "u4": "k0", "u5": "k0", "u6": "k0"}
print(min_moves(load, owner, {"k0": 3.0, "k1": 2.0}, 0.25).status)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == "before\noptimal\n"


# ------------------------------------------------------------------------------------ against brute force


Instance = tuple[dict[str, float], dict[str, str], dict[str, float], float]


@st.composite
def instances(draw: Any) -> Instance:
    brokers = [f"k{j}" for j in range(draw(st.integers(1, 3)))]
    cap = {b: float(draw(st.integers(1, 4))) for b in brokers}
    n = draw(st.integers(0, 7))
    load = {f"u{i}": float(draw(st.integers(0, 20))) for i in range(n)}
    owner = {i: draw(st.sampled_from([*brokers, *brokers, "gone"])) for i in load}
    band = draw(st.sampled_from([0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0]))
    return load, owner, cap, band


def agree(inst: Instance) -> Optimum:
    load, owner, cap, band = inst
    exact, brute = min_moves(load, owner, cap, band), brute_force_min_moves(load, owner, cap, band)
    assert (exact.status, exact.moves) == (brute.status, brute.moves)
    if exact.status == "optimal":
        assert_valid(exact, load, owner, cap, band)
        assert_valid(brute, load, owner, cap, band)
    return exact


@pytest.mark.parametrize(
    "inst",
    [
        (
            {"u0": 5.0, "u1": 5.0, "u2": 0.0, "u3": 20.0, "u4": 18.0},
            {"u0": "k1", "u1": "k1", "u2": "k0", "u3": "k0", "u4": "k1"},
            {"k0": 3.0, "k1": 3.0},
            0.05,
        ),
        (
            {"u0": 19.0, "u1": 6.0, "u2": 5.0, "u3": 9.0, "u4": 19.0},
            {"u0": "k0", "u1": "k1", "u2": "k0", "u3": "k1", "u4": "k0"},
            {"k0": 4.0, "k1": 4.0},
            0.1,
        ),
        (
            {"u0": 17.0, "u1": 12.0, "u2": 17.0, "u3": 20.0},
            {"u0": "k0", "u1": "k0", "u2": "gone", "u3": "k1"},
            {"k0": 2.0, "k1": 1.0},
            0.1,
        ),
    ],
)
def test_infeasible_instances_highs_fails_to_solve_after_presolve(inst: Instance) -> None:
    # With presolve on, HiGHS (SciPy 1.17) ends these with "Solve error" (status 4), which min_moves used to
    # raise mid-simulation; it retries without presolve and gets the answer brute force gives.
    assert agree(inst).status == "infeasible"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_milp_equals_brute_force(inst: Instance) -> None:
    agree(inst)


def fixed_mix(agree_with_brute_force: Callable[[Instance], Optimum], seed: int) -> dict[str, int]:
    """150 seeded instances through ``agree_with_brute_force``: how many came out optimal and infeasible,
    checked to include both and several move counts, so the mix is not left to chance."""
    rng = random.Random(seed)
    seen: dict[str, int] = {}
    moves: set[int] = set()
    for _ in range(150):
        brokers = [f"k{j}" for j in range(rng.randint(2, 3))]
        cap = {b: float(rng.randint(1, 3)) for b in brokers}
        load = {f"u{i}": float(rng.randint(1, 12)) for i in range(rng.randint(3, 7))}
        owner = {i: rng.choice(brokers) for i in load}
        opt = agree_with_brute_force((load, owner, cap, rng.choice([0.1, 0.25, 0.5, 1.0])))
        seen[opt.status] = seen.get(opt.status, 0) + 1
        if opt.moves is not None:
            moves.add(opt.moves)
    assert len(moves) >= 3, moves  # instances that need 0, 1, 2, ... moves
    return seen


def test_milp_equals_brute_force_on_a_fixed_mix_of_feasible_and_infeasible() -> None:
    seen = fixed_mix(agree, 11)
    assert seen.get("optimal", 0) >= 30 and seen.get("infeasible", 0) >= 30, seen


# ------------------------------------------------------------------------------- the std target (cutting planes)


def test_std_target_by_hand() -> None:
    # Utilisations 0.9 / 0.1 / 0.5 (std 0.327): one move of 0.4 from k0 to k1 leaves 0.5 / 0.5 / 0.5.
    load = {"a": 0.4, "b": 0.5, "c": 0.1, "d": 0.5}
    owner = {"a": "k0", "b": "k0", "c": "k1", "d": "k2"}
    cap = {"k0": 1.0, "k1": 1.0, "k2": 1.0}
    assert utilisation_std(owner, load, cap) == pytest.approx(0.3266, abs=1e-4)
    for solve in (min_moves_std, brute_force_min_moves_std):
        assert solve(load, owner, cap, 0.5).moves == 0
        opt = solve(load, owner, cap, 0.01)
        assert (opt.status, opt.moves) == ("optimal", 1)
        assert opt.assignment["a"] == "k1"
        assert utilisation_std(opt.assignment, load, cap) <= 0.01


def test_std_target_asks_less_than_the_band() -> None:
    # Two brokers far apart can be within the std target while a third sits outside the band: the band
    # needs a move here, the std target does not.
    load = {"a": 0.7, "b": 0.5, "c": 0.3}
    owner = {"a": "k0", "b": "k1", "c": "k2"}
    cap = {"k0": 1.0, "k1": 1.0, "k2": 1.0}
    assert min_moves_std(load, owner, cap, 0.2).moves == 0  # std 0.163
    assert min_moves(load, owner, cap, 0.1).moves is None  # no assignment keeps all three within +-0.1


def test_std_target_infeasible_and_orphans() -> None:
    # One bundle carries everything: no assignment of it balances three brokers.
    load, cap = {"a": 3.0}, {"k0": 1.0, "k1": 1.0, "k2": 1.0}
    assert min_moves_std(load, {"a": "k0"}, cap, 0.1).status == "infeasible"
    # An orphan (its owner is gone) moves whatever we do.
    opt = min_moves_std({"a": 1.0, "b": 1.0}, {"a": "gone", "b": "k0"}, {"k0": 1.0, "k1": 1.0}, 0.0)
    assert (opt.moves, opt.assignment["a"]) == (1, "k1")


def test_std_target_gives_up_after_its_time_limit() -> None:
    rng = random.Random(3)
    brokers = [f"k{j}" for j in range(6)]
    load = {f"u{i}": rng.uniform(0.5, 1.5) for i in range(60)}
    owner = {i: brokers[0] if n < 40 else rng.choice(brokers) for n, i in enumerate(load)}
    cap = dict.fromkeys(brokers, 10.0)
    opt = min_moves_std(load, owner, cap, 0.001, max_cuts=2)
    assert (opt.status, opt.moves) == ("time_limit", None)


def std_agree(inst: Instance) -> Optimum:
    load, owner, cap, band = inst
    target = band / 2  # the same draws, read as a std target
    exact, brute = (
        min_moves_std(load, owner, cap, target),
        brute_force_min_moves_std(load, owner, cap, target),
    )
    assert (exact.status, exact.moves) == (brute.status, brute.moves)
    if exact.status == "optimal":
        assert utilisation_std(exact.assignment, load, cap) <= target + 1e-6
        assert sum(1 for i, b in exact.assignment.items() if owner.get(i) != b) == exact.moves
    return exact


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_std_cutting_planes_equal_brute_force(inst: Instance) -> None:
    std_agree(inst)


def test_std_cutting_planes_equal_brute_force_on_a_fixed_mix() -> None:
    seen = fixed_mix(std_agree, 12)
    assert seen.get("optimal", 0) >= 30 and seen.get("infeasible", 0) >= 10, seen
