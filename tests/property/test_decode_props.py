"""Decoding hostile channel values (docs/protocol.md 2.2): the fast path equals the strict reference, the
reference equals an independent oracle built on the standard library's ``json``, replay does not depend on
batch boundaries, and the outcome does not depend on the interpreter's environment.

Every generator here is a function of a ``random.Random``: hypothesis drives it through ``st.randoms`` (which
shrinks) or a seeded PRNG (which spreads over every branch), and the environment test replays a fixed corpus
from ``random.Random(CORPUS_SEED)`` in subprocesses with different hash seeds, int-digit limits and stacks.
"""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import Oracle, oracle_decode, table_json

from trimtab.channel.records import (
    MAX_RECORD_BYTES,
    SKIP_REASONS,
    Record,
    Skip,
    State,
    decode,
    decode_strict,
    encode,
    make,
)
from trimtab.channel.table import TableView

ROOT = Path(__file__).resolve().parents[2]
SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]
SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=SLOW_OK)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FIELDS = ("schema", "state", "dst", "src", "version", "force", "ts", "writer")

# ------------------------------------------------------------------------------------------ JSON trees


@dataclass
class Obj:
    """A JSON object as name/value pairs, so that a name may repeat. A name is text, or ``Raw`` bytes
    (already a complete string literal, e.g. with chosen escapes or invalid UTF-8)."""

    pairs: list[tuple[str | Raw, Node]] = field(default_factory=list)


@dataclass
class Raw:
    """Bytes written verbatim: a number literal, a deep structure, invalid UTF-8, anything."""

    data: bytes


Node: TypeAlias = "Obj | Raw | list[Node] | str | int | bool | None"


@dataclass
class Style:
    """How a tree is written: escape probability per character, ASCII only, whitespace between tokens."""

    esc: float = 0.0
    ascii_only: bool = False
    ws: float = 0.0
    bad_ws: float = 0.0  # probability of a character JSON does not count as whitespace between tokens


SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _u(r: random.Random, code: int) -> str:
    text = f"\\u{code:04x}"
    return text.upper().replace("\\U", "\\u") if r.random() < 0.3 else text


def dump_str(s: str, r: random.Random, style: Style) -> bytes:
    """A string literal for ``s``; lone surrogates in ``s`` become escapes (so two adjacent ones pair)."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        escape = r.random() < style.esc
        if 0xD800 <= o <= 0xDFFF:
            out.append(_u(r, o))
        elif ch in SHORT_ESCAPES:
            out.append(_u(r, o) if escape else SHORT_ESCAPES[ch])
        elif o < 0x20:
            out.append(_u(r, o))
        elif ch == "/" and escape:
            out.append("\\/" if r.random() < 0.5 else _u(r, o))
        elif o > 0xFFFF and (escape or style.ascii_only):
            v = o - 0x10000
            out.append(_u(r, 0xD800 + (v >> 10)) + _u(r, 0xDC00 + (v & 0x3FF)))
        elif escape or (o > 0x7F and style.ascii_only):
            out.append(_u(r, o))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out).encode("utf-8")


BAD_WS = (b"\x0b", b"\x0c", b"\x00", b"\x1c", "\u00a0".encode(), "\u2028".encode(), "\ufeff".encode())


def _ws(r: random.Random, style: Style) -> bytes:
    if style.bad_ws and r.random() < style.bad_ws:
        return r.choice(BAD_WS)
    if style.ws and r.random() < style.ws:
        return bytes(r.choice(b" \t\n\r") for _ in range(r.randint(1, 3)))
    return b""


def dump(node: Node, r: random.Random, style: Style) -> bytes:
    if isinstance(node, Raw):
        return node.data
    if node is None:
        return b"null"
    if node is True:
        return b"true"
    if node is False:
        return b"false"
    if isinstance(node, int):
        return str(node).encode()
    if isinstance(node, str):
        return dump_str(node, r, style)
    if isinstance(node, list):
        items = [_ws(r, style) + dump(v, r, style) + _ws(r, style) for v in node]
        return b"[" + b",".join(items) + _ws(r, style) + b"]"
    members = []
    for name, value in node.pairs:
        key = name.data if isinstance(name, Raw) else dump_str(name, r, style)
        members.append(
            _ws(r, style) + key + _ws(r, style) + b":" + _ws(r, style) + dump(value, r, style) + _ws(r, style)
        )
    return b"{" + b",".join(members) + _ws(r, style) + b"}"


def objects(node: Node) -> list[Obj]:
    """Every object of a tree (the record, children, objects inside unknown fields)."""
    out: list[Obj] = []
    todo = [node]
    while todo:
        n = todo.pop()
        if isinstance(n, Obj):
            out.append(n)
            todo.extend(v for _, v in n.pairs)
        elif isinstance(n, list):
            todo.extend(n)
    return out


def name_text(name: str | Raw) -> str | None:
    return name if isinstance(name, str) else None


# ------------------------------------------------------------------------------------------ records

BROKERS = (
    "b1:1",
    "b2:2",
    "broker-3:8080",
    "controller:1:t7",
    "\u00e9:1",
    "\U0001f600",
    'a"b',
    "a\\b",
    "a/b",
    "\x00",
    "\b\f\n\r\t",
    "\x01\x1f\x7f",
    "\u2028",
    "\ufeff",
    "{[",
    "x" * 40,
)
RANGES = ("0x00000000_0x80000000", "0x80000000_0xffffffff", "0x00000000_0x40000000", "0x40000000_0x80000000")
EDGE_INTS = (0, 1, -1, 2, 7, 2**31, 2**32, 2**53 + 1, INT64_MAX, INT64_MAX - 1, INT64_MIN, INT64_MIN + 1)


def gen_record(r: random.Random) -> Record:
    """Any well-formed record: every state, with or without children, edgy strings and integers."""
    brokers = [None, None, *BROKERS[:4], *BROKERS]
    children = None
    if r.random() < 0.35:
        keys = list(RANGES[: r.randint(0, 4)]) + [r.choice(BROKERS) for _ in range(r.randint(0, 2))] + [""]
        children = {k: r.choice(brokers) for k in keys[: r.randint(0, len(keys))]}
    version = r.choice((1, 2, 3, 9, INT64_MAX, r.randint(1, INT64_MAX)))
    ts = r.choice((*EDGE_INTS, 1795265765201, r.randint(INT64_MIN, INT64_MAX)))
    return make(
        r.choice(list(State)),
        version=version,
        ts=ts,
        writer=r.choice(("", "w", *BROKERS)),
        dst=r.choice(brokers),
        src=r.choice(brokers),
        force=r.random() < 0.3,
        children=children,
    )


def record_tree(rec: Record) -> Obj:
    d = rec.to_json()
    pairs: list[tuple[str | Raw, Node]] = []
    for k, v in d.items():
        if k == "children":
            pairs.append((k, Obj([(ck, cv) for ck, cv in v.items()])))
        else:
            pairs.append((k, v))
    return Obj(pairs)


# Values to drop into a field: wrong types, boundaries, look-alikes, invalid UTF-8.
EDGE_VALUES: tuple[Node, ...] = (
    None,
    True,
    False,
    0,
    -1,
    1,
    2,
    INT64_MAX,
    INT64_MIN,
    "",
    "1",
    "owned",
    "OWNED",
    "owned ",
    "migrating",
    [],
    Obj(),
    ["owned"],
    Raw(b"-0"),
    Raw(b"1.0"),
    Raw(b"1e0"),
    Raw(b"1E+0"),
    Raw(b"-0.0"),
    Raw(b"0.5"),
    Raw(b"1e999"),
    Raw(b"9223372036854775808"),
    Raw(b"-9223372036854775809"),
    Raw(b"9223372036854775807"),
    Raw(b"-9223372036854775808"),
    Raw(b"99999999999999999999"),
    Raw(b"-10000000000000000000"),
    Raw(b"1" + b"0" * 700),
    Raw(b'"\xff"'),
    Raw(b'"\xc0\xaf"'),
    Raw(b'"\xed\xa0\x80"'),
    Raw(b'"\\ud800"'),
    Raw(b'"\\udc00\\ud800"'),
    Raw(b'"\\ud83d\\ude00"'),
    Raw(b'"\\u0000"'),
    "\ud800",
    "a\udfffb",
    "\ud83d\ude00",  # two surrogates: written as a valid pair escape
    "\U0001f600",
)
SCHEMAS: tuple[Node, ...] = (2, 3, 0, -1, INT64_MAX, "1", True, None, Raw(b"1.0"), Raw(b"2.0"), Raw(b"1e0"))
SCHEMAS += (Raw(b"-0"), Raw(b"9223372036854775808"), Raw(b"99999999999999999999"), [1], Obj([("v", 1)]))
STATES: tuple[Node, ...] = ("migrating", "OWNED", "", "owned ", " owned", "own", 1, None, True, ["owned"])
STATES += ("\u043ewned", "owned\x00", Raw(b'"own\\u0065d"'), Raw(b'"\\u006fwned"'), Raw(b'"owned\xff"'))


def pick(r: random.Random, nodes: tuple[Node, ...]) -> Node:
    """One of ``nodes``, copied: the trees are mutated in place, and shared constants must stay constant
    (or generation would depend on earlier test cases)."""
    return copy.deepcopy(r.choice(nodes))


def rand_str(r: random.Random, n: int = 6) -> str:
    alphabet = 'ab"\\/\b\f\n\r\t\x00\x01\x1f\x7f\u00e9\u2028\ufeff\U0001f600\ud800\udc00{}[]:,'
    return "".join(r.choice(alphabet) for _ in range(r.randint(0, n)))


def rand_json(r: random.Random, depth: int = 0) -> Node:
    """Arbitrary JSON for unknown fields: deep, big integers, floats, surrogates, invalid UTF-8, duplicates."""
    k = r.randrange(14 if depth < 3 else 9)
    if k == 0:
        return pick(r, EDGE_VALUES)
    if k == 1:
        return r.choice((None, True, False, r.randint(-(10**20), 10**20), r.choice(EDGE_INTS)))
    if k == 2:
        return rand_str(r)
    if k == 3:
        digits = r.choice((18, 19, 20, 640, 641, 4300, 4301, 5000))
        return Raw((b"-" if r.random() < 0.5 else b"") + b"1" + b"0" * (digits - 1))
    if k == 4:
        return Raw(r.choice((b"1e999", b"-1e999", b"1.5", b"-0.0", b"2.5e-400", b"1" + b"0" * 400 + b".0")))
    if k == 5:
        n = r.choice((29, 30, 31, 32, 33, 40, 1000, 3000))
        return Raw(b"[" * n + b"]" * n)
    if k == 6:
        n = r.choice((30, 31, 32, 33))
        return Raw(b'{"a":' * n + b"0" + b"}" * n)
    if k == 7:
        return Raw(b'"' + b"[" * r.choice((40, 500)) + b"{" * 40 + b'"')
    if k == 8:
        return Raw(
            r.choice(
                (b'"\xff\xfe"', b'"\xed\xb0\x80"', b'"\xf0\x9f\x98"', b'"\xc1\x81"', b'"\xf4\x90\x80\x80"')
            )
        )
    if k in (9, 10):
        return [rand_json(r, depth + 1) for _ in range(r.randint(0, 3))]
    obj = Obj([(rand_str(r, 3), rand_json(r, depth + 1)) for _ in range(r.randint(0, 3))])
    if obj.pairs and r.random() < 0.3:
        name, _ = r.choice(obj.pairs)
        obj.pairs.insert(r.randint(0, len(obj.pairs)), (name, rand_json(r, depth + 1)))
    return obj


def escaped_name(r: random.Random, name: str) -> Raw:
    """The same name written with every, or some, of its characters escaped."""
    p = r.choice((1.0, 0.5))
    return Raw(dump_str(name, r, Style(esc=p)))


# ------------------------------------------------------------------------------------------ mutations


def mutate_tree(r: random.Random, tree: Obj) -> None:
    kind = r.randrange(12)
    top = tree.pairs
    if kind == 0:  # a duplicated member, anywhere (top level, children, unknown objects)
        objs = [o for o in objects(tree) if o.pairs]
        if objs:
            o = r.choice(objs)
            name, value = r.choice(o.pairs)
            text = name_text(name)
            new_name: str | Raw = escaped_name(r, text) if text is not None and r.random() < 0.5 else name
            new_value = copy.deepcopy(value) if r.random() < 0.5 else pick(r, (*EDGE_VALUES, "b9:9"))
            o.pairs.insert(r.randint(0, len(o.pairs)), (new_name, new_value))
    elif kind == 1:  # an explicit "children":null (or replaced)
        for i, (n, _) in enumerate(top):
            if n == "children":
                top[i] = ("children", None)
                break
        else:
            top.insert(r.randint(0, len(top)), ("children", None))
    elif kind == 2:  # unknown fields with arbitrary JSON
        for _ in range(r.randint(1, 2)):
            name = r.choice(("x", "future", "dsT", "children2", "", "\u00e9", rand_str(r, 4)))
            top.insert(r.randint(0, len(top)), (name, rand_json(r)))
    elif kind == 3:
        _set(top, "schema", pick(r, SCHEMAS))
    elif kind == 4:
        _set(top, "state", pick(r, STATES))
    elif kind == 5:  # one field of the wrong type or out of range
        _set(top, r.choice((*FIELDS, "children")), pick(r, EDGE_VALUES))
    elif kind == 6:  # a required field missing
        if top:
            top.pop(r.randrange(len(top)))
    elif kind == 7 and any(o.pairs for o in objects(tree)):  # surrogates (lone or paired) in a value or name
        o = r.choice([o for o in objects(tree) if o.pairs])
        i = r.randrange(len(o.pairs))
        name, value = o.pairs[i]
        sur = r.choice(
            ("\ud800", "\udfff", "\udc00\ud800", "\ud83d\ude00", "\ud800\ud800\udc00", "\U0001f600")
        )
        if r.random() < 0.5 and isinstance(value, str):
            o.pairs[i] = (name, value + sur)
        elif isinstance(name, str):
            o.pairs[i] = (name + sur, value)
    elif kind == 8:
        r.shuffle(top)
    elif kind == 9 and any(o.pairs for o in objects(tree)):  # a name written with escapes (same name)
        o = r.choice([o for o in objects(tree) if o.pairs])
        i = r.randrange(len(o.pairs))
        name, value = o.pairs[i]
        if isinstance(name, str):
            o.pairs[i] = (escaped_name(r, name), value)
    elif kind == 10:  # children of the wrong shape
        _set(top, "children", r.choice((Obj([("a", 1)]), [], Obj([("a", "")]), Obj([("a", Obj())]), "x")))
    elif kind == 11:  # the record one level down
        tree.pairs = [("wrapped", Obj(list(top)))]


def _set(pairs: list[tuple[str | Raw, Node]], name: str, value: Node) -> None:
    for i, (n, _) in enumerate(pairs):
        if n == name:
            pairs[i] = (name, value)
            return
    pairs.insert(len(pairs), (name, value))


INTERESTING = b'"\\{}[],: \t\n\r\x00\x0b\x0c\x7f\x80\xbf\xc0\xc1\xed\xef\xf4\xf5\xff0123456789-.eEu'
SNIPPETS = (
    b"\xef\xbb\xbf",
    b"\xc2\xa0",
    b"\xc0\xaf",
    b"\xed\xa0\x80",
    b"\\u0000",
    b"\\ud800",
    b"\\udc00",
    b"\\\\",
    b'\\"',
    b",",
    b"}",
    b'"',
    b'"x":1,',
    b'"dst":null,',
    b'"children":null,',
    b"99999999999999999999",
    b"[" * 33,
    b",]",
    b"NaN",
)


def mutate_bytes(r: random.Random, v: bytes) -> bytes:
    b = bytearray(v)
    kind = r.randrange(9)
    i = r.randint(0, len(b))
    if kind == 0 and b:  # bit flip
        j = min(i, len(b) - 1)
        b[j] ^= 1 << r.randrange(8)
    elif kind == 1 and b:
        b[min(i, len(b) - 1)] = r.choice(INTERESTING)
    elif kind == 2:
        b[i:i] = bytes([r.choice(INTERESTING)])
    elif kind == 3:
        b[i:i] = r.choice(SNIPPETS)
    elif kind == 4:
        del b[i : i + r.randint(1, 4)]
    elif kind == 5:  # duplicate a slice somewhere else
        j = r.randint(0, len(b))
        lo, hi = min(i, j), max(i, j)
        k = r.randint(0, len(b))
        b[k:k] = b[lo : min(hi, lo + 64)]
    elif kind == 6:
        del b[i:]
    elif kind == 7 and r.random() < 0.3:
        b[0:0] = b"\xef\xbb\xbf"
    else:
        b[i:i] = bytes(r.choice(b" \t\n\r\x0b\x0c") for _ in range(r.randint(1, 3)))
    return bytes(b)


# ------------------------------------------------------------------------------------------ value generators


def gen_valid(r: random.Random) -> bytes:
    """A record written in any valid way: plain, escaped, ASCII-only, with whitespace, reordered."""
    rec = gen_record(r)
    if r.random() < 0.3:
        raw = encode(rec)
        assert raw is not None
        return raw
    tree = record_tree(rec)
    if r.random() < 0.3:
        r.shuffle(tree.pairs)
    style = Style(esc=r.choice((0.0, 0.1, 1.0)), ascii_only=r.random() < 0.5, ws=r.choice((0.0, 0.3)))
    return dump(tree, r, style)


def gen_mutated(r: random.Random) -> bytes:
    tree = record_tree(gen_record(r))
    for _ in range(r.randint(1, 3)):
        mutate_tree(r, tree)
    style = Style(
        esc=r.choice((0.0, 0.0, 0.1, 1.0)),
        ascii_only=r.random() < 0.6,
        ws=r.choice((0.0, 0.2)),
        bad_ws=r.choice((0.0, 0.0, 0.0, 0.02)),
    )
    v = dump(tree, r, style)
    for _ in range(r.choice((0, 0, 0, 1, 1, 2))):
        v = mutate_bytes(r, v)
    return v


VIOLATIONS: tuple[bytes, ...] = (
    b'"\\ud800"',
    b'"\\udc00\\ud800"',
    b"9223372036854775808",
    b"-9223372036854775809",
    b"[" * 32 + b"]" * 32,
    b'{"a":' * 32 + b"0" + b"}" * 32,
    b'{"d":1,"d":2}',
    b'{"d":1,"\\u0064":2}',
)


def gen_violations(r: random.Random) -> bytes:
    """A record with several rule-4 violations (or near misses) at random places: top level, children,
    unknown fields, names; the first rule of the documented list must win wherever it is."""
    rec = gen_record(r)
    tree = record_tree(rec)
    for _ in range(r.randint(1, 4)):
        objs = objects(tree)
        o = r.choice(objs)
        bad = r.choice(VIOLATIONS)
        if r.random() < 0.2:  # a near miss: one level less deep, one less than the overflow...
            bad = bad.replace(b"[" * 32, b"[" * 31).replace(b"]" * 32, b"]" * 31).replace(b"808", b"807")
        where = r.randrange(3)
        if where == 0:
            o.pairs.insert(r.randint(0, len(o.pairs)), (rand_str(r, 3), Raw(bad)))
        elif where == 1 and o.pairs:  # as a duplicate name
            o.pairs.insert(r.randint(0, len(o.pairs)), (r.choice(o.pairs)[0], Raw(bad)))
        else:
            o.pairs.insert(r.randint(0, len(o.pairs)), (Raw(r.choice((b'"\\ud800"', b'"x"'))), Raw(bad)))
    style = Style(esc=r.choice((0.0, 0.2)), ascii_only=r.random() < 0.5, ws=r.choice((0.0, 0.2)))
    return dump(tree, r, style)


def gen_whitespace(r: random.Random) -> bytes:
    """A valid record with whitespace between tokens, now and then a character that is not JSON whitespace
    (vertical tab, form feed, NUL, U+00A0, U+2028, U+FEFF)."""
    tree = record_tree(gen_record(r))
    return dump(tree, r, Style(ascii_only=r.random() < 0.5, ws=0.5, bad_ws=r.choice((0.0, 0.02, 0.05))))


def gen_byte_mutant(r: random.Random) -> bytes:
    v = gen_valid(r)
    for _ in range(r.randint(1, 3)):
        v = mutate_bytes(r, v)
    return v


def gen_junk(r: random.Random) -> bytes:
    n = r.choice((0, 1, 2, 3, 8, 40, 200))
    if r.random() < 0.5:
        return bytes(r.randrange(256) for _ in range(n))
    return bytes(r.choice(INTERESTING) for _ in range(n))


def gen_duplicate_attack(r: random.Random) -> bytes:
    """A duplicated member whose bytes are paid for by shorter escapes elsewhere, and whose quote marks are
    paid for by writing escaped quotes as ``\\u0022``: the value is exactly as long as the canonical
    encoding (and, where possible, has its quote count), but it has a repeated name -- an attack on any
    fast path that would try to prove by length or quote count that no name repeats."""
    base = gen_record(r)
    writer = "".join(r.choice('\b\f\n\r\t"') for _ in range(r.randint(8, 24)))
    rec = make(base.state, version=base.version, ts=base.ts, writer=writer, dst=base.dst, src=base.src)
    canonical = encode(rec)
    assert canonical is not None
    tree = record_tree(rec)
    dup_name = r.choice(FIELDS)
    dup_value = dict(tree.pairs)[dup_name] if r.random() < 0.5 else r.choice((None, "b9:9", 2, True))
    tree.pairs.insert(r.randint(0, len(tree.pairs)), (dup_name, dup_value))
    v = dump(tree, r, Style())
    # Write the writer's quote marks as \u0022 (no quote byte) and shorten the rest as needed.
    literal = dump_str(writer, r, Style())
    cheap = literal[1:-1].replace(b'\\"', b"\\u0022")
    v = v.replace(literal, b'"' + cheap + b'"', 1)
    if len(v) < len(canonical):
        v = v[:-1] + b" " * (len(canonical) - len(v)) + b"}"
    return v


def gen_size_edge(r: random.Random) -> bytes:
    """A record, a record with a duplicate, or junk, padded to exactly 65 536 bytes, or one byte more."""
    size = MAX_RECORD_BYTES + r.choice((0, 0, 1, -1))
    rec = gen_record(r)
    tree = record_tree(rec)
    if r.random() < 0.3:
        tree.pairs.append(("writer", "dup"))
    head = dump(tree, r, Style(ascii_only=r.random() < 0.5))
    pad = size - len(head)
    if pad <= 0:
        return head
    how = r.randrange(4)
    if how == 0:
        return head[:-1] + b" " * pad + b"}"
    if how == 1 and pad >= 9:  # an unknown field holding a long string
        return head[:-1] + b',"pad":"' + b"p" * (pad - 9) + b'"}'
    if how == 2:
        return head + b"\n" * pad
    return bytes(r.randrange(256) for _ in range(size))


GENERATORS: dict[str, Callable[[random.Random], bytes]] = {
    "valid": gen_valid,
    "mutated": gen_mutated,
    "byte_mutant": gen_byte_mutant,
    "junk": gen_junk,
    "duplicate_attack": gen_duplicate_attack,
    "violations": gen_violations,
    "whitespace": gen_whitespace,
}
# Half of the sources of randomness are hypothesis's (they shrink, but lean towards the first choice of
# every r.choice), half are seeded PRNGs (they reach every branch as often as the generators intend).
rngs: st.SearchStrategy[random.Random] = st.one_of(
    st.randoms(use_true_random=False), st.integers(0, 2**64).map(random.Random)
)
values = st.sampled_from(sorted(GENERATORS)).flatmap(lambda name: rngs.map(GENERATORS[name]))


# ------------------------------------------------------------------------------------------ comparing


def result_text(res: Record | Skip) -> str:
    """A stable, type-exact text of a decoding result (True and 1 differ; key order does not matter)."""
    if isinstance(res, Skip):
        return "skip " + res.reason
    return "record " + json.dumps(res.to_json(), sort_keys=True)


def oracle_text(value: bytes) -> str:
    expected = oracle_decode(value)
    if isinstance(expected, str):
        return "skip " + expected
    return "record " + json.dumps(expected, sort_keys=True)


def check_value(value: bytes) -> Record | Skip:
    fast = decode(value)
    strict = decode_strict(value)
    assert isinstance(fast, Record | Skip)
    assert isinstance(strict, Record | Skip)
    if isinstance(strict, Skip):
        assert strict.reason in SKIP_REASONS
        assert strict.reason not in ("bad_key", "wrong_partition")
    assert result_text(fast) == result_text(strict), value
    assert fast == strict, value
    assert result_text(strict) == oracle_text(value), value
    return strict


# ------------------------------------------------------------------------------------------ decode properties


@SETTINGS
@given(value=values)
def test_fast_path_equals_reference_equals_oracle(value: bytes) -> None:
    check_value(value)


@settings(max_examples=150, deadline=None, suppress_health_check=SLOW_OK)
@given(r=rngs)
def test_valid_encodings_decode_to_the_record(r: random.Random) -> None:
    """Any valid writing of a record (escapes, whitespace, order, \\u-escaped names) is that record."""
    rec = gen_record(r)
    tree = record_tree(rec)
    r.shuffle(tree.pairs)
    style = Style(esc=r.choice((0.0, 0.2, 1.0)), ascii_only=r.random() < 0.5, ws=r.choice((0.0, 0.5)))
    value = dump(tree, r, style)
    assert check_value(value) == rec
    # Unknown fields (valid under rules 1-4) are ignored; "children": null is no children.
    if rec.children is None:
        tree.pairs.insert(r.randint(0, len(tree.pairs)), ("children", None))
    tree.pairs.insert(r.randint(0, len(tree.pairs)), ("future", Raw(b'{"a":[1,2.5,1e999,{"b":null}]}')))
    assert check_value(dump(tree, r, style)) == rec


@settings(max_examples=150, deadline=None, suppress_health_check=SLOW_OK)
@given(r=rngs)
def test_a_repeated_member_is_read_as_its_last_occurrence(r: random.Random) -> None:
    """A record with one member repeated (at the top or in children, same or escaped name, same or other
    value, valid or not) reads as if only its last occurrence were there: the fast path, the reference
    and the oracle (Python's json) agree, and equal the value without the earlier occurrence."""
    if r.random() < 0.3:
        check_value(gen_duplicate_attack(r))
        return
    rec = gen_record(r)
    if rec.children is None or r.random() < 0.5:
        rec = make(
            State.SPLITTING,
            version=rec.version,
            ts=rec.ts,
            writer=rec.writer,
            src=rec.src,
            dst=rec.dst,
            children={RANGES[0]: r.choice((None, "b1:1")), RANGES[1]: None},
        )
    tree = record_tree(rec)
    target = r.choice([tree, *(v for _, v in tree.pairs if isinstance(v, Obj) and v.pairs)])
    i = r.randrange(len(target.pairs))
    name, value_node = target.pairs[i]
    assert isinstance(name, str)
    new_name: str | Raw = escaped_name(r, name) if r.random() < 0.5 else name
    other = copy.deepcopy(value_node) if r.random() < 0.5 else r.choice((None, "b9:9", 7, True, "x"))
    j = r.randint(0, len(target.pairs))
    target.pairs.insert(j, (new_name, other))
    style = Style(ascii_only=r.random() < 0.7, ws=r.choice((0.0, 0.3)))
    value = dump(tree, r, style)
    res = check_value(value)
    # Without the earlier of the two occurrences, the same result.
    earlier = i if j > i else j
    del target.pairs[earlier]
    assert check_value(dump(tree, r, style)) == res, value


@settings(max_examples=40, deadline=None, suppress_health_check=SLOW_OK)
@given(r=rngs)
def test_values_at_and_over_the_size_limit(r: random.Random) -> None:
    value = gen_size_edge(r)
    res = check_value(value)
    if len(value) > MAX_RECORD_BYTES:
        assert res == Skip("too_large")


def _padded(rec: Record, size: int, extra: bytes = b"") -> bytes:
    raw = encode(rec)
    assert raw is not None
    head = raw[:-1] + extra + b',"pad":"'
    return head + b"p" * (size - len(head) - 2) + b'"}'


@pytest.mark.parametrize("extra", [b"", b',"dst":null', b',"x":"\\ud800"', b',"x":"\xff"'], ids=repr)
def test_exactly_the_size_limit(extra: bytes) -> None:
    rec = make(State.OWNED, version=1, ts=0, writer="w", dst="b1:1")
    at = _padded(rec, MAX_RECORD_BYTES, extra)
    over = _padded(rec, MAX_RECORD_BYTES + 1, extra)
    assert (len(at), len(over)) == (MAX_RECORD_BYTES, MAX_RECORD_BYTES + 1)
    expected = {b"": rec, b',"dst":null': msgspec.structs.replace(rec, dst=None)}.get(extra)
    got = check_value(at)
    if expected is not None:
        assert got == expected
    else:
        assert got in (Skip("lone_surrogate"), Skip("invalid_utf8"))
    assert check_value(over) == Skip("too_large")
    assert check_value(b"\xff" * (MAX_RECORD_BYTES + 1)) == Skip("too_large")


# ------------------------------------------------------------------------------------------ replay batches

BUNDLES = (b"t/ns/0x00000000_0x80000000", b"t/ns/0x80000000_0xffffffff", b"t/ns/0x00000000_0xffffffff")
Msg = tuple[bytes | None, bytes | None, int | None, int | None]


def next_record(r: random.Random, cur: dict[str, Any] | None, key: bytes) -> Record | None:
    """A plausible next record for a bundle (often accepted), or None for a tombstone."""
    v = 1 if cur is None else cur["version"] + 1
    if r.random() < 0.15:
        v = max(1, v + r.choice((-1, 1)))
    state = None if cur is None else cur["state"]
    a, b = r.choice(("b1:1", "b2:2")), r.choice(("b2:2", "b3:3"))
    if state is None:
        return make(State.ASSIGNING, version=v, ts=1, writer=a, dst=a)
    if state == "assigning":
        assert cur is not None
        return make(State.OWNED, version=v, ts=2, writer=a, dst=cur["dst"], src=cur["src"])
    if state == "owned":
        owner = cur["dst"] if cur else a
        if r.random() < 0.5:
            lo, hi = key.rsplit(b"/", 1)[1].split(b"_")
            mid = (int(lo, 16) + int(hi, 16)) // 2
            kids: dict[str, str | None] = {
                f"0x{int(lo, 16):08x}_0x{mid:08x}": owner,
                f"0x{mid:08x}_0x{int(hi, 16):08x}": None,
            }
            return make(State.SPLITTING, version=v, ts=3, writer=a, src=owner, children=kids)
        return make(State.RELEASING, version=v, ts=3, writer=a, src=owner)
    if state == "releasing":
        return make(State.FREE, version=v, ts=4, writer=a, src=cur["src"] if cur else b)
    if state == "splitting":
        return make(State.DELETED, version=v, ts=5, writer=a, src=cur["src"] if cur else b)
    if r.random() < 0.6:
        return None
    return make(State.ASSIGNING, version=v, ts=6, writer=a, dst=b, force=True)


def gen_log(r: random.Random) -> tuple[int | None, list[Msg]]:
    partitions = r.choice((None, 2))
    oracle = Oracle(partitions)
    offsets: dict[int, int] = {}
    msgs: list[Msg] = []
    for _ in range(r.randint(0, 40)):
        key: bytes | None = r.choice(BUNDLES)
        kind = r.randrange(10)
        if kind == 0:
            key = r.choice((None, b"\xff", b"not-a-bundle", b"t/ns/0x80000000_0x00000000"))
        assert key is None or isinstance(key, bytes)
        cur = oracle.table.get(key.decode("utf-8", "replace")) if key else None
        rec = next_record(r, cur, key if key in BUNDLES else BUNDLES[0])
        value = encode(rec)
        if value is not None and kind in (1, 2, 3):  # the same record written another valid way
            tree = record_tree(rec) if rec is not None else Obj()
            if kind == 2:
                tree.pairs.insert(0, ("unknown", rand_json(r)))
            if kind == 3:
                mutate_tree(r, tree)
            value = dump(tree, r, Style(esc=r.choice((0.0, 0.3)), ascii_only=r.random() < 0.5, ws=0.2))
        elif kind in (4, 5):
            value = r.choice((gen_mutated, gen_byte_mutant, gen_junk, gen_duplicate_attack))(r)
        partition: int | None = None
        offset: int | None = None
        if partitions is not None:
            partition = zlib.crc32(key) % partitions if key is not None else 0
            if r.random() < 0.1:
                partition = (partition + 1) % partitions
            offset = offsets.get(partition, 0)
            offsets[partition] = offset + 1
        msg = (key, value, partition, offset)
        msgs.append(msg)
        oracle.apply(*msg)
        if partitions is not None and msgs and r.random() < 0.1:  # a consumer re-fetching
            msgs.append(r.choice(msgs))
    return partitions, msgs


def split_batches(r: random.Random, msgs: list[Msg]) -> list[list[Msg]]:
    cuts = sorted(r.sample(range(len(msgs) + 1), k=min(len(msgs) + 1, r.randint(0, 6))))
    edges = [0, *cuts, len(msgs)]
    return [msgs[edges[i] : edges[i + 1]] for i in range(len(edges) - 1)]


@settings(max_examples=120, deadline=None, suppress_health_check=SLOW_OK)
@given(r=rngs)
def test_replay_does_not_depend_on_batch_boundaries(r: random.Random) -> None:
    partitions, msgs = gen_log(r)
    one = TableView(partitions)
    oracle = Oracle(partitions)
    for m in msgs:
        outcome = one.apply(*m)
        expected, _reason = oracle.apply(*m)
        assert outcome == expected, m
    assert table_json(one.items()) == oracle.table

    batched = TableView(partitions)
    for batch in split_batches(r, msgs):
        batched.apply_all(iter(batch))
    whole = TableView(partitions)
    whole.apply_all(msgs)

    assert batched.as_dict() == one.as_dict() == whole.as_dict()
    assert batched.positions == one.positions == whole.positions
    assert batched.stats.detail() == one.stats.detail() == whole.stats.detail()

    # The skip counters are the oracle's reasons, message by message.
    reasons: dict[str, int] = {}
    check = Oracle(partitions)
    for m in msgs:
        outcome, reason = check.apply(*m)
        if outcome == "skipped":
            assert reason is not None
            reasons[reason] = reasons.get(reason, 0) + 1
    assert one.stats.detail()["skipped_by_reason"] == reasons


# ------------------------------------------------------------------------------------------ environment

CORPUS_SEED = 20240229
CORPUS_SIZE = 300

_CHILD = r"""
import json, sys
from trimtab.channel.records import decode
from trimtab.channel.table import TableView

values = [bytes.fromhex(h) for h in json.load(open(sys.argv[1]))]
out = []

def run():
    for v in values:
        res = decode(v)
        if hasattr(res, "reason"):
            out.append("skip " + res.reason)
        else:
            out.append("record " + json.dumps(res.to_json(), sort_keys=True))
    view = TableView()
    view.apply_all((b"t/ns/0x00000000_0xffffffff", v, None, None) for v in values)
    out.append(json.dumps(view.stats.detail(), sort_keys=True))
    out.append(json.dumps({k: r.to_json() for k, r in view.items()}, sort_keys=True))

def deep(n):
    if n:
        return deep(n - 1)
    run()

if sys.argv[2] == "shallow":
    run()
else:
    sys.setrecursionlimit(120)
    deep(80)
    sys.setrecursionlimit(1000)
sys.stdout.write("\n".join(out) + "\n")
"""


def environment_corpus() -> list[bytes]:
    r = random.Random(CORPUS_SEED)
    gens = [
        gen_valid,
        gen_mutated,
        gen_byte_mutant,
        gen_junk,
        gen_duplicate_attack,
        gen_violations,
        gen_whitespace,
    ]
    corpus = [gens[i % len(gens)](r) for i in range(CORPUS_SIZE - 12)]
    rec = make(State.OWNED, version=1, ts=0, writer="w", dst="b1:1")
    raw = encode(rec)
    assert raw is not None
    corpus += [
        raw[:-1] + b',"big":' + b"9" * 5000 + b"}",
        raw[:-1] + b',"big":-' + b"1" * 700 + b"}",
        raw.replace(b'"version":1', b'"version":' + b"1" * 700),
        raw.replace(b'"ts":0', b'"ts":' + b"1" * 4301),
        raw[:-1] + b',"deep":' + b"[" * 3000 + b"]" * 3000 + b"}",
        raw[:-1] + b',"deep":' + b"[" * 31 + b"]" * 31 + b"}",
        raw[:-1] + b',"deep":' + b"[" * 32 + b"]" * 32 + b"}",
        _padded(rec, MAX_RECORD_BYTES),
        _padded(rec, MAX_RECORD_BYTES + 1),
        raw[:-1] + b',"\\u0064st":null}',
        raw.replace(b'"schema":1', b'"schema":2'),
        raw.replace(b'"owned"', b'"migrating"'),
    ]
    return corpus


def run_child(corpus_file: Path, env_changes: dict[str, str | None], mode: str) -> str:
    env = dict(os.environ)
    for k, v in env_changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(corpus_file), mode],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_decoding_does_not_depend_on_the_environment(tmp_path: Path) -> None:
    corpus = environment_corpus()
    assert len(corpus) == CORPUS_SIZE
    assert environment_corpus() == corpus  # generation depends on the seed only
    corpus_file = tmp_path / "corpus.json"
    corpus_file.write_text(json.dumps([v.hex() for v in corpus]))
    base = {"PYTHONHASHSEED": "0", "PYTHONINTMAXSTRDIGITS": None}
    runs = {
        "hashseed=0": run_child(corpus_file, base, "shallow"),
        "hashseed=12345": run_child(corpus_file, {**base, "PYTHONHASHSEED": "12345"}, "shallow"),
        "intmaxstrdigits=640": run_child(corpus_file, {**base, "PYTHONINTMAXSTRDIGITS": "640"}, "shallow"),
        "recursionlimit=120,depth=80": run_child(corpus_file, base, "deep"),
    }
    reference = runs["hashseed=0"]
    lines = reference.splitlines()
    assert len(lines) == CORPUS_SIZE + 2
    for name, out in runs.items():
        assert out == reference, name
    # ... and the children agree with this process and with the oracle.
    for value, line in zip(corpus, lines[:CORPUS_SIZE], strict=True):
        assert line == result_text(check_value(value))
    # The corpus is adversarial enough to reach every decoding outcome this test cares about.
    seen = {line.split(" ", 1)[0] if line.startswith("record") else line for line in lines[:CORPUS_SIZE]}
    for expected in (
        "record",
        "skip too_large",
        "skip bom",
        "skip invalid_utf8",
        "skip malformed",
        "skip lone_surrogate",
        "skip int_out_of_range",
        "skip too_deep",
        "skip future_schema",
        "skip unknown_state",
    ):
        assert expected in seen, expected
