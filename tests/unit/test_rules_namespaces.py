"""Namespace rules (balance/namespaces.py; docs/security.md "Namespaces and lookup limits", docs/testing.md):
what a valid tenant, namespace and allow-list entry is, with each refusal word for word and every length at
its limit; what the auto-create allow-list allows; what a lookup of a missing namespace answers; and which
of a namespace's bundles a deletion sees, owned or in flight."""

from __future__ import annotations

from collections import Counter

import pytest

from trimtab.balance.namespaces import (
    PART_MAX,
    AutoCreatePolicy,
    NamespaceBundles,
    bundles_of,
    check_namespace,
    check_part,
    check_pattern,
    not_found_message,
    owned_per_namespace,
)
from trimtab.channel.records import Record, State, make
from trimtab.errors import BundleError


def refusal(exc: pytest.ExceptionInfo[BundleError]) -> str:
    return str(exc.value)


# --- names ---------------------------------------------------------------------------------------------


def test_a_part_may_be_up_to_part_max_characters() -> None:
    """Rule: a tenant or namespace part of exactly PART_MAX (128) characters is valid and returned as is;
    one more is refused, quoting its first 32 characters and giving its length and the limit."""
    assert PART_MAX == 128
    assert check_part("tenant", "a" * 128) == "a" * 128
    long = "b" * 32 + "c" * 97
    with pytest.raises(BundleError) as exc:
        check_part("namespace", long)
    assert refusal(exc) == f"the namespace {'b' * 32!r}... is 129 characters long; at most 128"


def test_an_empty_part_is_refused() -> None:
    """Rule: an empty tenant or namespace part is refused, naming which."""
    with pytest.raises(BundleError) as exc:
        check_part("tenant", "")
    assert refusal(exc) == "the tenant must not be empty"


@pytest.mark.parametrize(
    ("part", "bad"),
    [("a b", " "), ("ab/c d", "/"), ("é", "é"), ("a*", "*"), ("x\x00", "\x00")],
)
def test_a_part_with_a_character_outside_the_name_characters_is_refused_naming_the_first(
    part: str, bad: str
) -> None:
    """Rule: a part may hold only letters, digits and '_', '.', '=', ':', '-'; the refusal names the part
    and its first character that is not one of them."""
    with pytest.raises(BundleError) as exc:
        check_part("tenant", part)
    assert refusal(exc) == (
        f"the tenant {part!r} holds {bad!r}: use letters, digits and '_', '.', '=', ':', '-' only"
    )


@pytest.mark.parametrize("part", ["_a", ".a", "=a", ":a", "-a", "-"])
def test_a_part_must_start_with_a_letter_or_a_digit(part: str) -> None:
    """Rule: a part made of valid characters must still start with a letter or a digit."""
    with pytest.raises(BundleError) as exc:
        check_part("namespace", part)
    assert refusal(exc) == f"the namespace {part!r} must start with a letter or a digit"


def test_every_name_character_may_follow_the_first() -> None:
    """Rule: after a letter or digit, every name character is valid (a digit may start a part too)."""
    assert check_part("tenant", "a_.=:-Z9") == "a_.=:-Z9"
    assert check_part("tenant", "9") == "9"


def test_a_namespace_is_a_valid_tenant_slash_a_valid_local_name() -> None:
    """Rule: a namespace is tenant/name, both parts valid (the first '/' splits them, so a second one is a
    bad character of the name); without '/' it is refused quoting its first 300 characters."""
    assert check_namespace("public/default") == "public/default"
    with pytest.raises(BundleError) as exc:
        check_namespace("x" * 301)
    assert refusal(exc) == f"invalid namespace {'x' * 300!r}: expected tenant/namespace"
    with pytest.raises(BundleError) as exc:
        check_namespace("_t/ns")
    assert refusal(exc) == "the tenant '_t' must start with a letter or a digit"
    with pytest.raises(BundleError) as exc:
        check_namespace("t/")
    assert refusal(exc) == "the namespace must not be empty"
    with pytest.raises(BundleError) as exc:
        check_namespace("t/a/b")
    assert refusal(exc) == (
        "the namespace 'a/b' holds '/': use letters, digits and '_', '.', '=', ':', '-' only"
    )


PATTERN_REFUSAL = (
    "invalid namespace pattern {!r}: expected TENANT or TENANT/NAMESPACE, each a glob of letters, digits, "
    "'_', '.', '=', ':', '-' and '*', '?', '[...]' (e.g. 'public/*')"
)


@pytest.mark.parametrize(
    "pattern", ["*", "public", "public/*", "p?b[!x]/[a-z]*", "a" * 128 + "/" + "b" * 128]
)
def test_an_allow_list_entry_is_one_or_two_globs(pattern: str) -> None:
    """Rule: an allow-list entry is a tenant glob or tenant-glob/namespace-glob, each 1 to 128 of the name
    and glob characters; it is returned as is."""
    assert check_pattern(pattern) == pattern


@pytest.mark.parametrize("pattern", ["", "a/", "/b", "a/b/c", "a b", "a" * 129, "a/" + "b" * 129])
def test_an_allow_list_entry_that_is_not_one_or_two_globs_is_refused(pattern: str) -> None:
    """Rule: an entry with an empty part, a part over 128 characters, a character outside the name and glob
    characters, or more than two parts is refused, quoting it."""
    with pytest.raises(BundleError) as exc:
        check_pattern(pattern)
    assert refusal(exc) == PATTERN_REFUSAL.format(pattern)


def test_a_refused_allow_list_entry_is_quoted_up_to_300_characters() -> None:
    """Rule: the refusal of a long entry quotes its first 300 characters only."""
    pattern = "a/b/" + "c" * 400
    with pytest.raises(BundleError) as exc:
        check_pattern(pattern)
    assert refusal(exc) == PATTERN_REFUSAL.format(pattern[:300])


# --- the allow-list ------------------------------------------------------------------------------------


def test_a_policy_checks_each_of_its_patterns() -> None:
    """Rule: AutoCreatePolicy.of keeps the patterns in order and refuses the first bad one."""
    assert AutoCreatePolicy.of(["b", "a/*"]).patterns == ("b", "a/*")
    assert AutoCreatePolicy.of([]).patterns == ()
    with pytest.raises(BundleError) as exc:
        AutoCreatePolicy.of(["a", "a/b/c"])
    assert refusal(exc) == PATTERN_REFUSAL.format("a/b/c")


def test_no_pattern_allows_nothing() -> None:
    """Rule: the default policy (no pattern) allows no namespace to be created by a lookup."""
    assert not AutoCreatePolicy().allows("public/default")


def test_a_tenant_pattern_allows_every_namespace_of_its_tenants_only() -> None:
    """Rule: a pattern without '/' matches the tenant (case-sensitively, as a glob) and allows each of its
    namespaces; another tenant is not allowed."""
    policy = AutoCreatePolicy.of(["public", "team-?"])
    assert policy.allows("public/default")
    assert policy.allows("team-a/x")
    assert not policy.allows("Public/default")
    assert not policy.allows("public2/default")
    assert not policy.allows("team-ab/x")


def test_a_namespace_pattern_needs_both_parts_to_match() -> None:
    """Rule: a tenant/namespace pattern allows a namespace only when the tenant glob matches the tenant and
    the namespace glob matches the local name, separately (so '*' never crosses the '/')."""
    policy = AutoCreatePolicy.of(["public/a*"])
    assert policy.allows("public/ab")
    assert policy.allows("public/a")
    assert not policy.allows("public/b")  # tenant matches, namespace does not
    assert not policy.allows("other/ab")  # namespace matches, tenant does not
    assert not AutoCreatePolicy.of(["p*"]).allows("q/p")
    assert not AutoCreatePolicy.of(["*/b"]).allows("a/xb")


def test_any_pattern_of_the_list_may_allow() -> None:
    """Rule: a namespace is allowed when any pattern allows it, not only the first."""
    policy = AutoCreatePolicy.of(["other", "x/y", "public/*"])
    assert policy.allows("public/default")
    assert policy.allows("x/y")
    assert not policy.allows("x/z")


@pytest.mark.parametrize("name", ["a/b/c", "a", "_a/b", "a/", "a b/c"])
def test_an_invalid_name_is_never_allowed(name: str) -> None:
    """Rule: a name that is not a valid namespace is never allowed, even by '*' (which matches its
    tenant) or '*/*'."""
    assert not AutoCreatePolicy.of(["*", "*/*"]).allows(name)


def test_the_policy_in_words() -> None:
    """Rule: describe() says that an empty list creates nothing, or lists the patterns in order."""
    assert AutoCreatePolicy().describe() == "namespace.auto_create is empty: lookups create no namespace"
    assert AutoCreatePolicy.of(["b", "a/*"]).describe() == "namespace.auto_create allows b, a/*"


def test_a_missing_namespace_says_how_an_operator_creates_it() -> None:
    """Rule: a lookup in a namespace that does not exist (and may not be created) answers which namespace,
    why, and how an operator creates it -- without the allow-list."""
    assert not_found_message("t/ns") == (
        "namespace t/ns does not exist, and namespace.auto_create does not let lookups create it. "
        "An operator creates it with `trimtab admin namespaces create t/ns` "
        "(POST /v1/admin/namespaces on a controller), or allows it in namespace.auto_create "
        "(docs/security.md)"
    )


# --- a namespace's bundles ---------------------------------------------------------------------------------


def rec(state: State, dst: str | None = None, src: str | None = None) -> Record:
    return make(state, version=1, ts=0, writer="w", dst=dst, src=src)


def test_a_namespace_is_live_while_it_has_an_owned_or_an_in_flight_bundle() -> None:
    """Rule: a namespace is live (still given a broker) with an owned bundle or one in flight, else not."""
    assert not NamespaceBundles().live
    assert NamespaceBundles(owned=[("t/ns/b", rec(State.OWNED, "a:1"))]).live
    assert NamespaceBundles(in_flight={"t/ns/b": "assigning"}).live
    empty = NamespaceBundles()
    assert empty.owned == [] and empty.in_flight == {}


def test_a_deletion_sees_the_owned_bundles_sorted_and_those_in_flight() -> None:
    """Rule: bundles_of keeps the bundles of exactly this namespace (the name minus its last segment; other
    namespaces, with the same prefix or under it, skipped wherever they come): the Owned ones with an owner,
    sorted by bundle, with their records, and the in-flight ones with their state; Free, Deleted and an
    Owned record without an owner are left out."""
    owned_b = rec(State.OWNED, "a:1")
    owned_a = rec(State.OWNED, "b:1")
    items = [
        ("t/other/0x0_0x1", rec(State.OWNED, "a:1")),
        ("t/ns/0x2_0x3", owned_b),
        ("t/ns2/0x0_0x1", rec(State.OWNED, "a:1")),
        ("t/ns/sub/0x0_0x1", rec(State.OWNED, "a:1")),
        ("t/0x0_0x1", rec(State.OWNED, "a:1")),
        ("t/ns/0x0_0x1", owned_a),
        ("t/ns/0x4_0x5", rec(State.ASSIGNING, "a:1")),
        ("t/ns/0x5_0x6", rec(State.RELEASING, "a:1", "b:1")),
        ("t/ns/0x6_0x7", rec(State.SPLITTING, "a:1", "a:1")),
        ("t/ns/0x7_0x8", rec(State.MERGING, "a:1", "a:1")),
        ("t/ns/0x8_0x9", rec(State.FREE)),
        ("t/ns/0x9_0xa", rec(State.DELETED)),
        ("t/ns/0xa_0xb", rec(State.OWNED)),
    ]
    got = bundles_of(items, "t/ns")
    assert got.owned == [("t/ns/0x0_0x1", owned_a), ("t/ns/0x2_0x3", owned_b)]
    assert got.in_flight == {
        "t/ns/0x4_0x5": "assigning",
        "t/ns/0x5_0x6": "releasing",
        "t/ns/0x6_0x7": "splitting",
        "t/ns/0x7_0x8": "merging",
    }
    assert bundles_of(items, "t").owned == [("t/0x0_0x1", items[4][1])]
    assert bundles_of(items, "t/ns/sub").owned == [("t/ns/sub/0x0_0x1", items[3][1])]
    assert not bundles_of(items, "t/none").live


def test_owned_bundles_are_counted_per_namespace() -> None:
    """Rule: owned_per_namespace counts each namespace's Owned records (by the name minus its last
    segment), and only those."""
    items = [
        ("t/a/0x0_0x1", rec(State.OWNED, "a:1")),
        ("t/a/0x1_0x2", rec(State.OWNED, "b:1")),
        ("t/a/0x2_0x3", rec(State.ASSIGNING, "b:1")),
        ("t/b/0x0_0x1", rec(State.FREE)),
        ("t/a/x/0x0_0x1", rec(State.OWNED, "a:1")),
        ("u/0x0_0x1", rec(State.OWNED, "a:1")),
    ]
    assert owned_per_namespace(items) == Counter({"t/a": 2, "t/a/x": 1, "u": 1})
    assert owned_per_namespace([]) == Counter()
