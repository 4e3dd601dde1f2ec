"""Node-level bug classes from Apache Pulsar's load manager issue tracker, each pinned as a rule trimtab
keeps (issue 31; docs/reliability.md lists them with what trimtab does instead):

* a node that keeps running with a failed component and answers every lookup with an error
  (apache/pulsar#23297): a trimtab agent whose component fails is either recovered (the channel follower
  is restarted), not ready meanwhile (its ``/readyz`` and its lookups say why, retryably), or -- when it
  cannot start at all -- gone (the process exits 1); a background job that keeps failing is counted and
  run again and touches neither readiness nor lookups;
* a shutdown that gives up leadership too late (apache/pulsar#20315): a stopping controller resigns (its
  leader node deleted) before the slow parts of its shutdown, so another controller leads within moments,
  not after a session timeout.

Real components, as the neighbouring tests use them: a real ZooKeeper server; the session's real Apache
Kafka for the agents (tests/conftest.py), the in-memory channel for in-process controllers (as
tests/integration/test_controller_jobs.py), a local cluster's own Kafka for ``trimtab`` processes
(tests/integration/test_controller.py's ``Harness``); daemons built by their own wiring and run by their own
lifecycle, in a thread of this process where a test reaches inside. Synchronisation is by waiting for
conditions with deadlines (tests.support.waiting.wait_for).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

import httpx
import msgspec
import pytest
from kazoo.client import KazooClient
from prometheus_client import CollectorRegistry

from tests.integration.test_controller import FAST, Harness, merge
from tests.support.kafka import KafkaEnv
from tests.support.memory_log import memory_log
from tests.support.procs import Procs
from tests.support.settings import AUTO_CREATE, NO_AUTH, NO_AUTH_SETS
from tests.support.waiting import wait_for
from trimtab.agent import wiring as agent_wiring
from trimtab.agent.wiring import WiredAgent
from trimtab.balance.assign import BrokerInfo
from trimtab.channel.memory import MemoryTransport
from trimtab.channel.records import Record, State, encode, make
from trimtab.cluster.zk import ZkPaths
from trimtab.config.loader import load_settings, parse_assignments
from trimtab.config.merge import deep_merge
from trimtab.config.settings import Settings
from trimtab.controller.daemon import Controller
from trimtab.controller.wiring import build_controller
from trimtab.devkit.zkserver import free_port

pytestmark = pytest.mark.integration

D = TypeVar("D")


class InThread(Generic[D]):
    """A daemon built by ``build`` and run by ``run`` on an event loop of its own thread, as its process
    would run it (signal handlers cannot be installed off the main thread: :meth:`stop` does what SIGTERM
    does, on that loop)."""

    def __init__(
        self, build: Callable[[], D], run: Callable[[D], Awaitable[int]], stop: Callable[[D], None]
    ) -> None:
        self._build, self._run, self._stop = build, run, stop
        self.daemon: D | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.code: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="daemon", daemon=True)

    def _main(self) -> None:
        async def main() -> int:
            self.loop = asyncio.get_running_loop()
            self.daemon = self._build()  # on the loop: the agent's wiring needs the running loop
            return await self._run(self.daemon)

        try:
            self.code = asyncio.run(main())
        except BaseException as e:
            self.error = e

    def start(self) -> InThread[D]:
        self.thread.start()
        wait_for(lambda: self.daemon is not None or self.error is not None, message="the daemon is built")
        if self.error is not None:
            raise self.error
        return self

    @property
    def it(self) -> D:
        assert self.daemon is not None
        return self.daemon

    @property
    def running(self) -> bool:
        return self.thread.is_alive()

    def stop(self) -> None:
        if self.loop is not None and self.running:
            self.loop.call_soon_threadsafe(self._stop, self.it)

    def join(self, timeout: float = 30.0) -> int | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the daemon did not stop"
        if self.error is not None:
            raise self.error
        return self.code


# ================================================================================================ #23297

NS = "acme/orders"


def topic(i: int) -> str:
    return f"persistent://{NS}/t{i}"


def agent_settings(zk_hosts: str, kafka: KafkaEnv) -> Settings:
    """One agent beside its simulated broker, on this test's topics of the real Kafka."""
    tree: dict[str, Any] = {
        "zookeeper": {"hosts": zk_hosts, "session_timeout_s": 4.0},
        "kafka": {
            "bootstrap_servers": kafka.bootstrap_servers,
            "channel_topic": kafka.channel_topic,
            "snapshot_topic": kafka.snapshot_topic,
            "broker_load_topic": kafka.topic("load"),
            "top_bundles_topic": kafka.topic("top"),
            "events_topic": kafka.topic("events"),
            "standby_topic": kafka.topic("standby"),
        },
        "http": {"host": "127.0.0.1", "port": 0},
        "broker": {"adapter": {"kind": "simulated", "retries": 0}},
        "namespace": {"default_bundles": 4, **AUTO_CREATE["namespace"]},
        "load": {"report_interval_s": 0.2},
        "split": {"enabled": False},
        **NO_AUTH,
    }
    return Settings.model_validate(deep_merge({}, tree))


@contextlib.contextmanager
def running_agent(s: Settings, kafka: KafkaEnv) -> Iterator[WiredAgent]:
    """An agent built by its wiring and run by its lifecycle until it is ready; stopped at the end (a
    second stop: no drain to wait for)."""
    transport = kafka.new_transport(client_id="test-agent")
    agent = InThread(
        lambda: agent_wiring.build(s, transport=transport),
        lambda w: w.run(),
        lambda w: w.agent.stop(),
    ).start()
    try:
        wait_for(
            lambda: agent.it.agent.ready or not agent.running,
            60,
            message=lambda: f"the agent to be ready (error: {agent.error!r})",
        )
        assert agent.running, agent.error
        yield agent.it
    finally:
        agent.stop()
        agent.stop()
        agent.join(60)


def get(w: WiredAgent, path: str, **params: str) -> httpx.Response:
    return httpx.get(f"{w.identity.http_url}{path}", params=params, timeout=10)


def looked_up(w: WiredAgent, t: str) -> dict[str, Any]:
    """A lookup that answers (a fresh agent may answer 503 while its first load report is on its way)."""
    r = wait_for(
        lambda: (r := get(w, "/v1/lookup", topic=t)).status_code == 200 and r, 30, message=f"lookup {t}"
    )
    return dict(r.json())


def job_failures(w: WiredAgent, task: str) -> float:
    return w.prom.get_sample_value("trimtab_job_failures_total", {"task": task}) or 0.0


def test_an_agent_whose_channel_follower_dies_is_not_ready_until_it_is_restarted_apache_pulsar_23297(
    zk_hosts: str, kafka: KafkaEnv
) -> None:
    """apache/pulsar#23297: a broker kept running with a failed load manager, in service, and every lookup
    sent to it failed. In trimtab an agent whose channel follower stops (here: a bug in a component on the
    follower's thread) is not ready from that moment -- ``/readyz`` answers 503 with the reason, so
    Kubernetes takes it out of service, and a lookup that still reaches it gets a retryable 503 naming the
    reason, never an answer from a table being rebuilt -- while its liveness holds (nothing to restart);
    the follower is restarted from the newest snapshot and the agent is ready again, answering lookups as
    before."""
    with running_agent(agent_settings(zk_hosts, kafka), kafka) as w:
        before = looked_up(w, topic(0))
        assert before["owner"] == w.identity.id
        boom = threading.Event()
        poison = "acme/poison/0x00000000_0xffffffff"

        def bug(key: str, old: Record | None, new: Record | None) -> None:
            if key == poison and not boom.is_set():
                boom.set()
                raise RuntimeError("a bug on the follower's thread")

        w.channel.table.add_listener(bug)
        rec = make(State.ASSIGNING, dst="peer:1", version=1, ts=int(time.time() * 1000), writer="peer:1")
        kafka.transport.produce(kafka.channel_topic, poison.encode(), encode(rec)).result(10)

        ready = wait_for(
            lambda: boom.is_set() and (r := get(w, "/readyz")).status_code == 503 and r.json(),
            20,
            interval=0.01,
            message="the agent reports not ready once its follower stopped",
        )
        assert ready["ready"] is False and "a bug on the follower's thread" in ready["channel"], ready
        refused = get(w, "/v1/lookup", topic=topic(0))
        assert refused.status_code == 503, refused.text
        assert refused.json()["retryable"] is True and "channel view is not ready" in refused.json()["error"]
        assert get(w, "/healthz").status_code == 200  # alive: not ready, not wedged

        wait_for(
            lambda: get(w, "/readyz").status_code == 200,
            60,
            message=lambda: f"the follower restarted and the agent ready again: {w.channel.health()}",
        )
        assert w.channel.recoveries >= 1
        after = looked_up(w, topic(0))
        assert after["how"] == "owned"  # answered from the rebuilt table, as before the failure
        assert {k: after[k] for k in ("bundle", "owner", "version")} == {
            k: before[k] for k in ("bundle", "owner", "version")
        }


def test_a_background_job_that_keeps_failing_is_run_again_and_lookups_still_answer_apache_pulsar_23297(
    zk_hosts: str, kafka: KafkaEnv
) -> None:
    """apache/pulsar#23297: a component failed and the broker went on as if nothing had, failing its
    lookups. In trimtab every background job runs through one runner: a job that raises is logged
    (``job_failed``), counted in ``trimtab_job_failures_total{task}`` (an alert's series) and run again at
    its next turn -- and since no background job stands on the lookup path, the agent stays ready *and*
    its lookups keep answering, for bundles it owns and for new ones it assigns."""
    with running_agent(agent_settings(zk_hosts, kafka), kafka) as w:
        looked_up(w, topic(0))

        async def broken() -> None:
            raise RuntimeError("the load reporter is broken")

        w.reporter.report_once = broken  # type: ignore[method-assign]
        wait_for(
            lambda: job_failures(w, "load_report") >= 3,
            30,
            message="the failing job is counted and run again",
        )
        assert get(w, "/readyz").status_code == 200
        assert get(w, "/healthz").status_code == 200
        for i in range(4):  # one topic in each bundle of the namespace: owned ones and new ones
            got = get(w, "/v1/lookup", topic=topic(100 + i))
            assert got.status_code == 200 and got.json()["owner"] == w.identity.id, got.text
        assert job_failures(w, "load_report") >= 3 and job_failures(w, "tick") == 0


@pytest.mark.slow
def test_an_agent_that_cannot_start_exits_instead_of_running_unready_apache_pulsar_23297(
    zk_hosts: str, zk: KazooClient, kafka: KafkaEnv, procs: Procs
) -> None:
    """apache/pulsar#23297 itself: the extensible load manager failed to start, the broker kept running
    (having unregistered itself) and failed every lookup sent to it. A trimtab agent whose start-up fails
    -- here its broker id is registered by another live ZooKeeper session, so it may not register -- is
    never ready, exits with status 1 saying why, and leaves the other session's registration alone."""
    port = free_port()
    broker = "taken:1"
    sets = [
        f"zookeeper.hosts={zk_hosts}",
        "zookeeper.session_timeout_s=4",
        f"kafka.bootstrap_servers={kafka.bootstrap_servers}",
        *(
            f"kafka.{name}_topic={kafka.prefix}-own-{name}"
            for name in ("channel", "snapshot", "broker_load", "top_bundles", "events", "standby")
        ),
        "http.host=127.0.0.1",
        f"http.port={port}",
        "broker.adapter.kind=simulated",
        f"broker.id={broker}",
        *NO_AUTH_SETS,
    ]
    s = load_settings(None, parse_assignments(sets), environ=False)
    path = ZkPaths(s.zk_path).broker(broker)
    info = BrokerInfo(id=broker, service_url="pulsar://elsewhere:6650", http_url="http://elsewhere:8080")
    zk.create(path, msgspec.json.encode(info), ephemeral=True, makepath=True)
    mine = zk.client_id[0]

    proc = procs.trimtab("agent", *(a for kv in sets for a in ("--set", kv)), name="agent-taken-id")
    answered: list[int] = []

    def exited() -> bool:
        with contextlib.suppress(httpx.HTTPError):
            answered.append(httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code)
        return not proc.is_running()

    wait_for(
        exited, 4 * 2 + 5 + 60, interval=0.1, message=lambda: f"the agent exits: {proc.stderr()[-2000:]}"
    )
    done = proc.wait(10)
    assert done.returncode == 1, done.describe()
    assert "registered by another live ZooKeeper session" in done.stderr, done.stderr
    assert 200 not in answered, answered
    data, stat = zk.get(path)
    assert stat.ephemeralOwner == mine and msgspec.json.decode(data, type=BrokerInfo) == info


# ================================================================================================ #20315

CONTROLLER_SESSION_S = 20.0  # long: a leader that only lost its session would hold the election this long


def controller_settings(zk_hosts: str) -> Settings:
    sets = [
        f"zookeeper.hosts={zk_hosts}",
        f"zookeeper.session_timeout_s={CONTROLLER_SESSION_S}",
        "http.host=127.0.0.1",
        "http.port=0",
        "healing.safe_mode_settle_s=0",
        *NO_AUTH_SETS,
    ]
    return load_settings(None, parse_assignments(sets), environ=False)


def controller(s: Settings, log: Any) -> InThread[Controller]:
    return InThread(
        lambda: build_controller(s, transport=MemoryTransport(log), prom=CollectorRegistry()),
        lambda c: c.run(),
        lambda c: c.stop_event.set(),  # what its SIGTERM handler does
    )


def test_a_leader_whose_channel_follower_dies_decides_nothing_until_it_is_restarted_apache_pulsar_23297(
    zk_hosts: str,
) -> None:
    """apache/pulsar#23297, on the controller: a leader whose channel replica failed must neither decide
    from it nor look healthy. In trimtab the leader whose channel follower stops is in safe mode
    ("warming_up": monitor, healing and shedding write nothing) and not ready (``/readyz`` 503 with the
    reason) until the follower is restarted; then it is ready and out of safe mode again."""
    s = controller_settings(zk_hosts)
    log = memory_log(s)
    ctl = controller(s, log).start()
    try:
        c = ctl.it
        wait_for(lambda: c.leadership.is_leader and c.leadership.safe_mode() is None, 30, message="it leads")
        url = c.election.http_url
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
        boom = threading.Event()

        def bug(key: str, old: Record | None, new: Record | None) -> None:
            if not boom.is_set():
                boom.set()
                raise RuntimeError("a bug on the follower's thread")

        c.channel.table.add_listener(bug)
        rec = make(State.ASSIGNING, dst="b:1", version=1, ts=int(time.time() * 1000), writer="b:1")
        c.channel.publish("acme/poison/0x00000000_0xffffffff", rec).result(10)
        ready = wait_for(
            lambda: (
                boom.is_set()
                and (r := httpx.get(f"{url}/readyz", timeout=10)).status_code == 503
                and r.json()
            ),
            20,
            interval=0.01,
            message="the leader reports not ready once its follower stopped",
        )
        assert "a bug on the follower's thread" in ready["channel"], ready
        assert c.leadership.safe_mode() == "warming_up"
        wait_for(
            lambda: httpx.get(f"{url}/readyz", timeout=10).status_code == 200,
            60,
            message=lambda: f"the follower restarted: {c.channel.health()}",
        )
        assert c.channel.recoveries >= 1 and c.leadership.safe_mode() is None
    finally:
        ctl.stop()
        assert ctl.join(60) == 0


def test_a_stopping_leader_resigns_before_the_slow_parts_of_its_shutdown_apache_pulsar_20315(
    zk_hosts: str, zk: KazooClient
) -> None:
    """apache/pulsar#20315: a leader shutting down kept its leadership while it closed its services, so
    nobody led meanwhile. A trimtab controller told to stop (SIGTERM) gives up leadership first: by the
    time it stops following the channel and the load topics (here made as slow as the test likes), its
    leader node is gone, and the other controller leads -- long before the stopping one has finished, and
    well within the session timeout it would otherwise have to wait out."""
    s = controller_settings(zk_hosts)
    log = memory_log(s)
    a = controller(s, log).start()
    b: InThread[Controller] | None = None
    release = threading.Event()
    try:
        wait_for(lambda: a.it.leadership.is_leader, 30, message="the first controller leads")
        term = a.it.leadership.term()
        b = controller(s, log).start()
        wait_for(
            lambda: b is not None and b.it.liveness.ready and b.it.election.leader() is not None,
            30,
            message="the second controller is warm and knows the leader",
        )
        assert not b.it.leadership.is_leader
        leader_path = ZkPaths(s.zk_path).leader
        seen_at_slow_part: list[Any] = []
        stop_following = a.it.replica.stop_following

        async def slow_stop_following() -> None:
            # The first slow part of the shutdown: what does ZooKeeper say about the leadership now?
            seen_at_slow_part.append((a.it.election.term, zk.exists(leader_path)))
            await asyncio.to_thread(release.wait, 60)
            await stop_following()

        a.it.replica.stop_following = slow_stop_following  # type: ignore[method-assign]
        asked = time.monotonic()
        a.stop()
        wait_for(
            lambda: b is not None and b.it.leadership.is_leader,
            CONTROLLER_SESSION_S / 2,
            interval=0.01,
            message="the other controller leads while the stopping one is still shutting down",
        )
        took = time.monotonic() - asked
        # The other may lead before the stopping one reaches the slow part (it resigned first, which is the
        # point): wait for it to get there too -- it cannot finish meanwhile, the slow part holds it.
        wait_for(lambda: seen_at_slow_part, 30, interval=0.01, message="the stopping leader at its slow part")
        assert a.running and not release.is_set()  # the stopping leader has not finished its shutdown
        ((own_term, node),) = seen_at_slow_part
        assert own_term is None, "still leading when the slow part of the shutdown began"
        assert node is None or node.ephemeralOwner != a.it.zk.session_id, (
            "its leader node outlived the resignation"
        )
        assert b.it.leadership.term() > term
        assert took < CONTROLLER_SESSION_S / 4, f"took over {took:.1f}s after the stop"
    finally:
        release.set()
        a.stop()
        assert a.join(60) == 0
        if b is not None:
            b.stop()
            assert b.join(60) == 0


def slow_request(host: str, port: int, token_headers: dict[str, str]) -> socket.socket:
    """A request whose body is still arriving: a stopping HTTP server waits for it (up to its graceful
    shutdown timeout) -- a slow part of every daemon's shutdown that a client decides."""
    head = "".join(f"{k}: {v}\r\n" for k, v in token_headers.items())
    sock = socket.create_connection((host, port), timeout=10)
    sock.sendall(
        (
            "POST /v1/admin/shedding HTTP/1.1\r\n"
            f"Host: {host}:{port}\r\n{head}"
            "Content-Type: application/json\r\nContent-Length: 64\r\n\r\n{"
        ).encode()
    )
    return sock


@pytest.mark.slow
def test_after_sigterm_the_other_controller_leads_before_the_old_one_has_stopped_apache_pulsar_20315(
    tmp_path: Path,
) -> None:
    """apache/pulsar#20315, with processes: two ``trimtab controller`` processes on a real ZooKeeper (and
    a real Kafka), a session timeout of 20 s. The leader gets SIGTERM while a client holds its HTTP server
    busy with a request whose body is still arriving (the server waits for it while shutting down). The
    other controller leads within moments of the signal, and seconds before the old leader's process has
    exited: leadership went first, not with the session at the end."""
    h = Harness.start(
        tmp_path,
        brokers=0,
        controllers=2,
        settings=merge(FAST, {"zookeeper": {"session_timeout_s": CONTROLLER_SESSION_S}}),
    )
    try:
        c = h.cluster
        leader = h.leader()
        follower = h.follower(leader)
        term = c.get(leader, "/v1/leader")["leader"]["term"]
        url = httpx.URL(leader.http)
        busy = slow_request(str(url.host), int(url.port or 80), c.auth_headers())
        try:
            asked = time.monotonic()
            c.kill(leader.name, signal.SIGTERM)
            wait_for(
                lambda: c.get(follower, "/v1/leader")["is_leader"],
                CONTROLLER_SESSION_S / 2,
                interval=0.02,
                message="the other controller leads",
            )
            took = time.monotonic() - asked
            assert leader.proc.wait(30) == 0
            exited = time.monotonic() - asked
        finally:
            busy.close()
        assert took + 1.0 < exited, (
            f"led {took:.2f}s after SIGTERM; the old leader exited after {exited:.2f}s"
        )
        assert took < CONTROLLER_SESSION_S / 4, f"took over {took:.1f}s after SIGTERM"
        assert c.get(follower, "/v1/leader")["leader"]["term"] > term
        assert "leader_resigned" in c.log_tail(leader.name, 200)
    finally:
        h.close()
