"""Shared hypothesis strategies, and an independent reference model of the bundle state channel.

The reference model (:class:`Oracle`) is written from docs/design.md section 3 and docs of the wire format, not
from ``channel.resolve``/``channel.table``: it parses JSON with the standard library, validates fields by
hand, and states the transition table literally. Property tests compare the real code against it after
every message. The log generator (:func:`channel_logs`) also uses it to know the true state of a bundle
while it invents plausible next records (assign, transfer, unload, split, overrides, tombstones, re-created
bundles), racing writers, stale writers, duplicates, garbage values and bad keys.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import zlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from tests.support.records import to_record
from trimtab.channel.bundles import FULL_UPPER, BundleRange
from trimtab.channel.records import Record, encode

BROKERS = ("b1:1", "b2:2", "b3:3")
WRITERS = (*BROKERS, "leader")
STATE_NAMES = ("free", "owned", "assigning", "releasing", "splitting", "merging", "deleted")
REQUIRED_FIELDS = ("schema", "state", "dst", "src", "version", "force", "ts", "writer")

# docs/design.md 3.1, verbatim: from -> allowed non-forced targets; None is Init (no record / tombstone).
DESIGN_TRANSITIONS: dict[str | None, frozenset[str | None]] = {
    None: frozenset({"assigning", "owned"}),
    "free": frozenset({"assigning", None}),
    "owned": frozenset({"splitting", "releasing", "merging"}),
    "assigning": frozenset({"owned"}),
    "releasing": frozenset({"assigning", "free"}),
    "splitting": frozenset({"deleted"}),
    "merging": frozenset({"deleted", "owned"}),
    "deleted": frozenset({None}),
}

_RANGE = re.compile(r"0x([0-9a-f]{8})_0x([0-9a-f]{8})")
_PART = r"[A-Za-z0-9][A-Za-z0-9_.=:-]{0,127}"
_BUNDLE = re.compile(rf"({_PART}/{_PART})/0x([0-9a-f]{{8}})_0x([0-9a-f]{{8}})")

Msg = tuple[bytes | None, bytes | None, int | None, int | None]

# --------------------------------------------------------------------------------------------- basics

EDGE_HASHES = (0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, FULL_UPPER)
hashes = st.one_of(st.sampled_from(EDGE_HASHES), st.integers(0, FULL_UPPER))

name_parts = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.=:-]{0,12}\Z")
namespaces = st.builds(lambda a, b: f"{a}/{b}", name_parts, name_parts)
topic_names = st.builds(
    lambda d, a, b, local: f"{d}://{a}/{b}/{local}",
    st.sampled_from(["persistent", "non-persistent"]),
    name_parts,
    name_parts,
    st.text(st.characters(blacklist_categories=("Z", "C")), min_size=1, max_size=30),
)


@st.composite
def bundle_ranges(draw: Any) -> BundleRange:
    """Any valid range, with the full space, last-bundle and tiny ranges well represented."""
    kind = draw(st.sampled_from(["any", "any", "full", "last", "tiny"]))
    if kind == "full":
        return BundleRange(0, FULL_UPPER)
    lo = draw(st.one_of(st.sampled_from([0, 0xFFFFFFF0, FULL_UPPER - 1]), st.integers(0, FULL_UPPER - 1)))
    if kind == "last":
        return BundleRange(lo, FULL_UPPER)
    if kind == "tiny":
        return BundleRange(lo, min(FULL_UPPER, lo + draw(st.integers(1, 4))))
    return BundleRange(lo, draw(st.integers(lo + 1, FULL_UPPER)))


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=10),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def rec(
    state: str,
    version: int,
    *,
    dst: str | None = None,
    src: str | None = None,
    force: bool = False,
    children: dict[str, str | None] | None = None,
    ts: int = 0,
    writer: str = "w",
) -> dict[str, Any]:
    """A record in the reference model's form: exactly what ``Record.to_json()`` must produce."""
    out: dict[str, Any] = {
        "schema": 1,
        "state": state,
        "dst": dst,
        "src": src,
        "version": version,
        "force": force,
        "ts": ts,
        "writer": writer,
    }
    if children is not None:
        out["children"] = dict(children)
    return out


@st.composite
def records(draw: Any, rng: BundleRange | None = None, max_version: int = 6) -> Record:
    """Well-formed records (not necessarily valid for any state); splitting ones often tile ``rng``, merging
    ones often name a range ``rng`` merges into."""
    state = draw(st.sampled_from(STATE_NAMES))
    brokers = st.sampled_from([None, *BROKERS])
    children = None
    if state == "merging":
        children = draw(merged_for(rng))
    elif state == "splitting" or draw(st.integers(0, 9)) == 0:
        children = draw(children_for(rng))
    d = rec(
        state,
        draw(st.integers(1, max_version)),
        dst=draw(brokers),
        src=draw(brokers),
        force=draw(st.booleans()),
        children=children,
        ts=draw(st.integers(0, 2**40)),
        writer=draw(st.sampled_from(WRITERS)),
    )
    return to_record(d)


@st.composite
def children_for(draw: Any, rng: BundleRange | None) -> dict[str, str | None]:
    """Split children: usually an exact tiling of ``rng``, sometimes broken (gap, overlap, one child...)."""
    owner = st.sampled_from([None, *BROKERS])
    if rng is not None and rng.upper - rng.lower >= 2 and draw(st.integers(0, 3)) > 0:
        cuts = sorted(set(draw(st.lists(st.integers(rng.lower + 1, rng.upper - 1), min_size=1, max_size=3))))
        edges = [rng.lower, *cuts, rng.upper]
        spans = [(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]
        mode = draw(st.sampled_from(["ok", "ok", "ok", "drop", "widen", "bogus"]))
        if mode == "drop" and len(spans) > 1:
            spans.pop(draw(st.integers(0, len(spans) - 1)))
        elif mode == "widen" and spans[0][1] < rng.upper:
            spans[0] = (spans[0][0], spans[0][1] + 1)
        names = [f"0x{a:08x}_0x{b:08x}" for a, b in spans if a < b]
        if mode == "bogus":
            names.append(draw(st.sampled_from(["garbage", "0xFFFFFFFF_0x00000000", "0x00000001_0x00000001"])))
        return {n: draw(owner) for n in names}
    lo = draw(st.integers(0, FULL_UPPER - 1))
    hi = draw(st.integers(lo + 1, FULL_UPPER))
    return {f"0x{lo:08x}_0x{hi:08x}": draw(owner)}


@st.composite
def merged_for(draw: Any, rng: BundleRange | None) -> dict[str, str | None]:
    """A merge's one entry: usually a range that extends ``rng`` on one side, sometimes a wrong one (the
    bundle itself, a range around it, a split's children, two entries)."""
    owner = st.sampled_from([None, *BROKERS])
    if rng is not None and draw(st.integers(0, 3)) > 0:
        lo, hi = rng.lower, rng.upper
        sides = [(lo, draw(st.integers(hi + 1, FULL_UPPER)))] if hi < FULL_UPPER else []
        sides += [(draw(st.integers(0, lo - 1)), hi)] if lo > 0 else []
        mode = draw(st.sampled_from(["ok", "ok", "ok", "self", "around", "two"]))
        if mode == "self" or not sides:
            spans = [(lo, hi)]
        elif mode == "around" and lo > 0 and hi < FULL_UPPER:
            spans = [(lo - 1, hi + 1)]
        elif mode == "two" and len(sides) == 2:
            spans = sides
        else:
            spans = [draw(st.sampled_from(sides))]
        return {f"0x{a:08x}_0x{b:08x}": draw(owner) for a, b in spans}
    return draw(children_for(rng))


# ------------------------------------------------------------------------------------- reference model


def oracle_tiles(lo: int, hi: int, children: dict[str, Any]) -> bool:
    spans = []
    for name in children:
        m = _RANGE.fullmatch(name)
        if m is None:
            return False
        a, b = int(m[1], 16), int(m[2], 16)
        if a >= b:
            return False
        spans.append((a, b))
    spans.sort()
    if len(spans) < 2 or spans[0][0] != lo or spans[-1][1] != hi:
        return False
    return all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1))


def oracle_merges_into(lo: int, hi: int, children: dict[str, Any]) -> bool:
    """One entry, a range that strictly contains [lo, hi) and shares exactly one of its two edges."""
    if len(children) != 1:
        return False
    m = _RANGE.fullmatch(next(iter(children)))
    if m is None:
        return False
    a, b = int(m[1], 16), int(m[2], 16)
    return a < b and a <= lo and hi <= b and (a == lo) != (b == hi)


def oracle_shape_ok(lo: int, hi: int, r: dict[str, Any]) -> bool:
    s, children = r["state"], r.get("children")
    if s == "splitting":
        return r["src"] is not None and children is not None and oracle_tiles(lo, hi, children)
    if s == "merging":
        return r["src"] is not None and children is not None and oracle_merges_into(lo, hi, children)
    if children is not None:
        return False
    if s in ("owned", "assigning"):
        return r["dst"] is not None
    if s == "releasing":
        return r["src"] is not None and r["src"] != r["dst"]  # no transfer to self
    if s == "deleted":
        return r["src"] is not None or r["dst"] is not None
    return True


def oracle_accepts(lo: int, hi: int, cur: dict[str, Any] | None, new: dict[str, Any] | None) -> bool:
    """First valid transition, restated from docs/design.md 3.1/3.3 (``lo``/``hi``: the bundle's range)."""
    if new is None:  # tombstone: only a semi-terminal bundle goes back to Init
        return cur is not None and cur["state"] in ("free", "deleted")
    expected = 1 if cur is None else cur["version"] + 1
    if new["version"] != expected:
        return False
    if not oracle_shape_ok(lo, hi, new):
        return False
    if new["force"]:
        return True
    frm, to = (None if cur is None else cur["state"]), new["state"]
    if to not in DESIGN_TRANSITIONS[frm]:
        return False
    src, dst = new["src"], new["dst"]
    if cur is None:
        return not (to == "assigning" and src is not None)  # a fresh assignment has no source
    if frm == "free":
        return src is None
    if frm == "owned":  # only the owner releases, splits or merges
        return src == cur["dst"] and not (to in ("splitting", "merging") and dst is not None)
    if frm == "merging" and to == "owned":  # an aborted merge stays with its broker
        return src == cur["src"] and dst == cur["src"]
    if (src, dst) != (cur["src"], cur["dst"]):  # continue the in-flight record
        return False
    if frm == "releasing" and to == "assigning":
        return dst is not None  # only a transfer continues to Assigning
    if frm == "releasing" and to == "free":
        return cur["dst"] is None  # a transfer cannot end as an unload
    return True


def _reject_constant(name: str) -> Any:
    raise ValueError(name)


ORACLE_MAX_BYTES = 64 * 1024  # docs/protocol.md 2.2
ORACLE_MAX_DEPTH = 32
# docs/protocol.md 2.2: the first rule of this list a JSON text breaks is its skip reason.
ORACLE_RULES = ("lone_surrogate", "int_out_of_range", "too_deep")


class _Int:
    """An integer literal as written, so the oracle never converts more digits than int64 needs."""

    def __init__(self, text: str) -> None:
        self.text = text


class _Pairs(list[tuple[str, Any]]):
    """An object as its name/value pairs, duplicates included."""


def _json_loads_any_depth(text: str) -> Any:
    """json.loads with hooks, on a thread with a big stack when the text may nest deeply (the standard
    library parser recurses); raises ValueError for anything that is not JSON."""
    kw: dict[str, Any] = {"object_pairs_hook": _Pairs, "parse_int": _Int, "parse_constant": _reject_constant}
    if text.count("[") + text.count("{") < 200:
        return json.loads(text, **kw)
    out: dict[str, Any] = {}

    def run() -> None:
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(400_000)
        try:
            out["v"] = json.loads(text, **kw)
        except ValueError as e:
            out["e"] = e
        finally:
            sys.setrecursionlimit(old)

    threading.stack_size(512 << 20)
    try:
        t = threading.Thread(target=run)
        t.start()
    finally:
        threading.stack_size(0)
    t.join()
    if "e" in out:
        raise out["e"]
    return out["v"]


def _oracle_violations(node: Any) -> tuple[set[str], Any]:
    """The rules a parsed JSON text breaks, and its plain value (walked with an explicit stack)."""
    broken: set[str] = set()

    def text(s: str) -> str:
        if any(0xD800 <= ord(ch) <= 0xDFFF for ch in s):
            broken.add("lone_surrogate")
        return s

    def scalar(v: Any) -> Any:
        if isinstance(v, _Int):
            digits = v.text.lstrip("-")
            if len(digits) > 19 or not -(2**63) <= int(v.text) <= 2**63 - 1:
                broken.add("int_out_of_range")
                return 0
            return int(v.text)
        return text(v) if isinstance(v, str) else v

    root: list[Any] = [None]
    work: list[tuple[Any, int, Any, Any]] = [(node, 1, root, 0)]  # (node, depth, parent, slot)
    while work:
        n, depth, parent, slot = work.pop()
        if isinstance(n, _Pairs):
            if depth > ORACLE_MAX_DEPTH:
                broken.add("too_deep")
            # A repeated name: its last value counts (docs/protocol.md 2.2), but every occurrence is
            # still checked against the rules.
            last = {text(k): i for i, (k, _) in enumerate(n)}
            d: dict[str, Any] = {}
            parent[slot] = d
            for i, (k, v) in enumerate(n):
                if last[k] == i:
                    d[k] = None
                    work.append((v, depth + 1, d, k))
                else:
                    work.append((v, depth + 1, [None], 0))
        elif isinstance(n, list):
            if depth > ORACLE_MAX_DEPTH:
                broken.add("too_deep")
            lst: list[Any] = [None] * len(n)
            parent[slot] = lst
            for i, v in enumerate(n):
                work.append((v, depth + 1, lst, i))
        else:
            parent[slot] = scalar(n)
    return broken, root[0]


def oracle_json(value: bytes) -> Any:
    """docs/protocol.md 2.2 restated with the standard library: the value, or ("skip", reason)."""
    if len(value) > ORACLE_MAX_BYTES:
        return ("skip", "too_large")
    if value[:3] == b"\xef\xbb\xbf":
        return ("skip", "bom")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return ("skip", "invalid_utf8")
    try:
        parsed = _json_loads_any_depth(text)
    except ValueError:
        return ("skip", "malformed")
    broken, plain = _oracle_violations(parsed)
    for rule in ORACLE_RULES:
        if rule in broken:
            return ("skip", rule)
    return plain


def oracle_decode(value: bytes) -> dict[str, Any] | str:
    """A record dict, or the skip reason (docs/protocol.md 2.2)."""
    obj = oracle_json(value)
    if type(obj) is tuple:
        return str(obj[1])
    if type(obj) is not dict:
        return "malformed"
    if _oracle_valid(obj):
        children = obj.get("children")
        return rec(
            obj["state"],
            obj["version"],
            dst=obj["dst"],
            src=obj["src"],
            force=obj["force"],
            children=children,
            ts=obj["ts"],
            writer=obj["writer"],
        )
    schema = obj.get("schema")
    if type(schema) is int and schema > 1:
        return "future_schema"
    state = obj.get("state")
    if type(schema) is int and schema == 1 and type(state) is str and state not in STATE_NAMES:
        return "unknown_state"
    return "malformed"


def _is_broker(v: Any) -> bool:
    return v is None or (type(v) is str and v != "")


def _oracle_valid(d: dict[str, Any]) -> bool:
    if any(f not in d for f in REQUIRED_FIELDS):
        return False
    if type(d["schema"]) is not int or d["schema"] != 1:
        return False
    if type(d["state"]) is not str or d["state"] not in STATE_NAMES:
        return False
    if not (_is_broker(d["dst"]) and _is_broker(d["src"])):
        return False
    if type(d["version"]) is not int or d["version"] < 1:
        return False
    if type(d["force"]) is not bool or type(d["ts"]) is not int or type(d["writer"]) is not str:
        return False
    children = d.get("children")
    return children is None or (type(children) is dict and all(map(_is_broker, children.values())))


def oracle_bundle(name: str) -> tuple[int, int] | None:
    m = _BUNDLE.fullmatch(name)
    if m is None:
        return None
    lo, hi = int(m[2], 16), int(m[3], 16)
    return (lo, hi) if lo < hi else None


class Oracle:
    """The table every node must compute, applied one message at a time."""

    def __init__(self, partitions: int | None = None) -> None:
        self.partitions = partitions
        self.table: dict[str, dict[str, Any]] = {}
        self.positions: dict[int, int] = {}

    def apply(
        self, key: bytes | None, value: bytes | None, partition: int | None, offset: int | None
    ) -> tuple[str, str | None]:
        """``(outcome, skip reason)`` with the outcomes of ``TableView.apply``."""
        if partition is not None and offset is not None:
            if offset < self.positions.get(partition, 0):
                return "duplicate", None
            self.positions[partition] = offset + 1
        if key is None:
            return "skipped", "bad_key"
        try:
            name = key.decode("utf-8")
        except UnicodeDecodeError:
            return "skipped", "bad_key"
        # One bundle's records live in one partition (crc32(key) % partitions); others are skipped.
        if (
            self.partitions is not None
            and partition is not None
            and zlib.crc32(key) % self.partitions != partition
        ):
            return "skipped", "wrong_partition"
        rng = oracle_bundle(name)
        if rng is None:
            return "skipped", "bad_key"
        new = None
        if value is not None:
            decoded = oracle_decode(value)
            if isinstance(decoded, str):
                return "skipped", decoded
            new = decoded
        if not oracle_accepts(rng[0], rng[1], self.table.get(name), new):
            return "rejected", None
        if new is None:
            del self.table[name]
        else:
            self.table[name] = new
        return "accepted", None


def table_json(items: Any) -> dict[str, dict[str, Any]]:
    """A TableView (or dict of records) in the reference model's form."""
    pairs = items.items() if hasattr(items, "items") else items
    return {k: r.to_json() for k, r in pairs}


# ------------------------------------------------------------------------------------- log generation


@dataclass
class ChannelLog:
    """Messages in append order; with ``partitions`` each carries its partition and offset."""

    partitions: int | None
    messages: list[Msg]

    def partition_logs(self) -> dict[int, list[Msg]]:
        assert self.partitions is not None
        out: dict[int, list[Msg]] = {p: [] for p in range(self.partitions)}
        for m in self.messages:
            assert m[2] is not None
            out[m[2]].append(m)
        return out

    def in_partition_order(self) -> list[Msg]:
        """The whole channel read partition by partition: what a full replay from offset zero reads."""
        if self.partitions is None:
            return list(self.messages)
        return [m for p, msgs in sorted(self.partition_logs().items()) for m in msgs]


_DEEP = b'{"x":' + b"[" * 3000 + b"]" * 3000 + b"}"
BAD_KEYS = (
    None,
    b"\xff\xfe",
    b"",
    b"not-a-bundle",
    b"t/ns0/0x80000000_0x00000000",
    b"t/ns0/0x00000000_0x00000000",
    b"t/ns0/0X00000000_0X80000000",
    b"t/ns0/0x00000000_0x80000000\n",
    b"t/ns0/0x00000000_0x800000000",
    b"t/0x00000000_0x80000000",
    b"t/ns0/0x00000000_0x80000000/x",
)
_ACTIONS = (
    ("flow",) * 6
    + ("race",) * 2
    + ("flush",) * 2
    + (
        "stale",
        "force",
        "tombstone",
        "garbage",
        "bad_key",
        "wrong_partition",
        "mutate",
        "extra_fields",
    )
)


class _Builder:
    def __init__(self, draw: Any, partitions: int | None) -> None:
        self.draw = draw
        self.partitions = partitions
        self.truth = Oracle(partitions)
        self.keys: list[str] = [
            "t/ns0/0x00000000_0x80000000",
            "t/ns0/0x80000000_0xffffffff",
            "t/ns1/0x00000000_0xffffffff",
        ]
        self.history: dict[str, list[dict[str, Any] | None]] = {k: [None] for k in self.keys}
        self.claims: dict[str, str] = {}  # split child -> the parent's owner, who claims it
        self.pending: list[tuple[bytes | None, bytes | None, int | None]] = []
        self.messages: list[Msg] = []
        self.offsets: dict[int, int] = defaultdict(int)
        self.ts = 0

    # -- plumbing
    def append(self, key: bytes | None, value: bytes | None, partition: int | None = None) -> None:
        if self.partitions is None:
            msg: Msg = (key, value, None, None)
        else:
            if partition is None:
                if key is None:
                    partition = self.draw(st.integers(0, self.partitions - 1))
                else:
                    partition = zlib.crc32(key) % self.partitions
            msg = (key, value, partition, self.offsets[partition])
            self.offsets[partition] += 1
        self.messages.append(msg)
        outcome, _ = self.truth.apply(*msg)
        if outcome == "accepted" and key is not None:
            name = key.decode()
            cur = self.truth.table.get(name)
            self.history.setdefault(name, [None]).append(cur)
            if cur is not None and cur["state"] in ("splitting", "merging"):
                ns = name.rsplit("/", 1)[0]
                for child in cur["children"]:
                    ckey = f"{ns}/{child}"
                    if ckey not in self.history:
                        self.keys.append(ckey)
                        self.history[ckey] = [None]
                    self.claims[ckey] = cur["src"]

    def encode(self, d: dict[str, Any] | None, extra: bool = False) -> bytes | None:
        if d is None:
            return None
        if extra:
            return json.dumps({"zzz_future": {"a": [1, 2]}, **d, "note": "x"}).encode()
        return encode(to_record(d))

    def pick_key(self) -> str:
        return self.draw(st.sampled_from(self.keys))

    def children(self, name: str, owner: str | None) -> dict[str, str | None] | None:
        rng = oracle_bundle(name)
        assert rng is not None
        lo, hi = rng
        if hi - lo < 2:
            return None
        cut = self.draw(st.sampled_from([lo + (hi - lo) // 2, lo + 1, hi - 1]))
        return {f"0x{lo:08x}_0x{cut:08x}": owner, f"0x{cut:08x}_0x{hi:08x}": owner}

    def merged(self, name: str, owner: str | None) -> dict[str, str | None] | None:
        """A merge with a neighbour: this bundle's range extended on one side."""
        rng = oracle_bundle(name)
        assert rng is not None
        lo, hi = rng
        sides = [f"0x{lo:08x}_0x{FULL_UPPER:08x}"] if hi < FULL_UPPER else []
        sides += [f"0x00000000_0x{hi:08x}"] if lo > 0 else []
        return {self.draw(st.sampled_from(sides)): owner} if sides else None

    def flows(self, name: str, cur: dict[str, Any] | None) -> list[dict[str, Any] | None]:
        """The plausible next records of a bundle observed at ``cur`` (docs/design.md 3.1 flows)."""
        self.ts += 1
        w = self.draw(st.sampled_from(WRITERS))

        def r(state: str, **kw: Any) -> dict[str, Any]:
            return rec(state, 1 if cur is None else cur["version"] + 1, ts=self.ts, writer=w, **kw)

        if cur is None:
            out: list[dict[str, Any] | None] = [r("assigning", dst=b) for b in BROKERS]
            if name in self.claims:
                out.append(r("owned", dst=self.claims[name]))
            return out
        s, a, src = cur["state"], cur["dst"], cur["src"]
        if s == "free":
            return [*(r("assigning", dst=b) for b in BROKERS), None]
        if s == "owned":
            out = [r("releasing", src=a), *(r("releasing", src=a, dst=b) for b in BROKERS if b != a)]
            children = self.children(name, a)
            if children is not None:
                out.append(r("splitting", src=a, children=children))
            merged = self.merged(name, a)
            if merged is not None:
                out.append(r("merging", src=a, children=merged))
            return out
        if s == "assigning":
            return [r("owned", dst=a, src=src)]
        if s == "releasing":
            return [r("assigning", src=src, dst=a) if a is not None else r("free", src=src)]
        if s == "splitting":
            return [r("deleted", src=src, dst=a)]
        if s == "merging":
            return [r("deleted", src=src, dst=a), r("owned", src=src, dst=src)]
        return [None]  # deleted

    def step(self) -> None:
        draw = self.draw
        action = draw(st.sampled_from(_ACTIONS))
        name = self.pick_key()
        key = name.encode()
        cur = self.truth.table.get(name)
        if action == "flow":
            self.append(key, self.encode(draw(st.sampled_from(self.flows(name, cur)))))
        elif action == "race":
            # Two writers compute the next record from the same observed state; they land whenever.
            first = draw(st.sampled_from(self.flows(name, cur)))
            second = draw(st.sampled_from(self.flows(name, cur)))
            if draw(st.booleans()):
                self.append(key, self.encode(first))
            else:
                self.pending.append((key, self.encode(first), None))
            self.pending.append((key, self.encode(second), None))
        elif action == "flush":
            if self.pending:
                self.append(*self.pending.pop(draw(st.integers(0, len(self.pending) - 1))))
        elif action == "stale":
            observed = draw(st.sampled_from(self.history[name]))
            self.append(key, self.encode(draw(st.sampled_from(self.flows(name, observed)))))
        elif action == "force":
            self.append(key, self.encode(self.forced(name, cur)))
        elif action == "tombstone":
            self.append(key, None)
        elif action == "garbage":
            self.append(key, self.garbage(name, cur))
        elif action == "bad_key":
            nxt = rec("assigning", 1, dst="b1:1")
            self.append(draw(st.sampled_from(BAD_KEYS)), self.encode(nxt))
        elif action == "wrong_partition" and self.partitions is not None and self.partitions > 1:
            home = zlib.crc32(key) % self.partitions
            wrong = (home + draw(st.integers(1, self.partitions - 1))) % self.partitions
            self.append(key, self.encode(draw(st.sampled_from(self.flows(name, cur)))), wrong)
        elif action == "mutate":
            self.append(key, self.encode(self.mutated(name, cur)))
        elif action == "extra_fields":
            self.append(key, self.encode(draw(st.sampled_from(self.flows(name, cur))), extra=True))

    def forced(self, name: str, cur: dict[str, Any] | None) -> dict[str, Any]:
        draw = self.draw
        state = draw(st.sampled_from(STATE_NAMES))
        expected = 1 if cur is None else cur["version"] + 1
        version = max(1, expected + draw(st.sampled_from([0, 0, 0, -1, 1])))
        src = draw(st.sampled_from([None, *BROKERS]))
        children = self.children(name, src) if state == "splitting" else None
        if state == "merging":
            children = self.merged(name, src)
        self.ts += 1
        return rec(
            state,
            version,
            dst=draw(st.sampled_from([None, *BROKERS])),
            src=src,
            force=True,
            children=children,
            ts=self.ts,
            writer="leader",
        )

    def mutated(self, name: str, cur: dict[str, Any] | None) -> dict[str, Any]:
        draw = self.draw
        base = draw(st.sampled_from(self.flows(name, cur)))
        if base is None:
            base = rec("assigning", 1 if cur is None else cur["version"] + 1, dst="b1:1")
        field = draw(st.sampled_from(["dst", "src", "version", "state", "children"]))
        if field in ("dst", "src"):
            base[field] = draw(st.sampled_from([None, *BROKERS]))
        elif field == "version":
            base["version"] = max(1, base["version"] + draw(st.sampled_from([-1, 1, 2])))
        elif field == "state":
            base["state"] = draw(st.sampled_from(STATE_NAMES))
            if base["state"] in ("splitting", "merging") and "children" not in base:
                make = self.children if base["state"] == "splitting" else self.merged
                base["children"] = make(name, base["src"])
                if base["children"] is None:
                    del base["children"]
        elif "children" in base:
            del base["children"]
        else:
            base["children"] = self.children(name, base["src"]) or {"0x00000000_0xffffffff": None}
        return base

    def garbage(self, name: str, cur: dict[str, Any] | None) -> bytes:
        """Values that must be skipped; several look like the valid next record."""
        draw = self.draw
        nxt = draw(st.sampled_from(self.flows(name, cur))) or rec("assigning", 1, dst="b1:1")
        kind = draw(
            st.sampled_from(["bytes", "json", "schema2", "unknown_state", "missing", "empty_broker", "deep"])
        )
        if kind == "bytes":
            return bytes(draw(st.binary(max_size=24)))
        if kind == "json":
            return json.dumps(draw(json_values)).encode()
        if kind == "schema2":
            return json.dumps({**nxt, "schema": 2}).encode()
        if kind == "unknown_state":
            return json.dumps({**nxt, "state": "migrating"}).encode()
        if kind == "missing":
            field = draw(st.sampled_from(REQUIRED_FIELDS))
            return json.dumps({k: v for k, v in nxt.items() if k != field}).encode()
        if kind == "empty_broker":
            return json.dumps({**nxt, "dst": ""}).encode()
        return _DEEP


@st.composite
def channel_logs(draw: Any, partitions: Any = None, max_steps: int = 40) -> ChannelLog:
    """Random channel logs; ``partitions`` is a strategy for the partition count (None: one stream)."""
    p = draw(partitions) if partitions is not None else None
    b = _Builder(draw, p)
    for _ in range(draw(st.integers(0, max_steps))):
        b.step()
    while b.pending:  # late writers land eventually, in any order
        b.append(*b.pending.pop(draw(st.integers(0, len(b.pending) - 1))))
    return ChannelLog(p, b.messages)


@st.composite
def deliveries(
    draw: Any, log: ChannelLog, redeliver: bool = True, start: dict[int, int] | None = None
) -> list[Msg]:
    """One node's view of the channel: partitions interleaved arbitrarily (each in order), from ``start``
    offsets, with occasional re-deliveries of already-read offsets (a consumer re-fetching)."""
    if log.partitions is None:
        return list(log.messages)
    parts = {p: msgs[(start or {}).get(p, 0) :] for p, msgs in log.partition_logs().items()}
    cursor = dict.fromkeys(parts, 0)
    rewinds = 3 if redeliver else 0
    out: list[Msg] = []
    while True:
        remaining = [p for p in sorted(parts) if cursor[p] < len(parts[p])]
        if not remaining:
            return out
        p = draw(st.sampled_from(remaining))
        if rewinds and cursor[p] > 0 and draw(st.integers(0, 7)) == 0:
            rewinds -= 1
            cursor[p] -= draw(st.integers(1, cursor[p]))
        out.append(parts[p][cursor[p]])
        cursor[p] += 1
