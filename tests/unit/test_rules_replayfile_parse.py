"""The export reader's parsing rules (channel/replayfile.py; docs/protocol.md section 8; docs/testing.md).

An export line is hostile input: the reader delimits a line's members with a small scanner, refuses every
line that is not an export line with a reason, and never raises anything else. The reasons are what an
operator reads (``BadExportLine``'s message, the ``bad_line`` hook of ``replay_lines``, the header's
problem), so each is pinned word for word here, with the member it names. The scanner is pinned where it
can break: at the end of the line (a name, a value or ``{}`` that is the last thing on it) and one byte
after a delimiter. Number ranges are pinned at both ends, on the general path (a line not in the
exporter's own layout) and on the exporter's layout.
"""

from __future__ import annotations

import pytest

from trimtab.channel.replayfile import parse_message_line, read_header, replay_lines, scan_members
from trimtab.errors import BadExportLine

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
HEADER = b'"format":"trimtab-channel-export","version":1'


def refusal(line: bytes) -> str:
    """Why ``parse_message_line`` refuses ``line`` (it must refuse it, with a BadExportLine)."""
    with pytest.raises(BadExportLine) as caught:
        parse_message_line(line)
    return str(caught.value)


# ---------------------------------------------------------------------------------------------- scanner


@pytest.mark.parametrize("line", [b"{}", b"{ }", b"{}\r\n", b" {\t} "])
def test_an_empty_object_is_an_object(line: bytes) -> None:
    """Rule: ``{}`` (whitespace inside and around allowed) is an object without members."""
    assert scan_members(line) == []


@pytest.mark.parametrize("line", [b"{}x", b"{ }x", b"{}}", b"{} x"])
def test_nothing_but_whitespace_may_follow_an_empty_object(line: bytes) -> None:
    """Rule: the closing brace of an empty object is one byte, and anything but whitespace after it makes
    the line no object -- also a single byte right after it."""
    assert scan_members(line) is None
    assert refusal(line) == "not one delimitable JSON object"


@pytest.mark.parametrize("line", [b'{"a"', b'{"a" ', b'{"a"x1}', b'{"a" 11}', b'{"a""b"}', b'{"a",1}'])
def test_a_name_must_be_followed_by_a_colon(line: bytes) -> None:
    """Rule: after a member's name comes a colon (whitespace allowed); a line that ends after the name, or
    has any other byte there, is no object (the byte is not skipped as if it were the colon)."""
    assert scan_members(line) is None
    assert refusal(line) == "not one delimitable JSON object"


def test_a_colon_after_a_name_may_have_whitespace_around_it() -> None:
    """Rule: whitespace before and after the colon is allowed; the spans are the names' literals and the
    values' exact byte ranges."""
    assert scan_members(b'{"a" :1}') == [(b'"a"', 6, 7)]
    assert scan_members(b'{"a": 1,"b"\t:\t"x"}') == [(b'"a"', 6, 7), (b'"b"', 14, 17)]


@pytest.mark.parametrize(
    "line",
    [b'{"a":1', b'{"a":1 ', b'{"a":"b"', b'{"a":"b"x', b'{"a":"b" x', b'{"a":[1]x', b'{"a":1,'],
)
def test_after_a_value_comes_a_comma_or_the_closing_brace(line: bytes) -> None:
    """Rule: after a member's value the line goes on with a comma and another member, or with the closing
    brace; a line that ends after the value, or has any other byte there -- also as its last byte -- is no
    object."""
    assert scan_members(line) is None
    assert refusal(line) == "not one delimitable JSON object"


def test_a_value_may_be_the_last_member_before_the_brace() -> None:
    """Rule: the closing brace right after a value, or after whitespace, ends the object."""
    assert scan_members(b'{"a":"b"}') == [(b'"a"', 5, 8)]
    assert scan_members(b'{"a":1 }\n') == [(b'"a"', 5, 6)]
    assert scan_members(b'{"a":1 , "b":2}') == [(b'"a"', 5, 6), (b'"b"', 13, 14)]


# ---------------------------------------------------------------------------------------------- members


@pytest.mark.parametrize("line", [b"x", b"", b"[]", b'"key"', b"null", b'{"key":null,"value":null'])
def test_a_line_that_is_not_one_object_is_refused_as_such(line: bytes) -> None:
    """Rule: a line that is not one delimitable JSON object is refused with "not one delimitable JSON
    object"."""
    assert refusal(line) == "not one delimitable JSON object"


@pytest.mark.parametrize("line", [b'{"\\ud800":1}', b'{"\xff":1}', b'{"\\x":1}', b'{"\x01":1}'])
def test_a_member_name_must_be_a_valid_json_string(line: bytes) -> None:
    """Rule: a member's name that delimits but is not strict JSON text (a lone surrogate, invalid UTF-8, a
    bad escape, a control character) is refused with "a member name is not a valid JSON string"."""
    assert refusal(line) == "a member name is not a valid JSON string"


def test_a_member_name_may_occur_once() -> None:
    """Rule: a name that occurs twice -- compared after unescaping -- is refused, naming the member."""
    assert refusal(b'{"key":null,"value":null,"key":null}') == "member 'key' occurs twice"
    assert refusal(b'{"value":null,"key":null,"valu\\u0065":1}') == "member 'value' occurs twice"


def test_an_unknown_member_is_refused_by_name() -> None:
    """Rule: a member that is not one of the message members is refused, naming it; of several, the first
    by name -- and before anything else about the line is looked at."""
    assert refusal(b'{"key":null,"value":null,"extra":1}') == "unknown member 'extra'"
    assert refusal(b'{"zz":1,"aa":2}') == "unknown member 'aa'"


# ---------------------------------------------------------------------------------------------- key


@pytest.mark.parametrize("line", [b'{"value":null}', b'{"key":null,"key_b64":"","value":null}'])
def test_exactly_one_of_key_and_key_b64(line: bytes) -> None:
    """Rule: a line with neither or both of ``key`` and ``key_b64`` is refused with "needs exactly one of
    key and key_b64"."""
    assert refusal(line) == "needs exactly one of key and key_b64"


@pytest.mark.parametrize("key", [b"5", b"[]", b'"\\ud800"', b"true"])
def test_a_key_is_a_string_or_null(key: bytes) -> None:
    """Rule: ``key`` that is not a JSON string or null is refused with "key is not a string or null"."""
    assert refusal(b'{"key":' + key + b',"value":null}') == "key is not a string or null"


@pytest.mark.parametrize("key_b64", [b"null", b"5", b'"\\ud800"'])
def test_key_b64_is_a_string(key_b64: bytes) -> None:
    """Rule: ``key_b64`` must be a JSON string (null is no key bytes): else "key_b64 is not a string"."""
    assert refusal(b'{"key_b64":' + key_b64 + b',"value":null}') == "key_b64 is not a string"


def test_key_b64_is_strict_base64() -> None:
    """Rule: ``key_b64`` that is not base64, or not its canonical spelling, is refused naming ``key_b64``;
    a canonical one gives its bytes."""
    assert refusal(b'{"key_b64":"QQ","value":null}') == "key_b64 is not valid base64"
    assert refusal(b'{"key_b64":"QR==","value":null}') == "key_b64 is not canonical base64"
    assert parse_message_line(b'{"key_b64":"/w==","value":null}') == (b"\xff", None, None, None)


# ---------------------------------------------------------------------------------------------- value


@pytest.mark.parametrize("line", [b'{"key":null}', b'{"key":null,"value":1,"value_b64":null}'])
def test_exactly_one_of_value_and_value_b64(line: bytes) -> None:
    """Rule: a line with neither or both of ``value`` and ``value_b64`` is refused with "needs exactly one
    of value and value_b64"."""
    assert refusal(line) == "needs exactly one of value and value_b64"


@pytest.mark.parametrize("value_b64", [b"5", b"{}", b'"\\ud800"'])
def test_value_b64_is_a_string_or_null(value_b64: bytes) -> None:
    """Rule: ``value_b64`` that is not a JSON string or null is refused with "value_b64 is not a string or
    null"."""
    assert refusal(b'{"key":null,"value_b64":' + value_b64 + b"}") == "value_b64 is not a string or null"


def test_value_b64_is_strict_base64() -> None:
    """Rule: ``value_b64`` that is not base64, or not its canonical spelling, is refused naming
    ``value_b64``, in any layout."""
    assert refusal(b'{"key":null,"value_b64":"QQ"}') == "value_b64 is not valid base64"
    assert refusal(b'{"key":null,"value_b64":"QR=="}') == "value_b64 is not canonical base64"
    assert refusal(b'{"value_b64" : "QQ", "key" : null}') == "value_b64 is not valid base64"


def test_value_b64_is_strict_base64_in_the_exporters_layout() -> None:
    """Rule: the exporter's own layout (``key``, ``value_b64``, ``partition``, ``offset``, no spaces) holds
    ``value_b64`` to the same strict base64, with the same reasons."""
    assert (
        refusal(b'{"key":"k","value_b64":"QQ","partition":0,"offset":0}') == "value_b64 is not valid base64"
    )
    assert (
        refusal(b'{"key":"k","value_b64":"QR==","partition":0,"offset":0}')
        == "value_b64 is not canonical base64"
    )
    assert parse_message_line(b'{"key":"k","value_b64":"QQ==","partition":0,"offset":0}') == (
        b"k",
        b"A",
        0,
        0,
    )


# ---------------------------------------------------------------------------------------------- partition, offset


@pytest.mark.parametrize("number", [b"1.0", b"true", b'"1"', b"01", b"1e3", b"-0x1"])
def test_partition_and_offset_are_integers_or_null(number: bytes) -> None:
    """Rule: ``partition`` and ``offset`` that are not a JSON integer or null are refused, naming the
    member."""
    assert (
        refusal(b'{"key":null,"value":null,"partition":' + number + b"}")
        == "partition is not an integer or null"
    )
    assert (
        refusal(b'{"key":null,"value":null,"offset":' + number + b"}") == "offset is not an integer or null"
    )


def test_a_partition_is_0_to_int32_max() -> None:
    """Rule: a partition from 0 to 2**31 - 1 inclusive is passed on, outside that range the line is refused
    with the number and the range -- in any layout, and in the exporter's own."""
    general = b'{"key":null,"value":null,"partition":%d}'
    assert parse_message_line(general % 0) == (None, None, 0, None)
    assert parse_message_line(general % INT32_MAX) == (None, None, INT32_MAX, None)
    assert refusal(general % (INT32_MAX + 1)) == "partition 2147483648 is outside 0..2147483647"
    assert refusal(general % -1) == "partition -1 is outside 0..2147483647"
    exported = b'{"key":"k","value_b64":null,"partition":%d,"offset":0}'
    assert parse_message_line(exported % INT32_MAX) == (b"k", None, INT32_MAX, 0)
    assert refusal(exported % (INT32_MAX + 1)) == "partition 2147483648 is outside 0..2147483647"


def test_an_offset_is_0_to_int64_max() -> None:
    """Rule: an offset from 0 to 2**63 - 1 inclusive is passed on, outside that range the line is refused
    with the number and the range -- in any layout, and in the exporter's own."""
    general = b'{"key":null,"value":null,"offset":%d}'
    assert parse_message_line(general % 0) == (None, None, None, 0)
    assert parse_message_line(general % INT64_MAX) == (None, None, None, INT64_MAX)
    assert (
        refusal(general % (INT64_MAX + 1)) == "offset 9223372036854775808 is outside 0..9223372036854775807"
    )
    assert refusal(general % -1) == "offset -1 is outside 0..9223372036854775807"
    exported = b'{"key":"k","value_b64":null,"partition":0,"offset":%d}'
    assert parse_message_line(exported % INT64_MAX) == (b"k", None, 0, INT64_MAX)
    assert (
        refusal(exported % (INT64_MAX + 1)) == "offset 9223372036854775808 is outside 0..9223372036854775807"
    )


def test_null_partition_and_offset_are_absent() -> None:
    """Rule: ``partition`` and ``offset`` null mean the same as leaving them out."""
    assert parse_message_line(b'{"key":"k","value":1,"partition":null,"offset":null}') == (
        b"k",
        b"1",
        None,
        None,
    )


# ---------------------------------------------------------------------------------------------- header


def test_a_line_without_format_is_not_a_header() -> None:
    """Rule: only a line with a ``format`` member is read as a header; any other line is a message line."""
    assert read_header(b'{"key":null,"value":null}') is None
    assert read_header(b"not json") is None


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b'{"format":"other","version":1}', "header: format is not 'trimtab-channel-export'"),
        (b'{"format":5,"version":1}', "header: format is not 'trimtab-channel-export'"),
        (b'{"format":"trimtab-channel-export"}', "header: version is not 1"),
        (b'{"format":"trimtab-channel-export","version":2}', "header: version is not 1"),
        (b'{"format":"trimtab-channel-export","version":1.0}', "header: version is not 1"),
        (b'{"format":"x","format":"y"}', "member 'format' occurs twice"),
        (b'{"format":"x","\\ud800":1}', "a member name is not a valid JSON string"),
    ],
)
def test_a_header_this_reader_does_not_understand_says_why(line: bytes, problem: str) -> None:
    """Rule: a header with another format or version, or members that are not valid, declares nothing and
    says why, word for word -- also to ``replay_lines``'s bad-line hook."""
    assert read_header(line) == (None, problem)
    seen: list[tuple[int, str]] = []
    replay_lines([b"", line], on_bad_line=lambda n, why: seen.append((n, why)))
    assert seen == [(2, problem)]


@pytest.mark.parametrize("topic", [b"5", b"[]", b'"\\ud800"'])
def test_a_headers_topic_is_a_string_or_null(topic: bytes) -> None:
    """Rule: a header's ``topic`` is informational but must be a string or null; else the header is not
    valid and says so."""
    assert read_header(b"{" + HEADER + b',"topic":' + topic + b',"partitions":4}') == (
        None,
        "header: topic is not a string or null",
    )


def test_a_header_declares_its_partitions() -> None:
    """Rule: a valid header declares its ``partitions`` (null or absent: none); its ``topic`` and members
    it does not know change nothing."""
    assert read_header(b"{" + HEADER + b',"topic":"c","partitions":4,"more":[1]}') == (4, None)
    assert read_header(b"{" + HEADER + b',"topic":null,"partitions":null}') == (None, None)
    assert read_header(b"{" + HEADER + b"}") == (None, None)


def test_a_headers_partition_count_is_1_to_int32_max() -> None:
    """Rule: a header's partition count runs from 1 to 2**31 - 1 inclusive; outside that range, or not an
    integer, the header says so with the number and the range."""
    line = b"{" + HEADER + b',"partitions":%b}'
    assert read_header(line % b"1") == (1, None)
    assert read_header(line % b"2147483647") == (INT32_MAX, None)
    assert read_header(line % b"0") == (None, "header: partitions 0 is outside 1..2147483647")
    assert read_header(line % b"2147483648") == (
        None,
        "header: partitions 2147483648 is outside 1..2147483647",
    )
    assert read_header(line % b'"4"') == (None, "header: partitions is not an integer or null")
