"""The explanations' rules one at a time (balance/explain.py; docs/testing.md: mutation testing).

What ``trimtab admin explain`` answers is what an operator reads: every reason's word and sentence, the
keys of the answer and the figures in it are pinned exactly -- the sentence of every stop of the cluster
(shedding off or paused, no cycle yet, a skip the table does not know, failed and held brokers, waiting
operations, stale reports, draining brokers), the spread rounded to 4 places, and for one bundle its
record, owner, placement, candidates, the seconds since it moved and of grace left (the grace ends at
equality), its operations with their outcome, and which of them will still move it.
"""

from __future__ import annotations

from typing import Any

from tests.support.explain import cluster
from trimtab.balance.explain import explain_bundle
from trimtab.balance.operations import Move, Operation, OpKind, OpState, Outcome
from trimtab.balance.shed import ShedResult, ShedState
from trimtab.channel.records import Record, State, make

B = "t/ns/0x00000000_0x80000000"
OTHER = "t/ns/0x80000000_0xffffffff"
NOW = 1_800_000_000_000


def reasons(out: dict[str, Any]) -> list[tuple[str, str]]:
    return [(r["reason"], r["detail"]) for r in out["reasons"]]


def bundle(
    rec: Record | None = None,
    *,
    last: ShedResult | None = None,
    moved_ms: int | None = None,
    grace_ms: int = 60_000,
    operations: tuple[Operation, ...] = (),
    candidates: tuple[str, ...] = ("b:1",),
) -> dict[str, Any]:
    return explain_bundle(
        B,
        rec,
        placement="namespace t/ns: no isolation policy",
        candidates=candidates,
        last=last,
        state=ShedState(recent_bundles={} if moved_ms is None else {B: moved_ms}),
        bundle_grace_ms=grace_ms,
        now_ms=NOW,
        operations=operations,
        cluster={"balanced": True},
    )


def why(out: dict[str, Any]) -> list[tuple[str, str]]:
    return [(r["reason"], r["detail"]) for r in out["why_not_moved"]]


def op(state: OpState, *moves: Move) -> Operation:
    return Operation(
        id="drain-1",
        kind=OpKind.DRAIN,
        reason="r",
        requested_by="x",
        created_ms=NOW,
        updated_ms=NOW,
        state=state,
        moves=moves,
    )


# ---------------------------------------------------------------------------------------- cluster


def test_the_cluster_answer_has_its_keys_and_the_spread_rounded_to_four_places() -> None:
    """Rule: the cluster's answer is ``balanced``, ``std`` (the last cycle's, rounded to 4 places; None
    without a cycle), ``target_std`` and ``reasons``, each reason a ``reason`` word and a ``detail``."""
    out = cluster(last=ShedResult([], "skip", "balanced", std=0.12890625))
    assert out == {
        "balanced": True,
        "std": 0.1289,
        "target_std": 0.25,
        "reasons": [
            {
                "reason": "balanced",
                "detail": "the load spread is within shedding.target_std and no broker is over- or underloaded",
            }
        ],
    }
    assert cluster(last=None)["std"] is None


def test_shedding_off_or_paused_says_so_in_full() -> None:
    """Rule: shedding disabled and shedding paused are each a reason with its own sentence (disabled wins
    over paused: a disabled shedder's pause does not matter)."""
    assert reasons(cluster(shedding_enabled=False, shedding_paused=True, last=None)) == [
        ("shedding_disabled", "shedding.enabled is false: load is never moved for balance")
    ]
    assert reasons(cluster(shedding_paused=True, last=None)) == [
        ("shedding_paused", "an operator paused shedding (trimtab admin shedding resume)")
    ]


def test_a_leader_without_a_cycle_says_so() -> None:
    """Rule: an enabled, running shedder with no cycle yet is the reason ``no_cycle_yet``, with its
    sentence."""
    assert reasons(cluster(last=None)) == [("no_cycle_yet", "this leader has not run a shedding cycle yet")]


def test_a_skip_the_table_does_not_know_is_named_as_it_is() -> None:
    """Rule: a skip reason without a sentence of its own is said as it is; an empty one is ``unknown``
    (never an empty reason)."""
    assert reasons(cluster(last=ShedResult([], "skip", "odd_skip"))) == [
        ("odd_skip", "the last shedding cycle skipped: odd_skip")
    ]
    assert reasons(cluster(last=ShedResult([], "skip", ""))) == [
        ("unknown", "the last shedding cycle skipped: unknown")
    ]


def test_healing_failed_and_held_brokers_are_listed_in_order() -> None:
    """Rule: the failed brokers, sorted and comma-separated, with the bundles still to move (0 when not
    given), and the held brokers likewise, each in its sentence."""
    out = cluster(healing={"failed": {"f:2": {}, "f:1": {}}, "pending_bundles": 12, "held": ["h:2", "h:1"]})
    assert reasons(out) == [
        ("balanced", "the load spread is within shedding.target_std and no broker is over- or underloaded"),
        ("failed_brokers", "f:1, f:2 failed; 12 bundles still to move"),
        (
            "healing_held",
            "an operator paused the healing of h:1, h:2: its bundles stay unowned until `admin ops resume`",
        ),
    ]
    assert reasons(cluster(healing={"failed": ["f:1"]}))[1] == (
        "failed_brokers",
        "f:1 failed; 0 bundles still to move",
    )


def test_waiting_operations_stale_reports_and_draining_brokers_say_who() -> None:
    """Rule: each kind of waiting move is its own reason, its word said with spaces; stale and draining
    brokers are listed sorted and comma-separated in their sentences."""
    out = cluster(
        last=ShedResult([], "success", "overloaded"),
        waiting={"throttled_cluster": 40, "in_flight_limit": 2},
        stale=["s:2", "s:1"],
        draining=["d:2", "d:1"],
    )
    assert reasons(out) == [
        ("in_flight_limit", "2 moves of operations wait (in flight limit)"),
        ("throttled_cluster", "40 moves of operations wait (throttled cluster)"),
        (
            "stale_load_report",
            "s:1, s:2 reported no load within load.ttl_s: left out of shedding (neither gives nor takes load) "
            "until they report again",
        ),
        ("draining", "d:1, d:2 take no new bundles (draining)"),
    ]
    assert out["balanced"] is False


# ----------------------------------------------------------------------------------------- bundle


def test_a_bundle_answer_has_every_key() -> None:
    """Rule: a bundle's answer is the bundle, its record (as JSON; None without one), its owner, the
    placement rule, the candidates, the reasons it did not move, its operations and the cluster's
    answer; nobody owning it is the reason ``unowned``, a placement allowing nobody the reason
    ``placement``, each with its sentence."""
    assert bundle(None, candidates=()) == {
        "bundle": B,
        "record": None,
        "owner": None,
        "placement": "namespace t/ns: no isolation policy",
        "candidates": [],
        "why_not_moved": [
            {
                "reason": "unowned",
                "detail": "nobody owns it: the next lookup of one of its topics assigns it",
            },
            {
                "reason": "placement",
                "detail": "no other live broker is allowed to take it (namespace t/ns: no isolation policy)",
            },
        ],
        "operations": [],
        "cluster": {"balanced": True},
    }
    owned = make(State.OWNED, dst="a:1", version=4, ts=NOW, writer="x")
    out = bundle(owned)
    assert out["record"] == owned.to_json() and out["owner"] == "a:1" and out["candidates"] == ["b:1"]
    assert out["why_not_moved"] == []


def test_an_in_flight_bundle_says_its_state_and_version() -> None:
    """Rule: a bundle whose record is in flight is the reason ``in_flight``, with the state and version."""
    rec = make(State.ASSIGNING, dst="a:1", version=7, ts=NOW, writer="x")
    assert why(bundle(rec)) == [("in_flight", "it is assigning (version 7) right now")]


def test_the_last_cycle_skip_of_this_bundle_only() -> None:
    """Rule: the last cycle's skips of this bundle (not of others) are reasons, each with its sentence."""
    owned = make(State.OWNED, dst="a:1", version=4, ts=NOW, writer="x")
    last = ShedResult([], "skip", "no_bundles", skipped_bundles=[(OTHER, "too_big"), (B, "cool_down")])
    assert why(bundle(owned, last=last)) == [
        ("cool_down", "the last shedding cycle considered it and skipped it: cool_down")
    ]


def test_a_recent_move_says_how_long_ago_and_how_much_grace_is_left() -> None:
    """Rule: a bundle moved less than ``bundle_grace_ms`` ago says the whole seconds since and of grace
    left; exactly at the grace it is no longer recent."""
    owned = make(State.OWNED, dst="a:1", version=4, ts=NOW, writer="x")
    out = bundle(owned, moved_ms=NOW - 2_000_000, grace_ms=3_000_000)
    assert why(out) == [("recently_moved", "moved 2000 s ago: 1000 s of grace left")]
    assert why(bundle(owned, moved_ms=NOW - 60_000, grace_ms=60_000)) == []
    assert why(bundle(owned, moved_ms=NOW - 59_999, grace_ms=60_000)) == [
        ("recently_moved", "moved 60 s ago: 0 s of grace left")
    ]


def test_operations_list_their_moves_and_only_an_open_one_holds_the_bundle() -> None:
    """Rule: every operation moving the bundle is listed with its move's outcome; only an open move of an
    operation that is not over is the reason ``in_operation``, with the operation's id, kind and state."""
    owned = make(State.OWNED, dst="a:1", version=4, ts=NOW, writer="x")
    done = op(OpState.RUNNING, Move(bundle=B, src="a:1", dst="b:1", outcome=Outcome.MOVED))
    out = bundle(owned, operations=(done,))
    assert out["operations"] == [
        {"id": "drain-1", "kind": "drain", "state": "running", "from": "a:1", "to": "b:1", "outcome": "moved"}
    ]
    assert why(out) == []
    running = op(OpState.RUNNING, Move(bundle=OTHER, src="a:1"), Move(bundle=B, src="a:1", dst="b:1"))
    out = bundle(owned, operations=(running,))
    assert out["operations"] == [
        {"id": "drain-1", "kind": "drain", "state": "running", "from": "a:1", "to": "b:1", "outcome": None}
    ]
    assert why(out) == [("in_operation", "operation drain-1 (drain, running) will move it")]
    cancelled = op(OpState.CANCELLED, Move(bundle=B, src="a:1", dst="b:1"))
    assert why(bundle(owned, operations=(cancelled,))) == []
