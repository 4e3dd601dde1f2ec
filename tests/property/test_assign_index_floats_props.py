"""The assignment index (balance/assign_index.py) against the scan with scores over the whole range a report
may carry (subnormals, 1e18, -0.0, exact ties), reports exactly on the TTL boundary, reports of
unregistered brokers and notifications before the first decision, excluded unknown brokers, odd diffs."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.property.test_assign_index_props import decides_as_the_scan
from trimtab.balance.assign import AssignContext, BrokerInfo
from trimtab.balance.assign_index import AssignIndex
from trimtab.balance.load import FIGURE_MAX, BrokerLoadData

IDS = [f"b{i}:80" for i in range(7)]
UNKNOWN = ["zz:1", "a:0"]
BUNDLE = "t/ns/0x00000000_0xffffffff"
TTL_S = 3.0
SCORES = st.one_of(
    st.sampled_from([0.0, -0.0, 5e-324, 1e-320, 2.2250738585072014e-308, 0.1, 0.2, 0.3, 1e18, 9.99e17]),
    st.floats(0, FIGURE_MAX),
    st.floats(0, 1e-300),
)
AGES = st.one_of(st.sampled_from([0, 2_999, 3_000, 3_001]), st.integers(-100, 6_000))

ops = st.lists(
    st.one_of(
        st.tuples(st.just("report"), st.sampled_from(IDS + UNKNOWN), SCORES, st.integers(0, 120), AGES),
        st.tuples(st.just("vanish"), st.sampled_from(IDS + UNKNOWN)),
        st.tuples(st.just("drain"), st.sampled_from(IDS), st.booleans()),
        st.tuples(st.just("tick"), st.sampled_from([0, 1, 1_000, 2_999, 3_000, 3_001, -1])),
        st.tuples(
            st.just("decide"),
            st.lists(st.sampled_from(IDS + UNKNOWN), max_size=3),
            st.sampled_from([0.0, 0.1, -0.1, 1e18, 5e-324, 1e-9]),
            st.integers(0, 2**32),
        ),
    ),
    max_size=50,
)


def _info(b: str, draining: bool) -> BrokerInfo:
    return BrokerInfo(id=b, service_url="s", http_url="h", draining=draining)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(IDS), min_size=1, unique=True), ops)
def test_the_index_decides_as_the_scan_over_extreme_figures(
    registered: list[str], history: list[tuple[Any, ...]]
) -> None:
    loads: dict[str, BrokerLoadData] = {}
    draining = dict.fromkeys(registered, False)
    brokers = {b: _info(b, False) for b in registered}
    index = AssignIndex(loads)
    now = 10_000
    for op in history:
        kind = op[0]
        if kind == "report":
            _, b, ema, topics, age = op
            loads[b] = BrokerLoadData(
                broker=b, weighted_max_ema=ema, topics=topics, updated_at=max(0, now - age)
            )
            index.load_changed(b)  # possibly before the first decision, possibly unregistered
        elif kind == "vanish":
            loads.pop(op[1], None)
            index.load_changed(op[1])
        elif kind == "drain":
            if op[1] in draining:
                draining[op[1]] = op[2]
                brokers = {b: _info(b, d) for b, d in draining.items()}  # replaced whole
        elif kind == "tick":
            now = max(0, now + op[1])
        else:
            _, exclude, diff, seed = op
            ctx = AssignContext(
                loads=loads, now_ms=now, load_ttl_s=TTL_S, max_topics=100, exclude=frozenset(exclude)
            )
            decides_as_the_scan(index, brokers, ctx, diff, seed)
