"""Why the cluster is not balanced, and why a bundle is where it is (issue 32 point 3), from the leader's
last decisions. Pure: the controller gathers the inputs (``trimtab admin explain [BUNDLE]``).

"Why is it not balancing?" is what operators of every load balancer ask; Cruise Control once answered it
with an empty reason (its #1109). Every answer here is a list of reasons, each a stable word -- the same
words the decision events and the metric labels carry -- with a sentence that says it in full.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trimtab.balance.operations import Operation
from trimtab.balance.shed import ShedResult, ShedState
from trimtab.channel.records import Record, State


@dataclass(frozen=True)
class Reason:
    word: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"reason": self.word, "detail": self.detail}


#: What a shedding cycle's skip reason means, for people.
SHED_SKIPS: Mapping[str, str] = {
    "balanced": "the load spread is within shedding.target_std and no broker is over- or underloaded",
    "hit_count": "the imbalance has not lasted shedding.hit_count_threshold cycles yet (a spike is not shed)",
    "cool_down": "the brokers that could give load away shed recently (shedding.broker_cooldown_s)",
    "no_load_data": "fresh load reports are missing: nothing is decided from stale load",
    "no_brokers": "fewer than two brokers may take load",
    "no_bundles": "the overloaded brokers have no bundle that may move",
    "paused": "shedding is paused by an operator or disabled",
    "safe_mode": "the leader is in safe mode",
    "unloads_in_flight": "the last cycle's moves are not done yet (up to shedding.unload_timeout_s)",
    "operations_not_loaded": "a new leader is still reading the stored operations: its moves could not be stored",
    "stale_load_data": "a broker that shed recently has not reported its load since: the statistics would be wrong",
}


def explain_cluster(
    *,
    safe_mode: str | None,
    shedding_enabled: bool,
    shedding_paused: bool,
    last: ShedResult | None,
    target_std: float,
    healing: Mapping[str, Any],
    waiting: Mapping[str, int],
    draining: Iterable[str],
    stale: Iterable[str] = (),
) -> dict[str, Any]:
    """Why the cluster is (or is not) balanced right now, most decisive first."""
    out: list[Reason] = []
    if safe_mode is not None:
        out.append(Reason("safe_mode", f"the leader holds back every move: {safe_mode}"))
    if not shedding_enabled:
        out.append(Reason("shedding_disabled", "shedding.enabled is false: load is never moved for balance"))
    elif shedding_paused:
        out.append(Reason("shedding_paused", "an operator paused shedding (trimtab admin shedding resume)"))
    if last is not None and last.result == "skip":
        word = last.reason or "unknown"
        out.append(Reason(word, SHED_SKIPS.get(word, f"the last shedding cycle skipped: {word}")))
    elif last is None and shedding_enabled and not shedding_paused:
        out.append(Reason("no_cycle_yet", "this leader has not run a shedding cycle yet"))
    if healing.get("paused"):
        out.append(Reason(f"healing_{healing['paused']}", f"self-healing is paused: {healing['paused']}"))
    if healing.get("failed"):
        failed = ", ".join(sorted(healing["failed"]))
        out.append(
            Reason(
                "failed_brokers",
                f"{failed} failed; {healing.get('pending_bundles', 0)} bundles still to move",
            )
        )
    if healing.get("held"):
        held = ", ".join(sorted(healing["held"]))
        out.append(
            Reason(
                "healing_held",
                f"an operator paused the healing of {held}: its bundles stay unowned until `admin ops resume`",
            )
        )
    for word, n in sorted(waiting.items()):
        out.append(Reason(word, f"{n} moves of operations wait ({word.replace('_', ' ')})"))
    outdated = sorted(stale)
    if outdated:
        out.append(
            Reason(
                "stale_load_report",
                f"{', '.join(outdated)} reported no load within load.ttl_s: left out of shedding (neither gives nor "
                "takes load) until they report again",
            )
        )
    drained = sorted(draining)
    if drained:
        out.append(Reason("draining", f"{', '.join(drained)} take no new bundles (draining)"))
    std = last.std if last is not None else None
    balanced = last is not None and last.result == "skip" and last.reason == "balanced"
    return {
        "balanced": balanced,
        "std": round(std, 4) if std is not None else None,
        "target_std": target_std,
        "reasons": [r.to_json() for r in out],
    }


def explain_bundle(
    bundle: str,
    rec: Record | None,
    *,
    placement: str,
    candidates: Sequence[str],
    last: ShedResult | None,
    state: ShedState,
    bundle_grace_ms: int,
    now_ms: int,
    operations: Iterable[Operation],
    cluster: Mapping[str, Any],
) -> dict[str, Any]:
    """Why ``bundle`` is on its broker, and why it did not move: its record, what placement allows, what the
    last shedding cycle said of it, the operations that name it, and the cluster-wide reasons."""
    why_not: list[Reason] = []
    owner = rec.owner() if rec is not None else None
    if rec is None or rec.state is State.FREE:
        why_not.append(Reason("unowned", "nobody owns it: the next lookup of one of its topics assigns it"))
    elif rec.state.in_flight:
        why_not.append(Reason("in_flight", f"it is {rec.state.value} (version {rec.version}) right now"))
    for b, word in last.skipped_bundles if last is not None else ():
        if b == bundle:
            why_not.append(Reason(word, f"the last shedding cycle considered it and skipped it: {word}"))
    moved = state.recent_bundles.get(bundle)
    if moved is not None and now_ms - moved < bundle_grace_ms:
        left = (bundle_grace_ms - (now_ms - moved)) / 1000
        why_not.append(
            Reason(
                "recently_moved", f"moved {round((now_ms - moved) / 1000)} s ago: {left:.0f} s of grace left"
            )
        )
    ops = []
    for op in operations:
        for m in op.moves:
            if m.bundle == bundle:
                ops.append(
                    {
                        "id": op.id,
                        "kind": op.kind.value,
                        "state": op.state.value,
                        "from": m.src,
                        "to": m.dst,
                        "outcome": m.outcome.value if m.outcome is not None else None,
                    }
                )
                if m.open and not op.state.terminal:
                    why_not.append(
                        Reason(
                            "in_operation",
                            f"operation {op.id} ({op.kind.value}, {op.state.value}) will move it",
                        )
                    )
    if not candidates:
        why_not.append(Reason("placement", f"no other live broker is allowed to take it ({placement})"))
    return {
        "bundle": bundle,
        "record": rec.to_json() if rec is not None else None,
        "owner": owner,
        "placement": placement,
        "candidates": list(candidates),
        "why_not_moved": [r.to_json() for r in why_not],
        "operations": ops,
        "cluster": cluster,
    }
