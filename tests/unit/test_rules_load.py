"""The load-report rules one at a time (balance/load.py; docs/testing.md: mutation testing).

Every test names the rule it pins: the weights read from the settings, each one in its place, the
unweighted maximum over cpu and both bandwidths (memory left out), the publish threshold on the raw
maximum and on the EMA with equality not publishing, one reporter step (``next_report``) -- the EMA
continued or restarted, the reason from the last published report, forced, the report stamped with the
time it is published -- and the top-k order where only topics plus sessions differ.
"""

from __future__ import annotations

import msgspec
import pytest

from trimtab.balance.load import (
    BrokerLoadData,
    BundleStats,
    NextReport,
    Usage,
    Weights,
    max_resource_usage,
    next_report,
    publish_reason,
    top_k,
)
from trimtab.config.settings import LoadSettings, Settings

NOW = 1_000_000
SETTINGS = Settings(
    load=LoadSettings(history_weight=0.5, report_threshold_pct=12.5, report_max_interval_s=60.0)
)


def test_weights_come_from_the_settings_each_in_its_place() -> None:
    """Rule: ``Weights.from_settings`` reads cpu, memory, bandwidth in and bandwidth out weights from
    ``load``, each into its own field."""
    s = Settings(
        load=LoadSettings(
            cpu_weight=0.25, memory_weight=0.5, bandwidth_in_weight=0.75, bandwidth_out_weight=0.125
        )
    )
    assert Weights.from_settings(s) == Weights(cpu=0.25, memory=0.5, bandwidth_in=0.75, bandwidth_out=0.125)
    assert Weights.from_settings(Settings()) == Weights()


@pytest.mark.parametrize("resource", ["cpu", "bandwidth_in", "bandwidth_out"])
def test_max_resource_usage_is_the_largest_of_cpu_and_both_bandwidths(resource: str) -> None:
    """Rule: the unweighted maximum takes cpu, bandwidth in and bandwidth out -- whichever is largest --
    and leaves memory out."""
    load = BrokerLoadData(broker="b", memory=Usage(100.0, 100.0), **{resource: Usage(75.0, 100.0)})  # type: ignore[arg-type]
    assert max_resource_usage(load) == 0.75


def report(*, mru: float = 0.5, ema: float = 0.5) -> BrokerLoadData:
    return BrokerLoadData(broker="b", max_resource_usage=mru, weighted_max_ema=ema, reported_at=NOW)


def reason(last: BrokerLoadData, current: BrokerLoadData) -> str | None:
    return publish_reason(last, current, NOW, threshold_pct=12.5, max_interval_s=60.0)


def test_a_change_of_the_raw_maximum_publishes_only_above_the_threshold() -> None:
    """Rule: a change of the unweighted maximum by exactly the threshold (0.5 -> 0.625: 12.5 points) does
    not publish; more does."""
    assert reason(report(), report(mru=0.625)) is None
    assert reason(report(), report(mru=0.75)) == "changed"


def test_a_change_of_the_ema_publishes_only_above_the_threshold() -> None:
    """Rule: the EMA counts by its own change: by exactly the threshold (0.5 -> 0.625) it does not
    publish, more does, and an unchanged EMA changes nothing."""
    assert reason(report(), report(ema=0.625)) is None
    assert reason(report(), report(ema=0.75)) == "changed"
    assert reason(report(), report()) is None


# -------------------------------------------------------------------------------------- reporter step


def raw(cpu: float = 25.0) -> BrokerLoadData:
    return BrokerLoadData(broker="b", cpu=Usage(cpu, 100.0), updated_at=NOW)


def step(
    sample: BrokerLoadData,
    *,
    current: BrokerLoadData | None = None,
    published: BrokerLoadData | None = None,
    fresh: bool = False,
    force: bool = False,
    now_ms: int = NOW,
) -> NextReport:
    return next_report(
        sample,
        current=current,
        published=published,
        fresh=fresh,
        force=force,
        weights=Weights(),
        settings=SETTINGS,
        now_ms=now_ms,
    )


def test_the_ema_continues_from_the_current_report_unless_load_just_moved() -> None:
    """Rule: a step continues the EMA from ``current`` with the settings' history weight (0.5 x 0.5 +
    0.5 x 0.25), and restarts it from the sample when ``fresh``; the step's ``current`` is that report."""
    before = msgspec.structs.replace(raw(50.0), weighted_max_ema=0.5)
    on = step(raw(), current=before)
    assert on.current.weighted_max_ema == 0.375
    assert on.current.weighted_max == 0.25
    restarted = step(raw(), current=before, fresh=True)
    assert restarted.current.weighted_max_ema == 0.25
    assert restarted.current.broker == "b"


def test_the_first_report_is_published_stamped_with_the_time() -> None:
    """Rule: with nothing published yet the step publishes (``first``) its current report, with
    ``reported_at`` the step's time."""
    first = step(raw(), now_ms=NOW + 8)
    assert first.reason == "first"
    assert first.published == msgspec.structs.replace(first.current, reported_at=NOW + 8)
    assert first.current.reported_at == 0


def test_a_step_judges_against_the_last_published_report() -> None:
    """Rule: a step compares with what was last published, at the step's time, with the settings'
    threshold and interval: an unchanged sample within the interval is not published (no report), one
    at the interval is (``interval``), and ``force`` publishes whatever changed."""
    first = step(raw())
    assert first.published is not None
    same = step(raw(), current=first.current, published=first.published, now_ms=NOW + 1000)
    assert (same.reason, same.published) == (None, None)
    assert same.current.weighted_max_ema == 0.25
    late = step(raw(), current=first.current, published=first.published, now_ms=NOW + 60_000)
    assert late.reason == "interval"
    assert late.published is not None and late.published.reported_at == NOW + 60_000
    forced = step(raw(), current=first.current, published=first.published, force=True, now_ms=NOW + 1000)
    assert forced.reason == "forced"
    assert forced.published == msgspec.structs.replace(forced.current, reported_at=NOW + 1000)
    moved = step(raw(50.0), current=first.current, published=first.published, now_ms=NOW + 1000)
    assert moved.reason == "changed"


def test_top_k_orders_equal_rates_by_topics_plus_sessions() -> None:
    """Rule: bundles equal in throughput and rates are ordered by topics plus sessions, most first (3
    before 2, though the other has more topics and the later name)."""
    sessions = BundleStats(bundle="t/ns/a", msg_throughput_in=1.0, topics=1, producers=1, consumers=1)
    topics = BundleStats(bundle="t/ns/b", msg_throughput_in=1.0, topics=2)
    assert top_k([topics, sessions], 2) == [sessions, topics]
