"""Settings an operator changes while the cluster runs, without a restart (issue 32 point 2).

Why: Cruise Control users stop and restart it to change how many moves run at once (its #431), losing the
work in progress. Here the operations' limits -- and healing's, whose plans are operations too -- are
*live*: an override stored in ZooKeeper
(``<root>/<cluster>/admin/config``) that every controller watches, so the leader's next pass -- and any
future leader's first -- uses it. Only the keys of :data:`LIVE_KEYS` may be overridden; every other setting
still needs a restart (it sizes a thread pool, a socket, a topic...).

Everything read from ZooKeeper is hostile until decoded: an override that does not decode, names a key that
is not live, or does not validate is refused as a whole, logged with the reason and counted
(:attr:`LiveSettings.unreadable`), and the settings in force stay as they were.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import structlog
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from pydantic import ValidationError

from trimtab.balance.heal import HealConfig
from trimtab.cluster.zk import ZkPaths, zk_call
from trimtab.config.settings import OperationSettings, Settings
from trimtab.errors import RequestError

log = structlog.get_logger("trimtab.controller")

#: The settings an override may change at run time (``section.field``).
LIVE_KEYS = frozenset(
    {
        "operations.max_in_flight",
        "operations.max_in_flight_per_broker",
        "operations.max_in_flight_per_namespace",
        "operations.republish_after_s",
        "healing.max_in_flight",
        "healing.max_in_flight_per_broker",
    }
)
_SECTIONS = ("operations", "healing")
MAX_BYTES = 64 * 1024


def effective(base: Settings, overrides: Mapping[str, Any]) -> Settings:
    """``base`` with ``overrides`` (``section.field`` -> value) applied; :class:`ValueError` naming the key
    and the reason when one is not live or does not validate. Pure."""
    unknown = sorted(set(overrides) - LIVE_KEYS)
    if unknown:
        raise ValueError(
            f"not settable at run time: {', '.join(unknown)} (live: {', '.join(sorted(LIVE_KEYS))})"
        )
    update: dict[str, Any] = {}
    for section in _SECTIONS:
        fields = {k.split(".", 1)[1]: v for k, v in overrides.items() if k.split(".", 1)[0] == section}
        current = getattr(base, section)
        try:
            update[section] = type(current).model_validate({**current.model_dump(), **fields})
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            raise ValueError(f"{section}.{where}: {first['msg']}") from None
    return base.model_copy(update=update)


def decode(value: bytes | None) -> dict[str, Any]:
    """The stored overrides, or :class:`ValueError` saying why they are not readable."""
    if not value:
        return {}
    if len(value) > MAX_BYTES:
        raise ValueError(f"{len(value)} bytes, more than {MAX_BYTES}")
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("overrides", {}), dict):
        raise ValueError("not an object with an 'overrides' object")
    return dict(obj.get("overrides", {}))


class LiveSettings:
    """The settings in force: the file's and environment's, with the live overrides on top."""

    def __init__(
        self,
        base: Settings,
        zk: KazooClient | None,
        paths: ZkPaths | None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``zk`` None: no live overrides (the simulator, unit tests): the base settings only."""
        self.base = base
        self.zk = zk
        self.path = paths.dynamic_config if paths is not None else ""
        self.clock = clock
        self.overrides: dict[str, Any] = {}
        self.by: str | None = None
        self.unreadable = 0
        self._in_force = base
        self._heal = HealConfig.from_settings(base)
        self._lock = threading.Lock()

    def operations(self) -> OperationSettings:
        return self._in_force.operations

    def heal_config(self) -> HealConfig:
        """Healing's settings in force (its throttles are live; the healing job reads them every round)."""
        return self._heal

    def _apply(self, overrides: dict[str, Any], in_force: Settings) -> None:
        with self._lock:
            self.overrides, self._in_force = overrides, in_force
            self._heal = HealConfig.from_settings(in_force)

    def start(self) -> None:
        """Watch the stored overrides (ZooKeeper's thread calls :meth:`_changed` now and on every change)."""
        if self.zk is not None:
            self.zk.DataWatch(self.path, self._changed)

    def _changed(self, data: bytes | None, _stat: Any) -> None:
        try:
            raw = decode(data)
            in_force = effective(self.base, raw)
        except ValueError as e:
            self.unreadable += 1
            log.warning("live_settings_unreadable", reason=str(e), action="keeping the settings in force")
            return
        self._apply(raw, in_force)
        log.info("live_settings", overrides=raw)

    def view(self) -> dict[str, Any]:
        return {
            "live_keys": sorted(LIVE_KEYS),
            "overrides": dict(self.overrides),
            "operations": self._in_force.operations.model_dump(),
            "healing": {
                k: getattr(self._in_force.healing, k) for k in ("max_in_flight", "max_in_flight_per_broker")
            },
        }

    def change(self, set_: Mapping[str, Any], reset: list[str], *, by: str) -> dict[str, Any]:
        """Apply ``set_`` and drop ``reset`` (keys) from the stored overrides, atomically against other
        writers (a versioned write), after validating the result; 400 with the reason, nothing changed,
        when it does not validate. Blocking (kazoo); ZooKeeper away is trimtab's ZooKeeper error (a
        retryable 503), as for every other write of the API."""
        if self.zk is None:
            raise RequestError(503, "live settings need ZooKeeper")
        unknown = sorted(set(reset) - LIVE_KEYS)
        if unknown:
            raise RequestError(
                400, f"not settable at run time: {', '.join(unknown)} (live: {', '.join(sorted(LIVE_KEYS))})"
            )
        for _ in range(5):
            try:
                data, stat = zk_call(self.zk, self.zk.get, self.path)
                version = stat.version
            except NoNodeError:
                data, version = b"", -1
            try:
                current = decode(data)
            except ValueError:
                current = {}  # unreadable: replaced by a valid one
            new = {k: v for k, v in {**current, **set_}.items() if k not in reset}
            try:
                in_force = effective(self.base, new)
            except ValueError as e:
                raise RequestError(400, str(e)) from None
            body = orjson.dumps({"overrides": new, "by": by, "ts": int(self.clock() * 1000)})
            try:
                if version < 0:
                    zk_call(self.zk, self.zk.create, self.path, body, makepath=True)
                else:
                    zk_call(self.zk, self.zk.set, self.path, body, version=version)
            except (BadVersionError, NodeExistsError):
                continue  # another writer came first: read again
            self._apply(new, in_force)
            log.info("live_settings_changed", overrides=new, by=by)
            return self.view()
        raise RequestError(
            409, "the live settings kept changing under this request; try again", retryable=True
        )
