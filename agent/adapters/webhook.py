"""The HTTP webhook adapter: any broker that implements this small JSON contract can be managed.

Contract (docs/broker-adapter.md; machine-readable in docs/webhook-openapi.json, generated from the
reference implementation in :mod:`agent.adapters.webhook_server`):

=======  ==============================  ===========================================================
GET      /trimtab/v1/load                -> BrokerSample JSON (host figures optional)
POST     /trimtab/v1/bundles/acquire     {"bundle", "lease_s", "apply_by_ms"}       start serving
POST     /trimtab/v1/bundles/renew       {"bundles": [...], "lease_s", "apply_by_ms"} -> {"not_serving"}
POST     /trimtab/v1/bundles/fence       {"bundle"}                                 stop accepting work
POST     /trimtab/v1/bundles/close       {"bundle", "redirect_url"}                 disconnect clients
POST     /trimtab/v1/bundles/prewarm     {"bundle"}                                 warm standby
POST     /trimtab/v1/bundles/split       {"bundle", "children": [...]}              re-partition topics
=======  ==============================  ===========================================================

Any 2xx is success; anything else (or no answer within the timeout) is a failure that the agent retries.
Every operation must be idempotent. With ``broker.adapter.hmac_key`` every call is signed
(:mod:`agent.adapters.signing`).
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson

from trimtab.agent.adapters.base import BrokerSample, OperationAdapter, decode_sample
from trimtab.agent.adapters.signing import sign
from trimtab.errors import AdapterError

PREFIX = "/trimtab/v1"
MAX_ANSWER_BYTES = 16 << 20


class WebhookAdapter(OperationAdapter):
    kind = "webhook"

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 10.0,
        *,
        hmac_key: bytes | None = None,
        verify: str | bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._key = hmac_key
        self._client = httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s, verify=verify)

    def _headers(self, method: str, path: str, body: bytes) -> dict[str, str]:
        headers = {"content-type": "application/json"} if body else {}
        if self._key is not None:
            headers.update(sign(self._key, int(time.time() * 1000), method, path, body))
        return headers

    async def _op(self, op: str, body: dict[str, Any]) -> Any:
        path = f"{PREFIX}/bundles/{op}"
        raw = orjson.dumps(body)
        what = body.get("bundle") or f"{len(body.get('bundles', []))} bundles"
        try:
            r = await self._client.post(path, content=raw, headers=self._headers("POST", path, raw))
        except httpx.HTTPError as e:
            raise AdapterError(f"{op} {what}: {type(e).__name__}: {e}") from e
        if not r.is_success:
            raise AdapterError(f"{op} {what}: HTTP {r.status_code}: {r.text[:200]}")
        if len(r.content) > MAX_ANSWER_BYTES:
            raise AdapterError(f"{op} {what}: answer of {len(r.content)} bytes is too large")
        try:
            return orjson.loads(r.content) if r.content else None
        except orjson.JSONDecodeError as e:
            if op == "renew":  # the only operation whose answer the agent reads
                raise AdapterError(f"{op}: the broker's answer is not JSON: {e}") from e
            return None

    async def sample(self) -> BrokerSample:
        path = f"{PREFIX}/load"
        try:
            r = await self._client.get(path, headers=self._headers("GET", path, b""))
        except httpx.HTTPError as e:
            raise AdapterError(f"sample: {type(e).__name__}: {e}") from e
        if not r.is_success:
            raise AdapterError(f"sample: HTTP {r.status_code}: {r.text[:200]}")
        return decode_sample(r.content, "the broker's load report")

    async def aclose(self) -> None:
        await self._client.aclose()
