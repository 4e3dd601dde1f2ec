"""Broker load data (docs/design.md section 4; reference digest pulsar_elb.md sections 3.1-3.3).

weighted max, the EMA, the reporter's publish rule, freshness and the top-k bundle report.
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trimtab.agent.adapters.base import BrokerSample
from trimtab.balance.load import (
    BrokerLoadData,
    BundleStats,
    TopBundles,
    Usage,
    Weights,
    is_fresh,
    max_resource_usage,
    publish_reason,
    top_k,
    weighted_max,
    with_ema,
)
from trimtab.channel.values import Refused, StrictDecoder

HALF = Weights(cpu=0.5, memory=0.5, bandwidth_in=0.5, bandwidth_out=0.5)


def pct(p: float) -> Usage:
    """A usage of ``p`` percent."""
    return Usage(p, 100.0)


def load(**kw: object) -> BrokerLoadData:
    kw.setdefault("broker", "b:1")
    return BrokerLoadData(**kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ weighted max


def test_usage_percent_and_zero_limit() -> None:
    assert Usage(25, 50).percent == 50.0
    assert Usage(5, 0).percent == 0.0  # no limit known: no usage, never a division by zero


def test_weighted_max_pulsar_vector() -> None:
    # BrokerLoadDataTest: all weights 0.5; cpu 1%, memory 400%, bandwidth in 3%, out 4%.
    first = load(cpu=pct(1), memory=pct(400), bandwidth_in=pct(3), bandwidth_out=pct(4))
    assert weighted_max(first, HALF) == pytest.approx(2.0)
    # memory is deliberately not part of max resource usage (as in Pulsar)
    assert max_resource_usage(first) == pytest.approx(0.04)


@pytest.mark.parametrize(
    ("field", "weights", "expected"),
    [
        # each resource can be the max once its weight makes it so
        ("cpu", Weights(cpu=2.0, memory=0.1, bandwidth_in=0.1, bandwidth_out=0.1), 0.8),
        ("memory", Weights(cpu=0.1, memory=3.0, bandwidth_in=0.1, bandwidth_out=0.1), 0.6),
        ("bandwidth_in", Weights(cpu=0.1, memory=0.1, bandwidth_in=4.0, bandwidth_out=0.1), 1.2),
        ("bandwidth_out", Weights(cpu=0.1, memory=0.1, bandwidth_in=0.1, bandwidth_out=5.0), 2.5),
    ],
)
def test_weighted_max_is_max_of_weighted_percentages(field: str, weights: Weights, expected: float) -> None:
    d = load(cpu=pct(40), memory=pct(20), bandwidth_in=pct(30), bandwidth_out=pct(50))
    parts = {
        "cpu": 40 * weights.cpu,
        "memory": 20 * weights.memory,
        "bandwidth_in": 30 * weights.bandwidth_in,
        "bandwidth_out": 50 * weights.bandwidth_out,
    }
    assert max(parts, key=lambda k: parts[k]) == field
    assert weighted_max(d, weights) == pytest.approx(expected)
    assert weighted_max(d, weights) == pytest.approx(max(parts.values()) / 100)


def test_weighted_max_zero_weight_ignores_a_resource() -> None:
    d = load(cpu=pct(10), memory=pct(99))
    assert weighted_max(d, Weights(memory=0.0)) == pytest.approx(0.10)
    assert weighted_max(d, Weights()) == pytest.approx(0.99)


# ------------------------------------------------------------------------------------------------ EMA


def test_with_ema_fresh_start_is_the_weighted_max() -> None:
    s = load(cpu=pct(1), memory=pct(400), bandwidth_in=pct(3), bandwidth_out=pct(4), msg_throughput_in=1)
    s = msgspec.structs.replace(s, msg_throughput_out=2)
    out = with_ema(s, None, HALF, 0.75)
    assert out.weighted_max == pytest.approx(2.0)
    assert out.weighted_max_ema == pytest.approx(2.0)
    assert out.max_resource_usage == pytest.approx(0.04)
    assert out.msg_throughput_ema == pytest.approx(3.0)
    # the raw figures are kept
    assert out.cpu == s.cpu and out.msg_throughput_in == 1 and out.broker == s.broker


def test_with_ema_pulsar_worked_example() -> None:
    # h = 0.75: 2.0 then 0.75 * 2.0 + 0.25 * 1.5 = 1.875; throughput EMA 3 then 0.75*3 + 0.25*11 = 5.
    first = with_ema(
        load(
            cpu=pct(1),
            memory=pct(400),
            bandwidth_in=pct(3),
            bandwidth_out=pct(4),
            msg_throughput_in=1,
            msg_throughput_out=2,
        ),
        None,
        HALF,
        0.75,
    )
    second_sample = load(
        cpu=pct(300),  # weighted 1.5: the new max
        memory=pct(200),  # weighted 1.0
        bandwidth_in=pct(5),
        bandwidth_out=pct(6),
        msg_throughput_in=5,
        msg_throughput_out=6,
    )
    assert weighted_max(second_sample, HALF) == pytest.approx(1.5)
    second = with_ema(second_sample, first, HALF, 0.75)
    assert first.weighted_max_ema == pytest.approx(2.0)
    assert second.weighted_max == pytest.approx(1.5)
    assert second.weighted_max_ema == pytest.approx(1.875)
    assert second.msg_throughput_ema == pytest.approx(5.0)
    assert second.max_resource_usage == pytest.approx(3.0)


@pytest.mark.parametrize("h", [0.0, 0.5, 0.9, 1.0])
def test_with_ema_formula(h: float) -> None:
    prev = load(weighted_max_ema=0.8, msg_throughput_ema=1000.0)
    s = load(cpu=pct(20), msg_throughput_in=100, msg_throughput_out=300)
    out = with_ema(s, prev, Weights(), h)
    assert out.weighted_max_ema == pytest.approx(h * 0.8 + (1 - h) * 0.2)
    assert out.msg_throughput_ema == pytest.approx(h * 1000 + (1 - h) * 400)


def test_with_ema_converges_to_a_constant_sample() -> None:
    prev = None
    s = load(cpu=pct(30))
    for _ in range(200):
        prev = with_ema(s, prev, Weights(), 0.9)
    assert prev is not None
    assert prev.weighted_max_ema == pytest.approx(0.3)
    # restarting (previous=None, after load moved) forgets history at once
    restarted = with_ema(load(cpu=pct(90)), None, Weights(), 0.9)
    assert restarted.weighted_max_ema == pytest.approx(0.9)


# ----------------------------------------------------------------------------------------- publishing

NOW = 10_000_000
RULE = {"threshold_pct": 10.0, "max_interval_s": 900.0}


def base() -> BrokerLoadData:
    return load(
        max_resource_usage=0.50,
        msg_rate_in=100.0,
        msg_rate_out=100.0,
        msg_throughput_in=1000.0,
        msg_throughput_out=1000.0,
        bundles=10,
        reported_at=NOW - 1000,
    )


def test_publish_first_report() -> None:
    assert publish_reason(None, base(), NOW, **RULE) == "first"


def test_publish_forced_wins() -> None:
    assert publish_reason(base(), base(), NOW, force=True, **RULE) == "forced"
    assert publish_reason(None, base(), NOW, force=True, **RULE) == "forced"


def test_publish_after_max_interval() -> None:
    last = msgspec.structs.replace(base(), reported_at=NOW - 900_000)
    assert publish_reason(last, base(), NOW, **RULE) == "interval"
    last = msgspec.structs.replace(base(), reported_at=NOW - 899_999)
    assert publish_reason(last, base(), NOW, **RULE) is None


def test_publish_follows_the_ema_after_a_step_in_load() -> None:
    # Raw figures jump once, then hold. The first sample after the step is published with an EMA only a
    # tenth of the way there (h = .9); the raw figures do not change again, but the EMA keeps moving, and
    # each time it has moved more than 10 points since the last publication the report goes out again.
    w = Weights()
    low, high = step(0.2), step(0.9)
    cur = with_ema(low, None, w, 0.9)
    published = msgspec.structs.replace(cur, reported_at=NOW - 5000)
    reasons = []
    for i in range(60):
        cur = with_ema(high, cur, w, 0.9)
        why = publish_reason(published, cur, NOW + i * 5000, **RULE)
        reasons.append(why)
        if why is not None:
            published = msgspec.structs.replace(cur, reported_at=NOW + i * 5000)
    assert reasons[0] == "changed"  # the raw step
    assert reasons.count("changed") >= 4  # and the EMA's climb after it
    assert abs(published.weighted_max_ema - 0.9) <= 0.1  # the published EMA ends within the threshold


def step(usage: float) -> BrokerLoadData:
    """A broker whose CPU use is ``usage`` (a fraction), every other figure constant."""
    return msgspec.structs.replace(base(), cpu=Usage(usage * 100, 100.0))


def test_publish_unchanged_is_skipped() -> None:
    assert publish_reason(base(), base(), NOW, **RULE) is None


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        # max resource usage is compared in percentage points
        ({"max_resource_usage": 0.61}, "changed"),  # +11 points
        ({"max_resource_usage": 0.59}, None),  # +9 points
        ({"max_resource_usage": 0.39}, "changed"),  # -11 points
        # the others as percent change
        ({"msg_rate_in": 125.0}, "changed"),  # 200 -> 225: +12.5%
        ({"msg_rate_out": 115.0}, None),  # +7.5%
        ({"msg_throughput_in": 1250.0}, "changed"),  # +12.5%
        ({"msg_throughput_out": 850.0}, None),  # -7.5%
        ({"msg_throughput_out": 700.0}, "changed"),  # -15%
        ({"bundles": 12}, "changed"),  # +20%
        ({"bundles": 9}, None),  # -10%: not *more* than the threshold
        # the EMA, what decisions compare, in percentage points
        ({"weighted_max_ema": 0.11}, "changed"),  # +11 points
        ({"weighted_max_ema": 0.09}, None),  # +9 points
    ],
)
def test_publish_each_changed_figure(changes: dict[str, float], expected: str | None) -> None:
    cur = msgspec.structs.replace(base(), **changes)
    assert publish_reason(base(), cur, NOW, **RULE) == expected


@pytest.mark.parametrize("field", ["msg_rate_in", "msg_throughput_out", "bundles"])
def test_publish_zero_to_non_zero_is_an_infinite_change(field: str) -> None:
    zero = msgspec.structs.replace(
        base(), msg_rate_in=0.0, msg_rate_out=0.0, msg_throughput_in=0.0, msg_throughput_out=0.0, bundles=0
    )
    bump = {"msg_rate_in": 0.001, "msg_throughput_out": 0.001, "bundles": 1}[field]
    cur = msgspec.structs.replace(zero, **{field: bump})
    assert publish_reason(zero, cur, NOW, threshold_pct=1e9, max_interval_s=900.0) == "changed"
    # zero to zero is no change at all
    assert publish_reason(zero, zero, NOW, threshold_pct=0.0, max_interval_s=900.0) is None


# ---------------------------------------------------------------------------------------------- fresh


def test_is_fresh_ttl_boundary() -> None:
    d = load(updated_at=1_000_000)
    assert is_fresh(d, 1_000_000, 1800)
    assert is_fresh(d, 1_000_000 + 1_800_000, 1800)
    assert not is_fresh(d, 1_000_000 + 1_800_001, 1800)
    assert not is_fresh(load(updated_at=0), 1_800_001, 1800)


# ---------------------------------------------------------------------------------------------- top-k


def bs(name: str, tin: float = 0.0, tout: float = 0.0, **kw: object) -> BundleStats:
    return BundleStats(
        bundle=f"t/ns/{name}",
        msg_throughput_in=tin,
        msg_throughput_out=tout,
        **kw,  # type: ignore[arg-type]
    )


def test_top_k_orders_by_strict_comparator() -> None:
    stats = [
        bs("a", 10, 0),
        bs("b", 30, 0),
        bs("c", 20, 5),
        bs("d", 20, 9),  # same in, more out than c
        bs("e", 20, 9, msg_rate_in=3.0),  # same throughput as d, more messages
        bs("f", 20, 9, msg_rate_in=3.0, topics=4),  # then topics + sessions
    ]
    names = [s.bundle.rsplit("/", 1)[1] for s in top_k(stats, 10)]
    assert names == ["b", "f", "e", "d", "c", "a"]


def test_top_k_drops_zero_throughput_and_limits_k() -> None:
    stats = [bs(f"x{i}", float(i)) for i in range(12)] + [bs("idle", 0, 0, msg_rate_in=99.0, topics=50)]
    got = top_k(stats, 5)
    assert [s.msg_throughput_in for s in got] == [11, 10, 9, 8, 7]
    assert all(s.throughput > 0 for s in top_k(stats, 100))
    assert len(top_k(stats, 100)) == 11  # x0 and idle have no throughput
    assert top_k(stats, 0) == []
    assert top_k([], 3) == []
    # out-only traffic counts
    assert [s.bundle for s in top_k([bs("o", 0, 1)], 3)] == ["t/ns/o"]


def test_top_k_tie_break_is_deterministic() -> None:
    tied = [bs(n, 5, 5, msg_rate_in=1.0, topics=2) for n in ("0x1", "0x3", "0x2", "0x0")]
    results = {tuple(s.bundle for s in top_k(list(p), 3)) for p in itertools.permutations(tied)}
    assert len(results) == 1  # independent of the input order
    (only,) = results
    assert len(only) == 3 and len(set(only)) == 3


def test_top_k_does_not_mutate_its_input() -> None:
    stats = [bs("a", 1), bs("b", 3), bs("c", 2)]
    before = list(stats)
    top_k(stats, 2)
    assert stats == before


def test_ema_never_nan_for_zero_limits() -> None:
    d = with_ema(load(cpu=Usage(5, 0), memory=Usage(0, 0)), None, Weights(), 0.9)
    assert not math.isnan(d.weighted_max_ema) and d.weighted_max_ema == 0.0


# ------------------------------------------------------------------------------------------ on the wire

_FIGURES = [
    ("weighted_max_ema",),
    ("msg_throughput_ema",),
    ("msg_rate_in",),
    ("max_resource_usage",),
    ("cpu", "usage"),
    ("bandwidth_in", "limit"),
]
_COUNTS = [("bundles",), ("topics",), ("updated_at",), ("reported_at",)]


def _set(d: dict[str, Any], path: tuple[str, ...], value: object) -> None:
    for p in path[:-1]:
        d = d[p]
    d[path[-1]] = value


@given(
    path=st.sampled_from(_FIGURES + _COUNTS),
    bad=st.sampled_from(["-1", "-1e-300", "1e400", "-1e400", "1e19"]),
    ema=st.floats(0, 10),
)
def test_a_report_with_a_negative_or_infinite_figure_is_refused(
    path: tuple[str, ...], bad: str, ema: float
) -> None:
    # 1e400 decodes to infinity: one such report would make every average and deviation of the cluster
    # infinite or NaN. The view's decoder (cluster.kvview) refuses it, with the field in the detail.
    dec = StrictDecoder(BrokerLoadData, 1 << 16)
    good = load(weighted_max_ema=ema, cpu=Usage(1.0, 4.0), bundles=3, updated_at=5)
    assert dec.decode(msgspec.json.encode(good)) == good
    d = msgspec.to_builtins(good)
    _set(d, path, "@")
    out = dec.decode(json.dumps(d).replace('"@"', bad).encode())
    assert isinstance(out, Refused) and out.reason == "invalid", out  # (a count is also no float)
    assert path[-1] in out.detail


def test_top_bundles_and_adapter_samples_refuse_negative_figures() -> None:
    top = StrictDecoder(TopBundles, 1 << 16)
    ok = b'{"broker":"a","bundles":[{"bundle":"x","topics":2,"topic_loads":{"1":[1.0,2.0]}}]}'
    assert not isinstance(top.decode(ok), Refused)
    for bad in (
        b'{"broker":"a","bundles":[{"bundle":"x","topic_loads":{"1":[1.0,-2.0]}}]}',
        b'{"broker":"a","bundles":[{"bundle":"x","consumers":-1}]}',
        b'{"broker":"a","bundles":[{"bundle":"x","msg_throughput_out":1e400}]}',
    ):
        assert isinstance(top.decode(bad), Refused), bad
    # What a broker answers to "sample" (webhook and command adapters) is held to the same rules.
    with pytest.raises(msgspec.DecodeError, match="msg_rate_in"):
        msgspec.json.decode(b'{"bundles":[{"bundle":"x","msg_rate_in":-5}]}', type=BrokerSample)


def test_top_k_leaves_out_what_the_shedder_may_not_move() -> None:
    """Pulsar's TopKBundles: bundles of namespaces with policies (unless shedding them is allowed) do not
    take the k places, so the report still names k bundles the shedder may move."""
    stats = [bs("pinned-1", 90), bs("pinned-2", 80), bs("a", 30), bs("b", 20), bs("c", 10)]
    pinned = lambda name: "pinned" in name  # noqa: E731
    assert [s.bundle for s in top_k(stats, 2)] == ["t/ns/pinned-1", "t/ns/pinned-2"]
    assert [s.bundle for s in top_k(stats, 2, pinned)] == ["t/ns/a", "t/ns/b"]
    assert top_k(stats, 5, lambda name: True) == []
