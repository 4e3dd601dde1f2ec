"""Background jobs of both daemons, run one way.

Every periodic or event-driven piece of work an agent or a controller does in the background (lease
renewals, load reports, auto-splits, pre-warming, the controller's snapshots, monitor, shedding, standby
sets and healing, the liveness ticks) is a job: a name, a ``run_once`` coroutine function, and a
:class:`Schedule`. The :class:`JobRunner` runs each on its own task:

* at its schedule -- every ``every_s`` at the latest, at once when its ``wake`` event is set (after
  ``settle_s``, so a burst of wake-ups is one run), the first run at start or one interval later;
* only while its gate allows (the controller's jobs run only while leading; a gate closing and opening
  again restarts the first-run clock, as a new leader waits an interval before its first shedding cycle);
* guarded: an exception is logged as ``job_failed`` with the job's name and counted in
  ``trimtab_job_failures_total{task}``, and the job runs again at its next turn -- a background loop
  never dies silently, and no loop hand-writes its own try/except.

Why one runner: the agent's four hand-written loops and the controller's scheduler each caught, logged
and waited differently; a failure in one was visible only if its author remembered to log it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import structlog
from prometheus_client import CollectorRegistry, Counter

log = structlog.get_logger("trimtab.jobs")

#: How often a job whose gate is closed looks again (a controller taking over starts its jobs within it).
GATE_POLL_S = 0.25


@dataclass(frozen=True)
class Schedule:
    """When a job runs.

    ``every_s``: the longest time between two runs (the period of a periodic job, the resync of an
    event-driven one). ``wake``: an event that makes it run early (cleared when it does). ``first``:
    ``"now"`` runs it as soon as the runner starts (or the gate opens), ``"after"`` one ``every_s`` later.
    ``settle_s``: after a wake-up, wait this long before running, so a burst is one run. ``pause_s``: after
    each run, at least this long before the next, whatever wakes it.
    """

    every_s: float
    wake: asyncio.Event | None = None
    first: Literal["now", "after"] = "now"
    settle_s: float = 0.0
    pause_s: float = 0.0


@dataclass(frozen=True)
class Job:
    name: str
    run_once: Callable[[], Awaitable[Any]]
    schedule: Schedule
    gate: Callable[[], bool] | None = None  # run only while this holds


def job_failures_counter(registry: CollectorRegistry) -> Counter:
    """``trimtab_job_failures_total{task}``: the one failure count of every background job of a process
    (the label is not ``job``: Prometheus gives that one the scrape job's name)."""
    return Counter(
        "trimtab_job_failures_total",
        "Runs of a background job that raised, by task (logged as job_failed; the job runs again at its "
        "next turn).",
        ["task"],
        registry=registry,
    )


class JobRunner:
    def __init__(self, failures: Counter, *, mono: Callable[[], float] = time.monotonic) -> None:
        """``failures``: the process's ``trimtab_job_failures_total`` counter (label ``task``)."""
        self.failures = failures
        self.mono = mono
        self.jobs: list[Job] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._epoch = 0

    def restart_clocks(self) -> None:
        """Every job waits for its first run again, as when its gate opens (a new leadership term)."""
        self._epoch += 1

    def add(
        self,
        name: str,
        run_once: Callable[[], Awaitable[Any]],
        schedule: Schedule,
        *,
        gate: Callable[[], bool] | None = None,
    ) -> None:
        if any(j.name == name for j in self.jobs):
            raise ValueError(f"job {name!r} added twice")
        self.jobs.append(Job(name, run_once, schedule, gate))
        self.failures.labels(name)  # exported at 0 from the start, so a rate() alert has a series

    def start(self) -> None:
        """Start every job added so far (on the running loop)."""
        self._tasks = [asyncio.create_task(self._loop(j), name=f"job-{j.name}") for j in self.jobs]

    async def stop(self) -> None:
        """Cancel every job, waiting for each to finish cancelling (a run in progress is cancelled)."""
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, job: Job) -> None:
        try:
            await job.run_once()
        except asyncio.CancelledError:
            raise
        except Exception:
            self.failures.labels(job.name).inc()
            log.exception("job_failed", task=job.name)

    async def _loop(self, job: Job) -> None:
        s = job.schedule
        due: float | None = None  # when the next run is due; None until the gate (if any) is open
        epoch = self._epoch
        while True:
            if epoch != self._epoch:
                epoch, due = self._epoch, None
            if job.gate is not None and not job.gate():
                due = None
                await asyncio.sleep(min(GATE_POLL_S, s.every_s))
                continue
            if due is None:
                due = self.mono() + (s.every_s if s.first == "after" else 0.0)
            wait = due - self.mono()
            if wait > 0:
                # A gated job looks at its gate at least every GATE_POLL_S while it waits: a gate that
                # closes and opens again restarts the first-run clock even within one long interval.
                woken = await self._wait(s.wake, min(wait, GATE_POLL_S) if job.gate is not None else wait)
                if not woken:
                    continue  # look at the gate and the time again
                if s.settle_s > 0:
                    await asyncio.sleep(s.settle_s)
                if job.gate is not None and not job.gate():
                    continue  # the gate closed while settling
            if s.wake is not None:
                s.wake.clear()
            await self._run(job)
            due = self.mono() + s.every_s
            if s.pause_s > 0:
                await asyncio.sleep(s.pause_s)

    @staticmethod
    async def _wait(wake: asyncio.Event | None, seconds: float) -> bool:
        """Sleep ``seconds``, or less if ``wake`` is set; True when woken."""
        if wake is None:
            await asyncio.sleep(seconds)
            return False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await wake.wait()
            return True
        return False
