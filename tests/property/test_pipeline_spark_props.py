"""``pipeline compact`` on real Spark (local mode) equals ``trimtab channel replay`` on random exports.

The same random exports as tests/property/test_pipeline_fold_props.py (racing and stale writers, splits,
overrides, tombstones, poison values, bad keys, wrong partitions, junk lines, re-delivered offsets), cut
into many small byte ranges and folded by several tasks: a handful of examples, because every one is a
Spark job; the fold itself gets many more examples without Spark in that module.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import channel_logs
from test_pipeline_fold_props import export_bytes

from trimtab.channel.replayfile import replay_lines, report_json, table_report
from trimtab.pipeline.compact import compact_export

SLOW_OK = [
    HealthCheck.too_slow,
    HealthCheck.data_too_large,
    HealthCheck.large_base_example,
    HealthCheck.function_scoped_fixture,
]


@settings(max_examples=3, deadline=None, suppress_health_check=SLOW_OK)
@given(data=st.data())
def test_compact_on_spark_equals_channel_replay(data: st.DataObject, spark: Any, tmp_path: Path) -> None:
    log = data.draw(channel_logs(st.one_of(st.none(), st.integers(1, 3)), max_steps=60))
    body, override = export_bytes(data, log)
    path = tmp_path / "export.jsonl"
    path.write_bytes(body)
    expected = report_json(table_report(replay_lines(io.BytesIO(body), partitions=override)))
    result = compact_export(
        spark, str(path), partitions=override, split_bytes=max(64, len(body) // 5), min_splits=3, tasks=3
    )
    assert report_json(result.report) == expected
