"""Which brokers are in maintenance (``<root>/<cluster>/admin/maintenance/<broker>``), read by every
controller: the budget per failure domain counts them, and ``maintenance end`` removes them. Hostile values
are skipped with a reason (the broker then counts as in maintenance all the same: its znode exists)."""

from __future__ import annotations

import contextlib
from typing import Protocol

import msgspec
import structlog
from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from trimtab.cluster.zk import ZkPaths
from trimtab.errors import RequestError

log = structlog.get_logger("trimtab.controller")


class InMaintenance(msgspec.Struct, frozen=True, kw_only=True):
    operation: str
    reason: str
    requested_by: str
    started_ms: int
    deadline_ms: int
    failure_domain: str | None = None  # when it went in: the budget counts it there while it is down


_DEC = msgspec.json.Decoder(InMaintenance)
_ENC = msgspec.json.Encoder()


class MaintenanceStore(Protocol):
    def read(self) -> dict[str, InMaintenance | None]: ...

    def start(self, broker: str, entry: InMaintenance) -> None: ...

    def end(self, broker: str) -> bool: ...


class ZkMaintenance:
    def __init__(self, zk: KazooClient, paths: ZkPaths) -> None:
        self.zk = zk
        self.dir = f"{paths.admin}/maintenance"

    def read(self) -> dict[str, InMaintenance | None]:
        """broker -> its entry (None: unreadable, still in maintenance)."""
        try:
            names = sorted(self.zk.get_children(self.dir))
        except NoNodeError:
            return {}
        out: dict[str, InMaintenance | None] = {}
        for b in names:
            try:
                data, _ = self.zk.get(f"{self.dir}/{b}")
            except NoNodeError:
                continue
            try:
                out[b] = _DEC.decode(data or b"")
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                log.warning("maintenance_unreadable", broker=b[:100], reason=str(e))
                out[b] = None
        return out

    def start(self, broker: str, entry: InMaintenance) -> None:
        with contextlib.suppress(NodeExistsError):
            self.zk.ensure_path(self.dir)
        try:
            self.zk.create(f"{self.dir}/{broker}", _ENC.encode(entry))
        except NodeExistsError:
            raise RequestError(409, f"{broker} is in maintenance already") from None

    def end(self, broker: str) -> bool:
        try:
            self.zk.delete(f"{self.dir}/{broker}")
        except NoNodeError:
            return False
        return True
