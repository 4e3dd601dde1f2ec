"""Racing channel writers and garbage records, for replica-convergence tests on a real Kafka protocol.

Each :class:`RacingWriter` is a broker-like node: its own transport (own producer and consumer), its own
:class:`channel.client.ChannelClient` table view, and a seeded RNG. Every round it reads its *own* view of
each bundle and publishes the next transition it wants, without waiting for anyone; several writers
computing the same next version from the same view is the race docs/design.md section 3.3 resolves ("first
valid transition wins"). The moves deliberately include the conflicts that matter:

* every writer claims the same ``Init``/``Free`` bundle for itself (``Assigning`` version n+1);
* every writer races to release an ``Owned`` bundle: competing transfers to different brokers and unloads;
* the non-owner sometimes pretends to own (broker mismatch), continues someone else's move, repeats an
  old version (stale) or skips one (version gap), forces a leader override, splits, deletes, tombstones.

:func:`write_garbage` adds records that every replica must *skip* (not JSON, future schema, unknown state,
bad keys, a record in the wrong partition...). Which writer wins is up to the cluster; the tests only
require that every replica ends with the same table and the same stats.
"""

from __future__ import annotations

import random
import threading
import time
import zlib
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future

import orjson
from confluent_kafka import Producer

from tests.support.waiting import wait_for
from trimtab.channel.bundles import (
    BundleLayout,
    BundleRange,
    bundle_name,
    parse_bundle,
    range_equally_divide,
    split_range,
)
from trimtab.channel.client import ChannelClient
from trimtab.channel.kafka import KafkaTransport
from trimtab.channel.records import Record, State, make
from trimtab.channel.transport import Message

NAMESPACE = "race/ns"
NOTHING = object()  # "no move for this bundle this round"


def race_bundles(count: int, namespace: str = NAMESPACE) -> list[str]:
    return BundleLayout.default(namespace, count).bundles


def children_of(bundle: str, rec: Record) -> list[str]:
    ns, _ = parse_bundle(bundle)
    return [bundle_name(ns, BundleRange.parse(c)) for c in sorted(rec.children or {})]


def propose(
    bundle: str, cur: Record | None, me: str, brokers: Sequence[str], rng: random.Random, splittable: bool
) -> Record | object | None:
    """The next record ``me`` publishes for ``bundle`` seen at ``cur``: a Record, None (a tombstone) or
    :data:`NOTHING`. Mostly valid moves, some deliberately wrong ones (see the module docstring)."""
    ts = time.time_ns() // 1_000_000
    others = [b for b in brokers if b != me]

    def rec(
        state: State,
        version: int,
        *,
        dst: str | None = None,
        src: str | None = None,
        force: bool = False,
        children: dict[str, str | None] | None = None,
    ) -> Record:
        return make(
            state, version=version, ts=ts, writer=me, dst=dst, src=src, force=force, children=children
        )

    if cur is None:
        return rec(State.ASSIGNING, 1, dst=me)
    v = cur.version
    roll = rng.random()
    if roll < 0.04:
        return rec(State.FREE, v + 1, force=True)  # a leader override from any state
    if roll < 0.08:
        return rec(State.ASSIGNING, v, dst=me)  # stale: a version already used
    if roll < 0.11:
        return rec(State.ASSIGNING, v + 2, dst=me)  # gap
    s = cur.state
    if s is State.FREE:
        return None if rng.random() < 0.25 else rec(State.ASSIGNING, v + 1, dst=me)
    if s is State.ASSIGNING:
        if cur.dst == me or rng.random() < 0.3:
            # The destination confirms; others sometimes race it (same record: stale) or claim it (mismatch).
            dst = cur.dst if rng.random() < 0.7 else me
            return rec(State.OWNED, v + 1, dst=dst, src=cur.src)
        return NOTHING
    if s is State.OWNED:
        owner = cur.dst
        assert owner is not None
        if owner == me and splittable and rng.random() < 0.15:
            _, rng_ = parse_bundle(bundle)
            cuts = range_equally_divide(rng_)
            if cuts:
                children: dict[str, str | None] = {c.name: me for c in split_range(rng_, cuts)}
                return rec(State.SPLITTING, v + 1, src=me, children=children)
        if rng.random() < 0.5:
            # Competing releases: a transfer to some other broker, or an unload (dst None). A non-owner
            # writing src=itself is a broker mismatch.
            src = owner if rng.random() < 0.85 else me
            dst = rng.choice([None, *[b for b in brokers if b != src]])
            return rec(State.RELEASING, v + 1, src=src, dst=dst)
        return NOTHING
    if s is State.RELEASING:
        if cur.src == me or rng.random() < 0.3:
            if cur.dst is not None:
                return rec(State.ASSIGNING, v + 1, src=cur.src, dst=cur.dst)
            return rec(State.FREE, v + 1, src=cur.src)
        return NOTHING
    if s is State.SPLITTING:
        if cur.src == me or rng.random() < 0.2:
            return rec(State.DELETED, v + 1, src=cur.src)
        return NOTHING
    if s is State.DELETED:
        return None if rng.random() < 0.6 else rec(State.ASSIGNING, v + 1, dst=rng.choice(others or [me]))
    return NOTHING


class RacingWriter(threading.Thread):
    """One racing node. Start all writers, then set ``go`` so they begin together; :meth:`close` after."""

    def __init__(
        self,
        me: str,
        brokers: Sequence[str],
        bootstrap_servers: str,
        topic: str,
        bundles: Sequence[str],
        *,
        rounds: int,
        seed: int,
        go: threading.Event,
        round_timeout: float = 15.0,
    ) -> None:
        super().__init__(name=f"writer-{me}", daemon=True)
        self.me = me
        self.brokers = list(brokers)
        self.topic = topic
        self.bundles = list(bundles)
        self.rounds = rounds
        self.rng = random.Random(seed)
        self.go = go
        self.round_timeout = round_timeout
        self.transport = KafkaTransport(bootstrap_servers, client_id=f"writer-{me}")
        self.client = ChannelClient(self.transport, topic, None, use_snapshot=False)
        self.published: Counter[str] = Counter()
        self.error: BaseException | None = None
        self.ready = threading.Event()

    def run(self) -> None:
        try:
            self.client.start()
            if not self.client.wait_ready(30):
                raise RuntimeError(f"{self.me}: channel view not ready: {self.client.error}")
            self.ready.set()
            if not self.go.wait(30):
                raise RuntimeError(f"{self.me}: never told to go")
            for _ in range(self.rounds):
                self._round()
        except BaseException as e:
            self.error = e

    def _known(self) -> list[str]:
        known = set(self.bundles)
        for name, rec in self.client.table.items():
            known.add(name)
            if rec.children:
                known.update(children_of(name, rec))
        return sorted(known)

    def _round(self) -> None:
        futures: list[Future[Message]] = []
        original = set(self.bundles)
        known = self._known()
        for bundle in self.rng.sample(known, k=len(known)):
            cur = self.client.table.get(bundle)
            if cur is None and bundle not in original and self.rng.random() < 0.5:
                # A split child nobody claimed yet: its parent's owner claims it Owned at version 1.
                parent = self._parent_of(bundle)
                if parent is not None:
                    prop: Record | object | None = make(
                        State.OWNED, version=1, ts=time.time_ns() // 1_000_000, writer=self.me, dst=parent
                    )
                else:
                    prop = NOTHING
            else:
                prop = propose(bundle, cur, self.me, self.brokers, self.rng, splittable=bundle in original)
            if prop is NOTHING:
                continue
            assert prop is None or isinstance(prop, Record)
            futures.append(self.client.publish(bundle, prop))
            self.published["tombstone" if prop is None else prop.state.value] += 1
        last: dict[int, int] = {}
        for f in futures:
            m = f.result(self.round_timeout)
            last[m.partition] = max(last.get(m.partition, -1), m.offset)
        # Our own view has applied our writes (and everything before them) before the next round.
        follower = self.client.follower
        assert follower is not None
        wait_for(
            lambda: all(follower.positions.get(p, 0) > o for p, o in last.items()),
            self.round_timeout,
            message=f"{self.me}'s view catches up with its own writes",
        )

    def _parent_of(self, child: str) -> str | None:
        """The broker named for ``child`` by a split record in our view (the claimant), if any."""
        ns, rng_ = parse_bundle(child)
        for name, rec in self.client.table.items():
            if rec.children and rng_.name in rec.children and name.startswith(ns + "/"):
                return rec.children[rng_.name]
        return None

    def close(self) -> None:
        self.client.stop()
        self.transport.close()


def run_writers(
    bootstrap_servers: str,
    topic: str,
    *,
    writers: int = 4,
    bundles: int = 12,
    rounds: int = 10,
    seed: int = 192,
    garbage: bool = True,
) -> tuple[list[RacingWriter], Counter[str]]:
    """Run racing writers (and one garbage writer in the middle of the race) to completion.

    Returns the writers (their channel views still following; :meth:`RacingWriter.close` them) and the
    expected skip reasons of the garbage written.
    """
    names = [f"broker-{i}" for i in range(writers)]
    go = threading.Event()
    team = [
        RacingWriter(
            n, names, bootstrap_servers, topic, race_bundles(bundles), rounds=rounds, seed=seed + i, go=go
        )
        for i, n in enumerate(names)
    ]
    expected_skips: Counter[str] = Counter()
    try:
        for w in team:
            w.start()
        wait_for(
            lambda: all(w.ready.is_set() or w.error for w in team), 30, message="every writer's view is ready"
        )
        go.set()
        if garbage:
            expected_skips = write_garbage(bootstrap_servers, topic, race_bundles(bundles))
        for w in team:
            w.join(60)
        for w in team:
            if w.is_alive():
                raise AssertionError(f"{w.name} did not finish its rounds")
            if w.error is not None:
                raise AssertionError(f"{w.name} failed: {w.error!r}") from w.error
    except BaseException:
        for w in team:
            w.close()
        raise
    return team, expected_skips


# ---------------------------------------------------------------------------------------------- garbage


def _valid_json(**overrides: object) -> bytes:
    body: dict[str, object] = {
        "schema": 1,
        "state": "assigning",
        "dst": "vandal",
        "src": None,
        "version": 1,
        "force": False,
        "ts": 1,
        "writer": "vandal",
    }
    body.update(overrides)
    return orjson.dumps(body)


def garbage_messages(
    bundles: Sequence[str], partitions: int = 4
) -> list[tuple[bytes | None, bytes, int | None, str]]:
    """(key, value, explicit partition or None, expected skip reason) of records every replica skips."""
    b = bundles[0].encode()
    # A well-formed record for a bundle nobody else writes, in a partition that is not its home.
    stray = f"{NAMESPACE}-stray/0x00000000_0xffffffff".encode()
    wrong = (zlib.crc32(stray) % partitions + 1) % partitions
    return [
        (b, b"not json at all", None, "malformed"),
        (b, b"", None, "malformed"),
        (b, b"[1, 2, 3]", None, "malformed"),
        (b, b'{"schema": 1, "state": "owned"}', None, "malformed"),
        (b, _valid_json(version="one"), None, "malformed"),
        (b, _valid_json(schema=2, state="owned", extra={"new": "field"}), None, "future_schema"),
        (b, _valid_json(state="exploded"), None, "unknown_state"),
        (b"not-a-bundle", _valid_json(), None, "bad_key"),
        (b"\xff\xfe\xfd", _valid_json(), None, "bad_key"),
        (None, _valid_json(), None, "bad_key"),
        (f"{NAMESPACE}/0x80000000_0x10000000".encode(), _valid_json(), None, "bad_key"),  # lower > upper
        (stray, _valid_json(), wrong, "wrong_partition"),
        # The same for a bundle that *is* in play: whether a replica has the key in its table when this
        # arrives depends on how it interleaved the partitions, so it must be skipped regardless.
        (
            b,
            _valid_json(version=2, state="owned", dst="vandal"),
            (zlib.crc32(b) % partitions + 2) % partitions,
            "wrong_partition",
        ),
        (b, _valid_json(), (zlib.crc32(b) % partitions + 3) % partitions, "wrong_partition"),
    ]


def write_garbage(bootstrap_servers: str, topic: str, bundles: Sequence[str]) -> Counter[str]:
    """Write :func:`garbage_messages` one by one (each delivered before the next, so they interleave
    with the racing writers) through a plain confluent-kafka producer, as "some other Kafka tool" would."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap_servers,
            "partitioner": "consistent",
            "client.id": "vandal",
            "log_level": 3,
        }
    )
    expected: Counter[str] = Counter()
    for key, value, partition, reason in garbage_messages(bundles):
        errors: list[object] = []
        done = threading.Event()

        def on_delivery(
            err: object, _msg: object, errors: list[object] = errors, done: threading.Event = done
        ) -> None:
            if err is not None:
                errors.append(err)
            done.set()

        if partition is None:
            producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
        else:
            producer.produce(topic, key=key, value=value, partition=partition, on_delivery=on_delivery)

        def delivered(done: threading.Event = done) -> bool:
            producer.poll(0.05)  # serves the delivery callback
            return done.is_set()

        wait_for(delivered, 15, message="garbage delivered")
        if errors:
            raise AssertionError(f"garbage write failed: {errors}")
        expected[reason] += 1
    producer.flush(10)
    return expected
