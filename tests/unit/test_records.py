"""The record wire format (docs/design.md 3.2): round trips, and decoding that never raises."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimtab.channel.records import (
    IN_FLIGHT,
    SCHEMA_VERSION,
    SKIP_REASONS,
    Record,
    Skip,
    State,
    decode,
    decode_strict,
    encode,
    intern_brokers,
    make,
    record_from_json,
)

FIELDS = ("schema", "state", "dst", "src", "version", "force", "ts", "writer")


def wire(**overrides: Any) -> bytes:
    d: dict[str, Any] = {
        "schema": 1,
        "state": "owned",
        "dst": "b1:1",
        "src": None,
        "version": 3,
        "force": False,
        "ts": 1700000000000,
        "writer": "b1:1",
    }
    d.update(overrides)
    return json.dumps(d).encode()


EXAMPLES = [
    make(State.FREE, version=4, ts=1, writer="b1:1", src="b1:1"),
    make(State.OWNED, version=2, ts=2, writer="b1:1", dst="b1:1"),
    make(State.ASSIGNING, version=1, ts=3, writer="b2:2", dst="b1:1"),
    make(State.ASSIGNING, version=5, ts=3, writer="b2:2", dst="b1:1", src="b2:2"),
    make(State.RELEASING, version=3, ts=4, writer="b1:1", src="b1:1", dst="b2:2"),
    make(
        State.SPLITTING,
        version=3,
        ts=5,
        writer="b1:1",
        src="b1:1",
        children={"0x00000000_0x80000000": "b1:1", "0x80000000_0xffffffff": None},
    ),
    make(State.DELETED, version=4, ts=6, writer="b1:1", src="b1:1"),
    make(State.OWNED, version=9, ts=7, writer="leader", dst="b3:3", force=True),
    make(
        State.MERGING,
        version=5,
        ts=8,
        writer="controller:c1:t3",
        src="b1:1",
        children={"0x00000000_0xffffffff": "b1:1"},
    ),
]


@pytest.mark.parametrize("record", EXAMPLES, ids=lambda r: f"{r.state.value}-v{r.version}")
def test_round_trip(record: Record) -> None:
    raw = encode(record)
    assert raw is not None
    assert decode(raw) == record
    # The wire form is plain JSON any Kafka tool can show, with every protocol field present.
    obj = json.loads(raw)
    assert obj == record.to_json()
    assert set(FIELDS) <= set(obj)
    assert obj["schema"] == SCHEMA_VERSION == 1
    assert obj["state"] == record.state.value
    assert ("children" in obj) == (record.children is not None)
    assert record_from_json(obj) == record
    assert decode_strict(raw) == record


def test_every_state_round_trips() -> None:
    assert {r.state for r in EXAMPLES} == set(State)
    assert {s.value for s in State} == {
        "free",
        "owned",
        "assigning",
        "releasing",
        "splitting",
        "merging",
        "deleted",
    }
    assert frozenset({State.ASSIGNING, State.RELEASING, State.SPLITTING, State.MERGING}) == IN_FLIGHT
    assert [s for s in State if s.in_flight] == [
        State.ASSIGNING,
        State.RELEASING,
        State.SPLITTING,
        State.MERGING,
    ]


def test_tombstone_encodes_as_none() -> None:
    assert encode(None) is None


@pytest.mark.parametrize("field", FIELDS)
def test_missing_required_field_is_malformed(field: str) -> None:
    d = json.loads(wire())
    del d[field]
    assert decode(json.dumps(d).encode()) == Skip("malformed")


def test_unknown_state_and_future_schema() -> None:
    assert decode(wire(state="migrating")) == Skip("unknown_state")
    assert decode(wire(state="OWNED")) == Skip("unknown_state")
    assert decode(wire(schema=2)) == Skip("future_schema")
    assert decode(wire(schema=99, state="migrating")) == Skip("future_schema")
    assert decode(wire(schema=2, version=0)) == Skip("future_schema")


@pytest.mark.parametrize("schema", [0, -1, "1", True, 1.0, None, [1]])
@pytest.mark.parametrize("state", ["owned", "migrating"])
def test_bad_schema_is_malformed(schema: Any, state: str) -> None:
    assert decode(wire(schema=schema, state=state)) == Skip("malformed")


@pytest.mark.parametrize(
    "overrides",
    [
        {"version": 0},
        {"version": -1},
        {"version": True},
        {"version": "4"},
        {"version": 1.5},
        {"version": 2.0},
        {"dst": ""},
        {"src": ""},
        {"dst": 5},
        {"force": 0},
        {"force": "false"},
        {"ts": "now"},
        {"ts": 1.5},
        {"writer": None},
        {"state": None},
        {"state": 1},
        {"children": {"0x00000000_0x80000000": ""}},
        {"children": ["0x00000000_0x80000000"]},
        {"children": {"0x00000000_0x80000000": 7}},
    ],
    ids=repr,
)
def test_wrong_field_types_are_malformed(overrides: dict[str, Any]) -> None:
    assert decode(wire(**overrides)) == Skip("malformed")


def test_extra_fields_are_ignored() -> None:
    plain = decode(wire())
    assert isinstance(plain, Record)
    assert decode(wire(future_field={"nested": [1, 2, {"x": None}]}, another=7)) == plain


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"   ",
        b"null",
        b"[]",
        b"42",
        b'"owned"',
        b"{",
        b'{"schema":1',
        b"NaN",
        wire()[:-1],
        wire() + b"x",
        b'{"schema":1,"state":"owned","dst":"b","src":null,"version":1,"force":false,"ts":NaN,"writer":"w"}',
    ],
)
def test_not_a_record_is_malformed(raw: bytes) -> None:
    assert decode(raw) == Skip("malformed")


@pytest.mark.parametrize("depth", [33, 100, 999, 1000, 1001, 5000, 30_000])
def test_deep_nesting_is_skipped_not_raised(depth: int) -> None:
    """Nesting beyond 32 levels is refused by a fixed rule, wherever it is (msgspec alone would raise
    RecursionError at a depth that depends on the caller's stack)."""
    nested = b"[" * depth + b"]" * depth
    assert decode(b'{"extra":' + nested + b"}") == Skip("too_deep")
    assert decode(nested) == Skip("too_deep")
    assert decode(wire()[:-1] + b', "extra": ' + nested + b"}") == Skip("too_deep")


def test_nesting_within_the_limit_is_fine_in_unknown_fields() -> None:
    nested = b"[" * 31 + b"]" * 31  # 31 arrays inside the record object: 32 levels
    rec = decode(wire()[:-1] + b', "extra": ' + nested + b"}")
    assert isinstance(rec, Record)
    assert decode(wire()[:-1] + b', "extra": [' + nested + b"]}") == Skip("too_deep")


def test_record_from_json() -> None:
    record = EXAMPLES[5]
    assert record_from_json(record.to_json()) == record
    assert record_from_json({"schema": 2}) == Skip("future_schema")
    assert record_from_json({"schema": 1, "state": "gone"}) == Skip("unknown_state")
    assert record_from_json({"schema": True, "state": "owned"}) == Skip("malformed")
    assert record_from_json([1, 2]) == Skip("malformed")
    assert record_from_json(None) == Skip("malformed")


def test_owner_and_names() -> None:
    free, owned, assigning, _, releasing, splitting, deleted, _, merging = EXAMPLES
    assert owned.owner() == "b1:1"
    assert splitting.owner() == "b1:1"  # the source keeps serving while it splits
    assert merging.owner() == "b1:1"  # ... and while it merges
    for r in (free, assigning, releasing, deleted):
        assert r.owner() is None
    assert releasing.names("b1:1") and releasing.names("b2:2") and not releasing.names("b3:3")
    assert not owned.names("b2:2")


def test_intern_brokers_keeps_the_record_equal() -> None:
    r = decode(wire(dst="b1:1", src="b2:2", state="assigning"))
    assert isinstance(r, Record)
    interned = intern_brokers(r)
    assert interned == r
    again = intern_brokers(decode(wire(dst="b1:1", src="b2:2", state="assigning")))  # type: ignore[arg-type]
    assert again.dst is interned.dst and again.src is interned.src


def test_records_are_immutable() -> None:
    with pytest.raises(AttributeError):
        EXAMPLES[1].dst = "b9:9"  # type: ignore[misc]


# ---------------------------------------------------------------------------------------- properties

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=25,
)
brokers = st.none() | st.text(min_size=1, max_size=12)


@st.composite
def record_like(draw: Any) -> dict[str, Any]:
    """Dicts close to a record: some fields dropped, replaced by arbitrary JSON, or added."""
    d = json.loads(wire())
    for f in draw(st.lists(st.sampled_from(FIELDS), max_size=3)):
        d.pop(f, None)
    for f in draw(st.lists(st.sampled_from(FIELDS), max_size=3)):
        d[f] = draw(json_values)
    d.update(draw(st.dictionaries(st.text(max_size=8), json_values, max_size=3)))
    return d


def _check(result: object) -> None:
    assert isinstance(result, (Record, Skip))
    if isinstance(result, Skip):
        assert result.reason in SKIP_REASONS
        assert result.reason not in ("bad_key", "wrong_partition")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_decode_arbitrary_bytes_never_raises(raw: bytes) -> None:
    _check(decode(raw))


@settings(max_examples=300, deadline=None)
@given(st.one_of(json_values, record_like()))
def test_decode_arbitrary_json_never_raises(value: Any) -> None:
    raw = json.dumps(value).encode()  # json.dumps may write NaN/Infinity: not JSON either
    _check(decode(raw))
    assert decode(raw) == decode_strict(raw)


@settings(deadline=None)
@given(
    state=st.sampled_from(list(State)),
    version=st.integers(1, 2**63 - 1),
    ts=st.integers(-(2**63), 2**63 - 1),
    writer=st.text(max_size=20),
    dst=brokers,
    src=brokers,
    force=st.booleans(),
    children=st.none() | st.dictionaries(st.text(max_size=22), brokers, max_size=3),
)
def test_encode_decode_round_trip(
    state: State,
    version: int,
    ts: int,
    writer: str,
    dst: str | None,
    src: str | None,
    force: bool,
    children: dict[str, str | None] | None,
) -> None:
    r = make(state, version=version, ts=ts, writer=writer, dst=dst, src=src, force=force, children=children)
    raw = encode(r)
    assert raw is not None
    assert decode(raw) == r
    assert decode_strict(raw) == r
    assert record_from_json(r.to_json()) == r
    assert json.loads(raw) == r.to_json()
    assert msgspec.json.decode(raw) == r.to_json()
