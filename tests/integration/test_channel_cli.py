"""``trimtab channel replay`` and ``trimtab channel dump`` as an operator runs them.

The offline tool must equal the nodes: an export of a live channel (``dump --export``), replayed with
``channel replay``, gives the same table and the same stats by reason as ``dump --no-snapshot --json`` on
the same channel -- and as this process's own full replay of the raw messages. The channel is poisoned
with every kind of value and key the protocol skips (docs/protocol.md 2.2), over the real Kafka protocol
(librdkafka mock cluster). The first tests run the commands in-process (click's runner) and need no Kafka.
"""

from __future__ import annotations

import base64
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from tests.support.kafka import MOCK_PARTITIONS, KafkaEnv, by_partition
from tests.support.procs import Procs
from trimtab.channel.records import State, encode, make
from trimtab.channel.replayfile import export_line, header_line, parse_message_line, table_report
from trimtab.channel.snapshot import SnapshotWriter
from trimtab.channel.table import TableView, replay
from trimtab.channel.transport import Message
from trimtab.cli.main import main

B1 = "t/ns/0x00000000_0x40000000"
B2 = "t/ns/0x40000000_0x80000000"
B3 = "t/ns/0x80000000_0xc0000000"
B4 = "t/ns/0xc0000000_0xffffffff"


def rec(state: State, version: int, **kw: Any) -> bytes:
    kw.setdefault("writer", "b1:1")
    out = encode(make(state, version=version, ts=1_700_000_000_000 + version, **kw))
    assert out is not None
    return out


ASSIGN = rec(State.ASSIGNING, 1, dst="b1:1")
# Values every node skips, each for its own reason (docs/protocol.md 2.2).
POISON: dict[str, bytes] = {
    "invalid_utf8": ASSIGN.replace(b'"writer":"b1:1"', b'"writer":"b1\xff"'),
    "bom": b"\xef\xbb\xbf" + ASSIGN,
    "too_deep": ASSIGN[:-1] + b',"x":' + b"[" * 1000 + b"]" * 1000 + b"}",
    "too_large": b"[" * 100_000 + b"]" * 100_000,
    "int_out_of_range": ASSIGN.replace(b'"ts":1700000000001', b'"ts":' + str(2**70).encode()),
    "lone_surrogate": ASSIGN.replace(b'"writer":"b1:1"', b'"writer":"\\ud800"'),
    "malformed": b"\x00not json",
    "future_schema": ASSIGN.replace(b'"schema":1', b'"schema":2'),
    "unknown_state": ASSIGN.replace(b'"assigning"', b'"gone"'),
}
BAD_KEYS = (b"\xff\xfe", b"not-a-bundle", b"")


def home(key: bytes, partitions: int = MOCK_PARTITIONS) -> int:
    return zlib.crc32(key) % partitions


def normalise(obj: Any) -> Any:
    return orjson.loads(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS))


def run_cli(*args: str, columns: int = 400) -> Any:
    result = CliRunner().invoke(main, list(args), env={"COLUMNS": str(columns)}, catch_exceptions=False)
    return result


# ---------------------------------------------------------------------------------------------- in-process


def test_replay_json_equals_a_node_and_names_bad_lines(tmp_path: Path) -> None:
    msgs: list[tuple[bytes | None, bytes | None, int | None, int | None]] = [
        (B1.encode(), ASSIGN, home(B1.encode()), 0),
        (B1.encode(), rec(State.OWNED, 2, dst="b1:1"), home(B1.encode()), 1),
        (B1.encode(), rec(State.OWNED, 2, dst="b2:2"), home(B1.encode()), 2),  # lost the race
        *((B2.encode(), v, home(B2.encode()), i) for i, v in enumerate(POISON.values())),
        (B3.encode(), ASSIGN, (home(B3.encode()) + 1) % MOCK_PARTITIONS, 0),  # wrong partition
        *((k, None, 0, 10 + i) for i, k in enumerate(BAD_KEYS)),
    ]
    path = tmp_path / "export.jsonl"
    path.write_bytes(
        header_line("c", MOCK_PARTITIONS)
        + b"".join(export_line(*m) for m in msgs)
        + b"not an export line\n\n"
        + b'{"key":"'
        + B4.encode()
        + b'","value":'
        + ASSIGN
        + b"}\n"
    )
    all_msgs = [*msgs, (B4.encode(), ASSIGN, None, None)]

    def expected(partitions: int) -> Any:
        view = TableView(partitions)
        view.apply_all(all_msgs)
        out = normalise(table_report(view))
        out["stats"]["skipped"] += 1
        out["stats"]["skipped_by_reason"]["bad_line"] = 1
        return out

    result = run_cli("channel", "replay", str(path), "--json")
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout) == expected(MOCK_PARTITIONS)
    stats = expected(MOCK_PARTITIONS)["stats"]
    assert {*POISON, "wrong_partition", "bad_key", "bad_line"} <= stats["skipped_by_reason"].keys()
    assert stats["skipped_by_reason"]["wrong_partition"] == 1
    assert stats["rejected_by_reason"] == {"stale_version": 1}
    assert f"line {len(msgs) + 2}: not an export line" in result.stderr

    # --partitions wins over the header (here everything outside partition 0 is misplaced).
    one = run_cli("channel", "replay", str(path), "--json", "--partitions", "1")
    assert orjson.loads(one.stdout) == expected(1) != expected(MOCK_PARTITIONS)


def test_replay_reads_stdin() -> None:
    text = b'{"key":"' + B1.encode() + b'","value":' + ASSIGN + b"}\n"
    result = CliRunner().invoke(main, ["channel", "replay", "-", "--json"], input=text)
    assert result.exit_code == 0, result.output
    assert list(orjson.loads(result.stdout)["table"]) == [B1]


def test_the_table_never_interprets_what_writers_wrote(tmp_path: Path) -> None:
    """Broker ids and writers are anyone's strings: no rich markup, no terminal escape sequences."""
    nasty_dst = "[link=https://evil.example]b1:1[/link]"
    nasty_writer = "[bold red]w[/] \x1b[2J\x1b]0;pwned\x07:smile:"
    value = rec(State.ASSIGNING, 1, dst=nasty_dst, writer=nasty_writer)
    path = tmp_path / "x.jsonl"
    path.write_bytes(export_line(B1.encode(), value, None, None))
    result = run_cli("channel", "replay", str(path))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert nasty_dst in out
    assert "[bold red]w[/]" in out
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b[2J" in out
    assert ":smile:" in out
    assert "accepted 1" in out


def test_export_and_json_together_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["channel", "dump", "--export", "-", "--json"])
    assert result.exit_code == 2
    assert "--export writes the raw channel" in result.output


# ---------------------------------------------------------------------------------------------- live channel


def publish_poisoned_channel(kafka: KafkaEnv) -> None:
    """Flows with races on four bundles, then every kind of poison, bad keys and misplaced records."""
    t, topic = kafka.transport, kafka.channel_topic
    futures = []
    for b in (B1, B2, B3, B4):
        k = b.encode()
        for v in (
            ASSIGN,
            rec(State.OWNED, 2, dst="b1:1"),
            rec(State.OWNED, 2, dst="b2:2"),  # a racing writer: stale_version everywhere
            rec(State.RELEASING, 3, src="b1:1", dst="b2:2"),
            rec(State.ASSIGNING, 5, src="b1:1", dst="b2:2"),  # version_gap
        ):
            futures.append(t.produce(topic, k, v))
    for v in POISON.values():
        futures.append(t.produce(topic, B1.encode(), v))
    for k in BAD_KEYS:
        futures.append(t.produce(topic, k, ASSIGN))
    futures.append(t.produce(topic, None, ASSIGN, partition=0))  # type: ignore[arg-type]  # a null key
    # A writer with another partitioner: a valid next record of B2, in the wrong partition.
    wrong = (home(B2.encode()) + 1) % MOCK_PARTITIONS
    futures.append(
        t.produce(topic, B2.encode(), rec(State.ASSIGNING, 4, src="b1:1", dst="b2:2"), partition=wrong)
    )
    futures.append(t.produce(topic, B3.encode(), None))  # a tombstone of an owned bundle: rejected
    for f in futures:
        f.result(15)


def reference(kafka: KafkaEnv) -> tuple[list[Message], dict[str, Any]]:
    messages = kafka.read_all(kafka.channel_topic)
    return messages, normalise(table_report(replay(messages, partitions=MOCK_PARTITIONS)))


@pytest.mark.integration
def test_replaying_an_export_equals_dump_no_snapshot(kafka: KafkaEnv, procs: Procs, tmp_path: Path) -> None:
    publish_poisoned_channel(kafka)
    messages, ref = reference(kafka)
    stats = ref["stats"]
    assert stats["accepted"] > 0
    assert {"stale_version", "version_gap"} <= stats["rejected_by_reason"].keys()
    assert {*POISON, "wrong_partition", "bad_key"} <= stats["skipped_by_reason"].keys()
    assert stats["skipped_by_reason"]["bad_key"] == len(BAD_KEYS) + 1

    export = tmp_path / "channel.jsonl"
    exporting = procs.trimtab(*kafka.dump_args("--export", str(export)), name="export")
    to_stdout = procs.trimtab(*kafka.dump_args("--export", "-"), name="export-stdout")
    dumping = procs.trimtab(*kafka.dump_args("--no-snapshot", "--json"), name="dump")
    done = exporting.wait(60).check()
    assert f"exported {len(messages)} messages" in done.stderr
    dumped = dumping.wait(60).check()
    stdout_export = tmp_path / "stdout.jsonl"
    stdout_export.write_text(to_stdout.wait(60).check().stdout)

    replayed = procs.run_trimtab("channel", "replay", str(export), "--json", timeout=60).check()
    assert replayed.stderr == ""  # no bad lines
    assert replayed.json() == dumped.json() == ref
    # The same output, byte for byte (one report, one encoder).
    assert replayed.stdout == dumped.stdout
    again = procs.run_trimtab("channel", "replay", str(stdout_export), "--json", timeout=60).check()
    assert again.stdout == dumped.stdout


@pytest.mark.integration
def test_the_export_holds_the_exact_messages(kafka: KafkaEnv, procs: Procs, tmp_path: Path) -> None:
    publish_poisoned_channel(kafka)
    messages, _ = reference(kafka)
    export = tmp_path / "channel.jsonl"
    procs.run_trimtab(*kafka.dump_args("--export", str(export)), timeout=60).check()
    lines = export.read_bytes().splitlines(keepends=True)
    assert orjson.loads(lines[0]) == {
        "format": "trimtab-channel-export",
        "version": 1,
        "topic": kafka.channel_topic,
        "partitions": MOCK_PARTITIONS,
    }
    got = [Message(*parse_message_line(line)) for line in lines[1:]]  # type: ignore[arg-type]
    # Per-partition order is the channel's, and every byte of every key and value is there.
    assert dict(by_partition(got)) == dict(by_partition(messages))
    assert Counter(m.partition for m in got) == Counter(m.partition for m in messages)
    exported_keys = {orjson.loads(line).get("key_b64") for line in lines[1:]}
    assert base64.b64encode(b"\xff\xfe").decode() in exported_keys  # a key that is not UTF-8


@pytest.mark.integration
def test_export_ignores_snapshots(kafka: KafkaEnv, procs: Procs, tmp_path: Path) -> None:
    """With a snapshot, ``dump`` replays only the tail after it; ``--export`` still writes the whole
    retained channel, so its replay equals ``dump --no-snapshot``, not the tail."""
    publish_poisoned_channel(kafka)
    messages, _ = reference(kafka)
    view = replay(messages, partitions=MOCK_PARTITIONS)
    states, positions = view.snapshot()
    SnapshotWriter(kafka.transport, kafka.snapshot_topic, kafka.channel_topic, writer="test").write(
        states, positions, MOCK_PARTITIONS, term=1
    )
    tail = rec(State.ASSIGNING, 4, src="b1:1", dst="b2:2")  # B4 was releasing v3: accepted
    kafka.transport.produce(kafka.channel_topic, B4.encode(), tail).result(15)
    _, ref = reference(kafka)

    with_snapshot = procs.run_trimtab(*kafka.dump_args("--json"), timeout=60).check().json()
    assert with_snapshot.get("snapshot")
    assert with_snapshot["table"] == ref["table"]
    # Only the tail was replayed on top of the snapshot.
    assert with_snapshot["stats"] == {
        "accepted": 1,
        "rejected": 0,
        "skipped": 0,
        "rejected_by_reason": {},
        "skipped_by_reason": {},
    }

    export = tmp_path / "channel.jsonl"
    procs.run_trimtab(*kafka.dump_args("--export", str(export)), timeout=60).check()
    replayed = procs.run_trimtab("channel", "replay", str(export), "--json", timeout=60).check().json()
    assert replayed == ref
    assert replayed["stats"]["skipped"] > 0


@pytest.mark.integration
def test_a_failed_export_leaves_no_file(procs: Procs, tmp_path: Path) -> None:
    export = tmp_path / "channel.jsonl"
    result = procs.run_trimtab(
        "channel",
        "dump",
        "--bootstrap-servers",
        "127.0.0.1:1",  # nothing listens there
        "--export",
        str(export),
        timeout=90,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == [tmp_path / "procs"]
