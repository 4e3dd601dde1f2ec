"""Offline replay of a JSON-lines channel export, and the report it prints."""

from __future__ import annotations

import json
from typing import Any

from channel.replayfile import replay_lines, table_report

K1 = "t/ns/0x00000000_0x80000000"
K2 = "t/ns/0x80000000_0xffffffff"


def record(
    state: str, version: int, dst: str | None = None, src: str | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "schema": 1,
        "state": state,
        "dst": dst,
        "src": src,
        "version": version,
        "force": False,
        "ts": 1700000000000 + version,
        "writer": "a:1",
        **extra,
    }


def line(key: Any, value: Any) -> str:
    return json.dumps({"key": key, "value": value})


def test_replay_lines_and_report() -> None:
    lines = [
        line(K1, record("assigning", 1, dst="a:1")),
        line(K1, record("owned", 2, dst="a:1")),
        line(K1, record("owned", 2, dst="b:2")),  # lost the race: rejected
        "",  # blank lines are not messages
        "   ",
        "this is not json",
        json.dumps([K1, None]),  # JSON, wrong shape
        json.dumps({"key": K1}),  # no value
        json.dumps({"key": 5, "value": None}),  # key not a string
        line(K2, record("assigning", 1, dst="b:2")),
        line(K2, record("owned", 2, dst="b:2")),
        line(K2, record("releasing", 3, src="b:2")),
        line(K2, record("free", 4, src="b:2")),
        line(K2, None),  # tombstone: back to Init, absent from the table
        line("not-a-bundle", record("assigning", 1, dst="a:1")),  # skipped: bad key
        line(K1, {"schema": 2}),  # skipped: future schema
        line(K1, "owned"),  # skipped: malformed
    ]
    view = replay_lines(lines)
    report = table_report(view)
    assert report == {
        "table": {K1: record("owned", 2, dst="a:1")},
        "stats": {"accepted": 7, "rejected": 1, "skipped": 7},
    }
    assert view.stats.skipped == {"bad_line": 4, "bad_key": 1, "future_schema": 1, "malformed": 1}


def test_bytes_and_str_lines_are_the_same() -> None:
    text = [line(K1, record("assigning", 1, dst="a:1")), "garbage", line(K1, record("owned", 2, dst="a:1"))]
    as_bytes = [t.encode() + b"\n" for t in text]
    a, b = replay_lines(text), replay_lines(as_bytes)
    assert table_report(a) == table_report(b)
    assert table_report(a)["stats"] == {"accepted": 2, "rejected": 0, "skipped": 1}


def test_bad_lines_do_not_reorder_the_log() -> None:
    """A bad line between two records must not change the order they are applied in."""
    lines = [
        line(K1, record("assigning", 1, dst="a:1")),
        "{",
        line(K1, record("owned", 2, dst="a:1")),
        "{",
        line(K1, record("releasing", 3, src="a:1", dst="b:2")),
    ]
    report = table_report(replay_lines(lines))
    assert report["table"] == {K1: record("releasing", 3, src="a:1", dst="b:2")}
    assert report["stats"] == {"accepted": 3, "rejected": 0, "skipped": 2}


def test_report_is_sorted_and_json_ready() -> None:
    lines = [
        line(K2, record("assigning", 1, dst="b:2")),
        line(K1, record("assigning", 1, dst="a:1", note="extra fields are ignored")),
    ]
    report = table_report(replay_lines(lines))
    assert list(report["table"]) == [K1, K2]
    assert report["table"][K1] == record("assigning", 1, dst="a:1")
    assert json.loads(json.dumps(report)) == report


def test_empty_input() -> None:
    assert table_report(replay_lines([])) == {
        "table": {},
        "stats": {"accepted": 0, "rejected": 0, "skipped": 0},
    }
