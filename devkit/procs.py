"""Child processes that do not outlive their parent."""

from __future__ import annotations

import ctypes
import signal
import sys
import threading
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def die_with_parent_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when its parent dies (Linux), or None.

    Only from the main thread: PDEATHSIG fires when the *thread* that forked exits. ``prctl`` is looked up
    here, in the parent: between fork and exec the child must do as little as possible.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    sigkill = int(signal.SIGKILL)

    def hook() -> None:  # pragma: no cover - runs in the child
        prctl(_PR_SET_PDEATHSIG, sigkill)

    return hook
