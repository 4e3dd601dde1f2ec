"""The warm-standby preference (cluster/placement/standbys.py): among the brokers the placement rules allow, a
bundle's standbys when any is there, else every allowed broker -- never a broker the rules forbid."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trimtab.balance.assign import BrokerInfo
from trimtab.cluster.placement.standbys import StandbyIndex, StandbySet, prefer_standby_set, prefer_standbys

BROKERS = [f"b{i}:1" for i in range(8)]
ids = st.sets(st.sampled_from(BROKERS))


def info(b: str) -> BrokerInfo:
    return BrokerInfo(id=b, service_url=f"pulsar://{b}", http_url=f"http://{b}")


@given(offered=ids, allowed=ids, standbys=st.lists(st.sampled_from(BROKERS), unique=True, max_size=3))
def test_standbys_are_preferred_only_among_allowed_brokers(
    offered: set[str], allowed: set[str], standbys: list[str]
) -> None:
    index = StandbyIndex()
    index.changed("t/ns/0x0_0x1", StandbySet(brokers=standbys))
    rule = prefer_standbys(index.of, lambda _b, brokers: {k: v for k, v in brokers.items() if k in allowed})
    got = set(rule("t/ns/0x0_0x1", {b: info(b) for b in offered}))
    ok = offered & allowed
    warm = ok & set(standbys)
    assert got == (warm or ok)
    as_sets = prefer_standby_set(index.of, lambda _b: frozenset(ok))
    assert as_sets("t/ns/0x0_0x1") == (warm or ok)


@given(st.lists(st.tuples(st.sampled_from(["x/y/0x0_0x1", "x/y/0x1_0x2"]), st.one_of(st.none(), ids))))
def test_the_index_holds_the_last_set_of_each_bundle(updates: list[tuple[str, set[str] | None]]) -> None:
    index = StandbyIndex()
    last: dict[str, tuple[str, ...]] = {}
    for bundle, brokers in updates:
        value = None if brokers is None else StandbySet(brokers=sorted(brokers))
        index.changed(bundle, value)
        if brokers:
            last[bundle] = tuple(sorted(brokers))
        else:
            last.pop(bundle, None)
    assert index.snapshot() == last
    for b in BROKERS:
        assert index.standing_by(b) == {k for k, v in last.items() if b in v}
