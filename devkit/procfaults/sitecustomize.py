"""Process faults for the chaos suite, loaded by Python at start-up (``sitecustomize``) in every process
the local cluster starts with this folder on ``PYTHONPATH``. The dev kit's only: no deployment loads it.

**A stepped wall clock** (``clock_skew``). With ``$TRIMTAB_CLOCK_SKEW_FILE`` set, ``time.time()`` and
``time.time_ns()`` -- the wall clock every timestamp trimtab writes comes from -- return the real time plus
the offset in that file (seconds, may be negative; re-read at most every 0.2 s, so the suite steps a running
node's clock by rewriting it). The monotonic clock is left alone, as a real wall-clock step (NTP, a VM
resumed) leaves it: leases and timeouts must not notice. Why not libfaketime (Debian's ``faketime``): its
0.9.10 makes every ``time.sleep`` fail with ``EINVAL`` when the monotonic clock is not faked
(``FAKETIME_DONT_FAKE_MONOTONIC=1``), and faking it steps the monotonic clock too, which is not the fault.

**An agent whose lease check is disabled** (the checker's self-test, issue 31 point 5). With
``$TRIMTAB_FAULT_AGENT_IGNORES_SESSION=1`` the agent vouches for its broker's leases whatever ZooKeeper says:
:class:`~trimtab.agent.leases.LeaseGuard` never asks for a confirmation and always allows a full lease, and a
lost session fences nothing. It is the agent-side twin of a broker that ignores its leases
(``sim.honour_leases = false``): cut from ZooKeeper, it keeps its broker serving after the leader gave the
bundles away, and the chaos checker must report the overlap.
"""

import os
import time

_file = os.environ.get("TRIMTAB_CLOCK_SKEW_FILE")
if _file:
    _path: str = _file
    _real_time, _real_time_ns, _mono = time.time, time.time_ns, time.monotonic
    _state = [0.0, -1.0]  # offset (s), when it was read (monotonic)

    def _offset() -> float:
        now = _mono()
        if now - _state[1] >= 0.2:
            _state[1] = now
            try:
                with open(_path) as f:
                    _state[0] = float(f.read().strip() or 0)
            except (OSError, ValueError):
                pass  # keep the last offset: a half-written file is read again next time
        return _state[0]

    def _time() -> float:
        return _real_time() + _offset()

    def _time_ns() -> int:
        return _real_time_ns() + int(_offset() * 1e9)

    time.time = _time
    time.time_ns = _time_ns


if os.environ.get("TRIMTAB_FAULT_AGENT_IGNORES_SESSION") == "1":
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import sys
    from collections.abc import Callable, Sequence
    from types import ModuleType
    from typing import Any

    def _patch_leases(module: ModuleType) -> None:
        guard = module.LeaseGuard

        def bound(self: Any) -> float:
            return float(self.lease_s) + 3600.0  # as if the session had just been confirmed, always

        async def ensure_fresh(self: Any) -> None:
            return None

        guard.bound = bound
        guard.ensure_fresh = ensure_fresh

    def _patch_daemon(module: ModuleType) -> None:
        def session_lost(self: Any) -> None:
            return None  # keeps serving and vouching: nothing fenced, nothing marked stale

        module.Agent._session_lost = session_lost

    _PATCHES: dict[str, Callable[[ModuleType], None]] = {
        "trimtab.agent.leases": _patch_leases,
        "trimtab.agent.daemon": _patch_daemon,
    }

    class _PatchAfterImport(importlib.abc.MetaPathFinder):
        """Finds nothing itself: for the modules above, finds the real spec and patches the module once it
        has run."""

        def find_spec(
            self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
        ) -> importlib.machinery.ModuleSpec | None:
            patch = _PATCHES.get(name)
            if patch is None:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return spec
            loader: Any = spec.loader
            run = loader.exec_module

            def exec_module(module: ModuleType) -> None:
                run(module)
                patch(module)

            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _PatchAfterImport())
