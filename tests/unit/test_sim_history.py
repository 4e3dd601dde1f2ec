"""A scenario rebuilt from a recorded history (what `pipeline tune` replays), and the tuner's pure parts."""

from __future__ import annotations

from typing import Any

import pytest

from trimtab.errors import ConfigError
from trimtab.pipeline.sweep import expand, rank_key, toml_snippet
from trimtab.sim.history import scenario_from_history
from trimtab.sim.run import simulate

T0 = 1_700_000_000_000
A, B = "t/a/0x00000000_0x80000000", "t/a/0x80000000_0xffffffff"
C = "t/c/0x00000000_0xffffffff"


def load(broker: str, minute: float, rate: float, tombstone: bool = False) -> dict[str, Any]:
    return {
        "broker": broker,
        "reported_at": T0 + int(minute * 60_000),
        "msg_rate_in": rate,
        "tombstone": tombstone,
    }


def top(broker: str, minute: float, bundle: str, rate: float, topics: int = 10) -> dict[str, Any]:
    return {
        "broker": broker,
        "reported_at": T0 + int(minute * 60_000),
        "bundle": bundle,
        "msg_rate_in": rate,
        "topics": topics,
    }


def history() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    loads = [load("b1", 0, 3000), load("b2", 0.5, 1000), load("b1", 5, 3000), load("b2", 5, 1000)]
    loads += [load("b3", 6, 0), load("b1", 10, 9000), load("b2", 10, 1000), load("b3", 10, 0)]
    loads += [load("b2", 11, 0, tombstone=True), load("b1", 15, 9000), load("b3", 15, 1000)]
    tops = [top("b1", 0, A, 2000), top("b1", 0, B, 1000), top("b2", 0.5, C, 1000, topics=5)]
    tops += [top("b1", 10, A, 6000), top("b1", 10, B, 3000), top("b2", 10, C, 1000, topics=5)]
    channel = [
        {"bundle": A, "state": "owned", "offset": 3},
        {"bundle": B, "state": "assigning", "offset": 4},
        {"bundle": B, "state": "owned", "offset": 9},
        {"bundle": C, "state": "owned", "offset": 5},
        {"bundle": "garbage", "state": "owned", "offset": 1},
    ]
    return loads, tops, channel


def test_membership_traffic_and_namespaces_are_rebuilt() -> None:
    sc = scenario_from_history(*history(), bucket_s=300)
    assert sc.broker_specs() and len(sc.broker_specs()) == 2  # b1 and b2 report in the first bucket
    ns = {n.name: n for n in sc.namespaces}
    assert set(ns) == {"t/a", "t/c"}
    assert ns["t/a"].bundles == 2 and ns["t/c"].bundles == 1 and ns["t/c"].topics == 5
    # Bucket 0: 4000 msg/s in total, t/a 3/4 of the top-bundle rates, t/c 1/4.
    assert ns["t/a"].msg_rate == pytest.approx(3000) and ns["t/c"].msg_rate == pytest.approx(1000)
    actions = [(e.at_s, e.action) for e in sc.events]
    assert (300.0, "add_brokers") in actions  # b3 joins in bucket 1
    assert (900.0, "remove_brokers") in actions  # b2 stopped with a tombstone in bucket 2
    scale = [e for e in sc.events if e.action == "load_scale"]
    # Bucket 2: 10 000 msg/s, t/a 9/10 -> 9000 (x3 of 3000); t/c 1000 (unchanged, no event for it).
    assert scale and scale[0].at_s == 600.0 and scale[0].load_scale == {"t/a": 3.0}
    assert sc.duration_s == 4 * 300


def test_the_replay_runs_in_the_simulator() -> None:
    sc = scenario_from_history(*history(), bucket_s=300)
    report, _ = simulate(sc)
    assert report["policies"]["transfer"]["violations_total"] == 0


def test_an_empty_or_hostile_history_is_refused_with_a_reason() -> None:
    with pytest.raises(ConfigError, match="no broker load report"):
        scenario_from_history([], [])
    hostile: list[dict[str, Any]] = [{"broker": 7, "reported_at": "x"}, {"broker": "b", "reported_at": None}]
    with pytest.raises(ConfigError, match="no broker load report"):
        scenario_from_history(hostile, [])
    with pytest.raises(ConfigError, match="namespace"):
        scenario_from_history([load("b1", 0, 10)], [top("b1", 0, "not a bundle", 5)])
    # NaN, negative and absurd rates are read as 0, not as a crash.
    loads = [load("b1", 0, float("nan")), load("b2", 0, -5)]
    sc = scenario_from_history(loads, [top("b1", 0, A, float("inf"))])
    assert sc.namespaces[0].msg_rate == 0


def test_the_grid_expands_to_every_combination_and_refuses_bad_keys() -> None:
    configs = expand({"shedding.interval_s": [30, 60], "split.max_msg_rate": [1, 2, 3]})
    assert len(configs) == 6
    assert {"shedding": {"interval_s": 30}, "split": {"max_msg_rate": 3}} in configs
    with pytest.raises(ConfigError, match=r"section\.field"):
        expand({"interval_s": [1]})
    with pytest.raises(ConfigError, match="at most"):
        expand({f"s.f{i}": [1, 2] for i in range(13)})


def test_ranking_prefers_balanced_then_fewer_moves_and_the_snippet_names_only_changes() -> None:
    rows = [
        {"index": 0, "time_to_balance_s": None, "moves": 1, "violations_total": 0},
        {"index": 1, "time_to_balance_s": 90.0, "moves": 30, "violations_total": 0},
        {"index": 2, "time_to_balance_s": 90.0, "moves": 20, "violations_total": 0},
        {"index": 3, "time_to_balance_s": 10.0, "moves": 5, "violations_total": 1},
        {"index": 4, "error": "bad"},
    ]
    assert [r["index"] for r in sorted(rows, key=rank_key)] == [2, 1, 0, 3, 4]
    snippet = toml_snippet(
        {"shedding": {"interval_s": 30.0, "hit_count_threshold": 3}}, {"shedding": {"hit_count_threshold": 3}}
    )
    assert snippet.strip() == "[shedding]\ninterval_s = 30.0"


def test_steady_brokers_reporting_at_different_offsets_give_steady_traffic() -> None:
    """Brokers report on their own timers: with buckets shorter than the report interval, only some
    brokers (and some of their top bundles) fall into each bucket. The traffic is taken as of each bucket,
    so a steady cluster replays as steady -- no load_scale events, the full rate from the first bucket."""
    loads: list[dict[str, Any]] = [load("b2", 0.5, 1000)]
    tops = [top("b2", 0.5, B, 1000)]
    for i in range(6):  # b1 every 10 minutes from 0, b2 every 10 minutes from 5; buckets of 5 minutes
        loads += [load("b1", 10 * i, 3000), load("b2", 10 * i + 5, 1000)]
        tops += [top("b1", 10 * i, A, 2000), top("b1", 10 * i, C, 1000), top("b2", 10 * i + 5, B, 1000)]
    loads.append(load("b1", 55.5, 3000))  # both report in the last bucket: neither stopped
    sc = scenario_from_history(loads, tops, bucket_s=300)
    ns = {n.name: n for n in sc.namespaces}
    assert ns["t/a"].msg_rate == pytest.approx(3000) and ns["t/c"].msg_rate == pytest.approx(1000)
    assert [e for e in sc.events if e.action == "load_scale"] == []


def test_a_departed_brokers_bundles_stop_counting_and_a_moved_bundle_counts_once() -> None:
    # b2 serves C and leaves with a tombstone in bucket 1; from bucket 2 b1 reports C (it moved there) at
    # the same rate, and in bucket 3 A doubles.
    loads = [load("b1", 0, 1000), load("b2", 0, 1000), load("b2", 6, 0, tombstone=True)]
    loads += [load("b1", 10, 2000), load("b1", 15, 3000), load("b1", 20, 3000)]
    tops = [top("b1", 0, A, 1000), top("b2", 0, C, 1000)]
    tops += [top("b1", 10, A, 1000), top("b1", 10, C, 1000), top("b1", 15, A, 2000)]
    sc = scenario_from_history(loads, tops, bucket_s=300)
    scale = [(e.at_s, e.load_scale) for e in sc.events if e.action == "load_scale"]
    # Bucket 3: 3000 msg/s; t/a 2000 of the top rates (A as of minute 15), t/c 1000 (C as of minute 10,
    # counted once although two brokers reported it) -> t/a x2, t/c unchanged.
    assert scale == [(900.0, {"t/a": 2.0})]
