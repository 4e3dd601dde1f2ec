"""Strict JSON: the one definition of which bytes trimtab accepts as a JSON value (docs/protocol.md §2.2).

Every value trimtab reads from Kafka is hostile until it passes these rules, and whether it passes must be
a function of its bytes alone -- the same on every node, whatever the interpreter's recursion limit or
``PYTHONINTMAXSTRDIGITS``, the caller's stack, the batch it arrived in or the hash seed -- or replicas of
the channel diverge. General-purpose parsers do not promise that (msgspec, for one, skips unknown fields
without checking their UTF-8, type-checks every occurrence of a repeated name but keeps the last, and
fails deep nesting with a ``RecursionError`` whose depth depends on the stack), so this module pins the
rules and implements them with an explicit stack: depth is a rule here, not a property of the interpreter.

A value is accepted iff all of these hold; otherwise the first rule in this list that it breaks is the
reason it is refused (a function of the whole value, not of where a parser happened to stop):

1. ``too_large``: longer than the caller's limit (checked by the caller, before anything is parsed);
2. ``bom``: it starts with a UTF-8 byte order mark;
3. ``invalid_utf8``: it is not well-formed UTF-8 (RFC 3629: no overlong forms, no encoded surrogates);
4. ``malformed``: it is not one RFC 8259 JSON text (syntax, a raw control character in a string, data
   after the value, ``NaN``);
5. ``lone_surrogate``: a string (a value or a name) has a ``\\uD800``-``\\uDFFF`` escape that is not half
   of a high+low pair;
6. ``int_out_of_range``: an integer literal (no fraction, no exponent) is outside signed 64-bit;
7. ``too_deep``: objects and arrays are nested more than :data:`MAX_DEPTH` levels.

A name that occurs more than once in one object is not refused: its **last** occurrence is the value
(compared after unescaping, so ``"dst"`` and ``"d\\u0073t"`` are one name) -- what RFC 8259 calls the
common behaviour, and what Python's ``json``, jq, JavaScript and Go do, so an operator's tools read the
same value as every node.

Numbers with a fraction or an exponent are accepted as floats (``1e999`` becomes ``inf``); they are never
integers, so a field that must be an integer refuses them.

This is the slow, pure-Python reference. Hot paths (channel replay, snapshot chunks) first try msgspec on
ASCII input and use this module only when msgspec fails or its result cannot be shown equal to what this
module would produce (see ``channel.records``); the property tests check that the two always agree.
"""

from __future__ import annotations

import re
from typing import Any, Final

MAX_DEPTH: Final = 32

TOO_LARGE: Final = "too_large"
BOM: Final = "bom"
INVALID_UTF8: Final = "invalid_utf8"
MALFORMED: Final = "malformed"
LONE_SURROGATE: Final = "lone_surrogate"
INT_OUT_OF_RANGE: Final = "int_out_of_range"
TOO_DEEP: Final = "too_deep"

#: Every reason :func:`parse` can return, in the order the rules are checked.
REASONS: Final = (
    TOO_LARGE,
    BOM,
    INVALID_UTF8,
    MALFORMED,
    LONE_SURROGATE,
    INT_OUT_OF_RANGE,
    TOO_DEEP,
)

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1


class Invalid:
    """Why a value was refused: one of :data:`REASONS`, plus a human detail (never used for decisions)."""

    __slots__ = ("detail", "reason")

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail

    def __repr__(self) -> str:
        return f"Invalid({self.reason!r}, {self.detail!r})"


_BOM = b"\xef\xbb\xbf"
_WS = re.compile(r"[ \t\n\r]*+")
# Possessive quantifiers: no backtracking, so a long string costs one linear pass.
_STRING = re.compile(r'"((?:[^"\\\x00-\x1f]++|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*+)"')
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*+)(\.[0-9]++)?([eE][+-]?[0-9]++)?")
_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_MAX_INT_DIGITS = 19  # len(str(2**63)) == 19: anything longer is out of range without converting it


def _unescape(content: str) -> tuple[str, bool]:
    """The text of a string literal whose escapes the regex has already checked for form, and whether it
    had a lone surrogate escape (kept as that code point, so the text is still a usable key)."""
    out: list[str] = []
    lone = False
    j = 0
    n = len(content)
    while j < n:
        k = content.find("\\", j)
        if k < 0:
            out.append(content[j:])
            break
        out.append(content[j:k])
        e = content[k + 1]
        if e != "u":
            out.append(_SIMPLE_ESCAPES[e])
            j = k + 2
            continue
        cp = int(content[k + 2 : k + 6], 16)
        j = k + 6
        if 0xD800 <= cp <= 0xDBFF and content.startswith("\\u", j):
            lo = int(content[j + 2 : j + 6], 16)
            if 0xDC00 <= lo <= 0xDFFF:
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                j += 6
        if 0xD800 <= cp <= 0xDFFF:
            lone = True
        out.append(chr(cp))
    return "".join(out), lone


class _Parser:
    """One pass over a decoded text; syntax errors end it, rule violations are noted and it goes on."""

    __slots__ = ("detail", "rank", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.rank = len(_RULES)  # the best (lowest) rank of a rule broken so far
        self.detail = ""

    def broke(self, reason: str, detail: str) -> None:
        rank = _RULES.index(reason)
        if rank < self.rank:
            self.rank = rank
            self.detail = detail

    def string(self, i: int) -> tuple[str, int] | None:
        m = _STRING.match(self.text, i)
        if m is None:
            return None
        content = m.group(1)
        if "\\" in content:
            text, lone = _unescape(content)
            if lone:
                self.broke(LONE_SURROGATE, f"lone surrogate escape in the string at character {i}")
            return text, m.end()
        return content, m.end()


# The rules a JSON text can break, in the order that picks the reason.
_RULES = (LONE_SURROGATE, INT_OUT_OF_RANGE, TOO_DEEP)


def _skip_ws(text: str, i: int) -> int:
    m = _WS.match(text, i)
    return i if m is None else m.end()


def _bad(i: int, what: str) -> Invalid:
    return Invalid(MALFORMED, f"{what} at character {i}")


def parse(value: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value of ``value`` (dicts, lists, str, int, float, bool, None), or :class:`Invalid`.

    Never raises on any input, and uses no recursion: nested containers live on an explicit stack.
    """
    if value.startswith(_BOM):
        return Invalid(BOM, "value starts with a UTF-8 byte order mark")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as e:
        return Invalid(INVALID_UTF8, f"not UTF-8 at byte {e.start}: {e.reason}")
    p = _Parser(text)
    v = _parse_text(p, text, max_depth)
    if isinstance(v, Invalid):
        return v
    if p.rank < len(_RULES):
        return Invalid(_RULES[p.rank], p.detail)
    return v


# One state machine over the text: splitting it would pass its state (stack, position) back and forth.
def _parse_text(p: _Parser, text: str, max_depth: int) -> Any:  # noqa: PLR0915
    n = len(text)
    # Frames of the containers being filled: [container, pending name (objects only)].
    stack: list[list[Any]] = []
    i = _skip_ws(text, 0)
    while True:
        # ---- one value starts at i
        if i >= n:
            return _bad(i, "unexpected end")
        c = text[i]
        v: Any
        if c in "{[":
            if len(stack) == max_depth:
                p.broke(TOO_DEEP, f"more than {max_depth} nested objects/arrays")
            i = _skip_ws(text, i + 1)
            if c == "{":
                if i < n and text[i] == "}":
                    v = {}
                    i += 1
                else:
                    got = p.string(i)
                    if got is None:
                        return _bad(i, "expected a name")
                    key, i = got
                    i = _skip_ws(text, i)
                    if i >= n or text[i] != ":":
                        return _bad(i, "expected ':'")
                    stack.append([{}, key])
                    i = _skip_ws(text, i + 1)
                    continue
            elif i < n and text[i] == "]":
                v = []
                i += 1
            else:
                stack.append([[], None])
                continue
        elif c == '"':
            got = p.string(i)
            if got is None:
                return _bad(i, "bad string")
            v, i = got
        elif c == "-" or "0" <= c <= "9":
            m = _NUMBER.match(text, i)
            if m is None:
                return _bad(i, "bad number")
            token = m.group(0)
            if m.group(1) is None and m.group(2) is None:
                digits = len(token) - (token[0] == "-")
                v = int(token) if digits <= _MAX_INT_DIGITS else 0
                if digits > _MAX_INT_DIGITS or not INT64_MIN <= v <= INT64_MAX:
                    p.broke(INT_OUT_OF_RANGE, f"integer outside signed 64-bit at character {i}")
            else:
                v = float(token)
            i = m.end()
        elif text.startswith("true", i):
            v = True
            i += 4
        elif text.startswith("false", i):
            v = False
            i += 5
        elif text.startswith("null", i):
            v = None
            i += 4
        else:
            return _bad(i, "unexpected character")

        # ---- v is complete: hand it to its container, closing containers as they end
        while True:
            if not stack:
                i = _skip_ws(text, i)
                if i != n:
                    return _bad(i, "trailing data")
                return v
            frame = stack[-1]
            container = frame[0]
            if type(container) is dict:
                container[frame[1]] = v
                close = "}"
            else:
                container.append(v)
                close = "]"
            i = _skip_ws(text, i)
            if i >= n:
                return _bad(i, "unexpected end")
            c = text[i]
            if c == ",":
                i = _skip_ws(text, i + 1)
                if close == "}":
                    got = p.string(i)
                    if got is None:
                        return _bad(i, "expected a name")
                    key, i = got  # a repeated name: its last value replaces the earlier one
                    i = _skip_ws(text, i)
                    if i >= n or text[i] != ":":
                        return _bad(i, "expected ':'")
                    frame[1] = key
                    i = _skip_ws(text, i + 1)
                break  # the next element starts at i
            if c != close:
                return _bad(i, f"expected ',' or {close!r}")
            stack.pop()
            v = container
            i += 1
