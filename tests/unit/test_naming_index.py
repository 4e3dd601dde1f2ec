"""The index of the bundles naming a broker (channel/naming.py) equals a scan of the table, whatever
happens to it: transitions accepted or refused, tombstones, a snapshot installed (the table replaced whole,
listeners silent), replay before the table is live, and questions at any point in between."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from trimtab.channel.naming import NamingIndex
from trimtab.channel.records import Record, State, encode, make
from trimtab.channel.table import TableView

BROKERS = ["a:1", "b:1", "c:1"]
BUNDLES = [f"t/ns/0x{i:08x}_0x{i + 1:08x}" for i in range(6)]

records = st.builds(
    lambda state, dst, src, version: make(state, version=version, ts=1, writer="w", dst=dst, src=src),
    st.sampled_from(list(State)),
    st.sampled_from([None, *BROKERS]),
    st.sampled_from([None, *BROKERS]),
    st.integers(1, 4),
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("apply"), st.sampled_from(BUNDLES), st.one_of(st.none(), records)),
        st.tuples(st.just("load"), st.dictionaries(st.sampled_from(BUNDLES), records, max_size=4)),
        st.tuples(st.just("live")),
        st.tuples(st.just("ask"), st.sampled_from(BROKERS)),
    ),
    max_size=60,
)


def scan(table: TableView, broker: str) -> dict[str, Record]:
    return {k: r for k, r in table.items() if r.names(broker)}


@settings(max_examples=300, deadline=None)
@given(steps)
def test_the_index_answers_what_a_scan_would(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    table = TableView()
    table.set_live()
    index = NamingIndex(table)  # one index, one listener, for every broker
    for op in ops:
        if op[0] == "apply":
            table.apply(op[1].encode(), encode(op[2]))
        elif op[0] == "load":
            table.load(op[1], {})
        elif op[0] == "live":
            table.set_live()
        else:
            assert index.records(op[1]) == scan(table, op[1])
    for b in BROKERS:
        assert index.records(b) == scan(table, b)


def test_a_question_asked_only_after_changes_still_sees_them() -> None:
    """The first question scans; later changes reach the index by the listener alone."""
    table = TableView()
    table.set_live()
    index = NamingIndex(table)
    assert index.records("a:1") == {}
    rec = make(State.ASSIGNING, version=1, ts=1, writer="w", dst="a:1")
    table.apply(BUNDLES[0].encode(), encode(rec))
    assert index.records("a:1") == {BUNDLES[0]: rec}
    owned = make(State.OWNED, version=2, ts=2, writer="a:1", dst="a:1")
    table.apply(BUNDLES[0].encode(), encode(owned))
    assert index.records("a:1") == {BUNDLES[0]: owned} == scan(table, "a:1")
    other = make(State.ASSIGNING, version=1, ts=1, writer="w", dst="b:1")
    table.apply(BUNDLES[1].encode(), encode(other))
    assert index.records("a:1") == {BUNDLES[0]: owned}


def test_a_table_replaced_while_a_question_is_asked_does_not_leave_the_index_behind() -> None:
    """Found by review: a ``load()`` (a history gap's recovery, on another thread) landing between the
    question's check that the table is live and its rescan made the index remember a half-replayed table
    as current; what the rest of the replay applied (listeners silent then) was missing for good."""
    a, b = BUNDLES[0], BUNDLES[1]
    owned = make(State.OWNED, version=1, ts=0, writer="w", dst="a:1")
    table = TableView()
    table.load({a: owned}, {})
    table.set_live()
    index = NamingIndex(table)
    assert set(index.records("a:1")) == {a}
    plain = type(table)
    fired: list[bool] = []

    class LoadsOnFirstLook(plain):  # type: ignore[misc,valid-type]
        @property  # type: ignore[override]
        def live(self) -> bool:
            value: bool = self.__dict__["live"]
            if value and not fired:
                fired.append(True)
                plain.load(self, {a: owned}, {})  # the recovery thread, right after the check
            return value

        @live.setter
        def live(self, value: bool) -> None:
            self.__dict__["live"] = value

    table.__class__ = LoadsOnFirstLook
    index.records("a:1")
    table.__class__ = plain
    table.apply(b.encode(), encode(owned))  # the tail after the snapshot, replayed before live
    table.set_live()
    assert set(index.records("a:1")) == {a, b} == set(scan(table, "a:1"))
