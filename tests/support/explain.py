"""The cluster explanation with every input at a quiet default (a balanced cycle, nothing failing or
waiting), so a test names only what it changes."""

from __future__ import annotations

from typing import Any

from trimtab.balance.explain import explain_cluster
from trimtab.balance.shed import ShedResult


def cluster(**kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "safe_mode": None,
        "shedding_enabled": True,
        "shedding_paused": False,
        "last": ShedResult([], "skip", "balanced", std=0.125),
        "target_std": 0.25,
        "healing": {},
        "waiting": {},
        "draining": [],
    }
    return explain_cluster(**{**args, **kw})
