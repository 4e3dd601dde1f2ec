"""The naming index's rules one at a time (channel/naming.py; docs/testing.md: mutation testing).

Every test names the rule it pins: the index costs one scan per broker while the table is live and not
replaced (a table not live is scanned each time), a bundle whose record stops naming a broker leaves that
broker's keys (a question looks up only the bundles that name it now), the listener is quiet about brokers
nobody asked about and about records without a source, a tombstone drops its bundle, and a table replaced
while a question is scanned or looked up is answered from what the table holds then.
"""

from __future__ import annotations

from collections.abc import Callable

from trimtab.channel.naming import NamingIndex
from trimtab.channel.records import Record, State, encode, make
from trimtab.channel.table import TableView

A, B, C = "a:1", "b:1", "c:1"
K1, K2, K3 = (f"t/ns/0x{i:08x}_0x{i + 1:08x}" for i in range(3))


def rec(state: State, version: int, dst: str | None = None, src: str | None = None) -> Record:
    return make(state, version=version, ts=1, writer="w", dst=dst, src=src)


class Watched(TableView):
    """A table that counts its scans and the keys looked up in it, and can run one action (another
    thread's work) at the next scan or look-up."""

    def __init__(self) -> None:
        super().__init__()
        self.scans = 0
        self.looked_up: list[str] = []
        self.on_scan: Callable[[], None] | None = None
        self.on_get: Callable[[], None] | None = None

    def items(self) -> list[tuple[str, Record]]:
        self.scans += 1
        out = super().items()
        action, self.on_scan = self.on_scan, None
        if action is not None:
            action()
        return out

    def get(self, bundle: str) -> Record | None:
        self.looked_up.append(bundle)
        action, self.on_get = self.on_get, None
        if action is not None:
            action()
        return super().get(bundle)


def apply(table: TableView, key: str, record: Record | None) -> None:
    assert table.apply(key.encode(), encode(record)) == "accepted"


def live_table(states: dict[str, Record]) -> Watched:
    table = Watched()
    table.load(states, {})
    table.set_live()
    return table


def test_a_live_table_is_scanned_once_per_broker() -> None:
    """Rule: while the table is live and not replaced, the first question about a broker scans it and every
    later one is answered from the index (no scan), also after changes; a replaced table is scanned again."""
    owned = rec(State.OWNED, 1, dst=A)
    table = live_table({K1: owned})
    index = NamingIndex(table)
    assert index.records(A) == {K1: owned}
    assert table.scans == 1
    assert index.records(A) == {K1: owned}
    apply(table, K2, rec(State.ASSIGNING, 1, dst=A))
    assert index.records(A) == {K1: owned, K2: rec(State.ASSIGNING, 1, dst=A)}
    assert table.scans == 1
    assert index.records(B) == {}
    assert table.scans == 2
    table.load({K3: owned}, {})
    table.set_live()
    assert index.records(A) == {K3: owned}
    assert table.scans == 3


def test_a_table_not_live_is_scanned_at_every_question() -> None:
    """Rule: until the table is live (listeners silent) every question is a scan, and what it answers is
    the table as it is then, changes included."""
    table = Watched()
    index = NamingIndex(table)
    first = rec(State.ASSIGNING, 1, dst=A)
    apply(table, K1, first)
    assert index.records(A) == {K1: first}
    owned = rec(State.OWNED, 2, dst=A)
    apply(table, K1, owned)
    assert index.records(A) == {K1: owned}
    assert table.scans == 2


def test_a_bundle_that_stops_naming_a_broker_leaves_its_keys() -> None:
    """Rule: once a bundle's record names the broker neither as dst nor as src (here: unloaded from A, then
    assigned to B), a question about A looks it up no more -- the index holds the bundles naming A now, not
    every bundle that ever did -- while a record that still names A (as src) keeps it."""
    table = live_table({K1: rec(State.OWNED, 1, dst=A), K2: rec(State.OWNED, 1, dst=A)})
    index = NamingIndex(table)
    assert set(index.records(A)) == {K1, K2}
    apply(table, K1, rec(State.RELEASING, 2, src=A))  # an unload: no destination
    apply(table, K1, rec(State.FREE, 3, src=A))
    apply(table, K2, rec(State.RELEASING, 2, dst=B, src=A))  # a transfer: still names A
    table.looked_up.clear()
    assert index.records(A) == {K1: rec(State.FREE, 3, src=A), K2: rec(State.RELEASING, 2, dst=B, src=A)}
    assert sorted(table.looked_up) == [K1, K2]
    apply(table, K1, rec(State.ASSIGNING, 4, dst=B))  # names B only, and nothing as src
    apply(table, K2, rec(State.ASSIGNING, 3, dst=B, src=A))
    apply(table, K2, rec(State.OWNED, 4, dst=B, src=A))
    table.looked_up.clear()
    assert index.records(A) == {K2: rec(State.OWNED, 4, dst=B, src=A)}
    assert table.looked_up == [K2]


def test_a_record_that_names_the_broker_on_both_sides_or_in_its_new_version_stays() -> None:
    """Rule: a bundle leaves a broker's keys only when its new record does not name the broker: a record
    moving from A as dst to A as src (and on to A as src and dst) keeps its place, and is found."""
    table = live_table({K1: rec(State.OWNED, 1, dst=A)})
    index = NamingIndex(table)
    assert set(index.records(A)) == {K1}
    apply(table, K1, rec(State.RELEASING, 2, dst=B, src=A))
    apply(table, K1, rec(State.ASSIGNING, 3, dst=B, src=A))
    assert index.records(A) == {K1: rec(State.ASSIGNING, 3, dst=B, src=A)}
    assert index.records(B) == {K1: rec(State.ASSIGNING, 3, dst=B, src=A)}
    apply(table, K1, rec(State.OWNED, 4, dst=B, src=A))
    apply(table, K1, rec(State.RELEASING, 5, dst=A, src=B))
    assert index.records(A) == index.records(B) == {K1: rec(State.RELEASING, 5, dst=A, src=B)}
    assert table.scans == 2


def test_changes_about_brokers_nobody_asked_about_are_ignored() -> None:
    """Rule: the listener keeps keys for the brokers asked about only: a record naming other brokers, or
    leaving them, or with no source, changes nothing and never fails (the listener runs in the feeder)."""
    table = live_table({K1: rec(State.OWNED, 1, dst=B)})
    index = NamingIndex(table)
    assert index.records(A) == {}
    apply(table, K1, rec(State.RELEASING, 2, dst=C, src=B))  # B and C: nobody asked
    apply(table, K1, rec(State.ASSIGNING, 3, dst=C, src=B))
    apply(table, K1, rec(State.OWNED, 4, dst=C, src=B))
    apply(table, K2, rec(State.ASSIGNING, 1, dst=C))
    apply(table, K2, rec(State.OWNED, 2, dst=C))
    assert index.records(A) == {}
    assert index.records(C) == {K1: rec(State.OWNED, 4, dst=C, src=B), K2: rec(State.OWNED, 2, dst=C)}


def test_a_tombstone_drops_its_bundle() -> None:
    """Rule: a tombstone (a Free or Deleted record returned to Init) removes the bundle from every broker's
    keys it was in, source or destination."""
    table = live_table({K1: rec(State.FREE, 3, src=A), K2: rec(State.DELETED, 5, dst=B, src=A)})
    index = NamingIndex(table)
    assert set(index.records(A)) == {K1, K2}
    assert set(index.records(B)) == {K2}
    apply(table, K1, None)
    apply(table, K2, None)
    table.looked_up.clear()
    assert index.records(A) == index.records(B) == {}
    assert table.looked_up == []


def test_a_table_replaced_during_the_scan_is_answered_from_what_it_holds_then() -> None:
    """Rule: when the table is replaced while a question scans it (a history gap's recovery, on the
    feeder's thread), the keys seen are looked up again and only the records that name the broker now are
    answered: a key that now names it as src only is in, a key that names another broker or is gone is not
    -- and the next question scans again."""
    table = live_table(
        {K1: rec(State.OWNED, 1, dst=A), K2: rec(State.OWNED, 1, dst=A), K3: rec(State.OWNED, 1, dst=A)}
    )
    index = NamingIndex(table)
    now = {K1: rec(State.RELEASING, 2, dst=B, src=A), K2: rec(State.OWNED, 2, dst=B)}
    table.on_scan = lambda: TableView.load(table, now, {})
    assert index.records(A) == {K1: now[K1]}
    table.set_live()
    assert index.records(A) == {K1: now[K1]}
    assert table.scans == 2


def test_a_table_replaced_and_live_again_during_the_scan_is_answered_from_what_it_holds_then() -> None:
    """Rule: the same when the replaced table is live again before the scan ends (its generation moved
    on): the answer is what the table holds, not what the scan saw."""
    table = live_table({K1: rec(State.OWNED, 1, dst=A), K2: rec(State.OWNED, 1, dst=A)})
    index = NamingIndex(table)
    now = {K1: rec(State.RELEASING, 2, dst=B, src=A), K2: rec(State.OWNED, 2, dst=B)}

    def recover() -> None:
        TableView.load(table, now, {})
        TableView.set_live(table)

    table.on_scan = recover
    assert index.records(A) == {K1: now[K1]}
    assert index.records(A) == {K1: now[K1]}
    assert index.records(B) == now


def test_a_table_replaced_after_the_index_was_read_is_answered_from_what_it_holds_then() -> None:
    """Rule: the records are looked up after the index is read, outside its lock; a table replaced in
    between (a key gone, a key now naming another broker) answers what it holds: neither key."""
    table = live_table({K1: rec(State.OWNED, 1, dst=A), K2: rec(State.OWNED, 1, dst=A)})
    index = NamingIndex(table)
    assert set(index.records(A)) == {K1, K2}
    table.on_get = lambda: TableView.load(table, {K2: rec(State.OWNED, 2, dst=B)}, {})
    assert index.records(A) == {}
