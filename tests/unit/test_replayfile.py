"""Offline replay of a channel export (channel/replayfile.py, docs/protocol.md section 8).

The one property that matters: replaying export lines gives exactly what a node's ``TableView`` gives for
the same raw messages -- same table, same stats by reason -- because the tool hands the table the exact
value bytes (never a re-encoding). Everything else here pins the line format and that nothing raises.
"""

from __future__ import annotations

import base64
import io
import json
import re
import sys
from collections.abc import Iterable
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from trimtab.channel.records import Record, State, encode, make
from trimtab.channel.replayfile import (
    BAD_LINE,
    carries_exactly,
    export_line,
    export_lines,
    header_line,
    parse_message_line,
    replay_lines,
    report_json,
    scan_members,
    table_report,
    value_end,
)
from trimtab.channel.table import TableView, partition_for
from trimtab.errors import BadExportLine

K1 = "t/ns/0x00000000_0x80000000"
K2 = "t/ns/0x80000000_0xffffffff"
K3 = "u/ns/0x00000000_0xffffffff"
Msg = tuple[bytes | None, bytes | None, int | None, int | None]
SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]


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


def raw_line(key: str, value: bytes) -> bytes:
    """A ``value``-form line carrying ``value`` verbatim (whatever its bytes)."""
    return b'{"key":' + orjson.dumps(key) + b',"value":' + value + b"}"


def b64_line(key: str, value: bytes | None, **extra: Any) -> bytes:
    v = None if value is None else base64.b64encode(value).decode()
    return orjson.dumps({"key": key, "value_b64": v, **extra})


def skipped(view: TableView) -> dict[str, int]:
    return dict(view.stats.skipped)


def stats(accepted: int, rejected: dict[str, int], skipped: dict[str, int]) -> dict[str, Any]:
    return {
        "accepted": accepted,
        "rejected": sum(rejected.values()),
        "skipped": sum(skipped.values()),
        "rejected_by_reason": rejected,
        "skipped_by_reason": skipped,
    }


def reference(messages: Iterable[Msg], partitions: int | None = None) -> dict[str, Any]:
    """What a node's table makes of the same raw messages."""
    view = TableView(partitions)
    view.apply_all(messages)
    return table_report(view)


# ---------------------------------------------------------------------------------------------- the basics


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
        "stats": stats(
            7,
            {"stale_version": 1},
            {"bad_line": 4, "bad_key": 1, "future_schema": 1, "malformed": 1},
        ),
    }
    # The report keeps the totals every consumer already reads.
    assert {"accepted", "rejected", "skipped"} <= report["stats"].keys()


def test_bytes_and_str_lines_are_the_same() -> None:
    text = [line(K1, record("assigning", 1, dst="a:1")), "garbage", line(K1, record("owned", 2, dst="a:1"))]
    as_bytes = [t.encode() + b"\n" for t in text]
    a, b = replay_lines(text), replay_lines(as_bytes)
    assert table_report(a) == table_report(b)
    assert table_report(a)["stats"] == stats(2, {}, {"bad_line": 1})


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
    assert report["stats"] == stats(3, {}, {"bad_line": 2})


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
    assert table_report(replay_lines([])) == {"table": {}, "stats": stats(0, {}, {})}
    assert table_report(replay_lines([b"\n", b"  \r\n"])) == {"table": {}, "stats": stats(0, {}, {})}


# ---------------------------------------------------------------------------------------------- exact bytes


ASSIGN = encode(make(State.ASSIGNING, version=1, ts=5, writer="w", dst="a:1"))
assert ASSIGN is not None


def test_repeated_names_are_judged_on_the_exact_bytes() -> None:
    """A repeated name: the last occurrence counts (docs/protocol.md 2.2) -- and every occurrence must
    still be well-formed. Re-encoding a parsed line would hide both; the tool must read the bytes as a
    node does."""
    for dup in (ASSIGN[:-1] + b',"dst":"b:2"}', ASSIGN[:-1] + b',"d\\u0073t":"b:2"}'):
        view = replay_lines([raw_line(K1, dup)])
        rec = view.get(K1)
        assert rec is not None and rec.dst == "b:2"
        assert table_report(view) == reference([(K1.encode(), dup, None, None)])
    for dup in (ASSIGN[:-1] + b',"dst":7}', ASSIGN[:-1] + b',"x":"\\ud800","x":1}'):
        view = replay_lines([raw_line(K1, dup)])
        assert len(view) == 0 and sum(view.stats.skipped.values()) == 1
        assert table_report(view) == reference([(K1.encode(), dup, None, None)])


def test_the_value_is_the_exact_span_not_a_reencoding() -> None:
    spaced = b'{ "schema" : 1 ,"state":"assigning","dst":"a:1","src":null,"version":1,"force":false,"ts":5,"writer":"w" }'
    assert parse_message_line(b'  {"value" :\t' + spaced + b' , "key":"' + K1.encode() + b'"}\r\n') == (
        K1.encode(),
        spaced,
        None,
        None,
    )
    view = replay_lines([raw_line(K1, spaced)])
    assert view.stats.accepted == 1


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (ASSIGN.replace(b'"writer":"w"', b'"writer":"w\xff"'), "invalid_utf8"),
        (ASSIGN.replace(b'"writer":"w"', b'"writer":"\xc0\xaf"'), "invalid_utf8"),  # overlong
        (ASSIGN.replace(b'"writer":"w"', b'"writer":"\xed\xa0\x80"'), "invalid_utf8"),  # surrogate
        (ASSIGN[:-1] + b',"x":"\xff"}', "invalid_utf8"),  # even in a field the schema does not know
        (ASSIGN.replace(b'"writer":"w"', b'"writer":"\\ud800"'), "lone_surrogate"),
        (ASSIGN.replace(b'"ts":5', b'"ts":' + str(2**70).encode()), "int_out_of_range"),
        (ASSIGN.replace(b'"ts":5', b'"ts":' + b"9" * 5000), "int_out_of_range"),  # > int max str digits
        (ASSIGN[:-1] + b',"x":' + b"[" * 32 + b"]" * 32 + b"}", "too_deep"),
        (ASSIGN[:-1] + b',"x":' + b"[" * 300 + b"]" * 300 + b"}", "too_deep"),  # past orjson's limit
        (ASSIGN[:-1] + b',"x":' + b"[" * 1000 + b"]" * 1000 + b"}", "too_deep"),  # past the recursion limit
        (b"[" * 30_000 + b"]" * 30_000, "too_deep"),
        (b"[" * 100_000 + b"]" * 100_000, "too_large"),
        (ASSIGN.replace(b'"version":1', b'"version":1.0'), "malformed"),
        (b'"owned"', "malformed"),
        (b"[1,2,]", "malformed"),
        (b"nul", "malformed"),
        (b"null", "malformed"),  # four bytes, not a tombstone: only value_b64 can carry them
        (ASSIGN.replace(b'"assigning"', b'"gone"'), "unknown_state"),
        (ASSIGN.replace(b'"schema":1', b'"schema":2'), "future_schema"),
    ],
)
def test_poison_values_are_judged_by_the_table(value: bytes, reason: str) -> None:
    """Both forms deliver the exact bytes; the table decides (and the tool never crashes)."""
    expected = reference([(K1.encode(), value, None, None)])
    assert expected["stats"]["skipped_by_reason"] == {reason: 1}
    forms = [b64_line(K1, value)]
    if carries_exactly(value):
        forms.append(raw_line(K1, value))
    else:
        assert value == b"null"
    for form in forms:
        assert table_report(replay_lines([form])) == expected


@pytest.mark.parametrize(
    "value",
    [
        b"\xef\xbb\xbf" + ASSIGN,  # BOM
        b" " + ASSIGN,  # whitespace at the ends is not part of a value span
        ASSIGN + b"\r",
        ASSIGN.replace(b",", b",\n", 1),  # a newline cannot be inside a line
        b"\xff\xfe{}",  # a scalar run, then more: not one span
        b"",
        b"null",
    ],
)
def test_values_only_value_b64_carries(value: bytes) -> None:
    assert not carries_exactly(value)
    got = replay_lines([b64_line(K1, value)])
    assert table_report(got) == reference([(K1.encode(), value, None, None)])
    assert BAD_LINE not in got.stats.skipped


def test_deep_nesting_in_the_line_itself() -> None:
    """100 000 levels inside ``value``: delimited without recursion, then skipped by the table."""
    deep = b"[" * 100_000 + b"{}" + b"]" * 100_000
    assert value_end(deep, 0) == len(deep)
    assert skipped(replay_lines([raw_line(K1, deep)])) == {"too_large": 1}
    unbalanced = b"[" * 100_000 + b"]" * 99_999
    assert value_end(unbalanced, 0) is None
    assert skipped(replay_lines([raw_line(K1, unbalanced)])) == {BAD_LINE: 1}
    # Deep nesting anywhere else in a line is a bad line, never a crash.
    assert skipped(replay_lines([b'{"key":' + b"[" * 100_000 + b"]" * 100_000 + b',"value":null}'])) == {
        BAD_LINE: 1
    }


# ---------------------------------------------------------------------------------------------- line forms


def test_key_forms() -> None:
    tomb = {"value": None}
    lines = [
        orjson.dumps({"key_b64": base64.b64encode(b"\xff\xfe").decode(), **tomb}),  # not UTF-8
        orjson.dumps({"key": None, **tomb}),  # a null key
        orjson.dumps({"key": "", **tomb}),
        orjson.dumps(
            {"key_b64": base64.b64encode(K1.encode()).decode(), "value": record("assigning", 1, dst="a:1")}
        ),
        b'{"k\\u0065y": "'
        + K2.encode()
        + b'", "value": '
        + orjson.dumps(record("assigning", 1, dst="b:2"))
        + b"}",
    ]
    view = replay_lines(lines)
    assert skipped(view) == {"bad_key": 3}
    assert sorted(k for k, _ in view.items()) == [K1, K2]


def test_partition_and_offset_are_passed_to_the_table() -> None:
    p1 = partition_for(K1.encode(), 4)
    wrong = (p1 + 1) % 4
    a1 = orjson.dumps(record("assigning", 1, dst="a:1"))
    o2 = orjson.dumps(record("owned", 2, dst="a:1"))
    msgs: list[Msg] = [
        (K1.encode(), a1, p1, 0),
        (K1.encode(), a1, p1, 0),  # re-delivered: ignored
        (K1.encode(), o2, wrong, 0),  # another partition: wrong_partition with 4 partitions
        (K1.encode(), o2, p1, 1),
    ]
    body = [export_line(*m) for m in msgs]
    # Without a partition count there is no home-partition rule (but offsets still count).
    assert table_report(replay_lines(body)) == reference(msgs, None)
    assert reference(msgs, None)["stats"]["rejected_by_reason"] == {"stale_version": 1}
    # The header's count applies it...
    with_header = [header_line("chan", 4), *body]
    assert table_report(replay_lines(with_header)) == reference(msgs, 4)
    assert reference(msgs, 4)["stats"]["skipped_by_reason"] == {"wrong_partition": 1}
    # ...and --partitions wins over the header.
    assert table_report(replay_lines(with_header, partitions=1)) == reference(msgs, 1)
    assert table_report(replay_lines(body, partitions=4)) == reference(msgs, 4)


def test_header() -> None:
    p1 = partition_for(K1.encode(), 4)
    msg = export_line(K1.encode(), orjson.dumps(record("assigning", 1, dst="a:1")), (p1 + 1) % 4, 0)
    # Blank lines before the header are fine; unknown header members are ignored.
    hdr = b'{"format":"trimtab-channel-export","version":1,"topic":"c","partitions":4,"exported_by":"x"}'
    assert skipped(replay_lines([b"", hdr, msg])) == {"wrong_partition": 1}
    # A header anywhere but first is a bad line, and so is a header this tool does not understand.
    assert skipped(replay_lines([msg, header_line("c", 4)])) == {BAD_LINE: 1}
    for bad in (
        b'{"format":"trimtab-channel-export","version":2,"partitions":4}',
        b'{"format":"other","version":1,"partitions":4}',
        b'{"format":"trimtab-channel-export","version":1,"partitions":0}',
        b'{"format":"trimtab-channel-export","version":1,"partitions":"4"}',
        b'{"format":"trimtab-channel-export","format":"trimtab-channel-export","version":1}',
    ):
        view = replay_lines([bad, msg])
        assert skipped(view) == {BAD_LINE: 1}, bad
        assert view.partitions is None
    assert replay_lines([header_line(None, None), msg]).stats.accepted == 1


A1 = orjson.dumps(record("assigning", 1, dst="a:1")).decode()
BAD_LINES = [
    "this is not json",
    "{",
    "{}",
    "[]",
    '"key"',
    "null",
    f'{{"key":"{K1}"}}',  # no value
    f'{{"value":{A1}}}',  # no key
    f'{{"key":"{K1}","value":{A1},"value_b64":null}}',  # both values
    f'{{"key":"{K1}","key_b64":"","value":null}}',  # both keys
    f'{{"key":"{K1}","value":{A1},"value":null}}',  # duplicate member
    f'{{"key":"{K1}","val\\u0075e":{A1},"value":null}}',  # duplicate after unescaping
    f'{{"key":"{K1}","value":{A1},"extra":1}}',  # unknown member
    f'{{"key":"{K1}","value":{A1},}}',  # trailing comma
    f'{{"key":"{K1}","value":{A1}}} x',  # trailing data
    f'{{"key":"{K1}","value":{A1}}}{{}}',
    f'{{"key":"{K1}" "value":{A1}}}',  # missing comma
    f'{{"key":"{K1}","value":}}',  # missing value
    f'{{"key":"{K1}","value":1 2}}',
    f'{{"key":"{K1}","value":[1}}',  # brackets that do not pair
    f'{{"key":"{K1}","value":"unterminated}}',
    f'{{"key":5,"value":{A1}}}',
    f'{{"key":["{K1}"],"value":{A1}}}',
    f'{{"key":"\\ud800","value":{A1}}}',  # lone surrogate in a key
    f'{{"key_b64":null,"value":{A1}}}',
    f'{{"key":"{K1}","value_b64":"QQ"}}',  # missing padding
    f'{{"key":"{K1}","value_b64":"QR=="}}',  # not the canonical spelling
    f'{{"key":"{K1}","value_b64":"Q Q=="}}',
    f'{{"key":"{K1}","value_b64":"\\u00e9AA="}}',
    f'{{"key":"{K1}","value_b64":5}}',
    f'{{"key":"{K1}","value":null,"partition":-1}}',
    f'{{"key":"{K1}","value":null,"partition":2147483648}}',
    f'{{"key":"{K1}","value":null,"partition":1.0}}',
    f'{{"key":"{K1}","value":null,"partition":true}}',
    f'{{"key":"{K1}","value":null,"offset":-1}}',
    f'{{"key":"{K1}","value":null,"offset":9223372036854775808}}',
    f'{{"key":"{K1}","value":null,"offset":01}}',
    f'{{"key":"{K1}","value":null,"offset":"1"}}',
    f'{{"key":"{K1}","value_b64":null,"partition":0,"offset":99999999999999999999}}',
    f'{{"key":"{K1}","value_b64":null,"partition":9999999999,"offset":0}}',
    f'{{"format":"trimtab-channel-export","key":"{K1}","value":null}}',
    '\ufeff{"key":"t/ns/0x00000000_0x80000000","value":null}',  # a BOM before the line
    "\udcff",  # not encodable (a str line holding a lone surrogate)
    "\ud800",
]


@pytest.mark.parametrize("bad", BAD_LINES)
def test_bad_lines(bad: str) -> None:
    seen: list[tuple[int, str]] = []
    view = replay_lines([bad], on_bad_line=lambda n, why: seen.append((n, why)))
    assert table_report(view) == {"table": {}, "stats": stats(0, {}, {BAD_LINE: 1})}
    assert len(seen) == 1 and seen[0][0] == 1 and seen[0][1]
    if bad.isascii():
        with pytest.raises(BadExportLine):
            parse_message_line(bad.encode())


def test_good_lines_in_any_layout() -> None:
    a1 = A1.encode()
    k = K1.encode()
    good = [
        b'{"key":"' + k + b'","value":' + a1 + b"}",
        b'  { "value" : ' + a1 + b' ,\t"key" : "' + k + b'" }  \r',
        b'{"offset":null,"key":"' + k + b'","partition":null,"value":' + a1 + b"}",
        b'{"key":"' + k + b'","value_b64":"' + base64.b64encode(a1) + b'"}',
        b'{"key":"' + k.replace(b"/", b"\\/") + b'","value":' + a1 + b"}",  # an escaped key
        b'{"\\u006bey":"' + k + b'","value":' + a1 + b"}",  # an escaped name
    ]
    for g in good:
        assert parse_message_line(g) == (k, a1, None, None), g


# ---------------------------------------------------------------------------------------------- scanner


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(v=json_values, spaced=st.booleans(), ascii_only=st.booleans())
def test_every_json_text_is_delimited_exactly(v: Any, spaced: bool, ascii_only: bool) -> None:
    """Independent of the scanner: whatever the standard library writes (any nesting, escapes, raw
    non-ASCII text, spaces inside) is one value span, and a line carries it byte for byte."""
    text = json.dumps(v, ensure_ascii=ascii_only, separators=(", ", ": ") if spaced else (",", ":"))
    data = text.encode("utf-8", "surrogatepass")
    assume(data != b"null")
    assert value_end(data, 0) == len(data)
    assert carries_exactly(data)
    assert parse_message_line(raw_line(K1, data)) == (K1.encode(), data, None, None)
    assert value_end(b" " + data + b" ,", 1) == len(data) + 1


def test_scan_members() -> None:
    assert scan_members(b' {"a" : [1,"]"] , "b":{"c":"}"}}\n') == [(b'"a"', 8, 15), (b'"b"', 22, 31)]
    assert scan_members(b"{}") == []
    assert scan_members(b'{"a\\"b":"\\\\","c":"\\""}') == [(b'"a\\"b"', 8, 12), (b'"c"', 17, 21)]
    # Escapes inside strings: an escaped quote does not end one, an escaped backslash does not escape.
    for text in (b'"a\\"b"', b'"a\\\\"', b'"\\\\\\""', b'["\\"]"]', b'{"}\\"{":"]"}'):
        assert value_end(text + b',"x"', 0) == len(text), text
    for bad in (b"", b"{", b'{"a"}', b'{"a":}', b'{"a":1,}', b'{"a":1}}', b"[1]", b'{"a":1 "b":2}', b"{a:1}"):
        assert scan_members(bad) is None, bad


# ---------------------------------------------------------------------------------------------- property


BROKERS = ("b1:1", "b2:2")
KEYS: tuple[bytes | None, ...] = (
    K1.encode(),
    K2.encode(),
    K3.encode(),
    None,
    b"",
    b"\xff\xfe",
    b"not-a-bundle",
    b"t/ns/0x80000000_0x00000000",
)


def _flow(key: bytes) -> list[bytes]:
    """A transfer from b1 to b2: with the right order, every record of it is accepted."""
    recs = [
        make(State.ASSIGNING, version=1, ts=1, writer="b1:1", dst="b1:1"),
        make(State.OWNED, version=2, ts=2, writer="b1:1", dst="b1:1"),
        make(State.RELEASING, version=3, ts=3, writer="b1:1", src="b1:1", dst="b2:2"),
        make(State.ASSIGNING, version=4, ts=4, writer="b1:1", src="b1:1", dst="b2:2"),
        make(State.OWNED, version=5, ts=5, writer="b2:2", src="b1:1", dst="b2:2"),
    ]
    return [v for r in recs if (v := encode(r)) is not None]


FLOW = _flow(K1.encode())


@st.composite
def records(draw: Any) -> bytes:
    rec = make(
        draw(st.sampled_from(list(State))),
        version=draw(st.integers(1, 6)),
        ts=draw(st.integers(-(2**63), 2**63 - 1)),
        writer=draw(st.sampled_from([*BROKERS, "[bold]x[/]", "w\u00e9"])),
        dst=draw(st.sampled_from([None, *BROKERS])),
        src=draw(st.sampled_from([None, *BROKERS])),
        force=draw(st.booleans()),
    )
    out = encode(rec)
    assert out is not None
    return out


def _mutations(v: bytes, d: int, pos: int, byte: int) -> list[bytes]:
    pos %= len(v) + 1
    return [
        v[:pos] + bytes([byte]) + v[pos:],
        v[:pos] + v[pos + 1 :],
        v[:pos] + bytes([byte]) + v[pos + 1 :],
        b"\xef\xbb\xbf" + v,
        b" " + v + b"\t",
        v[:-1] + b',"dst":"b2:2"}',
        v[:-1] + b',"d\\u0073t":null}',
        v.replace(b'"writer":"', b'"writer":"\xff', 1),
        v.replace(b'"writer":"', b'"writer":"\\udc00', 1),
        re.sub(rb'"ts":-?[0-9]+', b'"ts":' + str(2**64 + d).encode(), v),
        v[:-1] + b',"x":' + b"[" * d + b"]" * d + b"}",
        v.replace(b",", b",\n", 1),
        v.replace(b'"version":', b'"version":1.', 1),
    ]


@st.composite
def values(draw: Any) -> bytes | None:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return None
    if kind == 1:
        return draw(st.sampled_from(FLOW))
    if kind == 2:
        return draw(records())
    if kind == 3:
        base = draw(st.sampled_from(FLOW) | records())
        d = draw(st.sampled_from([31, 32, 33, 255, 300, 1023, 1100, 5000]))
        muts = _mutations(base, d, draw(st.integers(0, 500)), draw(st.integers(0, 255)))
        return draw(st.sampled_from(muts))
    if kind == 4:
        return draw(st.binary(max_size=40))
    return draw(st.sampled_from([b"null", b"", b"{}", b"[]", b'"x"', b"1", b"[" * 40_000 + b"]" * 40_000]))


@st.composite
def logs(draw: Any) -> tuple[int | None, list[Msg]]:
    """Raw messages as a channel holds them, with re-deliveries and records in the wrong partition."""
    partitions = draw(st.sampled_from([None, 1, 2, 4]))
    positional = partitions is not None or draw(st.booleans())
    nparts = partitions or 3
    next_offset: dict[int, int] = {}
    out: list[Msg] = []
    for _ in range(draw(st.integers(0, 40))):
        if out and positional and draw(st.integers(0, 9)) == 0:
            out.append(draw(st.sampled_from(out)))  # re-delivered: the table ignores it
            continue
        key = draw(st.sampled_from(KEYS))
        value = draw(values())
        if not positional:
            out.append((key, value, None, None))
            continue
        home = partition_for(key or b"", nparts)
        p = home if draw(st.integers(0, 5)) else draw(st.integers(0, nparts - 1))
        o = next_offset.get(p, 0)
        next_offset[p] = o + 1
        out.append((key, value, p, o))
    return partitions, out


_KEY_NAMES = (b'"key"', b'"k\\u0065y"')


@st.composite
def hand_written_line(draw: Any, msg: Msg) -> bytes:
    """A line another tool might write for ``msg``: any member order, whitespace, escapes, either form."""
    key, value, partition, offset = msg
    members: list[tuple[bytes, bytes]] = []
    text_key: str | None = None
    if key is not None:
        try:
            text_key = key.decode("utf-8")
        except UnicodeDecodeError:
            text_key = None
    if key is None:
        members.append((b'"key"', b"null"))
    elif text_key is not None and draw(st.booleans()):
        members.append((draw(st.sampled_from(_KEY_NAMES)), orjson.dumps(text_key)))
    else:
        members.append((b'"key_b64"', b'"' + base64.b64encode(key) + b'"'))
    if value is None:
        members.append(draw(st.sampled_from([(b'"value"', b"null"), (b'"value_b64"', b"null")])))
    elif carries_exactly(value) and draw(st.booleans()):
        members.append((b'"value"', value))
    else:
        members.append((b'"value_b64"', b'"' + base64.b64encode(value) + b'"'))
    for name, n in ((b'"partition"', partition), (b'"offset"', offset)):
        if n is not None:
            members.append((name, str(n).encode()))
        elif draw(st.booleans()):
            members.append((name, b"null"))
    order = draw(st.permutations(members))
    ws = st.sampled_from([b"", b" ", b"\t", b"  "])
    body = b",".join(draw(ws) + n + draw(ws) + b":" + draw(ws) + v + draw(ws) for n, v in order)
    return draw(ws) + b"{" + body + b"}" + draw(st.sampled_from([b"", b"\r", b" "]))


JUNK = st.binary(min_size=1, max_size=30).filter(lambda b: b"\n" not in b and b.strip(b" \t\r") != b"")


@settings(max_examples=300, deadline=None, suppress_health_check=SLOW_OK)
@given(log=logs(), data=st.data())
def test_replaying_export_lines_equals_a_node(log: tuple[int | None, list[Msg]], data: st.DataObject) -> None:
    partitions, messages = log
    expected = reference(messages, partitions)

    # What `channel dump --export` writes, read back as a file: exactly the node's table and stats.
    exported = b"".join(export_lines(messages, topic="c", partitions=partitions))
    assert table_report(replay_lines(io.BytesIO(exported))) == expected

    # Hand-written lines (both value forms, any layout), with junk and blank lines between them.
    lines: list[bytes] = []
    junk = 0
    mode = data.draw(st.sampled_from(["header", "flag", "both"]))
    flag = None if mode == "header" else partitions
    if mode == "header":
        lines.append(header_line("c", partitions))
    elif mode == "both":  # the header says something else; the flag wins
        lines.append(header_line("c", None if partitions is None else 3))
    for m in messages:
        for _ in range(data.draw(st.integers(0, 1))):
            if data.draw(st.booleans()):
                lines.append(data.draw(JUNK))
                junk += 1
            else:
                lines.append(b"")
        lines.append(data.draw(hand_written_line(m)))
    text = b"\n".join(lines) + data.draw(st.sampled_from([b"", b"\n"]))
    got = table_report(replay_lines(io.BytesIO(text), partitions=flag))
    want_skipped = dict(expected["stats"]["skipped_by_reason"])
    if junk:
        want_skipped[BAD_LINE] = junk
    assert got["table"] == expected["table"]
    assert got["stats"]["rejected_by_reason"] == expected["stats"]["rejected_by_reason"]
    assert got["stats"]["skipped_by_reason"] == want_skipped
    assert got["stats"]["accepted"] == expected["stats"]["accepted"]


@settings(max_examples=200, deadline=None)
@given(log=logs())
def test_the_exporter_lines_parse_back_to_the_messages(log: tuple[int | None, list[Msg]]) -> None:
    """Both parsing paths (the exporter's shape, and the general scanner on the same line reformatted)
    give back every message exactly."""
    for m in log[1]:
        line_ = export_line(*m)
        assert parse_message_line(line_) == m
        spaced = b" " + line_.replace(b'":', b'" : ').rstrip(b"\n") + b" \n"
        assert parse_message_line(spaced) == m


@settings(max_examples=300, deadline=None, suppress_health_check=SLOW_OK)
@given(
    lines=st.lists(
        st.one_of(
            st.binary(max_size=60),
            st.builds(
                lambda m, pos, b: m[:pos] + bytes([b]) + m[pos + 1 :],
                st.sampled_from(
                    [
                        export_line(K1.encode(), ASSIGN, 0, 0),
                        raw_line(K1, ASSIGN),
                        header_line("c", 4),
                        b'{"key":"' + K1.encode() + b'","value":[[{"a":"\\""}]],"partition":1,"offset":2}',
                    ]
                ),
                st.integers(0, 120),
                st.integers(0, 255),
            ),
            st.text(max_size=30),
        ),
        max_size=20,
    )
)
def test_nothing_raises(lines: list[bytes | str]) -> None:
    view = replay_lines(lines, on_bad_line=lambda n, why: None)
    # Blank means JSON whitespace only (space, tab, CR, LF): b"\x0b" is a (bad) line.
    n_lines = sum(1 for x in lines if (x.strip(b" \t\r\n") if isinstance(x, bytes) else x.strip(" \t\r\n")))
    st_ = view.stats
    assert st_.accepted + sum(st_.rejected.values()) + sum(st_.skipped.values()) <= n_lines
    report_json(table_report(view))


# ---------------------------------------------------------------------------------------------- output


def test_report_json_never_raises() -> None:
    """The decoder bounds integers and refuses lone surrogates, but printing must not depend on that."""
    bad = Record(
        schema=1,
        state=State.OWNED,
        dst="b\udc80",
        src=None,
        version=2**80,
        force=False,
        ts=-(2**70),
        writer="[bold]w[/]",
    )
    view = TableView()
    view.load({K1: bad}, {})
    out = report_json({**table_report(view), "huge": 10**5000, "deep": [[[[[]]]]]})
    doc = json.loads(out)
    rec = doc["table"][K1]
    assert rec["ts"] == str(-(2**70))
    assert rec["version"] == str(2**80)
    assert rec["dst"] == "b\\udc80"
    assert rec["writer"] == "[bold]w[/]"
    assert doc["huge"] == hex(10**5000) or sys.get_int_max_str_digits() == 0
    assert doc["deep"] == [[[[[]]]]]
    assert out.endswith(b"\n")
    # The usual report is unchanged by the fallback.
    normal = table_report(replay_lines([line(K1, record("assigning", 1, dst="a:1"))]))
    assert json.loads(report_json(normal)) == normal
    assert (
        report_json(normal) == orjson.dumps(normal, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
    )
