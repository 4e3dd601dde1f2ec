"""The dependents index (controller/dependents.py) against the real channel.table.TableView (not a fake): records
applied through the resolve predicate (forced, so most are accepted), tombstones, snapshots installed with
load(), set_live() interning in place, and questions asked from another listener of the same table -- the
one registered before the index's hears each record before the index does (the table already holds it),
the one after hears it after."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from trimtab.balance.heal import dependents, in_flight_by_broker, named_brokers
from trimtab.channel.records import Record, State, encode, make
from trimtab.channel.table import TableView
from trimtab.controller.dependents import DependentsIndex

BROKERS = ["a:1", "b:1", "c:1"]
KEYS = [f"t/ns/0x{i:08x}_0x{i + 1:08x}" for i in range(6)]
STATES = [State.OWNED, State.ASSIGNING, State.RELEASING, State.FREE]

records = st.builds(
    lambda state, dst, src, version: make(
        state, version=version, ts=1, writer="w", dst=dst, src=src, force=True
    ),
    st.sampled_from(STATES),
    st.sampled_from([None, *BROKERS]),
    st.sampled_from([None, *BROKERS]),
    st.integers(1, 6),
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("apply"), st.sampled_from(KEYS), st.one_of(st.none(), records), st.booleans()),
        st.tuples(st.just("load"), st.dictionaries(st.sampled_from(KEYS), records, max_size=4)),
        st.tuples(st.just("live")),
        st.tuples(st.just("ask"), st.lists(st.sampled_from(BROKERS), unique=True)),
    ),
    max_size=50,
)


def answers(index: DependentsIndex, brokers: list[str]) -> tuple[Any, ...]:
    return index.named(), index.depending_on(brokers), index.assigning()


def scan(items: list[tuple[str, Record]], brokers: list[str]) -> tuple[Any, ...]:
    want = sorted((k, r) for k, r in items if not frozenset(brokers).isdisjoint(dependents(r)))
    return named_brokers(items), want, in_flight_by_broker(items)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_the_index_answers_as_a_scan_of_a_real_table(ops: list[tuple[Any, ...]]) -> None:
    table = TableView()
    asking = {"before": False, "after": False}
    seen: list[tuple[Any, ...]] = []

    def before(key: str, old: Record | None, new: Record | None) -> None:
        if asking["before"]:
            # the table holds the new record, the index has not heard it: named() and assigning() may
            # answer either state (as the fake-table property allows); depending_on reads the table back
            seen.append(("before", index.named(), index.assigning(), table.items(), old, key))

    def after(key: str, old: Record | None, new: Record | None) -> None:
        if asking["after"]:
            assert answers(index, BROKERS) == scan(table.items(), BROKERS)

    table.add_listener(before)
    index = DependentsIndex(table)
    table.add_listener(after)
    for op in ops:
        if op[0] == "apply":
            _, key, rec, flag = op
            asking["before"], asking["after"] = flag, not flag
            cur = table.get(key)
            if rec is not None and cur is not None:
                rec = make(
                    rec.state, version=cur.version + 1, ts=1, writer="w", dst=rec.dst, src=rec.src, force=True
                )
            elif rec is not None:
                rec = make(rec.state, version=1, ts=1, writer="w", dst=rec.dst, src=rec.src, force=True)
            table.apply(key.encode(), encode(rec))
            asking["before"] = asking["after"] = False
        elif op[0] == "load":
            table.load(op[1], {})
        elif op[0] == "live":
            table.set_live()
        else:
            assert answers(index, op[1]) == scan(table.items(), op[1])
    for _, named, assigning, items_after, old, key in seen:
        items_before = [(k, r) for k, r in items_after if k != key] + (
            [(key, old)] if old is not None else []
        )
        assert named in (named_brokers(items_before), named_brokers(items_after))
        assert assigning in (in_flight_by_broker(items_before), in_flight_by_broker(items_after))
    table.set_live()
    assert answers(index, BROKERS) == scan(table.items(), BROKERS)
