"""Offline replay of a channel export: the operator's tool for "why does this node think X owns Y?".

The export format is JSON lines (docs/protocol.md section 8): an optional header line, then one line per
channel message. A node decides what a message means from its exact value bytes (docs/protocol.md 2.2),
so the offline replay must hand the table *those* bytes -- never a re-encoding. Parsing a line with a JSON
library and encoding its value again would change the bytes (collapse repeated names, normalise escapes,
drop invalid UTF-8, fail on deep nesting) and the replay would disagree with the nodes. So a line is not
parsed as a whole: a small scanner delimits its top-level members, and the ``value`` member's raw byte
span is the value, judged by the same :class:`channel.table.TableView` the nodes use. ``value_b64``
carries bytes that cannot be written as a JSON text (not JSON at all, a BOM, whitespace at the ends, a
newline); the exporter (:func:`export_line`) always uses it.

Everything here is total: any input line is either a message or counted as skipped with reason
``bad_line``, and nothing in a line can make replay raise (no recursion, no interpreter limits).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

import orjson

from trimtab.channel import strictjson
from trimtab.channel.table import TableView
from trimtab.errors import BadExportLine, TrimtabError

EXPORT_FORMAT: Final = "trimtab-channel-export"
EXPORT_VERSION: Final = 1
#: The skip reason of a line that is not an export line (counted with the table's own skip reasons).
BAD_LINE: Final = "bad_line"

RawMessage = tuple[bytes | None, bytes | None, int | None, int | None]
#: Called with the 1-based line number and why the line is not an export line (for people, not decisions).
BadLineHook = Callable[[int, str], None]

_BATCH = 10_000
_MAX_PARTITION = 2**31 - 1  # Kafka partitions are int32
_MAX_OFFSET = strictjson.INT64_MAX
_NULL = b"null"  # as a member's value: a null key, a tombstone

# ---------------------------------------------------------------------------------------------- scanner
# Bytes-level regular expressions with possessive quantifiers: one linear pass, no backtracking, and no
# recursion however long or deeply nested the input is.
_WS = re.compile(rb"[ \t\r\n]*+")
# A string literal: anything but an unescaped quote, any byte after a backslash. Deliberately lenient
# (invalid UTF-8, control characters, bad escapes all delimit fine): the table's decoder judges the bytes.
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
# A bare scalar (number, true, false, null -- or junk the decoder will refuse): up to a delimiter.
_SCALAR = re.compile(rb'[^ \t\r\n,:{}\[\]"]++')
# Inside a container: everything up to the next bracket, complete strings included (one C call for a
# whole flat record); it stops at a bracket, at an unterminated string's quote, or at the end.
_SKIP = re.compile(rb'(?:[^"{}\[\]]++|"(?:[^"\\]++|\\.)*+")*+', re.DOTALL)
_INT = re.compile(rb"-?(?:0|[1-9][0-9]{0,18})")
# A string literal that is its own text: printable ASCII, no quote, no backslash (names, base64, most keys).
_PLAIN_STRING = re.compile(rb'"([\x20\x21\x23-\x5b\x5d-\x7e]*+)"')
_OPEN_OBJECT, _CLOSE_OBJECT, _OPEN_ARRAY, _CLOSE_ARRAY, _QUOTE = b'{}[]"'


def _ws(buf: bytes, i: int) -> int:
    m = _WS.match(buf, i)
    return i if m is None else m.end()


def value_end(buf: bytes, i: int) -> int | None:
    """End (exclusive) of the JSON value starting at ``buf[i]``, or None if it cannot be delimited.

    Delimiting, not validating: a string runs to its closing unescaped quote whatever bytes it holds, a
    container to its matching bracket (strings inside skipped; brackets must pair up), a scalar to the next
    delimiter. Every valid JSON text is delimited exactly; anything else that delimits is left for the
    decoder to refuse. Iterative, with a byte per open container: 100 000 levels cost 100 KB.
    """
    n = len(buf)
    if i >= n:
        return None
    c = buf[i]
    if c == _QUOTE:
        m = _STRING.match(buf, i)
        return None if m is None else m.end()
    if c not in (_OPEN_OBJECT, _OPEN_ARRAY):
        m = _SCALAR.match(buf, i)
        return None if m is None else m.end()
    closers = bytearray()
    j = i
    skip = _SKIP.match
    while True:
        j = skip(buf, j).end()  # type: ignore[union-attr]  # matches at every position, maybe empty
        if j >= n:
            return None
        c = buf[j]
        j += 1
        if c == _OPEN_OBJECT:
            closers.append(_CLOSE_OBJECT)
        elif c == _OPEN_ARRAY:
            closers.append(_CLOSE_ARRAY)
        elif c == _QUOTE or closers.pop() != c:  # an unterminated string, or brackets that do not pair
            return None
        elif not closers:
            return j


def carries_exactly(value: bytes) -> bool:
    """Whether ``"value": <value>`` in a line gives back exactly ``value`` (else ``value_b64`` is needed).

    True for every JSON text without a newline or whitespace at its ends, except the four bytes ``null``
    (``"value": null`` is a tombstone, not those bytes); also for some non-JSON that still delimits (the
    table refuses it the same way whichever form delivers it).
    """
    return value != _NULL and b"\n" not in value and value_end(value, 0) == len(value)


def scan_members(line: bytes) -> list[tuple[bytes, int, int]] | None:
    """The members of a line holding one JSON object: (name literal with its quotes, value start, value
    end) each, in order; None if the line is not one delimitable object (whitespace around it allowed)."""
    n = len(line)
    i = _ws(line, 0)
    if i >= n or line[i] != _OPEN_OBJECT:
        return None
    i = _ws(line, i + 1)
    members: list[tuple[bytes, int, int]] = []
    if i < n and line[i] == _CLOSE_OBJECT:
        i += 1
    else:
        while True:
            m = _STRING.match(line, i)
            if m is None:
                return None
            name = line[i : m.end()]
            i = _ws(line, m.end())
            if i >= n or line[i] != 0x3A:  # ':'
                return None
            i = _ws(line, i + 1)
            end = value_end(line, i)
            if end is None:
                return None
            members.append((name, i, end))
            i = _ws(line, end)
            if i < n and line[i] == 0x2C:  # ','
                i = _ws(line, i + 1)
                continue
            if i < n and line[i] == _CLOSE_OBJECT:
                i += 1
                break
            return None
    return members if _ws(line, i) == n else None


# ---------------------------------------------------------------------------------------------- members
class _Bad(TrimtabError):
    """A line that is not an export line; the message says why (internal: never escapes this module)."""


def _text(span: bytes) -> str | None:
    """A JSON string literal's text (strict JSON: UTF-8, escapes, no lone surrogate), or None if the span
    is not one. Plain ASCII without escapes -- every name and base64 string -- skips the full parser."""
    plain = _PLAIN_STRING.fullmatch(span)
    if plain is not None:
        return plain.group(1).decode("ascii")
    if span[:1] != b'"':
        return None
    obj = strictjson.parse(span)
    return obj if type(obj) is str else None


def _members(line: bytes) -> dict[str, tuple[int, int]]:
    """Name -> value span of a line's members (names compared after unescaping, like the protocol's)."""
    raw = scan_members(line)
    if raw is None:
        raise _Bad("not one delimitable JSON object")
    out: dict[str, tuple[int, int]] = {}
    for name_literal, start, end in raw:
        name = _text(name_literal)
        if name is None:
            raise _Bad("a member name is not a valid JSON string")
        if name in out:
            raise _Bad(f"member {name!r} occurs twice")
        out[name] = (start, end)
    return out


def _string_or_null(span: bytes, what: str) -> str | None:
    if span == _NULL:
        return None
    text = _text(span)
    if text is None:
        raise _Bad(f"{what} is not a string or null")
    return text


def _int_or_null(span: bytes, what: str, low: int, high: int) -> int | None:
    if span == _NULL:
        return None
    if _INT.fullmatch(span) is None:
        raise _Bad(f"{what} is not an integer or null")
    v = int(span)
    if not low <= v <= high:
        raise _Bad(f"{what} {v} is outside {low}..{high}")
    return v


def _b64(text: str, what: str) -> bytes:
    """Strict base64: the standard alphabet with padding, and only the one canonical spelling of the bytes
    (so one export line means one byte string)."""
    try:
        raw = text.encode("ascii")
        out = base64.b64decode(raw, validate=True)
    except (UnicodeEncodeError, binascii.Error, ValueError):
        raise _Bad(f"{what} is not valid base64") from None
    if base64.b64encode(out) != raw:
        raise _Bad(f"{what} is not canonical base64")
    return out


# The exact shape export_line writes for a plain key: one regular expression instead of the scanner
# (about three times faster). It yields exactly what _parse_general yields for the same line (tested);
# anything else, or a number out of range, takes the general path.
_EXPORTED = re.compile(
    rb'\{"key":"([\x20\x21\x23-\x5b\x5d-\x7e]*+)","value_b64":(?:"([A-Za-z0-9+/=]*+)"|null),'
    rb'"partition":(0|[1-9][0-9]{0,9}+),"offset":(0|[1-9][0-9]{0,18}+)\}[ \t\r\n]*+'
)

_MESSAGE_MEMBERS = frozenset({"key", "key_b64", "value", "value_b64", "partition", "offset"})


def parse_message_line(line: bytes) -> RawMessage:
    """One export line as ``(key, value, partition, offset)``; raises :class:`~trimtab.errors.BadExportLine`
    (with the reason) if it is not one. The value is the exact bytes the line carries: ``value``'s raw span, or
    ``value_b64`` decoded; a JSON ``null`` in either is a tombstone."""
    try:
        return _parse_message(line)
    except _Bad as e:
        raise BadExportLine(str(e)) from None


def _parse_message(line: bytes) -> RawMessage:
    m = _EXPORTED.fullmatch(line)
    if m is not None:
        key, b64, partition, offset = m.groups()
        p, o = int(partition), int(offset)
        if p <= _MAX_PARTITION and o <= _MAX_OFFSET:
            value = None if b64 is None else _b64(b64.decode("ascii"), "value_b64")
            return key, value, p, o
    return _parse_general(line)


def _parse_general(line: bytes) -> RawMessage:
    """Any export line: members in any order, any whitespace, escapes in names and strings."""
    members = _members(line)
    unknown = members.keys() - _MESSAGE_MEMBERS
    if unknown:
        raise _Bad(f"unknown member {sorted(unknown)[0]!r}")

    def span(name: str) -> bytes | None:
        got = members.get(name)
        return None if got is None else line[got[0] : got[1]]

    key_span, key_b64_span = span("key"), span("key_b64")
    if (key_span is None) == (key_b64_span is None):
        raise _Bad("needs exactly one of key and key_b64")
    key: bytes | None
    if key_span is not None:
        key_text = _string_or_null(key_span, "key")
        key = None if key_text is None else key_text.encode()  # strict JSON text: no lone surrogate
    else:
        assert key_b64_span is not None
        key_b64 = _text(key_b64_span)
        if key_b64 is None:
            raise _Bad("key_b64 is not a string")
        key = _b64(key_b64, "key_b64")

    value_span, value_b64_span = span("value"), span("value_b64")
    if (value_span is None) == (value_b64_span is None):
        raise _Bad("needs exactly one of value and value_b64")
    value: bytes | None
    if value_span is not None:
        value = None if value_span == _NULL else value_span
    else:
        assert value_b64_span is not None
        value_b64 = _string_or_null(value_b64_span, "value_b64")
        value = None if value_b64 is None else _b64(value_b64, "value_b64")

    partition_span, offset_span = span("partition"), span("offset")
    partition = None
    if partition_span is not None:
        partition = _int_or_null(partition_span, "partition", 0, _MAX_PARTITION)
    offset = None
    if offset_span is not None:
        offset = _int_or_null(offset_span, "offset", 0, _MAX_OFFSET)
    return key, value, partition, offset


def _parse_header(line: bytes) -> int | _Bad | None:
    """The partition count a header line declares (None: not declared), or why it is not a header.

    Members other than ``format``, ``version``, ``topic`` and ``partitions`` are ignored: a version-1
    exporter may add information, never change what the messages mean.
    """
    try:
        members = _members(line)
        fmt, version = members.get("format"), members.get("version")
        if fmt is None or _text(line[fmt[0] : fmt[1]]) != EXPORT_FORMAT:
            raise _Bad(f"header: format is not {EXPORT_FORMAT!r}")
        if version is None or line[version[0] : version[1]] != b"%d" % EXPORT_VERSION:
            raise _Bad(f"header: version is not {EXPORT_VERSION}")
        topic = members.get("topic")
        if topic is not None:
            _string_or_null(line[topic[0] : topic[1]], "header: topic")
        parts = members.get("partitions")
        if parts is None:
            return None
        return _int_or_null(line[parts[0] : parts[1]], "header: partitions", 1, _MAX_PARTITION)
    except _Bad as e:
        return e


def _is_header(line: bytes) -> bool:
    raw = scan_members(line)
    return raw is not None and any(_text(name) == "format" for name, _, _ in raw)


def is_blank(line: bytes) -> bool:
    """Whether an export line holds only whitespace (replay ignores it)."""
    return _ws(line, 0) == len(line)


def read_header(line: bytes) -> tuple[int | None, str | None] | None:
    """What the first non-blank line of an export says about itself, exactly as :func:`replay_lines` reads
    it (the pipeline's parallel reader of exports uses it too): None if it is not a header (then it is a
    message line); else ``(partitions, problem)``: the declared partition count (None: not declared) and,
    for a header that is not valid, why -- it then counts as a ``bad_line`` and declares nothing."""
    if not _is_header(line):
        return None
    header = _parse_header(line)
    if isinstance(header, _Bad):
        return None, str(header)
    return header, None


# ---------------------------------------------------------------------------------------------- replay
def replay_lines(
    lines: Iterable[bytes | str],
    *,
    partitions: int | None = None,
    on_bad_line: BadLineHook | None = None,
) -> TableView:
    """Replay export lines through a :class:`TableView`, exactly as a node replays the same messages.

    ``partitions`` (the ``--partitions`` flag) wins over the header's; with neither, the home-partition
    rule is not applied (a plain ``{"key","value"}`` log has no partitions). A line that is not an export
    line counts as skipped with reason ``bad_line`` (and goes to ``on_bad_line``); blank lines are ignored.
    Never raises on any input.
    """
    view: TableView | None = None
    batch: list[RawMessage] = []

    def bad(lineno: int, why: str) -> None:
        assert view is not None
        view.stats.skipped[BAD_LINE] += 1
        if on_bad_line is not None:
            on_bad_line(lineno, why)

    lineno = 0
    for line in lines:
        lineno += 1
        if isinstance(line, str):
            try:
                raw = line.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                raw = b"\x00"  # not bytes any export could hold: a bad line below
        else:
            raw = line
        if is_blank(raw):
            continue
        if view is None:
            # The first line decides the partition count before any message is applied.
            header = read_header(raw)
            if header is None:
                view = TableView(partitions)
            else:
                declared, problem = header
                view = TableView(partitions if partitions is not None else declared)
                if problem is not None:
                    bad(lineno, problem)
                continue
        try:
            batch.append(_parse_message(raw))
        except _Bad as e:
            bad(lineno, str(e))
            continue
        if len(batch) >= _BATCH:
            view.apply_all(batch)
            batch.clear()
    if view is None:
        view = TableView(partitions)
    view.apply_all(batch)
    return view


def table_report(view: TableView) -> dict[str, Any]:
    """``{"table": {bundle: record}, "stats": {...}}``: what ``channel replay --json`` and ``channel dump
    --json`` print, so the two can be compared byte for byte. ``stats`` has the ``accepted``, ``rejected``
    and ``skipped`` totals and the same counts by reason."""
    return {
        "table": {k: r.to_json() for k, r in sorted(view.items())},
        "stats": view.stats.detail(),
    }


# ---------------------------------------------------------------------------------------------- export
def header_line(topic: str | None, partitions: int | None) -> bytes:
    """The first line of an export (newline included)."""
    header = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "topic": topic, "partitions": partitions}
    return orjson.dumps(header) + b"\n"


def export_line(key: bytes | None, value: bytes | None, partition: int | None, offset: int | None) -> bytes:
    """One message as an export line (newline included): ``value_b64`` always (exact bytes whatever they
    are), ``key`` when the key is UTF-8 text and ``key_b64`` otherwise."""
    line: dict[str, Any] = {}
    if key is None:
        line["key"] = None
    else:
        try:
            line["key"] = key.decode("utf-8")
        except UnicodeDecodeError:
            line["key_b64"] = base64.b64encode(key).decode("ascii")
    line["value_b64"] = None if value is None else base64.b64encode(value).decode("ascii")
    if partition is not None:
        line["partition"] = partition
    if offset is not None:
        line["offset"] = offset
    return orjson.dumps(line) + b"\n"


def export_lines(
    messages: Iterable[RawMessage], *, topic: str | None, partitions: int | None
) -> Iterator[bytes]:
    """A whole export: the header, then one line per message in the order given."""
    yield header_line(topic, partitions)
    for key, value, partition, offset in messages:
        yield export_line(key, value, partition, offset)


# ---------------------------------------------------------------------------------------------- output
_JSON_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
_SAFE_DEPTH = 64


def report_json(obj: Any) -> bytes:
    """``obj`` as indented, key-sorted JSON (newline included). Never raises: the report holds strings and
    numbers that came off the channel, and printing it must not fail on one orjson cannot encode (an
    integer beyond 64 bits, a lone surrogate); such a value is written as a string instead."""
    try:
        return orjson.dumps(obj, option=_JSON_OPTIONS) + b"\n"
    except (TypeError, ValueError):  # orjson.JSONEncodeError is a TypeError
        return orjson.dumps(_json_safe(obj, 0), option=_JSON_OPTIONS) + b"\n"


def _safe_str(s: str) -> str:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")
    return s


def _json_safe(v: Any, depth: int) -> Any:
    """A copy of ``v`` made only of what orjson always encodes (bounded depth: our reports are shallow)."""
    if v is None or type(v) is bool or type(v) is float:
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        if -(2**63) <= v < 2**64:
            return int(v)
        try:
            return str(v)
        except ValueError:  # more digits than sys.get_int_max_str_digits() allows
            return hex(v)
    if isinstance(v, str):
        return _safe_str(str(v))
    if depth >= _SAFE_DEPTH:
        return "<nested too deep>"
    if isinstance(v, dict):
        return {_safe_str(str(k)): _json_safe(x, depth + 1) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json_safe(x, depth + 1) for x in v]
    if isinstance(v, float):
        return float(v)
    return _safe_str(repr(v))
