"""Assignment's rules, through ``select_broker``'s results only (balance/assign.py; docs/testing.md).

These tests use the public function and what it returns -- never a helper of the module -- so that they
hold whatever index the selection is computed with. The placement rule is passed on every test that
chooses under a policy: it is a hard rule, applied before the soft filters.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from trimtab.balance.assign import AssignContext, BrokerInfo, Selection, select_broker
from trimtab.balance.load import BrokerLoadData

NOW = 100_000_000
BUNDLE = "t/iso/0x00000000_0x40000000"


def info(bid: str, *, draining: bool = False, version: str = "1.0.0") -> BrokerInfo:
    return BrokerInfo(
        id=bid, service_url=f"svc://{bid}", http_url=f"http://{bid}", draining=draining, version=version
    )


def ctx(loads: dict[str, float] | None = None, exclude: frozenset[str] = frozenset()) -> AssignContext:
    reports = {
        b: BrokerLoadData(broker=b, weighted_max_ema=v, updated_at=NOW) for b, v in (loads or {}).items()
    }
    return AssignContext(loads=reports, now_ms=NOW, exclude=exclude)


BROKERS = {b: info(b) for b in ("a", "b", "c")}


def every_pick(brokers: dict[str, BrokerInfo], context: AssignContext, **kw: object) -> set[str | None]:
    """Every broker the selection can return, over many seeds."""
    return {select_broker(BUNDLE, brokers, context, random.Random(s), **kw).broker for s in range(200)}  # type: ignore[arg-type]


def test_placement_decides_among_the_brokers_it_allows() -> None:
    """Rule: with a placement rule the broker is always one the rule allows, however loaded the others
    are (isolation: this namespace only on c)."""

    def only_c(bundle: str, candidates: dict[str, BrokerInfo]) -> dict[str, BrokerInfo]:
        return {k: v for k, v in candidates.items() if k == "c"}

    loads = {"a": 0.0, "b": 0.0, "c": 0.9}
    assert every_pick(BROKERS, ctx(loads), placement=only_c) == {"c"}
    sel = select_broker(BUNDLE, BROKERS, ctx(loads), random.Random(0), placement=only_c)
    assert (sel.broker, sel.candidates, sel.reason) == ("c", 1, "selected")
    assert every_pick(BROKERS, ctx(loads)) == {"a", "b"}  # without the rule the least loaded win


def test_placement_that_allows_nobody_fails_the_selection() -> None:
    """Rule: placement is a hard rule: when it allows none of the brokers, nothing is selected (reason
    ``placement``) rather than a broker that breaks the policy."""
    sel = select_broker(BUNDLE, BROKERS, ctx({"a": 0.1}), random.Random(0), placement=lambda b, c: {})
    assert (sel.broker, sel.candidates, sel.skipped_filters, sel.reason) == (None, 0, [], "placement")


def test_placement_is_asked_about_the_bundle_with_the_eligible_brokers_only() -> None:
    """Rule: the placement rule gets the bundle being placed, and only brokers that may take it: not
    draining, not excluded."""
    seen: list[tuple[str, set[str]]] = []

    def record(bundle: str, candidates: dict[str, BrokerInfo]) -> dict[str, BrokerInfo]:
        seen.append((bundle, set(candidates)))
        return candidates

    brokers = {**BROKERS, "d": info("d", draining=True)}
    sel = select_broker(BUNDLE, brokers, ctx(exclude=frozenset({"a"})), random.Random(0), placement=record)
    assert seen == [(BUNDLE, {"b", "c"})]
    assert sel.broker in {"b", "c"}


def test_placement_comes_before_the_soft_filters() -> None:
    """Rule: the soft filters narrow what placement allowed, never the reverse: the version filter keeps
    the newest version *among the brokers placement allows* (a, b), not c, the newest of all."""
    brokers = {"a": info("a"), "b": info("b"), "c": info("c", version="2.0.0")}
    context = AssignContext(loads={}, now_ms=NOW, prefer_later_versions=True)

    def not_c(bundle: str, candidates: dict[str, BrokerInfo]) -> dict[str, BrokerInfo]:
        return {k: v for k, v in candidates.items() if k != "c"}

    assert every_pick(brokers, context, placement=not_c) == {"a", "b"}
    assert every_pick(brokers, context) == {"c"}


def test_no_eligible_broker_is_no_brokers_before_placement() -> None:
    """Rule: with every broker draining or excluded there is nobody to place on (``no_brokers``), and the
    placement rule is not consulted."""
    asked: list[str] = []

    def record(bundle: str, candidates: dict[str, BrokerInfo]) -> dict[str, BrokerInfo]:
        asked.append(bundle)
        return candidates

    brokers = {"a": info("a", draining=True), "b": info("b")}
    sel = select_broker(BUNDLE, brokers, ctx(exclude=frozenset({"b"})), random.Random(0), placement=record)
    assert sel == Selection(None, 0, [], "no_brokers") and asked == []


def test_the_context_carries_the_assignment_settings() -> None:
    """Rule: ``AssignContext.from_settings`` carries the load TTL, the topic limit and the version
    preference over from the settings."""
    from trimtab.config.settings import AssignmentSettings, LoadSettings, Settings

    s = Settings(
        load=LoadSettings(ttl_s=2000.0, report_max_interval_s=60.0),
        assignment=AssignmentSettings(broker_max_topics=7, prefer_later_versions=True),
    )
    c = AssignContext.from_settings(s, {}, NOW, frozenset({"x"}))
    assert (c.load_ttl_s, c.max_topics, c.prefer_later_versions, c.exclude) == (
        2000.0,
        7,
        True,
        frozenset({"x"}),
    )


def aged(ema: float, age_ms: int, topics: int = 0) -> BrokerLoadData:
    return BrokerLoadData(broker="?", weighted_max_ema=ema, topics=topics, updated_at=NOW - age_ms)


def test_a_report_exactly_ttl_old_still_counts() -> None:
    """Rule: a load report is fresh while its age is at most the TTL (in seconds, compared in ms): at
    exactly the TTL the least loaded broker is still preferred and a broker at the topic limit still
    dropped; a millisecond later neither report counts."""
    ttl_ms = 1800 * 1000
    for age, fresh in ((ttl_ms, True), (ttl_ms + 1, False)):
        loads = {"a": aged(0.0, age), "b": aged(0.9, age), "c": aged(0.9, age)}
        context = AssignContext(loads=loads, now_ms=NOW, load_ttl_s=1800.0)
        assert (every_pick(BROKERS, context) == {"a"}) is fresh
        full = {"a": aged(0.0, age, topics=10), "b": aged(0.0, 0), "c": aged(0.0, 0)}
        context = AssignContext(loads=full, now_ms=NOW, load_ttl_s=1800.0, max_topics=10)
        assert ("a" in every_pick(BROKERS, context)) is not fresh


def test_a_filter_is_asked_about_the_bundle_being_placed() -> None:
    """Rule: every filter of the chain gets the bundle it filters for."""
    asked: list[str] = []

    class Recording:
        name = "recording"

        def apply(
            self, bundle: str, candidates: dict[str, BrokerInfo], ctx: AssignContext
        ) -> dict[str, BrokerInfo]:
            asked.append(bundle)
            return candidates

    select_broker(BUNDLE, BROKERS, ctx(), random.Random(0), filters=[Recording()])
    assert asked == [BUNDLE]


def test_a_splitting_or_merging_parent_counts_at_its_source() -> None:
    """Rule: the bundles the channel gives a broker include a splitting or merging parent at its source
    (the broker still serving it), and an owned or incoming bundle at its destination."""
    from trimtab.balance.assign import headed_to
    from trimtab.channel.records import State, make

    kids: dict[str, str | None] = {"0x00000000_0x20000000": "a", "0x20000000_0x40000000": "a"}
    records = [
        make(State.SPLITTING, version=2, ts=0, writer="a", src="a", children=kids),
        make(State.MERGING, version=2, ts=0, writer="b", src="b", children={"0x00000000_0x80000000": None}),
        make(State.OWNED, version=1, ts=0, writer="c", dst="c", src="a"),
        make(State.ASSIGNING, version=1, ts=0, writer="x", dst="c"),
    ]
    assert headed_to(records) == {"a": 1, "b": 1, "c": 2}


def test_a_broker_on_the_line_tolerance_included_is_among_the_best() -> None:
    """Rule: a broker is among the best when its EMA plus ``diff`` is at most the average plus the 1e-9
    tolerance -- at equality with that bound it still is (a: 0 + diff == 0.5 + 1e-9), so the pick is a,
    not a random one of all."""
    diff = 0.5 + 1e-9
    assert every_pick(BROKERS, ctx({"a": 0.0, "b": 1.0}), diff=diff) == {"a"}
    assert every_pick(BROKERS, ctx({"a": 0.0, "b": 1.0}), diff=diff + 1e-9) == {"a", "b", "c"}


def load(ema: float, bundles: int) -> BrokerLoadData:
    return BrokerLoadData(broker="?", weighted_max_ema=ema, bundles=bundles, updated_at=NOW)


def test_the_mean_load_per_bundle_counts_only_reports_with_bundles() -> None:
    """Rule: the cluster's load per bundle is the sum of the EMAs of the reports that count a bundle over
    the number of their bundles -- one bundle counts; a report without bundles adds neither its load nor
    a bundle; with no bundle at all it is 0."""
    from trimtab.balance.assign import per_bundle_load

    assert per_bundle_load({}) == 0.0
    assert per_bundle_load({"a": load(0.75, 0)}) == 0.0
    assert per_bundle_load({"a": load(0.5, 1)}) == 0.5
    assert per_bundle_load({"a": load(0.5, 1), "b": load(0.5, 3), "c": load(0.25, 0)}) == 0.25


def test_a_drain_adds_its_load_per_bundle_to_each_destination() -> None:
    """Rule: each pick of a drain raises its destination's load, in what the next pick reads, by the
    drained broker's EMA over its number of bundles (one bundle: all of it; none counted: as one)."""
    from trimtab.balance.assign import BurstPicks

    loads = {"me": load(0.5, 0), "a": load(0.0, 0)}
    context = AssignContext(loads=loads, now_ms=NOW)
    only_a = {"a": info("a")}
    for bundles, added in ((0, 0.5), (1, 0.5), (4, 0.125)):
        burst = BurstPicks.for_drain(loads, "me", bundles)
        assert burst.select(BUNDLE, only_a, context, random.Random(0)).broker == "a"
        assert burst.context(context).loads["a"].weighted_max_ema == added, bundles


def test_a_drain_pick_passes_the_bundle_and_the_placement_rule_on() -> None:
    """Rule: a pick of a drain is a selection like any other: the placement rule (and every keyword)
    reaches it, and is asked about the bundle being placed."""
    from trimtab.balance.assign import BurstPicks

    asked: list[str] = []

    def only_c(bundle: str, candidates: dict[str, BrokerInfo]) -> dict[str, BrokerInfo]:
        asked.append(bundle)
        return {k: v for k, v in candidates.items() if k == "c"}

    burst = BurstPicks.for_drain({}, "me", 1)
    for seed in range(20):
        sel = burst.select(
            BUNDLE, BROKERS, ctx({"a": 0.0, "b": 0.0, "c": 0.9}), random.Random(seed), placement=only_c
        )
        assert sel.broker == "c"
    assert set(asked) == {BUNDLE}


def test_versions_compare_their_release_numbers_as_numbers_before_any_pre_release() -> None:
    """Rule: the version filter keeps the newest release number, compared part by part as numbers, and
    only then a pre-release before its release: 2.0.10-rc1 is newer than 2.0.9 (the hyphen splits the
    pre-release off, it is not part of the last number)."""
    brokers = {"a": info("a", version="2.0.10-rc1"), "b": info("b", version="2.0.9")}
    context = AssignContext(loads={}, now_ms=NOW, prefer_later_versions=True)
    assert every_pick(brokers, context) == {"a"}
    brokers = {"a": info("a", version="2.0.10-rc1"), "b": info("b", version="2.0.10")}
    assert every_pick(brokers, context) == {"b"}


def test_versions_follow_semver_precedence() -> None:
    """Rule: versions order as semver 2.0.0 section 11 says (its own example, in order): numeric
    identifiers below alphanumeric ones, a longer set of identifiers above its prefix, a pre-release
    below its release."""
    from trimtab.balance.assign import version_key

    example = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
    ]
    assert sorted(example, key=version_key) == example


def test_a_release_part_that_is_not_a_number_orders_below_every_number() -> None:
    """Rule: a version is the broker's own word: a release part that is not a number (``1.x.0``, a
    digit int() refuses such as ``1.²``) orders below every number -- never above a real release -- and
    such parts compare by their text."""
    from trimtab.balance.assign import version_key

    assert version_key("1.x.0") < version_key("1.0.0") < version_key("1.1.0")
    assert version_key("1.²") < version_key("1.0")
    assert version_key("1.a") < version_key("1.b") < version_key("1.0")


def test_a_number_of_any_length_orders_as_its_value() -> None:
    """Rule: release and pre-release numbers order by value whatever their length, leading zeros
    included, and whatever the interpreter's int-digits limit (int() refuses 4 301 digits by default: a
    broker registering such a version must not make every selection raise while later versions are
    preferred); a non-ASCII decimal ("٣", Arabic-Indic three) is the number it writes."""
    from trimtab.balance.assign import version_key

    huge = "9" * 5000
    assert version_key(f"1.{huge}") > version_key("1.10") > version_key("1.9") > version_key("1.0")
    assert version_key(f"1.{huge}") < version_key(f"1.1{huge}")
    assert version_key("1.007") == version_key("1.7") < version_key("1.08")
    assert version_key("1.0-rc.2") < version_key("1.0-rc.10") < version_key(f"1.0-rc.{huge}")
    assert version_key("1.٣") == version_key("1.3") < version_key("1.٤")
    assert version_key("1.0") == version_key("1.00") < version_key("1.1")


@settings(max_examples=300)
@given(st.lists(st.integers(min_value=0, max_value=10**40), min_size=1, max_size=4), st.data())
def test_numbers_order_as_integers(parts: list[int], data: st.DataObject) -> None:
    """Rule: two versions of numbers only order as their tuples of integers (leading zeros ignored)."""
    from trimtab.balance.assign import version_key

    other = data.draw(st.lists(st.integers(min_value=0, max_value=10**40), min_size=1, max_size=4))
    zeros = data.draw(st.integers(min_value=0, max_value=3))

    def text(ps: list[int]) -> str:
        return ".".join("0" * zeros + str(p) for p in ps)

    a, b = version_key(text(parts)), version_key(text(other))
    assert (a < b) == (tuple(parts) < tuple(other))
    assert (a == b) == (parts == other)
