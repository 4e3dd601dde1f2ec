"""A channel bootstrap in a fresh interpreter that holds nothing else (``python -m
trimtab.devkit.bench.fresh_node BOOTSTRAP TOPIC TIMEOUT``): prints one JSON line with the time from
``start()`` to ready, the CPU time, the replay stats and a digest of the table."""

from __future__ import annotations

import json
import sys

from trimtab.channel.client import ChannelClient
from trimtab.channel.kafka import KafkaTransport
from trimtab.cluster.logs import configure_logging
from trimtab.devkit.bench.channel import table_digest, time_to_ready


def main(bootstrap: str, topic: str, timeout: float) -> None:
    configure_logging("warning", json_logs=False)
    transport = KafkaTransport(bootstrap, client_id="bench-fresh-node")
    client = ChannelClient(transport, topic, snapshot_topic=None)
    ready = time_to_ready(client, timeout)
    client.stop()
    transport.close()
    print(
        json.dumps(
            {
                "ok": ready.ok,
                "error": repr(client.error),
                "elapsed": ready.elapsed,
                "cpu": ready.cpu,
                "records": client.follower.records if client.follower else 0,
                "stats": client.table.stats.as_dict(),
                "digest": table_digest(client.table.items()),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
