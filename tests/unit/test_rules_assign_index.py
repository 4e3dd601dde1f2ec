"""The assignment index's own rules (balance/assign_index.py; docs/testing.md).

:class:`AssignIndex` must answer what :func:`select_broker` answers (the default filters, no placement
rule) from the same random state; the property tests check that over random histories. These tests sit
where its bookkeeping can break without a random history noticing: a report exactly TTL old (when the
index is built and when the report ages while indexed), a score that leaves the index and comes back (a
score of 0, a score that is not a number, a broker at the topic limit), the cut of the best set moving up,
the average as a correctly rounded sum, the rebuild condition, the version shortcut, and the bound on the
heap of report ages. Every decision is compared with the scan's over several seeds; loads on a line are
dyadic fractions.
"""

from __future__ import annotations

import math
import random

from trimtab.balance.assign import AssignContext, BrokerInfo, Selection, select_broker
from trimtab.balance.assign_index import AssignIndex
from trimtab.balance.load import BrokerLoadData

NOW = 100_000_000
TTL_S = 60.0
TTL_MS = 60_000
MAX_TOPICS = 100
BUNDLE = "t/ns/0x00000000_0xffffffff"
SEEDS = range(40)


def info(b: str, version: str = "1.0.0") -> BrokerInfo:
    return BrokerInfo(id=b, service_url=f"svc://{b}", http_url=f"http://{b}", version=version)


def report(b: str, ema: float, *, at: int = NOW, topics: int = 0) -> BrokerLoadData:
    return BrokerLoadData(broker=b, weighted_max_ema=ema, updated_at=at, topics=topics)


def brokers_of(*ids: str) -> dict[str, BrokerInfo]:
    return {b: info(b) for b in ids}


def indexed(
    index: AssignIndex,
    brokers: dict[str, BrokerInfo],
    seed: int,
    *,
    now: int = NOW,
    exclude: frozenset[str] = frozenset(),
    diff: float = 0.1,
    prefer: bool = False,
) -> Selection | None:
    return index.select(
        brokers,
        random.Random(seed),
        now_ms=now,
        load_ttl_s=TTL_S,
        max_topics=MAX_TOPICS,
        prefer_later_versions=prefer,
        exclude=exclude,
        diff=diff,
    )


def scanned(
    brokers: dict[str, BrokerInfo],
    loads: dict[str, BrokerLoadData],
    seed: int,
    *,
    now: int = NOW,
    exclude: frozenset[str] = frozenset(),
    diff: float = 0.1,
    prefer: bool = False,
) -> Selection:
    ctx = AssignContext(
        loads=loads,
        now_ms=now,
        load_ttl_s=TTL_S,
        max_topics=MAX_TOPICS,
        prefer_later_versions=prefer,
        exclude=exclude,
    )
    return select_broker(BUNDLE, brokers, ctx, random.Random(seed), diff=diff)


def picks(
    index: AssignIndex,
    brokers: dict[str, BrokerInfo],
    loads: dict[str, BrokerLoadData],
    *,
    now: int = NOW,
    exclude: frozenset[str] = frozenset(),
    diff: float = 0.1,
    prefer: bool = False,
) -> set[str | None]:
    """The index's picks over many seeds, each asserted equal to the scan's (broker and candidates)."""
    got: set[str | None] = set()
    for seed in SEEDS:
        sel = indexed(index, brokers, seed, now=now, exclude=exclude, diff=diff, prefer=prefer)
        want = scanned(brokers, loads, seed, now=now, exclude=exclude, diff=diff, prefer=prefer)
        assert sel is not None, "the index declined a case it covers"
        assert (sel.broker, sel.candidates, sel.reason) == (want.broker, want.candidates, want.reason)
        got.add(sel.broker)
    return got


def test_a_report_exactly_ttl_old_counts_when_the_index_is_built() -> None:
    """Rule: a report exactly TTL old is fresh when the index scores it (``now - updated_at <= ttl``, as
    the scan), one a millisecond older is not, and the TTL is ``load_ttl_s`` seconds in milliseconds: a,
    at 0 and exactly TTL old, is the only best broker; c, at 0 but TTL + 1 ms old, is not scored."""
    brokers = brokers_of("a", "b", "c", "d")
    loads = {
        "a": report("a", 0.0, at=NOW - TTL_MS),
        "b": report("b", 0.5),
        "c": report("c", 0.0, at=NOW - TTL_MS - 1),
        "d": report("d", 0.5),
    }
    index = AssignIndex(loads)
    assert picks(index, brokers, loads) == {"a"}


def test_an_indexed_report_turns_stale_only_after_the_ttl() -> None:
    """Rule: a report the index holds leaves the scores when it is more than TTL old, not when it is
    exactly TTL old (the expiry heap uses the scan's ``<=`` too): TTL after it, a (at 0) is still the only
    best broker, while c (at 0, reported 1 ms earlier) is gone."""
    brokers = brokers_of("a", "b", "c", "d")
    loads = {
        "a": report("a", 0.0),
        "b": report("b", 0.5),
        "c": report("c", 0.0, at=NOW - 1),
        "d": report("d", 0.5),
    }
    index = AssignIndex(loads)
    assert picks(index, brokers, loads) == {"a", "c"}
    later = NOW + TTL_MS
    for b in ("b", "d"):
        loads[b] = report(b, 0.5, at=later)
        index.load_changed(b)
    assert picks(index, brokers, loads, now=later) == {"a"}
    assert index.rebuilds == 1  # aged while indexed, not rebuilt


def test_a_decision_at_the_same_clock_reading_does_not_rebuild() -> None:
    """Rule: only a change of the brokers' mapping or of the settings, or a clock that went back, rebuilds
    the index (``rebuilds``, public); a decision at the same ``now_ms`` as the last absorbs the reports that
    arrived in between."""
    brokers = brokers_of("a", "b", "c")
    loads = {"a": report("a", 0.5), "b": report("b", 0.5), "c": report("c", 0.5)}
    index = AssignIndex(loads)
    assert picks(index, brokers, loads) == {"a", "b", "c"}
    assert index.rebuilds == 1
    loads["b"] = report("b", 0.0)
    index.load_changed("b")
    assert picks(index, brokers, loads) == {"b"}
    assert index.rebuilds == 1
    assert picks(index, brokers, loads, now=NOW - 1) == {"b"}  # the clock went back
    assert index.rebuilds == 2


def test_one_version_with_later_versions_preferred_is_indexed() -> None:
    """Rule: with ``prefer_later_versions`` on, the index leaves the decision to the scan only when the
    brokers run more than one version; all on one version, it answers (the version filter keeps them
    all)."""
    brokers = brokers_of("a", "b", "c")
    loads = {"a": report("a", 0.0), "b": report("b", 0.5), "c": report("c", 0.5)}
    index = AssignIndex(loads)
    assert picks(index, brokers, loads, prefer=True) == {"a"}
    brokers = {**brokers, "c": info("c", "2.0.0")}
    assert indexed(AssignIndex(loads), brokers, 0, prefer=True) is None


def test_versions_are_not_read_while_later_versions_are_not_preferred() -> None:
    """Rule: with ``prefer_later_versions`` off neither the scan nor the index computes a version key, so a
    version no key can be computed for -- a release number of 4 301 digits, which int() refuses -- does
    not stop the index (the scan ignores it too)."""
    brokers = {**brokers_of("a", "b"), "c": info("c", "1" * 4301 + ".0.0")}
    loads = {"a": report("a", 0.0), "b": report("b", 0.5), "c": report("c", 0.5)}
    index = AssignIndex(loads)
    assert picks(index, brokers, loads) == {"a"}


def test_a_score_that_was_not_a_number_is_indexed_again_once_it_is_one() -> None:
    """Rule: a broker whose score is not a finite number makes the index decline (the scan decides), and
    once it reports a number it is scored like any other: the index answers again, as the scan, also when
    it is the only broker with a report."""
    brokers = brokers_of("a", "b", "c")
    loads = {"a": report("a", math.nan)}
    index = AssignIndex(loads)
    assert indexed(index, brokers, 0) is None
    loads["a"] = report("a", 0.25)
    index.load_changed("a")
    assert picks(index, brokers, loads) == {"a", "b", "c"}  # nobody is diff below a lone average
    loads["b"] = report("b", 0.0)
    index.load_changed("b")
    assert picks(index, brokers, loads) == {"b"}


def test_a_score_of_zero_leaves_the_scores_when_it_is_replaced() -> None:
    """Rule: a new report replaces the old score, also a score of 0 (0 units in the exact sum): a, at 0
    and then at 1, is no longer among the best, which are b and c at .5 (average 2/3)."""
    brokers = brokers_of("a", "b", "c")
    loads = {"a": report("a", 0.0), "b": report("b", 0.5), "c": report("c", 0.5)}
    index = AssignIndex(loads)
    assert picks(index, brokers, loads) == {"a"}
    loads["a"] = report("a", 1.0)
    index.load_changed("a")
    assert picks(index, brokers, loads) == {"b", "c"}


def test_an_excluded_broker_at_the_topic_limit_does_not_stop_the_index() -> None:
    """Rule: the index declines for a fresh broker at the topic limit only when that broker is a
    candidate: excluded, it is no candidate anyway, and the index answers as the scan."""
    brokers = brokers_of("a", "b", "c")
    loads = {"a": report("a", 0.0, topics=MAX_TOPICS), "b": report("b", 0.0), "c": report("c", 0.5)}
    index = AssignIndex(loads)
    assert indexed(index, brokers, 0) is None
    assert picks(index, brokers, loads, exclude=frozenset({"a"})) == {"b"}


def test_a_broker_below_the_topic_limit_again_is_indexed_again() -> None:
    """Rule: a broker that was at the topic limit and reports fewer topics no longer makes the index
    decline: it answers again, as the scan."""
    brokers = brokers_of("a", "b", "c")
    loads = {"a": report("a", 0.0, topics=MAX_TOPICS), "b": report("b", 0.5), "c": report("c", 0.5)}
    index = AssignIndex(loads)
    assert indexed(index, brokers, 0) is None
    loads["a"] = report("a", 0.0, topics=MAX_TOPICS - 1)
    index.load_changed("a")
    assert picks(index, brokers, loads) == {"a"}


def test_brokers_that_join_the_best_set_as_the_average_rises_are_all_drawn() -> None:
    """Rule: when the average rises, every broker that is now ``diff`` below it joins the best set and is
    drawn as the scan draws it: a, b, c at .25 are no one's best while d is at .25 too, and all three are
    when d reports 1 (average .4375)."""
    brokers = brokers_of("a", "b", "c", "d")
    loads = {b: report(b, 0.25) for b in brokers}
    index = AssignIndex(loads)
    assert picks(index, brokers, loads) == {"a", "b", "c", "d"}
    loads["d"] = report("d", 1.0)
    index.load_changed("d")
    assert picks(index, brokers, loads) == {"a", "b", "c"}


def test_the_average_is_the_correctly_rounded_sum_over_the_count() -> None:
    """Rule: the line of the best set is ``fsum(scores) / count + 1e-9``, the sum rounded once, half to
    even: 1 + 2**-53 lies halfway between two doubles and rounds to 1, so with ``diff`` one double step
    above the line a broker at 0 is not best (a sum one unit of 2**-1074 off would round up, and it would
    be)."""
    brokers = brokers_of("x", "y", "z")
    scores = {"x": 1.0, "y": 2.0**-53, "z": 0.0}
    loads = {b: report(b, s) for b, s in scores.items()}
    line = math.fsum(scores.values()) / 3 + 1e-9
    assert math.fsum(scores.values()) == 1.0
    index = AssignIndex(loads)
    assert picks(index, brokers, loads, diff=math.nextafter(line, math.inf)) == {"x", "y", "z"}
    assert picks(index, brokers, loads, diff=line) == {"z"}


def test_the_heap_of_report_ages_is_compacted_beyond_twice_the_scores_plus_1024() -> None:
    """Rule: each report the index scores leaves an entry in its heap of report ages; the entries of
    replaced reports are dropped once the heap holds more than 2 x the scored brokers + 1024, and not
    before (memory bounded, and the O(brokers) compaction paid only every ~1024 reports). This reads the
    private heap (``_expiry``): its length is the rule. After the compaction a report still turns stale
    when its TTL has passed."""
    brokers = brokers_of("a", "b")
    loads = {"a": report("a", 0.0), "b": report("b", 0.5)}
    index = AssignIndex(loads)
    assert picks(index, brokers, loads) == {"a"}
    bound = 2 * 2 + 1024
    for _ in range(bound - 2):  # each decision scores b's new report: one entry more
        index.load_changed("b")
        assert indexed(index, brokers, 0) is not None
    assert len(index._expiry) == bound  # at the bound: kept
    index.load_changed("b")
    assert indexed(index, brokers, 0) is not None
    assert len(index._expiry) == 2  # beyond it: one entry per scored broker
    later = NOW + TTL_MS + 1
    loads["b"] = report("b", 0.5, at=later)
    index.load_changed("b")
    assert picks(index, brokers, loads, now=later) == {"a", "b"}  # a is stale: nobody is best
    assert index.rebuilds == 1
