"""Placement rules that the other placement tests leave loose (balance/placement/model.py, affinity.py,
isolation.py; docs/placement.md, docs/testing.md): the host and namespace of a name that starts with its
separator, a broker absent from the group's counts (it holds none of the group's bundles), a candidate
layout with a domain of one broker, and every refusal of a bad policy with its message."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from trimtab.balance.placement.affinity import CandidateLayout, anti_affinity_filter
from trimtab.balance.placement.isolation import (
    IsolationPolicy,
    compile_patterns,
    isolation_candidates,
    sorted_policies,
)
from trimtab.balance.placement.model import Broker, PlacementConfigError, host_of, namespace_of


def refusal(exc: pytest.ExceptionInfo[PlacementConfigError]) -> str:
    return str(exc.value)


# --- model ---------------------------------------------------------------------------------------------


def test_host_of_an_id_that_starts_with_its_port_separator_is_empty() -> None:
    """Rule: the host is the text before the last ':' -- also when that ':' is the first character (the
    host is then empty, never the whole id with its port); an id without ':' is all host."""
    assert host_of(":8080") == ""
    assert host_of("a:8080") == "a"
    assert host_of("[::1]:8080") == "[::1]"
    assert host_of("broker") == "broker"


def test_namespace_of_a_name_that_starts_with_its_separator_is_empty() -> None:
    """Rule: a bundle's namespace is its name minus the last '/segment' -- also when that '/' is the first
    character (the namespace is then empty); a name without '/' is its own namespace."""
    assert namespace_of("/0x0_0x4") == ""
    assert namespace_of("t/0x0_0x4") == "t"
    assert namespace_of("t/ns/0x0_0x4") == "t/ns"
    assert namespace_of("t") == "t"


def test_a_broker_id_must_not_be_empty_and_the_refusal_says_so() -> None:
    """Rule: a Broker with an empty id is refused, with the message 'a broker id must not be empty'."""
    with pytest.raises(PlacementConfigError) as exc:
        Broker("")
    assert refusal(exc) == "a broker id must not be empty"
    assert Broker("a:1").id == "a:1"


# --- affinity --------------------------------------------------------------------------------------------


def test_a_broker_absent_from_the_counts_holds_none_of_the_group() -> None:
    """Rule: a candidate the group's counts do not name holds 0 of its bundles -- in its domain's total and
    per broker -- so it is kept as one of the emptiest, and beats a broker holding one."""
    assert anti_affinity_filter(["a", "b"], {"b": 1}, None) == ["a"]
    assert anti_affinity_filter(["a", "b"], {"b": 0}, None) == ["a", "b"]
    assert anti_affinity_filter(["a"], {}, None) == ["a"]
    domains: dict[str, str | None] = {"a": "d1", "b": "d2", "c": "d2"}
    # d1 holds 0 (a is absent), d2 holds 0 (b named with 0, c absent): both domains tie, every broker too
    assert anti_affinity_filter(["a", "b", "c"], {"b": 0}, domains) == ["a", "b", "c"]
    # d2 holds 1 (b), d1 0: only d1's broker, absent from the counts
    assert anti_affinity_filter(["a", "b", "c"], {"b": 1}, domains) == ["a"]
    # one domain: the absent broker beats the one holding one
    assert anti_affinity_filter(["b", "c"], {"b": 1}, domains) == ["c"]


def test_domain_totals_count_only_the_candidates_and_unmapped_brokers_pool_in_default() -> None:
    """Rule: a domain's total sums its candidates' counts only, and a broker without a domain counts in
    'default' with the others without one: the emptiest domain wins, then its emptiest brokers."""
    domains: dict[str, str | None] = {"a": "d1", "b": None, "x": "d1"}
    # a (d1) holds 1; b and c pool in default (0 + 1 = 1): both domains total 1, then per broker 0 < 1
    assert anti_affinity_filter(["a", "b", "c"], {"a": 1, "c": 1, "x": 5}, domains) == ["b"]
    assert anti_affinity_filter(["a", "b", "c"], {"a": 1, "b": 1, "c": 1}, domains) == ["a"]
    assert anti_affinity_filter([], {}, domains) == []


def test_a_layout_with_a_domain_of_one_broker_filters_like_the_function() -> None:
    """Rule: CandidateLayout.filter gives the same brokers as anti_affinity_filter (sorted by id), also for
    one candidate, for a domain of a single broker next to a larger one, and with the owner counted one
    less (``minus``)."""
    domains: dict[str, str | None] = {"a": "d1", "b": "d2", "c": "d2"}
    assert CandidateLayout(["a"], domains).filter({"a": 3}) == ("a",)
    layout = CandidateLayout(["c", "b", "a"], domains)
    assert layout.filter({"a": 1, "b": 0, "c": 0}) == ("b", "c")  # d2 totals 0 < 1
    assert layout.filter({"a": 0, "b": 1}) == ("a",)  # d1 totals 0 < 1
    assert layout.filter({"a": 1, "b": 1}) == ("c",)  # both total 1: then c's 0 is the least
    assert layout.filter({"b": 0}) == ("a", "b", "c")  # both total 0, every broker 0
    assert layout.filter({"a": 1, "b": 1}, minus="a") == ("a",)  # a's own bundle left out: d1 totals 0
    assert layout.filter({"a": 2, "b": 2, "c": 1}, minus="x") == ("a",)  # not a candidate: nothing less
    assert CandidateLayout([], domains).filter({}) == ()
    assert CandidateLayout(["b", "a"], None).filter({"b": 1}) == ("a",)


# --- isolation -----------------------------------------------------------------------------------------


def policy(name: str = "p", **kw: object) -> IsolationPolicy:
    fields: dict[str, object] = {"namespaces": ["t/.*"], "primary": ["p1"], "secondary": [], "min_limit": 0}
    fields.update(kw)
    return IsolationPolicy(name=name, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "kw", "message"),
    [
        ("", {}, "an isolation policy needs a non-empty name"),
        (7, {}, "an isolation policy needs a non-empty name"),
        ("p", {"namespaces": "t/.*"}, "isolation policy 'p': namespaces must be a list of regexes"),
        ("p", {"secondary": "s1"}, "isolation policy 'p': secondary must be a list of regexes"),
        ("p", {"namespaces": []}, "isolation policy 'p': namespaces must not be empty"),
        ("p", {"primary": []}, "isolation policy 'p': primary must not be empty"),
        ("p", {"min_limit": -1}, "isolation policy 'p': min_limit must be an integer >= 0"),
        ("p", {"min_limit": True}, "isolation policy 'p': min_limit must be an integer >= 0"),
        ("p", {"min_limit": 1.0}, "isolation policy 'p': min_limit must be an integer >= 0"),
        ("p", {"primary": ["p1", 5]}, "isolation policy 'p': primary[1] must be a string"),
    ],
)
def test_a_policy_that_cannot_be_applied_is_refused_with_what_is_wrong(
    name: object, kw: dict[str, object], message: str
) -> None:
    """Rule: a policy is refused when it is built -- no name (empty or not a string), a lone string for a
    list, no namespace or no primary regex, a min_limit that is not an integer >= 0 (a bool is not one),
    a regex that is not a string -- and the message names the policy and what is wrong."""
    with pytest.raises(PlacementConfigError) as exc:
        policy(name, **kw)  # type: ignore[arg-type]
    assert refusal(exc) == message


def test_a_regex_that_does_not_compile_is_named_by_field_and_index() -> None:
    """Rule: a regex that does not compile is refused naming the policy, the field, its index and text."""
    with pytest.raises(PlacementConfigError) as exc:
        compile_patterns("p", "secondary", ["ok", "("])
    assert refusal(exc).startswith(
        "isolation policy 'p': secondary[1] '(' is not a valid regular expression: "
    )
    assert [p.pattern for p in compile_patterns("p", "primary", ["a", "b.*"])] == ["a", "b.*"]


def test_two_policies_with_one_name_are_refused() -> None:
    """Rule: sorted_policies orders policies by name and refuses two with one name, saying which."""
    with pytest.raises(PlacementConfigError) as exc:
        sorted_policies([policy("q"), policy("p"), policy("q")])
    assert refusal(exc) == "two isolation policies are named 'q'"
    assert [p.name for p in sorted_policies([policy("q"), policy("p")])] == ["p", "q"]


@dataclass
class Doc:
    """A document describing a policy (the fields of PolicyFields), as lists like a decoded one."""

    namespaces: Sequence[str]
    primary: Sequence[str]
    secondary: Sequence[str]
    min_limit: int


def test_a_policy_of_a_document_carries_every_field_of_it() -> None:
    """Rule: IsolationPolicy.of(name, doc) is the policy of that name with the document's namespaces,
    primaries, secondaries and min_limit, and is checked like any other (a bad document is refused)."""
    got = IsolationPolicy.of(
        "p", Doc(namespaces=["t/a", "t/b"], primary=["p1"], secondary=["s1"], min_limit=2)
    )
    want = IsolationPolicy(
        name="p", namespaces=("t/a", "t/b"), primary=("p1",), secondary=("s1",), min_limit=2
    )
    assert got == want
    assert (got.name, got.namespaces, got.primary, got.secondary, got.min_limit) == (
        "p",
        ("t/a", "t/b"),
        ("p1",),
        ("s1",),
        2,
    )
    # the fields are applied, not just stored: one primary live < min_limit 2, so the secondary joins
    assert got.candidates(["p1:1", "s1:1", "x:1"]) == ["p1:1", "s1:1"]
    assert got.applies_to("t/b") and not got.applies_to("t/c")
    with pytest.raises(PlacementConfigError) as exc:
        IsolationPolicy.of("p", Doc(namespaces=[], primary=["p1"], secondary=[], min_limit=0))
    assert refusal(exc) == "isolation policy 'p': namespaces must not be empty"


def test_an_unpoliced_namespace_goes_to_shared_brokers_only() -> None:
    """Rule: a namespace no policy matches may go only to brokers that are primary in no policy (a
    secondary-only broker is shared); a policed one to the policy's candidates, input order kept."""
    pols = sorted_policies([policy("p", secondary=["s1"], min_limit=1)])
    ids = ["x:1", "s1:1", "p1:1"]
    assert isolation_candidates("other/ns", ids, pols) == ["x:1", "s1:1"]
    assert isolation_candidates("t/ns", ids, pols) == ["p1:1"]
    assert isolation_candidates("t/ns", ["s1:1", "x:1"], pols) == ["s1:1"]  # no primary live: the secondary
