"""A whole trimtab cluster on one machine: the local dev cluster, and the harness of the process-level
tests and benchmarks.

It starts a real ZooKeeper server (``trimtab.devkit.zkserver``), owns a librdkafka mock cluster for its
lifetime (this process must stay up), writes one TOML config for every node, and runs agents (each with
its built-in simulated broker) and controllers as separate ``trimtab`` processes. Every process is put in
its own process group and killed on exit, whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from trimtab.config.loader import load_settings
from trimtab.devkit.kafka_mock import MockCluster
from trimtab.devkit.procs import die_with_parent_hook
from trimtab.devkit.zkserver import ZooKeeperServer, free_port
from trimtab.errors import DevKitError

# Timers for a cluster you watch converge in a minute instead of an hour (every one can be overridden).
FAST_TIMERS: dict[str, Any] = {
    "load": {"report_interval_s": 1.0, "report_max_interval_s": 10.0},
    "shedding": {
        "interval_s": 5.0,
        "hit_count_threshold": 1,
        "broker_cooldown_s": 5.0,
        "bundle_grace_s": 30.0,
    },
    "split": {"interval_s": 10.0},
    "channel": {"monitor_interval_s": 5.0, "snapshot_interval_s": 15.0},
    "zookeeper": {"session_timeout_s": 6.0},
    "healing": {"safe_mode_settle_s": 10.0},
}


class ClusterError(DevKitError):
    pass


@dataclass
class Node:
    name: str
    kind: str  # agent | controller
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    broker: str | None = None

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


def _merge(a: dict[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def _toml(d: Mapping[str, Any], prefix: str = "") -> str:
    """Write a nested dict as TOML: sections as tables, dict-valued settings (tags...) inline."""
    inline = {
        k: v
        for k, v in d.items()
        if not isinstance(v, Mapping) or (prefix and all(not isinstance(x, Mapping) for x in v.values()))
    }
    tables = {k: v for k, v in d.items() if k not in inline}
    lines: list[str] = [f"[{prefix}]"] if prefix and inline else []
    lines += [f"{k} = {_toml_value(v)}" for k, v in inline.items()]
    for k, v in tables.items():
        lines.append(_toml(v, f"{prefix}.{k}" if prefix else k))
    return "\n".join(lines) + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, Mapping):
        return (
            "{ "
            + ", ".join(f"{orjson.dumps(str(k)).decode()} = {_toml_value(x)}" for k, x in v.items())
            + " }"
        )
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return orjson.dumps(v).decode()


@dataclass
class LocalCluster:
    workdir: Path
    brokers: int = 3
    controllers: int = 2
    settings: Mapping[str, Any] = field(default_factory=dict)
    cluster_name: str = "local"
    python: str = sys.executable
    env: Mapping[str, str] | None = None
    zk_port: int = 0

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.nodes: dict[str, Node] = {}
        self.zk: ZooKeeperServer | None = None
        self.kafka: MockCluster | None = None
        self.config_path = self.workdir / "trimtab.toml"
        self._http = httpx.Client(timeout=10)
        self._seq = {"agent": 0, "controller": 0}

    # ------------------------------------------------------------------ infrastructure
    def start(self, timeout: float = 90.0) -> LocalCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        try:
            self.zk = ZooKeeperServer(self.workdir / "zookeeper", port=self.zk_port).start()
            self.kafka = MockCluster()
            self._write_config()
            s = load_settings(self.config_path, environ=False)
            self.kafka.create_topics(
                [
                    s.kafka.channel_topic,
                    s.kafka.snapshot_topic,
                    s.kafka.broker_load_topic,
                    s.kafka.top_bundles_topic,
                    s.kafka.events_topic,
                ]
            )
            for _ in range(self.brokers):
                self.add_agent(wait=False)
            for _ in range(self.controllers):
                self.add_controller(wait=False)
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _write_config(self) -> None:
        assert self.zk is not None and self.kafka is not None
        base: dict[str, Any] = {
            "cluster": {"name": self.cluster_name},
            "zookeeper": {"hosts": self.zk.hosts},
            # The mock auto-creates every topic with four partitions: use the snapshot topic's first only.
            "kafka": {
                "bootstrap_servers": self.kafka.bootstrap_servers,
                "allow_multi_partition_snapshot_topic": True,
            },
            # The local cluster's brokers are synthetic: the one place (with tests and benchmarks) that
            # chooses the simulated adapter.
            "broker": {"adapter": {"kind": "simulated"}},
            "logging": {"level": "info", "json_logs": True},
        }
        cfg = _merge(base, self.settings)
        self.config_path.write_text(_toml(cfg))

    @property
    def zk_hosts(self) -> str:
        assert self.zk is not None
        return self.zk.hosts

    @property
    def bootstrap_servers(self) -> str:
        assert self.kafka is not None
        return self.kafka.bootstrap_servers

    # ------------------------------------------------------------------ processes
    def _spawn(self, kind: str, name: str, port: int, extra: list[str]) -> Node:
        log = self.workdir / "logs" / f"{name}.log"
        env = {**os.environ, **(self.env or {}), "PYTHONUNBUFFERED": "1"}
        cmd = [
            self.python,
            "-m",
            "trimtab.cli",
            kind,
            "--config",
            str(self.config_path),
            "--http-port",
            str(port),
            *extra,
        ]
        with log.open("ab") as out:
            # Own session (signals to the orchestrator are not forwarded), yet killed if the orchestrator
            # dies: a dev cluster or a test run must never leave daemons behind.
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent_hook(),  # noqa: PLW1509
            )
        node = Node(name, kind, port, proc, log)
        self.nodes[name] = node
        return node

    def add_agent(
        self, name: str | None = None, *, wait: bool = True, port: int | None = None, args: Iterable[str] = ()
    ) -> Node:
        self._seq["agent"] += 1
        name = name or f"agent-{self._seq['agent']}"
        port = port or free_port()
        node = self._spawn("agent", name, port, list(args))
        node.broker = f"127.0.0.1:{port}"
        if wait:
            self.wait_node(node, 60)
        return node

    def add_controller(self, name: str | None = None, *, wait: bool = True, args: Iterable[str] = ()) -> Node:
        self._seq["controller"] += 1
        name = name or f"controller-{self._seq['controller']}"
        node = self._spawn("controller", name, free_port(), list(args))
        if wait:
            self.wait_node(node, 60)
        return node

    @property
    def agents(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind == "agent" and n.alive()]

    @property
    def controller_nodes(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind == "controller" and n.alive()]

    def node(self, name: str) -> Node:
        return self.nodes[name]

    def by_broker(self, broker: str) -> Node:
        for n in self.nodes.values():
            if n.broker == broker:
                return n
        raise KeyError(broker)

    # ------------------------------------------------------------------ waiting
    def _ready(self, node: Node) -> bool:
        try:
            return self._http.get(f"{node.http}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_node(self, node: Node, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not node.alive():
                raise ClusterError(
                    f"{node.name} exited with {node.proc.returncode}:\n{self.log_tail(node.name)}"
                )
            if self._ready(node):
                return
            time.sleep(0.05)
        raise ClusterError(f"{node.name} not ready after {timeout}s:\n{self.log_tail(node.name)}")

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        for node in list(self.nodes.values()):
            if node.alive():
                self.wait_node(node, max(1.0, deadline - time.monotonic()))
        if self.controller_nodes:
            while self.leader() is None:
                if time.monotonic() > deadline:
                    raise ClusterError("no controller was elected leader")
                time.sleep(0.05)

    def log_tail(self, name: str, lines: int = 30) -> str:
        try:
            return "\n".join(self.nodes[name].log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # ------------------------------------------------------------------ HTTP helpers
    def get(self, node: Node | str, path: str, **params: Any) -> Any:
        n = self.nodes[node] if isinstance(node, str) else node
        r = self._http.get(f"{n.http}{path}", params=params)
        r.raise_for_status()
        return r.json()

    def post(self, node: Node | str, path: str, body: Mapping[str, Any]) -> httpx.Response:
        n = self.nodes[node] if isinstance(node, str) else node
        return self._http.post(f"{n.http}{path}", json=dict(body), follow_redirects=True)

    def leader(self) -> Node | None:
        for n in self.controller_nodes:
            try:
                if self.get(n, "/v1/leader").get("is_leader"):
                    return n
            except httpx.HTTPError:
                continue
        return None

    def lookup(self, topic: str, via: Node | None = None) -> dict[str, Any]:
        node = via or self.agents[hash(topic) % len(self.agents)]
        r = self._http.get(f"{node.http}/v1/lookup", params={"topic": topic}, timeout=40)
        if r.status_code != 200:
            raise ClusterError(f"lookup {topic} via {node.name}: {r.status_code} {r.text}")
        return dict(r.json())

    def ownership(self, via: Node | None = None) -> dict[str, dict[str, Any]]:
        node = via or (self.leader() or self.agents[0])
        return dict(self.get(node, "/v1/ownership")["bundles"])

    def timelines(self) -> dict[str, list[dict[str, Any]]]:
        """Every live simulated broker's acquire/fence/close timeline, by broker id."""
        out = {}
        for n in self.agents:
            st = self.get(n, "/v1/sim/state")
            out[st["broker"]] = st["timeline"]
        return out

    # ------------------------------------------------------------------ faults and stopping
    def kill(self, name: str, sig: signal.Signals = signal.SIGKILL) -> None:
        node = self.nodes[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.proc.pid, sig)

    def terminate(self, name: str, timeout: float = 60.0) -> int:
        """SIGTERM (an agent drains first) and wait for the exit code."""
        node = self.nodes[name]
        self.kill(name, signal.SIGTERM)
        try:
            return node.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(name)
            return node.proc.wait(5)

    def stop(self, graceful: bool = False) -> None:
        procs = list(self.nodes.values())
        for n in procs:
            if n.alive():
                self.kill(n.name, signal.SIGTERM if graceful else signal.SIGKILL)
        deadline = time.monotonic() + (30 if graceful else 5)
        for n in procs:
            try:
                n.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(n.name)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    n.proc.wait(5)
        if self.zk is not None:
            self.zk.stop()
            self.zk = None
        if self.kafka is not None:
            self.kafka.close()
            self.kafka = None
        self._http.close()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ description
    def state(self) -> dict[str, Any]:
        return {
            "agents": [
                {"broker": n.broker, "http": n.http, "pid": n.pid, "name": n.name} for n in self.agents
            ],
            "controllers": [{"http": n.http, "pid": n.pid, "name": n.name} for n in self.controller_nodes],
            "zookeeper": self.zk_hosts if self.zk else None,
            "kafka": self.bootstrap_servers if self.kafka else None,
            "config": str(self.config_path),
            "workdir": str(self.workdir),
            "orchestrator_pid": os.getpid(),
        }

    def write_state(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(self.state(), option=orjson.OPT_INDENT_2))
        tmp.replace(path)
