"""Smoke tests of the lookup, shed, failover and storm benchmarks at tiny sizes.

Each runs the real command end to end (the lookup and failover ones with a LocalCluster: real ZooKeeper,
the Kafka mock, agent and controller processes), parses the one JSON object on stdout and checks that every
figure is there and that the bench's own correctness checks held. Speed is never asserted (docs/design.md
section 11: performance is measured by benchmarks, not by timed tests).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from trimtab.devkit.bench.cli import bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def invoke(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(bench, list(args))
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    out: dict[str, Any] = orjson.loads(result.stdout)  # stdout is the JSON object alone
    return out


def assert_checks(out: dict[str, Any]) -> None:
    checks = {k: v for k, v in out["checks"].items() if k != "note"}
    assert checks and all(v is True for v in checks.values()), checks
    assert {"python", "cpu_count", "loadavg_start", "loadavg_end"} <= out["env"].keys()


def assert_number(out: dict[str, Any], *keys: str) -> None:
    for key in keys:
        assert isinstance(out[key], int | float) and out[key] >= 0, f"{key}: {out.get(key)!r}"


def test_bench_shed_small() -> None:
    out = invoke("shed", "--brokers", "50", "--bundles", "2000", "--runs", "3")
    assert out["bench"] == "shed"
    assert_number(
        out,
        "decision_ms",
        "decision_ms_p99",
        "threshold_decision_ms",
        "decision_with_inputs_ms",
        "shed_cycle_ms",
        "inputs_only_ms",
        "heal_plan_ms",
        "assign_decision_ms",
        "assign_decision_ms_p99",
        "assign_scan_ms_p99",
        "standby_change_ms_p99",
        "standby_full_pass_s",
    )
    assert out["decision_ms_target"] == 50.0 and out["heal_plan_ms_target"] == 1000.0
    assert out["assign_decision_ms_p99_target"] == 1.0 and out["standby_change_ms_p99_target"] == 1.0
    assert out["decisions"] > 0 and out["threshold_decisions"] > 0
    assert out["inputs"]["brokers"] == 50 and out["inputs"]["bundles"] == 2000
    assert len(out["transfer_shedder"]["timing_ms"]["runs"]) == 3
    assert set(out["meets_targets"]) == {
        "decision_ms",
        "decision_ms_p99",
        "decision_with_inputs_ms",
        "heal_plan_ms",
        "assign_decision_ms_p99",
        "standby_change_ms_p99",
    }
    assert_checks(out)


def test_bench_lookup_small() -> None:
    out = invoke(
        "lookup",
        "--topics", "32",
        "--lookups", "50",
        "--concurrency", "3",
        "--assign-samples", "50",
        "--rtt-samples", "50",
        "--follower-samples", "20",
        "--alternative-fetch-wait-ms", "1",
        "--one-core-seconds", "1",
    )  # fmt: skip
    # One agent on one core under wrk: every answer checked by the wrk script, else the bench fails.
    assert_number(out, "owned_lookups_per_s_one_core", "owned_lookup_p99_ms_half_rate")
    one = out["one_core"]
    assert [r["connections"] for r in one["runs"]] == [8, 16, 32]
    assert all(r["requests"] > 0 and r["errors_answer"] == 0 for r in [*one["runs"], one["half_rate"]])
    assert set(out["meets_targets"]) >= {"owned_lookups_per_s_one_core", "owned_lookup_p99_ms_half_rate"}
    headline = (
        "owned_lookup_p50_ms",
        "owned_lookup_p99_ms",
        "owned_lookups_per_s",
        "assign_p50_ms",
        "assign_p99_ms",
        "raw_rtt_p50_ms",
        "raw_rtt_p99_ms",
        "assign_vs_rtt_ratio",
        "follower_rtt_p50_ms",
        "follower_rtt_p99_ms",
    )
    assert out["bench"] == "lookup"
    assert_number(out, *headline)
    assert out["assign_vs_rtt_ratio_target"] == 2.0
    assert out["settings"]["kafka.fetch_wait_max_ms"] == 100  # the default
    assert out["owned"]["concurrency"] == 3 and out["owned"]["lookups"] == 50
    assert out["assign"]["samples"] == 50 and out["raw_rtt"]["samples"] == 50
    assert out["assign"]["breakdown"]["segments_ms"]["assigning_to_owned"]["n"] == 50
    alt = out["alternative"]
    assert alt["settings"]["kafka.fetch_wait_max_ms"] == 1
    assert_number(alt, *headline)
    assert_checks(out)


def test_bench_failover_small() -> None:
    # A per-broker throttle below the bundle count: healing needs several rounds and must defer, not
    # orphan, what does not fit (the bench fails if a bundle ends Free).
    out = invoke(
        "failover",
        "--bundles", "500",
        "--per-namespace", "250",
        "--session-timeout-s", "3",
        "--raised", "never",
        "--set", "healing.max_in_flight_per_broker=100",
    )  # fmt: skip
    assert out["bench"] == "failover"
    assert_number(
        out,
        "failover_s",
        "failover_s_target",
        "detection_s",
        "detection_measured_s",
        "first_override_s",
        "failover_after_detection_s",
    )
    assert out["detection_s"] == 3.0 and out["failover_s_target"] == 4.0
    assert out["bundles"] == 500
    assert out["settings"]["healing.max_in_flight_per_broker"] == 100
    healing = out["healing"]
    assert healing["overrides_accepted"] == 500
    assert sum(healing["final_owners"].values()) == 500
    assert sum(1 for r in healing["leader_rounds"] if r["event"] == "healing_overrides") >= 2
    assert out["raised_throttles"] is None
    assert_checks(out)


def test_bench_storm_small() -> None:
    """A broker dies while clients ask for its topics through the survivors: every topic answered with a
    live owner (the wrk script checks each answer; any other fails the bench), each bundle assigned once."""
    out = invoke(
        "storm",
        "--bundles", "200",
        "--per-namespace", "100",
        "--agents", "3",
        "--topics-per-bundle", "3",
        "--clients", "20",
        "--session-timeout-s", "3",
    )  # fmt: skip
    assert out["bench"] == "storm"
    assert_number(out, "lookup_storm_s", "lookup_storm_errors", "detection_s", "last_owned_after_detection_s")
    assert out["lookups"] == 600 and out["bundles"] == 200 and out["clients"] == 20
    assert out["assignments_per_bundle_max"] == 1
    assert sum(w["answers"] for w in out["wrk"]) == 600 and len(out["wrk"]) == 2
    assert set(out["meets_targets"]) == {
        "lookup_storm_s",
        "lookup_storm_errors",
        "assignments_per_bundle_max",
    }
    assert_checks(out)


def test_bench_failover_standbys_small() -> None:
    out = invoke(
        "failover",
        "--bundles", "200",
        "--per-namespace", "100",
        "--session-timeout-s", "3",
        "--raised", "never",
        "--standbys", "1",
    )  # fmt: skip
    side = out["standbys"]
    assert side["replicas"] == 1
    for run in ("cold", "warm"):
        assert_number(side[run], "failover_s", "failover_after_detection_s")
    assert set(side["failover_after_detection_s"]) == {"cold", "warm"}
    assert_checks(out)


def test_bench_placement_small() -> None:
    out = invoke("placement", "--bundles", "4000")
    assert out["bundles"] == 4000
    assert_number(
        out, "build_s", "candidates_cold_s", "candidates_warm_s", "standbys_10k_bundles_2_replicas_s"
    )
    assert out["meets_targets"] == {"candidates_s": True}


def test_bench_compiled_small() -> None:
    """The mypyc prototype compiles the two modules, replays with each and checks both tables."""
    out = invoke("compiled", "--records", "20000", "--bundles", "2000", "--runs", "1")
    assert out["bench"] == "compiled"
    assert_number(out, "replay_records_per_s_interpreted", "replay_records_per_s_compiled", "speedup")
    assert out["compiled_modules"] == ["trimtab/channel/resolve.py", "trimtab/channel/table.py"]


def test_bench_agent_memory_small() -> None:
    """A real agent bootstraps a channel of 2 000 bundles: its RSS is measured once its own metrics say
    it holds every bundle (the bench fails otherwise)."""
    out = invoke("agent-memory", "--bundles", "2000", "--owners", "10", "--samples", "2")
    assert out["bench"] == "agent-memory"
    assert_number(out, "agent_rss_mb", "agent_rss_mb_peak", "agent_rss_mb_empty", "agent_ready_s")
    assert len(out["agent_rss_mb_runs"]) == 2
    assert out["table_seen_by_the_agent"] == {
        "owned": 2000,
        "accepted": 4000,
        "rejected_or_skipped": 0,
        "ready": 1,
    }
    assert_checks(out)


def test_bench_kafka_restarts_small() -> None:
    """Whole-cluster Kafka restarts: every follower reads again (the stall watch cures what librdkafka
    leaves stalled)."""
    out = invoke("kafka-restarts", "--cycles", "1", "--followers", "2", "--brokers", "1", "--outage-s", "1")
    assert out["bench"] == "kafka-restarts"
    assert_checks(out)
    assert out["followers_stuck"] == 0 and out["ends_unreadable_cycles"] == 0
    assert_number(out, "stalls_cured", "catch_up_s_max", "records_acknowledged")
    [row] = out["rounds"]
    assert row["outage_s"] == 1 and set(row["caught_up_s"]) == {"f0", "f1"}


def test_bench_sim_profile_small() -> None:
    """The simulator's ceiling: production code's share of a run, and the speed it bounds from above."""
    out = invoke("sim-profile", "--scenario", "sim/scenarios/small-scale-out.yaml")
    assert out["bench"] == "sim-profile"
    assert_number(out, "sim_speedup", "production_code_share", "sim_speedup_ceiling")
    assert 0 < out["production_code_share"] <= 1
    assert out["sim_speedup_ceiling"] >= out["sim_speedup"]
    assert abs(sum(out["own_time_share_by_package"].values()) - 1) < 0.01
    assert {"agent", "balance", "channel", "sim"} <= out["own_time_share_by_package"].keys()
