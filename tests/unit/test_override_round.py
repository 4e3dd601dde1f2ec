"""The leader's round of forced records (controller.writes.OverrideRound): every record sent once, its
delivery report counted once -- acknowledged, failed, or never heard of within the timeout."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from prometheus_client import CollectorRegistry

from trimtab.balance.heal import Override
from trimtab.channel.records import State, make
from trimtab.controller.metrics import ControllerMetrics
from trimtab.controller.writes import OverrideRound
from trimtab.errors import TransportError


class FakeChannel:
    """Reports each record as its bundle name says: ok-* at once, fail-* at once with an error, late-* from
    another thread, lost-* never."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.threads: list[threading.Thread] = []

    def send(self, bundle: str, record: Any, on_done: Any) -> None:
        self.sent.append(bundle)
        kind = bundle.split("-", maxsplit=1)[0]
        if kind == "ok":
            on_done(None)
        elif kind == "fail":
            on_done(TransportError(f"produce of {bundle} failed: broker down"))
        elif kind == "late":
            t = threading.Thread(target=on_done, args=(None,))
            self.threads.append(t)
            t.start()


class FakeLeadership:
    def __init__(self, confirmed: bool) -> None:
        self.confirmed = confirmed
        self.asked = 0

    def confirm_blocking(self) -> bool:
        self.asked += 1
        return self.confirmed


def overrides(*bundles: str, reason: str = "failed_broker") -> list[Override]:
    rec = make(State.ASSIGNING, dst="b1:1", version=2, ts=1, writer="ctl")
    return [Override(b, rec, reason, "gone:1", "b1:1") for b in bundles]


def counted(r: CollectorRegistry, reason: str, result: str) -> float:
    return r.get_sample_value("trimtab_overrides_total", {"reason": reason, "result": result}) or 0.0


def test_every_report_is_counted_once_and_silence_is_a_failure_after_the_timeout() -> None:
    reg = CollectorRegistry()
    channel, leadership = FakeChannel(), FakeLeadership(True)
    batch = OverrideRound(channel, leadership, ControllerMetrics.create(reg), ack_timeout_s=0.3)  # type: ignore[arg-type]
    batch.add(overrides("ok-1", "late-1", "fail-1"))
    batch.add([])
    batch.add(overrides("ok-2", "lost-1", reason="stuck"))
    published = asyncio.run(batch.finish())
    for t in channel.threads:
        t.join()
    assert leadership.asked == 1, "leadership is confirmed once per round"
    assert channel.sent == ["ok-1", "late-1", "fail-1", "ok-2", "lost-1"]
    assert published == 3
    assert counted(reg, "failed_broker", "published") == 2
    assert counted(reg, "stuck", "published") == 1
    assert counted(reg, "failed_broker", "failed") == 1
    assert counted(reg, "stuck", "failed") == 1  # lost-1: no acknowledgement within the timeout


def test_a_round_whose_reports_all_came_back_does_not_wait_for_the_timeout() -> None:
    reg = CollectorRegistry()
    channel = FakeChannel()
    batch = OverrideRound(channel, FakeLeadership(True), ControllerMetrics.create(reg), ack_timeout_s=3600)  # type: ignore[arg-type]
    batch.add(overrides(*(f"late-{i}" for i in range(50))))
    batch.add(overrides(*(f"ok-{i}" for i in range(50))))
    assert asyncio.run(asyncio.wait_for(batch.finish(), 30)) == 100
    for t in channel.threads:
        t.join()


def test_nothing_is_sent_when_leadership_is_not_confirmed() -> None:
    reg = CollectorRegistry()
    channel, leadership = FakeChannel(), FakeLeadership(False)
    batch = OverrideRound(channel, leadership, ControllerMetrics.create(reg), ack_timeout_s=0.1)  # type: ignore[arg-type]
    batch.add(overrides("ok-1"))
    batch.add(overrides("ok-2"))
    assert asyncio.run(batch.finish()) == 0
    assert channel.sent == [] and leadership.asked == 1
    assert counted(reg, "failed_broker", "published") == 0
