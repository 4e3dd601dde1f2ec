"""Operations in a real ZooKeeper (controller/operation_store.py): stored whole, read back equal, only the
changed chunks written again, and hostile znodes skipped with a reason -- never raised."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from trimtab.balance import operations as ops
from trimtab.cluster.zk import ZkPaths
from trimtab.controller.operation_store import CHUNK_MOVES, MemoryOperations, OperationConflict, ZkOperations
from trimtab.errors import RequestError

T0 = 1_800_000_000_000


def bundle(i: int) -> str:
    lo = i * 0x10000
    return f"t/ns/0x{lo:08x}_0x{lo + 0x10000:08x}"


def drain(op_id: str, n: int) -> ops.Operation:
    return ops.new(
        op_id,
        ops.OpKind.DRAIN,
        [(bundle(i), "a:1", None) for i in range(n)],
        reason="maintenance of a:1",
        requested_by="ops@example",
        now_ms=T0,
    )


@pytest.mark.parametrize("store_kind", ["zk", "memory"])
def test_an_operation_of_many_chunks_is_stored_updated_and_read_back(
    zk: KazooClient, store_kind: str
) -> None:
    paths = ZkPaths("/trimtab/ops")
    store = ZkOperations(zk, paths) if store_kind == "zk" else MemoryOperations()
    op = drain("drain-1", 2 * CHUNK_MOVES + 7)  # three chunks
    store.create(op)
    with pytest.raises(RequestError, match="exists already"):
        store.create(op)
    assert store.list() == [op]
    moves = list(op.moves)
    moves[CHUNK_MOVES + 1] = ops.Move(
        bundle=moves[CHUNK_MOVES + 1].bundle, src="a:1", started_version=4, started_ms=T0
    )
    changed = ops.pause(
        ops.Operation(**{**_fields(op), "moves": tuple(moves)}), why="operator", now_ms=T0 + 5
    )
    if isinstance(store, ZkOperations):
        before = [zk.exists(f"{paths.admin}/operations/drain-1/{s:06d}").version for s in range(3)]
    store.write(changed, op)
    assert store.list() == [changed]
    if isinstance(store, ZkOperations):
        after = [zk.exists(f"{paths.admin}/operations/drain-1/{s:06d}").version for s in range(3)]
        assert [a - b for a, b in zip(after, before, strict=True)] == [0, 1, 0]  # only the changed chunk
    store.delete("drain-1")
    assert store.list() == []


@pytest.mark.parametrize("store_kind", ["zk", "memory"])
def test_a_drain_extended_past_its_last_chunk_is_written_and_read_back(
    zk: KazooClient, store_kind: str
) -> None:
    """A drain whose broker was given more bundles after it was planned grows a chunk: stored, not taken
    for a conflict (which would have reloaded every operation on every pass and stopped the drain)."""
    paths = ZkPaths("/trimtab/ops-extend")
    store = ZkOperations(zk, paths) if store_kind == "zk" else MemoryOperations()
    op = drain("drain-2", CHUNK_MOVES)  # exactly one full chunk
    store.create(op)
    more = ops.extend(op, [(bundle(CHUNK_MOVES + i), "a:1", None) for i in range(3)], now_ms=T0 + 1)
    store.write(more, op)
    assert store.list() == [more]
    with pytest.raises(OperationConflict):
        store.write(drain("never-created", 1), None)  # written without being created: refused, both stores
    store.delete("drain-2")


def _fields(op: ops.Operation) -> dict[str, object]:
    return {f: getattr(op, f) for f in op.__struct_fields__}


HOSTILE = [b"", b"null", b"{}", b"[]", b"\xff\xfe", b'{"schema":1}', b"[" * 3000 + b"]" * 3000]


def test_hostile_znodes_are_skipped_with_a_reason(zk: KazooClient) -> None:
    paths = ZkPaths("/trimtab/ops-hostile")
    store = ZkOperations(zk, paths)
    good = drain("good", 3)
    store.create(good)
    base = f"{paths.admin}/operations"
    for i, value in enumerate(HOSTILE):
        zk.create(f"{base}/bad-header-{i}", value, makepath=True)
        zk.create(f"{base}/bad-chunk-{i}", zk.get(f"{base}/good")[0])
        zk.create(f"{base}/bad-chunk-{i}/000000", value)
    zk.create(f"{base}/bad-names", zk.get(f"{base}/good")[0])
    zk.create(f"{base}/bad-names/zzz", b"[]")
    zk.create(f"{base}/null-header", b"")
    zk.set(f"{base}/null-header", None)
    zk.create(f"{base}/Not-An-Id!", zk.get(f"{base}/good")[0])
    zk.create(f"{base}/Not-An-Id!/000000", zk.get(f"{base}/good/000000")[0])
    assert store.list() == [good]
    assert store.unreadable == 2 * len(HOSTILE) + 3


def test_a_deposed_leader_cannot_overwrite_what_its_successor_stored(zk: KazooClient) -> None:
    """Every write is conditional on the version this store last read: the old leader's late write of a
    pass is refused (OperationConflict), and so is the new leader's if the old one wrote first -- whoever
    loses reads again before deciding anything more."""
    paths = ZkPaths("/trimtab/ops-fenced")
    old, new = ZkOperations(zk, paths), ZkOperations(zk, paths)
    op = drain("drain-2", 3)
    old.create(op)
    [seen] = new.list()  # the new leader loads
    ahead = ops.pause(seen, why="new leader", now_ms=T0 + 1)
    new.write(ahead, seen)
    stale = ops.cancel(op, why="old leader, late", now_ms=T0 + 2)
    with pytest.raises(OperationConflict):
        old.write(stale, op)
    assert new.list() == [ahead]
    [again] = old.list()  # the loser reads again: now it can write
    old.write(ops.resume(again, now_ms=T0 + 3), again)
    assert new.list()[0].state is ops.OpState.PENDING
