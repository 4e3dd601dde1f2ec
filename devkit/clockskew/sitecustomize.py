"""A stepped wall clock for the chaos suite's ``clock_skew`` fault: Python loads this module at start-up
(``sitecustomize``) in every process started with this folder on ``PYTHONPATH``.

With ``$TRIMTAB_CLOCK_SKEW_FILE`` set, ``time.time()`` and ``time.time_ns()`` -- the wall clock every
timestamp trimtab writes comes from -- return the real time plus the offset in that file (seconds, may be
negative; re-read at most every 0.2 s, so the suite steps a running node's clock by rewriting it). The
monotonic clock is left alone, as a real wall-clock step (NTP, a VM resumed) leaves it: leases and timeouts
must not notice.

Why not libfaketime (Debian's ``faketime``): its 0.9.10 makes every ``time.sleep`` fail with ``EINVAL``
when the monotonic clock is not faked (``FAKETIME_DONT_FAKE_MONOTONIC=1``), and faking it steps the
monotonic clock too, which is not the fault. This module is the dev kit's only: no deployment loads it.
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
