"""The shedding policies a scenario can run side by side, by name.

``transfer`` and ``threshold`` are trimtab's own shedders (the leader's code path, balance.shed); the
``legacy-*`` ones are Pulsar's modular-load-manager shedders (sim.legacy), which unload without choosing
a destination -- the next lookup places the bundle; ``none`` never sheds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from trimtab.balance.load import BrokerLoadData, TopBundles
from trimtab.balance.shed import (
    Owner,
    ShedConfig,
    ShedResult,
    ShedState,
    Transferable,
    threshold_shedder,
    transfer_shedder,
)
from trimtab.sim.legacy import legacy_threshold_shedder, overload_shedder, uniform_load_shedder

Shedder = Callable[
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

SHEDDERS: dict[str, Shedder | None] = {
    "transfer": transfer_shedder,
    "threshold": threshold_shedder,
    "legacy-overload": overload_shedder,
    "legacy-threshold": legacy_threshold_shedder,
    "legacy-uniform": uniform_load_shedder,
    "none": None,
}


def shedder_for(policy: str) -> Shedder | None:
    try:
        return SHEDDERS[policy]
    except KeyError:
        raise ValueError(f"unknown policy {policy!r} (known: {', '.join(SHEDDERS)})") from None
