"""A channel replica with snapshots as a separate process, for tests that pause it (SIGSTOP) past retention.

    python -m tests.support.channel_node --bootstrap-servers HOST:PORT --topic T --snapshot-topic S

Runs a :class:`channel.client.ChannelClient` (snapshot + tail, recovery on) and prints a JSON line on
stdout whenever what it reports changes: ``{"event": "status", "ready", "reason", "gaps", "recoveries",
"positions", "table"}`` (``table`` only while ready, as ``table_report`` gives it). A paused process stops
its librdkafka threads too, so -- unlike a blocked thread in the test process, whose consumer keeps
prefetching -- it really falls behind retention. Exits after ``--duration`` seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import orjson

from trimtab.channel.client import ChannelClient
from trimtab.channel.kafka import KafkaTransport
from trimtab.channel.replayfile import table_report
from trimtab.cluster.logs import configure_logging


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.buffer.write(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS) + b"\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="channel_node")
    ap.add_argument("--bootstrap-servers", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--snapshot-topic", required=True)
    ap.add_argument("--max-retry-s", type=float, default=0.5)
    ap.add_argument("--duration", type=float, default=120.0)
    args = ap.parse_args(argv)
    configure_logging("warning", json_logs=True)
    transport = KafkaTransport(args.bootstrap_servers, client_id=f"node-{os.getpid()}")
    client = ChannelClient(
        transport,
        args.topic,
        args.snapshot_topic,
        max_retry_s=args.max_retry_s,
    )
    end = time.monotonic() + args.duration
    last: Any = None
    try:
        client.start()
        while time.monotonic() < end:
            ready, reason = client.health()
            follower = client.follower
            status = {
                "event": "status",
                "pid": os.getpid(),
                "ready": ready,
                "reason": reason,
                "gaps": client.gaps,
                "recoveries": client.recoveries,
                "positions": {str(p): o for p, o in sorted((follower.positions if follower else {}).items())},
                "table": table_report(client.table)["table"] if ready else None,
            }
            if status != last:
                _emit(status)
                last = status
            time.sleep(0.05)
        return 0
    finally:
        client.stop()
        transport.close()


if __name__ == "__main__":
    sys.exit(main())
