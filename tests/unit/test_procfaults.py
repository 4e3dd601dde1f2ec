"""The chaos suite's stepped wall clock (devkit/procfaults/sitecustomize.py): a process started with the
folder on PYTHONPATH reads its offset from the file, as often as the suite rewrites it; the monotonic clock
is never touched; a file it cannot read keeps the last offset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from trimtab.devkit.localcluster import PROCESS_FAULTS_DIR

PROBE = """
import json, time, datetime, sys
def read():
    return {"skew": round(time.time() - datetime.datetime.now().timestamp()),
            "skew_ns": round((time.time_ns() - datetime.datetime.now().timestamp() * 1e9) / 1e9),
            "mono": time.monotonic()}
out = [read()]
sys.stdout.write("ready\\n"); sys.stdout.flush()
for line in sys.stdin:  # one line per step of the suite: wait past the 0.2 s re-read, then read
    m = time.monotonic()
    while time.monotonic() - m < 0.25:
        pass
    out.append(read())
    sys.stdout.write("read\\n"); sys.stdout.flush()
print(json.dumps(out))
"""


def test_the_wall_clock_follows_the_file_and_the_monotonic_clock_does_not(tmp_path: Path) -> None:
    f = tmp_path / "skew"
    f.write_text("30\n")
    env = {**os.environ, "PYTHONPATH": str(PROCESS_FAULTS_DIR), "TRIMTAB_CLOCK_SKEW_FILE": str(f)}
    p = subprocess.Popen(
        [sys.executable, "-c", PROBE], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert p.stdin is not None and p.stdout is not None
    assert p.stdout.readline() == "ready\n"
    for content in ("-30\n", "garbage", "0\n"):
        f.write_text(content)
        p.stdin.write("step\n")
        p.stdin.flush()
        assert p.stdout.readline() == "read\n"  # read before the next step is written
    out, _ = p.communicate(timeout=30)
    reads = json.loads(out)
    assert [r["skew"] for r in reads] == [30, -30, -30, 0]  # garbage: the last offset stays
    assert [r["skew_ns"] for r in reads] == [30, -30, -30, 0]
    monos = [r["mono"] for r in reads]
    assert monos == sorted(monos) and monos[-1] - monos[0] < 10  # never stepped


def test_without_the_file_setting_nothing_changes(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(PROCESS_FAULTS_DIR)}
    env.pop("TRIMTAB_CLOCK_SKEW_FILE", None)
    code = "import time, datetime; print(round(time.time() - datetime.datetime.now().timestamp()))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"


IGNORES_SESSION_PROBE = """
import asyncio, json
from trimtab.agent import daemon, leases
guard = leases.LeaseGuard.__new__(leases.LeaseGuard)
guard.lease_s = 4.0
guard.confirmed_at = None  # never confirmed: a real guard allows no lease at all
bound = guard.bound()
try:
    asyncio.run(guard.ensure_fresh())  # the real one asks its ZooKeeper session (this guard has none)
    asked = False
except AttributeError:
    asked = True
agent = daemon.Agent.__new__(daemon.Agent)
print(json.dumps({"bound": bound, "asked_zookeeper": asked, "patched": agent._session_lost.__qualname__}))
"""


def test_an_agent_told_to_ignore_its_session_vouches_for_every_lease(tmp_path: Path) -> None:
    """The checker's self-test fault: with the variable set the agent's lease check is gone (a full lease
    with no confirmed session, a lost session fences nothing); without it, the same probe fails on the
    real guard, which allows nothing unconfirmed and would ask ZooKeeper."""
    base = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROCESS_FAULTS_DIR), *sys.path])}
    on = subprocess.run(
        [sys.executable, "-c", IGNORES_SESSION_PROBE],
        env={**base, "TRIMTAB_FAULT_AGENT_IGNORES_SESSION": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(on.stdout) == {
        "bound": 3604.0,
        "asked_zookeeper": False,
        "patched": "_patch_daemon.<locals>.session_lost",
    }
    off = subprocess.run(
        [sys.executable, "-c", IGNORES_SESSION_PROBE], env=base, capture_output=True, text=True, check=True
    )
    assert json.loads(off.stdout) == {"bound": 0.0, "asked_zookeeper": True, "patched": "Agent._session_lost"}
