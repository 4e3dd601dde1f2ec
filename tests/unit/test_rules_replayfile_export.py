"""Export and report rules of the offline replay that the round-trip tests leave loose
(channel/replayfile.py; docs/protocol.md section 8, docs/testing.md).

What an export holds and what an operator reads are bytes other tools compare, so they are pinned
exactly: the header line, one line per message (``value_b64`` always, ``key_b64`` only for a key that is
not UTF-8), the reason a base64 member is refused for, the line number a bad line is reported at, and the
indented, key-sorted JSON report -- including its fallback for values orjson cannot encode (integers
beyond 64 bits, objects of other types, nesting deeper than the report's bound). Replay itself: a ``str``
line is the bytes it was decoded from, an input without a message keeps the partition count asked for,
and the table gets the messages in bounded batches.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import pytest

import trimtab.channel.replayfile as replayfile
from trimtab.channel.replayfile import (
    BAD_LINE,
    export_line,
    export_lines,
    header_line,
    replay_lines,
    report_json,
)
from trimtab.channel.table import TableView

K1 = "t/ns/0x00000000_0x80000000"
TOO_DEEP = "<nested too deep>"
Msg = tuple[bytes | None, bytes | None, int | None, int | None]


def bad_lines(lines: Iterable[bytes | str], partitions: int | None = None) -> list[tuple[int, str]]:
    seen: list[tuple[int, str]] = []
    replay_lines(lines, partitions=partitions, on_bad_line=lambda n, why: seen.append((n, why)))
    return seen


def chain(n: int, leaf: Any) -> Any:
    """``leaf`` inside ``n`` nested lists."""
    for _ in range(n):
        leaf = [leaf]
    return leaf


def dict_chain(n: int, leaf: Any) -> Any:
    """``leaf`` inside ``n`` nested one-member objects."""
    for _ in range(n):
        leaf = {"k": leaf}
    return leaf


# ---------------------------------------------------------------------------------------------- export


def test_the_header_line_is_exact() -> None:
    """Rule: the header is the line docs/protocol.md section 8 shows -- format, version 1, topic and
    partitions, in that order, compact, with its newline; an unknown topic or count is null."""
    assert header_line("trimtab-channel", 4) == (
        b'{"format":"trimtab-channel-export","version":1,"topic":"trimtab-channel","partitions":4}\n'
    )
    assert header_line(None, None) == (
        b'{"format":"trimtab-channel-export","version":1,"topic":null,"partitions":null}\n'
    )


@pytest.mark.parametrize(
    ("message", "exported"),
    [
        (
            (K1.encode(), b'{"a":1}', 2, 7),
            b'{"key":"t/ns/0x00000000_0x80000000","value_b64":"eyJhIjoxfQ==","partition":2,"offset":7}\n',
        ),
        # A UTF-8 key that is not ASCII is still text.
        (
            ("k\u00e9".encode(), b"x", 0, 0),
            '{"key":"k\u00e9","value_b64":"eA==","partition":0,"offset":0}\n'.encode(),
        ),
        # A key that is not UTF-8 goes as key_b64; a tombstone is a null value_b64.
        ((b"\xff\xfe", None, 0, 1), b'{"key_b64":"//4=","value_b64":null,"partition":0,"offset":1}\n'),
        # A message without a key; no partition and no offset: the members are left out.
        ((None, b"", None, None), b'{"key":null,"value_b64":""}\n'),
    ],
)
def test_an_export_line_is_exact(message: Msg, exported: bytes) -> None:
    """Rule: a message is written as ``key`` (UTF-8 text, or null) or else ``key_b64``, then
    ``value_b64`` always (null for a tombstone), then ``partition`` and ``offset`` when known; compact,
    with its newline."""
    assert export_line(*message) == exported


def test_an_export_is_the_header_then_one_line_per_message() -> None:
    """Rule: ``export_lines`` yields the header with the topic and partition count it is given, then each
    message's line in the order given."""
    messages: list[Msg] = [(K1.encode(), b"1", 1, 0), (b"\x80", None, 0, 5)]
    assert list(export_lines(messages, topic="chan", partitions=3)) == [
        b'{"format":"trimtab-channel-export","version":1,"topic":"chan","partitions":3}\n',
        b'{"key":"t/ns/0x00000000_0x80000000","value_b64":"MQ==","partition":1,"offset":0}\n',
        b'{"key_b64":"gA==","value_b64":null,"partition":0,"offset":5}\n',
    ]


# ---------------------------------------------------------------------------------------------- base64


@pytest.mark.parametrize(
    ("b64", "why"),
    [
        ("QQ==!", "is not valid base64"),  # a byte outside the alphabet is refused, not dropped
        ("QQ=", "is not valid base64"),  # padding missing
        ("\u00e9", "is not valid base64"),  # not even ASCII
        ("QR==", "is not canonical base64"),  # decodes (to b"A"), but is not how b"A" is written
    ],
)
def test_base64_is_strict_and_says_why(b64: str, why: str) -> None:
    """Rule: ``key_b64`` and ``value_b64`` accept the standard alphabet with padding only (no byte is
    skipped), and only the canonical spelling of the bytes; the bad line's reason names the member and
    says which of the two it failed -- in the exporter's own layout and in any other."""
    exported = f'{{"key":"{K1}","value_b64":"{b64}","partition":0,"offset":0}}'
    spaced = f'{{"value_b64": "{b64}", "key": "{K1}"}}'
    as_key = f'{{"key_b64":"{b64}","value_b64":null}}'
    assert bad_lines([exported, spaced, as_key]) == [
        (1, f"value_b64 {why}"),
        (2, f"value_b64 {why}"),
        (3, f"key_b64 {why}"),
    ]


# ---------------------------------------------------------------------------------------------- replay


def test_a_bad_line_is_reported_at_its_line_number() -> None:
    """Rule: the line number given with a bad line counts every line from 1 -- the header and blank lines
    included -- and the reason is the parser's."""
    lines: list[bytes | str] = [
        header_line("c", None),
        b"\n",
        "garbage",
        export_line(K1.encode(), None, 0, 0),
        "   ",
        b'{"key":"x"}',
    ]
    assert bad_lines(lines) == [
        (3, "not one delimitable JSON object"),
        (6, "needs exactly one of value and value_b64"),
    ]


def test_a_str_line_is_the_bytes_it_was_decoded_from() -> None:
    """Rule: a ``str`` line is encoded back with surrogateescape (as a file read with
    ``errors="surrogateescape"`` decoded it), so a byte that is not UTF-8 reaches the table as that byte
    and is judged there, not counted as a bad line."""
    raw = b'{"key":"' + K1.encode() + b'","value":"\xff"}'
    text = raw.decode("utf-8", "surrogateescape")
    assert "\udcff" in text
    for line in (raw, text):
        view = replay_lines([line])
        assert dict(view.stats.skipped) == {"invalid_utf8": 1}
        assert BAD_LINE not in view.stats.skipped


@pytest.mark.parametrize("lines", [[], [b"\n", "  \r\n"]])
def test_an_input_without_lines_keeps_the_partition_count(lines: list[bytes | str]) -> None:
    """Rule: with no message and no header, the table replay returns still has the partition count asked
    for (a caller that goes on applying messages to it gets the home-partition rule)."""
    assert replay_lines(lines, partitions=4).partitions == 4
    assert replay_lines(lines).partitions is None


class _Recording(TableView):
    batches: ClassVar[list[int]] = []

    def apply_all(self, messages: Iterable[Msg]) -> None:
        got = list(messages)
        self.batches.append(len(got))
        super().apply_all(got)


def test_the_table_gets_the_messages_in_batches_of_at_most_10_000(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule: replay holds at most 10 000 parsed messages: a batch goes to the table as soon as it has
    10 000 (not one more), and what is left at the end goes last -- all of them, in order."""
    monkeypatch.setattr(replayfile, "TableView", _Recording)
    monkeypatch.setattr(_Recording, "batches", [])
    lines = [export_line(K1.encode(), None, 0, i) for i in range(10_001)]
    view = replay_lines(lines)
    assert _Recording.batches == [10_000, 1]
    assert view.positions == {0: 10_001}


# ---------------------------------------------------------------------------------------------- report


def test_a_report_is_indented_sorted_json_with_a_newline() -> None:
    """Rule: the report is indented by two spaces with its keys sorted and ends with a newline; what orjson
    can encode is printed in full however deep (the fallback's depth bound does not apply)."""
    assert report_json({"b": [1], "a": "x"}) == b'{\n  "a": "x",\n  "b": [\n    1\n  ]\n}\n'
    deep = chain(100, 1)
    assert report_json(deep) == report_json(deep).strip() + b"\n"
    assert report_json(deep).count(b"[") == 100


def test_the_fallback_report_is_indented_sorted_json_with_a_newline() -> None:
    """Rule: a report orjson cannot encode as it is (here an integer of 2**64) is printed in the same
    layout: indented, keys sorted, a newline at the end."""
    assert report_json({"z": 2**64, "a": [1, None]}) == (
        b'{\n  "a": [\n    1,\n    null\n  ],\n  "z": "18446744073709551616"\n}\n'
    )


def test_the_fallback_keeps_every_64_bit_integer_and_writes_the_others_as_text() -> None:
    """Rule: in the fallback, an integer from -2**63 to 2**64 - 1 (what orjson encodes) stays a number,
    one outside that range is written as its decimal string -- at both ends, exactly at the bound."""
    out = report_json(
        {
            "below": -(2**63) - 1,
            "min": -(2**63),
            "negative": -200,
            "five": 5,
            "max": 2**64 - 1,
            "above": 2**64,
        }
    )
    assert out == (
        b"{\n"
        b'  "above": "18446744073709551616",\n'
        b'  "below": "-9223372036854775809",\n'
        b'  "five": 5,\n'
        b'  "max": 18446744073709551615,\n'
        b'  "min": -9223372036854775808,\n'
        b'  "negative": -200\n'
        b"}\n"
    )


class _Half(float):
    pass


class _Three(int):
    pass


class _Thing:
    def __repr__(self) -> str:
        return "<thing \udc80>"


def test_the_fallback_keeps_scalars_and_writes_other_objects_as_their_repr() -> None:
    """Rule: in the fallback, null, true, false, floats and integers (subclasses included) stay what they
    are; any other object is written as its repr (a lone surrogate in it escaped)."""
    out = report_json(
        {
            "big": 2**64,
            "null": None,
            "true": True,
            "false": False,
            "float": 0.25,
            "float_subclass": _Half(0.5),
            "int_subclass": _Three(3),
            "set": {1},
            "thing": _Thing(),
        }
    )
    assert out == (
        b"{\n"
        b'  "big": "18446744073709551616",\n'
        b'  "false": false,\n'
        b'  "float": 0.25,\n'
        b'  "float_subclass": 0.5,\n'
        b'  "int_subclass": 3,\n'
        b'  "null": null,\n'
        b'  "set": "{1}",\n'
        b'  "thing": "<thing \\\\udc80>",\n'
        b'  "true": true\n'
        b"}\n"
    )


def test_the_fallback_cuts_containers_at_depth_64() -> None:
    """Rule: in the fallback, the report's own object or list is depth 0; a scalar at any depth is kept,
    while a list or object at depth 64 (exactly) is written as "<nested too deep>" -- for lists and
    objects alike, however they nest."""
    scalars = [0.25, True, False, None, 7, "s"]
    leaf: list[Any] = [*scalars, [], {}]
    cut = [*scalars, TOO_DEEP, TOO_DEEP]
    # The report object is depth 0, its members depth 1; `leaf` sits at depth 63, its items at 64.
    report = {"big": 2**64, "lists": chain(62, leaf), "objects": dict_chain(62, leaf)}
    expected = {"big": str(2**64), "lists": chain(62, cut), "objects": dict_chain(62, cut)}
    assert report_json(report) == report_json(expected)
    # A list as the report: the same bound, counted from the list.
    assert report_json([2**64, chain(62, leaf)]) == report_json([str(2**64), chain(62, cut)])
