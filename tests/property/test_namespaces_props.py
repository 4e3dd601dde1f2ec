"""Who may create a namespace and how fast one client may look topics up (docs/security.md, "Namespaces and
lookup limits"), property-tested on the pure code with the clock in the test's hands:

* names: a tenant/namespace passes :func:`check_namespace` exactly when the channel's bundle-name grammar
  accepts it (so a name the admin API takes is a name every node can key a bundle by), and a refusal says
  what is wrong; an allow-list entry passes :func:`check_pattern` exactly when the setting's own pattern
  accepts it;
* the allow-list: empty allows nothing (the default), a tenant pattern allows exactly its tenants'
  namespaces, ``*`` never crosses the ``/``, an invalid name is never allowed, and a list allows exactly
  the union of what its entries allow;
* the token bucket: never more than ``burst + rate x elapsed`` lookups pass, a full bucket passes
  ``burst`` at once, a refusal's ``retry_after`` is exactly when the next one passes, and a clock that
  steps back neither refills nor takes;
* the per-client limiter: memory bounded by ``max_clients`` whatever the addresses (least recently seen
  forgotten first), a client's flood never refuses another client, and a rate of 0 allows everything and
  tracks nothing.
"""

from __future__ import annotations

import math
import re
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from trimtab.agent.ratelimit import ClientRateLimiter, TokenBucket, Verdict, worth_logging
from trimtab.balance.namespaces import PART_MAX, AutoCreatePolicy, check_namespace, check_pattern
from trimtab.channel.bundles import validate_namespace
from trimtab.config.settings import NamespaceSettings, Settings
from trimtab.errors import BundleError

NAME_CHARS = string.ascii_letters + string.digits + "_.=:-"
# Mostly name characters, with the ones that must be refused mixed in.
ANY_CHARS = NAME_CHARS + "/ \t\n*?[]!é\x00#%"

parts = st.text(NAME_CHARS, min_size=1, max_size=12).filter(lambda p: p[0].isalnum())
namespaces = st.builds(lambda t, n: f"{t}/{n}", parts, parts)
anything = st.text(ANY_CHARS, max_size=40)
glob_parts = st.text(NAME_CHARS + "*?", min_size=1, max_size=8)


# ---------------------------------------------------------------------------------------------- names
@given(st.one_of(anything, namespaces, st.builds(lambda a, b: f"{a}/{b}", anything, anything)))
def test_a_name_is_valid_exactly_when_the_channel_grammar_takes_it(name: str) -> None:
    try:
        validate_namespace(name)
        grammar = True
    except BundleError:
        grammar = False
    try:
        check_namespace(name)
        ours = True
    except BundleError as e:
        ours = False
        assert str(e), "a refusal says why"
    assert ours == grammar, name


@given(st.sampled_from(["tenant", "namespace"]), st.integers(PART_MAX + 1, PART_MAX + 50))
def test_a_part_longer_than_the_limit_is_refused_saying_so(which: str, length: int) -> None:
    long = "a" * length
    name = f"{long}/ns" if which == "tenant" else f"t/{long}"
    with pytest.raises(BundleError, match=f"at most {PART_MAX}"):
        check_namespace(name)
    check_namespace(name.replace(long, "a" * PART_MAX))  # the limit itself is fine


@given(st.one_of(anything, st.builds(lambda a, b: f"{a}/{b}", glob_parts, glob_parts), glob_parts))
def test_an_allow_list_entry_is_valid_exactly_when_the_setting_takes_it(pattern: str) -> None:
    try:
        NamespaceSettings(auto_create=[pattern])
        setting = True
    except ValidationError:
        setting = False
    try:
        check_pattern(pattern)
        ours = True
    except BundleError:
        ours = False
    assert ours == setting, pattern


# ---------------------------------------------------------------------------------------------- the allow-list
def test_by_default_lookups_create_no_namespace() -> None:
    assert Settings().namespace.auto_create == []
    assert not AutoCreatePolicy.of(Settings().namespace.auto_create).allows("public/default")


@given(namespaces)
def test_the_empty_policy_allows_nothing_and_star_allows_every_valid_name(ns: str) -> None:
    assert not AutoCreatePolicy().allows(ns)
    assert AutoCreatePolicy.of(["*"]).allows(ns)
    assert AutoCreatePolicy.of(["*/*"]).allows(ns)


@given(parts, namespaces)
def test_a_tenant_pattern_allows_exactly_that_tenants_namespaces(tenant: str, ns: str) -> None:
    policy = AutoCreatePolicy.of([tenant])
    assert policy.allows(ns) == (ns.split("/", maxsplit=1)[0] == tenant)
    assert policy.allows(f"{tenant}/{ns.split('/')[1]}")


@given(parts, parts, parts)
def test_a_glob_never_crosses_the_slash(a: str, b: str, c: str) -> None:
    # Matched part by part: fnmatch over the whole name would let "*" eat the "/" ("a*" would allow
    # "a/anything" through the namespace part, "*b" a namespace named b of any tenant).
    assert AutoCreatePolicy.of([f"{a}*/{b}"]).allows(f"{a}{c}/{b}")
    assert AutoCreatePolicy.of([f"{a}*"]).allows(f"{c}/{b}") == c.startswith(a)
    assert AutoCreatePolicy.of([f"*{b}"]).allows(f"{c}/{b}") == c.endswith(b)
    assert AutoCreatePolicy.of([f"{a}/*"]).allows(f"{c}/{b}") == (c == a)


@given(
    st.lists(st.one_of(parts, st.builds(lambda a, b: f"{a}/{b}", glob_parts, glob_parts)), max_size=4),
    anything,
)
def test_an_invalid_name_is_never_allowed(patterns: list[str], name: str) -> None:
    policy = AutoCreatePolicy.of([*patterns, "*"])
    try:
        check_namespace(name)
    except BundleError:
        assert not policy.allows(name)


@given(
    st.lists(st.one_of(parts, st.builds(lambda a, b: f"{a}/{b}", glob_parts, glob_parts)), max_size=5),
    namespaces,
)
def test_a_list_allows_the_union_of_its_entries(patterns: list[str], ns: str) -> None:
    union = any(AutoCreatePolicy.of([p]).allows(ns) for p in patterns)
    assert AutoCreatePolicy.of(patterns).allows(ns) == union


def test_patterns_the_settings_refuse_are_refused_by_the_policy_too() -> None:
    for bad in ("a/b/c", "", "a b", "/x", "x/"):
        with pytest.raises(BundleError):
            AutoCreatePolicy.of([bad])


# ---------------------------------------------------------------------------------------------- the bucket
rates = st.floats(0.1, 1000, allow_nan=False)
bursts = st.integers(1, 50)
steps = st.lists(st.tuples(st.floats(0, 2, allow_nan=False), st.integers(0, 20)), max_size=40)


@given(rates, bursts, steps)
def test_no_more_pass_than_the_burst_and_the_rate_allow(
    rate: float, burst: int, plan: list[tuple[float, int]]
) -> None:
    now = 100.0
    bucket = TokenBucket(rate, burst, now)
    start, passed = now, 0
    for dt, attempts in plan:
        now += dt
        passed += sum(bucket.take(now) == 0.0 for _ in range(attempts))
        assert passed <= burst + rate * (now - start) + 1e-6
        assert 0.0 <= bucket.tokens <= burst


@given(rates, bursts, st.floats(0, 100, allow_nan=False))
def test_a_full_bucket_passes_exactly_the_burst_at_once(rate: float, burst: int, idle: float) -> None:
    bucket = TokenBucket(rate, burst, 0.0)
    bucket.take(0.0)  # spend one
    # Long enough to be full again, whatever it spent. (burst / rate) * rate can come out an ulp below
    # burst in floating point, which left a one-token bucket a hair short: the nanosecond makes the premise
    # true, not the assertions weaker.
    now = idle + burst / rate + 1e-9
    assert all(bucket.take(now) == 0.0 for _ in range(burst))
    assert bucket.take(now) > 0.0


@given(rates, bursts, st.integers(0, 30))
def test_retry_after_is_when_the_next_lookup_passes(rate: float, burst: int, extra: int) -> None:
    bucket = TokenBucket(rate, burst, 0.0)
    for _ in range(burst + extra):
        bucket.take(0.0)
    wait = bucket.take(0.0)
    assert wait > 0.0
    assert bucket.take(wait * (1 - 1e-9)) > 0.0, "not before"
    assert bucket.take(wait * (1 + 1e-9) + 1e-12) == 0.0, "and then it does"


@given(rates, bursts, st.floats(0.001, 50, allow_nan=False))
def test_a_clock_stepping_back_neither_refills_nor_takes(rate: float, burst: int, back: float) -> None:
    bucket = TokenBucket(rate, burst, 10.0)
    while bucket.take(10.0) == 0.0:
        pass
    tokens = bucket.tokens
    assert bucket.take(10.0 - back) > 0.0
    assert bucket.tokens == tokens


@given(st.floats(0.001, 100, allow_nan=False))
def test_retry_after_header_is_whole_seconds_and_at_least_one(wait: float) -> None:
    header = Verdict(False, wait).retry_after_header
    assert int(header) == max(1, math.ceil(wait))


def test_refusals_are_logged_first_then_sparsely() -> None:
    logged = [n for n in range(5000) if worth_logging(n)]
    assert logged[:20] == list(range(20)) and logged[20:] == [1000, 2000, 3000, 4000]


# ---------------------------------------------------------------------------------------------- per client
clients = st.text(string.hexdigits, min_size=1, max_size=6)


@given(st.integers(1, 20), st.lists(st.tuples(clients, st.floats(0, 1, allow_nan=False)), max_size=200))
def test_memory_is_bounded_whatever_the_addresses(max_clients: int, calls: list[tuple[str, float]]) -> None:
    clock = [0.0]
    limiter = ClientRateLimiter(1.0, 3, max_clients, monotonic=lambda: clock[0])
    recent: list[str] = []
    for client, dt in calls:
        clock[0] += dt
        limiter.admit(client)
        recent = [c for c in recent if c != client] + [client]
        assert len(limiter) <= max_clients
        assert len(limiter._refused) <= max_clients
        # The least recently seen are the ones forgotten.
        assert set(limiter._buckets) == set(recent[-max_clients:])


@given(bursts, st.integers(0, 200), clients, clients)
def test_one_clients_flood_never_refuses_another(burst: int, flood: int, a: str, b: str) -> None:
    if a == b:
        b = a + "x"
    limiter = ClientRateLimiter(0.5, burst, 2, monotonic=lambda: 0.0)
    verdicts = [limiter.admit(a) for _ in range(burst + flood)]
    assert [v.allowed for v in verdicts] == [True] * burst + [False] * flood
    assert [v.refused_before for v in verdicts[burst:]] == list(range(flood))
    assert all(v.retry_after_s > 0 for v in verdicts[burst:])
    assert limiter.admit(b).allowed


@given(st.lists(clients, max_size=100))
def test_a_rate_of_zero_allows_everything_and_tracks_nothing(calls: list[str]) -> None:
    limiter = ClientRateLimiter(0, 1, 1, monotonic=lambda: 0.0)
    assert all(limiter.admit(c).allowed for c in calls)
    assert len(limiter) == 0


def test_the_limiter_refuses_nonsense() -> None:
    for args in ((-1, 1, 1), (1, 0, 1), (1, 1, 0)):
        with pytest.raises(ValueError):
            ClientRateLimiter(*args, monotonic=lambda: 0.0)
    assert re.fullmatch(r"\d+", Verdict(False, 0.2).retry_after_header)
