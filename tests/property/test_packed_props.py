"""Packed settled records (channel/packed.py) and the table that keeps them (channel/table.py).

A Packer turns a settled record into one int and back; every record that packs must come back equal in
every field, with the same field types and the same wire bytes, however many other records (and broker
ids) the same Packer numbered in between. A table that packs must read exactly like a plain dict of the
records it accepted: the model below replays the same messages with channel.resolve into such a dict.
"""

from __future__ import annotations

import operator
from typing import Any

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from strategies import records as proto_records

from trimtab.channel.bundles import parse_bundle
from trimtab.channel.packed import Packer
from trimtab.channel.records import (
    IN_FLIGHT,
    MAX_RECORD_BYTES,
    Record,
    Skip,
    State,
    decode,
    encode,
    make,
)
from trimtab.channel.resolve import ACCEPT, resolve
from trimtab.channel.strictjson import INT64_MAX, INT64_MIN
from trimtab.channel.table import TableView

SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=SLOW_OK)
TABLE_SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=SLOW_OK)

SETTLED = frozenset({State.OWNED, State.FREE, State.DELETED})

# ------------------------------------------------------------------------------------------ strategies

# Broker ids: any non-empty text (non-ASCII, control characters, astral planes), a few shared ones, and
# very long ones (up to 6 000 characters).
broker_text = st.one_of(
    st.sampled_from(["b1:1", "b2:2", "\u00fcber:1", "\u540d\u524d:9", "\U0001f642", "\x00", " "]),
    st.text(min_size=1, max_size=24),
    st.builds(operator.mul, st.text(min_size=1, max_size=3), st.integers(300, 2000)),
)
brokers = st.one_of(st.none(), broker_text)
writers = st.one_of(st.just(""), st.text(max_size=8), broker_text)
versions = st.one_of(
    st.sampled_from([1, 2, 255, 256, 2**16, 2**32, 2**62, INT64_MAX - 1, INT64_MAX]),
    st.integers(1, INT64_MAX),
)
timestamps = st.one_of(
    st.sampled_from([INT64_MIN, INT64_MIN + 1, -1, 0, 1, 2**32, INT64_MAX - 1, INT64_MAX]),
    st.integers(INT64_MIN, INT64_MAX),
)
children = st.one_of(
    st.none(),
    st.none(),
    st.none(),
    st.dictionaries(st.text(max_size=24), brokers, max_size=3),
)

valid_records = st.one_of(
    st.builds(
        make,
        st.sampled_from(list(State)),
        version=versions,
        ts=timestamps,
        writer=writers,
        dst=brokers,
        src=brokers,
        force=st.booleans(),
        children=children,
    ),
    proto_records(),
)


def settled(r: Record) -> bool:
    return r.state in SETTLED and r.children is None


def assert_same(got: Record | None, want: Record | None) -> None:
    """Equal in value, in every field's type and in wire bytes (catches 1 for True, a str subclass...)."""
    assert got == want
    if got is None or want is None:
        return
    for name in Record.__struct_fields__:
        assert type(getattr(got, name)) is type(getattr(want, name)), name
    assert got.state is want.state
    assert encode(got) == encode(want)


# ------------------------------------------------------------------------------------------ the packer


@SETTINGS
@given(r=valid_records)
def test_pack_round_trips_every_settled_record_and_only_those(r: Record) -> None:
    """pack gives None exactly for records in flight or with children; any other record unpacks equal,
    with the same field types and byte-identical wire form."""
    packer = Packer()
    packed = packer.pack(r)
    if r.state in IN_FLIGHT or r.children is not None:
        assert packed is None
        assert len(packer) == 0
        return
    assert type(packed) is int
    back = packer.unpack(packed)
    assert_same(back, r)
    assert back.children is None
    assert packer.owner(packed) == (r.dst if r.state is State.OWNED else None)
    assert len(packer) == len({r.dst, r.src, r.writer} - {None})


@SETTINGS
@given(
    batch=st.lists(st.tuples(valid_records, st.booleans()), min_size=1, max_size=40),
    pool=st.lists(broker_text, min_size=1, max_size=6, unique=True),
    data=st.data(),
)
def test_one_packer_keeps_every_packed_value_readable_as_it_numbers_more_ids(
    batch: list[tuple[Record, bool]], pool: list[str], data: st.DataObject
) -> None:
    """Records packed one after another by one Packer, sharing broker ids (a small pool) and bringing new
    ones: after every pack, every value packed so far still unpacks to its record; the Packer numbers
    each distinct id once."""
    packer = Packer()
    kept: list[tuple[int, Record]] = []
    numbered: set[str] = set()
    for r, share in batch:
        if share:  # the same ids again, in other fields
            pick = st.one_of(st.none(), st.sampled_from(pool))
            r = make(
                r.state,
                version=r.version,
                ts=r.ts,
                writer=data.draw(st.sampled_from(pool)),
                dst=data.draw(pick),
                src=data.draw(pick),
                force=r.force,
                children=r.children,
            )
        packed = packer.pack(r)
        assert (packed is None) == (not settled(r))
        if packed is not None:
            kept.append((packed, r))
            numbered |= {r.dst, r.src, r.writer} - {None}  # type: ignore[arg-type]
        for p, want in kept:
            assert_same(packer.unpack(p), want)
        assert len(packer) == len(numbered)


@SETTINGS
@given(r=valid_records)
def test_a_record_decoded_from_the_wire_packs_and_unpacks_to_itself(r: Record) -> None:
    """decode(encode(r)) is r, and it packs (when settled) and unpacks to the same record, with the same
    types and wire bytes."""
    raw = encode(r)
    assert raw is not None
    assume(len(raw) <= MAX_RECORD_BYTES)
    decoded = decode(raw)
    assert not isinstance(decoded, Skip)
    assert_same(decoded, r)
    packer = Packer()
    packed = packer.pack(decoded)
    assert (packed is None) == (not settled(r))
    if packed is not None:
        back = packer.unpack(packed)
        assert_same(back, decoded)
        assert encode(back) == raw


class _Str(str):
    """A str subclass, as code (not a decoder) might build a broker id."""


odd_ints = st.one_of(
    st.sampled_from([0, -1, INT64_MAX + 1, INT64_MIN - 1, 2**64, -(2**64), 2**200, -(2**200)]),
    st.integers(),
)
odd_versions = st.one_of(odd_ints, versions, st.sampled_from([True, False, 1.0, 2.5, "1", None]))
odd_timestamps = st.one_of(odd_ints, timestamps, st.sampled_from([True, False, 0.0, -1.5, "0", None]))
odd_force = st.sampled_from([True, False, 0, 1, None, "true", 1.0])
odd_brokers = st.one_of(
    brokers,
    st.sampled_from(["", 0, 1, -1, 2**70, True, False, 1.5, b"b1:1", ("b1:1",), frozenset(), State.OWNED]),
    st.integers(),
    st.builds(_Str, broker_text),
)
odd_states = st.one_of(st.sampled_from(list(State)), st.sampled_from(["owned", "free", "deleted", 0, None]))


@SETTINGS
@given(
    state=odd_states,
    version=odd_versions,
    ts=odd_timestamps,
    force=odd_force,
    dst=odd_brokers,
    src=odd_brokers,
    writer=st.one_of(writers, odd_brokers),
    kids=children,
    warm=st.lists(valid_records, max_size=3),
)
def test_a_record_built_in_code_never_makes_pack_raise_nor_unpack_differ(
    state: Any, version: Any, ts: Any, force: Any, dst: Any, src: Any, writer: Any, kids: Any, warm: Any
) -> None:
    """A record built in code may hold anything the protocol refuses (ts beyond int64, version 0 or
    negative or not an int, a non-bool force, non-str broker ids, a plain string for a state): pack never
    raises; it returns None, or an int that unpacks to a record equal to the one packed."""
    packer = Packer()
    for w in warm:  # some ids already numbered
        packer.pack(w)
    r = Record(1, state, dst, src, version, force, ts, writer, kids)
    packed = packer.pack(r)
    if packed is not None:
        assert type(packed) is int
        back = packer.unpack(packed)
        assert back == r
        assert type(back.version) is type(r.version)
        assert type(back.ts) is type(r.ts)
        assert back.force is r.force
        assert back.state is r.state
    for w in warm:  # and what was packed before still reads back
        p = packer.pack(w)
        if p is not None:
            assert_same(packer.unpack(p), w)


# ------------------------------------------------------------------------------------------ the table

KEYS = (
    "tenant/ns/0x00000000_0x80000000",
    "tenant/ns/0x80000000_0xffffffff",
    "tenant/ns/0x00000000_0xffffffff",
    "tenant/ns2/0x40000000_0x80000000",
)
ID_POOL = ("b1:1", "b2:2", "\u00fcber:1", "\U0001f642:7", "x" * 300, "")


def split_children(key: str, owner: str | None) -> dict[str, str | None]:
    rng = parse_bundle(key)[1]
    cut = rng.lower + (rng.upper - rng.lower) // 2
    return {f"0x{rng.lower:08x}_0x{cut:08x}": owner, f"0x{cut:08x}_0x{rng.upper:08x}": owner}


def merge_children(key: str, owner: str | None) -> dict[str, str | None]:
    rng = parse_bundle(key)[1]
    if rng.upper < 0xFFFFFFFF:
        return {f"0x{rng.lower:08x}_0xffffffff": owner}
    return {f"0x00000000_0x{rng.upper:08x}": owner}


@st.composite
def next_record(draw: Any, key: str, cur: Record | None) -> Record | None:
    """A plausible next record of a bundle at ``cur``: mostly the next version, often forced (so any state
    with the right shape is accepted), with ids from a small shared pool and wide ts/writer values;
    sometimes stale, early, or a tombstone."""
    if draw(st.integers(0, 9)) == 0:
        return None
    base = 1 if cur is None else cur.version + 1
    version = max(1, base + draw(st.sampled_from([0, 0, 0, 0, 0, 0, -1, 1])))
    state = draw(st.sampled_from(list(State)))
    ids = st.one_of(st.none(), st.sampled_from(ID_POOL[:-1]), broker_text)
    dst, src = draw(ids), draw(ids)
    if cur is not None and draw(st.booleans()):  # continue the current brokers
        dst, src = cur.dst, cur.src
        if state is State.RELEASING:
            src, dst = cur.dst, draw(ids)
    kids: dict[str, str | None] | None = None
    if state is State.SPLITTING:
        kids = split_children(key, src)
    elif state is State.MERGING:
        kids = merge_children(key, src)
    elif draw(st.integers(0, 19)) == 0:
        kids = {}
    return make(
        state,
        version=version,
        ts=draw(timestamps),
        writer=draw(st.one_of(st.sampled_from(ID_POOL), writers)),
        dst=dst,
        src=src,
        force=draw(st.integers(0, 3)) > 0,
        children=kids,
    )


Heard = tuple[str, Record | None, Record | None]


def check(view: TableView, model: dict[str, Record]) -> None:
    """Every way of reading the table gives the model's records, in value, types and wire bytes."""
    assert len(view) == len(model)
    for key in KEYS:
        assert (key in view) == (key in model)
        assert_same(view.get(key), model.get(key))
    items = view.items()
    assert sorted(k for k, _ in items) == sorted(model)
    for k, r in items:
        assert_same(r, model[k])
    as_dict = view.as_dict()
    assert as_dict.keys() == model.keys()
    for k, r in as_dict.items():
        assert_same(r, model[k])
    states, positions = view.snapshot()
    assert positions == view.positions
    assert states.keys() == model.keys()
    for k, r in states.items():
        assert_same(r, model[k])
    assert view.packed_count() == sum(1 for r in model.values() if settled(r))
    owners = sorted((k, r.dst) for k, r in model.items() if r.state is State.OWNED and r.dst is not None)
    assert sorted(view.owned()) == owners


@TABLE_SETTINGS
@given(data=st.data(), steps=st.integers(1, 40))
def test_a_packing_table_reads_like_a_dict_of_the_records_it_accepted(
    data: st.DataObject, steps: int
) -> None:
    """Random replays (TableView.apply of encoded records, tombstones included), loads of random states,
    reloads of its own snapshot and set_live, in any order: after each step, get / items / as_dict /
    snapshot give exactly a plain dict of the last accepted record per key (built by applying
    channel.resolve to the same messages), each apply has the outcome that model decides, and once live
    listeners hear exactly (key, old, new) of each accepted record."""
    view = TableView()
    heard: list[Heard] = []
    view.add_listener(lambda k, old, new: heard.append((k, old, new)))
    model: dict[str, Record] = {}
    live = False
    accepted = max_packed = 0
    for _ in range(steps):
        op = data.draw(st.sampled_from(["apply"] * 8 + ["load", "reload", "live"]))
        if op == "load":
            states = data.draw(st.dictionaries(st.sampled_from(KEYS), valid_records, max_size=len(KEYS)))
            view.load(states, {})
            model, live = dict(states), False
        elif op == "reload":
            snap, positions = view.snapshot()
            view.load(snap, positions)
            live = False
        elif op == "live":
            view.set_live()
            live = True
        else:
            key = data.draw(st.sampled_from(KEYS))
            cur = model.get(key)
            value = encode(data.draw(next_record(key, cur)))
            new = None if value is None else decode(value)  # a version past INT64_MAX is skipped
            n_heard = len(heard)
            outcome = view.apply(key.encode(), value, None, None)
            if isinstance(new, Skip):
                assert outcome == "skipped", new
                check(view, model)
                continue
            verdict = resolve(parse_bundle(key)[1], cur, new)
            assert outcome == ("accepted" if verdict is ACCEPT else "rejected"), verdict
            if verdict is ACCEPT:
                accepted += 1
                if new is None:
                    del model[key]
                else:
                    model[key] = new
                if live:
                    assert len(heard) == n_heard + 1
                    k, old, got = heard[-1]
                    assert k == key
                    assert_same(old, cur)
                    assert_same(got, new)
            assert len(heard) == n_heard + (1 if live and verdict is ACCEPT else 0)
        check(view, model)
        max_packed = max(max_packed, view.packed_count())
    event(f"accepted applies: {'0' if not accepted else '1-4' if accepted < 5 else '5+'}")
    event(f"most bundles packed at once: {min(max_packed, 3)}")
