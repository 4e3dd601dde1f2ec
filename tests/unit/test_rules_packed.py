"""Packed settled records: the rules of channel/packed.py and of their use in channel/table.py.

A table keeps each settled record (owned, free, deleted, without children) as one int numbered by its own
Packer and makes the record again on every read; records in flight and records with children stay objects.
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

import pytest

from trimtab.channel.packed import MAX_IDS, Packer
from trimtab.channel.records import IN_FLIGHT, Record, State, encode, make
from trimtab.channel.strictjson import INT64_MAX, INT64_MIN
from trimtab.channel.table import TableView, partition_for

K = "tenant/ns/0x00000000_0x80000000"
K2 = "tenant/ns/0x80000000_0xffffffff"
K3 = "tenant/ns2/0x00000000_0xffffffff"
K4 = "tenant/ns3/0x00000000_0xffffffff"
K5 = "tenant/ns4/0x00000000_0xffffffff"
K6 = "tenant/ns5/0x00000000_0xffffffff"
SETTLED = (State.OWNED, State.FREE, State.DELETED)
FLYING = tuple(s for s in State if s in IN_FLIGHT)

Heard = tuple[str, Record | None, Record | None]


def fresh(text: str) -> str:
    """An equal string that is a new object (never the interned one)."""
    out = text.encode().decode()
    assert out == text
    return out


def unique(prefix: str) -> str:
    """A broker id no other test (nor the interpreter) has seen: the first object of it is ours."""
    return f"{prefix}-{uuid.uuid4().hex}-\u00fc:1"


def owned(version: int = 1, **kw: Any) -> Record:
    fields: dict[str, Any] = {"ts": 5, "writer": "w", "dst": "a:1", **kw}
    return make(State.OWNED, version=version, **fields)


def wire(record: Record) -> bytes:
    raw = encode(record)
    assert raw is not None
    return raw


def round_trip(record: Record) -> Record:
    packer = Packer()
    packed = packer.pack(record)
    assert type(packed) is int
    return packer.unpack(packed)


def assert_same(got: Record, want: Record) -> None:
    """Equal in value, in every field's type and in wire bytes."""
    assert got == want
    for name in Record.__struct_fields__:
        assert type(getattr(got, name)) is type(getattr(want, name)), name
    assert got.state is want.state
    assert encode(got) == encode(want)


def apply(view: TableView, key: str, record: Record | None) -> str:
    return view.apply(key.encode(), encode(record), None, None)


# ------------------------------------------------------------------------------------- field boundaries


@pytest.mark.parametrize("ts", [INT64_MIN, INT64_MIN + 1, -1, 0, 1, INT64_MAX - 1, INT64_MAX])
def test_the_timestamp_round_trips_over_the_whole_signed_64_bit_range(ts: int) -> None:
    """Rule: ts is kept over the protocol's whole range; INT64_MIN and INT64_MAX come back exactly, as
    ints, and the record's wire bytes are unchanged."""
    r = owned(ts=ts)
    back = round_trip(r)
    assert_same(back, r)
    assert back.ts == ts


@pytest.mark.parametrize("version", [1, 2, 2**32, 2**63 - 2, INT64_MAX])
def test_the_version_round_trips_from_1_to_int64_max(version: int) -> None:
    """Rule: version is kept exactly from 1 to INT64_MAX (the bits above the timestamp, any size)."""
    for ts in (INT64_MIN, 0, INT64_MAX):  # the version's bits sit right above the timestamp's
        r = owned(version, ts=ts)
        back = round_trip(r)
        assert_same(back, r)
        assert back.version == version
        assert back.ts == ts


@pytest.mark.parametrize("force", [True, False])
def test_force_round_trips_as_a_bool(force: bool) -> None:
    """Rule: force comes back as the bool it was (not 0/1, not the flag's bit value)."""
    for state in SETTLED:
        r = make(state, version=3, ts=-7, writer="leader", dst="a:1", src="b:2", force=force)
        back = round_trip(r)
        assert back.force is force
        assert_same(back, r)


@pytest.mark.parametrize("dst", [None, "a:1"])
@pytest.mark.parametrize("src", [None, "b:2"])
def test_dst_and_src_round_trip_set_or_none(dst: str | None, src: str | None) -> None:
    """Rule: dst and src are each kept as None or as the broker id, independently of each other."""
    for state in SETTLED:
        r = make(state, version=2, ts=9, writer="w", dst=dst, src=src)
        back = round_trip(r)
        assert back.dst == dst
        assert back.src == src
        assert_same(back, r)


def test_dst_src_and_writer_may_name_the_same_broker() -> None:
    """Rule: one broker id in several fields is numbered once and comes back in each of them."""
    packer = Packer()
    r = make(State.DELETED, version=4, ts=1, writer="x:1", dst="x:1", src="x:1")
    packed = packer.pack(r)
    assert packed is not None
    assert len(packer) == 1
    assert_same(packer.unpack(packed), r)


def test_an_empty_writer_and_non_ascii_or_long_ids_round_trip() -> None:
    """Rule: the writer may be "" (any str on the wire) and broker ids any non-empty str, non-ASCII and
    long ones included."""
    long_id = "\u00e9\u4e2d\U0001f642" * 5000
    r = make(State.FREE, version=1, ts=0, writer="", dst="\u00fc\u00f1\u00ee:\u0663", src=long_id)
    assert_same(round_trip(r), r)


# ------------------------------------------------------------------------------------- what is packed


@pytest.mark.parametrize("state", FLYING)
def test_a_record_in_flight_is_not_packed(state: State) -> None:
    """Rule: assigning, releasing, splitting and merging records stay objects (pack returns None), with or
    without children, and number no broker id."""
    packer = Packer()
    for children in (None, {"0x00000000_0x40000000": "a:1", "0x40000000_0x80000000": None}):
        r = make(state, version=2, ts=3, writer="w", dst="a:1", src="b:2", children=children)
        assert packer.pack(r) is None
    assert len(packer) == 0


@pytest.mark.parametrize("state", SETTLED)
def test_a_settled_record_is_packed(state: State) -> None:
    """Rule: owned, free and deleted records without children are packed into an int."""
    packer = Packer()
    r = make(state, version=2, ts=3, writer="w", dst="a:1", src="b:2")
    packed = packer.pack(r)
    assert type(packed) is int
    assert_same(packer.unpack(packed), r)


@pytest.mark.parametrize("state", SETTLED)
@pytest.mark.parametrize("children", [{}, {"0x00000000_0xffffffff": None}, {"0x00000000_0x80000000": "a:1"}])
def test_a_settled_record_with_children_is_not_packed(state: State, children: dict[str, str | None]) -> None:
    """Rule: a record carrying children -- even an empty dict -- stays an object, whatever its state."""
    packer = Packer()
    r = make(state, version=2, ts=3, writer="w", dst="a:1", children=children)
    assert packer.pack(r) is None
    assert len(packer) == 0


@pytest.mark.parametrize(
    "record",
    [
        owned(ts=INT64_MAX + 1),
        owned(ts=INT64_MIN - 1),
        owned(ts=2**200),
        owned(version=-1),
        owned(version=True),
        owned(version=2.0),  # type: ignore[arg-type]  # built in code: out of the protocol's types
        owned(ts=1.5),
        owned(ts=False),
        owned(force=1),
        owned(force=None),
        owned(dst=7),
        owned(dst=b"a:1"),
        owned(src=("a", 1)),
        owned(writer=3),
        make("owned", version=1, ts=0, writer="w", dst="a:1"),  # type: ignore[arg-type]  # a str, not a State
    ],
    ids=repr,
)
def test_a_record_built_outside_the_protocol_ranges_stays_an_object(record: Record) -> None:
    """Rule: a record built in code with a field outside the protocol's ranges or types (ts beyond int64,
    a negative or non-int version, a non-bool force, a non-str broker id, a state that is not a State) is
    not packed: pack returns None and does not raise."""
    assert Packer().pack(record) is None


@pytest.mark.parametrize(
    "record", [owned(version=0), owned(version=INT64_MAX + 1), owned(version=2**300), owned(dst="")], ids=repr
)
def test_a_record_built_in_code_that_packs_unpacks_equal(record: Record) -> None:
    """Rule: whatever a record built in code holds, if pack gives an int then unpack gives the record back
    (version 0, versions beyond int64 and an empty broker id pack and round-trip)."""
    packer = Packer()
    packed = packer.pack(record)
    if packed is not None:
        assert_same(packer.unpack(packed), record)


@pytest.mark.parametrize("broker", [["a:1"], {"a": 1}], ids=["list", "dict"])
def test_a_record_built_in_code_with_an_unhashable_broker_id_stays_an_object(broker: Any) -> None:
    """Rule (packed.py: "one built in code may not be [in range], and stays an object"): a broker id that
    is not a str stays an object instead of raising -- an unhashable one (a list, a dict) included.
    Known bug: Packer.pack looks the id up in its index first, and an unhashable key raises TypeError."""
    assert Packer().pack(owned(dst=broker)) is None


# ------------------------------------------------------------------------------------- broker ids


def test_len_counts_the_broker_ids_numbered_so_far() -> None:
    """Rule: len(packer) is the number of distinct broker ids numbered: None is never one, an id is
    numbered once, and a record that is not packed for its state or children numbers none."""
    packer = Packer()
    assert len(packer) == 0
    packer.pack(make(State.FREE, version=1, ts=0, writer="w"))
    assert len(packer) == 1  # the writer; dst and src None
    packer.pack(make(State.OWNED, version=1, ts=0, writer="w", dst="a:1"))
    assert len(packer) == 2
    packer.pack(make(State.OWNED, version=2, ts=0, writer="a:1", dst="w", src="a:1"))
    assert len(packer) == 2
    packer.pack(make(State.ASSIGNING, version=3, ts=0, writer="x", dst="y", src="z"))
    packer.pack(make(State.OWNED, version=3, ts=0, writer="x", dst="y", src="z", children={}))
    assert len(packer) == 2
    packer.pack(make(State.DELETED, version=3, ts=0, writer="x", dst="y", src="z"))
    assert len(packer) == 5


def test_exactly_max_ids_broker_ids_are_numbered_and_the_next_new_one_stays_an_object() -> None:
    """Rule: a Packer numbers exactly MAX_IDS (65 535) distinct broker ids; past that a record naming a new
    id is not packed (pack returns None, len stays MAX_IDS), while records naming only numbered ids still
    pack -- and every value packed before still unpacks to its record, in every field."""
    assert MAX_IDS == 65_535
    packer = Packer()
    ids = [f"b{i}:{i % 7}" for i in range(MAX_IDS + 2)]
    kept: list[tuple[int, Record]] = []
    for i in range(MAX_IDS):
        # A new dst each time; src and writer name ids numbered earlier (high numbers in every field).
        r = make(SETTLED[i % 3], version=i + 1, ts=-i, writer=ids[i // 3], dst=ids[i], src=ids[i // 2])
        packed = packer.pack(r)
        assert packed is not None, i
        kept.append((packed, r))
    assert len(packer) == MAX_IDS
    top = ids[MAX_IDS - 1]
    newcomer = make(State.OWNED, version=1, ts=0, writer="w-none", dst=ids[MAX_IDS])
    assert packer.pack(newcomer) is None
    assert packer.pack(make(State.OWNED, version=1, ts=0, writer=top, dst=top, src=ids[MAX_IDS + 1])) is None
    assert packer.pack(make(State.OWNED, version=1, ts=0, writer=ids[MAX_IDS + 1], dst=top)) is None
    assert len(packer) == MAX_IDS
    late = make(State.FREE, version=INT64_MAX, ts=INT64_MAX, writer=top, dst=ids[1], src=top, force=True)
    packed = packer.pack(late)
    assert packed is not None
    kept.append((packed, late))
    for packed, r in kept:
        assert packer.unpack(packed) == r
    assert_same(packer.unpack(kept[-2][0]), kept[-2][1])
    assert_same(packer.unpack(kept[-1][0]), kept[-1][1])


def test_unpacked_broker_ids_are_the_interned_strings_shared_by_every_unpack() -> None:
    """Rule: unpacking gives, in dst, src and writer, the one interned string of each id -- the same object
    on every unpack, whichever record named it, not the copy the record was packed with."""
    names = [unique(p) for p in ("dst", "src", "writer")]
    canon = [sys.intern(fresh(n)) for n in names]  # the interned objects, made before any packing
    packer = Packer()
    r1 = make(State.OWNED, version=1, ts=0, writer=fresh(names[2]), dst=fresh(names[0]), src=fresh(names[1]))
    r2 = make(State.FREE, version=2, ts=0, writer=fresh(names[2]), dst=None, src=fresh(names[0]))
    p1, p2 = packer.pack(r1), packer.pack(r2)
    assert p1 is not None and p2 is not None
    a, b, c = packer.unpack(p1), packer.unpack(p1), packer.unpack(p2)
    assert a == r1 and c == r2
    assert a.dst is canon[0] and a.src is canon[1] and a.writer is canon[2]
    assert a.dst is not r1.dst
    assert b.dst is a.dst and b.src is a.src and b.writer is a.writer
    assert c.src is a.dst and c.writer is a.writer
    for s in (a.dst, a.src, a.writer):
        assert sys.intern(s) is s


# ------------------------------------------------------------------------------------- the table


def test_get_makes_a_settled_record_again_and_returns_an_in_flight_one_itself() -> None:
    """Rule: a settled record is held packed, so get returns a record equal to the applied one but not the
    same object (a new one on each read); a record in flight is held as is: get returns the very object
    applied (the one listeners heard), every time."""
    view = TableView()
    heard: list[Heard] = []
    view.add_listener(lambda k, old, new: heard.append((k, old, new)))
    view.set_live()
    assigning = make(State.ASSIGNING, version=1, ts=1, writer="w", dst="a:1")
    assert apply(view, K, assigning) == "accepted"
    flying = heard[-1][2]
    assert flying == assigning
    assert view.get(K) is flying
    assert view.get(K) is view.get(K)
    settled = make(State.OWNED, version=2, ts=2, writer="w", dst="a:1")
    assert apply(view, K, settled) == "accepted"
    got = view.get(K)
    assert got is not None
    assert_same(got, settled)
    assert got is not heard[-1][2]
    assert view.get(K) is not got


def test_get_returns_the_loaded_object_for_a_record_that_stays_one() -> None:
    """Rule: after load, records in flight or with children are the objects given to load; settled ones
    are equal records made again."""
    flying = make(State.RELEASING, version=3, ts=1, writer="w", src="a:1")
    with_children = make(State.OWNED, version=2, ts=1, writer="w", dst="a:1", children={})
    settled = owned(4)
    view = TableView()
    view.load({K: flying, K2: with_children, K3: settled}, {})
    assert view.get(K) is flying
    assert view.get(K2) is with_children
    got = view.get(K3)
    assert got is not None
    assert got is not settled
    assert_same(got, settled)


def test_packed_count_counts_exactly_the_settled_bundles_without_children() -> None:
    """Rule: packed_count is the number of bundles held packed: owned, free and deleted records without
    children; records in flight and records with children are not counted, and it follows every change."""
    view = TableView()
    assert view.packed_count() == 0
    states = {
        K: owned(),
        K2: make(State.FREE, version=2, ts=0, writer="w"),
        K3: make(State.DELETED, version=3, ts=0, writer="w", src="a:1"),
        K4: make(State.ASSIGNING, version=1, ts=0, writer="w", dst="a:1"),
        K5: make(State.SPLITTING, version=2, ts=0, writer="w", src="a:1", children={"0x0_0x1": None}),
        K6: make(State.OWNED, version=2, ts=0, writer="w", dst="a:1", children={}),
    }
    view.load(states, {})
    assert view.packed_count() == 3
    # owned -> releasing (in flight): one fewer packed
    assert apply(view, K, make(State.RELEASING, version=2, ts=0, writer="w", src="a:1")) == "accepted"
    assert view.packed_count() == 2
    # releasing -> free (settled): back to three
    assert apply(view, K, make(State.FREE, version=3, ts=0, writer="w", src="a:1")) == "accepted"
    assert view.packed_count() == 3
    # assigning -> owned: four
    assert apply(view, K4, make(State.OWNED, version=2, ts=0, writer="w", dst="a:1")) == "accepted"
    assert view.packed_count() == 4
    # a tombstone after free: the bundle is gone
    assert apply(view, K2, None) == "accepted"
    assert view.packed_count() == 3
    assert len(view) == 5


def test_the_replay_reads_a_packed_current_record_before_deciding() -> None:
    """Rule: the record a new one is resolved against is the packed one made again, every field intact:
    the owner (dst) can release, the next version is accepted and a stale or foreign one rejected."""
    view = TableView()
    owner = "\u00f6wner:1"
    assert apply(view, K, make(State.OWNED, version=1, ts=INT64_MIN, writer="w", dst=owner)) == "accepted"
    assert view.packed_count() == 1
    stale = make(State.RELEASING, version=1, ts=0, writer="w", src=owner)
    assert apply(view, K, stale) == "rejected"
    assert view.stats.rejected == {"stale_version": 1}
    foreign = make(State.RELEASING, version=2, ts=0, writer="w", src="other:1")
    assert apply(view, K, foreign) == "rejected"
    assert view.stats.rejected["broker_mismatch"] == 1
    assert apply(view, K, make(State.RELEASING, version=2, ts=0, writer="w", src=owner)) == "accepted"


def test_load_gives_the_same_records_through_get_items_as_dict_and_snapshot() -> None:
    """Rule: after load(states, positions), get of every key, items(), as_dict() and snapshot() all give
    exactly the loaded records (field types and wire bytes included) and the positions."""
    states = {
        K: make(State.OWNED, version=INT64_MAX, ts=INT64_MIN, writer="", dst="\u00e4:1", force=True),
        K2: make(State.FREE, version=1, ts=INT64_MAX, writer="w", src="b:2"),
        K3: make(State.DELETED, version=7, ts=-1, writer="leader", dst="a:1", src="b:2"),
        K4: make(State.MERGING, version=2, ts=0, writer="w", src="a:1", children={"0x0_0x1": "a:1"}),
    }
    view = TableView()
    view.load(states, {0: 12, 3: 4})
    assert view.packed_count() == 3
    assert len(view) == len(states)
    for k, r in states.items():
        got = view.get(k)
        assert got is not None
        assert_same(got, r)
    items = view.items()
    assert [k for k, _ in items] == list(states)
    for k, r in items:
        assert_same(r, states[k])
    assert view.as_dict() == states
    snap, positions = view.snapshot()
    assert positions == {0: 12, 3: 4}
    assert snap == states
    for k, r in snap.items():
        assert_same(r, states[k])


def test_a_table_loading_another_tables_snapshot_numbers_only_the_loaded_ids() -> None:
    """Rule: each table numbers broker ids with its own Packer: a table that loads another table's states
    numbers only the ids of the loaded settled records (records in flight number none); the ids the other
    table numbered for records it no longer holds do not leak in."""
    first = TableView()
    for i in range(20):  # forty ids, then every one of these bundles is gone
        key = f"tenant/old{i}/0x00000000_0xffffffff"
        free = make(State.FREE, version=1, ts=0, writer=f"w{i}", dst=f"old{i}:1", force=True)
        assert apply(first, key, free) == "accepted"
        assert apply(first, key, None) == "accepted"
    assert len(first) == 0
    assert len(first._packer) == 40
    for key, r in {
        K: make(State.OWNED, version=1, ts=0, writer="w", dst="a:1"),
        K2: make(State.OWNED, version=1, ts=0, writer="w", dst="a:1"),
        K3: make(State.ASSIGNING, version=1, ts=0, writer="flying-writer", dst="flying:1"),
    }.items():
        assert apply(first, key, r) == "accepted"
    assert apply(first, K2, make(State.RELEASING, version=2, ts=0, writer="w", src="a:1")) == "accepted"
    assert apply(first, K2, make(State.FREE, version=3, ts=0, writer="w", src="a:1")) == "accepted"
    states, _ = first.snapshot()
    second = TableView()
    second.load(states, {})
    assert len(second._packer) == 2  # "a:1" and "w"; the assigning record's ids are not numbered
    assert second.as_dict() == states
    assert second.packed_count() == 2


def test_load_keeps_the_tables_numbering_so_values_read_before_it_still_unpack() -> None:
    """Rule: load keeps the table's Packer: ids it numbered stay numbered (len only grows) and a packed
    value a reader took from the table before the load still unpacks to its record after it, whatever
    the loaded states number; the loaded records' new ids are numbered after the known ones."""
    view = TableView()
    before = make(State.OWNED, version=9, ts=-3, writer="writer-old", dst="owner-old:1", src="src-old:1")
    assert apply(view, K, make(State.OWNED, version=1, ts=0, writer="w0", dst="z:1")) == "accepted"
    view.load({K: before}, {})
    held = view._table[K]
    assert type(held) is int
    numbered = len(view._packer)
    assert numbered == 5
    others = {f"tenant/c{i}/0x00000000_0xffffffff": owned(dst=f"c{i}:1", writer=f"wc{i}") for i in range(4)}
    view.load(others, {})
    assert len(view._packer) == numbered + 8
    assert view._packer.unpack(held) == before
    view.load({}, {})
    assert len(view._packer) == numbered + 8
    assert view._packer.unpack(held) == before


def test_listeners_hear_records_with_interned_broker_ids_once_live() -> None:
    """Rule: once live, the records listeners hear (new and old, settled or in flight) carry the interned
    broker-id strings, not the copies each message decoded into."""
    dst, src, writer = unique("dst"), unique("src"), unique("writer")
    canon = {sys.intern(fresh(s)) for s in (dst, src, writer)}  # interned before any message is read
    view = TableView()
    heard: list[Heard] = []
    view.add_listener(lambda k, old, new: heard.append((k, old, new)))
    view.set_live()
    flow = [
        make(State.ASSIGNING, version=1, ts=1, writer=writer, dst=dst),
        make(State.OWNED, version=2, ts=2, writer=writer, dst=dst),
        make(State.RELEASING, version=3, ts=3, writer=writer, src=dst, dst=src),
        make(State.ASSIGNING, version=4, ts=4, writer=writer, src=dst, dst=src),
        make(State.OWNED, version=5, ts=5, writer=writer, src=dst, dst=src),
    ]
    for r in flow:
        assert view.apply(K.encode(), wire(r), None, None) == "accepted"
    assert [new for _, _, new in heard] == flow
    assert [old for _, old, _ in heard] == [None, *flow[:-1]]
    for _, old, new in heard:
        for got in (old, new):
            if got is None:
                continue
            for s in (got.dst, got.src, got.writer):
                assert s is None or any(s is c for c in canon), s


def test_set_live_interns_the_broker_ids_of_the_records_that_stay_objects() -> None:
    """Rule: set_live replaces every record held as an object (in flight, with children) by an equal one
    with interned broker ids; settled records come back with interned ids too."""
    dst, src, writer = unique("dst"), unique("src"), unique("writer")
    canon = [sys.intern(fresh(s)) for s in (dst, src, writer)]
    flying = make(State.RELEASING, version=2, ts=0, writer=fresh(writer), src=fresh(src), dst=fresh(dst))
    settled = make(State.OWNED, version=2, ts=0, writer=fresh(writer), src=fresh(src), dst=fresh(dst))
    view = TableView()
    view.load({K: flying, K2: settled}, {})
    assert view.get(K) is flying
    view.set_live()
    for key, want in ((K, flying), (K2, settled)):
        got = view.get(key)
        assert got == want
        assert got is not None
        assert got.dst is canon[0] and got.src is canon[1] and got.writer is canon[2]


def test_snapshot_returns_the_records_items_returns() -> None:
    """Rule: snapshot's states equal items() record for record (settled ones made again, in flight ones
    as held), with the table's positions."""
    view = TableView(2)
    msgs = [
        (K, make(State.ASSIGNING, version=1, ts=1, writer="w", dst="a:1")),
        (K, make(State.OWNED, version=2, ts=2, writer="w", dst="a:1")),
        (K2, make(State.OWNED, version=1, ts=3, writer="w", dst="b:2")),
        (K3, make(State.ASSIGNING, version=1, ts=4, writer="w", dst="c:3")),
    ]
    offsets = {0: 0, 1: 0}
    for key, r in msgs:
        part = partition_for(key.encode(), 2)
        assert view.apply(key.encode(), wire(r), part, offsets[part]) == "accepted"
        offsets[part] += 1
    states, positions = view.snapshot()
    assert positions == view.positions == {p: n for p, n in offsets.items() if n}
    assert states == dict(view.items())
    assert states == {K: msgs[1][1], K2: msgs[2][1], K3: msgs[3][1]}
    for k, r in view.items():
        assert_same(states[k], r)


class _LoadLandsMidRead(dict[str, Any]):
    """A table dict whose reads let another thread's load() land right after them: the interleaving a
    reader thread meets when the feeder installs a snapshot (a history gap) while it reads."""

    def __init__(self, view: TableView, states: dict[str, Record], table: dict[str, Any]) -> None:
        super().__init__(table)
        self.view, self.states = view, states

    def get(self, key: str, default: Any = None) -> Any:
        value = super().get(key, default)
        self.view.load(self.states, {})
        return value

    def items(self) -> Any:
        out = list(super().items())
        self.view.load(self.states, {})
        return out


@pytest.mark.parametrize("read", ["get", "items"])
def test_a_reader_racing_a_load_gets_the_old_or_the_new_record_never_a_mix(read: str) -> None:
    """Rule (TableView: "Readers on other threads may call get and iterate items snapshots"): a reader
    whose read overlaps a load() sees the bundle's record of the old table or of the new one -- here both
    say a:1 owns it -- never the old table's packed int made with numbers the load gave other ids (get and
    items read the table, then the packer: a load landing between the two must not renumber)."""
    rec_k = make(State.OWNED, version=9, ts=1, writer="w", dst="a:1")
    old = {K: rec_k}
    new = {f"tenant/c{i}/0x00000000_0xffffffff": owned(dst=f"c{i}:1", writer=f"wc{i}") for i in range(3)}
    new[K] = rec_k  # the same record, after three other bundles' ids
    view = TableView()
    view.load(old, {})
    view._table = _LoadLandsMidRead(view, new, view._table)
    got = view.get(K) if read == "get" else dict(view.items()).get(K)
    assert got == rec_k


# ------------------------------------------------------------------------------------- owners


@pytest.mark.parametrize("state", SETTLED)
@pytest.mark.parametrize("dst", [None, "a:1"])
def test_owner_of_a_packed_value_is_its_dst_when_owned_and_none_otherwise(
    state: State, dst: str | None
) -> None:
    """Rule: Packer.owner(packed) is the record's dst for an owned record and None for free and deleted
    ones (whatever dst they name), without making the record -- the same as the record's owner()."""
    packer = Packer()
    packer.pack(make(State.FREE, version=1, ts=0, writer="other", dst="other:1", src="x:1"))  # ids 1..3
    r = make(state, version=5, ts=INT64_MIN, writer="w", dst=dst, src="b:2", force=True)
    packed = packer.pack(r)
    assert packed is not None
    assert packer.owner(packed) == (dst if state is State.OWNED else None)
    assert packer.owner(packed) == r.owner()


def test_owned_lists_every_owned_bundle_with_its_dst_packed_or_not() -> None:
    """Rule: TableView.owned() yields (bundle, dst) for every bundle in state owned -- packed, or held as an
    object (with children, after load) -- and for no other state: the same pairs as the records' owner()
    for owned records."""
    states = {
        K: make(State.OWNED, version=2, ts=0, writer="w", dst="a:1"),
        K2: make(State.OWNED, version=3, ts=0, writer="w", dst="b:2", src="a:1", children={}),
        K3: make(State.FREE, version=2, ts=0, writer="w", dst="c:3"),
        K4: make(State.SPLITTING, version=2, ts=0, writer="w", src="d:4", children={"0x0_0x1": None}),
        K5: make(State.DELETED, version=2, ts=0, writer="w", dst="e:5", src="e:5"),
        K6: make(State.ASSIGNING, version=1, ts=0, writer="w", dst="f:6"),
    }
    view = TableView()
    view.load(states, {})
    assert sorted(view.owned()) == [(K, "a:1"), (K2, "b:2")]
    assert apply(view, K6, make(State.OWNED, version=2, ts=0, writer="w", dst="f:6")) == "accepted"
    assert apply(view, K, make(State.RELEASING, version=3, ts=0, writer="w", src="a:1")) == "accepted"
    assert sorted(view.owned()) == [(K2, "b:2"), (K6, "f:6")]
    want = sorted((k, r.dst) for k, r in view.items() if r.state is State.OWNED and r.dst is not None)
    assert sorted(view.owned()) == want


def test_a_new_broker_named_in_several_fields_of_one_record_takes_one_number() -> None:
    """Rule: dst, src and writer naming the same new broker number it once (the owner usually writes its
    own Owned record): numbers are a bounded resource."""
    packer = Packer()
    rec = make(State.OWNED, version=2, ts=1, writer="new:1", dst="new:1", src="new:1")
    packed = packer.pack(rec)
    assert packed is not None and packer.unpack(packed) == rec
    assert len(packer) == 1


def test_a_table_that_keeps_records_whole_gives_the_same_answers_and_packs_nothing() -> None:
    """Rule: ``TableView(packed=False)`` (the simulator's table) applies, loads and answers exactly as a
    packed one; it only holds every record as an object."""
    flow = [
        ("t/ns/0x00000000_0x80000000", owned(1, dst="a:1")),
        ("t/ns/0x80000000_0xffffffff", owned(1, dst="b:1")),
        ("t/ns/0x00000000_0x80000000", make(State.RELEASING, version=2, ts=1, writer="a:1", src="a:1")),
        ("t/ns/0x00000000_0x80000000", make(State.FREE, version=3, ts=2, writer="a:1", src="a:1")),
    ]
    packed, whole = TableView(), TableView(packed=False)
    for key, rec in flow:
        assert apply(packed, key, rec) == apply(whole, key, rec) == "accepted"
    assert packed.items() == whole.items()
    assert sorted(packed.owned()) == sorted(whole.owned()) == [("t/ns/0x80000000_0xffffffff", "b:1")]
    assert packed.packed_count() == 2 and whole.packed_count() == 0
    whole.load(packed.as_dict(), {})
    assert whole.packed_count() == 0 and whole.items() == packed.items()


def test_unsettled_lists_every_record_held_whole_and_no_packed_bundle() -> None:
    """Rule: ``unsettled`` is every bundle held as a record object -- those in flight, with children, or
    in a table that packs nothing -- and none held packed: a scan for bundles in flight finds them all."""
    releasing = make(State.RELEASING, version=2, ts=1, writer="a:1", src="a:1", dst="b:1")
    split = make(State.OWNED, version=3, ts=1, writer="a:1", dst="a:1", children={"0x0_0x1": "a:1"})
    states = {
        "t/ns/0x00000000_0x40000000": owned(1, dst="a:1"),
        "t/ns/0x40000000_0x80000000": releasing,
        "t/ns/0x80000000_0xffffffff": split,
    }
    packed, whole = TableView(), TableView(packed=False)
    packed.load(states, {})
    whole.load(states, {})
    assert sorted(packed.unsettled()) == sorted(
        (k, r) for k, r in states.items() if r is not states["t/ns/0x00000000_0x40000000"]
    )
    assert sorted(whole.unsettled()) == sorted(states.items())


def test_state_counts_count_every_bundle_by_state_packed_or_not() -> None:
    """Rule: ``state_counts`` is the number of bundles in each state, read from the packed values' state
    bits and the records' states alike (what the ``trimtab_channel_bundles`` gauge exports)."""
    states = {
        "t/ns/0x00000000_0x20000000": owned(1, dst="a:1"),
        "t/ns/0x20000000_0x40000000": owned(1, dst="b:1", force=True),
        "t/ns/0x40000000_0x60000000": make(State.FREE, version=3, ts=1, writer="a:1"),
        "t/ns/0x60000000_0x80000000": make(State.DELETED, version=4, ts=1, writer="a:1"),
        "t/ns/0x80000000_0xa0000000": make(State.ASSIGNING, version=1, ts=1, writer="a:1", dst="b:1"),
    }
    for table in (TableView(), TableView(packed=False)):
        table.load(states, {})
        assert table.state_counts() == {State.OWNED: 2, State.FREE: 1, State.DELETED: 1, State.ASSIGNING: 1}
    assert TableView().state_counts() == {}


def test_packed_broker_ids_counts_the_ids_the_table_numbered() -> None:
    """Rule: ``packed_broker_ids`` (the ``trimtab_channel_packed_broker_ids`` gauge) is how many broker
    ids the table numbered to pack: each new id of a settled record counts once, in-flight records none."""
    table = TableView()
    assert table.packed_broker_ids() == 0
    apply(table, "t/ns/0x00000000_0x80000000", owned(1, dst="a:1", writer="leader:1"))
    assert table.packed_broker_ids() == 2
    apply(
        table, "t/ns/0x80000000_0xffffffff", make(State.ASSIGNING, version=1, ts=1, writer="c:1", dst="d:1")
    )
    assert table.packed_broker_ids() == 2
    apply(table, "t/ns/0x80000000_0xffffffff", owned(2, dst="d:1", writer="d:1"))
    assert table.packed_broker_ids() == 3


@pytest.mark.parametrize("field", ["src", "writer"])
def test_past_the_last_number_a_new_src_or_writer_alone_keeps_the_record_whole(field: str) -> None:
    """Rule: once every number is taken, a settled record naming a new broker in any one field -- the
    source or the writer alone, its owner already numbered -- is not packed (no field is ever packed
    with a number it does not have)."""
    packer = Packer()
    for i in range(MAX_IDS):
        assert packer.pack(owned(dst=f"b{i}:1", writer=f"b{i}:1")) is not None
    kw = {"dst": "b0:1", "writer": "b0:1", field: "new:1"}
    assert packer.pack(owned(**kw)) is None
    assert packer.pack_decoded(owned(**kw)) is None
    assert len(packer) == MAX_IDS


def test_a_broker_packed_again_keeps_its_number() -> None:
    """Rule: each broker is numbered once, whichever field names it and however often."""
    packer = Packer()
    for rec in (
        owned(dst="a:1", writer="w:1"),
        owned(dst="w:1", src="a:1", writer="a:1"),
        owned(dst="a:1", src="w:1", writer="a:1"),
    ):
        packed = packer.pack(rec)
        assert packed is not None and packer.unpack(packed) == rec
    assert len(packer) == 2
