"""Rules of KafkaTransport.watermarks (channel/kafka.py): a partition between leaders is asked again, a
client whose own metadata lost the partition (after every broker of a cluster restarted) refreshes it and
asks again, anything else is a TransportError at once; a client failing for 20 s is replaced -- with a fake
metadata consumer, no Kafka needed."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

import trimtab.channel.kafka as kafka_module
from tests.support.clock import ManualClock
from tests.support.logs import capture_logs
from trimtab.channel.kafka import META_REBUILD_S, KafkaTransport
from trimtab.errors import TransportError


class FakeMeta:
    """Answers get_watermark_offsets with the errors given, then (3, 9); keeps every call."""

    def __init__(self, errors: list[int]) -> None:
        self.errors = list(errors)
        self.calls: list[str] = []

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        self.calls.append("watermarks")
        assert cached is False  # the ends now, never a cached answer
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return 3, 9

    def list_topics(self, topic: str, timeout: float) -> None:
        self.calls.append(f"metadata {topic}")


def transport(meta: FakeMeta) -> KafkaTransport:
    t = KafkaTransport("127.0.0.1:1")
    t._meta = meta  # type: ignore[assignment]
    return t


@pytest.mark.parametrize("code", [KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC])
def test_a_partition_the_clients_metadata_lost_is_refreshed_and_asked_again(code: int) -> None:
    meta = FakeMeta([code, code])
    assert transport(meta).watermarks("t", 2, timeout_s=5) == (3, 9)
    assert meta.calls == ["watermarks", "metadata t", "watermarks", "metadata t", "watermarks"]


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.NOT_COORDINATOR,
    ],
)
def test_a_partition_between_leaders_is_asked_again_without_a_metadata_refresh(code: int) -> None:
    meta = FakeMeta([code])
    assert transport(meta).watermarks("t", 0, timeout_s=5) == (3, 9)
    assert meta.calls == ["watermarks", "watermarks"]


def test_any_other_error_is_a_transport_error_at_once() -> None:
    meta = FakeMeta([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    with pytest.raises(TransportError, match=r"cannot read watermarks of t\[1\]"):
        transport(meta).watermarks("t", 1, timeout_s=5)
    assert meta.calls == ["watermarks"]


def test_an_error_that_lasts_past_the_timeout_is_a_transport_error() -> None:
    meta = FakeMeta([KafkaError._UNKNOWN_PARTITION] * 1000)
    with pytest.raises(TransportError, match="Unknown partition"):
        transport(meta).watermarks("t", 1, timeout_s=0.3)
    assert 2 <= meta.calls.count("watermarks") < 10


class FailingMeta(FakeMeta):
    def __init__(self) -> None:
        super().__init__([KafkaError.TOPIC_AUTHORIZATION_FAILED] * 100)
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()


def test_a_metadata_client_failing_for_20_s_is_replaced_once_and_closed_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = ManualClock(1000.0)
    monkeypatch.setattr(kafka_module.time, "monotonic", clock)
    monkeypatch.setattr(kafka_module, "META_CLOSE_AFTER_S", 0.01)  # 60 s in production
    meta = FailingMeta()
    t = transport(meta)
    for dt in (0.0, 10.0, META_REBUILD_S - 10.001):  # failing since the first, for less than 20 s
        clock.now += dt
        with pytest.raises(TransportError):
            t.watermarks("t", 0)
        assert t._meta is meta and t.meta_rebuilds == 0
    clock.now += 0.001
    with capture_logs() as logs, pytest.raises(TransportError):
        t.watermarks("t", 0)
    assert t._meta is None and t.meta_rebuilds == 1  # the next question makes a new client
    assert meta.closed.wait(5)
    assert [e["event"] for e in logs] == ["kafka_metadata_client_replaced"]


def test_a_success_ends_the_failing_spell() -> None:
    meta = FakeMeta([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    t = transport(meta)
    with pytest.raises(TransportError):
        t.watermarks("t", 0)
    assert t._meta_failing_since is not None
    assert t.watermarks("t", 0) == (3, 9)
    assert t._meta_failing_since is None and t.meta_rebuilds == 0


class ClosedMeta(FakeMeta):
    """A client closed under the question (replaced, or the transport closing): librdkafka's RuntimeError."""

    def __init__(self, closed_times: int) -> None:
        super().__init__([])
        self.closed_times = closed_times

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        if self.closed_times:
            self.closed_times -= 1
            self.calls.append("closed")
            raise RuntimeError("Consumer closed")
        return super().get_watermark_offsets(tp, timeout, cached)


def test_a_client_closed_under_the_question_is_asked_again_not_raised() -> None:
    meta = ClosedMeta(2)
    assert transport(meta).watermarks("t", 0, timeout_s=5) == (3, 9)
    assert meta.calls == ["closed", "closed", "watermarks"]


def test_a_client_that_stays_closed_is_a_transport_error() -> None:
    meta = ClosedMeta(1000)
    with pytest.raises(TransportError, match="Consumer closed"):
        transport(meta).watermarks("t", 0, timeout_s=0.3)


def test_after_close_a_closed_client_is_a_transport_error_at_once() -> None:
    meta = ClosedMeta(1000)
    t = transport(meta)
    t._stop.set()  # what close() sets first
    with pytest.raises(TransportError, match="Consumer closed"):
        t.watermarks("t", 0, timeout_s=5)
    assert meta.calls == ["closed"]
