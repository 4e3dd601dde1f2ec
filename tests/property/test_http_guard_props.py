"""Properties of the HTTP guard's pure parts (cluster/http_guard.py, cluster/logs.py):

* the JSON depth bound agrees with a reference depth on any JSON document, and refuses -- never crashes
  on -- any bytes;
* the refusal log drops nothing: every refusal is logged one by one or counted in a summary, and at most
  ``burst`` of a reason are logged one by one per window;
* the connection book, driven as a state machine: never more open connections than the cap; a new
  connection is refused only when none is idle; an eviction takes an idle connection of the client holding
  the most connections, and a silent one when that client has one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trimtab.cluster.http_guard import ConnectionBook, Limits, Refusals, json_too_deep
from trimtab.cluster.logs import RefusalLog

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=40,
)


def depth(v: Any) -> int:
    if isinstance(v, list):
        return 1 + max((depth(x) for x in v), default=0)
    if isinstance(v, dict):
        return 1 + max((depth(x) for x in v.values()), default=0)
    return 0


@given(json_values, st.integers(1, 12))
def test_depth_bound_matches_a_reference(doc: Any, limit: int) -> None:
    assert json_too_deep(orjson.dumps(doc), limit) is (depth(doc) > limit)


@given(st.binary(max_size=300), st.integers(1, 40))
def test_any_bytes_get_an_answer(body: bytes, limit: int) -> None:
    assert json_too_deep(body, limit) in (True, False, None)


@given(st.integers(1, 2000), st.integers(1, 40))
def test_nesting_of_any_depth(n: int, limit: int) -> None:
    assert json_too_deep(b"[" * n + b"]" * n, limit) is (n > limit)


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(st.sampled_from(["missing", "invalid", "body_too_large"]), st.floats(0, 40)), max_size=80
    ),
    st.integers(1, 5),
)
def test_the_refusal_log_drops_nothing(events: list[tuple[str, float]], burst: int) -> None:
    now = [0.0]
    individually: list[tuple[float, str]] = []
    summarised: dict[str, int] = {}
    pending: list[tuple[float, Callable[[], None]]] = []

    def emit(event: str, **kw: Any) -> None:
        if event.endswith("_summary"):
            for reason, n in kw["not_logged_individually"].items():
                summarised[reason] = summarised.get(reason, 0) + n
        else:
            individually.append((now[0], kw["reason"]))

    rl = RefusalLog(
        "r",
        burst=burst,
        interval_s=60,
        clock=lambda: now[0],
        schedule=lambda d, fn: pending.append((now[0] + d, fn)),
        emit=emit,
    )
    for reason, gap in events:
        # Scheduled summaries run when their time comes, as the event loop would run them.
        for due, fn in sorted(pending, key=lambda p: p[0]):
            if due <= now[0] + gap:
                pending.remove((due, fn))
                now[0] = max(now[0], due)
                fn()
        now[0] += gap
        rl(reason, client="c")
    for _, fn in pending:
        fn()
    rl.flush()
    total: dict[str, int] = {}
    for reason, _ in events:
        total[reason] = total.get(reason, 0) + 1
    logged: dict[str, int] = {}
    for _, reason in individually:
        logged[reason] = logged.get(reason, 0) + 1
    for reason, n in total.items():
        assert logged.get(reason, 0) + summarised.get(reason, 0) == n
    assert rl.total == len(events)


class FakeConn:
    """What the book knows of a connection: its client, whether it is talking, whether it was closed."""

    def __init__(self, n: int, host: str, talking: bool) -> None:
        self.n = n
        self.host = host
        self.is_talking = talking
        self.closed = False

    def client_host(self) -> str:
        return self.host

    def talking(self) -> bool:
        return self.is_talking

    def close_now(self) -> None:
        self.closed = True

    def __repr__(self) -> str:
        return f"conn{self.n}@{self.host}{'(talking)' if self.is_talking else ''}"


class BookMachine(RuleBasedStateMachine):
    CAP = 16

    def __init__(self) -> None:
        super().__init__()
        self.book = ConnectionBook(Limits(max_connections=self.CAP), Refusals())
        self.book.max_connections = self.CAP  # the open-file clamp is not what is tested here
        self.live: list[FakeConn] = []
        self.busy: set[FakeConn] = set()
        self.seq = 0

    @rule(host=st.sampled_from(["10.0.0.1", "10.0.0.2", "10.0.0.3", "probe"]), talking=st.booleans())
    def connect(self, host: str, talking: bool) -> None:
        self.seq += 1
        conn = FakeConn(self.seq, host, talking)
        full = len(self.live) >= self.CAP
        idle_before = [c for c in self.live if c not in self.busy]
        counts = {h: sum(1 for c in self.live if c.host == h) for h in {c.host for c in self.live}}
        admitted = self.book.opened(conn)  # type: ignore[arg-type]
        if not full:
            assert admitted
        elif not idle_before:
            assert not admitted
        else:
            assert admitted
            evicted = [c for c in idle_before if c.closed]
            assert len(evicted) == 1
            victim = evicted[0]
            idle_hosts = {c.host for c in idle_before}
            assert counts[victim.host] == max(counts[h] for h in idle_hosts)
            same_host_idle = [c for c in idle_before if c.host == victim.host]
            if any(not c.is_talking for c in same_host_idle):
                assert not victim.is_talking
            self.live.remove(victim)
        if admitted:
            self.live.append(conn)

    @precondition(lambda self: any(c not in self.busy for c in self.live))
    @rule(data=st.data())
    def request(self, data: st.DataObject) -> None:
        conn = data.draw(st.sampled_from([c for c in self.live if c not in self.busy]))
        self.busy.add(conn)
        self.book.busy(conn)  # type: ignore[arg-type]

    @precondition(lambda self: bool(self.busy))
    @rule(data=st.data())
    def respond(self, data: st.DataObject) -> None:
        conn = data.draw(st.sampled_from(sorted(self.busy, key=lambda c: c.n)))
        self.busy.discard(conn)
        self.book.idle_again(conn)  # type: ignore[arg-type]

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def disconnect(self, data: st.DataObject) -> None:
        conn = data.draw(st.sampled_from(self.live))
        self.live.remove(conn)
        self.busy.discard(conn)
        self.book.closed(conn)  # type: ignore[arg-type]

    @invariant()
    def book_matches(self) -> None:
        assert len(self.book.open) <= self.CAP
        assert set(self.book.open) == set(self.live)  # type: ignore[comparison-overlap]
        idle = {c for q in self.book.idle.values() for c in q}
        assert idle == {c for c in self.live if c not in self.busy}  # type: ignore[comparison-overlap]
        assert sum(self.book.per_client.values()) == len(self.live)
        assert all(q for q in self.book.idle.values())


TestConnectionBook = BookMachine.TestCase
TestConnectionBook.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
