"""Poison values on every topic trimtab reads: a running cluster must skip them, count them and keep serving.

Why: one channel value with invalid UTF-8 inside a JSON string (keyed by a real bundle name) once made every
agent stop following the channel -- new lookups answered 503 while every node still reported ready.
docs/protocol.md section 2.2 says every value is hostile: a bad one is skipped, counted by reason
(``trimtab_channel_records_total{outcome="skipped",reason=...}``), logged with its partition and offset,
and never stops a node or splits the cluster, because whether a value is a record is a function of its
bytes alone. This module checks that end to end, with real processes (:class:`LocalCluster`: a real
ZooKeeper server, the librdkafka mock Kafka cluster, 3 agents and 2 controllers).

Every poison value targets a real bundle of a namespace in use with the version a valid next record would
carry, and the same value without its defect would be *accepted* (checked in-process below): a lax decoder
would change ownership, so "nothing changed" is a real observation, not a tautology. The expected skip
reason of every value is written down here from the protocol, not computed by the product's decoder.

One module-scoped cluster; the tests run in file order and build on each other (poison, then new lookups,
then agreement, then the other topics, then a kill -9 and a replacement agent). Synchronisation is by
waiting for conditions with deadlines only.

Kafka's limits shape the cases: a broker refuses a record over its ``message.max.bytes`` (1 MiB by
default), so the "huge" snapshot value is 0.9 MB -- what a hostile producer can really get into the topic --
not over the 32 MiB snapshot cap.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
from confluent_kafka import KafkaError, Message, Producer
from prometheus_client.parser import text_string_to_metric_families

from tests.support.records import to_record
from tests.support.timeline import check_single_owner
from tests.support.waiting import wait_for
from trimtab.channel.bundles import BundleLayout, parse_bundle, topic_hash
from trimtab.channel.kafka import KafkaTransport
from trimtab.channel.records import Record, Skip, State, decode
from trimtab.channel.resolve import ACCEPT, resolve
from trimtab.channel.snapshot import SNAPSHOT_PARTITION, read_all
from trimtab.config.loader import load_settings
from trimtab.config.settings import Settings
from trimtab.devkit.localcluster import LocalCluster, Node

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SETTINGS: dict[str, Any] = {
    "load": {"report_interval_s": 0.5, "report_max_interval_s": 5},
    "zookeeper": {"session_timeout_s": 3},
    # Nothing but this test and healing moves a bundle: "the poison changed nothing" is then exact.
    "shedding": {"enabled": False},
    "split": {"enabled": False},
    "channel": {"monitor_interval_s": 1, "snapshot_interval_s": 2, "in_flight_timeout_s": 5},
    "healing": {"safe_mode_settle_s": 3},
}
BUNDLES_PER_NS = 4  # namespace.default_bundles
OWNED_NS = "poison/ns-0"  # every bundle owned before the poison
MIXED_NS = "poison/ns-1"  # two bundles owned, two left in Init (and poisoned) for the new lookups
FRESH_NS = [f"poison/fresh-{i}" for i in range(5)]
WRITER = b'"poison-test"'


# ---------------------------------------------------------------------------------------------- helpers


def topic_in(bundle: str, stem: str = "probe") -> str:
    """A topic whose hash falls in ``bundle`` (so a lookup of it resolves exactly that bundle)."""
    ns, rng = parse_bundle(bundle)
    i = 0
    while not rng.contains(topic_hash(t := f"persistent://{ns}/{stem}-{i}")):
        i += 1
    return t


def bundles_of(namespace: str) -> list[str]:
    return BundleLayout.default(namespace, BUNDLES_PER_NS).bundles


def j(v: Any) -> bytes:
    return orjson.dumps(v)


def obj(fields: list[tuple[bytes, bytes]]) -> bytes:
    """A JSON object from raw (name, value) fragments: names may repeat, contain escapes or bad bytes."""
    return b"{" + b",".join(b'"' + k + b'":' + v for k, v in fields) + b"}"


def nested(depth: int, kind: str = "array") -> bytes:
    if kind == "array":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


def skip_counts(text: str) -> Counter[str]:
    out: Counter[str] = Counter()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "trimtab_channel_records_total" and s.labels.get("outcome") == "skipped":
                out[s.labels["reason"]] += int(s.value)
    return out


def sample(text: str, name: str) -> float:
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name)


def log_records(cluster: LocalCluster, node: str) -> list[dict[str, Any]]:
    """Every JSON log line of ``node`` (nodes log one JSON object a line)."""
    out = []
    for line in cluster.nodes[node].log.read_bytes().splitlines():
        try:
            e = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(e, dict):
            out.append(e)
    return out


def log_events(cluster: LocalCluster, node: str, event: str) -> list[dict[str, Any]]:
    return [e for e in log_records(cluster, node) if e.get("event") == event]


def errors_logged(cluster: LocalCluster, node: str) -> list[str]:
    """Error-level log lines of ``node``, abridged (evidence for failure messages)."""
    return [
        f"{e.get('event')} {str(e.get('error') or e.get('exception') or '')[-300:]}"
        for e in log_records(cluster, node)
        if e.get("level") in ("error", "critical")
    ]


def tails(cluster: LocalCluster, names: list[str] | None = None, lines: int = 15) -> str:
    names = names if names is not None else list(cluster.nodes)
    return "\n".join(f"--- {n} log tail ---\n{cluster.log_tail(n, lines)}" for n in names)


@dataclass(frozen=True)
class Target:
    """A real bundle and the next record a valid writer could publish for it (a lax reader's outcome)."""

    bundle: str
    current: Record | None
    dst: str  # a live broker the record hands the bundle to

    @property
    def version(self) -> int:
        return 1 if self.current is None else self.current.version + 1

    def fields(self, *, forced: bool = False) -> list[tuple[bytes, bytes]]:
        if self.current is None:  # Init -> Assigning{dst}
            state, src, force = "assigning", None, False
        elif forced:  # the leader's override: any -> Assigning{dst, src=owner}
            state, src, force = "assigning", self.current.dst, True
        else:  # Owned{A} -> Releasing{src=A, dst=B}: the start of a transfer
            state, src, force = "releasing", self.current.dst, False
        return [
            (b"schema", b"1"),
            (b"state", j(state)),
            (b"dst", j(self.dst)),
            (b"src", j(src)),
            (b"version", j(self.version)),
            (b"force", j(force)),
            (b"ts", j(int(time.time() * 1000))),
            (b"writer", WRITER),
        ]


@dataclass(frozen=True)
class Poison:
    what: str
    key: bytes | None
    value: bytes | None
    reason: str
    partition: int | None = None  # explicit (a wrong one); None: the consistent partitioner decides
    clean: bytes | None = None  # the value without its defect: what a lax reader would have applied
    target: Target | None = None


Fields = list[tuple[bytes, bytes]]


def with_field(name: bytes, value: bytes) -> Callable[[Fields], bytes]:
    return lambda f: obj([(k, value if k == name else v) for k, v in f])


def extra(name: bytes, value: bytes) -> Callable[[Fields], bytes]:
    return lambda f: obj([*f, (name, value)])


# (what, target kind, expected reason, the defective value from the valid record's fields). Target kinds:
# "owned" (Owned{A} v -> Releasing{A->B} v+1), "forced" (-> forced Assigning{A->B} v+1), "init" (Init ->
# Assigning{B} v1). Every defect breaks exactly one rule of docs/protocol.md 2.2, so the reason is fixed.
VALUE_CASES: list[tuple[str, str, str, Callable[[Fields], bytes]]] = [
    ("truncated UTF-8 in dst", "forced", "invalid_utf8", with_field(b"dst", b'"br\xc3"')),
    ("overlong '/' in writer", "owned", "invalid_utf8", with_field(b"writer", b'"w\xc0\xafx"')),
    ("encoded surrogate in writer", "init", "invalid_utf8", with_field(b"writer", b'"w\xed\xa0\x80"')),
    ("invalid UTF-8 in an unknown field's value", "owned", "invalid_utf8", extra(b"note", b'"\xff\xfe"')),
    ("invalid UTF-8 in an unknown field's name", "init", "invalid_utf8", extra(b"n\xffte", b"1")),
    ("raw binary junk", "owned", "invalid_utf8", lambda f: b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x01\xff"),
    ("a byte order mark before a valid record", "owned", "bom", lambda f: b"\xef\xbb\xbf" + obj(f)),
    ("lone high surrogate escape in writer", "owned", "lone_surrogate", with_field(b"writer", b'"w\\ud800"')),
    ("lone low surrogate escape in an unknown name", "init", "lone_surrogate", extra(b"\\udc00x", b"1")),
    ("ts = 10**30", "owned", "int_out_of_range", with_field(b"ts", str(10**30).encode())),
    ("ts = 2**63", "forced", "int_out_of_range", with_field(b"ts", str(2**63).encode())),
    ("-2**63-1 in an unknown field", "init", "int_out_of_range", extra(b"n", str(-(2**63) - 1).encode())),
    # A repeated name: the last occurrence counts (docs/protocol.md 2.2), here a number where a broker id
    # belongs. A decoder that kept the first would apply a valid record.
    ("dst twice, the last a number", "owned", "malformed", extra(b"dst", b"7")),
    ("dst twice, the last escaped (d\\u0073t) and a number", "init", "malformed", extra(b"d\\u0073t", b"7")),
    ("arrays nested 300 deep in an unknown field", "owned", "too_deep", extra(b"x", nested(300))),
    (
        "objects nested 5000 deep in an unknown field",
        "forced",
        "too_deep",
        extra(b"x", nested(5000, "object")),
    ),
    ("arrays nested 5000 deep in an unknown field", "init", "too_deep", extra(b"x", nested(5000))),
    ("a 70 000-byte value", "owned", "too_large", extra(b"pad", j("a" * 70_000))),
    ("a trailing comma", "init", "malformed", lambda f: obj(f)[:-1] + b",}"),
    ("schema 2", "owned", "future_schema", with_field(b"schema", b"2")),
    ("an unknown state", "init", "unknown_state", with_field(b"state", b'"stolen"')),
]


def channel_poison(owned: list[Target], init: list[Target], partitions: int) -> list[Poison]:
    """The channel batch: every case of docs/protocol.md 2.2 at least once, on real bundles."""
    owned_it, init_it = itertools.cycle(owned), itertools.cycle(init)
    out: list[Poison] = []
    t = next(init_it)
    out.append(
        Poison(
            "the reported value: invalid UTF-8 in dst, keyed by an Init bundle",
            t.bundle.encode(),
            b'{"schema":1,"state":"assigning","dst":"br\xc3","src":null,"version":1,"force":false,'
            b'"ts":1,"writer":"x"}',
            "invalid_utf8",
            clean=b'{"schema":1,"state":"assigning","dst":"br","src":null,"version":1,"force":false,'
            b'"ts":1,"writer":"x"}',
            target=t,
        )
    )
    for what, kind, reason, defect in VALUE_CASES:
        t = next(init_it if kind == "init" else owned_it)
        fields = t.fields(forced=kind == "forced")
        out.append(Poison(what, t.bundle.encode(), defect(fields), reason, clean=obj(fields), target=t))
    # Keys: a valid record under a key that is not a bundle's, or outside its key's partition.
    for what, key in [
        ("a null key", None),
        ("a non-UTF-8 key", owned[0].bundle.encode().replace(b"/0x", b"/\xff0x", 1)),
        ("a key that is not a bundle name", b"poison/ns-0/not-a-bundle"),
        ("a topic name as key", topic_in(owned[0].bundle).encode()),
    ]:
        t = next(owned_it)
        out.append(Poison(what, key, obj(t.fields()), "bad_key", clean=obj(t.fields()), target=t))
    for what, t, forced in [
        ("a valid transfer in the wrong partition", next(owned_it), False),
        ("a valid override in the wrong partition", next(owned_it), True),
        ("a valid assignment in the wrong partition", next(init_it), False),
    ]:
        value = obj(t.fields(forced=forced))
        home = zlib.crc32(t.bundle.encode()) % partitions
        out.append(
            Poison(what, t.bundle.encode(), value, "wrong_partition", (home + 1) % partitions, value, t)
        )
    return out


class ReadyWatch:
    """Polls every node's /readyz in the background and remembers every answer that was not 200."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.bad: list[tuple[float, str, str]] = []
        self.samples = 0
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="ready-watch", daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(0.25):
                for n in self.nodes:
                    try:
                        r = client.get(f"{n.http}/readyz")
                        status = f"{r.status_code} {r.text[:300]}"
                        ok = r.status_code == 200
                    except httpx.HTTPError as e:
                        status, ok = repr(e), False
                    self.samples += 1
                    if not ok:
                        self.bad.append((round(time.monotonic() - self._t0, 2), n.name, status))

    def start(self) -> ReadyWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@dataclass
class Poisoned:
    cluster: LocalCluster
    settings: Settings
    producer: Producer
    partitions: int
    before: dict[str, dict[str, Any]]
    owned: list[Target]
    init: list[Target]
    poison: list[Poison]
    baseline: dict[str, Counter[str]]
    health0: dict[str, tuple[float, float]]
    watch: ReadyWatch
    http: httpx.Client
    victim_name: str = "agent-3"
    new_bundles: list[str] = field(default_factory=list)
    consumed: bool | None = None

    @property
    def expected(self) -> Counter[str]:
        return Counter(p.reason for p in self.poison)

    def nodes(self) -> list[Node]:
        return [n for n in self.cluster.nodes.values() if n.alive()]

    def metrics(self, node: Node) -> str:
        r = self.http.get(f"{node.http}/metrics")
        r.raise_for_status()
        return r.text

    def skipped_since(self, node: Node) -> Counter[str]:
        now = skip_counts(self.metrics(node))
        now.subtract(self.baseline.get(node.name, Counter()))
        return +now

    def wait_consumed(self, timeout: float = 15.0) -> bool:
        """Barrier: every node has counted the whole batch, or the deadline passed (the tests report)."""
        if self.consumed is None:
            with contextlib.suppress(AssertionError):
                wait_for(
                    lambda: all(self.skipped_since(n) == self.expected for n in self.nodes()), timeout, 0.1
                )
            self.consumed = all(self.skipped_since(n) == self.expected for n in self.nodes())
        return self.consumed

    def views(self, nodes: list[Node] | None = None) -> dict[str, dict[str, dict[str, Any]]]:
        return {n.name: self.cluster.ownership(via=n) for n in (nodes or self.nodes())}

    def produce(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None
    ) -> Message:
        got: list[tuple[KafkaError | None, Message]] = []
        kw: dict[str, Any] = {"partition": partition} if partition is not None else {}
        self.producer.produce(topic, value=value, key=key, on_delivery=lambda e, m: got.append((e, m)), **kw)
        self.producer.flush(30)
        assert len(got) == 1 and got[0][0] is None, f"produce to {topic} failed: {got}"
        return got[0][1]


def lookup(http: httpx.Client, node: Node, topic: str) -> tuple[int, Any]:
    try:
        r = http.get(f"{node.http}/v1/lookup", params={"topic": topic}, timeout=30)
    except httpx.HTTPError as e:
        return 0, repr(e)
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text


def concurrent_lookups(http: httpx.Client, jobs: list[tuple[Node, str]]) -> list[tuple[Node, str, int, Any]]:
    with ThreadPoolExecutor(min(len(jobs), 32)) as pool:
        results = list(pool.map(lambda job: lookup(http, *job), jobs))
    return [(n, t, s, b) for (n, t), (s, b) in zip(jobs, results, strict=True)]


def agreed_table(p: Poisoned, nodes: list[Node] | None = None) -> dict[str, dict[str, Any]] | None:
    """The channel table if every given node (default: every live node) has the same one with nothing in
    flight, else None."""
    views = p.views(nodes)
    tables = list(views.values())
    if any(t != tables[0] for t in tables[1:]):
        return None
    if any(State(r["state"]).in_flight for r in tables[0].values()):
        return None
    return tables[0]


def describe_views(p: Poisoned, bundles: list[str] | None = None) -> str:
    views = p.views()
    keys = sorted(set().union(*views.values()))
    lines = []
    for b in keys if bundles is None else bundles:
        seen = {
            n: (v[b]["state"], v[b]["dst"], v[b]["version"]) if b in v else None for n, v in views.items()
        }
        if len(set(seen.values())) > 1 or bundles is not None:
            lines.append(f"{b}: {seen}")
    return "\n".join(lines) or "all views identical (something is in flight)"


def serving_matches(p: Poisoned, table: Mapping[str, Mapping[str, Any]]) -> str | None:
    """None if every live simulated broker serves exactly what the table says it owns; else why not."""
    problems = []
    serving_all: dict[str, str] = {}
    for n in p.cluster.agents:
        serving = set(p.cluster.get(n, "/v1/sim/state")["serving"])
        expected = {b for b, r in table.items() if r["state"] == "owned" and r["dst"] == n.broker}
        if serving != expected:
            problems.append(
                f"{n.name}: extra {sorted(serving - expected)}, missing {sorted(expected - serving)}"
            )
        for b in serving:
            if b in serving_all:
                problems.append(f"{b} served by {serving_all[b]} and {n.name}")
            serving_all[b] = n.name
    return "; ".join(problems) or None


# ---------------------------------------------------------------------------------------------- fixture


def own_some_bundles(cluster: LocalCluster, owned_bundles: list[str]) -> dict[str, dict[str, Any]]:
    """History: lookups through the agents in turn until every node's table agrees and shows each of
    ``owned_bundles`` owned; returns that table."""
    agents = list(cluster.agents)
    for k, b in enumerate(owned_bundles):
        wait_for(
            functools.partial(cluster.lookup, topic_in(b), via=agents[k % 3]),
            40,
            interval=0.2,
            message=functools.partial(lambda b: f"setup lookup in {b}\n{tails(cluster)}", b),
            ignore=(Exception,),
        )
    holder: dict[str, Any] = {}

    def settled() -> bool:
        views = [cluster.ownership(via=n) for n in cluster.nodes.values()]
        ok = all(v == views[0] for v in views) and all(
            views[0].get(b, {}).get("state") == "owned" for b in owned_bundles
        )
        holder["table"] = views[0]
        return ok

    wait_for(settled, 30, interval=0.1, message="every node has the same table, setup bundles owned")
    table: dict[str, dict[str, Any]] = holder["table"]
    return table


def check_the_premise(poison: list[Poison]) -> None:
    """The test's own premise: without its defect every value is a record that replay would accept."""
    for q in poison:
        assert q.clean is not None and q.target is not None, q.what
        rec = decode(q.clean)
        assert not isinstance(rec, Skip), f"{q.what}: clean twin skipped ({rec.reason})"
        verdict = resolve(parse_bundle(q.target.bundle)[1], q.target.current, rec)
        assert verdict is ACCEPT, f"{q.what}: clean twin would be {verdict}"


def health_baseline(
    http: httpx.Client, nodes: list[Node]
) -> tuple[dict[str, Counter[str]], dict[str, tuple[float, float]]]:
    """Each node's skip counts and (recoveries, history gaps) before the poison."""
    baseline: dict[str, Counter[str]] = {}
    health0: dict[str, tuple[float, float]] = {}
    for n in nodes:
        text = http.get(f"{n.http}/metrics").text
        baseline[n.name] = skip_counts(text)
        health0[n.name] = (
            sample(text, "trimtab_channel_recoveries_total"),
            sample(text, "trimtab_channel_history_gaps_total"),
        )
    return baseline, health0


def produce_poison(producer: Producer, topic: str, poison: list[Poison], partitions: int) -> None:
    """Every value, delivered; keyed ones without an explicit partition in their home partition."""
    delivered: list[tuple[Poison, KafkaError | None, int | None, int | None]] = []

    def on_delivery(q: Poison, e: KafkaError | None, m: Message) -> None:
        delivered.append((q, e, m.partition(), m.offset()))

    for q in poison:
        kw: dict[str, Any] = {"partition": q.partition} if q.partition is not None else {}
        producer.produce(topic, value=q.value, key=q.key, on_delivery=functools.partial(on_delivery, q), **kw)
    producer.flush(30)
    assert len(delivered) == len(poison) and all(e is None for _, e, _, _ in delivered), delivered
    for q, _, part, _ in delivered:
        if q.key is not None and q.partition is None:
            assert part == zlib.crc32(q.key) % partitions, (
                f"{q.what} landed in {part}: not the home partition"
            )


@pytest.fixture(scope="module")
def p(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Poisoned]:
    cluster = LocalCluster(tmp_path_factory.mktemp("poison"), brokers=3, controllers=2, settings=SETTINGS)
    cluster.start(timeout=120)
    http = httpx.Client(timeout=30, limits=httpx.Limits(max_connections=64, max_keepalive_connections=64))
    producer: Producer | None = None
    watch: ReadyWatch | None = None
    try:
        producer = Producer(
            {
                "bootstrap.servers": cluster.bootstrap_servers,
                "partitioner": "consistent",  # crc32(key) % partitions: every key in its home partition
                "message.max.bytes": 8 << 20,
                "linger.ms": 0,
                "log_level": 0,
            }
        )
        s = load_settings(cluster.config_path, environ=False)
        topic = s.kafka.channel_topic
        partitions = len(producer.list_topics(topic, timeout=10).topics[topic].partitions)
        brokers = [str(a.broker) for a in cluster.agents]

        # History: every bundle of one namespace and half of another owned, through lookups.
        owned_bundles = bundles_of(OWNED_NS) + bundles_of(MIXED_NS)[:2]
        init_bundles = bundles_of(MIXED_NS)[2:]
        before = own_some_bundles(cluster, owned_bundles)
        assert not any(b in before for b in init_bundles)

        def target(b: str, k: int) -> Target:
            cur = to_record(before[b]) if b in before else None
            others = [x for x in brokers if cur is None or x != cur.dst]
            return Target(b, cur, others[k % len(others)])

        owned = [target(b, k) for k, b in enumerate(owned_bundles)]
        init = [target(b, k) for k, b in enumerate(init_bundles)]
        poison = channel_poison(owned, init, partitions)
        check_the_premise(poison)

        nodes = list(cluster.nodes.values())
        baseline, health0 = health_baseline(http, nodes)
        watch = ReadyWatch(nodes).start()
        produce_poison(producer, topic, poison, partitions)
        yield Poisoned(
            cluster, s, producer, partitions, before, owned, init, poison, baseline, health0, watch, http
        )
    finally:
        if watch is not None:
            watch.stop()
        if producer is not None:
            producer.flush(5)
        http.close()
        cluster.stop()


# ---------------------------------------------------------------------------------------------- the channel


def test_every_node_skips_counts_and_logs_every_poison_value(p: Poisoned) -> None:
    nodes = p.nodes()
    consumed = p.wait_consumed()
    counts = {n.name: dict(sorted(p.skipped_since(n).items())) for n in nodes}
    expected = dict(sorted(p.expected.items()))
    assert consumed and all(c == expected for c in counts.values()), (
        "skip counts since the poison, by node:\n"
        + "\n".join(f"  {k}: {v}" for k, v in counts.items())
        + f"\nexpected on every node: {expected}\n{tails(p.cluster, lines=12)}"
    )
    # Logged with partition and offset (SkipLog logs the first five of each reason).
    for n in nodes:
        logged = log_events(p.cluster, n.name, "channel_record_skipped")
        reasons = {e.get("reason") for e in logged}
        assert set(expected) <= reasons, f"{n.name} logged reasons {sorted(map(str, reasons))}"
        assert all(e.get("partition") is not None and e.get("offset") is not None for e in logged), logged[:3]


def test_poison_changes_no_bundle_anywhere(p: Poisoned) -> None:
    p.wait_consumed()
    views = p.views()
    for name, view in views.items():
        changed = {
            b: (p.before.get(b), view.get(b))
            for b in set(p.before) | set(view)
            if p.before.get(b) != view.get(b)
        }
        assert not changed, f"{name}: the poison changed {changed}"


def test_twenty_new_lookups_succeed_through_every_agent(p: Poisoned) -> None:
    p.wait_consumed()
    agents = [p.cluster.node(f"agent-{i}") for i in (1, 2, 3)]
    fresh = [b for ns in FRESH_NS for b in bundles_of(ns)][:18]
    bundles = [t.bundle for t in p.init] + fresh  # 2 poisoned Init bundles + 18 of namespaces new to all
    p.new_bundles = bundles
    jobs = [(agents[k % 3], topic_in(b, "new")) for k, b in enumerate(bundles)]
    t0 = time.monotonic()
    results = concurrent_lookups(p.http, jobs)
    took = time.monotonic() - t0
    bad = [(n.name, t, s, b) for n, t, s, b in results if s != 200]
    assert not bad, (
        f"{len(bad)} of {len(results)} new lookups failed (in {took:.1f}s):\n"
        + "\n".join(f"  via {n}: {t} -> {s} {b}" for n, t, s, b in bad)
        + f"\n{tails(p.cluster, [a.name for a in agents], 12)}"
    )
    live = {str(a.broker) for a in agents}
    for (n, t, _, body), b in zip(results, bundles, strict=True):
        assert body["bundle"] == b and body["owner"] in live and body["state"] == "owned", (n.name, t, body)
        # Init -> Assigning v1 -> Owned v2: no poisoned Assigning v1 was taken for the bundle's first record.
        assert body["version"] == 2, (n.name, t, body)


def test_every_node_agrees_on_every_owner_and_no_bundle_has_two(p: Poisoned) -> None:
    table = wait_for(
        lambda: agreed_table(p), 20, interval=0.2, message=lambda: f"identical tables:\n{describe_views(p)}"
    )
    assert table is not None
    expected = set(p.before) | set(p.new_bundles)
    missing = sorted(b for b in expected if table.get(b, {}).get("state") != "owned")
    assert not missing, f"not owned: {missing}"
    # Lookups through every agent name the table's owner.
    agents = list(p.cluster.agents)
    jobs = [(a, topic_in(b)) for b in sorted(expected) for a in agents]
    wrong = [
        (n.name, t, s, body)
        for n, t, s, body in concurrent_lookups(p.http, jobs)
        if s != 200 or body["owner"] != table[body["bundle"]]["dst"]
    ]
    assert not wrong, f"lookups disagreeing with the table: {wrong[:10]}"
    wait_for(
        lambda: serving_matches(p, table) is None,
        15,
        interval=0.2,
        message=lambda: f"simulated brokers serve what they own: {serving_matches(p, table)}",
    )
    check_single_owner(p.cluster.timelines())


def test_every_node_stayed_ready_and_ready_means_following(p: Poisoned) -> None:
    p.watch.stop()
    assert p.watch.samples > 0
    assert not p.watch.bad, f"/readyz not 200 after the poison: {p.watch.bad[:10]}"
    # The reported bug: nodes said ready while their channel follower had stopped. A valid record produced
    # now must reach every node that says it is ready.
    marker = Target(bundles_of(FRESH_NS[4])[3], None, str(p.cluster.node("agent-1").broker))
    p.produce(p.settings.kafka.channel_topic, marker.bundle.encode(), obj(marker.fields()))
    p.new_bundles.append(marker.bundle)

    def behind() -> list[str]:
        return [
            n.name
            for n in p.nodes()
            if p.cluster.get(n, "/v1/bundles", bundle=marker.bundle)["record"] is None
        ]

    wait_for(
        lambda: not behind(),
        10,
        interval=0.1,
        message=lambda: (
            f"every node applies a valid record produced after the poison; not applied by {behind()} "
            f"(/readyz: { {n.name: p.http.get(f'{n.http}/readyz').status_code for n in p.nodes()} }); "
            f"errors logged: { {n.name: errors_logged(p.cluster, n.name)[-2:] for n in p.nodes()} }"
        ),
    )
    for n in p.nodes():
        r = p.http.get(f"{n.http}/readyz")
        assert r.status_code == 200, f"{n.name}: {r.status_code} {r.text}"
        text = p.metrics(n)
        recoveries = sample(text, "trimtab_channel_recoveries_total") - p.health0[n.name][0]
        gaps = sample(text, "trimtab_channel_history_gaps_total") - p.health0[n.name][1]
        assert (recoveries, gaps) == (0, 0), (
            f"{n.name}: the channel follower stopped ({recoveries} recoveries, {gaps} gaps)\n"
            f"{errors_logged(p.cluster, n.name)}"
        )
    assert all(n.alive() for n in p.cluster.nodes.values())


# ---------------------------------------------------------------------------------------------- other topics


def latest_values(p: Poisoned, topic: str) -> dict[bytes, bytes]:
    t = KafkaTransport(
        p.cluster.bootstrap_servers, client_id="test-poison-read", client_config={"log_level": 0}
    )
    try:
        return {m.key: m.value for m in read_all(t, topic) if m.key is not None and m.value is not None}
    finally:
        t.close()


def channel_highs(p: Poisoned) -> dict[str, int]:
    """The channel's high watermarks now: a snapshot with these positions would be used, not ignored."""
    t = KafkaTransport(
        p.cluster.bootstrap_servers, client_id="test-poison-hw", client_config={"log_level": 0}
    )
    try:
        topic = p.settings.kafka.channel_topic
        return {str(part): t.watermarks(topic, part)[1] for part in range(p.partitions)}
    finally:
        t.close()


def report_poison(latest: dict[bytes, bytes]) -> list[tuple[bytes | None, bytes, str]]:
    """(key, value, reason) for a load or top-bundles topic: real reports, each with one defect."""
    out: list[tuple[bytes | None, bytes, str]] = []
    for key, value in sorted(latest.items()):
        broker = key.decode()
        assert value.startswith(b"{") and value.endswith(b"}"), value[:100]
        body = value[:-1]
        out += [
            (key, value.replace(j(broker), b'"' + key + b'\xc3"', 1), "invalid_utf8"),
            (key, body + b',"note":"\xff"}', "invalid_utf8"),
            (key, body + b',"x":' + nested(5000) + b"}", "too_deep"),
            (key, b"\xef\xbb\xbf" + value, "bom"),
            (key, body + b',"broker":7}', "invalid"),  # a repeated name: the last (a number) counts
            (key, b"\x00\x01junk\xff\xfe", "invalid_utf8"),
        ]
    some = next(iter(latest.values()))
    # (A keyless record cannot reach a compacted topic: Kafka refuses it.)
    out += [(b"\xff\xfebroker", some, "bad_key")]
    return out


def kv_reasons(p: Poisoned, node: str, topic: str) -> set[str]:
    return {
        str(e.get("reason"))
        for e in log_events(p.cluster, node, "kv_value_skipped")
        if e.get("topic") == topic
    }


def test_poisoned_snapshot_and_report_topics_leave_every_node_serving(p: Poisoned) -> None:
    s = p.settings.kafka

    # The leader's first snapshot comes one interval after it took over: wait for a complete one.
    def snapshot_written() -> dict[bytes, bytes] | None:
        v = latest_values(p, s.snapshot_topic)
        return v if any(k.startswith(b"manifest/") for k in v) else None

    snap_before = wait_for(snapshot_written, 15, interval=0.2, message="the leader wrote a snapshot")
    assert snap_before is not None
    loads = latest_values(p, s.broker_load_topic)
    tops = latest_values(p, s.top_bundles_topic)
    assert loads and tops, "no load or top-bundles reports to start from"
    highs = channel_highs(p)

    # Snapshot topic (read from partition 0 only): garbage under the real keys, and complete-looking
    # snapshots of a "later term" whose only defect a lax reader would not see.
    ch = s.channel_topic
    manifests = [k for k in snap_before if k.startswith(b"manifest/")]
    chunks = [k for k in snap_before if k.startswith(b"chunk/")]
    assert manifests and chunks, f"no snapshot written yet: {sorted(snap_before)}"

    def manifest(term: int, chunks: int, bundles: int, *more: tuple[bytes, bytes]) -> bytes:
        return obj(
            [
                (b"schema", b"1"),
                (b"id", j(f"{term}-1-poison")),
                (b"chunks", j(chunks)),
                (b"bundles", j(bundles)),
                (b"channel", j(ch)),
                (b"partitions", j(p.partitions)),
                (b"positions", j(highs)),  # where the channel ends now: a lax reader would use it
                (b"ts", b"1"),
                (b"writer", j("poison")),
                (b"term", j(term)),
                *more,
            ]
        )

    bogus = (
        b'{"schema":1,"state":"owned","dst":"poison\xc3","src":null,"version":1,"force":false,"ts":1,'
        b'"writer":"x"}'
    )
    snapshot_poison: list[tuple[bytes | None, bytes]] = [
        *((k, b"garbage{{{") for k in manifests),
        (sorted(chunks)[-1], b'{"schema":1,"id":"x\xff","seq":0,"bundles":{}}'),
        # An empty table at the channel's end, only its unknown field is not UTF-8.
        (f"manifest/{ch}/99999999".encode(), manifest(99999999, 0, 0, (b"note", b'"\xff"'))),
        # A valid manifest whose one chunk names an owner that is not UTF-8.
        (f"manifest/{ch}/99999998".encode(), manifest(99999998, 1, 1)),
        (
            b"chunk/99999998-1-poison/0",
            b'{"schema":1,"id":"99999998-1-poison","seq":0,"bundles":{'
            + j(p.owned[0].bundle)
            + b":"
            + bogus
            + b"}}",
        ),
        (f"manifest/{ch}/99999997".encode(), manifest(99999997, 0, 0, (b"x", nested(5000, "object")))),
        (b"chunk/99999996-1-poison/0", b'{"schema":1,"pad":"' + b"a" * 900_000 + b'\xff"}'),
        # (A record without a key cannot be written to a compacted topic: Kafka refuses it.)
        (b"manifest/\xff\xfe", b"{}"),
    ]
    for key, value in snapshot_poison:
        p.produce(s.snapshot_topic, key, value, partition=SNAPSHOT_PARTITION)
    load_poison = report_poison(loads)
    top_poison = report_poison(tops)
    for key, value, _ in load_poison:
        p.produce(s.broker_load_topic, key, value)
    for key, value, _ in top_poison:
        p.produce(s.top_bundles_topic, key, value)

    # Logged by every reader: agents read broker load, controllers read both.
    want_load = {r for _, _, r in load_poison}
    want_top = {r for _, _, r in top_poison}

    def all_logged() -> bool:
        for n in p.nodes():
            if not want_load <= kv_reasons(p, n.name, s.broker_load_topic):
                return False
            if n.kind == "controller" and not want_top <= kv_reasons(p, n.name, s.top_bundles_topic):
                return False
        return True

    wait_for(
        all_logged,
        15,
        interval=0.2,
        message=lambda: (
            "every reader logs the report poison: "
            + str(
                {
                    n.name: (
                        sorted(kv_reasons(p, n.name, s.broker_load_topic)),
                        sorted(kv_reasons(p, n.name, s.top_bundles_topic)),
                    )
                    for n in p.nodes()
                }
            )
        ),
    )
    for n in p.nodes():
        r = p.http.get(f"{n.http}/readyz")
        assert r.status_code == 200, f"{n.name} after the report poison: {r.status_code} {r.text}"
        # No poisoned report replaced a broker's last good one ("broker":"idle" twice: msgspec keeps the last).
        for broker, view in p.cluster.get(n, "/v1/brokers")["brokers"].items():
            assert view["load"] is None or view["load"]["broker"] == broker, (n.name, broker, view["load"])
    # New assignments still work (they read the load view the poison went to).
    agents = list(p.cluster.agents)
    bundles = bundles_of("poison/after-reports")
    results = concurrent_lookups(p.http, [(agents[k % 3], topic_in(b)) for k, b in enumerate(bundles)])
    bad = [(n.name, t, st, b) for n, t, st, b in results if st != 200]
    assert not bad, f"lookups after the report poison: {bad}\n{tails(p.cluster, lines=10)}"
    p.new_bundles += bundles


def test_kill_9_and_a_replacement_agent_bootstraps_through_the_poison(p: Poisoned) -> None:
    c = p.cluster
    victim = c.node(p.victim_name)
    assert victim.alive() and victim.broker is not None
    dead_broker = victim.broker
    last_timeline = c.get(victim, "/v1/sim/state")["timeline"]
    c.kill(victim.name)
    victim.proc.wait(10)
    dead_at = time.monotonic_ns()

    def healed() -> dict[str, dict[str, Any]] | None:
        t = agreed_table(p)
        if t is None or any(r["dst"] == dead_broker and r["state"] == "owned" for r in t.values()):
            return None
        return t

    wait_for(healed, 25, interval=0.2, message=lambda: f"the victim's bundles healed:\n{describe_views(p)}")

    new = c.add_agent(name="replacement", wait=False)
    c.wait_node(new, 45)
    loaded = [str(e.get("snapshot")) for e in log_events(c, new.name, "snapshot_loaded")]
    assert not any(x.startswith("9999999") for x in loaded), (
        f"the replacement loaded a poisoned snapshot: {loaded}"
    )
    skipped = {
        e["event"]
        for e in (
            *log_events(c, new.name, "snapshot_manifest_skipped"),
            *log_events(c, new.name, "snapshot_chunk_skipped"),
        )
    }
    assert skipped == {"snapshot_manifest_skipped", "snapshot_chunk_skipped"}, (
        f"the replacement did not log the poisoned snapshot values ({skipped})\n{c.log_tail(new.name, 20)}"
    )
    # Whatever it counted, it counted nothing the batch did not contain.
    assert set(p.skipped_since(new)) <= set(p.expected), p.skipped_since(new)

    table = wait_for(
        lambda: agreed_table(p), 20, interval=0.2, message=lambda: f"identical tables:\n{describe_views(p)}"
    )
    assert table is not None
    expected = set(p.before) | set(p.new_bundles)
    assert all(table.get(b, {}).get("state") == "owned" for b in expected), describe_views(
        p, sorted(expected)
    )
    assert not any(r["dst"] == dead_broker for r in table.values() if r["state"] == "owned")

    # The replacement serves lookups of known bundles (agreeing with everyone) and assigns new ones.
    agents = list(c.agents)
    jobs = [(new, topic_in(b)) for b in sorted(expected)]
    jobs += [(agents[k % len(agents)], topic_in(b)) for k, b in enumerate(bundles_of("poison/after-kill"))]
    jobs += [(new, topic_in(b)) for b in bundles_of("poison/after-kill-2")]
    results = concurrent_lookups(p.http, jobs)
    bad = [(n.name, t, st, b) for n, t, st, b in results if st != 200]
    assert not bad, f"lookups after the replacement ({len(bad)} failed): {bad[:10]}\n{tails(c, lines=10)}"
    for n, t, _, body in results:
        if body["bundle"] in table:
            assert body["owner"] == table[body["bundle"]]["dst"], (n.name, t, body)
    final = wait_for(
        lambda: agreed_table(p), 20, interval=0.2, message=lambda: f"identical tables:\n{describe_views(p)}"
    )
    assert final is not None
    wait_for(
        lambda: serving_matches(p, final) is None,
        15,
        interval=0.2,
        message=lambda: f"simulated brokers serve what they own: {serving_matches(p, final)}",
    )
    timelines = {**c.timelines(), dead_broker: last_timeline}
    check_single_owner(timelines, ended_at={dead_broker: dead_at})
    for n in p.nodes():
        assert p.http.get(f"{n.http}/readyz").status_code == 200, n.name
