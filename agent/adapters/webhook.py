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
POST     /trimtab/v1/bundles/merge       {"parents": [p, q], "bundle"}              serve p+q as bundle
=======  ==============================  ===========================================================

Any 2xx is success; anything else (or no answer within the timeout) is a failure that the agent retries.
Every operation must be idempotent. With ``broker.adapter.hmac_key`` every call is signed for this agent's
broker id (:mod:`agent.adapters.signing`): the signature covers the request target exactly as sent, so it
is computed on the built request, after the base URL's path was joined in. A broker reads at most
:data:`MAX_REQUEST_BYTES` of a body (413 beyond); the agent splits a renewal that would be larger.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
import orjson

from trimtab.agent.adapters.base import BrokerSample, Lease, OperationAdapter, decode_sample
from trimtab.agent.adapters.signing import Signer
from trimtab.errors import AdapterError, ConfigError

PREFIX = "/trimtab/v1"
MAX_ANSWER_BYTES = 16 << 20
#: The largest request body a broker must accept (and the reference broker reads; 413 beyond). The renew
#: body is the large one: 16 MiB carries 100 000 bundle names of up to ~160 characters each
#: (``tenant/namespace/0x00000000_0x40000000`` is 38); the agent splits a larger renewal into several calls.
MAX_REQUEST_BYTES = 16 << 20


class WebhookAdapter(OperationAdapter):
    kind = "webhook"

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 10.0,
        *,
        hmac_key: bytes | None = None,
        broker_id: str | None = None,
        verify: str | bool = True,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """``broker_id`` (the agent's ``broker.id``) is required with ``hmac_key``: a signed call names the
        broker it is meant for, so it cannot be replayed to another. ``transport`` is for tests (an
        in-process ASGI app)."""
        self.base_url = base_url.rstrip("/")
        if hmac_key is not None and not broker_id:
            raise ConfigError("a signing webhook adapter needs the broker id the calls are meant for")
        self._signer = Signer(hmac_key, broker_id) if hmac_key is not None and broker_id else None
        self.max_request_bytes = max_request_bytes
        self._client = httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout_s, verify=verify, transport=transport
        )

    async def _send(self, method: str, path: str, body: bytes) -> httpx.Response:
        """Build the request, then sign what will go on the wire: the target after the base URL's path
        was joined in, the body as encoded. Every call (and so every retry) gets a fresh timestamp and
        nonce."""
        headers = {"content-type": "application/json"} if body else {}
        request = self._client.build_request(method, path, content=body or None, headers=headers)
        if self._signer is not None:
            target = request.url.raw_path.decode("ascii")
            request.headers.update(self._signer.headers(method, target, body))
        return await self._client.send(request)

    async def _op(self, op: str, body: dict[str, Any]) -> Any:
        path = f"{PREFIX}/bundles/{op}"
        raw = orjson.dumps(body)
        what = body.get("bundle") or f"{len(body.get('bundles', []))} bundles"
        if len(raw) > self.max_request_bytes:
            raise AdapterError(f"{op} {what}: a body of {len(raw)} bytes is more than a broker accepts")
        try:
            r = await self._send("POST", path, raw)
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

    async def renew(self, bundles: Sequence[str], lease: Lease) -> list[str]:
        """One call, or several when the list would not fit in :attr:`max_request_bytes`: a renewal the
        broker refuses as too large would let every lease run out. Each batch is a complete renewal of
        its bundles (renew is idempotent per bundle), sent in turn."""
        gone: list[str] = []
        for batch in renew_batches(bundles, lease, self.max_request_bytes):
            gone.extend(await super().renew(batch, lease))
        return gone

    async def sample(self) -> BrokerSample:
        path = f"{PREFIX}/load"
        try:
            r = await self._send("GET", path, b"")
        except httpx.HTTPError as e:
            raise AdapterError(f"sample: {type(e).__name__}: {e}") from e
        if not r.is_success:
            raise AdapterError(f"sample: HTTP {r.status_code}: {r.text[:200]}")
        return decode_sample(r.content, "the broker's load report")

    async def aclose(self) -> None:
        await self._client.aclose()


def renew_batches(bundles: Sequence[str], lease: Lease, max_bytes: int) -> list[list[str]]:
    """``bundles`` cut, in order, into lists whose renew bodies each encode to at most ``max_bytes`` (one
    list when everything fits, the usual case). A name too long to fit alone still gets its own list: the
    broker's 413 then says what is wrong."""
    envelope = len(orjson.dumps({"bundles": [], **lease.to_json()}))
    out: list[list[str]] = [[]]
    size = envelope
    for b in bundles:
        name = len(orjson.dumps(b))
        if out[-1] and size + 1 + name > max_bytes:  # 1: the comma before it
            out.append([])
            size = envelope
        size += name + (1 if out[-1] else 0)
        out[-1].append(b)
    return out
