"""HMAC signatures of webhook calls, so a broker can reject calls that do not come from its agent.

The agent signs ``<timestamp ms>\\n<METHOD>\\n<path>\\n<body>`` with HMAC-SHA256 and the shared key and sends
``X-Trimtab-Timestamp: <ms>`` and ``X-Trimtab-Signature: sha256=<hex>``. The broker recomputes it and
refuses a missing or wrong signature, and a timestamp further than the allowed skew from its own clock (a
captured call cannot be replayed later). Comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

TIMESTAMP = "X-Trimtab-Timestamp"
SIGNATURE = "X-Trimtab-Signature"
DEFAULT_SKEW_MS = 30_000


def signature(key: bytes, ts_ms: int, method: str, path: str, body: bytes) -> str:
    msg = b"%d\n%s\n%s\n" % (ts_ms, method.upper().encode(), path.encode()) + body
    return "sha256=" + hmac.new(key, msg, hashlib.sha256).hexdigest()


def sign(key: bytes, ts_ms: int, method: str, path: str, body: bytes) -> dict[str, str]:
    """The headers that sign one call."""
    return {TIMESTAMP: str(ts_ms), SIGNATURE: signature(key, ts_ms, method, path, body)}


def verify(
    key: bytes,
    headers: Mapping[str, str],
    method: str,
    path: str,
    body: bytes,
    now_ms: int,
    skew_ms: int = DEFAULT_SKEW_MS,
) -> str | None:
    """None if the call is signed by ``key`` and fresh; otherwise why it is refused (never the key)."""
    ts_raw = headers.get(TIMESTAMP.lower()) or headers.get(TIMESTAMP)
    sig = headers.get(SIGNATURE.lower()) or headers.get(SIGNATURE)
    if not ts_raw or not sig:
        return f"unsigned call: {TIMESTAMP} and {SIGNATURE} are required"
    if not ts_raw.isascii() or not ts_raw.isdigit() or len(ts_raw) > 15:
        return f"{TIMESTAMP} must be unix milliseconds"
    ts = int(ts_raw)
    if abs(now_ms - ts) > skew_ms:
        return f"{TIMESTAMP} is {abs(now_ms - ts)} ms away from this broker's clock (allowed {skew_ms})"
    if not hmac.compare_digest(sig.encode(errors="replace"), signature(key, ts, method, path, body).encode()):
        return "bad signature"
    return None
