"""The reconciler shares the agent's event loop fairly.

Lease renewals, lookups and /healthz run on the same loop as the reconciler's workers. A plan that finishes
without suspending (an adapter that answers at once, a plan that only publishes) must still give the loop
back after each bundle: before that was so, one worker carried a whole failover of thousands of bundles
in a single step, renewals came seconds late and survivors lost the leases they had just taken.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from trimtab.agent.adapters.base import BrokerSample, Lease
from trimtab.agent.leases import LeaseGuard
from trimtab.agent.metrics import AgentMetrics
from trimtab.agent.reconciler import Reconciler
from trimtab.channel.records import Record, State, make

ME = "me:1"
WORKERS = 8
BUNDLES = 400


class InstantBroker:
    """An adapter whose every call completes without suspending (as an in-process broker does)."""

    def __init__(self) -> None:
        self.acquired: list[str] = []

    async def acquire(self, bundle: str, lease: Lease) -> None:
        self.acquired.append(bundle)

    async def renew(self, bundles: Sequence[str], lease: Lease) -> list[str]:
        return []

    async def fence(self, bundle: str) -> None: ...

    async def close(self, bundle: str, redirect_url: str | None) -> None: ...

    async def prewarm(self, bundle: str) -> None: ...

    async def split(self, bundle: str, children: list[str]) -> None: ...

    async def sample(self) -> BrokerSample:
        raise NotImplementedError

    async def aclose(self) -> None: ...


class Table(dict[str, Record]):
    pass


class Channel:
    """The two things the reconciler uses on the acquire path: the table and a fire-and-forget send."""

    def __init__(self, records: dict[str, Record]) -> None:
        self.table = Table(records)
        self.sent: list[str] = []

    def send(self, bundle: str, record: Record | None, on_done: Any) -> None:
        self.sent.append(bundle)


class Session:
    """A ZooKeeper session that is confirmed (the guard only asks for its timeout here)."""

    requested_timeout_s = 30.0
    connected = True

    def granted_timeout_s(self, wait_s: float = 5.0) -> float:
        return 30.0

    def confirm(self, timeout_s: float, path: str = "/") -> None: ...


def build_reconciler(
    channel: Any, broker: InstantBroker, workers: int = 32, guard: LeaseGuard | None = None
) -> Reconciler:
    """A reconciler for ``ME`` over ``channel`` and ``broker``; its lease guard ``guard``, or one whose
    ZooKeeper session was just confirmed."""
    if guard is None:
        metrics = AgentMetrics.create(CollectorRegistry())
        guard = LeaseGuard(Session(), lease_s=20.0, margin_s=2.0, metrics=metrics)  # type: ignore[arg-type]
        guard.confirmed_at = time.monotonic()
    metrics = guard.metrics
    return Reconciler(
        ME,
        channel,  # type: ignore[arg-type]
        broker,  # type: ignore[arg-type]
        url_of=lambda b: None,
        apply_split=lambda *a: None,
        metrics=metrics,
        on_served_change=lambda b, s: None,
        leases=guard,
        in_flight_timeout_s=30.0,
        workers=workers,
    )


def test_a_worker_gives_the_loop_back_after_each_bundle_even_when_nothing_suspends() -> None:
    async def main() -> list[int]:
        now_ms = int(time.time() * 1000)
        records = {
            f"t/ns/b{i:04d}": make(State.ASSIGNING, dst=ME, version=1, ts=now_ms, writer="leader")
            for i in range(BUNDLES)
        }
        channel = Channel(records)
        broker = InstantBroker()
        rec = build_reconciler(channel, broker, workers=WORKERS)
        for bundle in records:
            rec.mark(bundle)
        rec.start()
        # A probe that wants the loop as often as it can, like the lease renewer's timer: how many
        # bundles were acquired between two of its turns?
        seen: list[int] = []
        while rec.pending():
            seen.append(len(broker.acquired))
            await asyncio.sleep(0)
        await rec.stop()
        assert len(broker.acquired) == BUNDLES
        assert sorted(channel.sent) == sorted(records)  # each one's Owned record published
        return [b - a for a, b in itertools.pairwise(seen)]

    steps = asyncio.run(main())
    # Each worker takes at most one bundle per turn of the loop; without the yield the first worker
    # took all of them in one step.
    assert max(steps) <= WORKERS
