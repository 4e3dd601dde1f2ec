"""What compiling the replay hot loop buys (issue 33: replay >= 1 000 000 records/s on one core): the
channel's resolution and table modules (``channel/resolve.py``, ``channel/table.py``) compiled with mypyc
-- which ships with mypy, a dev dependency, and compiles the type-annotated code unchanged -- against the
same code interpreted, on the same generated log, each in a fresh interpreter, the replayed table checked
in both.

A prototype, not a build step: the package is copied to a temporary directory, the two modules compiled
there (gcc and the Python headers are needed), and the compiled copy is imported by a child process
through ``PYTHONPATH``. Nothing in the repository or the installed package changes.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trimtab.devkit.bench.common import BenchError, Progress, progress_printer
from trimtab.devkit.layout import link_tree

COMPILED = ("trimtab/channel/resolve.py", "trimtab/channel/table.py")

_CHILD = r"""
import gc, json, statistics, sys
from trimtab.channel import table
from trimtab.devkit.bench import channel as c
records, bundles, runs = (int(x) for x in sys.argv[1:4])
log = c.generate_log(records, bundles, seed=1)
batches = c.batches_of(log.messages)
rates = []
for i in range(runs):
    gc.collect()
    t, _wall, cpu = c.replay_once(batches, log.partitions)
    c.check_table(t, log, f"run {i + 1}")
    rates.append(len(log.messages) / cpu)
    del t
print(json.dumps({"module": table.__file__, "rates": rates}))
"""


def _replay(env: dict[str, str], cwd: Path, records: int, bundles: int, runs: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(records), str(bundles), str(runs)],
        env=env,
        cwd=cwd,  # sys.path[0] of ``-c``: the copy's directory, or one without a trimtab in it
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise BenchError(f"replay child failed: {out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def run(
    *, records: int = 1_000_000, bundles: int = 100_000, runs: int = 5, progress: Progress | None = None
) -> dict[str, Any]:
    progress = progress or progress_printer("compiled")
    mypyc = shutil.which("mypyc", path=str(Path(sys.executable).parent)) or shutil.which("mypyc")
    if mypyc is None:
        raise BenchError("mypyc not found (it comes with mypy: pip install -e '.[dev]')")
    with tempfile.TemporaryDirectory(prefix="trimtab-mypyc-") as tmp:
        work = Path(tmp)
        linked = link_tree(work / "links")
        shutil.copytree(
            linked / "trimtab", work / "trimtab", symlinks=False, ignore=shutil.ignore_patterns("__pycache__")
        )
        progress(f"compiling {', '.join(COMPILED)} with mypyc...")
        t0 = time.perf_counter()
        built = subprocess.run([mypyc, *COMPILED], cwd=work, capture_output=True, text=True, check=False)
        if built.returncode != 0:
            raise BenchError(f"mypyc failed: {built.stdout[-2000:]}{built.stderr[-2000:]}")
        compile_s = time.perf_counter() - t0
        env = dict(os.environ)
        interpreted = _replay(env, work / "links", records, bundles, runs)
        progress(f"interpreted: median {statistics.median(interpreted['rates']) / 1000:.0f}k records/s")
        env["PYTHONPATH"] = f"{work}{os.pathsep}{env.get('PYTHONPATH', '')}"
        compiled = _replay(env, work, records, bundles, runs)
        if interpreted["module"].endswith(".so") or not compiled["module"].endswith(".so"):
            raise BenchError(
                f"imported {interpreted['module']} and {compiled['module']}: not the pair compared"
            )
        progress(f"compiled: median {statistics.median(compiled['rates']) / 1000:.0f}k records/s")
    i, c = statistics.median(interpreted["rates"]), statistics.median(compiled["rates"])
    return {
        "bench": "compiled",
        "records": records,
        "bundles": bundles,
        "runs": runs,
        "compiled_modules": list(COMPILED),
        "compile_s": round(compile_s, 1),
        "replay_records_per_s_interpreted": round(i),
        "replay_records_per_s_compiled": round(c),
        "speedup": round(c / i, 2),
        "interpreted_runs": [round(r) for r in interpreted["rates"]],
        "compiled_runs": [round(r) for r in compiled["rates"]],
        "what": "records replayed per CPU-second into a fresh table (checked against the generator), the "
        "channel's resolve and table modules interpreted vs compiled unchanged with mypyc",
    }
