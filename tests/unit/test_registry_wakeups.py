"""The broker registry's worker (cluster/zk.py) reads only on a wake-up or when a full read is due; a
wake-up set just after its 5-s wait timed out must not be erased (found by review: a new broker then
stayed invisible until the next event or the 5-minute full read)."""

from __future__ import annotations

import threading
from typing import Any

import msgspec

from tests.support.waiting import wait_for
from trimtab.balance.assign import BrokerInfo
from trimtab.cluster.zk import BrokerRegistry, ZkPaths

NODES: dict[str, bytes] = {}


def info(bid: str) -> bytes:
    return msgspec.json.encode(BrokerInfo(id=bid, service_url=f"pulsar://{bid}", http_url=f"http://{bid}"))


class FakeZk:
    def ensure_path(self, path: str) -> None:
        pass

    def ChildrenWatch(self, path: str, fn: Any) -> None:
        pass

    def get_children(self, path: str) -> list[str]:
        return sorted(NODES)

    def get(self, path: str, watch: Any = None) -> tuple[bytes, None]:
        return NODES[path.rsplit("/", 1)[-1]], None

    def exists(self, path: str) -> None:
        return None


class FakeSession:
    client = FakeZk()
    connected = True
    session_id = 7

    def add_listener(self, fn: Any) -> None:
        pass


def test_a_wake_up_just_after_the_wait_timed_out_is_not_lost() -> None:
    NODES.clear()
    NODES["a:1"] = info("a:1")
    registry = BrokerRegistry(FakeSession(), ZkPaths("/t"))  # type: ignore[arg-type]
    inject = threading.Event()

    class Wake(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            got = super().wait(0.02)  # the worker's 5-s wait, shortened
            if not got and inject.is_set():
                inject.clear()
                NODES["b:1"] = info("b:1")
                registry._children_changed(sorted(NODES))  # kazoo's thread, right after the timeout
            return got

    registry._wake = Wake()
    registry.start()
    try:
        wait_for(lambda: set(registry.brokers) == {"a:1"}, 5)
        inject.set()
        wait_for(lambda: "b:1" in registry.brokers, 2, message=lambda: f"cache {sorted(registry.brokers)}")
    finally:
        registry.stop()
