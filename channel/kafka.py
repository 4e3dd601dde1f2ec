"""The Kafka transport (confluent-kafka).

Producer: idempotent (which implies ``acks=all``), ``partitioner=consistent`` (CRC32 of the key, the rule
the table view enforces), lz4-compressed. A background thread serves delivery callbacks, and a fatal
error (an idempotent producer that lost its guarantees) replaces the producer instead of limping on.

Readers: a consumer per reader, no group and no commits; every partition is ``assign()``-ed at a given
position. ``enable.partition.eof`` tells us when an empty partition is caught up.

Facts about the librdkafka mock cluster this code respects (see docs/operations.md): it auto-creates any
topic a metadata request names (with 4 partitions), cannot create topics through the admin API, never
compacts, and does not wake a waiting fetch when data arrives -- latency is bounded by
``fetch.wait.max.ms``, so low-latency readers use a small value.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any

import structlog
from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from trimtab.channel.topics import DEFAULT_PARTITIONS, TopicSpec
from trimtab.channel.transport import Delivered, Message, report
from trimtab.errors import HistoryGap, TransportError

log = structlog.get_logger("trimtab.kafka")


def _produce_failed(topic: str, why: object) -> TransportError:
    """The one wording of a write Kafka did not take, whether the producer refused it or reported it lost."""
    return TransportError(f"produce to {topic} failed: {why}")


_EOF = KafkaError._PARTITION_EOF
_RESET = KafkaError._AUTO_OFFSET_RESET  # auto.offset.reset=error: the fetch position was deleted
# A partition between leaders (a broker died, a topic was just created): retried, briefly.
_LEADER_MOVING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.NOT_COORDINATOR,
    }
)
# The client's own metadata does not know the partition: after every broker of a cluster restarted, a
# metadata answer given while the topic had no leader can stay in librdkafka's cache until its next periodic
# refresh (minutes). Asking for the topic's metadata refreshes it; then the question is asked again.
_STALE_METADATA = frozenset({KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC})
WATERMARK_RETRY_S = 10.0
#: A metadata client whose questions have all failed for this long is replaced (KafkaTransport._meta_failed).
META_REBUILD_S = 20.0
#: A replaced metadata client is closed this long after: past every question another thread may still be
#: asking it (each is bounded by its timeout, 10 s at most), so none finds it closed under its feet.
META_CLOSE_AFTER_S = 60.0
_new_message = tuple.__new__


def _close_later(consumer: Consumer, after_s: float) -> None:
    time.sleep(after_s)  # until no question asked of it before it was replaced can still be running
    with contextlib.suppress(Exception):
        consumer.close()


class KafkaReader:
    def __init__(self, consumer: Consumer, topic: str, start: dict[int, int]) -> None:
        self._c = consumer
        self._topic = topic
        self._parts = [TopicPartition(topic, p) for p in sorted(start)]
        self._eof: dict[int, int] = dict(start)
        self._gap: HistoryGap | None = None
        consumer.assign([TopicPartition(topic, p, o) for p, o in sorted(start.items())])

    def poll(self, max_messages: int, timeout: float) -> list[Message]:
        if self._gap is not None:
            raise self._gap
        # consume(n, timeout) blocks until it has n messages or the timeout has passed, even when messages
        # are already there: a follower tailing the channel (5000 a batch, 50 ms) would hold every record
        # for the whole timeout. Take what is queued; only when nothing is, wait for the first message and
        # take what came with it -- what MemoryReader does.
        try:
            raw = self._c.consume(max_messages, 0)
            if not raw and timeout > 0:
                first = self._c.poll(timeout)
                if first is not None:
                    raw = [first]
                    if max_messages > 1:
                        raw.extend(self._c.consume(max_messages - 1, 0))
        except KafkaException as e:
            raise TransportError(f"consume from {self._topic} failed: {e}") from e
        out: list[Message] = []
        append = out.append
        for m in raw:
            err = m.error()
            if err is None:
                append(_new_message(Message, (m.key(), m.value(), m.partition(), m.offset())))
            elif err.code() == _EOF:
                p, o = m.partition(), m.offset()
                if p is not None and o is not None:
                    self._eof[p] = o
            elif err.code() == _RESET:
                # The consumer stops fetching that partition; deliver the other messages of this batch
                # and report the gap now or at the next poll.
                if self._gap is None:
                    p, pos = m.partition(), m.offset()
                    self._gap = HistoryGap(
                        self._topic, -1 if p is None else p, -1 if pos is None or pos < 0 else pos, None
                    )
            elif err.fatal():
                raise TransportError(f"fatal consumer error on {self._topic}: {err.str()}")
            else:
                log.warning("consume_error", topic=self._topic, error=err.str(), retriable=err.retriable())
        if not out and self._gap is not None:
            raise self._gap
        return out

    def positions(self) -> dict[int, int]:
        out = dict(self._eof)
        for tp in self._c.position(self._parts):
            if tp.offset != OFFSET_INVALID and tp.offset >= 0:
                out[tp.partition] = max(out.get(tp.partition, 0), tp.offset)
        return out

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._c.close()


class KafkaTransport:
    """A :class:`channel.transport.Transport` over a Kafka cluster (or the librdkafka mock)."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        client_config: Mapping[str, Any] | None = None,
        client_id: str = "trimtab",
        linger_ms: float = 5.0,
        fetch_wait_max_ms: int = 100,
        delivery_timeout_ms: int = 30_000,
        topics: Sequence[TopicSpec] = (),
        replication_factor: int = -1,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self._base: dict[str, Any] = {
            "bootstrap.servers": bootstrap_servers,
            "client.id": client_id,
            "log_level": 3,
            **dict(client_config or {}),
        }
        self._linger_ms = linger_ms
        self._fetch_wait_max_ms = fetch_wait_max_ms
        self._delivery_timeout_ms = delivery_timeout_ms
        self._specs = {t.name: t for t in topics}
        self._replication_factor = replication_factor
        self._lock = threading.Lock()
        self._partitions: dict[str, int] = {}
        self._producer: Producer | None = None
        self._fatal = False
        self._meta: Consumer | None = None
        self._meta_failing_since: float | None = None
        self.meta_rebuilds = 0
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    # ------------------------------------------------------------------ producer
    def _error_cb(self, err: KafkaError) -> None:
        if err.fatal():
            log.error("producer_fatal", error=err.str(), action="the producer will be rebuilt")
            self._fatal = True
        else:
            log.warning("kafka_client_error", error=err.str())

    def _get_producer(self) -> Producer:
        p = self._producer
        if p is not None and not self._fatal:
            return p  # the common case, without the lock: it is taken once per record otherwise
        with self._lock:
            if self._producer is None or self._fatal:
                if self._producer is not None:
                    self._producer.flush(1.0)
                self._fatal = False
                self._producer = Producer(self.producer_config())
                if self._poller is None:
                    self._poller = threading.Thread(
                        target=self._poll_loop, name="kafka-producer", daemon=True
                    )
                    self._poller.start()
            return self._producer

    # ------------------------------------------------------------------ client configurations
    # Every client this transport makes is configured by one of these: each starts from the base (bootstrap
    # servers, client id and the caller's client_config -- TLS, SASL), so none can miss it.
    def producer_config(self) -> dict[str, Any]:
        return {
            **self._base,
            "enable.idempotence": True,
            "acks": "all",  # implied by idempotence; said, so that no client_config can weaken it
            "partitioner": "consistent",
            "compression.type": "lz4",
            "linger.ms": self._linger_ms,
            "delivery.timeout.ms": self._delivery_timeout_ms,
            "error_cb": self._error_cb,
        }

    def metadata_config(self) -> dict[str, Any]:
        return {**self._base, "group.id": f"trimtab-meta-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}

    def admin_config(self) -> dict[str, Any]:
        return dict(self._base)

    def reader_config(self, *, low_latency: bool = True) -> dict[str, Any]:
        return {
            **self._base,
            "group.id": f"trimtab-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # Never jump over records this node did not read: a position that retention deleted is
            # reported (HistoryGap) and the owner re-bootstraps from a snapshot.
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": self._fetch_wait_max_ms if low_latency else 200,
            "fetch.message.max.bytes": 8 << 20,
            "fetch.max.bytes": 64 << 20,
            # Prefetch per partition: enough to keep a bootstrap's replay fed (1 000 000 records from real
            # Kafka: 3.18 s against 3.11 s with 500 000 -- within the spread; the replay, not the fetch, is
            # the slow side), small enough that the queue is not a second copy of the channel: 500 000 and
            # 1 GiB made an agent's bootstrap of 2 000 000 records peak at 1 166 MiB resident, these at 966.
            "queued.min.messages": 20_000,
            "queued.max.messages.kbytes": 64 << 10,
        }

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            p = self._producer
            if p is not None:
                try:
                    p.poll(0.05)
                except Exception:  # a delivery callback raised: log it, and keep serving the others
                    log.exception("producer_poll_failed")
            else:
                self._stop.wait(0.05)

    def produce(
        self, topic: str, key: bytes, value: bytes | None, *, partition: int | None = None
    ) -> Future[Message]:
        fut: Future[Message] = Future()
        part = -1 if partition is None else partition  # -1: the configured partitioner decides

        def done(err: KafkaError | None, msg: Any) -> None:
            # A waiter that gave up (asyncio.wrap_future under a timeout) cancels the future; its report
            # still comes, and must not raise on the delivery thread.
            with contextlib.suppress(InvalidStateError):
                if err is not None:
                    fut.set_exception(_produce_failed(topic, err.str()))
                else:
                    fut.set_result(Message(msg.key(), msg.value(), msg.partition(), msg.offset()))

        failed = self._append(topic, key, value, part, done)
        if failed is not None:
            fut.set_exception(failed)
        return fut

    def send(self, topic: str, key: bytes, value: bytes | None, on_done: Delivered) -> None:
        def done(err: KafkaError | None, msg: Any) -> None:
            report(
                on_done,
                None if err is None else _produce_failed(topic, err.str()),
                topic,
            )

        failed = self._append(topic, key, value, -1, done)
        if failed is not None:
            report(on_done, failed, topic)

    def _append(
        self, topic: str, key: bytes, value: bytes | None, part: int, done: Callable[[Any, Any], None]
    ) -> TransportError | None:
        """Hand one record to the producer (waiting once for room in a full queue); the error if it could
        not take it, in which case ``done`` is never called."""
        producer = self._get_producer()
        try:
            producer.produce(topic, key=key, value=value, on_delivery=done, partition=part)
        except BufferError:
            producer.poll(0.5)
            try:
                producer.produce(topic, key=key, value=value, on_delivery=done, partition=part)
            except BufferError as e:
                return TransportError(f"producer queue full for {topic}: {e}")
        except KafkaException as e:
            return _produce_failed(topic, e)
        return None

    def flush(self, timeout: float) -> int:
        p = self._producer
        return 0 if p is None else int(p.flush(timeout))

    # ------------------------------------------------------------------ metadata
    def _meta_consumer(self) -> Consumer:
        with self._lock:
            if self._meta is None:
                self._meta = Consumer(self.metadata_config())
            return self._meta

    def partitions(self, topic: str) -> int:
        n = self._partitions.get(topic)
        if n:
            return n
        try:
            n = self._ensure_topic(topic)
        except KafkaException as e:
            raise TransportError(
                f"cannot read the metadata of {topic} from {self.bootstrap_servers}: {e}"
            ) from e
        self._partitions[topic] = n
        return n

    def _ensure_topic(self, topic: str) -> int:
        admin = AdminClient(self.admin_config())
        md = admin.list_topics(topic, timeout=10)
        t = md.topics.get(topic)
        if t is not None and t.error is None and t.partitions:
            return len(t.partitions)
        # Not there: create it as its spec says (cluster/topics.py) where the broker allows it...
        spec = self._specs.get(topic)
        wanted = spec.partitions if spec is not None else DEFAULT_PARTITIONS
        config = spec.topic_config() if spec is not None else {}
        try:
            fs = admin.create_topics(
                [NewTopic(topic, wanted, self._replication_factor, config=config)],
                request_timeout=10,
                operation_timeout=10,
            )
            fs[topic].result()
            log.info("topic_created", topic=topic, partitions=wanted, config=config)
        except KafkaException as e:
            # ...and otherwise see whether it exists after all (another client created it meanwhile, or the
            # broker auto-creates topics); the daemons never get here: cluster.topics.prepare_topics made or
            # refused every topic before their transport reads one.
            log.warning("topic_create_failed", topic=topic, error=str(e))
        md = self._meta_consumer().list_topics(topic, timeout=10)
        t = md.topics.get(topic)
        if t is None or t.error is not None or not t.partitions:
            err = t.error.str() if t is not None and t.error is not None else "not found"
            raise TransportError(f"topic {topic} unavailable on {self.bootstrap_servers}: {err}")
        return len(t.partitions)

    def watermarks(self, topic: str, partition: int, *, timeout_s: float = 10.0) -> tuple[int, int]:
        """The partition's low and high watermarks. A partition whose leader is moving (a broker died, the
        topic was just created) answers "not leader" for a moment: that is retried for up to
        :data:`WATERMARK_RETRY_S` (and ``timeout_s``); any other error, or one that lasts, is a
        :class:`TransportError` -- and once this client has failed for :data:`META_REBUILD_S`, it is
        replaced (see :meth:`_meta_failed`)."""
        try:
            ends = self._watermarks(topic, partition, timeout_s)
        except TransportError:
            self._meta_failed()
            raise
        self._meta_failing_since = None
        return ends

    def _meta_failed(self) -> None:
        """The metadata client failed again. librdkafka's clients can stay wedged after every broker of a
        cluster restarted (a follower's reader did; so did a metadata client, unable to read an end for
        minutes while a new client read it at once). One that has failed for :data:`META_REBUILD_S` is
        replaced by a new one at the next question -- not more often than that, so an outage costs a
        client per interval. The old one is closed :data:`META_CLOSE_AFTER_S` later on a thread of its own:
        other threads (the followers' stall watches, the lag's end reader) may be asking it right now, and
        closing can wait on its brokers."""
        now = time.monotonic()
        if self._meta_failing_since is None:
            self._meta_failing_since = now
            return
        if now - self._meta_failing_since < META_REBUILD_S:
            return
        with self._lock:
            old, self._meta = self._meta, None
        self._meta_failing_since = now
        self.meta_rebuilds += 1
        log.warning("kafka_metadata_client_replaced", failing_s=META_REBUILD_S, rebuilds=self.meta_rebuilds)
        if old is not None:
            threading.Thread(
                target=_close_later, args=(old, META_CLOSE_AFTER_S), name="kafka-meta-close", daemon=True
            ).start()

    def _watermarks(self, topic: str, partition: int, timeout_s: float) -> tuple[int, int]:
        deadline = time.monotonic() + min(WATERMARK_RETRY_S, timeout_s)
        delay = 0.05
        while True:
            try:
                low, high = self._meta_consumer().get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=timeout_s, cached=False
                )
                return int(low), int(high)
            except (KafkaException, RuntimeError) as e:
                if isinstance(e, RuntimeError):
                    # A client closed under this question (replaced, or the transport closing): never a
                    # crash of the caller's thread; asked again of the current client unless closing.
                    code, again = None, not self._stop.is_set()
                else:
                    err = e.args[0] if e.args else None
                    code = err.code() if isinstance(err, KafkaError) else None
                    again = code in _LEADER_MOVING or code in _STALE_METADATA
                if not again or time.monotonic() + delay > deadline:
                    raise TransportError(f"cannot read watermarks of {topic}[{partition}]: {e}") from e
                if code in _STALE_METADATA:
                    with contextlib.suppress(KafkaException, RuntimeError):
                        self._meta_consumer().list_topics(
                            topic, timeout=max(0.1, deadline - time.monotonic())
                        )
                time.sleep(delay)  # a leader being elected, a client replaced: nothing to wait on but time
                delay = min(delay * 2, 0.5)

    # ------------------------------------------------------------------ readers
    def reader(self, topic: str, start: dict[int, int], *, low_latency: bool = True) -> KafkaReader:
        n = self.partitions(topic)
        consumer = Consumer(self.reader_config(low_latency=low_latency))
        return KafkaReader(consumer, topic, {p: start.get(p, 0) for p in range(n)})

    def close(self) -> None:
        self._stop.set()
        if self._producer is not None:
            self._producer.flush(5.0)
        if self._poller is not None:
            self._poller.join(2.0)
        if self._meta is not None:
            with contextlib.suppress(RuntimeError):
                self._meta.close()
