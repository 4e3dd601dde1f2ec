"""Instructions per replayed record, counted by valgrind's callgrind: a figure that does not move with
the machine's load or its neighbours.

Wall-clock replay rates on a shared 2-core VM vary by ±25 % from run to run (see docs/benchmarks.md), which
hides a 5 % regression. callgrind counts the instructions the CPU executes instead: the same binary, code
and input give the same count (within a fraction of a percent) whatever else the machine is doing. The
figure is ``(instructions of load + replay - instructions of load) / records``, both runs in fresh
interpreters under callgrind, so interpreter start-up and reading the log cancel out.

``python -m bench.instructions LOG.pickle load|replay`` is the measured child; :func:`measure` drives it.
"""

from __future__ import annotations

import gc
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from trimtab.channel.transport import Message
from trimtab.devkit.bench.common import BenchError

BATCH = 5000


def available() -> bool:
    return shutil.which("valgrind") is not None


def _child(path: str, mode: str) -> None:
    with open(path, "rb") as f:
        # what measure() pickled: each Message as a plain (key, value, partition, offset) tuple
        messages: list[tuple[bytes | None, bytes | None, int, int]] = pickle.load(f)
    gc.freeze()
    from trimtab.channel.table import TableView

    if mode == "replay":
        view = TableView(4)
        for i in range(0, len(messages), BATCH):
            view.apply_all(messages[i : i + BATCH])
        print(view.stats.as_dict(), file=sys.stderr)


def _count(path: Path, mode: str) -> int:
    proc = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-m",
            "trimtab.devkit.bench.instructions",
            str(path),
            mode,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    m = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or m is None:
        raise BenchError(f"callgrind run ({mode}) failed: {proc.stderr[-2000:]}")
    return int(m.group(1))


def measure(messages: list[Message]) -> dict[str, Any]:
    """Instructions per record of ``TableView.apply_all`` over ``messages`` (batches of 5000)."""
    if not available():
        raise BenchError("valgrind is not installed (apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="trimtab-instr-") as tmp:
        path = Path(tmp) / "log.pickle"
        path.write_bytes(pickle.dumps([tuple(m) for m in messages], protocol=pickle.HIGHEST_PROTOCOL))
        load = _count(path, "load")
        replay = _count(path, "replay")
    return {
        "replay_instructions_per_record": round((replay - load) / len(messages), 1),
        "records": len(messages),
        "tool": "valgrind --tool=callgrind (instructions executed; repeatable within ~0.1 %)",
    }


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
