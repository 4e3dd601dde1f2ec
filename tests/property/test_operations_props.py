"""Operations (balance/operations.py) against a channel that resolves every proposal by the
first-valid-transition rule, with brokers that carry transfers through, other writers moving the same
bundles, lost publishes, and leaders killed between passes (the operation re-read from its stored bytes):

* no bundle is moved twice by one operation -- every record it proposes for a bundle has one version,
  and at most one of them applies;
* left alone (no other writer, nothing lost, no limit), every operation ends ``done`` with every move
  ``moved``;
* limits hold in every pass, and one namespace's many moves cannot starve another's few;
* stored bytes decode to the same operation, and no bytes make the decoder raise.
"""

from __future__ import annotations

import random
from collections import Counter

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from trimtab.balance import operations as ops
from trimtab.channel import intents
from trimtab.channel.bundles import parse_bundle
from trimtab.channel.records import Record, State, make
from trimtab.channel.resolve import Verdict, resolve
from trimtab.controller.operation_store import CHUNK_MOVES, assemble, chunks_of, header_of

BROKERS = ["b1:1", "b2:1", "b3:1", "b4:1"]
T0 = 1_800_000_000_000


def bundle(ns: int, i: int) -> str:
    lo = i * 0x01000000
    return f"t/ns{ns}/0x{lo:08x}_0x{lo + 0x01000000:08x}"


class Channel:
    """The table every replica agrees on: proposals applied in order when valid, skipped when not."""

    def __init__(self, records: dict[str, Record], lookups: bool = True) -> None:
        self.table = dict(records)
        self.lookups = lookups  # clients assign freed bundles again
        self.applied: Counter[tuple[str, str]] = Counter()  # (writer, bundle) -> transitions applied

    def propose(self, b: str, rec: Record) -> bool:
        if resolve(parse_bundle(b)[1], self.table.get(b), rec) is Verdict.ACCEPT:
            self.table[b] = rec
            self.applied[(rec.writer, b)] += 1
            return True
        return False

    def brokers_step(self, rng: random.Random, now: int) -> None:
        """Brokers carry in-flight transfers one step on (some of them, in a random order)."""
        for b in rng.sample(sorted(self.table), k=len(self.table)):
            cur = self.table[b]
            if rng.random() < 0.5:
                continue
            if cur.state is State.RELEASING and cur.src is not None:
                nxt = (
                    intents.hand_over(cur, cur.src, now_ms=now)
                    if cur.dst is not None
                    else intents.free(cur, cur.src, now_ms=now)
                )
                self.propose(b, nxt)
            elif cur.state is State.ASSIGNING and cur.dst is not None:
                self.propose(b, intents.take(cur, cur.dst, now_ms=now))
            elif self.lookups and cur.state is State.FREE and rng.random() < 0.3:  # looked up: any broker
                self.propose(b, intents.assign(cur, rng.choice(BROKERS), writer="lookup", now_ms=now))

    def settled(self) -> bool:
        return not any(r.state.in_flight for r in self.table.values())


def owned(n_ns: int, per_ns: int, rng: random.Random) -> dict[str, Record]:
    return {
        bundle(ns, i): make(
            State.OWNED, dst=rng.choice(BROKERS), version=rng.randint(1, 5), ts=T0, writer="x"
        )
        for ns in range(n_ns)
        for i in range(per_ns)
    }


@settings(max_examples=150, deadline=None)
@given(
    st.integers(min_value=0, max_value=2**32),
    st.integers(min_value=1, max_value=3),
    st.integers(min_value=1, max_value=12),
    st.floats(min_value=0, max_value=0.5),  # chance a publish is lost
    st.floats(min_value=0, max_value=0.3),  # chance another writer moves a bundle
    st.floats(min_value=0, max_value=0.3),  # chance the leader is killed after a pass
    st.one_of(st.none(), st.integers(min_value=1, max_value=6)),  # cluster limit
)
def test_no_bundle_is_moved_twice_whatever_happens(
    seed: int, n_ns: int, per_ns: int, lose: float, interfere: float, kill: float, limit: int | None
) -> None:
    rng = random.Random(seed)
    ch = Channel(owned(n_ns, per_ns, rng))
    plan = [(b, r.dst, rng.choice([x for x in BROKERS if x != r.dst] + [None])) for b, r in ch.table.items()]
    stored = [ops.encode(ops.new("op-1", ops.OpKind.DRAIN, plan, reason="test", requested_by="t", now_ms=T0))]
    proposed: dict[str, set[int]] = {}
    now = T0
    for _ in range(60):
        now += 1000
        current = [o for o in (ops.decode(v) for v in stored) if isinstance(o, ops.Operation)]
        assert len(current) == 1
        budget = ops.Budget.from_table(ch.table.items(), cluster=limit, per_broker=None, per_namespace=None)
        adv = ops.advance(current, ch.table.get, budget, writer="leader", now_ms=now, republish_after_ms=3000)
        if limit is not None:  # a move starts only within the limit, counting those on their way
            in_flight = sum(1 for r in ch.table.values() if r.state.in_flight)
            on_way = sum(
                1
                for m in current[0].moves
                if m.open and m.started_version is not None and ch.table[m.bundle].version < m.started_version
            )
            before = {m.bundle for m in current[0].moves if m.started_version is not None}
            started = [
                m for m in adv.ops[0].moves if m.started_version is not None and m.bundle not in before
            ]
            assert not started or in_flight + on_way + len(started) <= limit
        stored = [ops.encode(o) for o in adv.ops]  # persisted before publishing
        if rng.random() < kill:
            continue  # killed before publishing: the next leader reads what was stored
        for b, rec in adv.publish:
            proposed.setdefault(b, set()).add(rec.version)
            if rng.random() >= lose:
                ch.propose(b, rec)
        ch.brokers_step(rng, now)
        if rng.random() < interfere:  # another writer moves some bundle, anywhere -- back to its source too
            b = rng.choice(sorted(ch.table))
            cur = ch.table[b]
            if cur.state is State.OWNED and cur.dst is not None:
                dst = rng.choice([x for x in BROKERS if x != cur.dst] + [None])
                ch.propose(b, intents.release(cur, src=cur.dst, dst=dst, writer="other", now_ms=now))
    for b, versions in proposed.items():
        assert len(versions) == 1, (b, versions)
        assert ch.applied[("leader", b)] <= 1


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=2**32), st.integers(min_value=1, max_value=4), st.integers(1, 15))
def test_left_alone_every_operation_finishes_with_every_move_made(seed: int, n_ns: int, per_ns: int) -> None:
    rng = random.Random(seed)
    ch = Channel(owned(n_ns, per_ns, rng), lookups=False)
    plan = [(b, r.dst, rng.choice([x for x in BROKERS if x != r.dst] + [None])) for b, r in ch.table.items()]
    op = ops.new("op-1", ops.OpKind.SHED, plan, reason="test", requested_by="t", now_ms=T0)
    now = T0
    for _ in range(200):
        now += 1000
        budget = ops.Budget.from_table(ch.table.items(), cluster=None, per_broker=None, per_namespace=None)
        adv = ops.advance([op], ch.table.get, budget, writer="leader", now_ms=now, republish_after_ms=3000)
        op = adv.ops[0]
        for b, rec in adv.publish:
            assert ch.propose(b, rec)
        ch.brokers_step(rng, now)
        if op.state is ops.OpState.DONE:
            break
    assert op.state is ops.OpState.DONE
    assert {m.outcome for m in op.moves} == {ops.Outcome.MOVED}
    assert op.progress() == (len(plan), len(plan))
    for b, _src, dst in plan:
        rec = ch.table[b]
        assert (rec.state is State.FREE) if dst is None else (rec.state is State.OWNED and rec.dst == dst)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(min_value=1, max_value=30),  # cluster limit
    st.one_of(st.none(), st.integers(min_value=1, max_value=10)),  # per broker
    st.one_of(st.none(), st.integers(min_value=1, max_value=10)),  # per namespace
    st.integers(min_value=0, max_value=2**32),
)
def test_limits_hold_and_a_small_namespace_is_not_starved(
    cluster: int, per_broker: int | None, per_ns: int | None, seed: int
) -> None:
    rng = random.Random(seed)
    table = {
        bundle(0, i): make(State.OWNED, dst=rng.choice(BROKERS), version=1, ts=T0, writer="x")
        for i in range(200)
    }
    table |= {
        bundle(1, i): make(State.OWNED, dst=rng.choice(BROKERS), version=1, ts=T0, writer="x")
        for i in range(10)
    }
    big = ops.new(
        "big", ops.OpKind.SHED, [(b, r.dst, None) for b, r in table.items() if "/ns0/" in b], reason="r",
        requested_by="t", now_ms=T0,
    )  # fmt: skip
    small = ops.new(
        "small", ops.OpKind.DRAIN, [(b, r.dst, None) for b, r in table.items() if "/ns1/" in b], reason="r",
        requested_by="t", now_ms=T0 + 1,
    )  # fmt: skip
    budget = ops.Budget.from_table(
        table.items(), cluster=cluster, per_broker=per_broker, per_namespace=per_ns
    )
    adv = ops.advance([big, small], table.get, budget, writer="leader", now_ms=T0, republish_after_ms=1)
    started = Counter(parse_bundle(b)[0] for b, _ in adv.publish)
    assert sum(started.values()) <= cluster
    by_broker: Counter[str] = Counter()
    for b, _ in adv.publish:
        by_broker[table[b].dst or ""] += 1
    if per_broker is not None:
        assert max(by_broker.values(), default=0) <= per_broker
    if per_ns is not None:
        assert max(started.values(), default=0) <= per_ns
    # Fair: the small namespace gets its share -- half the cluster budget, or all it asked for.
    if per_broker is None:
        assert started["t/ns1"] >= min(10, cluster // 2, per_ns if per_ns is not None else 10)
    waits = sum(adv.waiting.values())
    assert waits + len(adv.publish) == 210  # every move either started or waits, with a reason


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_no_bytes_make_the_decoder_raise(value: bytes) -> None:
    got = ops.decode(value)
    assert isinstance(got, ops.Operation | ops.Undecodable)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50), st.sampled_from([*BROKERS, None])), max_size=30)
)
def test_stored_operations_read_back_as_they_were(moves: list[tuple[int, int, str | None]]) -> None:
    plan = {bundle(ns, i): ("b9:1", dst) for ns, i, dst in moves}
    op = ops.new("op-7", ops.OpKind.MAINTENANCE, [(b, s, d) for b, (s, d) in plan.items()], reason="é\n\"x",
                 requested_by="ops@example", now_ms=T0)  # fmt: skip
    assert ops.decode(ops.encode(op)) == op
    paused = ops.pause(op, why="operator", now_ms=T0 + 1)
    assert ops.decode(ops.encode(paused)) == paused


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.lists(st.binary(max_size=200), max_size=3))
def test_no_stored_parts_make_the_store_decoder_raise(header: bytes, chunks: list[bytes]) -> None:
    assert isinstance(assemble(header, chunks), ops.Operation | ops.Undecodable)


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=0, max_value=3 * CHUNK_MOVES))
def test_an_operation_split_into_chunks_assembles_back(n: int) -> None:
    op = ops.new(
        "op-9", ops.OpKind.DRAIN, [(bundle(i // 200, i % 200), "b1:1", None) for i in range(n)], reason="r",
        requested_by="t", now_ms=T0,
    )  # fmt: skip
    parts = [msgspec.json.encode(list(c)) for c in chunks_of(op.moves)]
    assert assemble(msgspec.json.encode(header_of(op)), parts) == op
    if parts:  # a chunk lost or added is refused, not read as a smaller operation
        assert isinstance(assemble(msgspec.json.encode(header_of(op)), parts[:-1]), ops.Undecodable)


# ---------------------------------------------------------------------------------------------- followed
_FOLLOWED_STATES = [
    State.OWNED,
    State.SPLITTING,
    State.MERGING,
    State.ASSIGNING,
    State.RELEASING,
    State.DELETED,
]


@st.composite
def _histories(draw: st.DrawFn) -> tuple[ops.OpKind, list[list[Record | None]]]:
    """A followed operation's kind and, for each of its (up to 3) bundles, what the channel shows it as over
    a few passes: versions that only grow (a tombstone, then the key made again from version 1)."""
    kind = draw(st.sampled_from(sorted(ops.FOLLOWED)))
    histories = []
    for _ in range(draw(st.integers(1, 3))):
        version, seq = 4, []
        for _ in range(draw(st.integers(1, 6))):
            if draw(st.booleans()) and draw(st.booleans()):
                seq.append(None)  # tombstoned
                version = 0
                continue
            version += draw(st.integers(0, 2))
            state = draw(st.sampled_from(_FOLLOWED_STATES))
            dst = draw(st.sampled_from([*BROKERS, None]))
            seq.append(make(state, dst=dst, src=BROKERS[0], version=max(1, version), ts=T0, writer="w"))
        histories.append(seq)
    return kind, histories


@settings(max_examples=300, deadline=None)
@given(_histories(), st.booleans())
def test_a_followed_operation_never_takes_an_outcome_back_and_ends_once(
    case: tuple[ops.OpKind, list[list[Record | None]]], cancel_midway: bool
) -> None:
    """Whatever the channel shows, pass after pass: an ended move keeps its outcome, a finished operation
    stays finished, ``done`` means every move ended and none aborted, ``failed`` that one aborted, and a
    cancelled heal ends every move still open; nothing here ever publishes (advance proposes nothing)."""
    kind, histories = case
    bundles = [bundle(0, i) for i in range(len(histories))]
    moves = [
        (
            b,
            BROKERS[0],
            BROKERS[1] if kind is ops.OpKind.HEAL else None,
            None if kind is ops.OpKind.HEAL else 4,
            None if kind is ops.OpKind.HEAL else T0,
        )
        for b in bundles
    ]
    op = ops.followed("f-1", kind, moves, reason="r", requested_by="w", now_ms=T0)
    ended: dict[str, ops.Outcome] = {}
    passes = max(len(h) for h in histories)
    for k in range(passes):
        table = {b: h[min(k, len(h) - 1)] for b, h in zip(bundles, histories, strict=True)}
        if cancel_midway and kind is ops.OpKind.HEAL and k == passes // 2:
            op = ops.end_followed(op, why="the broker came back", now_ms=T0 + k)
        was_terminal = op.state if op.state.terminal else None
        op = ops.follow(op, table.get, now_ms=T0 + k)
        adv = ops.advance([op], table.get, ops.Budget(), writer="l", now_ms=T0 + k, republish_after_ms=0)
        assert adv.publish == [] and adv.ops == [op]
        if was_terminal is not None:
            assert op.state is was_terminal
        for m in op.moves:
            if m.bundle in ended:
                assert m.outcome is ended[m.bundle]
            elif m.outcome is not None:
                ended[m.bundle] = m.outcome
        if op.state is ops.OpState.DONE:
            assert all(not m.open for m in op.moves)
            assert all(m.outcome is not ops.Outcome.ABORTED for m in op.moves)
        if op.state is ops.OpState.FAILED:
            assert any(m.outcome is ops.Outcome.ABORTED for m in op.moves)
        if op.state is ops.OpState.CANCELLED:
            assert all(not m.open for m in op.moves)
