"""Child processes that do not outlive their parent."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
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


def spawn_logged(
    cmd: list[str],
    log_path: Path,
    banner: str,
    *,
    cwd: Path,
    die_with_parent: bool,
    error: type[Exception],
) -> tuple[subprocess.Popen[bytes], int]:
    """Start a server process in a session of its own, its output appended to ``log_path`` (0600) after a
    ``===== trimtab: <banner> at <time> =====`` line; return it and the log offset where its output starts
    (what a readiness error quotes). A command that cannot run raises ``error``."""
    with open_log(log_path) as log:
        offset = log.tell()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log.write(f"\n===== trimtab: {banner} at {stamp} =====\n".encode())
        log.flush()
        hook = die_with_parent_hook() if die_with_parent else None
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=hook,  # noqa: PLW1509
            )
        except OSError as e:
            raise error(f"cannot run {cmd[0]!r}: {e}") from e
    return proc, offset
