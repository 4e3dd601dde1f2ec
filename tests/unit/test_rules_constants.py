"""The decision core's module-level constants against the normative description, docs/protocol.md.

mutmut does not mutate module-level constants (``scripts/mutation.sh --constants`` does, docs/testing.md);
these tests are what such a mutant fails: the transition table, the in-flight states and the size limit
are read from the protocol document and compared with the code, so neither can change without the other.
"""

from __future__ import annotations

import re
from pathlib import Path

from trimtab.channel.records import IN_FLIGHT, MAX_RECORD_BYTES, SEMI_TERMINAL, State
from trimtab.channel.resolve import TRANSITIONS

PROTOCOL = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text(encoding="utf-8")


def _state(word: str) -> State | None:
    """A state as the document writes it: `owned`, or Init (no record, a tombstone)."""
    return None if word.startswith("Init") else State(word.strip("`"))


def documented_transitions() -> dict[State | None, frozenset[State | None]]:
    """The ``from \\ to | valid without force`` table of section 3."""
    table = PROTOCOL.split("| from \\ to | valid without `force` |", 1)[1].split("\n\n", 1)[0]
    out: dict[State | None, frozenset[State | None]] = {}
    for row in table.strip().splitlines()[1:]:  # the first line is the |---| rule
        _, frm, to, _ = row.split("|")
        targets = re.findall(r"`(\w+)`|(Init)", to)
        out[_state(frm.strip())] = frozenset(_state(a or b) for a, b in targets)
    return out


def test_the_transition_table_is_the_documented_one() -> None:
    """Rule: the valid non-forced transitions are exactly docs/protocol.md section 3's table (a member left
    out of the code's table refuses a valid record everywhere; one added accepts an invalid one)."""
    documented = documented_transitions()
    assert len(documented) == len(State) + 1  # every state, and Init
    assert documented == TRANSITIONS


def test_the_in_flight_states_are_the_documented_ones() -> None:
    """Rule: the in-flight states (a lookup waits on them; the monitor forces them on when stuck) are the
    four the protocol names; Free and Deleted are the semi-terminal ones, tombstoned after a delay."""
    line = re.search(r"In-flight states: (.*)\.", PROTOCOL)
    assert line is not None
    assert frozenset(State(w) for w in re.findall(r"`(\w+)`", line.group(1))) == IN_FLIGHT
    assert frozenset({State.FREE, State.DELETED}) == SEMI_TERMINAL
    assert not IN_FLIGHT & SEMI_TERMINAL


def test_the_size_limit_is_the_documented_one() -> None:
    """Rule: a channel value longer than the documented size (65 536 bytes) is refused unread."""
    found = re.search(r"a value longer than ([\d ]+) bytes is skipped as `too_large`", PROTOCOL)
    assert found is not None
    assert int(found.group(1).replace(" ", "")) == MAX_RECORD_BYTES


def test_every_skip_reason_is_a_metric_label() -> None:
    """Rule: ``SKIP_REASONS`` (the bounded label set of the skipped-records metric) holds every reason a
    channel message can be skipped for -- each ``SKIP_*`` of channel/records.py and every structure rule of
    channel/strictjson.py -- once."""
    from trimtab.channel import records, strictjson

    defined = {
        v.reason for k, v in vars(records).items() if k.startswith("SKIP_") and isinstance(v, records.Skip)
    }
    assert defined >= {"bad_key", "wrong_partition", "future_schema", "unknown_state"}
    assert set(records.SKIP_REASONS) == defined | set(strictjson.REASONS)
    assert len(records.SKIP_REASONS) == len(set(records.SKIP_REASONS))
