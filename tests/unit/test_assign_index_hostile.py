"""The assignment index (balance/assign_index.py) against hostile registrations, found by review: a
version string no version key could order used to crash every rebuild (even with versions not preferred)
and leave a half-built index answering at random; a rebuild that fails half-way now rebuilds again."""

from __future__ import annotations

import contextlib
import random
from typing import Any

from trimtab.balance.assign import AssignContext, BrokerInfo, select_broker
from trimtab.balance.assign_index import AssignIndex
from trimtab.balance.load import BrokerLoadData

BUNDLE = "t/ns/0x00000000_0xffffffff"
KW: dict[str, Any] = {
    "now_ms": 1_000,
    "load_ttl_s": 60.0,
    "max_topics": 100,
    "prefer_later_versions": False,
    "exclude": frozenset(),
    "diff": 0.1,
}


def _info(b: str, version: str) -> BrokerInfo:
    return BrokerInfo(id=b, service_url=f"svc://{b}", http_url=f"http://{b}", version=version)


def _setup() -> tuple[dict[str, BrokerInfo], dict[str, BrokerLoadData]]:
    # "²".isdigit() is True but int("²") raises: version_key() cannot order this version. With
    # prefer_later_versions off the scan never looks at versions; the index computes every version's key
    # on each rebuild, whatever the setting.
    brokers = {"a:1": _info("a:1", "1.0.0"), "b:1": _info("b:1", "1.0.²"), "c:1": _info("c:1", "1.0.0")}
    loads = {
        "a:1": BrokerLoadData(broker="a:1", weighted_max_ema=0.0, updated_at=1_000),
        "b:1": BrokerLoadData(broker="b:1", weighted_max_ema=0.9, updated_at=1_000),
        "c:1": BrokerLoadData(broker="c:1", weighted_max_ema=0.9, updated_at=1_000),
    }
    return brokers, loads


def _scan(brokers: dict[str, BrokerInfo], loads: dict[str, BrokerLoadData], seed: int) -> str | None:
    ctx = AssignContext(loads=loads, now_ms=1_000, load_ttl_s=60.0, max_topics=100)
    return select_broker(BUNDLE, brokers, ctx, random.Random(seed), diff=0.1).broker


def test_an_unorderable_version_does_not_crash_the_index_when_versions_are_not_preferred() -> None:
    brokers, loads = _setup()
    assert _scan(brokers, loads, 0) == "a:1"  # the scan does not care about versions here
    index = AssignIndex(loads)
    got = index.select(brokers, random.Random(0), **KW)
    assert got is not None and got.broker == "a:1"


def test_an_odd_version_is_ordered_when_later_versions_are_preferred() -> None:
    """The filter chain orders it too (a digit int() refuses is compared as text), index or not."""
    brokers, loads = _setup()
    ctx = AssignContext(
        loads=loads, now_ms=1_000, load_ttl_s=60.0, max_topics=100, prefer_later_versions=True
    )
    want = select_broker(BUNDLE, brokers, ctx, random.Random(0), diff=0.1)
    assert want.broker is not None
    got = AssignIndex(loads).select(brokers, random.Random(0), **{**KW, "prefer_later_versions": True})
    assert got is None  # two versions while later ones are preferred: left to the filter chain


def test_a_failed_rebuild_does_not_leave_a_half_built_index_answering() -> None:
    """A rebuild that raises half-way (here: the loads mapping fails once) must not leave the index taking
    the new brokers for indexed: the next decision rebuilds and answers as the scan does."""
    brokers, loads = _setup()

    class FailsOnce(dict[str, BrokerLoadData]):
        failed = False

        def get(self, key: str, default: Any = None) -> Any:
            if not self.failed:
                self.failed = True
                raise RuntimeError("the mapping failed")
            return super().get(key, default)

    flaky = FailsOnce(loads)
    index = AssignIndex(flaky)
    with contextlib.suppress(RuntimeError):
        index.select(brokers, random.Random(0), **KW)
    for seed in range(20):
        got = index.select(brokers, random.Random(seed), **KW)
        assert got is not None and got.broker == _scan(brokers, loads, seed)
