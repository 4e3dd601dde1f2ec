"""Snapshots, leader only: the channel table with the positions it reflects, written every
``channel.snapshot_interval_s`` in the crash-safe chunked format (channel/snapshot.py), so a node
bootstraps from the snapshot and the tail after it instead of the whole channel."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from trimtab.channel.client import ChannelClient
from trimtab.channel.snapshot import SnapshotWriter, read_snapshot_topic
from trimtab.channel.transport import Transport
from trimtab.controller.leadership import Leadership
from trimtab.controller.metrics import ControllerMetrics

log = structlog.get_logger("trimtab.controller")


class SnapshotJob:
    name = "snapshot"

    def __init__(
        self,
        channel: ChannelClient,
        writer: SnapshotWriter,
        leadership: Leadership,
        metrics: ControllerMetrics,
        *,
        transport: Transport,
        topic: str,
        perf: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.channel = channel
        self.writer = writer
        self.leadership = leadership
        self.metrics = metrics
        self.transport = transport
        self.topic = topic
        self.perf = perf

    async def on_lead(self) -> None:
        """Learn what snapshots exist (sequence numbers, chunks to collect later) before writing any."""
        msgs = await asyncio.to_thread(read_snapshot_topic, self.transport, self.topic)
        self.writer.observe(msgs)

    async def run_once(self) -> bool:
        """Write one snapshot; False when not leading, not caught up, or the write failed (counted)."""
        if not self.leadership.is_leader or not self.channel.ready:
            return False
        t0 = self.perf()
        table = self.channel.table
        states, positions = table.snapshot()
        partitions = table.partitions or len(positions)
        try:
            manifest = await asyncio.to_thread(
                self.writer.write, states, positions, partitions, self.leadership.term()
            )
        except Exception as e:
            self.metrics.snapshots.labels("failed").inc()
            log.warning("snapshot_failed", error=str(e))
            return False
        self.metrics.snapshots.labels("written").inc()
        self.metrics.snapshot_bundles.set(manifest.bundles)
        self.metrics.snapshot_seconds.observe(self.perf() - t0)
        return True
