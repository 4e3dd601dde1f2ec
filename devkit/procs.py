"""Child processes that do not outlive their parent."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

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


def open_log(path: Path) -> BinaryIO:
    """Open a child process's log for appending, readable by its owner only: a log line may name a file
    that holds a secret, or quote a request an attacker sent, and the dev kit's logs live in a shared
    workdir. An existing log is narrowed to 0600 too."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")
