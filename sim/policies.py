"""The shedding policies a scenario can run side by side, by name.

Every policy but ``none`` runs as the leader's :class:`~trimtab.controller.shedding.SheddingJob` with its
shedder injected: ``transfer`` and ``threshold`` are trimtab's own shedders (balance.shed); the
``legacy-*`` ones are Pulsar's modular-load-manager shedders (sim.legacy), which unload without choosing a
destination -- the next lookup places the bundle; ``none`` runs no shedding job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from trimtab.balance.load import BrokerLoadData, TopBundles
from trimtab.balance.shed import (
    HasPolicies,
    Owner,
    ShedConfig,
    Shedder,
    ShedResult,
    ShedState,
    Transferable,
    threshold_shedder,
    transfer_shedder,
)
from trimtab.sim.legacy import legacy_threshold_shedder, overload_shedder, uniform_load_shedder

Legacy = Callable[
    [
        Mapping[str, bool],
        Mapping[str, BrokerLoadData],
        Mapping[str, TopBundles],
        Owner,
        ShedState,
        ShedConfig,
        int,
        Transferable,
    ],
    ShedResult,
]


def _legacy(fn: Legacy) -> Shedder:
    """A legacy shedder as the shedding job calls a shedder. Pulsar's modular load manager knows nothing of
    trimtab's placement policies (``has_policies`` is not asked), and its load data holds the live brokers
    only (a broker's entry goes with its registration), where trimtab's views keep a dead broker's last
    report until it is tombstoned or expires: the legacy shedders see the live brokers' reports only."""

    def shed(
        brokers: Mapping[str, bool],
        loads: Mapping[str, BrokerLoadData],
        top: Mapping[str, TopBundles],
        owner: Owner,
        state: ShedState,
        cfg: ShedConfig,
        now_ms: int,
        /,
        *,
        transferable: Transferable,
        has_policies: HasPolicies | None,
    ) -> ShedResult:
        live_loads = {b: v for b, v in loads.items() if b in brokers}
        live_top = {b: v for b, v in top.items() if b in brokers}
        return fn(brokers, live_loads, live_top, owner, state, cfg, now_ms, transferable)

    return shed


SHEDDERS: dict[str, Shedder | None] = {
    "transfer": transfer_shedder,
    "threshold": threshold_shedder,
    "legacy-overload": _legacy(overload_shedder),
    "legacy-threshold": _legacy(legacy_threshold_shedder),
    "legacy-uniform": _legacy(uniform_load_shedder),
    "none": None,
}


def shedder_for(policy: str) -> Shedder | None:
    try:
        return SHEDDERS[policy]
    except KeyError:
        raise ValueError(f"unknown policy {policy!r} (known: {', '.join(SHEDDERS)})") from None
