"""The broker adapter: the only way the agent touches its broker (docs/design.md section 7).

Operations, all idempotent (a retry after a lost response must be harmless):

* ``sample()``   -- host figures (optional) and per-bundle stats;
* ``acquire(b)`` -- start serving bundle ``b``;
* ``fence(b)``   -- first phase of a release: stop accepting work for ``b`` (clients stay connected);
* ``close(b, redirect_url)`` -- second phase: disconnect ``b``'s clients, telling them where to go;
* ``prewarm(b)`` -- prepare to take ``b`` over quickly (warm standby);
* ``split(b, children)`` -- re-partition ``b``'s topics into the child ranges.

A release is fence then close (Pulsar's multi-phase transfer, PIP-307). :class:`RetryingAdapter` wraps any
adapter with timeouts, bounded exponential backoff and metrics; a call that finally fails raises
:class:`AdapterError` and the caller does not publish the next channel record, so a failing broker can stall
a transition (the leader resolves it after the in-flight timeout) but never corrupt the channel.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import msgspec
import structlog

from trimtab.balance.load import BundleStats, Usage
from trimtab.errors import AdapterError

log = structlog.get_logger("trimtab.adapter")

T = TypeVar("T")


class BrokerSample(msgspec.Struct, kw_only=True):
    """What a broker reports. Host figures left as None are filled in by the agent from the host."""

    cpu: Usage | None = None
    memory: Usage | None = None
    bandwidth_in: Usage | None = None
    bandwidth_out: Usage | None = None
    bundles: list[BundleStats] = msgspec.field(default_factory=list)


class BrokerAdapter(Protocol):
    kind: str

    async def sample(self) -> BrokerSample: ...

    async def acquire(self, bundle: str) -> None: ...

    async def fence(self, bundle: str) -> None: ...

    async def close(self, bundle: str, redirect_url: str | None) -> None: ...

    async def prewarm(self, bundle: str) -> None: ...

    async def split(self, bundle: str, children: list[str]) -> None: ...

    async def aclose(self) -> None: ...


class OperationAdapter:
    """The five bundle operations as one request each (``op`` plus a JSON body): what the webhook and
    command adapters share. Subclasses implement :meth:`_op` and :meth:`sample`."""

    async def _op(self, op: str, body: dict[str, Any]) -> None:
        raise NotImplementedError

    async def acquire(self, bundle: str) -> None:
        await self._op("acquire", {"bundle": bundle})

    async def fence(self, bundle: str) -> None:
        await self._op("fence", {"bundle": bundle})

    async def close(self, bundle: str, redirect_url: str | None) -> None:
        await self._op("close", {"bundle": bundle, "redirect_url": redirect_url})

    async def prewarm(self, bundle: str) -> None:
        await self._op("prewarm", {"bundle": bundle})

    async def split(self, bundle: str, children: list[str]) -> None:
        await self._op("split", {"bundle": bundle, "children": children})


# Called with (operation, result, seconds); result is "ok", "retry" or "failed".
CallObserver = Callable[[str, str, float], None]


class RetryingAdapter:
    """Timeouts, retries with exponential backoff, and an observer for metrics, around any adapter."""

    def __init__(
        self,
        inner: BrokerAdapter,
        *,
        timeout_s: float,
        retries: int,
        backoff_s: float,
        observe: CallObserver | None = None,
        max_backoff_s: float = 5.0,
    ) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._observe = observe or (lambda op, result, secs: None)

    async def _call(self, op: str, fn: Callable[[], Awaitable[T]]) -> T:
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            t0 = time.perf_counter()
            try:
                # asyncio.timeout (not wait_for): no extra task per call, which matters when a failover
                # makes one agent acquire thousands of bundles at once.
                async with asyncio.timeout(self.timeout_s):
                    result = await fn()
            except (AdapterError, TimeoutError, OSError) as e:
                final = attempt == self.retries
                self._observe(op, "failed" if final else "retry", time.perf_counter() - t0)
                reason = str(e) or type(e).__name__  # a bare TimeoutError has an empty message
                log.warning(
                    "adapter_call_failed",
                    op=op,
                    attempt=attempt + 1,
                    of=self.retries + 1,
                    error=reason,
                    final=final,
                )
                if final:
                    raise AdapterError(f"{op} failed after {attempt + 1} attempt(s): {reason}") from e
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)
            else:
                self._observe(op, "ok", time.perf_counter() - t0)
                return result
        raise AssertionError("unreachable")

    async def sample(self) -> BrokerSample:
        return await self._call("sample", self.inner.sample)

    async def acquire(self, bundle: str) -> None:
        await self._call("acquire", lambda: self.inner.acquire(bundle))

    async def fence(self, bundle: str) -> None:
        await self._call("fence", lambda: self.inner.fence(bundle))

    async def close(self, bundle: str, redirect_url: str | None) -> None:
        await self._call("close", lambda: self.inner.close(bundle, redirect_url))

    async def prewarm(self, bundle: str) -> None:
        await self._call("prewarm", lambda: self.inner.prewarm(bundle))

    async def split(self, bundle: str, children: list[str]) -> None:
        await self._call("split", lambda: self.inner.split(bundle, children))

    async def aclose(self) -> None:
        await self.inner.aclose()
