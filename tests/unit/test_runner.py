"""The one runner of every background job (cluster/runner.py): failures are counted and survived, wake-ups
run a job early, gates hold it back, and a new leadership term restarts the first-run clock."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from trimtab.cluster.runner import JobRunner, Schedule, job_failures_counter
from trimtab.devkit.layout import folders


async def until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    """Yield to the loop until ``pred`` holds (a deadline, never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def runner() -> tuple[JobRunner, CollectorRegistry]:
    reg = CollectorRegistry()
    return JobRunner(job_failures_counter(reg)), reg


def recorder(then: Callable[[], None] = lambda: None) -> tuple[list[float], Callable[[], Awaitable[None]]]:
    """A job that records when it ran (then calls ``then``), and the list it records into."""
    runs: list[float] = []

    async def job() -> None:
        runs.append(time.monotonic())
        then()

    return runs, job


def failures(reg: CollectorRegistry, job: str) -> float:
    return reg.get_sample_value("trimtab_job_failures_total", {"task": job}) or 0.0


def test_a_failing_job_is_counted_logged_and_runs_again(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        jobs, reg = runner()
        calls: list[int] = []

        async def flaky() -> None:
            calls.append(1)
            if len(calls) <= 2:
                raise RuntimeError("boom")

        jobs.add("flaky", flaky, Schedule(0.01))
        assert failures(reg, "flaky") == 0.0  # exported before the first failure
        jobs.start()
        await until(lambda: len(calls) >= 4)
        await jobs.stop()
        assert failures(reg, "flaky") == 2.0

    asyncio.run(main())


def test_a_wake_runs_the_job_early_and_a_burst_is_one_run() -> None:
    async def main() -> None:
        jobs, _ = runner()
        wake = asyncio.Event()
        runs, job = recorder()
        jobs.add("woken", job, Schedule(60.0, wake=wake, first="after", settle_s=0.05))
        jobs.start()
        await asyncio.sleep(0)  # the job is waiting for its first turn (60 s away)
        assert runs == []
        for _ in range(5):
            wake.set()
            await asyncio.sleep(0)
        await until(lambda: len(runs) == 1)
        await asyncio.sleep(0.1)  # nothing else wakes it: still one run
        await jobs.stop()
        assert len(runs) == 1 and not wake.is_set()

    asyncio.run(main())


def test_a_closed_gate_holds_the_job_and_opening_it_waits_an_interval_first() -> None:
    async def main() -> None:
        jobs, _ = runner()
        open_ = False
        opened_at = 0.0
        runs, job = recorder()
        jobs.add("gated", job, Schedule(0.2, first="after"), gate=lambda: open_)
        jobs.start()
        await asyncio.sleep(0.3)
        assert runs == []  # more than an interval passed, but the gate was closed
        open_, opened_at = True, time.monotonic()
        await until(lambda: len(runs) >= 1)
        await jobs.stop()
        assert runs[0] - opened_at >= 0.2 - 0.01  # its first run came one interval after the gate opened

    asyncio.run(main())


def test_restart_clocks_makes_every_job_wait_its_first_interval_again() -> None:
    async def main() -> None:
        jobs, _ = runner()
        runs, job = recorder()
        jobs.add("periodic", job, Schedule(0.3, first="after"), gate=lambda: True)
        jobs.start()
        await asyncio.sleep(0.2)
        restarted = time.monotonic()
        jobs.restart_clocks()  # a new term, 0.2 s into the first interval
        await until(lambda: len(runs) >= 1)
        await jobs.stop()
        assert runs[0] - restarted >= 0.3 - 0.01

    asyncio.run(main())


def test_a_pause_after_each_run_spaces_runs_that_keep_being_woken() -> None:
    async def main() -> None:
        jobs, _ = runner()
        wake = asyncio.Event()
        runs, job = recorder(then=wake.set)  # as if every run caused the next wake-up (healing's records)
        jobs.add("busy", job, Schedule(60.0, wake=wake, pause_s=0.05))
        jobs.start()
        await until(lambda: len(runs) >= 4)
        await jobs.stop()
        gaps = [b - a for a, b in itertools.pairwise(runs)]
        assert min(gaps) >= 0.05 - 0.005

    asyncio.run(main())


def test_a_job_name_is_unique() -> None:
    jobs, _ = runner()

    def noop() -> Awaitable[None]:
        return asyncio.sleep(0)

    jobs.add("x", noop, Schedule(1.0))
    with pytest.raises(ValueError, match="added twice"):
        jobs.add("x", noop, Schedule(1.0))


def test_a_stop_in_the_same_turn_as_a_wake_up_still_stops_the_job() -> None:
    """Python 3.11's ``asyncio.wait_for`` returns the inner result when the caller is cancelled in the
    same loop turn as the awaited event fires -- the cancellation is lost. A job waiting for its wake-up
    that way ran on after ``stop()``, which then waited for it forever (an agent hung in CI, 30 s after
    two stops). The wake-up is set and the job cancelled back to back: the job must still end."""

    async def main() -> None:
        jobs, _ = runner()
        wake = asyncio.Event()
        runs, job = recorder()
        jobs.add("woken", job, Schedule(3600.0, wake=wake, first="after"))
        jobs.start()
        for _ in range(3):
            await asyncio.sleep(0)  # the job is now waiting for its wake-up
        task = jobs._tasks[0]
        wake.set()  # resolves the event's waiter first...
        task.cancel()  # ...then the job's own: both wake-ups land in the same turn
        done, _ = await asyncio.wait({task}, timeout=2.0)
        assert task in done and task.cancelled(), "the cancellation was swallowed: the job runs on"
        assert runs == []

    asyncio.run(main())


def test_no_module_waits_with_asyncio_wait_for() -> None:
    """The hazard above is in every ``asyncio.wait_for`` on this Python: the daemons use
    ``asyncio.timeout`` (which counts cancellations) or ``asyncio.wait`` instead."""
    root = Path(__file__).resolve().parents[2]
    offenders = [
        f"{p.relative_to(root)}:{n}"
        for folder in folders(root)
        for p in sorted((root / folder).rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "asyncio.wait_for(" in line and not line.lstrip().startswith("#")
    ]
    assert offenders == []
