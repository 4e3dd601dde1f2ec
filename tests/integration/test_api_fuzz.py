"""Property-based fuzzing of every agent and controller endpoint from their OpenAPI specs (issue 10).

Schemathesis turns each operation of ``/openapi.json`` into a Hypothesis strategy, in both generation
modes: *positive* (requests the spec allows) and *negative* (requests it forbids: wrong types, missing
fields, malformed values). Every request goes over real HTTP to a real app, with a timeout:

* the controller: built by :func:`trimtab.controller.wiring.build_controller` with a real ZooKeeper and the
  in-memory channel, started piece by piece as tests/integration/test_controller_jobs.py does, leading,
  with brokers registered and owned bundles; its own uvicorn server runs on a loop in a thread;
* the agent: built by :func:`trimtab.agent.wiring.build` with the simulated adapter and run whole (as
  tests/integration/test_agent_inprocess.py does) on a loop in a thread.

What must hold for every generated request:

* no hang: an answer within :data:`REQUEST_TIMEOUT_S` (lookups wait at most
  ``channel.in_flight_timeout_s``, set to 1 s here);
* no 500: an internal error is always a bug;
* every other 4xx/5xx is exactly ``{"error": str, "retryable": bool}`` (cluster.http's one error shape);
  a 5xx is allowed only as a *retryable* 502/503 (the controller cannot reach an agent -- the registered
  brokers here are not running agents -- or a lookup could not settle in time).

What is not called for real: the agent's own ``POST /v1/admin/drain`` with ``dry_run`` false (it would
drain the agent under test for the rest of the run; there is no undrain) -- such a request is sent as a
dry run instead, so the route's validation is still fuzzed. The simulated broker's fault and load controls
(``/v1/sim/*``) are reset after every request, so an injected failure or latency does not leak into the
next one.

Budget: :data:`EXAMPLES` per operation and generation mode (``TRIMTAB_FUZZ_EXAMPLES`` overrides it);
Hypothesis is derandomized (the same requests every run) unless ``TRIMTAB_FUZZ_RANDOM=1``.

Known findings (a product bug the fuzzer hit) are listed in :data:`KNOWN`: that one case is marked
``xfail(strict=True)``, so the suite stays green while the bug is open and turns red when it is fixed.

The last tests feed Hypothesis-generated hostile bytes to the latest-value views of the load topics
(:class:`trimtab.cluster.kvview.KeyValueView` of ``BrokerLoadData`` and ``TopBundles``): every value is
applied or skipped with a counted reason; nothing ever raises or restarts the view.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import msgspec
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from kazoo.client import KazooClient
from pydantic import ValidationError
from schemathesis.generation import GenerationMode

from tests.integration.test_agent_inprocess import (
    PEER,
    agent_settings,
    register_peer,
    running_agent,
)
from tests.integration.test_controller_jobs import Node, bundle, own
from tests.support.memory_log import memory_log
from tests.support.settings import NO_AUTH_SETS
from tests.support.waiting import wait_for
from trimtab.agent.api import DrainRequest, SimControls
from trimtab.agent.api import create_app as agent_app
from trimtab.agent.wiring import WiredAgent
from trimtab.balance.assign import BrokerInfo
from trimtab.balance.load import BrokerLoadData, BundleStats, TopBundles, Usage
from trimtab.channel.memory import MemoryLog, MemoryTransport
from trimtab.cluster.kvview import KeyValueView
from trimtab.cluster.zk import ZkPaths
from trimtab.config.loader import load_settings, parse_assignments
from trimtab.config.settings import Settings
from trimtab.controller.api import create_app as controller_app
from trimtab.devkit.zkserver import ZooKeeperServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLES = int(os.environ.get("TRIMTAB_FUZZ_EXAMPLES", "20"))
REQUEST_TIMEOUT_S = 10.0
RETRYABLE_5XX = {502, 503}
PROBES = {"/healthz": "ok", "/readyz": "ready"}  # their 503 is the probe's answer, not an error body

# (app, operation label) -> why it is expected to fail: a product bug the fuzzer found, still open.
KNOWN: dict[tuple[str, str], str] = {}


# ---------------------------------------------------------------------------------------------- the specs

# The specs, rendered at collection time from apps built without collaborators (both APIs allow it), so
# every operation is its own test; each test checks the live app serves the same spec.
SPECS: dict[str, dict[str, Any]] = {
    "agent": agent_app(None, SimControls(None, lambda: None)).openapi(),  # type: ignore[arg-type]
    "controller": controller_app(None).openapi(),  # type: ignore[arg-type]
}


def _schema(app: str) -> Any:
    return schemathesis.openapi.from_dict(json.loads(json.dumps(SPECS[app])))


def _labels(app: str) -> list[str]:
    return sorted(op.ok().label for op in _schema(app).get_all_operations())


def _can_be_invalid(app: str, label: str) -> bool:
    """Whether the operation takes any input a negative case could break (parameters or a body)."""
    method, path = label.split(" ", 1)
    op = SPECS[app]["paths"][path][method.lower()]
    return bool(op.get("parameters") or op.get("requestBody"))


def _params(app: str) -> list[Any]:
    out = []
    for label in _labels(app):
        modes = list(GenerationMode) if _can_be_invalid(app, label) else [GenerationMode.POSITIVE]
        for mode in modes:
            marks = []
            if (app, label) in KNOWN:
                marks.append(pytest.mark.xfail(strict=True, reason=KNOWN[app, label]))
            out.append(pytest.param(label, mode, marks=marks, id=f"{mode.value}:{label}"))
    return out


# ---------------------------------------------------------------------------------------------- realistic values

# Random strings almost never name a real bundle, topic or broker: half the time a field with one of
# these names gets a value that reaches past validation into the real code (or a near miss).
_OWNED = [f"acme/jobs/0x{i * 0x1000:08x}_0x{(i + 1) * 0x1000:08x}" for i in range(8)]
REALISTIC: dict[str, st.SearchStrategy[Any]] = {
    "bundle": st.sampled_from(
        [*_OWNED, "acme/jobs/0x00000000_0xffffffff", "acme/orders/0x00000000_0x40000000", "acme/jobs/0x1_0x0"]
    ),
    "topic": st.integers(0, 50).flatmap(
        lambda i: st.sampled_from(
            [
                f"persistent://acme/orders/t{i}",
                f"persistent://acme/jobs/t{i}",
                f"non-persistent://x/y/{i}",
                "x",
            ]
        )
    ),
    "broker": st.sampled_from(["b1:1", "b2:1", "b3:1", "peer-b:1", "nobody:1", ""]),
    "name": st.sampled_from(["rack-1", "zone_a", "brokers", "a" * 200, "bad/name", "p.1"]),
    "group": st.sampled_from(["g1", "G1", "", " ", "x" * 200]),
    "tenant": st.sampled_from(["acme", "public", "a b"]),
    "namespace": st.sampled_from(["jobs", "orders", "default"]),
    "namespaces": st.lists(st.sampled_from(["acme/.*", "acme/jobs", "(a+)+$", "[", ".*", ""]), max_size=3),
    "primary": st.lists(st.sampled_from(["b1", "b.*", "(", ".*", "127\\.0\\.0\\.1"]), max_size=3),
    "secondary": st.lists(st.sampled_from(["b2", ".*", ")"]), max_size=2),
    "brokers": st.lists(st.sampled_from(["b1:1", "b2:1", "b3:1", "nobody:1"]), max_size=4),
    "boundaries": st.lists(
        st.sampled_from(["0x00000800", "0x00001000", "0x0", "zz", "0xffffffffff"]), max_size=3
    ),
    "algorithm": st.sampled_from(
        ["range_equally_divide", "topic_count_equally_divide", "specified_positions_divide", "nope"]
    ),
    "unload_scope": st.sampled_from(["changed", "all_matching", "none", "some"]),
}


def realistic(case: Any, data: st.DataObject) -> None:
    for container in (case.path_parameters, case.query, case.body):
        if not isinstance(container, dict):
            continue
        for key in list(container):
            if key in REALISTIC and data.draw(st.booleans(), label=f"realistic {key}"):
                container[key] = data.draw(REALISTIC[key], label=key)


# ---------------------------------------------------------------------------------------------- checks


def check_answer(case: Any, response: requests.Response) -> None:
    """The API's promises for one answer: no 500, one error shape, 5xx only as a retryable 502/503."""
    status = response.status_code
    where = (
        f"{case.method} {case.formatted_path} -> {status}\n{case.as_curl_command()}\n{response.text[:500]}"
    )
    assert status != 500, f"internal error: {where}"
    if status < 400:
        return
    if case.path in PROBES and status == 503:
        # A probe's "no": its own body (Kubernetes reads the status), not a refusal of the request.
        assert PROBES[case.path] in response.json(), f"not the probe's answer: {where}"
        return
    try:
        body = response.json()
    except ValueError:
        raise AssertionError(f"an error without a JSON body: {where}") from None
    assert isinstance(body, dict) and set(body) == {"error", "retryable"}, f"not the error shape: {where}"
    assert isinstance(body["error"], str) and body["error"], f"'error' is not a message: {where}"
    assert isinstance(body["retryable"], bool), f"'retryable' is not a bool: {where}"
    if status >= 500:
        assert status in RETRYABLE_5XX and body["retryable"], f"a server error: {where}"


def fuzz(
    app: str,
    label: str,
    mode: GenerationMode,
    base_url: str,
    *,
    adjust: Callable[[Any], None] = lambda case: None,
    after: Callable[[], None] = lambda: None,
) -> int:
    """Run ``EXAMPLES`` generated requests of one operation against ``base_url``; returns how many ran."""
    live = requests.get(f"{base_url}/openapi.json", timeout=REQUEST_TIMEOUT_S).json()
    assert live == SPECS[app], "the live app serves another spec than the one fuzzed"
    op = _schema(app).find_operation_by_label(label)
    assert op is not None, label
    calls = 0

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=os.environ.get("TRIMTAB_FUZZ_RANDOM") != "1",
        phases=[Phase.explicit, Phase.generate],  # no shrinking: the failing request is printed as is
        suppress_health_check=list(HealthCheck),
    )
    @given(case=op.as_strategy(generation_mode=mode), data=st.data())
    def one(case: Any, data: st.DataObject) -> None:
        nonlocal calls
        realistic(case, data)
        adjust(case)
        t0 = time.monotonic()
        try:
            response = case.call(base_url=base_url, timeout=REQUEST_TIMEOUT_S, allow_redirects=False)
        except requests.Timeout:
            raise AssertionError(
                f"no answer within {REQUEST_TIMEOUT_S}s: {case.method} {case.formatted_path}\n"
                f"{case.as_curl_command()}"
            ) from None
        finally:
            after()
        calls += 1
        if os.environ.get("TRIMTAB_FUZZ_TRACE"):
            print(
                f"{mode.value} {case.method} {case.formatted_path} {case.query} {str(case.body)[:80]} -> {response.status_code} {response.text[:100]}"
            )
        assert time.monotonic() - t0 < REQUEST_TIMEOUT_S
        check_answer(case, response)

    try:
        one()
    except Unsatisfiable:
        if mode is GenerationMode.NEGATIVE and calls == 0:
            pytest.skip(
                "the spec leaves nothing to make invalid here (e.g. one free-form string path parameter)"
            )
        raise
    return calls


# ---------------------------------------------------------------------------------------------- a loop in a thread


class LoopThread:
    """An event loop on its own thread (the HTTP servers run there; requests come from the test thread)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzz-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def submit(self, coro: Any) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def chroot_hosts(zk_server: ZooKeeperServer) -> Iterator[str]:
    """A fresh chroot for this module (the conftest's is per test; the apps here live for the module)."""
    chroot = f"/fuzz-{uuid.uuid4().hex[:12]}"
    root = KazooClient(hosts=zk_server.hosts, timeout=10)
    root.start(timeout=15)
    try:
        root.ensure_path(chroot + "/controller")
        root.ensure_path(chroot + "/agent")
    finally:
        root.stop()
        root.close()
    yield f"{zk_server.hosts}{chroot}"


def closed_port() -> int:
    """A local port nobody listens on: a forward to it is refused at once (a retryable 502)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------- the controller


@pytest.fixture(scope="module")
def controller(chroot_hosts: str) -> Iterator[str]:
    """A leading controller with three brokers registered and eight owned bundles; its base URL."""
    hosts = chroot_hosts + "/controller"
    sets = [
        f"zookeeper.hosts={hosts}",
        "zookeeper.session_timeout_s=6",
        "http.host=127.0.0.1",
        "http.port=0",
        "healing.safe_mode_settle_s=0",
        "healing.grace_s=0",
        "channel.in_flight_timeout_s=1.5",  # the least start-up accepts with this margin (fast stuck states)
        "broker.adapter.lease_margin_s=0.5",
        *NO_AUTH_SETS,  # the fuzzer explores the API's inputs; tokens are test_security.py's
    ]
    s: Settings = load_settings(None, parse_assignments(sets), environ=False)
    log = memory_log(s)
    node = Node(s, log).start()
    zk = KazooClient(hosts=hosts, timeout=10)
    zk.start(timeout=15)
    loop = LoopThread()
    try:
        wait_for(lambda: node.ctl.leadership.is_leader, message="the controller leads")
        wait_for(lambda: node.ctl.leadership.safe_mode() is None, message="out of safe mode")
        paths = ZkPaths(s.zk_path)
        port = closed_port()
        brokers = ["b1:1", "b2:1", "b3:1"]
        for b in brokers:
            info = BrokerInfo(id=b, service_url=f"pulsar://{b}", http_url=f"http://127.0.0.1:{port}")
            zk.create(paths.broker(b), msgspec.json.encode(info), ephemeral=True, makepath=True)
        wait_for(lambda: len(node.ctl.registry.brokers) == 3, message="the registry sees the brokers")
        own(node, {bundle(i): brokers[i % 3] for i in range(8)})

        async def serve() -> None:
            node.ctl.http.start()

        loop.run(serve())
        base = f"http://127.0.0.1:{node.ctl.http.port}"
        wait_for(lambda: _answers(base), message="the controller's HTTP server answers")
        yield base
        loop.run(node.ctl.http.stop())
    finally:
        loop.close()
        zk.stop()
        zk.close()
        node.stop()


def _answers(base: str) -> bool:
    with contextlib.suppress(requests.RequestException):
        return requests.get(f"{base}/healthz", timeout=1).status_code == 200
    return False


@pytest.mark.parametrize(("label", "mode"), _params("controller"))
def test_controller_endpoint(controller: str, label: str, mode: GenerationMode) -> None:
    assert fuzz("controller", label, mode, controller) >= 1


# ---------------------------------------------------------------------------------------------- the agent


class AgentRun:
    def __init__(self, w: WiredAgent, base: str) -> None:
        self.w = w
        self.base = base

    def reset_sim(self) -> None:
        """Undo what a fuzzed ``/v1/sim/*`` call changed (injected failures, latency, load)."""
        sim = self.w.sim
        assert sim is not None
        with sim._lock:
            sim._fail_next.clear()
        sim.extra_latency_s = 0.0
        sim.model.scale = 1.0
        sim.model.namespace_scale.clear()


@pytest.fixture(scope="module")
def agent(chroot_hosts: str) -> Iterator[AgentRun]:
    """An agent (simulated broker) running on a loop in a thread, with a peer registered."""
    s = agent_settings(
        chroot_hosts + "/agent",
        # The least in-flight timeout start-up accepts with this margin: lookups that cannot settle fail fast.
        channel={"in_flight_timeout_s": 1.5},
        broker={"adapter": {"lease_margin_s": 0.5}},
        http={"host": "127.0.0.1", "port": 0},
    )
    log = memory_log(s)
    loop = LoopThread()
    zk = KazooClient(hosts=chroot_hosts + "/agent", timeout=10)
    zk.start(timeout=15)
    started: Future[WiredAgent] = Future()
    stop = asyncio.Event()

    async def lifetime() -> None:
        try:
            async with running_agent(s, log) as w:
                started.set_result(w)
                await stop.wait()
        except BaseException as e:
            if not started.done():
                started.set_exception(e)
            raise

    done = loop.submit(lifetime())
    try:
        w = started.result(60)
        register_peer(zk, s)
        wait_for(lambda: PEER in w.registry.brokers, message="the agent sees its peer")
        base = f"http://127.0.0.1:{w.http.port}"
        wait_for(lambda: _answers(base), message="the agent's HTTP server answers")
        yield AgentRun(w, base)
    finally:
        loop.loop.call_soon_threadsafe(stop.set)
        with contextlib.suppress(Exception):
            done.result(60)
        loop.close()
        zk.stop()
        zk.close()


def _drain_as_dry_run(case: Any) -> None:
    """A valid drain request that would really drain the agent under test is sent as a dry run."""
    if not isinstance(case.body, dict):
        return
    try:
        req = DrainRequest.model_validate(case.body)
    except ValidationError:
        return  # a refusal: sent as generated
    if not req.dry_run:
        case.body = {**case.body, "dry_run": True}


@pytest.mark.parametrize(("label", "mode"), _params("agent"))
def test_agent_endpoint(agent: AgentRun, label: str, mode: GenerationMode) -> None:
    adjust = _drain_as_dry_run if label == "POST /v1/admin/drain" else (lambda case: None)
    after = agent.reset_sim if label.startswith("POST /v1/sim/") else (lambda: None)
    assert fuzz("agent", label, mode, agent.base, adjust=adjust, after=after) >= 1
    assert not agent.w.agent.draining, "the fuzzing drained the agent under test"


# ---------------------------------------------------------------------------------------------- load-topic values

# Hostile values: random bytes; JSON of any shape; reports with a field replaced by a hostile value;
# valid reports (which must be applied); tombstones.
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats()
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_usage = st.builds(Usage, st.floats(0, 1e12), st.floats(0, 1e12))
_load = st.builds(BrokerLoadData, broker=st.text(max_size=20), cpu=_usage, bundles=st.integers(0, 10**6))
_stats = st.builds(BundleStats, bundle=st.text(max_size=30), topics=st.integers(0, 10**6))
_top = st.builds(TopBundles, broker=st.text(max_size=20), bundles=st.lists(_stats, max_size=3))


def _mutated(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    def build(args: tuple[Any, str, Any]) -> bytes:
        obj, field, junk = args
        d = msgspec.to_builtins(obj)
        d[field] = junk
        return json.dumps(d, allow_nan=True).encode()

    fields = st.sampled_from(["schema", "broker", "cpu", "bundles", "reported_at", "extra", "bundles"])
    return st.tuples(valid, fields, _json).map(build)


def _values(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes | None]:
    return st.one_of(
        st.none(),
        st.binary(max_size=200),
        _json.map(lambda v: json.dumps(v, allow_nan=True).encode()),
        valid.map(msgspec.json.encode),
        _mutated(valid),
        valid.map(msgspec.json.encode).flatmap(
            lambda b: st.tuples(st.integers(0, len(b)), st.binary(max_size=4)).map(
                lambda cut: b[: cut[0]] + cut[1] + b[cut[0] + 1 :]
            )
        ),
        st.sampled_from([b"\xef\xbb\xbf{}", b"[" * 5000, b'{"broker":"\\ud800"}', b"x" * 3000]),
    )


_keys = st.one_of(st.none(), st.binary(max_size=10), st.text(max_size=10).map(str.encode))


@pytest.mark.parametrize(("value_type", "valid"), [(BrokerLoadData, _load), (TopBundles, _top)])
def test_load_topic_values_are_applied_or_skipped_by_reason(value_type: type, valid: Any) -> None:
    log = MemoryLog(default_partitions=1)
    view: KeyValueView[Any] = KeyValueView(MemoryTransport(log), "loads", value_type, max_bytes=2000)
    applied: list[str] = []
    view.add_listener(lambda key, _value: applied.append(key))
    view.start()
    wait_for(lambda: view.ready, message="the view catches up")
    first = view.follower
    batches = 0

    @settings(
        max_examples=max(EXAMPLES * 2, 1),
        deadline=None,
        database=None,
        derandomize=os.environ.get("TRIMTAB_FUZZ_RANDOM") != "1",
        suppress_health_check=list(HealthCheck),
    )
    @given(records=st.lists(st.tuples(_keys, _values(valid)), min_size=1, max_size=20), good=valid)
    def batch(records: list[tuple[bytes | None, bytes | None]], good: Any) -> None:
        nonlocal batches
        batches += 1
        before_applied, before_skipped = len(applied), sum(view.skipped.values())
        for key, value in records:
            log.append("loads", key, value)
        mark = f"sentinel-{batches}"
        log.append("loads", mark.encode(), msgspec.json.encode(good))  # a valid value: applied
        wait_for(lambda: mark in view.values, timeout=10, message="the view reads the batch")
        new_applied = len(applied) - before_applied
        new_skipped = sum(view.skipped.values()) - before_skipped
        assert new_applied + new_skipped == len(records) + 1, (records, dict(view.skipped))
        assert view.follower is first and view.gaps == 0, "the view restarted: a value raised"

    try:
        batch()
    finally:
        view.stop()
    assert all(isinstance(r, str) and r for r in view.skipped), dict(view.skipped)  # every skip has a reason
