"""A virtual-time asyncio event loop: the simulator's scheduler.

The daemons' jobs are coroutines run by :class:`~trimtab.cluster.runner.JobRunner` (``asyncio.sleep``,
``wait_for``, events); the simulator runs those same coroutines, so it needs an event loop -- one whose
clock is virtual. :class:`VirtualLoop` is an ordinary asyncio loop except that:

* ``time()`` is virtual: it starts at 0 and moves only when nothing is ready to run, straight to the next
  scheduled callback (the "selector" never blocks: it jumps) -- a run of an hour takes as long as its
  callbacks take, and no real sleep ever happens;
* callbacks due at the same instant run in the order they were scheduled (asyncio's own timer heap leaves
  that order to the heap's shape): a scenario's events and the jobs they trigger happen in a fixed order;
* work handed to a thread (``asyncio.to_thread``, ``run_in_executor``) runs inline, at once, on the loop's
  own thread: the controller's jobs do their ZooKeeper calls on worker threads, and a real thread would
  let virtual time run on while it works (and make the run depend on the OS scheduler);
* there is no I/O: nothing can wake it from outside, so the loop stops when nothing is scheduled before
  its horizon (:meth:`VirtualLoop.run_until`);
* the tasks of one simulated process (an agent: its reconciler's workers, the lookups it answers) are
  that :class:`Process`'s -- those it starts and every task they start in turn -- so that a kill -9 or a
  SIGSTOP ends them all at once, wherever each one was.

Single-threaded, no real time, no I/O: the same callbacks scheduled in the same order give the same run.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import Context
from typing import Any, TypeVar, TypeVarTuple

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class InlineExecutor(ThreadPoolExecutor):
    """Runs each submitted call at once, on the caller's thread (see the module docstring); a thread pool
    only in name (asyncio accepts no other kind as the default executor) -- it never starts a thread."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        fut: Future[T] = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as e:
            fut.set_exception(e)
        return fut


class _Timer(asyncio.TimerHandle):
    """A timer ordered by (when, scheduling order): FIFO among callbacks due at the same instant."""

    __slots__ = ("_key",)

    def __init__(
        self,
        when: float,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        loop: asyncio.AbstractEventLoop,
        context: Context | None,
        seq: int,
    ) -> None:
        super().__init__(when, callback, args, loop, context)
        self._key = (when, seq)

    def __lt__(self, other: object) -> bool:
        if isinstance(other, _Timer):
            return self._key < other._key
        if isinstance(other, asyncio.TimerHandle):
            return self.when() < other.when()
        return NotImplemented


class _JumpingSelector:
    """Stands in for the I/O selector: instead of waiting ``timeout`` for I/O, moves virtual time to the
    next scheduled callback -- or stops the loop when that is past the horizon (or there is none)."""

    def __init__(self, loop: VirtualLoop) -> None:
        self.loop = loop

    def select(self, timeout: float | None) -> list[Any]:
        loop = self.loop
        if timeout == 0:
            return []
        nxt = loop.next_due()
        if nxt is None or nxt > loop.horizon:
            loop.stop()
            return []
        loop.advance_to(nxt)
        return []

    def close(self) -> None:
        pass


class Process:
    """The tasks of one simulated process: those started through :meth:`run`, and every task those start
    in turn (a reconciler's workers, the resolution a lookup waits for, a confirmation of the session).
    :meth:`kill` cancels them all at once: a process killed or stopped does nothing more, wherever each
    task was (an acquire half done is not done)."""

    def __init__(self, loop: VirtualLoop, name: str) -> None:
        self.loop = loop
        self.name = name
        self.tasks: dict[asyncio.Task[Any], None] = {}  # in creation order (a set's order is the hash's)

    def run(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """Call ``fn`` on the loop's thread; the tasks it creates are this process's."""
        outer, self.loop.starting = self.loop.starting, self
        try:
            return fn(*args)
        finally:
            self.loop.starting = outer

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """A task of this process."""
        return self.run(self.loop.create_task, coro)

    def adopt(self, task: asyncio.Task[Any]) -> None:
        self.tasks[task] = None
        self.loop.owners[task] = self
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self.tasks.pop(task, None)
        self.loop.owners.pop(task, None)

    def kill(self) -> None:
        """Cancel every task of the process, newest first: a task shared by several others (a single-flight
        confirmation they all wait for) ends before those waiting for it, so none of them leaves it behind
        half cancelled for the next caller."""
        for task in reversed(list(self.tasks)):
            task.cancel()


class VirtualLoop(asyncio.BaseEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self._virtual_now = 0.0
        self._seq = itertools.count()
        self._selector = _JumpingSelector(self)
        self._exact()
        self.horizon = 0.0
        self.set_default_executor(InlineExecutor())
        self.starting: Process | None = None  # the process whose Process.run is on the stack
        self.owners: dict[asyncio.Task[Any], Process] = {}

    # ------------------------------------------------------------------ processes
    def create_task(  # type: ignore[override]
        self, coro: Coroutine[Any, Any, T], *, name: str | None = None, context: Context | None = None
    ) -> asyncio.Task[T]:
        """A task, adopted by the process that creates it (directly, or from one of its tasks)."""
        task = super().create_task(coro, name=name, context=context)
        current = asyncio.current_task(self)
        owner = self.starting or (self.owners.get(current) if current is not None else None)
        if owner is not None:
            owner.adopt(task)
        return task

    # ------------------------------------------------------------------ the virtual clock
    def time(self) -> float:
        return self._virtual_now

    def advance_to(self, t: float) -> None:
        if t > self._virtual_now:
            self._virtual_now = t
            self._exact()

    def _exact(self) -> None:
        """asyncio runs the timers due before ``time() + clock_resolution``: with a real clock's resolution
        a timer a few ulps ahead would run *before* its time, and a job that computes its wait from the
        clock (the JobRunner's ``due - mono()``) would schedule it again, for ever, without time moving.
        One ulp runs exactly the timers due now."""
        self._clock_resolution = math.ulp(self._virtual_now)

    def next_due(self) -> float | None:
        """When the next live (not cancelled) timer is due; None when nothing is scheduled."""
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        while scheduled and scheduled[0].cancelled():
            heapq.heappop(scheduled)
            self._timer_cancelled_count -= 1  # type: ignore[attr-defined]
        return scheduled[0].when() if scheduled else None

    def call_at(
        self,
        when: float,
        callback: Callable[[*Ts], object],
        *args: *Ts,
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        self._check_closed()  # type: ignore[attr-defined]
        timer = _Timer(when, callback, args, self, context, next(self._seq))
        heapq.heappush(self._scheduled, timer)  # type: ignore[attr-defined]
        timer._scheduled = True  # type: ignore[attr-defined]
        return timer

    def run_until(self, horizon: float) -> None:
        """Run every callback due at or before ``horizon`` (virtual seconds), and those they schedule in
        turn; return with the clock at the last one that ran (nothing due in between is skipped)."""
        self.horizon = horizon
        self.run_forever()

    # ------------------------------------------------------------------ no I/O
    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass  # nothing to wake: the loop never blocks
