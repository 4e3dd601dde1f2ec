"""Signed webhook calls (scheme v2): what the agent signs, and everything a broker checks before it acts.

A broker acts on a call only if it proves three things: it comes from the agent (HMAC-SHA256 under the
shared key), it is meant for *this* broker (the target broker id is signed), and it is new (a timestamp in a
tight window and a nonce this broker has not accepted before). v1 signed only the timestamp, method, path and
body and accepted a call for 30 s either way: the ``close`` an agent sent to one broker during a transfer,
replayed byte for byte to the broker that had just taken the bundle over, made that broker stop serving it.

The string signed (every field but the body is free of newlines, so the framing is unambiguous)::

    trimtab-webhook-v2\\n<broker id>\\n<METHOD>\\n<request target>\\n<timestamp ms>\\n<nonce>\\n<body>

* broker id -- the agent's ``broker.id``, which the broker knows as its own;
* METHOD -- upper case (``GET``, ``POST``);
* request target -- the path and query string exactly as on the HTTP request line (percent-encoding as
  sent, ``?query`` only when the query is not empty; no scheme, host or fragment);
* timestamp -- unix milliseconds in decimal, no sign, no leading zeros;
* nonce -- 32 lower-case hex digits (128 random bits), fresh for every attempt;
* body -- the raw bytes of the request body (empty for ``GET``).

Headers: ``X-Trimtab-Broker``, ``X-Trimtab-Timestamp``, ``X-Trimtab-Nonce`` and ``X-Trimtab-Signature:
v2=<64 lower-case hex>``. :class:`Verifier` is the whole broker side in one pure object (an injected clock,
no I/O), written to be read by whoever implements the contract in another language: the checks, their order
and the answer to each refusal (docs/broker-adapter.md, "Signed calls", has the same in prose and a worked
example). The key never appears in a message, a log line or a ``repr``.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping

from trimtab.errors import ConfigError, SignatureRefused

SCHEME = "trimtab-webhook-v2"
SIGNATURE_PREFIX = "v2="

BROKER = "X-Trimtab-Broker"
TIMESTAMP = "X-Trimtab-Timestamp"
NONCE = "X-Trimtab-Nonce"
SIGNATURE = "X-Trimtab-Signature"
HEADERS = (BROKER, TIMESTAMP, NONCE, SIGNATURE)

#: How old a call may be when it arrives (its timestamp against the broker's clock). It covers the agent's
#: clock running behind plus the time from signing to the broker reading the headers; every retry is signed
#: anew, so a call that took longer is simply refused and retried, not lost. The lease protocol already needs
#: the two clocks within well under a second (a lease request must arrive before its ``apply_by_ms``, half of
#: ``lease_margin_s`` -- 1 s -- after it was sent), so 5 s adds no new requirement on NTP.
MAX_AGE_MS = 5_000
#: How far ahead of the broker's clock a timestamp may be: the agent's clock running ahead. Smaller than
#: MAX_AGE_MS because no delivery delay adds to it; 2 s is still a hundred times what NTP normally keeps.
MAX_AHEAD_MS = 2_000
#: At most this many nonces are remembered. Only calls whose signature verified are remembered, so they come
#: from the agent: a few per second, and bursts of thousands during a failover, stay far below it (each
#: entry is kept MAX_AGE_MS + MAX_AHEAD_MS at most: 100 000 entries is > 14 000 calls/s sustained, ~22 MB).
#: Past it the broker refuses (503, retryable) rather than forget a nonce that is still in the window.
MAX_NONCES = 100_000
#: How long (by the broker's monotonic clock) an accepted nonce is kept even after its call left the window,
#: while the cache is at most half full. Why: a forgotten nonce makes the broker refuse every timestamp at
#: or below the newest forgotten one (a replay of that call could otherwise pass after a step back), so
#: forgetting at the window's edge turned a wall-clock step back of the host running both an agent and its
#: broker into a stall of every call for the size of the step (the chaos suite's ``clock_skew``: 25 s of
#: refused calls, leases lapsing). Keeping nonces a minute by the monotonic clock keeps the floor a minute
#: behind, so steps back of up to ``RETAIN_MS - MAX_AHEAD_MS - MAX_AGE_MS`` (53 s) stall nothing; a larger
#: one still fails closed until the clock caught up. Under pressure (more than half of ``MAX_NONCES``) the
#: cache falls back to forgetting at the window's edge.
RETAIN_MS = 60_000
MIN_KEY_BYTES = 16

_NONCE = re.compile(r"[0-9a-f]{32}")
_SIGNATURE = re.compile(r"v2=[0-9a-f]{64}")
_TIMESTAMP_DIGITS = 15  # unix ms fits in 15 digits until the year 33658; longer is malformed


def wall_ms() -> int:
    """The wall clock in unix milliseconds: both ends of a call compare wall clocks."""
    return time.time_ns() // 1_000_000


def mono_ms() -> int:
    """The broker's monotonic clock in milliseconds: how long ago a nonce was accepted, whatever the wall
    clock did meanwhile."""
    return time.monotonic_ns() // 1_000_000


def new_nonce() -> str:
    """128 random bits as 32 lower-case hex digits: unique per call without coordination."""
    return secrets.token_hex(16)


def canonical(broker: str, method: str, target: str, ts_ms: int, nonce: str, body: bytes) -> bytes:
    """The exact bytes that are signed (see the module docstring)."""
    head = "\n".join((SCHEME, broker, method.upper(), target, str(ts_ms), nonce))
    return head.encode("utf-8") + b"\n" + body


def signature(key: bytes, broker: str, method: str, target: str, ts_ms: int, nonce: str, body: bytes) -> str:
    """The ``X-Trimtab-Signature`` value: ``v2=`` and the HMAC-SHA256 of :func:`canonical`, in hex."""
    digest = hmac.new(key, canonical(broker, method, target, ts_ms, nonce, body), hashlib.sha256)
    return SIGNATURE_PREFIX + digest.hexdigest()


def sign(
    key: bytes, broker: str, method: str, target: str, body: bytes, *, ts_ms: int, nonce: str
) -> dict[str, str]:
    """The four headers that sign one call to ``broker``."""
    return {
        BROKER: broker,
        TIMESTAMP: str(ts_ms),
        NONCE: nonce,
        SIGNATURE: signature(key, broker, method, target, ts_ms, nonce, body),
    }


def _check_key(key: bytes) -> bytes:
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"the webhook HMAC key must be at least {MIN_KEY_BYTES} bytes")
    return key


def _check_target(target: str) -> str:
    # What goes on the request line: visible ASCII, no spaces, starting with "/". Anything else cannot be
    # what the broker receives, and a newline would break the framing of the signed string.
    if not target.startswith("/") or not target.isascii() or not all(33 <= ord(c) <= 126 for c in target):
        raise ValueError(f"not an origin-form request target: {target!r}")
    return target


class Signer:
    """The agent's side: signs each call with a fresh timestamp and nonce (a retry is a new call).

    ``clock`` and ``nonces`` are injectable so the signed headers can be reproduced in tests."""

    __slots__ = ("_clock", "_key", "_nonces", "broker")

    def __init__(
        self,
        key: bytes,
        broker: str,
        *,
        clock: Callable[[], int] = wall_ms,
        nonces: Callable[[], str] = new_nonce,
    ) -> None:
        if not broker or "\n" in broker:
            raise ConfigError("signed webhook calls need the target broker id (broker.id)")
        self._key = _check_key(key)
        self.broker = broker
        self._clock = clock
        self._nonces = nonces

    def headers(self, method: str, target: str, body: bytes) -> dict[str, str]:
        """The headers for one call of ``method`` on ``target`` (path and query as sent) with ``body``."""
        return sign(
            self._key,
            self.broker,
            method,
            _check_target(target),
            body,
            ts_ms=self._clock(),
            nonce=self._nonces(),
        )

    def __repr__(self) -> str:
        return f"Signer(broker={self.broker!r}, key=<hidden>)"


def _refuse(reason: str, message: str) -> SignatureRefused:
    return SignatureRefused(401, reason, message)


class NonceCache:
    """The nonces of accepted calls, each kept until a replay of it would be refused anyway.

    An entry may be forgotten once its timestamp is older than the window's start (``ts < now - max_age``)
    *and* it was accepted more than ``retain_ms`` ago by the monotonic clock -- or, when the cache is more
    than half full, as soon as its timestamp left the window. So the cache holds at most
    (calls accepted per ms) x ``retain_ms`` entries, and never more than ``max_entries``: when full,
    :meth:`admit` refuses instead of evicting a live entry (an evicted nonce could be replayed).
    ``floor_ms`` is the newest timestamp ever forgotten: a timestamp at or below it is refused as stale even
    if the clock stepped back and the window would let it in, because its nonce may have been forgotten --
    every timestamp above the floor that was accepted is still remembered. Keeping nonces ``retain_ms``
    keeps the floor that far behind the clock, which is what lets a step back of the wall clock pass without
    refusing every new call (see :data:`RETAIN_MS`)."""

    __slots__ = ("_by_ts", "_seen", "floor_ms", "max_entries", "retain_ms")

    def __init__(self, max_entries: int = MAX_NONCES, retain_ms: int = RETAIN_MS) -> None:
        if max_entries < 1:
            raise ConfigError("the nonce cache needs room for at least one nonce")
        if retain_ms < 0:
            raise ConfigError("the nonce retention must not be negative")
        self.max_entries = max_entries
        self.retain_ms = retain_ms
        self._seen: set[str] = set()
        self._by_ts: list[tuple[int, int, str]] = []  # a heap of (ts, accepted at (mono ms), nonce)
        self.floor_ms = -1

    def __len__(self) -> int:
        return len(self._seen)

    def forget_before(self, oldest_ms: int, mono_now_ms: int = 0) -> None:
        """Forget nonces whose timestamp is older than ``oldest_ms`` (the window's start) and that were
        accepted more than ``retain_ms`` before ``mono_now_ms`` -- regardless of the latter while the cache
        is more than half full."""
        heap = self._by_ts
        kept_since = mono_now_ms - self.retain_ms
        while heap and heap[0][0] < oldest_ms:
            if heap[0][1] > kept_since and 2 * len(self._seen) <= self.max_entries:
                return  # retained a while longer (a later timestamp may be older by mono: kept too, safely)
            ts, _, nonce = heapq.heappop(heap)
            self._seen.discard(nonce)
            self.floor_ms = max(self.floor_ms, ts)

    def admit(self, nonce: str, ts_ms: int, mono_now_ms: int = 0) -> SignatureRefused | None:
        """Remember ``nonce``; or why not: seen before, at or below the floor, or the cache is full."""
        if ts_ms <= self.floor_ms:
            return _refuse(
                "stale",
                f"{TIMESTAMP} is not newer than calls this broker no longer remembers (did its clock step back "
                "by more than a minute?)",
            )
        if nonce in self._seen:
            return _refuse("replayed", f"this {NONCE} was already accepted: a call is accepted only once")
        if len(self._seen) >= self.max_entries:
            return SignatureRefused(
                503,
                "replay_cache_full",
                f"more than {self.max_entries} calls in the replay window: cannot tell a new call from a replay",
            )
        self._seen.add(nonce)
        heapq.heappush(self._by_ts, (ts_ms, mono_now_ms, nonce))
        return None


class Verifier:
    """The broker's side of the contract, pure: feed it the headers, method, request target and body of a
    call and it raises :class:`SignatureRefused` unless the broker may act on it. Thread-safe.

    The checks, in order (the first that fails answers):

    1. all four headers are present                               -- 401 ``missing_header``
    2. each is well-formed (timestamp digits, nonce 32 hex digits,
       signature ``v2=`` + 64 hex digits)                           -- 401 ``malformed_header``
    3. ``X-Trimtab-Broker`` is this broker's id                     -- 401 ``wrong_broker``
    4. ``now - max_age_ms <= timestamp``                            -- 401 ``stale``
    5. ``timestamp <= now + max_ahead_ms``                          -- 401 ``early``
    6. the signature, recomputed with *this broker's* id, matches
       (constant-time comparison)                                   -- 401 ``bad_signature``
    7. the timestamp is above the newest one forgotten
       (:class:`NonceCache`; fails only after a clock step back
       of more than ~53 s)                                          -- 401 ``stale``
    8. the nonce was not accepted before                            -- 401 ``replayed``
    9. the nonce cache has room                                     -- 503 ``replay_cache_full``

    Only a call that passed 1-6 reaches the cache, so nobody without the key can fill it, and a replay of a
    remembered call cannot add a second entry."""

    def __init__(
        self,
        key: bytes,
        broker: str,
        *,
        clock: Callable[[], int] = wall_ms,
        mono: Callable[[], int] = mono_ms,
        max_age_ms: int = MAX_AGE_MS,
        max_ahead_ms: int = MAX_AHEAD_MS,
        cache: NonceCache | None = None,
    ) -> None:
        if max_age_ms < 0 or max_ahead_ms < 0:
            raise ConfigError("the signature window must not be negative")
        if not broker:
            raise ConfigError("a broker verifying signed calls needs its own broker id")
        self._key = _check_key(key)
        self.broker = broker
        self._clock = clock
        self._mono = mono
        self.max_age_ms = max_age_ms
        self.max_ahead_ms = max_ahead_ms
        self.cache = cache if cache is not None else NonceCache()
        self._lock = threading.Lock()

    def verify(self, headers: Mapping[str, str], method: str, target: str, body: bytes) -> None:
        """Accept the call (and remember its nonce), or raise :class:`SignatureRefused`. ``target`` is the
        path and query string exactly as received (``raw_path`` + ``?`` + ``query_string`` in ASGI)."""
        h = {k.lower(): v for k, v in headers.items()}
        values = [h.get(name.lower()) for name in HEADERS]
        if any(not v for v in values):
            missing = ", ".join(name for name, v in zip(HEADERS, values, strict=True) if not v)
            raise _refuse("missing_header", f"unsigned call: {missing} required")
        broker, ts_raw, nonce, sig = (str(v) for v in values)
        if not (ts_raw.isascii() and ts_raw.isdigit() and len(ts_raw) <= _TIMESTAMP_DIGITS) or (
            ts_raw != str(int(ts_raw))
        ):
            raise _refuse("malformed_header", f"{TIMESTAMP} must be unix milliseconds, without leading zeros")
        if not _NONCE.fullmatch(nonce):
            raise _refuse("malformed_header", f"{NONCE} must be 32 lower-case hex digits")
        if not _SIGNATURE.fullmatch(sig):
            raise _refuse(
                "malformed_header", f"{SIGNATURE} must be {SIGNATURE_PREFIX}<64 lower-case hex digits>"
            )
        if not hmac.compare_digest(broker.encode("utf-8", "replace"), self.broker.encode()):
            raise _refuse(
                "wrong_broker", f"{BROKER} does not name this broker: the call was meant for another"
            )
        ts = int(ts_raw)
        now = self._clock()
        if ts < now - self.max_age_ms:
            raise _refuse(
                "stale", f"{TIMESTAMP} is {now - ts} ms old (at most {self.max_age_ms} ms are accepted)"
            )
        if ts > now + self.max_ahead_ms:
            raise _refuse(
                "early",
                f"{TIMESTAMP} is {ts - now} ms ahead of this broker's clock "
                f"(at most {self.max_ahead_ms} ms are accepted)",
            )
        expected = signature(self._key, self.broker, method, target, ts, nonce, body)
        if not hmac.compare_digest(sig.encode(), expected.encode()):
            raise _refuse(
                "bad_signature", "the signature does not match (wrong key, or the call was altered)"
            )
        with self._lock:
            mono = self._mono()
            self.cache.forget_before(now - self.max_age_ms, mono)
            refused = self.cache.admit(nonce, ts, mono)
        if refused is not None:
            raise refused

    def __repr__(self) -> str:
        return (
            f"Verifier(broker={self.broker!r}, window=-{self.max_age_ms}/+{self.max_ahead_ms} ms, "
            f"nonces={len(self.cache)}/{self.cache.max_entries}, key=<hidden>)"
        )
