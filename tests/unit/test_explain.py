"""``trimtab admin explain`` (balance/explain.py): every stop says why, in a stable word and a sentence --
safe mode, shedding off or paused, each skip of the last cycle, healing paused, failed brokers, operations
throttled, draining brokers -- and, for one bundle, what holds it where it is."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.explain import cluster
from trimtab.balance import operations as ops
from trimtab.balance.explain import SHED_SKIPS, explain_bundle
from trimtab.balance.shed import ShedResult, ShedState
from trimtab.channel.records import State, make

B = "t/ns/0x00000000_0x80000000"
NOW = 1_800_000_000_000


def words(out: dict[str, Any]) -> list[str]:
    return [r["reason"] for r in out["reasons"]]


def test_a_balanced_cluster_says_so() -> None:
    out = cluster()
    assert out["balanced"] is True and words(out) == ["balanced"] and out["std"] == 0.125


@pytest.mark.parametrize("skip", sorted(SHED_SKIPS))
def test_every_skip_of_the_last_cycle_is_a_reason_with_a_sentence(skip: str) -> None:
    out = cluster(last=ShedResult([], "skip", skip, std=0.3))
    assert words(out) == [skip] and out["reasons"][0]["detail"] == SHED_SKIPS[skip]
    assert out["balanced"] is (skip == "balanced")


def test_every_stop_is_listed_most_decisive_first() -> None:
    out = cluster(
        safe_mode="zookeeper session suspended",
        shedding_paused=True,
        last=ShedResult([], "skip", "hit_count", std=0.3),
        healing={"paused": "mass_failure", "failed": {"b:1": {}}, "pending_bundles": 12, "held": ["b:1"]},
        waiting={"throttled_cluster": 40},
        draining=["c:1"],
        stale=["d:1"],
    )
    assert words(out) == [
        "safe_mode",
        "shedding_paused",
        "hit_count",
        "healing_mass_failure",
        "failed_brokers",
        "healing_held",
        "throttled_cluster",
        "stale_load_report",
        "draining",
    ]
    assert all(r["detail"] for r in out["reasons"])
    assert words(cluster(shedding_enabled=False, last=None)) == ["shedding_disabled"]
    assert words(cluster(last=None)) == ["no_cycle_yet"]


def test_a_bundle_says_what_holds_it() -> None:
    state = ShedState(recent_bundles={B: NOW - 10_000})
    last = ShedResult([], "skip", "no_bundles", skipped_bundles=[(B, "cool_down")])
    op = ops.new("drain-1", ops.OpKind.DRAIN, [(B, "a:1", "b:1")], reason="r", requested_by="x", now_ms=NOW)
    out = explain_bundle(
        B,
        make(State.OWNED, dst="a:1", version=4, ts=NOW, writer="x"),
        placement="namespace t/ns: no isolation policy",
        candidates=[],
        last=last,
        state=state,
        bundle_grace_ms=60_000,
        now_ms=NOW,
        operations=[op],
        cluster=cluster(),
    )
    assert out["owner"] == "a:1"
    assert [r["reason"] for r in out["why_not_moved"]] == [
        "cool_down",
        "recently_moved",
        "in_operation",
        "placement",
    ]
    assert out["operations"] == [
        {"id": "drain-1", "kind": "drain", "state": "pending", "from": "a:1", "to": "b:1", "outcome": None}
    ]
    free = explain_bundle(
        B, None, placement="p", candidates=["b:1"], last=None, state=ShedState(), bundle_grace_ms=1,
        now_ms=NOW, operations=[], cluster=cluster(),
    )  # fmt: skip
    assert [r["reason"] for r in free["why_not_moved"]] == ["unowned"]
