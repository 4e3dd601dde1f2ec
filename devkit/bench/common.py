"""Helpers shared by the lookup, shed and failover benchmarks: percentiles, progress lines, the environment
block every result carries, and the error a failed correctness check raises."""

from __future__ import annotations

import contextlib
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from trimtab.errors import DevKitError

Progress = Callable[[str], None]


class BenchError(DevKitError):
    """A correctness check failed: the bench prints no figures and exits non-zero."""


def progress_printer(name: str) -> Progress:
    def progress(msg: str) -> None:
        print(f"[bench {name} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    return progress


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by the nearest-rank method: a value that was actually observed."""
    if not values:
        raise ValueError("no values")
    s = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(s)))
    return s[min(rank, len(s)) - 1]


def summary_ms(values_s: Sequence[float], digits: int = 3) -> dict[str, float | int]:
    """p50/p90/p99/max/mean in milliseconds of durations given in seconds."""
    ms = [v * 1000 for v in values_s]
    return {
        "n": len(ms),
        "p50": round(percentile(ms, 50), digits),
        "p90": round(percentile(ms, 90), digits),
        "p99": round(percentile(ms, 99), digits),
        "max": round(max(ms), digits),
        "mean": round(sum(ms) / len(ms), digits),
    }


@contextlib.contextmanager
def bench_workdir(
    workdir: Path | None, prefix: str, progress: Progress, *, keep: bool = False
) -> Iterator[Path]:
    """The clusters' directory: a temporary one unless given. Removed after a successful run (unless kept
    or given), kept -- and said where -- after a failed one, so its logs can be read."""
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield base
    except BaseException:
        progress(f"logs kept in {base}")
        raise
    if not keep and workdir is None:
        shutil.rmtree(base, ignore_errors=True)


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def versions(*dists: str) -> dict[str, str]:
    from importlib.metadata import version

    out: dict[str, str] = {}
    for dist in dists:
        with contextlib.suppress(Exception):
            out[dist] = version(dist)
    if "confluent-kafka" in dists:
        with contextlib.suppress(Exception):
            import confluent_kafka

            out["librdkafka"] = confluent_kafka.libversion()[0]
    return out


def wrk_with_script(paths: Path, script: str) -> list[str]:
    """``[wrk, "-s", <script>]``: Debian's wrk and a Lua script written beside ``paths`` (the file of request
    paths the script reads), for the benchmarks that load an agent from outside (lookup, storm)."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise BenchError("wrk not found: scripts/setup.sh installs it (Debian package wrk)")
    lua = paths.with_suffix(".lua")
    lua.write_text(script)
    return [wrk, "-s", str(lua)]


def environment(load_start: list[float] | None, *dists: str, note: str = "") -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "loadavg_start": load_start,
        "loadavg_end": loadavg(),
        "versions": versions(*dists),
        "note": note
        or "other processes on the machine share its cores (see loadavg): compare runs on a quiet machine",
    }


class ChannelWatch:
    """An independent replica of the channel in the bench process: a :class:`channel.client.ChannelClient`
    over its own Kafka client (the same settings the nodes use), recording every accepted change with the
    wall-clock time this process saw it. Record timestamps (``ts``) are the writers' wall clocks: on one
    machine they share the clock with ``time.time()`` here, to the millisecond."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        fetch_wait_max_ms: int,
        linger_ms: float = 5.0,
        client_config: dict[str, str] | None = None,
    ) -> None:
        from trimtab.channel.client import ChannelClient
        from trimtab.channel.kafka import KafkaTransport

        self.transport = KafkaTransport(
            bootstrap,
            client_config=client_config,
            client_id="trimtab-bench-watch",
            linger_ms=linger_ms,
            fetch_wait_max_ms=fetch_wait_max_ms,
        )
        self.client = ChannelClient(self.transport, topic, None)
        self.changes: list[tuple[str, Any, float]] = []  # (bundle, new record or None, seen at wall s)
        self.client.table.add_listener(self._on_change)

    def _on_change(self, key: str, old: Any, new: Any) -> None:
        self.changes.append((key, new, time.time()))  # list.append is atomic under the GIL

    def start(self, timeout: float = 60.0) -> ChannelWatch:
        self.client.start()
        if not self.client.wait_ready(timeout):
            raise BenchError(f"the bench's channel replica did not catch up within {timeout}s")
        return self

    @property
    def table(self) -> Any:
        return self.client.table

    def stop(self) -> None:
        self.client.stop()
        with contextlib.suppress(Exception):
            self.transport.close()
