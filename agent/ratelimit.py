"""Per-client lookup rate limits: a token bucket per client address, for a bounded number of clients.

The lookup is public (brokers' clients call it without a token), so one client can flood an agent: each
lookup of an unowned bundle publishes to the channel, and each one of a namespace the agent has not seen
reads ZooKeeper. Each client address gets a bucket of ``burst`` lookups that refills at ``rate`` per
second; a lookup finding it empty is refused (429, ``Retry-After``) before it costs anything.

Pure and single-threaded (the agent's event loop calls it), with an injected monotonic clock, so the
property tests drive time themselves. Memory is bounded whatever the number of addresses: at most
``max_clients`` buckets are kept, the least recently used is forgotten first. A forgotten client starts
again with a full bucket, which can only favour it: eviction never refuses anyone.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


class TokenBucket:
    """``burst`` tokens at most, ``rate`` more per second; a take costs one. Starts full."""

    __slots__ = ("burst", "rate", "tokens", "updated")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs rate > 0 and burst >= 1 (got {rate}, {burst})")
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.updated = now

    def _refill(self, now: float) -> None:
        if now > self.updated:  # a clock that steps back refills nothing (and takes nothing back)
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now

    def take(self, now: float) -> float:
        """Take one token: 0.0 if there was one, else the seconds until there is (nothing is taken)."""
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


@dataclass(frozen=True)
class Verdict:
    """One lookup's admission: allowed, or refused with how long to wait before the next one can pass."""

    allowed: bool
    retry_after_s: float = 0.0
    refused_before: int = 0  # lookups of this client refused before this one, while tracked (logging)

    @property
    def retry_after_header(self) -> str:
        """``Retry-After`` in whole seconds (HTTP's delay-seconds), at least 1."""
        return str(max(1, math.ceil(self.retry_after_s)))


ALLOWED = Verdict(True)


class ClientRateLimiter:
    """A :class:`TokenBucket` per client, for the ``max_clients`` most recently seen clients (LRU).

    ``rate`` of 0 disables it: every lookup is allowed and nothing is tracked."""

    def __init__(
        self,
        rate: float,
        burst: int,
        max_clients: int,
        *,
        monotonic: Callable[[], float],
    ) -> None:
        if rate < 0 or burst < 1 or max_clients < 1:
            raise ValueError(
                f"need rate >= 0, burst >= 1, max_clients >= 1 (got {rate}, {burst}, {max_clients})"
            )
        self.rate = rate
        self.burst = burst
        self.max_clients = max_clients
        self._monotonic = monotonic
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self._refused: dict[str, int] = {}  # refusals so far, per tracked client (bounded with the buckets)
        self.evictions = 0

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def __len__(self) -> int:
        """Clients tracked now (never more than ``max_clients``)."""
        return len(self._buckets)

    def admit(self, client: str) -> Verdict:
        """Whether ``client`` (its address) may look up now; takes a token if so."""
        if not self.enabled:
            return ALLOWED
        now = self._monotonic()
        bucket = self._buckets.get(client)
        if bucket is None:
            bucket = self._buckets[client] = TokenBucket(self.rate, self.burst, now)
            while len(self._buckets) > self.max_clients:
                gone, _ = self._buckets.popitem(last=False)
                self._refused.pop(gone, None)
                self.evictions += 1
        else:
            self._buckets.move_to_end(client)
        wait = bucket.take(now)
        if wait == 0.0:
            return ALLOWED
        before = self._refused.get(client, 0)
        self._refused[client] = before + 1
        return Verdict(False, wait, before)


def worth_logging(refused_before: int) -> bool:
    """Log a client's first 20 refusals, then every thousandth: a flood cannot flood the log. (Counted
    whether or not lookups pass in between: a client flooding at twice its rate has every other lookup
    refused, and would otherwise be logged on each one.)"""
    return refused_before < 20 or refused_before % 1000 == 0
