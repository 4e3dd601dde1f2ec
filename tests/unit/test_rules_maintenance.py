"""Maintenance rules that tests/unit/test_maintenance.py leaves loose (balance/maintenance.py;
docs/testing.md): the budget per failure domain at equality and its refusal word for word, and the deadline
at both of its bounds."""

from __future__ import annotations

import pytest

from trimtab.balance.maintenance import MAX_DEADLINE_S, budget_refusal, deadline_refusal, domain_key

DOMAINS: dict[str, str | None] = {"a:1": "rack-1", "b:1": "rack-1", "c:1": "rack-1", "d:1": None, "e:1": ""}


def test_a_broker_without_a_domain_counts_alone() -> None:
    """Rule: a broker counts in its failure domain; without one (absent, None or empty) it counts alone."""
    assert domain_key("a:1", DOMAINS) == "domain rack-1"
    assert domain_key("d:1", DOMAINS) == "broker d:1 (no failure domain)"
    assert domain_key("e:1", DOMAINS) == "broker e:1 (no failure domain)"
    assert domain_key("z:1", DOMAINS) == "broker z:1 (no failure domain)"


def test_the_budget_refuses_once_the_domain_has_max_per_domain_in_maintenance() -> None:
    """Rule: a broker may not go into maintenance when its domain already has max_per_domain others in
    maintenance (equality refuses, one fewer passes); the broker itself and other domains do not count,
    and the refusal names the domain, how many, which (sorted, comma-separated) and the setting."""
    inside = ["c:1", "b:1", "a:1", "d:1", "z:1"]  # c:1 is the one asking: not counted against itself
    assert budget_refusal("c:1", DOMAINS, inside, 3) is None
    assert budget_refusal("c:1", DOMAINS, inside, 2) == (
        "domain rack-1 has 2 broker(s) in maintenance already (a:1, b:1); "
        "operations.maintenance_max_per_domain is 2: end one first"
    )


def test_a_budget_of_zero_refuses_even_an_idle_domain() -> None:
    """Rule: with max_per_domain 0 no broker may go into maintenance, even alone in its domain."""
    assert budget_refusal("d:1", DOMAINS, ["d:1"], 0) == (
        "broker d:1 (no failure domain) has 0 broker(s) in maintenance already (); "
        "operations.maintenance_max_per_domain is 0: end one first"
    )
    assert budget_refusal("d:1", DOMAINS, ["e:1"], 1) is None  # each broker without a domain is its own


def test_the_deadline_may_be_exactly_a_week() -> None:
    """Rule: a deadline of up to a week (604 800 s, included) and above 0 is accepted."""
    assert MAX_DEADLINE_S == 604800.0
    assert deadline_refusal(MAX_DEADLINE_S) is None
    assert deadline_refusal(0.125) is None


@pytest.mark.parametrize(
    ("deadline", "message"),
    [
        (MAX_DEADLINE_S + 0.5, "the deadline must be a number of seconds up to 604800, not 604800"),
        (MAX_DEADLINE_S + 1, "the deadline must be a number of seconds up to 604800, not 604801"),
        (float("inf"), "the deadline must be a number of seconds up to 604800, not inf"),
        (float("-inf"), "the deadline must be a number of seconds up to 604800, not -inf"),
        (float("nan"), "the deadline must be a number of seconds up to 604800, not nan"),
        (0.0, "the deadline must be a positive number of seconds, not 0"),
        (-0.5, "the deadline must be a positive number of seconds, not -0.5"),
    ],
)
def test_a_deadline_beyond_a_week_not_finite_or_not_positive_is_refused(
    deadline: float, message: str
) -> None:
    """Rule: a deadline above a week or not finite (inf, -inf, nan) is refused as out of range, one of 0 or
    below as not positive; the refusal gives the bound and the value."""
    assert deadline_refusal(deadline) == message
