"""The simulated broker as its agent sees it: a :class:`~trimtab.agent.adapters.base.BrokerAdapter` over
the engine's cluster model.

Each operation takes the model's time on the virtual clock (``model.acquire_s`` to take a bundle over,
``model.release_s`` to fence or close one, ``model.split_s`` to split one -- or merge two -- in place) and
then acts on the model: the broker serves the bundle, stops accepting work for it, disconnects its clients,
serves the children instead of the parent, or the merged bundle instead of its two parents. An operation
of a process that was killed or stopped meanwhile never completes (its task is cancelled,
:class:`~trimtab.sim.clock.Process`). The broker never fails and never refuses a lease: what can go wrong
between an agent and its broker is the production adapters' business, not the balance figures'.

The broker keeps serving without its agent until the engine's lease model stops it (a paused agent, a
ZooKeeper outage longer than a lease); a renewal asks nothing of it but which bundles it no longer serves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trimtab.agent.adapters.base import BrokerSample, Lease


@dataclass(frozen=True)
class BrokerModel:
    """What one broker's operations do to the cluster model (the engine's methods, for this broker)."""

    serve: Callable[[str], None]
    fence: Callable[[str], None]
    close: Callable[[str], None]
    split: Callable[[str, Sequence[str]], None]
    merge: Callable[[Sequence[str], str], None]
    serves: Callable[[str], bool]
    figures: Callable[[], BrokerSample]


class SimBroker:
    kind = "sim"

    def __init__(self, model: BrokerModel, *, acquire_s: float, release_s: float, split_s: float) -> None:
        self.model = model
        self.acquire_s = acquire_s
        self.release_s = release_s
        self.split_s = split_s

    async def sample(self) -> BrokerSample:
        """The broker's figures from the model (the load reporter's and the split scheduler's sampler)."""
        return self.model.figures()

    async def acquire(self, bundle: str, lease: Lease) -> None:
        await asyncio.sleep(self.acquire_s)
        self.model.serve(bundle)

    async def renew(self, bundles: Sequence[str], lease: Lease) -> list[str]:
        return [b for b in bundles if not self.model.serves(b)]

    async def fence(self, bundle: str) -> None:
        await asyncio.sleep(self.release_s)
        self.model.fence(bundle)

    async def close(self, bundle: str, redirect_url: str | None) -> None:
        await asyncio.sleep(self.release_s)
        self.model.close(bundle)

    async def prewarm(self, bundle: str) -> None:
        pass

    async def split(self, bundle: str, children: list[str]) -> None:
        await asyncio.sleep(self.split_s)
        self.model.split(bundle, children)

    async def merge(self, parents: list[str], merged: str) -> None:
        """Merging takes what a split takes: the topics change bundle in place, on one broker."""
        await asyncio.sleep(self.split_s)
        self.model.merge(parents, merged)

    async def aclose(self) -> None:
        pass
