"""The strict JSON reference parser (docs/protocol.md 2.2): every rule, the precedence between rules, and
the corner cases of UTF-8, escapes, numbers, whitespace and nesting."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import pytest

from trimtab.channel import strictjson
from trimtab.channel.strictjson import INT64_MAX, INT64_MIN, MAX_DEPTH, Invalid, parse

BOM = b"\xef\xbb\xbf"
OK = "ok"


def outcome(value: bytes) -> str:
    """The skip reason of ``value``, or ``ok`` when it parses."""
    got = parse(value)
    if isinstance(got, Invalid):
        assert got.reason in strictjson.REASONS
        assert isinstance(got.detail, str)
        return got.reason
    return OK


def parsed(value: bytes) -> Any:
    got = parse(value)
    assert not isinstance(got, Invalid), got
    return got


def nest(depth: int, inner: bytes = b"", kind: str = "[") -> bytes:
    """``depth`` nested containers around ``inner`` (arrays, objects ``{"k":...}``, or alternating)."""
    opens: list[bytes] = []
    closes: list[bytes] = []
    for level in range(depth):
        k = kind if kind in "[{" else "[{"[level % 2]
        opens.append(b"[" if k == "[" else b'{"k":')
        closes.append(b"]" if k == "[" else b"}")
    return b"".join(opens) + inner + b"".join(reversed(closes))


# ------------------------------------------------------------------------------------------ the reason list


def test_reasons_are_the_documented_list_in_order() -> None:
    assert strictjson.REASONS == (
        "too_large",
        "bom",
        "invalid_utf8",
        "malformed",
        "lone_surrogate",
        "int_out_of_range",
        "too_deep",
    )
    assert MAX_DEPTH == 32
    assert (INT64_MIN, INT64_MAX) == (-(2**63), 2**63 - 1)


# ------------------------------------------------------------------------------------------ accepted values


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"{}", {}),
        (b"[]", []),
        (b"null", None),
        (b"true", True),
        (b"false", False),
        (b"0", 0),
        (b"-0", 0),
        (b"1.5", 1.5),
        (b"-0.0", -0.0),
        (b"1E2", 100.0),
        (b"1e-2", 0.01),
        (b"1e+2", 100.0),
        (b'""', ""),
        (b'"a/b"', "a/b"),
        (b' \t\r\n{ "a" : [ 1 , 2 ] , "b" : { } }\n\r\t ', {"a": [1, 2], "b": {}}),
        (b'{"":0}', {"": 0}),
        (b'"\\"\\\\\\/\\b\\f\\n\\r\\t"', '"\\/\b\f\n\r\t'),
        (b'"\\u0064st"', "dst"),
        (b'"\\u00E9\\u00e9"', "\u00e9\u00e9"),
        (b'"\\u0000"', "\x00"),
        (b'"\\u001f\\u001F"', "\x1f\x1f"),
        (b'"\\ud83d\\ude00"', "\U0001f600"),
        (b'"\\uD83D\\uDE00"', "\U0001f600"),
        (b'"\\udbff\\udfff"', "\U0010ffff"),
        (b'"\\ud800\\udc00"', "\U00010000"),
        ('"\U0001f600"'.encode(), "\U0001f600"),
        (b'"\xf4\x8f\xbf\xbf"', "\U0010ffff"),
        (b'"\xef\xbf\xbf"', "\uffff"),  # a noncharacter is still well-formed UTF-8
        (b'"\x7f"', "\x7f"),  # DEL is not a control character for JSON
        (b'"\xc2\x85"', "\x85"),  # nor are the C1 controls
        ('"\u2028\u2029"'.encode(), "\u2028\u2029"),
        (b'"' + BOM + b'"', "\ufeff"),  # a U+FEFF inside a string is ordinary text
        (b'"\\ufeff"', "\ufeff"),
        (b'{"a":"' + BOM + b'"}', {"a": "\ufeff"}),
        (b'"{[{["', "{[{["),
    ],
    ids=repr,
)
def test_accepted_values(raw: bytes, expected: Any) -> None:
    got = parsed(raw)
    assert got == expected
    assert type(got) is type(expected)


def test_floats_are_never_integers() -> None:
    got = parsed(b"[1e999, -1e999, 1.0, 1e0, 9223372036854775808.0, 1e19, 1E400, 2.5e-400]")
    assert got == [math.inf, -math.inf, 1.0, 1.0, 9223372036854775808.0, 1e19, math.inf, 0.0]
    assert all(type(x) is float for x in got)
    assert math.copysign(1.0, parsed(b"-0.0")) == -1.0


def test_negative_zero_integer_is_the_integer_zero() -> None:
    got = parsed(b'{"a":-0}')
    assert got == {"a": 0}
    assert type(got["a"]) is int


def test_5000_digit_float_is_accepted() -> None:
    assert parsed(b"1" + b"0" * 5000 + b".5") == math.inf
    assert parsed(b"0." + b"1" * 5000) == pytest.approx(0.1111111111)


# ------------------------------------------------------------------------------------------ rule 2: text


@pytest.mark.parametrize(
    "raw",
    [
        BOM,
        BOM + b"{}",
        BOM + b" {}",
        BOM + BOM + b"{}",
        BOM + b"\xff",
        BOM + b"[" * 40,
        BOM + b'{"a":1,"a":1}',
    ],
    ids=repr,
)
def test_leading_bom(raw: bytes) -> None:
    assert outcome(raw) == "bom"


@pytest.mark.parametrize(
    "raw", [b" " + BOM + b"{}", b"{}" + BOM, b"[1," + BOM + b"2]", b'{"a"' + BOM + b":1}"]
)
def test_bom_elsewhere_than_the_start_is_just_a_character_outside_a_string(raw: bytes) -> None:
    assert outcome(raw) == "malformed"


@pytest.mark.parametrize(
    "raw",
    [
        b'"\xc0\xaf"',  # overlong '/'
        b'"\xc1\xbf"',
        b'"\xe0\x80\xaf"',  # 3-byte overlong
        b'"\xf0\x80\x80\xaf"',  # 4-byte overlong
        b'"\xed\xa0\x80"',  # CESU-8 / encoded high surrogate
        b'"\xed\xbf\xbf"',  # encoded low surrogate
        b'"\xed\xa0\xbd\xed\xb8\x80"',  # an encoded surrogate *pair* is still ill-formed
        b'"\xf4\x90\x80\x80"',  # above U+10FFFF
        b'"\xf5\x80\x80\x80"',
        b'"\xf8\x88\x80\x80\x80"',  # 5-byte form
        b'"\xff"',
        b'"\xfe"',
        b'"\x80"',  # lone continuation byte
        b'"\xc3"',  # truncated 2-byte sequence inside a string
        b'"\xf0\x9f\x98"',  # truncated 4-byte sequence
        b'"\xe2\x82',  # truncated at the very end of the value (and the string is unterminated)
        b"\xf0\x9f",
        b"\xef\xbb",  # half a BOM is not a BOM
        b"{}\xff",
        b'{"unknown":"\xff"}',  # in a field no schema knows
        b'{"\xc0\xaf":1}',  # in a name
        b'{"a":1,"a":2,"b":"\x80"}',
        b'["\\ud800",99999999999999999999,' + nest(40) + b',"\xed\xa0\x80"]',
        b'{"a":1,}\xff',  # beats malformed
    ],
    ids=repr,
)
def test_invalid_utf8(raw: bytes) -> None:
    assert outcome(raw) == "invalid_utf8"


def test_four_byte_utf8_in_names_and_values() -> None:
    assert parsed('{"\U0001f600":"\U0010ffff"}'.encode()) == {"\U0001f600": "\U0010ffff"}


# ------------------------------------------------------------------------------------------ rule 3: JSON text


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b" ",
        b"\t\r\n",
        b"{",
        b"}",
        b"[",
        b"]",
        b"[1,]",
        b"[,1]",
        b"[1,,2]",
        b'{"a":1,}',
        b'{,"a":1}',
        b'{"a" 1}',
        b'{"a":}',
        b'{"a"}',
        b'{"a":1 "b":2}',
        b"{a:1}",
        b"{1:2}",
        b"{'a':1}",
        b"{null:1}",
        b"[1 2]",
        b"{}{}",
        b"{} []",
        b"{}x",
        b"{}\x00",
        b"1 2",
        b"NaN",
        b"-NaN",
        b"Infinity",
        b"-Infinity",
        b"[NaN]",
        b"nan",
        b"True",
        b"NULL",
        b"nul",
        b"tru",
        b"nulll",
        b"truefalse",
        b"01",
        b"-01",
        b"00",
        b"[01]",
        b"+1",
        b"-",
        b"--1",
        b"1.",
        b".5",
        b"-.5",
        b"1.e5",
        b"1e",
        b"1e+",
        b"1E-",
        b"0x10",
        b"1_000",
        b"\xef\xbc\x91",  # FULLWIDTH DIGIT ONE
        b"\xd9\xa1",  # ARABIC-INDIC DIGIT ONE
        b'"abc',
        b'"\\"',
        b'"\\',
        b'"\\x41"',
        b'"\\a"',
        b'"\\U0041"',
        b'"\\u41"',
        b'"\\u004"',
        b'"\\u00g1"',
        b'"\\ud800\\u"',
        b'"\\ud800\\uzzzz"',
        b"'a'",
        b'{"a":1}//',
        b"/*c*/{}",
    ],
    ids=repr,
)
def test_malformed(raw: bytes) -> None:
    assert outcome(raw) == "malformed"


@pytest.mark.parametrize("code", range(0x20))
def test_raw_control_characters_in_strings_are_malformed(code: int) -> None:
    ch = bytes([code])
    assert outcome(b'"a' + ch + b'b"') == "malformed"
    assert outcome(b'{"n' + ch + b'":1}') == "malformed"
    # ... but every one of them may be escaped.
    assert parsed(b'"\\u%04x"' % code) == chr(code)


@pytest.mark.parametrize(
    "ws",
    [
        b"\x0b",  # vertical tab
        b"\x0c",  # form feed
        b"\x00",
        b"\x1c",
        b"\x85",
        "\u00a0".encode(),  # NO-BREAK SPACE
        "\u2028".encode(),
        "\u3000".encode(),
        BOM,
    ],
    ids=repr,
)
def test_only_four_whitespace_characters(ws: bytes) -> None:
    expected = "invalid_utf8" if ws == b"\x85" else "malformed"
    assert outcome(ws + b"{}") == ("bom" if ws == BOM else expected)
    for raw in (b"{}" + ws, b"{" + ws + b"}", b"[1" + ws + b",2]", b'{"a"' + ws + b":1}", b"[" + ws + b"]"):
        assert outcome(raw) == expected, raw
    assert outcome(b' \t\n\r{ \t\n\r"a" \t\n\r: \t\n\r1 \t\n\r} \t\n\r') == OK


def test_ascii_text_that_json_does_not_know_is_malformed_even_with_rule_4_violations() -> None:
    # Rule 3 comes before rule 4: a syntax error anywhere wins over a lone surrogate before it.
    assert outcome(b'["\\ud800", 99999999999999999999, ' + nest(40) + b', {"a":1,"a":2},]') == "malformed"
    assert outcome(b'{"a":1,"a":2} x') == "malformed"
    assert outcome(nest(40) + b"]") == "malformed"
    assert outcome(b"[" * 40) == "malformed"


# ------------------------------------------------------------------------------------------ rule 4.1


@pytest.mark.parametrize(
    "string",
    [
        b'"\\ud800"',
        b'"\\uDBFF"',
        b'"\\udc00"',
        b'"\\uDFFF"',
        b'"a\\ud800b"',
        b'"\\ud800x"',
        b'"\\ud800\\u0041"',  # high + non-surrogate escape
        b'"\\ud800\\ue000"',
        b'"\\ud800\\ud800"',  # high + high
        b'"\\udc00\\ud800"',  # reversed pair
        b'"\\ud800\\\\udc00"',  # high + escaped backslash + "udc00" text
        b'"\\ud800\\n\\udc00"',
        b'"\\ud800\\ud800\\udc00"',  # the first high is alone
        b'"\\ud800\\udc00\\udc00"',  # the second low is alone
        b'"\\ud83d\\ude00\\ude00"',
        b'"\xf0\x9f\x98\x80\\ude00"',  # a raw 4-byte character does not pair with an escape
        b'"\\ud83d\xf0\x9f\x98\x80"',
    ],
    ids=repr,
)
def test_lone_surrogate_in_values_and_names(string: bytes) -> None:
    assert outcome(string) == "lone_surrogate"
    assert outcome(b'{"a":' + string + b"}") == "lone_surrogate"
    assert outcome(b"{" + string + b":1}") == "lone_surrogate"
    assert outcome(b'{"x":{"y":[1,{' + string + b":null}]}}") == "lone_surrogate"


@pytest.mark.parametrize(
    "string",
    [b'"\\ud800\\udc00"', b'"\\uDBFF\\uDFFF"', b'"\\ud83d\\uDE00"', b'"x\\ud83d\\ude00\\ud83d\\ude00y"'],
)
def test_paired_surrogates_are_fine(string: bytes) -> None:
    assert outcome(string) == OK
    assert outcome(b"{" + string + b":" + string + b"}") == OK


# ------------------------------------------------------------------------------------------ rule 4.2


@pytest.mark.parametrize(
    "literal",
    [
        b"9223372036854775807",
        b"-9223372036854775808",
        b"-9223372036854775807",
        b"0",
        b"-0",
        b"1000000000000000000",  # 19 digits
        b"-1000000000000000000",
    ],
)
def test_integers_inside_int64(literal: bytes) -> None:
    got = parsed(b"[" + literal + b"]")
    assert got == [int(literal)]
    assert type(got[0]) is int


@pytest.mark.parametrize(
    "literal",
    [
        b"9223372036854775808",
        b"-9223372036854775809",
        b"9999999999999999999",  # 19 digits, above the maximum
        b"-9999999999999999999",
        b"10000000000000000000",  # 20 digits
        b"-10000000000000000000",
        b"18446744073709551615",  # uint64 max
        b"18446744073709551616",
        b"99999999999999999999",
        b"-99999999999999999999",
        b"1" + b"0" * 4999,  # 5000 digits: never converted, whatever PYTHONINTMAXSTRDIGITS says
        b"-" + b"9" * 5000,
        b"-" + b"1" * 4300,
        b"1" * 641,
    ],
    ids=lambda b: b[:24].decode() + (f"..({len(b)})" if len(b) > 24 else ""),
)
def test_integers_outside_int64(literal: bytes) -> None:
    assert outcome(literal) == "int_out_of_range"
    assert outcome(b'{"a":' + literal + b"}") == "int_out_of_range"
    assert outcome(b'{"a":[1,{"b":' + literal + b"}]}") == "int_out_of_range"
    # With a fraction or an exponent it is a number, not an integer.
    assert outcome(literal + b".0") == OK
    assert outcome(literal + b"e0") == OK
    assert outcome(literal + b"E-5") == OK


# ------------------------------------------------------------------------------------------ rule 4.3


@pytest.mark.parametrize("kind", ["[", "{", "mixed"])
def test_depth_32_is_allowed_and_33_is_too_deep(kind: str) -> None:
    assert outcome(nest(32, b"0", kind)) == OK
    assert outcome(nest(33, b"0", kind)) == "too_deep"
    assert outcome(nest(31, b"[]", kind)) == OK
    assert outcome(nest(31, b"{}", kind)) == OK
    # An empty container at level 33 still counts; a scalar at level 33 is not a level.
    assert outcome(nest(32, b"[]", kind)) == "too_deep"
    assert outcome(nest(32, b"{}", kind)) == "too_deep"
    assert outcome(nest(32, b'"deep"', kind)) == OK
    assert outcome(nest(32, b"null", kind)) == OK
    assert outcome(nest(31, b'{"x":{}}', kind)) == "too_deep"


def test_depth_counts_the_record_object_as_level_one() -> None:
    assert outcome(nest(32)) == OK  # the innermost [] is level 32
    assert outcome(nest(33)) == "too_deep"


def test_depth_is_not_cumulative_over_siblings() -> None:
    sibling = nest(31)
    assert outcome(b"[" + b",".join([sibling] * 50) + b"]") == OK
    assert outcome(b"[" + b",".join([sibling] * 50 + [nest(32)]) + b"]") == "too_deep"
    assert outcome(b'{"a":' + nest(31) + b',"b":' + nest(31) + b"}") == OK
    assert outcome(b'{"a":' + nest(31) + b',"b":' + nest(32) + b"}") == "too_deep"


@pytest.mark.parametrize(
    "inner",
    [b'"[[[[[[[[[["', b'"{{{{{{{{{{"', b'"]]]]]]]]]]"', b'"}}}}}}}}}}"', b'"\\"[[[{{{"', b'"[\\\\"'],
    ids=repr,
)
def test_brackets_inside_strings_do_not_count(inner: bytes) -> None:
    assert outcome(nest(32, inner, "[")) == OK
    assert outcome(nest(31, b"{" + inner + b":" + inner + b"}", "[")) == OK
    assert outcome(nest(33, inner, "[")) == "too_deep"


@pytest.mark.parametrize("depth", [33, 1000, 30_000])
def test_deep_nesting_never_recurses(depth: int) -> None:
    assert outcome(nest(depth)) == "too_deep"
    assert outcome(nest(depth, b"0", "{")) == "too_deep"
    assert outcome(b"[" * depth) == "malformed"
    assert outcome(b'{"a":' * depth) == "malformed"


def test_max_depth_parameter() -> None:
    assert not isinstance(parse(nest(3), max_depth=3), Invalid)
    got = parse(nest(4), max_depth=3)
    assert isinstance(got, Invalid)
    assert got.reason == "too_deep"


# ------------------------------------------------------------------------------------------ rule 4.4


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a":1,"a":1}',
        b'{"a":1,"a":2}',
        b'{"a":1,"b":2,"a":3}',
        b'{"a":1,"b":2,"c":3,"d":4,"e":5,"a":6}',
        b'{"a":1,"a":2,"a":3}',
        b'{"":1,"":2}',
        b'{"dst":"x","\\u0064st":"y"}',
        b'{"\\u0064st":"x","dst":"y"}',
        b'{"d\\u0073t":null,"dst":null}',
        b'{"\\u0064\\u0073\\u0074":1,"ds\\u0074":2}',
        b'{"\\u0044":1,"D":2}',
        b'{"a/b":1,"a\\/b":2}',
        b'{"\\b":1,"\\u0008":2}',
        b'{"\\f":1,"\\u000C":2}',
        b'{"\\n":1,"\\u000a":2}',
        b'{"\\"":1,"\\u0022":2}',
        b'{"\\\\":1,"\\u005c":2}',
        b'{"\\u00e9":1,"\xc3\xa9":2}',
        b'{"\\ud83d\\ude00":1,"\xf0\x9f\x98\x80":2}',
        b'{"a":{"a":1,"a":2}}',
        b'{"x":[1,2,{"k":1,"k":2}]}',
        b'[{"k":1},{"k":1,"k":1}]',
        b'{"a":{},"a":[]}',
        b'{"a":{"b":1},"a":{"b":1}}',
        b'{"a":null,"b":' + nest(31) + b',"a":null}',
    ],
    ids=repr,
)
def test_a_repeated_name_keeps_its_last_value(raw: bytes) -> None:
    """docs/protocol.md 2.2: the last occurrence counts -- as Python's json (and jq, JavaScript, Go) read
    it, compared after unescaping."""
    assert outcome(raw) == OK
    assert parsed(raw) == json.loads(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a":1,"A":2}',
        b'{"a":1,"a ":2}',
        b'{"a":1,"a\\u0000":2}',
        b'{"\xc3\xa9":1,"e\xcc\x81":2}',  # no Unicode normalisation: precomposed vs combining
        b'{"\\u00e9":1,"e\\u0301":2}',
        b'{"a":{"a":1}}',
        b'{"a":1,"b":{"a":1}}',
        b'[{"a":1},{"a":1}]',
        b'{"x":{"k":1},"y":{"k":1}}',
        b'{"a":"a","b":"a"}',
    ],
    ids=repr,
)
def test_not_duplicates(raw: bytes) -> None:
    assert outcome(raw) == OK


def test_names_in_different_objects_are_independent() -> None:
    assert parsed(b'{"a":1,"b":{"a":2}}') == {"a": 1, "b": {"a": 2}}
    assert parsed(b'{"a":1,"a":{"a":2,"a":3}}') == {"a": {"a": 3}}


def test_an_overridden_occurrence_still_has_to_follow_the_rules() -> None:
    assert outcome(b'{"a":"\\udead","a":1}') == "lone_surrogate"
    assert outcome(b'{"a":99999999999999999999,"a":1}') == "int_out_of_range"
    assert outcome(b'{"a":' + nest(32) + b',"a":1}') == "too_deep"


# ------------------------------------------------------------------------------------------ precedence

# One violation of each rule-4 rule, as a JSON value to place in an array or object.
VIOLATIONS: dict[str, bytes] = {
    "lone_surrogate": b'"\\udead"',
    "int_out_of_range": b"-9223372036854775809",
    "too_deep": nest(33),
}
RULE4 = tuple(VIOLATIONS)


def _subsets() -> list[tuple[str, ...]]:
    return [
        p
        for n in range(1, len(RULE4) + 1)
        for c in itertools.combinations(RULE4, n)
        for p in itertools.permutations(c)
    ]


@pytest.mark.parametrize("order", _subsets(), ids="+".join)
def test_first_rule_of_the_list_wins_wherever_it_is(order: tuple[str, ...]) -> None:
    expected = min(order, key=RULE4.index)
    parts = [VIOLATIONS[r] for r in order]
    assert outcome(b"[" + b",".join(parts) + b"]") == expected
    obj = b"{" + b",".join(b'"k%d":%s' % (i, p) for i, p in enumerate(parts)) + b"}"
    assert outcome(obj) == expected
    # A syntax error after all of them makes it malformed; invalid UTF-8 or a BOM beat that too.
    assert outcome(obj[:-1] + b",}") == "malformed"
    assert outcome(obj + b"\xff") == "invalid_utf8"
    assert outcome(BOM + obj + b"\xff") == "bom"


def test_duplicate_name_that_is_also_a_lone_surrogate() -> None:
    assert outcome(b'{"\\ud800":1,"\\ud800":2}') == "lone_surrogate"
    assert outcome(b'{"a":1,"a":"\\udfff"}') == "lone_surrogate"


def test_violations_inside_a_too_deep_subtree() -> None:
    assert outcome(nest(40, b'{"a":1,"a":2}')) == "too_deep"
    assert outcome(nest(40, b"99999999999999999999")) == "int_out_of_range"
    assert outcome(nest(40, b'"\\ud800"')) == "lone_surrogate"
    assert outcome(b'{"a":1,"a":' + nest(40, b'"\\ud800"') + b"}") == "lone_surrogate"


# ------------------------------------------------------------------------------------------ totality


@pytest.mark.parametrize(
    "raw",
    [
        b"\x00",
        b"\\",
        b'"\\u',
        b'"\\ud800\\',
        b'"\\ud800\\u12',
        b'{"a":"\\ud800',
        b"-" * 100,
        b"[" * 100_000,
        b"{" * 100_000,
        b'{"' * 50_000,
        b"1" * 100_000,
        bytes(range(256)),
    ],
    ids=lambda b: repr(b[:20]),
)
def test_parse_never_raises(raw: bytes) -> None:
    got = parse(raw)
    assert isinstance(got, Invalid)
    assert got.reason in ("malformed", "int_out_of_range", "invalid_utf8")


def test_huge_numbers_with_a_fraction_or_exponent_are_floats() -> None:
    assert parsed(b"1." + b"1" * 60_000) == pytest.approx(1.1111111)
    assert parsed(b"1e" + b"9" * 60_000) == math.inf
    assert parsed(b"1e-" + b"9" * 60_000) == 0.0
