"""Smoke test of the channel benchmark (``bench channel``) at a small size, Kafka part included.

It checks that the bench runs end to end, prints one JSON object with every figure, and that its
correctness checks hold; it never asserts on speed (docs/design.md section 11: performance is measured by
benchmarks, not by timed tests).
"""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from trimtab.devkit.bench.channel import check_table, generate_log, replay_once
from trimtab.devkit.bench.cli import bench
from trimtab.devkit.bench.common import BenchError

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FIGURES = (
    "replay_records_per_s",
    "replay_records_per_s_runs",
    "bootstrap_1m_s",
    "bootstrap_1m_s_fresh_process",
    "kafka_consume_only_1m_s",
    "bootstrap_snapshot_1m_s",
    "bytes_per_bundle",
    "bytes_per_bundle_live",
    "bytes_per_bundle_1m_bundles",
    "bytes_per_bundle_1m_bundles_live",
)


def test_bench_channel_small_run_reports_every_figure_and_passes_its_checks() -> None:
    result = CliRunner().invoke(
        bench,
        [
            "channel",
            "--records", "20000",
            "--bundles", "2000",
            "--runs", "1",
            "--kafka-runs", "1",
            "--memory-bundles", "2000",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = orjson.loads(result.stdout)  # stdout is the JSON object alone

    for key in FIGURES:
        assert isinstance(out[key], int | float | list), f"{key} missing or null: {out.get(key)!r}"
        assert out[key], f"{key} is empty or zero"
    assert out["replay_records_per_s_target"] == 1_000_000
    assert out["bootstrap_1m_s_target"] == 2.0
    assert out["bytes_per_bundle_target"] == 200
    assert len(out["replay_records_per_s_runs"]) == 1
    assert set(out["meets_targets"]) == {"replay_records_per_s", "bootstrap_1m_s", "bytes_per_bundle"}

    checks = {k: v for k, v in out["checks"].items() if k != "note"}
    assert checks and all(v is True for v in checks.values()), checks

    log = out["log"]
    assert log["records"] == 20000
    assert log["bundles"] == log["bundles_in_table"] == 2000
    intended = log["intended"]
    assert intended["accepted"] + intended["rejected"] + intended["skipped"] == 20000
    assert intended["rejected"] > 0 and intended["skipped"] > 0
    for k in ("accepted", "rejected", "skipped"):
        assert out["replay"][k] == intended[k]
    assert out["replay"]["gc_frozen"] is True
    assert out["memory"]["one_million_bundles"]["bundles"] == 2000
    assert out["kafka"]["bootstrap_details_run1"]["records_replayed"] == 20000
    assert out["kafka"]["bootstrap_details_run1"]["snapshot_used"] is False
    assert {"python", "cpu_count", "loadavg_start", "loadavg_end"} <= out["env"].keys()


def test_generator_is_seeded_and_the_checks_catch_a_wrong_replay() -> None:
    a = generate_log(3000, 300, seed=5)
    b = generate_log(3000, 300, seed=5)
    assert a.messages == b.messages
    assert a.messages != generate_log(3000, 300, seed=6).messages
    assert a.expected_stats()["rejected_by_reason"] == {"stale_version": a.expected_stats()["rejected"]}

    table, _, _ = replay_once([a.messages], a.partitions)
    check_table(table, a, "full log")  # the intended result

    # One accepted record missing from the middle of the log: the bench must refuse to report a figure.
    drop = next(i for i, m in enumerate(a.messages) if i > 1000 and b'"state":"owned"' in (m.value or b""))
    broken, _, _ = replay_once([a.messages[:drop] + a.messages[drop + 1 :]], a.partitions)
    with pytest.raises(BenchError):
        check_table(broken, a, "log with a record dropped")


def test_a_wrong_replay_fails_the_bench_without_printing_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    import trimtab.channel.table as channel_table
    from trimtab.channel.resolve import ACCEPT

    monkeypatch.setattr(channel_table, "resolve", lambda *_: ACCEPT)  # first-writer-wins broken: all accepted
    result = CliRunner().invoke(
        bench,
        [
            "channel",
            "--records",
            "4000",
            "--bundles",
            "400",
            "--runs",
            "1",
            "--skip-kafka",
            "--memory-bundles",
            "0",
        ],
    )
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "FAILED" in result.stderr
