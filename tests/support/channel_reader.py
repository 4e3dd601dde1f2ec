"""A live channel replica as a separate process, for replica-convergence tests.

    python -m tests.support.channel_reader --bootstrap-servers HOST:PORT --topic T [--end-prefix __end__/]

Follows the channel with :class:`channel.client.ChannelClient` (no snapshot) and prints JSON lines on
stdout:

* ``{"event": "ready", ...}`` once caught up (the test starts its writers only after every reader said so);
* ``{"event": "done", "report": {"table", "stats", "detail"}, "notified": n, ...}`` once it has applied an
  end-of-log sentinel in *every* partition, then exits 0.

The test writes the sentinels (keys ``<end-prefix><i>``, one per partition, not bundle names, so every
replica skips them as ``bad_key``) only after all writers are done; since each partition is read in order,
a reader that has applied all of them has applied everything written before. ``notified`` counts listener
calls: a reader that was live from the start must be notified of exactly the accepted records.
Exits 3 if it does not catch up or see the end within ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any

import orjson

from trimtab.channel.client import ChannelClient
from trimtab.channel.kafka import KafkaTransport
from trimtab.channel.records import Record
from trimtab.channel.replayfile import table_report
from trimtab.cluster.logs import configure_logging


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.buffer.write(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS) + b"\n")
    sys.stdout.flush()


def _fail(message: str) -> int:
    print(f"channel_reader: {message}", file=sys.stderr, flush=True)
    return 3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="channel_reader")
    ap.add_argument("--bootstrap-servers", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--end-prefix", default="__end__/")
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args(argv)
    configure_logging("warning", json_logs=True)
    deadline = time.monotonic() + args.timeout

    transport = KafkaTransport(args.bootstrap_servers, client_id=f"reader-{os.getpid()}")
    partitions = transport.partitions(args.topic)
    ends: dict[int, int] = {}
    all_ends = threading.Event()
    notified = 0

    def on_skip(key: str | None, partition: int | None, offset: int | None, reason: str) -> None:
        # Runs on the follower thread, in log order.
        if (
            key is not None
            and key.startswith(args.end_prefix)
            and partition is not None
            and offset is not None
        ):
            ends[partition] = offset
            if len(ends) == partitions:
                all_ends.set()

    def on_change(_bundle: str, _old: Record | None, _new: Record | None) -> None:
        nonlocal notified
        notified += 1

    client = ChannelClient(transport, args.topic, None, on_skip=on_skip, use_snapshot=False)
    client.table.add_listener(on_change)
    try:
        client.start()
        if not client.wait_ready(max(0.0, deadline - time.monotonic())):
            return _fail(f"not ready within {args.timeout}s (error: {client.error})")
        follower = client.follower
        assert follower is not None
        _emit({"event": "ready", "pid": os.getpid(), "records": follower.records, "partitions": partitions})
        if not all_ends.wait(max(0.0, deadline - time.monotonic())):
            return _fail(
                f"saw end sentinels in partitions {sorted(ends)} of {partitions} only (error: {client.error})"
            )
        # on_skip fires inside a batch; the batch (and its stats) is complete once positions pass the sentinels.
        while not all(follower.positions.get(p, 0) > o for p, o in ends.items()):
            if time.monotonic() > deadline:
                return _fail("the batch holding the last sentinel was never completed")
            time.sleep(0.005)
        report = table_report(client.table)
        report["detail"] = client.table.stats.detail()
        _emit(
            {
                "event": "done",
                "pid": os.getpid(),
                "report": report,
                "notified": notified,
                "records": follower.records,
                "positions": {str(p): o for p, o in sorted(follower.positions.items())},
            }
        )
        return 0
    finally:
        client.stop()
        transport.close()


if __name__ == "__main__":
    sys.exit(main())
