"""Subprocesses for tests: the trimtab CLI and helper scripts, each in its own process group.

Output goes to files (never pipes: a chatty child cannot block on a full pipe while the test waits for
something else), every process is killed with its whole group when the owning :class:`Procs` closes, and
a process that outlives its timeout is killed before the failure is reported.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

REPO_ROOT = Path(__file__).resolve().parents[2]
# Variables of the parent that would leak into a child's configuration; the tests pass what they mean.
_KEEP_TRIMTAB_VARS = {"TRIMTAB_ZK_CLASSPATH", "TRIMTAB_KAFKA_CLASSPATH"}


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The parent's environment without TRIMTAB_* settings, unbuffered, with the repo importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMTAB_") or k in _KEEP_TRIMTAB_VARS}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


@dataclass(frozen=True)
class Finished:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        """stdout parsed as one JSON document."""
        try:
            return orjson.loads(self.stdout)
        except orjson.JSONDecodeError as e:
            raise AssertionError(f"{self.describe()}: stdout is not JSON ({e})") from e

    def check(self) -> Finished:
        """Assert a zero exit status (the message carries stderr)."""
        if self.returncode != 0:
            raise AssertionError(self.describe())
        return self

    def describe(self) -> str:
        return (
            f"{' '.join(self.argv[2:] if self.argv[1:2] == ['-m'] else self.argv)} exited {self.returncode}\n"
            f"--- stderr (tail) ---\n{_tail(self.stderr)}\n--- stdout (tail) ---\n{_tail(self.stdout)}"
        )


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


class Proc:
    """One child process in its own session/process group; stdout and stderr captured to files."""

    def __init__(
        self, argv: Sequence[str], *, name: str, log_dir: Path, cwd: Path, env: Mapping[str, str]
    ) -> None:
        self.argv = list(argv)
        self.name = name
        self.stdout_path = log_dir / f"{name}.out"
        self.stderr_path = log_dir / f"{name}.err"
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=cwd,
                env=dict(env),
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def is_running(self) -> bool:
        return self.popen.poll() is None

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def json_lines(self) -> list[Any]:
        """stdout's complete lines that parse as JSON (a helper script's event stream)."""
        out = []
        text = self.stdout()
        complete = text if text.endswith("\n") else text[: text.rfind("\n") + 1]
        for line in complete.splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                out.append(orjson.loads(line))
        return out

    def wait(self, timeout: float = 30.0) -> Finished:
        """Wait for exit; on timeout kill the group and fail with the captured output."""
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.name} did not exit within {timeout}s (killed)\n--- stderr (tail) ---\n{_tail(self.stderr())}"
                f"\n--- stdout (tail) ---\n{_tail(self.stdout())}"
            ) from None
        return Finished(self.argv, self.popen.returncode, self.stdout(), self.stderr())

    def signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole process group and reap the child."""
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5.0)

    def terminate(self, timeout: float = 5.0) -> int | None:
        """SIGTERM the group, then SIGKILL if it has not exited after ``timeout`` seconds."""
        self.signal_group(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.popen.poll()


class Procs:
    """Starts child processes for one test and kills every one of them (whole groups) on :meth:`close`."""

    def __init__(self, log_dir: Path, *, cwd: Path = REPO_ROOT) -> None:
        self.log_dir = log_dir
        self.cwd = cwd
        self.procs: list[Proc] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def spawn(
        self, argv: Sequence[str], *, name: str | None = None, env: Mapping[str, str] | None = None
    ) -> Proc:
        name = f"{len(self.procs):02d}-{name or Path(argv[0]).name}"
        proc = Proc(argv, name=name, log_dir=self.log_dir, cwd=self.cwd, env=child_env(env))
        self.procs.append(proc)
        return proc

    def python_module(
        self, module: str, *args: str, name: str | None = None, env: Mapping[str, str] | None = None
    ) -> Proc:
        """``python -m module args...`` with this interpreter (the venv's)."""
        return self.spawn(
            [sys.executable, "-m", module, *args], name=name or module.rsplit(".", 1)[-1], env=env
        )

    def trimtab(self, *args: str, name: str | None = None, env: Mapping[str, str] | None = None) -> Proc:
        """Start ``trimtab args...`` (as ``python -m trimtab.cli``); returns at once."""
        return self.python_module("trimtab.cli", *args, name=name or "trimtab-" + "-".join(args[:2]), env=env)

    def run_trimtab(
        self, *args: str, timeout: float = 30.0, env: Mapping[str, str] | None = None
    ) -> Finished:
        """Run ``trimtab args...`` to completion (killed and failed after ``timeout`` seconds)."""
        return self.trimtab(*args, env=env).wait(timeout)

    def close(self) -> None:
        # Signal every group, even of a child that exited: its own children may still be running.
        for proc in self.procs:
            proc.kill()

    def report(self, lines: int = 20) -> str:
        """The tail of every child's stderr, for failure reports."""
        parts = []
        for p in self.procs:
            state = "running" if p.is_running() else f"exit {p.returncode}"
            parts.append(f"--- {p.name} (pid {p.pid}, {state}) stderr ---\n{_tail(p.stderr(), lines)}")
        return "\n".join(parts)
