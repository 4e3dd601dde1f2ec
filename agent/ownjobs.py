"""What an agent's own periodic decisions over the bundles it owns -- the automatic splits
(agent/splits.py) and merges (agent/merges.py) -- are built from: the same collaborators for both, gathered
once by the agent's wiring and by the simulator's agents."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from trimtab.agent.adapters.base import Sampler
from trimtab.agent.metrics import AgentMetrics
from trimtab.agent.reporter import LoadReporter
from trimtab.channel.client import ChannelClient
from trimtab.cluster.events import EventPublisher


@dataclass(frozen=True)
class OwnerJobs:
    """``reporter``: the figures of the last load report (else ``adapter`` samples afresh); ``paused``: the
    broker is draining (automatic splits and merges wait)."""

    me: str
    channel: ChannelClient
    reporter: LoadReporter
    adapter: Sampler
    events: EventPublisher
    metrics: AgentMetrics
    paused: Callable[[], bool]
    clock: Callable[[], float] = time.time
