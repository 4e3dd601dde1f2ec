"""The agent's plan rules the table tests leave open (balance/roles.py; docs/testing.md: mutation testing).

Every test names the rule it pins: an assignment is acquired directly unless the caller says it is late,
a ``Free`` record redirects nobody whatever ``dst`` it carries, and a ``Merging`` record without a merged
range is no merge to plan.
"""

from __future__ import annotations

import pytest

from trimtab.balance.roles import Acquire, Close, Plan, Publish, plan
from trimtab.channel.records import Record, State, make

ME, B, C = "me:1", "b:2", "c:3"
BUNDLE = "t/ns/0x00000000_0x40000000"
NOW = 1_700_000_000_000


def test_an_assignment_is_acquired_directly_unless_said_to_be_late() -> None:
    """Rule: ``late`` is off by default: ``Assigning{dst=me}`` is acquired, then ``Owned`` published
    (``assign``), not settled through the channel first."""
    cur = make(State.ASSIGNING, dst=ME, src=B, version=3, ts=0, writer=B)
    owned = make(State.OWNED, dst=ME, src=B, version=4, ts=NOW, writer=ME)
    assert plan(ME, BUNDLE, cur, serving=False, fenced=False, now_ms=NOW) == Plan(
        "assign", (Acquire(), Publish(owned))
    )
    assert plan(ME, BUNDLE, cur, serving=False, fenced=False, now_ms=NOW, late=True) == Plan(
        "assign_late", (Publish(owned),)
    )


def test_a_free_record_redirects_nobody_whatever_dst_it_names() -> None:
    """Rule: a broker still serving a ``Free`` bundle closes it without a redirect, even when the record
    names a ``dst`` (a forced ``Free`` may): nobody owns a free bundle."""
    cur = make(State.FREE, dst=C, src=B, version=5, ts=0, writer=B, force=True)
    assert plan(ME, BUNDLE, cur, serving=True, fenced=False, now_ms=NOW) == Plan(
        "forced_close", (Close(None),)
    )


@pytest.mark.parametrize("children", [None, {}], ids=["none", "empty"])
def test_a_merging_record_without_a_merged_range_plans_nothing(
    children: dict[str, str | None] | None,
) -> None:
    """Rule: ``Merging{src=me}`` naming no merged range (a shape the channel refuses) is no merge: the
    plan is nothing to do, not an error."""
    cur: Record = make(State.MERGING, src=ME, version=2, ts=0, writer=ME, children=children)
    assert plan(ME, BUNDLE, cur, serving=True, fenced=False, now_ms=NOW, lookup=lambda name: None) is None
