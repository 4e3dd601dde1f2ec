"""The HTTP webhook adapter: any broker that implements this small JSON contract can be managed.

Contract (docs/broker-adapter.md; machine-readable in docs/webhook-openapi.json, generated from the
reference implementation in :mod:`agent.adapters.webhook_server`):

=======  ==============================  =====================================================
GET      /trimtab/v1/load                -> BrokerSample JSON (host figures optional)
POST     /trimtab/v1/bundles/acquire     {"bundle"}                       start serving
POST     /trimtab/v1/bundles/fence       {"bundle"}                       stop accepting work
POST     /trimtab/v1/bundles/close       {"bundle", "redirect_url"}       disconnect clients
POST     /trimtab/v1/bundles/prewarm     {"bundle"}                       warm standby
POST     /trimtab/v1/bundles/split       {"bundle", "children": [...]}    re-partition topics
=======  ==============================  =====================================================

Any 2xx is success; anything else (or no answer within the timeout) is a failure that the agent retries.
Every operation must be idempotent.
"""

from __future__ import annotations

from typing import Any

import httpx
import msgspec

from trimtab.agent.adapters.base import BrokerSample, OperationAdapter
from trimtab.errors import AdapterError

PREFIX = "/trimtab/v1"
_sample_dec = msgspec.json.Decoder(BrokerSample)


class WebhookAdapter(OperationAdapter):
    kind = "webhook"

    def __init__(self, base_url: str, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s)

    async def _op(self, op: str, body: dict[str, Any]) -> None:
        try:
            r = await self._client.post(f"{PREFIX}/bundles/{op}", json=body)
        except httpx.HTTPError as e:
            raise AdapterError(f"{op} {body.get('bundle')}: {type(e).__name__}: {e}") from e
        if not r.is_success:
            raise AdapterError(f"{op} {body.get('bundle')}: HTTP {r.status_code}: {r.text[:200]}")

    async def sample(self) -> BrokerSample:
        try:
            r = await self._client.get(f"{PREFIX}/load")
        except httpx.HTTPError as e:
            raise AdapterError(f"sample: {type(e).__name__}: {e}") from e
        if not r.is_success:
            raise AdapterError(f"sample: HTTP {r.status_code}: {r.text[:200]}")
        try:
            return _sample_dec.decode(r.content)
        except msgspec.DecodeError as e:
            raise AdapterError(f"sample: the broker's load report is not a valid BrokerSample: {e}") from e

    async def aclose(self) -> None:
        await self._client.aclose()
