"""Placement policies in ZooKeeper (docs/placement.md): failure domains, namespace anti-affinity groups and
namespace isolation policies, each kept as one JSON map in one znode so that a change is one versioned
write (a conflicting concurrent change fails instead of being lost) and every node sees it whole.

* ``admin/failure_domains`` -> ``{"domains": {name: {"brokers": [id, ...]}}}``
* ``admin/anti_affinity``   -> ``{"groups": {namespace: group}}``
* ``admin/isolation``       -> ``{"policies": {name: {"namespaces": [re], "primary": [re], "secondary": [re],
  "min_limit": n}}}``

:class:`PlacementStore` reads and writes (blocking, kazoo); :class:`PlacementWatch` follows the three
znodes and hands every valid version to a listener. Znodes are hostile until decoded: an unreadable one is
counted, logged and ignored -- the last good version stays in force -- never fatal.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import msgspec
import structlog
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from trimtab.channel.values import Refused, StrictDecoder
from trimtab.cluster.zk import ZNODE_MAX_BYTES, ZkPaths, compare_and_set, versioned_write, zk_call
from trimtab.errors import ZnodeUnreadable

log = structlog.get_logger("trimtab.placement")


class FailureDomain(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    brokers: list[str]


class IsolationPolicyDoc(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    namespaces: list[str]
    primary: list[str]
    secondary: list[str] = []
    min_limit: int = 1


class FailureDomains(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    domains: dict[str, FailureDomain] = {}


class AntiAffinityGroups(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    groups: dict[str, str] = {}


class IsolationPolicies(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    policies: dict[str, IsolationPolicyDoc] = {}


class PlacementDocs(msgspec.Struct, frozen=True):
    """The three maps as last read (each the empty map when its znode does not exist)."""

    domains: FailureDomains = FailureDomains()
    groups: AntiAffinityGroups = AntiAffinityGroups()
    isolation: IsolationPolicies = IsolationPolicies()


_enc = msgspec.json.Encoder()
_KINDS: dict[str, type[msgspec.Struct]] = {
    "domains": FailureDomains,
    "groups": AntiAffinityGroups,
    "isolation": IsolationPolicies,
}
_DECODERS = {kind: StrictDecoder(t, ZNODE_MAX_BYTES) for kind, t in _KINDS.items()}


def znode_paths(paths: ZkPaths) -> dict[str, str]:
    return {
        "domains": paths.failure_domains,
        "groups": paths.anti_affinity,
        "isolation": paths.isolation,
    }


class PlacementStore:
    """Blocking reads and versioned writes of the three maps (callers on an event loop use a thread)."""

    def __init__(self, zk: KazooClient, paths: ZkPaths) -> None:
        self.zk = zk
        self.paths = znode_paths(paths)

    def read(self, kind: str) -> tuple[msgspec.Struct, int]:
        """The map of ``kind`` and its znode version (-1: absent). An unreadable znode raises
        :class:`ZnodeUnreadable`: a writer must not overwrite what it cannot read without an operator
        deciding to."""
        try:
            data, stat = zk_call(self.zk, self.zk.get, self.paths[kind])
        except NoNodeError:
            return _KINDS[kind](), -1
        doc = _DECODERS[kind].decode(data)
        if isinstance(doc, Refused):
            raise ZnodeUnreadable(
                f"{self.paths[kind]} is unreadable ({doc.reason}: {doc.detail}); repair or delete that znode "
                "with a ZooKeeper client, then retry"
            )
        return doc, stat.version

    def read_all(self) -> PlacementDocs:
        docs = {kind: self.read(kind)[0] for kind in _KINDS}
        return PlacementDocs(**docs)  # type: ignore[arg-type]

    def update(
        self, kind: str, change: Callable[[msgspec.Struct], msgspec.Struct], attempts: int = 5
    ) -> msgspec.Struct:
        """Read, ``change``, write if the znode is still at the version read: one
        :func:`~trimtab.cluster.zk.compare_and_set`, so a concurrent change is read again and ``change``
        applied to it, never lost; :class:`~trimtab.errors.ZkConflict` after ``attempts`` lost races.
        ``change`` may raise to refuse the change (nothing is written)."""

        def attempt() -> msgspec.Struct:
            doc, version = self.read(kind)
            new = change(doc)
            versioned_write(self.zk, self.paths[kind], _enc.encode(new), version)
            return new

        return compare_and_set(attempt, what=self.paths[kind], tries=attempts)


class PlacementWatch:
    """Follows the three znodes; calls ``listener(docs)`` (on kazoo's thread) with every valid version.

    An unreadable version keeps the last good one in force and counts ``unreadable`` (by kind)."""

    def __init__(self, zk: KazooClient, paths: ZkPaths, listener: Callable[[PlacementDocs], None]) -> None:
        self.zk = zk
        self.paths = znode_paths(paths)
        self.listener = listener
        self._lock = threading.Lock()
        self._docs: dict[str, msgspec.Struct] = {kind: t() for kind, t in _KINDS.items()}
        self.unreadable: dict[str, int] = dict.fromkeys(_KINDS, 0)

    @property
    def docs(self) -> PlacementDocs:
        with self._lock:
            return PlacementDocs(**self._docs)  # type: ignore[arg-type]

    def start(self) -> None:
        for kind, path in self.paths.items():
            self.zk.DataWatch(path, self._watcher(kind))

    def _watcher(self, kind: str) -> Callable[[bytes | None, object], bool]:
        def changed(data: bytes | None, stat: object) -> bool:
            if data is None and stat is None:
                doc: msgspec.Struct | Refused = _KINDS[kind]()
            else:
                doc = _DECODERS[kind].decode(data or b"")
            if isinstance(doc, Refused):
                self.unreadable[kind] += 1
                log.warning(
                    "placement_znode_unreadable",
                    path=self.paths[kind],
                    reason=doc.reason,
                    detail=doc.detail,
                    action="keeping the last good version",
                )
                return True
            with self._lock:
                self._docs[kind] = doc
            try:
                self.listener(self.docs)
            except Exception:
                log.exception("placement_listener_failed")
            return True

        return changed
