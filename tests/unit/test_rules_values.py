"""The typed-value decoder's rules one at a time (channel/values.py; docs/testing.md: mutation testing).

Every test names the rule it pins: a missing value and a value over the size limit are refused with a fixed
reason and a detail that says why (the limit itself is allowed, on both paths), a structure refusal keeps
the strict parser's reason and detail, a value of the wrong shape is ``invalid``, and the fast path: what
trimtab's own writers produce is decoded without the pure-Python parser, anything else goes through it.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from trimtab.channel import strictjson
from trimtab.channel.values import REASONS, Refused, StrictDecoder


class Point(msgspec.Struct, frozen=True):
    x: int
    label: str


CANONICAL = b'{"x":1,"label":"a"}'  # what msgspec writes for Point(1, "a"): 19 bytes
SPACED = b'{"x": 1, "label": "a"}'  # another writer's formatting: 22 bytes


def spy_on_parse(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The values the strict parser is asked about, from now on."""
    calls: list[bytes] = []
    real: Callable[[bytes], object] = strictjson.parse

    def parse(value: bytes) -> object:
        calls.append(value)
        return real(value)

    monkeypatch.setattr(strictjson, "parse", parse)
    return calls


def refusal(out: object) -> tuple[str, str]:
    assert isinstance(out, Refused), out
    return out.reason, out.detail


def test_a_refusal_without_a_detail_has_an_empty_one() -> None:
    """Rule: ``Refused(reason)`` has the detail ``""``; both show in its repr."""
    assert Refused("invalid").detail == ""
    assert repr(Refused("invalid")) == "Refused('invalid', '')"
    assert repr(Refused("bom", "why")) == "Refused('bom', 'why')"


def test_no_data_at_all_is_malformed() -> None:
    """Rule: a znode without data (None, not b"") is refused as ``malformed``, with the detail
    "no data at all (null)"."""
    assert refusal(StrictDecoder(Point, 64).decode(None)) == (
        strictjson.MALFORMED,
        "no data at all (null)",
    )


def test_a_value_of_exactly_the_limit_is_decoded_and_one_byte_more_is_too_large() -> None:
    """Rule: the size limit is inclusive: ``len(value) > max_bytes`` is refused as ``too_large`` with the
    detail "<len> bytes > <limit>", on the fast path (canonical bytes) and the strict one (spaced)."""
    for value in (CANONICAL, SPACED):
        n = len(value)
        assert StrictDecoder(Point, n).decode(value) == Point(1, "a")
        assert refusal(StrictDecoder(Point, n - 1).decode(value)) == (
            strictjson.TOO_LARGE,
            f"{n} bytes > {n - 1}",
        )


def test_the_strict_path_has_the_same_inclusive_size_limit() -> None:
    """Rule: ``decode_strict`` (the reference, also called on its own) applies the same limit: exactly
    ``max_bytes`` is decoded, one byte more is ``too_large`` with "<len> bytes > <limit>"."""
    n = len(SPACED)
    assert StrictDecoder(Point, n).decode_strict(SPACED) == Point(1, "a")
    assert refusal(StrictDecoder(Point, n - 1).decode_strict(SPACED)) == (
        strictjson.TOO_LARGE,
        f"{n} bytes > {n - 1}",
    )


def test_a_structure_refusal_keeps_the_parser_s_reason_and_detail() -> None:
    """Rule: a value the structure rules refuse is refused with the strict parser's own reason and detail
    (a byte order mark: ``bom``; not UTF-8: ``invalid_utf8``), by ``decode`` and ``decode_strict``."""
    dec = StrictDecoder(Point, 64)
    bom = b"\xef\xbb\xbf" + CANONICAL
    want = (strictjson.BOM, "value starts with a UTF-8 byte order mark")
    assert refusal(dec.decode(bom)) == want
    assert refusal(dec.decode_strict(bom)) == want
    bad_utf8 = b'{"x":1,"label":"\xff"}'
    parsed = strictjson.parse(bad_utf8)
    assert isinstance(parsed, strictjson.Invalid)
    assert refusal(dec.decode(bad_utf8)) == (strictjson.INVALID_UTF8, parsed.detail)
    assert refusal(dec.decode_strict(bad_utf8)) == (strictjson.INVALID_UTF8, parsed.detail)


def test_a_value_of_the_wrong_shape_is_invalid() -> None:
    """Rule: well-formed JSON that is not a value of the type is refused as ``invalid`` (one of
    :data:`REASONS`), with msgspec's explanation naming the field."""
    out = StrictDecoder(Point, 64).decode(b'{"x":"1","label":"a"}')
    reason, detail = refusal(out)
    assert reason == "invalid" and reason in REASONS
    assert "$.x" in detail


def test_what_trimtab_writes_is_decoded_without_the_strict_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule (the fast path): an ASCII value that msgspec decodes and that re-encodes to exactly the same
    bytes is accepted as msgspec decoded it -- a value of the type -- and the pure-Python parser is never
    called."""
    calls = spy_on_parse(monkeypatch)
    dec = StrictDecoder(Point, 64)
    assert msgspec.json.encode(Point(1, "a")) == CANONICAL
    out = dec.decode(CANONICAL)
    assert type(out) is Point and out == Point(1, "a")
    assert calls == []


def test_anything_else_is_decided_by_the_strict_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule: a value msgspec decodes but that re-encodes differently (another writer's spacing, a repeated
    name) is decided by the strict parser -- same value, and the strict rules' refusals: a lone surrogate
    that msgspec would take is refused."""
    calls = spy_on_parse(monkeypatch)
    dec = StrictDecoder(Point, 64)
    assert dec.decode(SPACED) == Point(1, "a")
    assert calls == [SPACED]
    repeated = b'{"x":2,"label":"a","x":1}'
    assert dec.decode(repeated) == Point(1, "a")  # the last occurrence of a name is its value
    lone = b'{"x":1,"label":"\\ud800"}'
    reason, _ = refusal(dec.decode(lone))
    assert reason == strictjson.LONE_SURROGATE
    assert calls == [SPACED, repeated, lone]
