"""The broker adapter: the only way the agent touches its broker (docs/design.md section 7).

Operations, all idempotent (a retry after a lost response must be harmless):

* ``sample()``   -- host figures (optional) and per-bundle stats;
* ``acquire(b, lease)`` -- start serving bundle ``b`` under a lease;
* ``renew(bs, lease)`` -- extend the leases of the bundles ``bs``; answers which of them it does not serve;
* ``fence(b)``   -- first phase of a release: stop accepting work for ``b`` (clients stay connected);
* ``close(b, redirect_url)`` -- second phase: disconnect ``b``'s clients, telling them where to go;
* ``prewarm(b)`` -- prepare to take ``b`` over quickly (warm standby);
* ``split(b, children)`` -- re-partition ``b``'s topics into the child ranges;
* ``merge(parents, m)`` -- serve two adjacent bundles' topics as the one bundle ``m``, their union.

A release is fence then close (Pulsar's multi-phase transfer, PIP-307).

Leases: a broker serves a bundle only while its lease runs. The lease runs from the moment the broker
receives the acquire or renew request for ``lease.seconds``; at its end the broker stops serving the bundle
on its own (fenced bundles are closed too), without being told -- that is what makes a paused, partitioned
or crashed agent safe beside a broker that keeps running. A request received after ``lease.apply_by_ms``
(unix milliseconds) must be refused: a request that sat in a socket buffer must not extend a lease the
agent can no longer vouch for. See :mod:`agent.leases` for how long a lease the agent may grant. :class:`RetryingAdapter` wraps any
adapter with timeouts, bounded exponential backoff and metrics; a call that finally fails raises
:class:`AdapterError` and the caller does not publish the next channel record, so a failing broker can stall
a transition (the leader resolves it after the in-flight timeout) but never corrupt the channel.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class Lease:
    """How long a broker may serve a bundle without hearing from its agent again."""

    seconds: float
    apply_by_ms: int  # unix ms: refuse the request if it arrives later than this

    def to_json(self) -> dict[str, Any]:
        return {"lease_s": self.seconds, "apply_by_ms": self.apply_by_ms}


class Sampler(Protocol):
    """What the load reporter and the split scheduler ask of a broker: its figures now. Every
    :class:`BrokerAdapter` is one; the simulator's brokers are only that."""

    async def sample(self) -> BrokerSample: ...


class BrokerAdapter(Protocol):
    kind: str

    async def sample(self) -> BrokerSample: ...

    async def acquire(self, bundle: str, lease: Lease) -> None: ...

    async def renew(self, bundles: Sequence[str], lease: Lease) -> list[str]: ...

    async def fence(self, bundle: str) -> None: ...

    async def close(self, bundle: str, redirect_url: str | None) -> None: ...

    async def prewarm(self, bundle: str) -> None: ...

    async def split(self, bundle: str, children: list[str]) -> None: ...

    async def merge(self, parents: list[str], merged: str) -> None: ...

    async def aclose(self) -> None: ...


class OperationAdapter:
    """The bundle operations as one request each (``op`` plus a JSON body): what the webhook and
    command adapters share. Subclasses implement :meth:`_op` and :meth:`sample`."""

    async def _op(self, op: str, body: dict[str, Any]) -> Any:
        """Send one operation; returns the decoded JSON answer (None when there is none)."""
        raise NotImplementedError

    async def acquire(self, bundle: str, lease: Lease) -> None:
        await self._op("acquire", {"bundle": bundle, **lease.to_json()})

    async def renew(self, bundles: Sequence[str], lease: Lease) -> list[str]:
        answer = await self._op("renew", {"bundles": list(bundles), **lease.to_json()})
        return not_serving_from(answer, bundles)

    async def fence(self, bundle: str) -> None:
        await self._op("fence", {"bundle": bundle})

    async def close(self, bundle: str, redirect_url: str | None) -> None:
        await self._op("close", {"bundle": bundle, "redirect_url": redirect_url})

    async def prewarm(self, bundle: str) -> None:
        await self._op("prewarm", {"bundle": bundle})

    async def split(self, bundle: str, children: list[str]) -> None:
        await self._op("split", {"bundle": bundle, "children": children})

    async def merge(self, parents: list[str], merged: str) -> None:
        await self._op("merge", {"parents": parents, "bundle": merged})


_sample_dec = msgspec.json.Decoder(BrokerSample)


def decode_sample(raw: bytes, what: str) -> BrokerSample:
    """A broker's load report (its bytes, hostile until decoded) as a :class:`BrokerSample`, or an
    :class:`AdapterError` saying why not. msgspec raises ``UnicodeDecodeError`` -- not ``DecodeError`` --
    for invalid UTF-8 inside a string (a bundle name), so both are caught here, once for every adapter."""
    try:
        return _sample_dec.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise AdapterError(f"sample: {what} is not a valid BrokerSample: {e}") from e


def not_serving_from(answer: Any, asked: Sequence[str]) -> list[str]:
    """The ``not_serving`` list of a renew answer, kept to the bundles that were asked about: the answer
    is the broker's bytes and must not make the agent drop (or invent) anything else."""
    if not isinstance(answer, dict):
        raise AdapterError("renew: the answer is not a JSON object with a not_serving list")
    listed = answer.get("not_serving", [])
    if not isinstance(listed, list) or not all(isinstance(b, str) for b in listed):
        raise AdapterError("renew: not_serving must be a list of bundle names")
    wanted = set(asked)
    return [b for b in dict.fromkeys(listed) if b in wanted]


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
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.inner = inner
        self.wall = wall
        self.kind = inner.kind
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._observe = observe or (lambda op, result, secs: None)

    async def _call(self, op: str, fn: Callable[[], Awaitable[T]], until: float | None = None) -> T:
        """``until``: a wall-clock time after which an attempt is refused anyway (a lease's apply_by): no
        retry is made that would start after it."""
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            t0 = time.perf_counter()
            try:
                # asyncio.timeout (not wait_for): no extra task per call, which matters when a failover
                # makes one agent acquire thousands of bundles at once.
                async with asyncio.timeout(self.timeout_s):
                    result = await fn()
            except (AdapterError, TimeoutError, OSError) as e:
                too_late = until is not None and self.wall() + delay >= until
                final = attempt == self.retries or too_late
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
                    why = (
                        ""
                        if attempt == self.retries
                        else " (a retry would arrive after the lease's apply_by)"
                    )
                    raise AdapterError(f"{op} failed after {attempt + 1} attempt(s){why}: {reason}") from e
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)
            else:
                self._observe(op, "ok", time.perf_counter() - t0)
                return result
        raise AssertionError("unreachable")

    async def sample(self) -> BrokerSample:
        return await self._call("sample", self.inner.sample)

    async def acquire(self, bundle: str, lease: Lease) -> None:
        """Retried only while a retry can still arrive before the lease's ``apply_by_ms``: the broker
        refuses it after that, so a late retry is load for nothing -- and the backoff before it holds one of
        the reconciler's few workers. Found by the long chaos run: on a starved machine every late acquire
        was sent three more times, 1.4 s of backoff each, while hundreds of bundles queued behind them and
        the cluster did not settle within a minute. The reconciler plans the bundle again with a fresh
        lease instead."""
        await self._call(
            "acquire", lambda: self.inner.acquire(bundle, lease), until=lease.apply_by_ms / 1000.0
        )

    async def renew(self, bundles: Sequence[str], lease: Lease) -> list[str]:
        """One attempt, bounded by the time the lease request may take to arrive: a late renewal is
        useless (the broker refuses it) and the renewer tries again on its next round anyway."""
        t0 = time.perf_counter()
        budget = max(0.05, lease.apply_by_ms / 1000.0 - time.time())
        try:
            async with asyncio.timeout(min(self.timeout_s, budget)):
                out = await self.inner.renew(bundles, lease)
        except (AdapterError, TimeoutError, OSError) as e:
            self._observe("renew", "failed", time.perf_counter() - t0)
            raise AdapterError(f"renew failed: {str(e) or type(e).__name__}") from e
        self._observe("renew", "ok", time.perf_counter() - t0)
        return out

    async def fence(self, bundle: str) -> None:
        await self._call("fence", lambda: self.inner.fence(bundle))

    async def close(self, bundle: str, redirect_url: str | None) -> None:
        await self._call("close", lambda: self.inner.close(bundle, redirect_url))

    async def prewarm(self, bundle: str) -> None:
        await self._call("prewarm", lambda: self.inner.prewarm(bundle))

    async def split(self, bundle: str, children: list[str]) -> None:
        await self._call("split", lambda: self.inner.split(bundle, children))

    async def merge(self, parents: list[str], merged: str) -> None:
        await self._call("merge", lambda: self.inner.merge(parents, merged))

    async def aclose(self) -> None:
        await self.inner.aclose()
