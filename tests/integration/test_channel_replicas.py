"""Three processes replay one channel while racing writers publish conflicting transitions, and all three
end with identical tables (docs/design.md section 3.3), over the real Kafka protocol (librdkafka mock cluster).

The pytest process owns the mock cluster and runs the racing writers (threads, each a separate node with
its own producer, consumer and table view; see tests/support/channel_race.py). The replicas are separate
processes: ``trimtab channel dump`` run after the race, and live followers started before it. Each must
equal the others *and* an in-process full replay (``channel.table.replay``) of the same messages.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
import pytest

from tests.support.channel_race import RacingWriter, run_writers
from tests.support.kafka import MOCK_PARTITIONS, KafkaEnv, keys_per_partition
from tests.support.procs import Procs
from tests.support.waiting import wait_for
from trimtab.channel.replayfile import table_report
from trimtab.channel.table import replay
from trimtab.channel.transport import Follower

pytestmark = pytest.mark.integration

REPLICAS = 3
WRITERS = 4
BUNDLES = 16
ROUNDS = 16
END_PREFIX = "__end__/"


def reference(kafka: KafkaEnv) -> tuple[dict[str, Any], dict[str, Any]]:
    """Full in-process replay of everything in the channel now: (report as JSON, detailed stats)."""
    messages = kafka.read_all(kafka.channel_topic)
    view = replay(messages, partitions=MOCK_PARTITIONS)
    return normalise(table_report(view)), view.stats.detail()


def normalise(obj: Any) -> Any:
    return orjson.loads(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS))


def check_the_race_happened(
    detail: dict[str, Any], expected_skips: Counter[str], extra_skips: int = 0
) -> None:
    # Conflicting transitions really were published and rejected, by the same rule everywhere...
    assert detail["rejected"] > 0
    assert detail["rejected_by_reason"].get("stale_version", 0) > 0, "no writer ever lost a race"
    assert detail["accepted"] > BUNDLES
    # ...and every garbage record was skipped for the reason it was written with.
    assert detail["skipped"] == sum(expected_skips.values()) + extra_skips
    skipped = Counter(detail["skipped_by_reason"])
    skipped["bad_key"] -= extra_skips
    assert +skipped == expected_skips


def check_writer_views(writers: list[RacingWriter], kafka: KafkaEnv, ref_report: dict[str, Any]) -> None:
    """The writers' own in-process views (four more replicas), once caught up with the end of the log."""
    ends = {p: kafka.transport.watermarks(kafka.channel_topic, p)[1] for p in range(MOCK_PARTITIONS)}
    for w in writers:
        follower = w.client.follower
        assert follower is not None

        def at_end(f: Follower = follower) -> bool:
            return all(f.positions.get(p, 0) >= e for p, e in ends.items())

        wait_for(at_end, 15, message=f"{w.me}'s view reaches the end of the channel")
        assert normalise(table_report(w.client.table)) == ref_report, f"{w.me} diverged"


def test_three_dump_processes_agree_after_a_race(kafka: KafkaEnv, procs: Procs) -> None:
    writers, expected_skips = run_writers(
        kafka.bootstrap_servers, kafka.channel_topic, writers=WRITERS, bundles=BUNDLES, rounds=ROUNDS
    )
    try:
        ref_report, detail = reference(kafka)
        check_the_race_happened(detail, expected_skips)

        # Three replicas in three processes, concurrently, each replaying the channel from offset zero.
        dumps = [
            procs.trimtab(*kafka.dump_args("--no-snapshot", "--json"), name=f"dump{i}")
            for i in range(REPLICAS)
        ]
        reports = [normalise(d.wait(60).check().json()) for d in dumps]

        assert reports[0] == reports[1] == reports[2]
        assert reports[0] == ref_report
        assert reports[0]["stats"]["rejected"] > 0
        assert reports[0]["stats"]["skipped"] >= sum(expected_skips.values())
        assert len(reports[0]["table"]) >= 1
        check_writer_views(writers, kafka, ref_report)
    finally:
        for w in writers:
            w.close()


def test_three_live_followers_agree_after_a_race(kafka: KafkaEnv, procs: Procs) -> None:
    # The replicas start first, on an empty channel, and follow the whole race live.
    readers = [
        procs.python_module(
            "tests.support.channel_reader",
            "--bootstrap-servers",
            kafka.bootstrap_servers,
            "--topic",
            kafka.channel_topic,
            "--end-prefix",
            END_PREFIX,
            "--timeout",
            "60",
            name=f"reader{i}",
        )
        for i in range(REPLICAS)
    ]

    def events(proc: Any, kind: str) -> list[dict[str, Any]]:
        return [e for e in proc.json_lines() if e.get("event") == kind]

    wait_for(
        lambda: all(events(r, "ready") or not r.is_running() for r in readers),
        30,
        message=lambda: "every reader is caught up\n" + procs.report(),
    )
    for r in readers:
        assert events(r, "ready"), f"{r.name} exited early:\n{r.wait(1).describe()}"
        assert events(r, "ready")[0]["records"] == 0

    writers, expected_skips = run_writers(
        kafka.bootstrap_servers,
        kafka.channel_topic,
        writers=WRITERS,
        bundles=BUNDLES,
        rounds=ROUNDS,
        seed=2024,
    )
    try:
        # Everything is written; now mark the end of every partition.
        sentinels = keys_per_partition(END_PREFIX, MOCK_PARTITIONS)
        for key in sentinels:
            kafka.transport.produce(kafka.channel_topic, key, b"end").result(10)

        for r in readers:
            r.wait(60).check()
        outputs = [events(r, "done")[0] for r in readers]
        reports = [normalise(o["report"]) for o in outputs]

        ref_report, detail = reference(kafka)
        check_the_race_happened(detail, expected_skips, extra_skips=len(sentinels))
        assert reports[0] == reports[1] == reports[2]
        ref_with_detail = {**ref_report, "detail": normalise(detail)}
        assert reports[0] == ref_with_detail
        for o in outputs:
            # Live from the first record: notified of each accepted change exactly once, in log order.
            assert o["notified"] == detail["accepted"]
            assert o["records"] == sum(
                kafka.transport.watermarks(kafka.channel_topic, p)[1] for p in range(MOCK_PARTITIONS)
            )
        check_writer_views(writers, kafka, ref_report)
    finally:
        for w in writers:
            w.close()
