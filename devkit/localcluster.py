"""A whole trimtab cluster on one machine: the local dev cluster, and the harness of the process-level
tests and benchmarks.

It starts a real ZooKeeper server (``trimtab.devkit.zkserver``) and a real Apache Kafka KRaft cluster of
``kafka_brokers`` nodes (``trimtab.devkit.kafka_server``; its topics created by ``trimtab topics ensure``'s
code from cluster/topics.py, as docker-compose's kafka-init does), writes one TOML config for every node, and runs agents (each with
its built-in simulated broker) and controllers as separate ``trimtab`` processes. Every process is put in
its own process group and killed on exit, whatever happens.

With ``broker_processes=True`` each simulated broker is a process of its own (``trimtab sim-broker``, the
reference webhook broker) that its agent drives through the webhook adapter with signed calls: pausing or
killing an agent then leaves its broker running, as beside a real broker, and only broker leases stop it
from serving what the agent can no longer vouch for. The chaos suite runs this way.

With ``zk_servers=3`` ZooKeeper is a three-server ensemble (:class:`~trimtab.devkit.zkserver.ZooKeeperEnsemble`);
with a ``network`` (:mod:`trimtab.devkit.netns`) its servers run on hosts of their own, so links between them
can be cut (the chaos suite's ``partition_zk_member``). With ``node_hosts`` too, so does every agent (with
its broker process beside it, as on one machine), every controller, and Kafka listens on the network's
gateway in the root namespace: an agent can then be cut off from ZooKeeper but not from Kafka, a leader from
Kafka but not from ZooKeeper, the cluster split in halves (the chaos suite's network faults).

With ``prometheus`` options, a real Prometheus server (:mod:`trimtab.devkit.prometheus`) scrapes every agent
and controller, dead ones included, with the deployed alert rules loaded; it is stopped with the cluster.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from trimtab.cluster.wiring import ensure_topics
from trimtab.config.loader import load_settings
from trimtab.config.merge import deep_merge
from trimtab.devkit.kafka_server import KafkaCluster, Security
from trimtab.devkit.netns import Network
from trimtab.devkit.procs import die_with_parent_hook, open_log
from trimtab.devkit.prometheus import AGENT_JOB, CONTROLLER_JOB, PrometheusOptions, PrometheusServer, Target
from trimtab.devkit.zkserver import ZooKeeperEnsemble, ZooKeeperServer, free_port
from trimtab.errors import DevKitError

#: The folder whose sitecustomize injects process faults: a stepped wall clock (LocalCluster.clock_skew), an
#: agent that ignores its ZooKeeper session (LocalCluster.agent_lease_check False).
PROCESS_FAULTS_DIR = Path(__file__).resolve().parent / "procfaults"

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
    backend: str | None = None  # an agent's sim-broker process (node name), with broker_processes
    scheme: str = "http"  # https when the cluster's settings give the nodes a TLS certificate
    host: str = "127.0.0.1"  # its address: a host of its own's (node_hosts), else loopback
    netns_host: str | None = None  # the name of its host in the cluster's network (node_hosts)

    @property
    def http(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


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
    zk_servers: int = 1  # 3 (or 5...): an ensemble, so a ZooKeeper leader change can happen under trimtab
    network: Network | None = None  # hosts of their own for ZooKeeper's servers (devkit/netns.py)
    node_hosts: bool = False  # with a network: agents (with their brokers) and controllers on hosts too
    # Agents' and controllers' wall clocks can be stepped (skew()): devkit/procfaults/sitecustomize.py.
    clock_skew: bool = False
    # False: agents vouch for leases whatever ZooKeeper says (the chaos checker's self-test only).
    agent_lease_check: bool = True
    broker_processes: bool = False
    kafka_brokers: int = 1
    # "sasl_ssl": SCRAM over TLS with the StandardAuthorizer (real Kafka only); every node then uses the
    # admin (super user) credentials, written to <workdir>/security/kafka-admin.properties, unless its
    # args set kafka.client_config_file to a principal of its own (tests/integration/test_kafka_security.py).
    kafka_security: Security = "plaintext"
    # A real Prometheus server scraping every agent and controller, with the alert rules loaded
    # (trimtab.devkit.prometheus); None: no Prometheus.
    prometheus: PrometheusOptions | None = None

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.nodes: dict[str, Node] = {}
        self.zk: ZooKeeperServer | None = None
        self.zk_ensemble: ZooKeeperEnsemble | None = None
        self.kafka: KafkaCluster | None = None
        self.prometheus_server: PrometheusServer | None = None
        self.config_path = self.workdir / "trimtab.toml"
        # Security on, as in production (docs/security.md): an admin and a read token and ZooKeeper digest
        # credentials of this cluster alone, written to owner-only files at start; the helpers below call
        # the nodes with the admin token (and trust the settings' http.tls_ca_file, if any).
        self.admin_token = secrets.token_urlsafe(32)
        self.read_token = secrets.token_urlsafe(32)
        self._zk_digest = f"trimtab:{secrets.token_urlsafe(24)}"
        self.security_dir = self.workdir / "security"
        http = dict(self.settings.get("http") or {})
        self._scheme = "https" if http.get("tls_cert_file") else "http"
        ca = http.get("tls_ca_file")
        self._http = httpx.Client(
            timeout=10,
            headers={"authorization": f"Bearer {self.admin_token}"},
            verify=ssl.create_default_context(cafile=str(ca)) if ca else True,
        )
        self._seq = {"agent": 0, "controller": 0}

    # ------------------------------------------------------------------ infrastructure
    def start(self, timeout: float = 90.0) -> LocalCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        # Every start is a new cluster with new credentials, so what an earlier one left in the same directory
        # is unusable: its znodes' ACLs name the old ZooKeeper digest (every write would be refused), and its
        # logs would mix into this cluster's failure messages.
        for stale in ("zookeeper", "logs", "prometheus", "kafka"):
            shutil.rmtree(self.workdir / stale, ignore_errors=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        try:
            self._start_zookeeper()
            # Topics only as trimtab makes them: nothing auto-created by a stray metadata request.
            self.kafka = KafkaCluster(
                self.workdir / "kafka",
                brokers=self.kafka_brokers,
                security=self.kafka_security,
                extra_config={"auto.create.topics.enable": "false"},
                # On the gateway when nodes have hosts of their own: every host reaches it over the bridge.
                host=self.network.gateway if self.network is not None and self.node_hosts else "127.0.0.1",
            ).start()
            self._write_config()
            # What docker-compose's kafka-init runs (trimtab topics ensure), with the nodes' configuration.
            ensure_topics(load_settings(self.config_path, environ=False), "trimtab-dev")
            for _ in range(self.brokers):
                self.add_agent(wait=False)
            for _ in range(self.controllers):
                self.add_controller(wait=False)
            self.wait_ready(timeout)
            if self.prometheus is not None:
                # Once the nodes are ready, so that its first scrapes find them all up: a node seen down
                # while it boots would show a pending TrimtabAgentDown for nothing.
                ca = (self.settings.get("http") or {}).get("tls_ca_file")
                self.prometheus_server = PrometheusServer(
                    self.workdir / "prometheus", self.prometheus, ca_file=str(ca) if ca else None
                )
                self._update_scrape_targets()
                self.prometheus_server.start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_zookeeper(self) -> None:
        if self.zk_servers == 1 and self.network is not None:
            h = self.network.add_host("zk1")
            run_in = self.network.argv(h.name, [])
            self.zk = ZooKeeperServer(self.workdir / "zookeeper", 2181, address=h.ip, run_in=run_in).start()
            return
        if self.zk_servers == 1:
            self.zk = ZooKeeperServer(self.workdir / "zookeeper", port=self.zk_port).start()
            return
        hosts = None
        if self.network is not None:
            made = [self.network.add_host(f"zk{i + 1}") for i in range(self.zk_servers)]
            hosts = [(h.ip, self.network.argv(h.name, [])) for h in made]
        self.zk_ensemble = ZooKeeperEnsemble(self.workdir / "zookeeper", self.zk_servers, hosts=hosts).start()

    def _write_config(self) -> None:
        assert self.kafka is not None
        sec = self._write_secrets()
        base: dict[str, Any] = {
            "cluster": {"name": self.cluster_name},
            "zookeeper": {"hosts": self.zk_hosts, "auth_digest_file": str(sec["zookeeper_digest"])},
            "security": {
                "admin_tokens_file": str(sec["admin_token"]),
                "read_tokens_file": str(sec["read_token"]),
            },
            "kafka": {"bootstrap_servers": self.kafka.bootstrap_servers},
            # The local cluster's brokers are synthetic: the one place (with tests and benchmarks) that
            # chooses the simulated adapter.
            "broker": {"adapter": {"kind": "simulated"}},
            "logging": {"level": "info", "json_logs": True},
            # Lookups create a namespace only where namespace.auto_create allows it -- nowhere in production
            # (docs/security.md). This harness's tests look up topics of many tenants nobody created, so it
            # allows any; dev up, the chaos suite and the benchmarks narrow it to their own tenants, and a
            # test of the policy passes its own list in ``settings``.
            "namespace": {"auto_create": ["*"]},
        }
        if self.broker_processes:
            # Agents and their sim-broker processes read the same file (each agent is told its broker's URL
            # and the webhook kind on its command line): the webhook calls are signed.
            key = self.workdir / "webhook-hmac.key"
            if not key.exists():
                key.write_text(secrets.token_urlsafe(32) + "\n")
                key.chmod(0o600)
            base["broker"] = {"adapter": {"kind": "simulated", "hmac_key_file": str(key)}}
        base["kafka"]["replication_factor"] = min(3, self.kafka_brokers)
        if self.kafka.security == "sasl_ssl":
            props = self.kafka.write_client_properties(self.security_dir / "kafka-admin.properties")
            base["kafka"]["client_config_file"] = str(props)
        cfg = deep_merge(base, self.settings)
        self.config_path.write_text(_toml(cfg))

    @property
    def token_files(self) -> dict[str, Path]:
        """Where the secrets are: the admin and read token files and the ZooKeeper digest file."""
        d = self.security_dir
        return {
            "admin_token": d / "admin.tokens",
            "read_token": d / "read.tokens",
            "zookeeper_digest": d / "zookeeper.digest",
        }

    def _write_secrets(self) -> dict[str, Path]:
        """Write this cluster's secrets, readable by their owner only (mode 0600), over any old ones."""
        files = self.token_files
        self.security_dir.mkdir(parents=True, exist_ok=True)
        self.security_dir.chmod(0o700)
        secret = {
            "admin_token": self.admin_token,
            "read_token": self.read_token,
            "zookeeper_digest": self._zk_digest,
        }
        for key, path in files.items():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                os.fchmod(f.fileno(), 0o600)
                f.write(secret[key] + "\n")
        return files

    def auth_headers(self, role: str = "admin") -> dict[str, str]:
        """``Authorization`` for a request of one's own (``role``: admin or read)."""
        return {"authorization": f"Bearer {self.admin_token if role == 'admin' else self.read_token}"}

    @property
    def zk_auth(self) -> tuple[str, str]:
        """kazoo ``auth_data`` entry for a client that may change this cluster's znodes."""
        return ("digest", self._zk_digest)

    @property
    def zk_hosts(self) -> str:
        """The ZooKeeper connect string: the server, or every member of the ensemble."""
        if self.zk_ensemble is not None:
            return self.zk_ensemble.connect
        assert self.zk is not None
        return self.zk.hosts

    @property
    def bootstrap_servers(self) -> str:
        assert self.kafka is not None
        return self.kafka.bootstrap_servers

    # ------------------------------------------------------------------ processes
    def _host_for(self, name: str) -> tuple[str | None, str]:
        """(its host's name, its address) for node ``name``: with ``node_hosts``, a host per agent (shared
        by its broker process and every restart: ``agent-2~3`` is on ``a2``) and per controller."""
        if self.network is None or not self.node_hosts:
            return None, "127.0.0.1"
        kind, _, seq = name.split("~", maxsplit=1)[0].rpartition("-")
        host = {"agent": "a", "broker": "a", "controller": "c"}[kind] + seq
        if host not in self.network.hosts:
            self.network.add_host(host)
        return host, self.network.hosts[host].ip

    def _spawn(self, kind: str, name: str, port: int, extra: list[str], clock: str | None = None) -> Node:
        """An agent or a controller."""
        host, ip = self._host_for(name)
        argv = [kind, "--config", str(self.config_path), "--http-port", str(port), *extra]
        if host is not None:
            argv += ["--http-host", ip]
        proc = self._popen(name, argv, host, clock)
        node = Node(name, kind, port, proc, self._log(name), scheme=self._scheme)
        node.host, node.netns_host = ip, host
        return self._add_node(node)

    def _log(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    def _popen(
        self, name: str, argv: list[str], host: str | None = None, clock: str | None = None
    ) -> subprocess.Popen[bytes]:
        """``trimtab <argv>`` with its output in the node's log (on ``host`` of the network, if given; with
        the wall clock named ``clock`` in a ``clock_skew`` cluster: an agent and its broker share one, as
        processes of one machine do)."""
        env = {**os.environ, **(self.env or {}), "PYTHONUNBUFFERED": "1"}
        clock = clock or name.split("~", maxsplit=1)[0]
        if self.clock_skew or not self.agent_lease_check:
            path = [str(PROCESS_FAULTS_DIR), *filter(None, [env.get("PYTHONPATH")])]
            env["PYTHONPATH"] = os.pathsep.join(path)
        if self.clock_skew:
            env["TRIMTAB_CLOCK_SKEW_FILE"] = str(self._skew_file(clock))
        if not self.agent_lease_check:
            env["TRIMTAB_FAULT_AGENT_IGNORES_SESSION"] = "1"
        cmd = [self.python, "-m", "trimtab.cli", *argv]
        if host is not None:
            assert self.network is not None
            cmd = self.network.argv(host, cmd)
        with open_log(self._log(name)) as out:
            # Own session (signals to the orchestrator are not forwarded), yet killed if the orchestrator
            # dies: a dev cluster or a test run must never leave daemons behind.
            return subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent_hook(),  # noqa: PLW1509
            )

    def _skew_file(self, clock: str) -> Path:
        """Where the offset of the wall clock named ``clock`` is: a broker id (its agent's and its broker
        process's, through restarts), or a controller's name."""
        path = self.workdir / "clock-skew" / clock
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("0\n")
        return path

    def skew(self, clock: str, seconds: float) -> None:
        """Step the wall clock named ``clock`` -- a broker id (its agent and broker process) or a
        controller's name -- to ``seconds`` from the real time (``clock_skew`` clusters)."""
        if not self.clock_skew:
            raise ClusterError("this cluster's clocks cannot be stepped: start it with clock_skew=True")
        tmp = self._skew_file(clock).with_suffix(".tmp")
        tmp.write_text(f"{seconds}\n")
        tmp.replace(self._skew_file(clock))  # atomically: a reader never sees half a number

    def _add_node(self, node: Node) -> Node:
        self.nodes[node.name] = node
        self._update_scrape_targets()
        return node

    def _update_scrape_targets(self) -> None:
        """Every agent and controller ever started, dead ones included (their ``up`` is 0: that is what
        the agent-down alert sees); a restarted node keeps its name and replaces its old target."""
        if self.prometheus_server is None:
            return
        jobs: dict[str, list[Target]] = {AGENT_JOB: [], CONTROLLER_JOB: []}
        for n in self.nodes.values():
            if n.kind in ("agent", "controller"):
                job = AGENT_JOB if n.kind == "agent" else CONTROLLER_JOB
                jobs[job].append(Target(f"{n.host}:{n.port}", n.scheme, {"node": n.name}))
        self.prometheus_server.set_targets(jobs)

    def add_agent(
        self, name: str | None = None, *, wait: bool = True, port: int | None = None, args: Iterable[str] = ()
    ) -> Node:
        self._seq["agent"] += 1
        name = name or f"agent-{self._seq['agent']}"
        host, ip = self._host_for(name)
        port = port or (8080 if host is not None else free_port())
        broker = f"{ip}:{port}"
        extra = list(args)
        backend = None
        if self.broker_processes:
            # A restarted agent (same port, same broker id) finds its broker still running.
            sim = self.broker_process(broker) or self.add_broker_process(broker)
            backend = sim.name
            extra = [
                "--set",
                "broker.adapter.kind=webhook",
                "--set",
                f"broker.adapter.url={sim.http}",
                *extra,
            ]
        node = self._spawn("agent", name, port, extra, clock=broker)
        node.broker = broker
        node.backend = backend
        if wait:
            self.wait_node(node, 60)
        return node

    def add_broker_process(self, broker: str, timeout: float = 60.0) -> Node:
        """Start ``trimtab sim-broker`` for broker id ``broker`` and wait until it answers."""
        ip = broker.rsplit(":", 1)[0]
        host = (
            next((h.name for h in self.network.hosts.values() if h.ip == ip), None) if self.network else None
        )
        port = 8081 if host is not None else free_port()
        name = f"broker-{broker.rsplit(':', 1)[-1]}" if host is None else f"broker-{host[1:]}"
        argv = ["sim-broker", "--config", str(self.config_path), "--port", str(port), "--broker-id", broker]
        argv += ["--host", ip]
        proc = self._popen(name, argv, host, clock=broker)
        node = Node(name, "broker", port, proc, self._log(name), broker=broker, host=ip, netns_host=host)
        self._add_node(node)
        deadline = time.monotonic() + timeout
        while not self._answers(f"{node.http}/trimtab/v1/sim/state"):
            if not node.alive():
                raise ClusterError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")
            if time.monotonic() > deadline:
                raise ClusterError(f"{name} did not answer within {timeout}s:\n{self.log_tail(name)}")
            time.sleep(0.05)
        return node

    def _answers(self, url: str) -> bool:
        try:
            return self._http.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def broker_process(self, broker: str) -> Node | None:
        """The live sim-broker process of broker id ``broker`` (broker_processes only)."""
        for n in self.nodes.values():
            if n.kind == "broker" and n.broker == broker and n.alive():
                return n
        return None

    @property
    def broker_nodes(self) -> list[Node]:
        return [n for n in list(self.nodes.values()) if n.kind == "broker" and n.alive()]

    def add_controller(self, name: str | None = None, *, wait: bool = True, args: Iterable[str] = ()) -> Node:
        self._seq["controller"] += 1
        name = name or f"controller-{self._seq['controller']}"
        port = 8080 if self.network is not None and self.node_hosts else free_port()
        node = self._spawn("controller", name, port, list(args))
        if wait:
            self.wait_node(node, 60)
        return node

    @property
    def agents(self) -> list[Node]:
        return [n for n in list(self.nodes.values()) if n.kind == "agent" and n.alive()]

    @property
    def controller_nodes(self) -> list[Node]:
        return [n for n in list(self.nodes.values()) if n.kind == "controller" and n.alive()]

    def node(self, name: str) -> Node:
        return self.nodes[name]

    def by_broker(self, broker: str) -> Node:
        """The agent of broker id ``broker``."""
        for n in self.nodes.values():
            if n.kind == "agent" and n.broker == broker:
                return n
        raise KeyError(broker)

    # ------------------------------------------------------------------ waiting
    def _ready(self, node: Node) -> bool:
        return self._answers(f"{node.http}/readyz")

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
            if node.alive() and node.kind != "broker":  # sim-brokers answered when they were started
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
        """POST, following a follower's 307 to the leader with the token (httpx drops ``Authorization``
        when a redirect changes the port, as curl does)."""
        n = self.nodes[node] if isinstance(node, str) else node
        url = httpx.URL(f"{n.http}{path}")
        for _ in range(5):
            r = self._http.post(url, json=dict(body))
            if r.status_code not in (307, 308) or "location" not in r.headers:
                break
            url = url.join(r.headers["location"])
        return r

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
        """Every live simulated broker's acquire/fence/close/expire timeline, by broker id: from the
        sim-broker processes (whose agents may be dead or paused) or from the agents' built-in brokers."""
        return {st["broker"]: st["timeline"] for st in self.broker_states().values()}

    def broker_states(self) -> dict[str, dict[str, Any]]:
        """``GET .../sim/state`` of every live simulated broker, by broker id."""
        out = {}
        if self.broker_processes:
            for n in self.broker_nodes:
                st = self.get(n, "/trimtab/v1/sim/state")
                out[st["broker"]] = st
        else:
            for n in self.agents:
                st = self.get(n, "/v1/sim/state")
                out[st["broker"]] = st
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
        if self.prometheus_server is not None:
            self.prometheus_server.close()
            self.prometheus_server = None
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
        if self.zk_ensemble is not None:
            self.zk_ensemble.stop()
            self.zk_ensemble = None
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
            "brokers": [{"broker": n.broker, "http": n.http, "pid": n.pid} for n in self.broker_nodes],
            "zookeeper": self.zk_hosts if self.zk or self.zk_ensemble else None,
            "kafka": self.bootstrap_servers if self.kafka else None,
            "kafka_brokers": (
                [{"id": b.id, "pid": b.pid, "host": b.host, "port": b.port} for b in self.kafka.brokers]
                if isinstance(self.kafka, KafkaCluster)
                else []
            ),
            "config": str(self.config_path),
            "workdir": str(self.workdir),
            "orchestrator_pid": os.getpid(),
            # Where the secrets are, never the secrets (`trimtab admin --token-file ...`).
            "security": {f"{k}_file": str(v) for k, v in self.token_files.items()},
            "prometheus": (
                {"url": self.prometheus_server.url, "pid": self.prometheus_server.pid}
                if self.prometheus_server is not None
                else None
            ),
        }

    def write_state(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(self.state(), option=orjson.OPT_INDENT_2))
        tmp.replace(path)
