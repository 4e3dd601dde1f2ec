"""The decision core's module-level constants against the normative description, docs/protocol.md.

mutmut does not mutate module-level constants (``scripts/mutation.sh --constants`` does, docs/testing.md);
these tests are what such a mutant fails: the transition table, the in-flight states and the size limit
are read from the protocol document and compared with the code, so neither can change without the other.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import orjson

from trimtab.channel.records import IN_FLIGHT, MAX_RECORD_BYTES, SEMI_TERMINAL, State
from trimtab.channel.resolve import TRANSITIONS
from trimtab.channel.topics import DEFAULT_PARTITIONS

PROTOCOL_DIR = Path(__file__).resolve().parents[2] / "docs"
PROTOCOL = (PROTOCOL_DIR / "protocol.md").read_text(encoding="utf-8")


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


# ---------------------------------------------------------------------------------------------- balance


def test_a_figure_on_the_wire_is_at_most_1e18() -> None:
    """Rule: a load figure decodes up to 1e18 inclusive (docs/design.md: "at most 1e18") and the next
    double above it is refused as ``invalid`` -- a sum over thousands of brokers stays finite."""
    import math

    from trimtab.balance.load import BrokerLoadData, Usage
    from trimtab.channel.values import Refused, StrictDecoder

    assert "at most 1e18" in (PROTOCOL_DIR / "design.md").read_text(encoding="utf-8")
    decoder = StrictDecoder(BrokerLoadData, 1 << 16)

    def report(figure: float) -> bytes:
        return orjson.dumps({"broker": "b:1", "cpu": {"usage": figure, "limit": 1e18}, "updated_at": 1})

    ok = decoder.decode(report(1e18))
    assert isinstance(ok, BrokerLoadData) and ok.cpu == Usage(1e18, 1e18)
    refused = decoder.decode(report(math.nextafter(1e18, math.inf)))
    assert isinstance(refused, Refused) and refused.reason == "invalid"


def test_a_resource_a_broker_does_not_report_is_zero_of_a_limit_of_one() -> None:
    """Rule: a load report without a resource carries it as ``{"usage": 0.0, "limit": 1.0}`` on the wire
    (what every reader of the topic -- the pipeline included -- sees), and at 0 %."""
    from trimtab.balance.load import BrokerLoadData

    data = BrokerLoadData(broker="b:1", updated_at=1)
    wire = orjson.loads(msgspec.json.encode(data))
    for resource in ("cpu", "memory", "bandwidth_in", "bandwidth_out"):
        assert wire[resource] == {"usage": 0.0, "limit": 1.0}
        assert getattr(data, resource).percent == 0.0


def test_the_bandwidth_limit_is_in_mebibytes() -> None:
    """Rule: ``split.max_bandwidth_mbytes`` counts 1 048 576-byte megabytes (Pulsar's
    loadBalancerNamespaceBundleMaxBandwidthMbytes): a bundle at exactly the limit in bytes is not over it,
    one byte a second more is, for the split decision and the flow algorithm's bound alike."""
    from trimtab.balance.load import BundleStats
    from trimtab.balance.split import SplitLimits, over_limit

    lim = SplitLimits(max_bandwidth_mbytes=2)
    at = BundleStats(bundle="t/ns/0x00000000_0xffffffff", msg_throughput_in=2 * 1_048_576)
    over = BundleStats(bundle="t/ns/0x00000000_0xffffffff", msg_throughput_in=2 * 1_048_576 + 1)
    assert over_limit(at, lim) is None
    assert over_limit(over, lim) == "bandwidth"


def test_every_shedding_skip_has_its_own_sentence() -> None:
    """Rule: ``admin explain`` has a sentence of its own for every reason a shedding cycle can be skipped
    for -- exactly the skip reasons docs/operations.md lists for ``trimtab_shedding_cycles_total`` -- and
    never the generic "skipped: <word>"."""
    from trimtab.balance.explain import SHED_SKIPS

    row = next(
        line
        for line in (PROTOCOL_DIR / "operations.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("| `trimtab_shedding_cycles_total`")
    )
    listed = row.split(" or skip (", 1)[1]
    documented = {
        m.group(1) for piece in re.split(r"[,;]", listed) if (m := re.match(r"\s*([a-z_]+)(:|\)|$)", piece))
    }
    assert len(documented) >= 10
    assert set(SHED_SKIPS) == documented
    assert all(SHED_SKIPS[w] and "skipped:" not in SHED_SKIPS[w] for w in documented)


# ---------------------------------------------------------------------------------------------- channel


def test_the_topics_trimtab_creates_have_the_documented_partitions() -> None:
    """Rule: the broker load, top bundles, standby and events topics are created with docs/operations.md's
    partition count (4; any count works for the compacted ones, but the table is what an operator
    provisions by)."""
    from trimtab.cluster.topics import topic_specs
    from trimtab.config.settings import Settings

    rows = (PROTOCOL_DIR / "operations.md").read_text(encoding="utf-8").splitlines()
    documented = {
        row.split("|")[1].strip(): int(row.split("|")[2].split()[0])
        for row in rows
        if row.startswith(("| broker load, top bundles, standbys |", "| events ("))
    }
    assert len(documented) == 2 and set(documented.values()) == {4}
    k = Settings().kafka
    specs = {s.name: s.partitions for s in topic_specs(k)}
    for topic in (k.broker_load_topic, k.top_bundles_topic, k.standby_topic, k.events_topic):
        assert specs[topic] == 4 == DEFAULT_PARTITIONS


def test_every_refusal_of_a_value_decoder_is_one_of_its_reasons() -> None:
    """Rule: a refused value's reason is always one of ``values.REASONS`` (the bounded set its callers
    count by): every structure rule of channel/strictjson.py, and ``invalid`` for a wrong shape."""
    from trimtab.channel import strictjson
    from trimtab.channel.values import REASONS

    assert set(REASONS) == {*strictjson.REASONS, "invalid"}
    assert len(REASONS) == len(set(REASONS))
