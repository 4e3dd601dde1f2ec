"""Persisted controller state in ZooKeeper: everything a new leader needs to carry on.

* ``admin/failed_brokers/<id>``   -> {"first_failure": ms, "recorded_by": ..., "term": n}
* ``admin/reassignments/<id>/<seq>`` -> {"bundles": {bundle: planned dst}, "created": ms, "term": n}
* ``admin/controller``             -> {"shedding_paused": bool, ...} operator switches

All blocking (kazoo); callers on the event loop use ``asyncio.to_thread``. The healer reads and writes
them through :class:`FailedBrokerStore` and :class:`PlanStore`; the simulator gives it the in-memory ones
of :mod:`trimtab.controller.memory_stores`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Protocol

import msgspec
import structlog
from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError, NotEmptyError

from trimtab.channel.values import Refused, StrictDecoder
from trimtab.cluster.zk import ZNODE_MAX_BYTES, ZkPaths
from trimtab.errors import ZooKeeperError

log = structlog.get_logger("trimtab.controller")


class FailedBroker(msgspec.Struct, frozen=True, kw_only=True):
    first_failure: int
    recorded_by: str = ""
    term: int = 0


class Chunk(msgspec.Struct, frozen=True, kw_only=True):
    bundles: dict[str, str | None]  # bundle -> planned destination
    created: int
    term: int = 0


class ControllerSwitches(msgspec.Struct, kw_only=True):
    shedding_paused: bool = False
    paused_by: str | None = None
    paused_at: int | None = None


_enc = msgspec.json.Encoder()
# Znodes are hostile until decoded too: an unreadable one is skipped (and logged), never fatal.
_fb = StrictDecoder(FailedBroker, ZNODE_MAX_BYTES)
_chunk = StrictDecoder(Chunk, ZNODE_MAX_BYTES)
_sw = StrictDecoder(ControllerSwitches, ZNODE_MAX_BYTES)


class FailedBrokerStore(Protocol):
    """The persisted first failure of each failed broker (KIP-46)."""

    def read(self) -> dict[str, FailedBroker]: ...

    def record(self, broker: str, when_ms: int, by: str, term: int) -> bool:
        """putIfAbsent; True when this call recorded it."""
        ...

    def clear(self, broker: str) -> None: ...


class PlanStore(Protocol):
    """The persisted healing plans: each failed broker's bundles in numbered chunks, with their planned
    destinations; a chunk is deleted once satisfied."""

    def read(self, broker: str) -> dict[int, Chunk]: ...

    def brokers(self) -> list[str]: ...

    def write_plan(self, broker: str, chunks: list[dict[str, str | None]], term: int) -> dict[int, Chunk]: ...

    def done(self, broker: str, seq: int) -> None: ...

    def drop(self, broker: str) -> None: ...


class FailedBrokers:
    def __init__(self, zk: KazooClient, paths: ZkPaths) -> None:
        self.zk = zk
        self.paths = paths

    def read(self) -> dict[str, FailedBroker]:
        out: dict[str, FailedBroker] = {}
        try:
            children = self.zk.get_children(self.paths.failed_brokers)
        except NoNodeError:
            return out
        for c in children:
            try:
                data, _ = self.zk.get(f"{self.paths.failed_brokers}/{c}")
            except NoNodeError:
                continue
            fb = _fb.decode(data)
            if isinstance(fb, Refused):
                log.warning("failed_broker_record_unreadable", broker=c, reason=fb.reason, detail=fb.detail)
                continue
            out[c] = fb
        return out

    def record(self, broker: str, when_ms: int, by: str, term: int) -> bool:
        """putIfAbsent: the *first* failure time survives restarts and failovers (KIP-46)."""
        try:
            self.zk.create(
                f"{self.paths.failed_brokers}/{broker}",
                _enc.encode(FailedBroker(first_failure=when_ms, recorded_by=by, term=term)),
                makepath=True,
            )
            return True
        except NodeExistsError:
            return False

    def clear(self, broker: str) -> None:
        with contextlib.suppress(NoNodeError):
            self.zk.delete(f"{self.paths.failed_brokers}/{broker}")


class Reassignments:
    def __init__(self, zk: KazooClient, paths: ZkPaths, *, clock: Callable[[], float] = time.time) -> None:
        self.zk = zk
        self.paths = paths
        self.clock = clock

    def _dir(self, broker: str) -> str:
        return f"{self.paths.reassignments}/{broker}"

    def read(self, broker: str) -> dict[int, Chunk]:
        out: dict[int, Chunk] = {}
        try:
            children = self.zk.get_children(self._dir(broker))
        except NoNodeError:
            return out
        for c in children:
            if not (c.isascii() and c.isdigit() and len(c) < 19):
                log.warning("heal_chunk_unreadable", broker=broker, chunk=c[:100], reason="bad_name")
                continue
            try:
                data, _ = self.zk.get(f"{self._dir(broker)}/{c}")
            except NoNodeError:
                continue
            chunk = _chunk.decode(data)
            if isinstance(chunk, Refused):
                log.warning("heal_chunk_unreadable", broker=broker, chunk=c, reason=chunk.reason)
                continue
            out[int(c)] = chunk
        return dict(sorted(out.items()))

    def brokers(self) -> list[str]:
        try:
            return sorted(self.zk.get_children(self.paths.reassignments))
        except NoNodeError:
            return []

    def write_plan(self, broker: str, chunks: list[dict[str, str | None]], term: int) -> dict[int, Chunk]:
        """Persist a plan in one transaction; returns it as :meth:`read` would (no need to read it back)."""
        now = int(self.clock() * 1000)
        tx = self.zk.transaction()
        with contextlib.suppress(NodeExistsError):
            self.zk.ensure_path(self._dir(broker))
        plan = {seq: Chunk(bundles=bundles, created=now, term=term) for seq, bundles in enumerate(chunks)}
        for seq, chunk in plan.items():
            tx.create(f"{self._dir(broker)}/{seq:06d}", _enc.encode(chunk))
        results = tx.commit()
        errors = [r for r in results if isinstance(r, Exception)]
        if errors:
            raise ZooKeeperError(f"could not persist the reassignment plan for {broker}: {errors[0]!r}")
        log.info(
            "reassignment_planned", broker=broker, chunks=len(chunks), bundles=sum(len(c) for c in chunks)
        )
        return plan

    def done(self, broker: str, seq: int) -> None:
        with contextlib.suppress(NoNodeError):
            self.zk.delete(f"{self._dir(broker)}/{seq:06d}")

    def drop(self, broker: str) -> None:
        with contextlib.suppress(NoNodeError, NotEmptyError):
            self.zk.delete(self._dir(broker), recursive=True)


class Switches:
    def __init__(self, zk: KazooClient, paths: ZkPaths) -> None:
        self.zk = zk
        self.paths = paths

    def read(self) -> ControllerSwitches:
        try:
            data, _ = self.zk.get(self.paths.controller_state)
        except NoNodeError:
            return ControllerSwitches()
        sw = _sw.decode(data)
        if isinstance(sw, Refused):
            log.warning("controller_switches_unreadable", reason=sw.reason, detail=sw.detail)
            return ControllerSwitches()
        return sw

    def write(self, sw: ControllerSwitches) -> None:
        data = _enc.encode(sw)
        try:
            self.zk.set(self.paths.controller_state, data)
        except NoNodeError:
            self.zk.create(self.paths.controller_state, data, makepath=True)
