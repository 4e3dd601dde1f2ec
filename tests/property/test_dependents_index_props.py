"""The leader's index of who depends on whom (controller/dependents.py) answers as a scan of the table does
-- over random histories of record changes, deletions, whole-table replacements (which listeners never
hear of), a table that is not live; a question asked between a record's write and its listener call sees
the table before that record or after it, and the next one after it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from trimtab.balance.heal import dependents, in_flight_by_broker, named_brokers
from trimtab.channel.records import Record, State, make
from trimtab.controller.dependents import DependentsIndex

BROKERS = ["a:1", "b:1", "c:1", "d:1"]
KEYS = [f"t/ns/0x{i:02x}_0x{i + 1:02x}" for i in range(8)]
Listener = Callable[[str, Record | None, Record | None], None]


class FakeTable:
    """What the index reads of a TableView: items, get, live, generation, listeners."""

    def __init__(self) -> None:
        self.data: dict[str, Record] = {}
        self.live = True
        self.generation = 0
        self.listeners: list[Listener] = []

    def add_listener(self, fn: Listener) -> None:
        self.listeners.append(fn)

    def items(self) -> list[tuple[str, Record]]:
        return list(self.data.items())

    def get(self, key: str) -> Record | None:
        return self.data.get(key)


records = st.builds(
    lambda state, src, dst: make(state, version=1, ts=0, writer="w", src=src, dst=dst),
    st.sampled_from(list(State)),
    st.one_of(st.none(), st.sampled_from(BROKERS)),
    st.one_of(st.none(), st.sampled_from(BROKERS)),
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.sampled_from(KEYS), records, st.booleans()),
        st.tuples(st.just("delete"), st.sampled_from(KEYS)),
        st.tuples(st.just("replace"), st.dictionaries(st.sampled_from(KEYS), records)),
        st.tuples(st.just("live"), st.booleans()),
        st.tuples(st.just("ask"), st.lists(st.sampled_from(BROKERS), unique=True)),
    ),
    max_size=40,
)


def check(index: DependentsIndex, table: FakeTable, brokers: list[str]) -> None:
    items = table.items()
    assert index.named() == named_brokers(items)
    want = sorted((k, r) for k, r in items if not frozenset(brokers).isdisjoint(dependents(r)))
    assert index.depending_on(brokers) == want
    assert index.assigning() == in_flight_by_broker(items)


@settings(max_examples=400, deadline=None)
@given(ops)
def test_the_index_answers_as_a_scan(history: list[tuple[Any, ...]]) -> None:
    table = FakeTable()
    index = DependentsIndex(table)  # type: ignore[arg-type]
    for op in history:
        kind = op[0]
        if kind == "set":
            _, key, rec, ask_between = op
            old = table.data.get(key)
            before = table.items()
            table.data[key] = rec
            if ask_between:  # between the write and its listener call: the state before or after it
                after = table.items()
                assert index.named() in (named_brokers(before), named_brokers(after))
                assert index.assigning() in (in_flight_by_broker(before), in_flight_by_broker(after))
            if table.live:
                for fn in table.listeners:
                    fn(key, old, rec)
        elif kind == "delete":
            old = table.data.pop(op[1], None)
            if table.live and old is not None:
                for fn in table.listeners:
                    fn(op[1], old, None)
        elif kind == "replace":  # a snapshot or a history gap: listeners hear nothing
            table.live = False
            table.data = dict(op[1])
            table.generation += 1
        elif kind == "live":
            table.live = op[1] or table.live  # a table goes live again after a replacement, never back
        else:
            check(index, table, op[1])
    table.live = True
    check(index, table, BROKERS)
