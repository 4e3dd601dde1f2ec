"""``ChannelClient.publish_acked`` for test channels that fake only ``publish`` (a Future)."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any

from trimtab.channel.records import Record


class AckedPublish:
    """Mix into a fake channel whose ``publish`` returns a Future: waits for it as the real client does."""

    def publish(self, bundle: str, rec: Record) -> Future[Any]:
        raise NotImplementedError

    async def publish_acked(self, bundle: str, rec: Record, timeout_s: float) -> Any:
        return await asyncio.wait_for(asyncio.wrap_future(self.publish(bundle, rec)), timeout_s)
