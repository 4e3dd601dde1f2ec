"""ZooKeeper behind one boundary (issue 30, point 4): ``cluster.zk.zk_call`` retries a command through
kazoo's ``KazooRetry`` and turns kazoo's failures into trimtab's errors; ``compare_and_set`` runs a
read-decide-write loop on the same helper. Fake kazoo clients: no server needed, every failure on cue."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import msgspec
import pytest
from kazoo.exceptions import BadVersionError, ConnectionLoss, NoAuthError, NodeExistsError, NoNodeError
from kazoo.retry import KazooRetry

from trimtab.cluster import zk
from trimtab.cluster.placement.store import FailureDomain, FailureDomains, PlacementStore
from trimtab.cluster.zk import ZkPaths, zk_call
from trimtab.devkit.layout import package_dirs
from trimtab.errors import RequestError, ZkAccessDenied, ZkConflict, ZkUnavailable

ROOT = Path(__file__).resolve().parents[2]


class Stat:
    def __init__(self, version: int) -> None:
        self.version = version


class FakeZk:
    """The few kazoo client calls the stores make, on an in-memory tree with versions; ``fail`` is raised
    (one per call) before the next calls run; ``rival`` runs before every ``set``/``create`` (another
    writer getting there first)."""

    def __init__(self, *, authenticated: bool = False) -> None:
        self.auth_data = {("digest", "u:p")} if authenticated else set()
        self.nodes: dict[str, tuple[bytes, int]] = {}
        self.fail: list[Exception] = []
        self.calls: list[str] = []
        self.rival: Any = None

    def _maybe_fail(self, op: str) -> None:
        self.calls.append(op)
        if self.fail:
            raise self.fail.pop(0)

    def get(self, path: str, watch: Any = None) -> tuple[bytes, Stat]:
        self._maybe_fail("get")
        if path not in self.nodes:
            raise NoNodeError()
        data, version = self.nodes[path]
        return data, Stat(version)

    def create(self, path: str, data: bytes, makepath: bool = False) -> str:
        self._maybe_fail("create")
        if self.rival is not None:
            self.rival(self)
        if path in self.nodes:
            raise NodeExistsError()
        self.nodes[path] = (data, 0)
        return path

    def set(self, path: str, data: bytes, version: int = -1) -> Stat:
        self._maybe_fail("set")
        if self.rival is not None:
            self.rival(self)
        if path not in self.nodes:
            raise NoNodeError()
        if version not in (-1, self.nodes[path][1]):
            raise BadVersionError()
        self.nodes[path] = (data, self.nodes[path][1] + 1)
        return Stat(self.nodes[path][1])


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same policy (3 tries), without the backoff's sleeps."""
    monkeypatch.setattr(zk, "COMMAND_RETRY", KazooRetry(max_tries=3, delay=0.0, max_jitter=0.0))


# ---------------------------------------------------------------------------------------------- zk_call
def test_a_lost_connection_is_retried_through_kazoo_retry() -> None:
    client = FakeZk()
    client.nodes["/a"] = (b"x", 4)
    client.fail = [ConnectionLoss(), ConnectionLoss()]
    data, stat = zk_call(client, client.get, "/a")  # type: ignore[arg-type]
    assert (data, stat.version) == (b"x", 4) and client.calls == ["get", "get", "get"]


def test_a_connection_that_stays_lost_is_zk_unavailable_naming_the_call() -> None:
    client = FakeZk()
    client.fail = [ConnectionLoss()] * 3
    with pytest.raises(ZkUnavailable) as e:
        zk_call(client, client.get, "/a")  # type: ignore[arg-type]
    assert str(e.value) == "ZooKeeper did not answer get /a in 3 tries (ConnectionLoss)"
    assert len(client.calls) == 3


@pytest.mark.parametrize("authenticated", [False, True])
def test_refused_credentials_are_zk_access_denied_naming_the_znode_and_the_setting(
    authenticated: bool,
) -> None:
    client = FakeZk(authenticated=authenticated)
    client.fail = [NoAuthError()]
    with pytest.raises(ZkAccessDenied) as e:
        zk_call(client, client.create, "/trimtab/c/brokers/b1", b"")  # type: ignore[arg-type]
    assert "/trimtab/c/brokers/b1" in str(e.value) and "zookeeper.auth_digest" in str(e.value)
    assert ("digest credentials" in str(e.value)) is authenticated
    assert client.calls == ["create"]  # not retried: it would be refused again


@pytest.mark.parametrize("answer", [NoNodeError(), NodeExistsError(), BadVersionError()])
def test_kazoos_answers_reach_the_caller_unchanged(answer: Exception) -> None:
    client = FakeZk()
    client.fail = [answer]
    with pytest.raises(type(answer)):
        zk_call(client, client.get, "/a")  # type: ignore[arg-type]
    assert client.calls == ["get"]


# ---------------------------------------------------------------------------------------------- compare-and-set
def _store(client: FakeZk) -> PlacementStore:
    return PlacementStore(client, ZkPaths("/trimtab/c"))  # type: ignore[arg-type]


def _domains(client: FakeZk, store: PlacementStore) -> Any:
    return msgspec.json.decode(client.nodes[store.paths["domains"]][0])


def test_a_write_that_lost_a_race_reads_again_and_loses_nothing() -> None:
    client = FakeZk()
    store = _store(client)
    path = store.paths["domains"]

    def rival(c: FakeZk) -> None:  # once: another controller adds rack0 between our read and our write
        c.rival = None
        c.nodes[path] = (b'{"domains": {"rack0": {"brokers": ["b0:1"]}}}', 0)

    client.rival = rival

    def add_rack1(doc: Any) -> FailureDomains:
        return FailureDomains(domains={**doc.domains, "rack1": FailureDomain(brokers=["b1:1"])})

    store.update("domains", add_rack1)
    assert _domains(client, store) == {
        "domains": {"rack0": {"brokers": ["b0:1"]}, "rack1": {"brokers": ["b1:1"]}}
    }
    assert client.calls == ["get", "create", "get", "set"]


def test_a_write_that_keeps_losing_is_zk_conflict_and_writes_nothing() -> None:
    client = FakeZk()
    store = _store(client)
    path = store.paths["domains"]
    client.nodes[path] = (b'{"domains": {}}', 0)

    def rival(c: FakeZk) -> None:  # every time: a version bump between our read and our write
        data, version = c.nodes[path]
        c.nodes[path] = (data, version + 1)

    client.rival = rival
    with pytest.raises(ZkConflict) as e:
        store.update(
            "domains", lambda doc: FailureDomains(domains={"x": FailureDomain(brokers=[])}), attempts=4
        )
    assert path in str(e.value) and "try again" in str(e.value)
    assert client.calls.count("set") == 4 and _domains(client, store) == {"domains": {}}


def test_a_refused_change_is_not_retried() -> None:
    client = FakeZk()
    store = _store(client)

    def refuse(doc: Any) -> Any:
        raise RequestError(409, "b1:1 already in failure domain 'rack0'")

    with pytest.raises(RequestError):
        store.update("domains", refuse)
    assert client.calls == ["get"]


# ---------------------------------------------------------------------------------------------- nothing else
#: Modules that still catch kazoo's failures themselves, and why. Everything else talks to ZooKeeper
#: through cluster.zk's boundary (or a store built on it); kazoo's answers (cluster.zk.ANSWERS: absent,
#: exists, moved on, not empty) may be handled anywhere they mean something.
KAZOO_FAILURES_ALLOWED = {
    "cluster/zk.py": "the boundary itself",
    "cli/main.py": "failure_reason: a NoAuthError a kazoo recipe (a watch) raised at start-up",
}


def _runtime_sources() -> list[Path]:
    """Every module of the package but the dev kit's (which talks to its own test servers)."""
    folders = [p for n, p in package_dirs(ROOT).items() if n != "trimtab.devkit"]
    return [p for f in folders for p in sorted(f.rglob("*.py"))]


def test_kazoo_failures_are_translated_in_one_place() -> None:
    answers = {cls.__name__ for cls in zk.ANSWERS}
    found: dict[str, set[str]] = {}
    for path in _runtime_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kazoo."):
                names = {a.name for a in node.names} - answers
                names -= {"KazooClient", "KazooState", "EventType", "WatchedEvent", "ACL"}
                names -= {"make_acl", "make_digest_acl", "make_digest_acl_credential"}
                if names:
                    found.setdefault(str(path.relative_to(ROOT)), set()).update(names)
    stray = {k: sorted(v) for k, v in found.items() if k not in KAZOO_FAILURES_ALLOWED}
    assert not stray, f"translate kazoo's failures through cluster.zk.zk_call: {stray}"
    assert set(found) == set(KAZOO_FAILURES_ALLOWED), "an allowed module no longer needs to be"
