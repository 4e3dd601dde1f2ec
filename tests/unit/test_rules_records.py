"""Record rules that the other record tests leave loose (channel/records.py; docs/testing.md)."""

from __future__ import annotations

from trimtab.channel.records import State, intern_brokers, make


def fresh(text: str) -> str:
    """An equal string that is a different object (as two decoded records' fields are)."""
    return "".join(list(text))


def test_intern_brokers_shares_every_broker_string_the_writer_too() -> None:
    """Rule: a replayed record keeps one shared copy of each broker id it names -- destination, source and
    writer -- so a million records about a hundred brokers hold a hundred strings (memory is bounded)."""
    a = make(State.RELEASING, version=2, ts=0, writer=fresh("leader:9"), dst=fresh("b1:1"), src=fresh("b2:2"))
    b = make(State.RELEASING, version=3, ts=0, writer=fresh("leader:9"), dst=fresh("b1:1"), src=fresh("b2:2"))
    assert a.writer is not b.writer and a.dst is not b.dst
    ia, ib = intern_brokers(a), intern_brokers(b)
    assert (ia, ib) == (a, b)
    assert ia.writer is ib.writer and ia.dst is ib.dst and ia.src is ib.src
