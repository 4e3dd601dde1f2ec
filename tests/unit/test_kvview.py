"""The latest-value views (load reports, top bundles): hostile values are skipped by reason and keep the
key's last good value; a history gap makes the view re-read the topic, never stop."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import msgspec
import pytest

from tests.support.waiting import wait_for
from trimtab.channel.memory import MemoryLog, MemoryTransport
from trimtab.cluster.kvview import KeyValueView


class Report(msgspec.Struct, frozen=True):
    broker: str
    load: float


def enc(r: Report) -> bytes:
    return msgspec.json.encode(r)


@pytest.fixture
def views() -> Iterator[list[KeyValueView[Report]]]:
    made: list[KeyValueView[Report]] = []
    yield made
    for v in made:
        v.stop()


def view_of(views: list[KeyValueView[Report]], log: MemoryLog, **kw: int) -> KeyValueView[Report]:
    v = KeyValueView(MemoryTransport(log), "loads", Report, **kw)
    views.append(v)
    v.start()
    wait_for(lambda: v.ready, message="the view catches up")
    return v


def test_hostile_values_are_skipped_by_reason_and_keep_the_last_good_value(
    views: list[KeyValueView[Report]],
) -> None:
    log = MemoryLog(default_partitions=2)
    log.append("loads", b"b1", enc(Report("b1", 0.5)))
    hostile = {
        b'{"broker":"b1\xc3","load":0.9}': "invalid_utf8",
        b"\xef\xbb\xbf" + enc(Report("b1", 0.9)): "bom",
        b'{"broker":"b1","load":0.9,"x":' + b"[" * 40 + b"]" * 40 + b"}": "too_deep",
        b'{"broker":"\\ud800","load":0.9}': "lone_surrogate",
        b'{"broker":"b1","load":"high"}': "invalid",
        b'{"broker":"b1","load":0.9,"n":99999999999999999999}': "int_out_of_range",
        b"x" * 2000: "too_large",
        b"\x00junk": "malformed",
    }
    for value in hostile:
        log.append("loads", b"b1", value)
    log.append("loads", None, enc(Report("b2", 0.1)))
    log.append("loads", b"\xff", enc(Report("b2", 0.1)))
    v = view_of(views, log, max_bytes=1000)
    assert v.values == {"b1": Report("b1", 0.5)}
    expected: dict[str, int] = {"bad_key": 2}
    for reason in hostile.values():
        expected[reason] = expected.get(reason, 0) + 1
    assert dict(v.skipped) == expected
    # It keeps following: a later good report replaces the old one.
    log.append("loads", b"b1", enc(Report("b1", 0.7)))
    wait_for(lambda: v.values.get("b1") == Report("b1", 0.7), message="the view follows the tail")


def test_a_history_gap_rereads_the_topic_instead_of_stopping(views: list[KeyValueView[Report]]) -> None:
    log = MemoryLog(default_partitions=1)
    for i in range(3):
        log.append("loads", f"b{i}".encode(), enc(Report(f"b{i}", i / 10)))
    v = view_of(views, log)
    first = v.follower
    gate = threading.Event()
    entered = threading.Event()

    def block(key: str, _value: Report | None) -> None:
        if key == "slow":  # a paused reader: it stays inside this batch
            entered.set()
            assert gate.wait(10)

    v.add_listener(block)
    log.append("loads", b"slow", enc(Report("slow", 0.0)))
    assert entered.wait(10)
    for i in range(3, 6):
        log.append("loads", f"b{i}".encode(), enc(Report(f"b{i}", i / 10)))
    log.append("loads", b"b0", enc(Report("b0", 0.9)))
    log.truncate("loads", 0, 6)  # retention deletes offsets 4 and 5 before the reader gets to them
    gate.set()
    wait_for(lambda: v.gaps == 1, message="the gap is counted")
    wait_for(lambda: v.values.get("b0") == Report("b0", 0.9), message="the view reads what is retained")
    assert v.follower is not first and v.ready
    assert {"b1", "b2", "slow"} <= set(v.values)  # values read before the gap are kept
