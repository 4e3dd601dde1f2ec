"""Rules of the live placement view's ownership (cluster/placement/view.py): it reads who owns what from
the channel table itself -- no copy of its own -- and keeps only a count and, once a question needs it, the
placement index, current record by record."""

from __future__ import annotations

from trimtab.balance.assign import BrokerInfo
from trimtab.channel.records import Record, State, encode, make
from trimtab.channel.table import TableView
from trimtab.cluster.placement.store import AntiAffinityGroups, PlacementDocs
from trimtab.cluster.placement.view import LivePlacement

NS = "t/ns"
A, B = "a:1", "b:1"


def bundle(i: int) -> str:
    return f"{NS}/0x{i:08x}_0x{i + 1:08x}"


def owned(dst: str, version: int = 1, src: str | None = None) -> Record:
    return make(State.OWNED, version=version, ts=0, writer=dst, dst=dst, src=src)


BROKERS = {b: BrokerInfo(id=b, service_url=f"s://{b}", http_url=f"h://{b}") for b in (A, B)}


def wired(states: dict[str, Record] | None = None) -> tuple[TableView, LivePlacement]:
    """A table and a view wired as a replica wires them: the view hears the table, and reads it whole
    when it turns live."""
    table = TableView()
    view = LivePlacement(lambda: BROKERS, failure_domains_enabled=False, table=table)
    table.add_listener(view.record_changed)
    table.load(states or {}, {})
    table.set_live()
    view.load_table()
    return table, view


def apply(table: TableView, key: str, rec: Record | None) -> None:
    assert table.apply(key.encode(), encode(rec)) == "accepted"


def test_the_owner_is_the_tables_owned_record_dst_and_nothing_else() -> None:
    """Rule: ``owner`` is the ``dst`` of the bundle's ``Owned`` record in the table; any other state (a
    releasing bundle still has a dst) or no record is no owner."""
    releasing = make(State.RELEASING, version=2, ts=0, writer=A, src=A, dst=B)
    _table, view = wired({bundle(0): owned(A), bundle(1): releasing})
    assert view.owner(bundle(0)) == A
    assert view.owner(bundle(1)) is None
    assert view.owner(bundle(2)) is None


def test_the_owner_follows_every_applied_record() -> None:
    """Rule: the view keeps no copy of the owners: an applied record is the answer at once."""
    table, view = wired()
    apply(table, bundle(0), owned(A))
    assert view.owner(bundle(0)) == A
    apply(table, bundle(0), make(State.RELEASING, version=2, ts=0, writer=A, src=A, dst=B))
    assert view.owner(bundle(0)) is None
    apply(table, bundle(0), make(State.ASSIGNING, version=3, ts=0, writer=A, src=A, dst=B))
    apply(table, bundle(0), owned(B, version=4, src=A))
    assert view.owner(bundle(0)) == B


def test_the_owned_total_is_counted_on_load_and_kept_by_each_change() -> None:
    """Rule: ``load_table`` counts the table's ``Owned`` bundles; each change adds one when a bundle
    becomes owned, removes one when it stops being owned, and a move between owners changes nothing."""
    table, view = wired(
        {bundle(0): owned(A), bundle(1): owned(B), bundle(2): make(State.FREE, version=3, ts=0, writer=A)}
    )
    assert view.owned_total() == 2
    apply(table, bundle(3), owned(A))
    assert view.owned_total() == 3
    apply(table, bundle(0), make(State.RELEASING, version=2, ts=0, writer=A, src=A))
    assert view.owned_total() == 2
    apply(table, bundle(0), make(State.FREE, version=3, ts=0, writer=A, src=A))
    assert view.owned_total() == 2


def test_a_table_replaced_whole_is_counted_again() -> None:
    """Rule: after ``load`` (a snapshot, a history gap: listeners heard nothing) ``load_table`` counts the
    new table, and the index is rebuilt from it on the next question (the generation moves on)."""
    table, view = wired({bundle(0): owned(A)})
    generation = view.generation
    table.load({bundle(i): owned(B) for i in range(5)}, {})
    table.set_live()
    view.load_table()
    assert view.owned_total() == 5
    assert view.generation == generation + 1
    assert view.owner(bundle(0)) == B


def test_a_built_index_hears_changes_and_owner_listeners_hear_each_change_once() -> None:
    """Rule: the placement index, once a question built it from the table, is kept current by the
    listener; owner listeners hear ``(bundle, before, after)`` for every change of an ``Owned`` owner."""
    table, view = wired({bundle(0): owned(A)})
    view.policies_changed(PlacementDocs(groups=AntiAffinityGroups(groups={NS: "g"})))
    heard: list[tuple[str, str | None, str | None]] = []
    view.add_owner_listener(lambda b, before, after: heard.append((b, before, after)))
    assert view.candidates(bundle(1)) == [B]  # the group's bundle on A steers the next one to B
    apply(table, bundle(1), owned(B))
    assert view.candidates(bundle(2)) == [A, B]  # one each now
    assert view.planning().owned == {bundle(0): A, bundle(1): B}
    apply(table, bundle(1), make(State.RELEASING, version=2, ts=0, writer=B, src=B))
    assert heard == [(bundle(1), None, B), (bundle(1), B, None)]
    assert view.planning().owned == {bundle(0): A}


def test_the_table_lists_its_owned_bundles_packed_or_not() -> None:
    """Rule: ``TableView.owned`` yields ``(bundle, dst)`` of every ``Owned`` bundle -- held packed or as a
    record (one with children stays a record) -- and nothing else."""
    with_children = make(State.OWNED, version=1, ts=0, writer=A, dst=A, children={"0x00000000_0x00000001": A})
    table = TableView()
    table.load(
        {
            bundle(0): owned(A),
            bundle(1): with_children,
            bundle(2): make(State.FREE, version=3, ts=0, writer=A),
            bundle(3): make(State.ASSIGNING, version=1, ts=0, writer=A, dst=B),
        },
        {},
    )
    assert table.packed_count() == 2
    assert sorted(table.owned()) == [(bundle(0), A), (bundle(1), A)]
