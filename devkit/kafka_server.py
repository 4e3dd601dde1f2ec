"""A real Apache Kafka cluster (KRaft) as child processes: what users run, for the tests, the benchmarks, the
chaos suite and the local cluster.

No pytest here. Every node is a combined broker + controller (``process.roles=broker,controller``) started
as ``java -cp <jars> kafka.Kafka server.properties`` on free loopback ports, with its storage formatted by
``kafka.tools.StorageTool`` under one cluster id. The controller quorum is *static*
(``controller.quorum.voters``): nothing about the quorum is written into the storage, so a port that was
taken between choosing it and binding it is simply replaced on the next try, and formatting needs no
directory ids. The jars are, first found wins:

1. the ``classpath`` argument (jars, or directories of jars);
2. ``$TRIMTAB_KAFKA_CLASSPATH`` (a ``:``-separated list of jars, directories of jars or ``dir/*``);
3. the cache ``scripts/setup.sh`` fills from Maven Central (``devkit/kafka/pom.xml``):
   ``${XDG_CACHE_HOME:-~/.cache}/trimtab/kafka-<KAFKA_VERSION>/libs``.

Security: ``plaintext`` (a PLAINTEXT listener) or ``sasl_ssl``: a SASL_SSL listener that takes
SCRAM-SHA-512 over TLS (a CA and a server certificate for 127.0.0.1 made with openssl into the workdir),
the ``StandardAuthorizer`` with the admin user (``admin``, random password) as its only super user, and the
admin's SCRAM credential written at format time (``--add-scram``) so that brokers can authenticate to each
other from their first start. The controller listener speaks SASL_PLAINTEXT/PLAIN with the same admin
principal: KRaft controllers cannot take SCRAM (its credentials live in the metadata they serve), and an
unauthenticated controller listener would need ``User:ANONYMOUS`` as a super user. Other principals are
added by the admin API once the cluster runs: :meth:`KafkaCluster.create_user` (a SCRAM credential),
:meth:`KafkaCluster.create_acls` / :meth:`KafkaCluster.grant` (e.g. the bindings of
``trimtab.cluster.kafka_acls.acl_bindings``), each waiting until every broker applies it, and
:meth:`KafkaCluster.write_client_properties` writes a principal's settings as trimtab's
``kafka.client_config_file`` (tests/integration/test_kafka_security.py runs trimtab that way).

Start-up time matters because the tests start many clusters: each JVM gets a small serial-GC heap and the
C1 compiler only (``jvm_args`` can append ``-XX:TieredStopAtLevel=4`` for a benchmark's steady state), and
the first graceful stop of a one-node cluster leaves a class-data-sharing archive for this Java and these
jars in the cache (``kafka-cds/``), which later starts map instead of loading and verifying ~4,000 classes (about a
second less per node on this 2-core machine). Readiness is a real metadata request through each node's own
listener that sees every running broker, polled under a deadline; errors carry the tail of the node's log.

Nodes run in their own process groups (a Ctrl-C meant for the dev cluster does not reach them before we stop
them), log to ``<workdir>/node-<id>/kafka.log`` and die with their parent (``PR_SET_PDEATHSIG``, when started
from the main thread); nodes still running when the interpreter exits are killed by an ``atexit`` hook.

Standalone: ``python -m trimtab.devkit.kafka_server --brokers 3`` runs a cluster until Ctrl-C and prints its
bootstrap servers; ``--check`` starts one, prints the time to ready and stops it (``scripts/setup.sh``).
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import functools
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclBindingFilter,
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from trimtab.devkit.pki import make_pki, openssl
from trimtab.devkit.procs import spawn_logged
from trimtab.devkit.zkserver import ZooKeeperServerError
from trimtab.devkit.zkserver import find_java as _find_java
from trimtab.errors import DevKitError

# Keep in step with devkit/kafka/pom.xml (tests/integration/test_kafka_server.py checks that they agree).
KAFKA_VERSION = "4.4.0"
CLASSPATH_ENV = "TRIMTAB_KAFKA_CLASSPATH"
MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
SERVER_JAR = f"kafka_2.13-{KAFKA_VERSION}.jar"
ADMIN_USER = "admin"
SCRAM_MECHANISM = "SCRAM-SHA-512"
INSTALL_HINT = (
    "run `bash scripts/setup.sh` (it fetches them from Maven Central once, with Maven), or point "
    f"${CLASSPATH_ENV} at a directory of Kafka {KAFKA_VERSION} server jars"
)
LOG_NAME = "kafka.log"
CONFIG_NAME = "server.properties"
STATE_NAME = "cluster.json"
Security = Literal["plaintext", "sasl_ssl"]
SECURITY_MODES: tuple[Security, ...] = ("plaintext", "sasl_ssl")
_LOOPBACK = "127.0.0.1"
_T = TypeVar("_T")

# log4j2 for the broker: everything at INFO to stdout (the node's log file). Its own shutdown hook is off so
# the lines Kafka writes while it shuts down (controlled shutdown, log flushes) are not lost.
_LOG4J2 = """\
status = warn
shutdownHook = disable
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
"""


class KafkaServerError(DevKitError):
    """A Kafka node could not be found, formatted, started or stopped; the message says what to do."""


# ---------------------------------------------------------------------------------------------- discovery
def cache_root() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/trimtab``: where ``scripts/setup.sh`` puts what git does not hold."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trimtab"


def default_libs_dir() -> Path:
    """Where ``scripts/setup.sh`` copies the server jars of :data:`KAFKA_VERSION` (moved into place whole,
    so the directory existing means the copy is complete)."""
    return cache_root() / f"kafka-{KAFKA_VERSION}" / "libs"


def _jars_of(entry: str) -> list[str]:
    path = Path(entry[:-2] if entry.endswith("/*") else entry)
    if path.is_dir():
        return sorted(str(p) for p in path.glob("*.jar"))
    if path.is_file():
        return [str(path)]
    raise KafkaServerError(f"the Kafka classpath names something that does not exist: {entry}")


def find_classpath(explicit: str | Sequence[str] | None = None) -> list[str]:
    """The server's jars, in a fixed order (see the module docstring for where they come from).

    Explicit jar lists rather than ``dir/*``: the class-data-sharing archive is only used by a JVM whose
    classpath is the one it was made with, and a sorted list is the same every time.
    """
    if explicit:
        entries = explicit.split(os.pathsep) if isinstance(explicit, str) else list(explicit)
    else:
        env = os.environ.get(CLASSPATH_ENV, "").strip()
        if env:
            entries = env.split(os.pathsep)
        else:
            libs = default_libs_dir()
            if not (libs / SERVER_JAR).is_file():
                raise KafkaServerError(
                    f"no Apache Kafka {KAFKA_VERSION} server jars in {libs}: {INSTALL_HINT}"
                )
            entries = [str(libs)]
    jars = [jar for entry in entries if entry for jar in _jars_of(entry)]
    if not any(Path(j).name.startswith("kafka_2.13-") for j in jars):
        raise KafkaServerError(
            f"no kafka_2.13-*.jar (the Kafka server) on the classpath {entries}: {INSTALL_HINT}"
        )
    return list(dict.fromkeys(jars))


def find_java(explicit: str | None = None) -> str:
    """The ``java`` executable: the argument, then ``$JAVA_HOME/bin/java``, then ``java`` on PATH."""
    try:
        return _find_java(explicit)
    except ZooKeeperServerError as e:
        raise KafkaServerError(f"{e} (Kafka {KAFKA_VERSION} needs Java 17 or newer)") from None


def _cds_archive(java: str, jars: Sequence[str]) -> Path | None:
    """Where the class-data-sharing archive for this Java and these jars lives (it may not exist yet).

    The name hashes the JVM (path, size and mtime of libjvm.so) and every jar (path, size, mtime): the JVM
    refuses an archive made by another build or with other jars (with a warning, and starts slower), so a
    Java upgrade or a new Kafka version simply makes a new one. None if the cache is not writable.
    """
    real = Path(java).resolve()
    libjvm = real.parent.parent / "lib" / "server" / "libjvm.so"
    h = hashlib.sha256()
    for item in (libjvm if libjvm.is_file() else real, *map(Path, jars)):
        try:
            st = item.stat()
        except OSError:
            return None
        h.update(f"{item}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    directory = cache_root() / "kafka-cds"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if not os.access(directory, os.W_OK):
        return None
    return directory / f"kafka-{KAFKA_VERSION}-{h.hexdigest()[:20]}.jsa"


# ---------------------------------------------------------------------------------------------- helpers
def _free_ports(count: int, host: str = _LOOPBACK) -> list[int]:
    """``count`` distinct ports that were free a moment ago (all bound at once, so no two are equal)."""
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind((host, 0))
            ports.append(int(s.getsockname()[1]))
        return ports


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _tail(path: Path, lines: int, offset: int = 0) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(offset, f.tell() - 64 * 1024))
            data = f.read()
    except OSError:
        return "(no log)"
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def _kafka_uuid() -> str:
    """A Kafka cluster id: 16 random bytes in URL-safe base64 without padding (never starting with '-',
    which the storage tool's argument parser would take for an option)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _properties(values: Mapping[str, Any]) -> str:
    return "".join(f"{k}={v}\n" for k, v in values.items())


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read: server configs hold the admin password."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _error_text(e: BaseException) -> str:
    if isinstance(e, KafkaException) and e.args and isinstance(e.args[0], KafkaError):
        err: KafkaError = e.args[0]
        return f"{err.name()}: {err.str()}"
    return str(e) or type(e).__name__


@dataclass(frozen=True)
class BrokerInfo:
    """One node of the cluster as clients and fault injection see it (``pid`` is None while stopped)."""

    id: int
    pid: int | None
    host: str
    port: int
    controller_port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


class _Node:
    """A node's files and process. The cluster object does everything to it under its lock."""

    def __init__(self, node_id: int, directory: Path, host: str = _LOOPBACK) -> None:
        self.id = node_id
        self.host = host
        self.dir = directory
        self.data_dir = directory / "data"
        self.config_path = directory / CONFIG_NAME
        self.log_path = directory / LOG_NAME
        self.port = 0
        self.controller_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_offset = 0
        self.starts = 0
        self.cds_dump: Path | None = None  # the archive this run writes when it exits, until renamed

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def formatted(self) -> bool:
        return (self.data_dir / "meta.properties").is_file()

    def log_since_start(self) -> str:
        try:
            with self.log_path.open("rb") as f:
                f.seek(self.log_offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""


# ---------------------------------------------------------------------------------------------- cleanup
_RUNNING: weakref.WeakSet[KafkaCluster] = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:
    for cluster in list(_RUNNING):
        with contextlib.suppress(Exception):
            cluster.kill_all()


# ---------------------------------------------------------------------------------------------- cluster
class KafkaCluster:
    """A KRaft cluster of ``brokers`` combined broker + controller nodes on 127.0.0.1, owning ``workdir``
    (configs, storage, logs, certificates, ``cluster.json`` with the cluster id and the admin password).

    Ports are chosen at the first :meth:`start`; :meth:`start_broker` after :meth:`kill` or
    :meth:`stop_broker` brings a node back on the same port with the same storage. A workdir that already
    holds a formatted cluster of the same size is started again as it was (``python -m ... --workdir``).

    The defaults suit tests on a small machine: offsets, transaction and share-state topics replicated
    ``min(3, brokers)`` times with few partitions, no initial rebalance delay, one network thread, a broker
    fenced 6 s after its last heartbeat (Kafka's default is 9 s) so a killed leader is replaced sooner.
    ``extra_config`` overrides any server property.
    """

    def __init__(
        self,
        workdir: Path | str,
        brokers: int = 1,
        security: Security = "plaintext",
        *,
        java: str | None = None,
        classpath: str | Sequence[str] | None = None,
        heap_mb: int = 256,
        jvm_args: Iterable[str] = (),
        extra_config: Mapping[str, Any] | None = None,
        class_data_sharing: bool = True,
        die_with_parent: bool = True,
        host: str = _LOOPBACK,
    ) -> None:
        """``host``: the address every node listens on and advertises (127.0.0.1; the chaos suite's
        network gateway when its clients run on hosts of their own, :mod:`trimtab.devkit.netns`)."""
        if brokers < 1:
            raise KafkaServerError(f"a cluster needs at least one broker, not {brokers}")
        if security not in SECURITY_MODES:
            raise KafkaServerError(f"security must be one of {', '.join(SECURITY_MODES)}, not {security!r}")
        self.workdir = Path(workdir).resolve()
        self.size = brokers
        self.security: Security = security
        self.heap_mb = heap_mb
        self.jvm_args = list(jvm_args)
        self.extra_config = dict(extra_config or {})
        self.class_data_sharing = class_data_sharing
        self.die_with_parent = die_with_parent
        self.ready_seconds: float | None = None  # how long the last start() took, for benchmarks and logs
        self._java_arg = java
        self._classpath_arg = classpath
        self._java = ""
        self._jars: list[str] = []
        self._cds: Path | None = None
        self.host = host
        self._nodes = [_Node(i, self.workdir / f"node-{i}", host) for i in range(1, brokers + 1)]
        self._cluster_id = ""
        self.admin_password = ""
        self._admin: Any = None
        self._lock = threading.RLock()
        self._started = False

    # ------------------------------------------------------------------ info
    @property
    def bootstrap_servers(self) -> str:
        """Every node's client listener, ``127.0.0.1:p1,127.0.0.1:p2,...`` (stopped nodes included)."""
        if not self._nodes[0].port:
            raise KafkaServerError("the cluster has no ports yet: start() it first")
        return ",".join(n.address for n in self._nodes)

    @property
    def brokers(self) -> list[BrokerInfo]:
        return [
            BrokerInfo(
                n.id, n.proc.pid if n.running() and n.proc else None, n.host, n.port, n.controller_port
            )
            for n in self._nodes
        ]

    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    @property
    def ca_file(self) -> Path:
        """The CA certificate clients trust (``sasl_ssl`` only; made anew at every :meth:`start`)."""
        return self.workdir / "pki" / "ca.pem"

    def broker(self, broker_id: int) -> BrokerInfo:
        for info in self.brokers:
            if info.id == broker_id:
                return info
        raise KafkaServerError(f"no broker {broker_id} in this cluster (ids 1..{self.size})")

    def is_running(self, broker_id: int) -> bool:
        return self._node(broker_id).running()

    def log_path(self, broker_id: int) -> Path:
        return self._node(broker_id).log_path

    def log_tail(self, broker_id: int, lines: int = 40) -> str:
        return _tail(self._node(broker_id).log_path, lines)

    def client_config(self, user: str | None = None, password: str | None = None) -> dict[str, Any]:
        """The librdkafka settings a client of this cluster needs, ``bootstrap.servers`` included.

        ``sasl_ssl``: SASL_SSL with SCRAM-SHA-512 as ``user`` (the admin when omitted), trusting the cluster's
        CA. ``plaintext``: only the bootstrap servers (``user`` and ``password`` are ignored).
        """
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        if self.security == "sasl_ssl":
            if user is None:
                user, password = ADMIN_USER, self.admin_password
            conf.update(
                {
                    "security.protocol": "SASL_SSL",
                    "sasl.mechanisms": SCRAM_MECHANISM,
                    "sasl.username": user,
                    "sasl.password": password or "",
                    "ssl.ca.location": str(self.ca_file),
                }
            )
        return conf

    def admin_config(self) -> dict[str, Any]:
        """Settings for a client with every right (the super user under ``sasl_ssl``)."""
        return self.client_config()

    def write_client_properties(
        self, path: Path | str, user: str | None = None, password: str | None = None
    ) -> Path:
        """Write :meth:`client_config` without ``bootstrap.servers`` as an owner-only ``key=value`` file: what
        trimtab's ``kafka.client_config_file`` takes (docs/security.md), the password included."""
        conf = {k: v for k, v in self.client_config(user, password).items() if k != "bootstrap.servers"}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_private(path, _properties(conf))
        return path

    def __repr__(self) -> str:
        running = [n.id for n in self._nodes if n.running()]
        return f"KafkaCluster({self.workdir}, brokers={self.size}, {self.security}, running={running})"

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 120.0, *, keep_ports: bool = False) -> KafkaCluster:
        """Format the storage if needed, start every node and wait until each serves all of them.

        ``keep_ports`` (what :meth:`restart` passes): never move to other ports -- a port still held (a
        closed listener's connections in TIME_WAIT, which the JVM binds through) is retried until the
        deadline, because clients know the cluster by its bootstrap servers."""
        with self._lock:
            if any(n.running() for n in self._nodes):
                if all(n.running() for n in self._nodes):
                    return self
                raise KafkaServerError("some brokers are running: start_broker() the others")
            began = time.monotonic()
            deadline = began + timeout
            self._java = find_java(self._java_arg)
            self._jars = find_classpath(self._classpath_arg)
            self._cds = _cds_archive(self._java, self._jars) if self.class_data_sharing else None
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._load_or_create_state()
            (self.workdir / "log4j2.properties").write_text(_LOG4J2)
            # A restart keeps the certificates its clients already trust.
            if self.security == "sasl_ssl" and not (
                keep_ports and (self.workdir / "pki" / "node.p12").is_file()
            ):
                self._make_keystore()
            if not all(n.port for n in self._nodes) or (not keep_ports and not self._ports_free()):
                self._choose_ports()
            self._format(deadline)
            attempt = 0
            while True:
                attempt += 1
                for node in self._nodes:
                    self._spawn(node)
                _RUNNING.add(self)
                self._started = True
                try:
                    self._await_ready(self._nodes, deadline, timeout)
                except _BindFailed:
                    self._kill_nodes(self._nodes)
                    if keep_ports and time.monotonic() < deadline:
                        time.sleep(0.5)  # polling for the ports under the deadline
                        continue
                    if attempt >= 5 or time.monotonic() >= deadline:
                        raise KafkaServerError(
                            f"Kafka could not listen on the ports it was given {attempt} times (last: "
                            f"{self.bootstrap_servers}); something else keeps taking them"
                        ) from None
                    self._choose_ports()  # someone took a port we picked: pick others (storage unchanged)
                    continue
                except BaseException:
                    self._kill_nodes(self._nodes)
                    raise
                self.ready_seconds = time.monotonic() - began
                return self

    def restart(self, timeout: float = 120.0) -> KafkaCluster:
        """Start a cluster stopped by :meth:`close` or :meth:`kill_all` again, on the same ports with the same
        storage (the chaos suite's Kafka outage): clients reconnect to the bootstrap servers they have."""
        with self._lock:
            if not self._started or not all(n.port for n in self._nodes):
                raise KafkaServerError("restart() needs a cluster that was started before: start() it")
            return self.start(timeout, keep_ports=True)

    def start_broker(self, broker_id: int, timeout: float = 90.0) -> BrokerInfo:
        """Start a stopped or killed node again on its port with its storage; wait until it serves."""
        with self._lock:
            node = self._node(broker_id)
            if not self._started:
                raise KafkaServerError("start() the cluster before restarting one of its brokers")
            if node.running():
                return self.broker(broker_id)
            deadline = time.monotonic() + timeout
            while True:
                self._spawn(node)
                try:
                    self._await_ready([node], deadline, timeout)
                    return self.broker(broker_id)
                except _BindFailed:
                    # The port's old socket can linger a moment after a kill, or another process took it:
                    # the quorum and the clients know this node by its port, so wait for it, do not move.
                    self._kill_nodes([node])
                    if time.monotonic() >= deadline:
                        raise KafkaServerError(
                            f"broker {broker_id} cannot listen on {node.address} or its controller port "
                            f"{node.controller_port}: in use by another process (log: {node.log_path})"
                        ) from None
                    time.sleep(0.5)  # polling for the port under the deadline
                except BaseException:
                    self._kill_nodes([node])
                    raise

    def stop_broker(self, broker_id: int, timeout: float = 30.0) -> int | None:
        """SIGTERM (controlled shutdown), then SIGKILL after ``timeout`` s. Returns the exit status."""
        with self._lock:
            node = self._node(broker_id)
            self._signal(node, signal.SIGCONT)  # a paused JVM cannot shut down
            self._signal(node, signal.SIGTERM)
            return self._reap(node, timeout)

    def kill(self, broker_id: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a node's process group: SIGKILL (the default; waits until it is gone) for a crash,
        SIGSTOP/SIGCONT to pause and resume it, SIGTERM for a shutdown you do not wait for."""
        with self._lock:
            node = self._node(broker_id)
            if not node.running():
                raise KafkaServerError(f"broker {broker_id} is not running")
            self._signal(node, sig)
            if sig == signal.SIGKILL:
                self._reap(node, 10.0)

    def close(self, timeout: float = 15.0) -> None:
        """Stop every node: SIGTERM to all at once, SIGKILL to those still running after ``timeout`` s.

        A whole cluster that leaves at once cannot shut down in order: a broker's controlled shutdown waits
        for an active controller, and the last controllers wait (5 s) for a successor, neither of which can
        exist once fewer than a majority of the nodes run. So a node is killed, after a second's grace,
        as soon as its broker has shut down (logs flushed, clean-shutdown markers written) or no majority
        is left to serve it; a kept workdir then recovers a little at its next start.
        """
        with self._lock:
            running = self._running()
            for node in running:
                self._signal(node, signal.SIGCONT)
                self._signal(node, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            stuck_since: float | None = None
            while True:
                left = [n for n in running if n.running()]
                now = time.monotonic()
                if not left or now >= deadline:
                    break
                no_quorum = 2 * len(left) <= self.size
                if self.size > 1 and (no_quorum or all(self._broker_shut_down(n) for n in left)):
                    stuck_since = stuck_since or now
                    if now - stuck_since >= 1.0:
                        break
                else:
                    stuck_since = None
                time.sleep(0.1)  # polling the processes under the deadline
            for node in running:
                self._reap(node, 0.0)
            self._admin = None
            _RUNNING.discard(self)

    def kill_all(self) -> None:
        """SIGKILL every node (the ``atexit`` hook; tests that want a crash of the whole cluster)."""
        with self._lock:
            self._kill_nodes(self._nodes)
            _RUNNING.discard(self)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ topics, users, ACLs
    def create_topics(
        self,
        names: Iterable[str],
        partitions: int = 4,
        replication: int | None = None,
        config: Mapping[str, str] | None = None,
        timeout: float = 60.0,
    ) -> None:
        """Create topics (those that exist already are left as they are) and wait until every partition has
        a leader. ``partitions`` defaults to 4, what the librdkafka mock gives every topic; ``replication`` to
        ``min(3, brokers)``; ``config`` (e.g. ``{"cleanup.policy": "compact"}``) applies to each topic."""
        names = list(dict.fromkeys(names))
        if not names:
            return
        rf = replication if replication is not None else min(3, self.size)
        deadline = time.monotonic() + timeout
        topic_config = {k: str(v) for k, v in (config or {}).items()}
        new = [NewTopic(name, partitions, rf, config=topic_config) for name in names]
        futures = self._admin_client().create_topics(new, request_timeout=timeout, operation_timeout=timeout)
        for name, future in futures.items():
            try:
                future.result(timeout)
            except KafkaException as e:
                err = e.args[0] if e.args else None
                if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue
                raise KafkaServerError(
                    f"cannot create topic {name} on {self.bootstrap_servers}: {_error_text(e)}"
                ) from None

        def led() -> bool:
            md = self._admin_client().list_topics(timeout=max(0.5, min(5.0, deadline - time.monotonic())))
            for name in names:
                t = md.topics.get(name)
                if t is None or t.error is not None or not t.partitions:
                    return False
                if any(p.leader < 0 for p in t.partitions.values()):
                    return False
            return True

        self._poll(led, deadline, f"every partition of {names} has a leader", ignore=(KafkaException,))

    def partition_leader(self, topic: str, partition: int = 0, timeout: float = 10.0) -> int:
        """The id of the broker that leads ``topic``/``partition`` now, as the metadata says (-1: none)."""
        md = self._admin_client().list_topics(topic, timeout=timeout)
        t = md.topics.get(topic)
        if t is None or t.error is not None or partition not in t.partitions:
            raise KafkaServerError(f"no partition {topic}/{partition} on {self.bootstrap_servers}")
        return int(t.partitions[partition].leader)

    def create_user(self, user: str, password: str, *, iterations: int = 4096, timeout: float = 60.0) -> None:
        """Create (or change) the SCRAM-SHA-512 credential of ``user`` and wait until every running broker
        authenticates it: credentials reach the brokers through the metadata log, a moment after the
        controller commits them, and a client that connects in between would be refused."""
        self._require_sasl("create_user")
        deadline = time.monotonic() + timeout
        upsert = UserScramCredentialUpsertion(
            user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, iterations), password.encode()
        )
        futures = self._admin_client().alter_user_scram_credentials([upsert], request_timeout=timeout)
        try:
            futures[user].result(timeout)
        except KafkaException as e:
            raise KafkaServerError(f"cannot create the SCRAM user {user!r}: {_error_text(e)}") from None
        for node in self._running():
            self._poll(
                functools.partial(self._authenticates, node, user, password),
                deadline,
                f"broker {node.id} authenticates the new user {user!r}",
            )

    def create_acls(self, bindings: Sequence[AclBinding], timeout: float = 60.0) -> None:
        """Create ACLs and wait until every running broker's authorizer has them (they too travel through
        the metadata log)."""
        self._require_sasl("create_acls")
        if not bindings:
            return
        deadline = time.monotonic() + timeout
        futures = self._admin_client().create_acls(list(bindings), request_timeout=timeout)
        for binding, future in futures.items():
            try:
                future.result(timeout)
            except KafkaException as e:
                raise KafkaServerError(f"cannot create the ACL {binding}: {_error_text(e)}") from None
        for node in self._running():
            self._poll(
                functools.partial(self._knows_acls, node, set(bindings)),
                deadline,
                f"broker {node.id} knows the new ACLs",
                ignore=(KafkaException,),
            )

    def grant(
        self,
        user: str,
        operations: Iterable[str],
        *,
        topic: str | None = None,
        group: str | None = None,
        prefixed: bool = False,
        timeout: float = 60.0,
    ) -> list[AclBinding]:
        """Allow ``user`` the ``operations`` (``"READ"``, ``"WRITE"``, ``"DESCRIBE"``, ...) on a topic and/or a
        consumer group (names taken as prefixes when ``prefixed``), from any host. Returns the bindings."""
        resources = [("TOPIC", topic), ("GROUP", group)]
        pattern = "PREFIXED" if prefixed else "LITERAL"
        bindings = [
            AclBinding(kind, name, pattern, f"User:{user}", "*", op.upper(), "ALLOW")
            for kind, name in resources
            if name is not None
            for op in operations
        ]
        if not bindings:
            raise KafkaServerError("grant() needs a topic or a group and at least one operation")
        self.create_acls(bindings, timeout)
        return bindings

    # ------------------------------------------------------------------ internals: setup
    def _node(self, broker_id: int) -> _Node:
        for node in self._nodes:
            if node.id == broker_id:
                return node
        raise KafkaServerError(f"no broker {broker_id} in this cluster (ids 1..{self.size})")

    def _running(self) -> list[_Node]:
        return [n for n in self._nodes if n.running()]

    def _require_sasl(self, what: str) -> None:
        if self.security != "sasl_ssl":
            raise KafkaServerError(f"{what}() needs a cluster started with security='sasl_ssl'")

    def _load_or_create_state(self) -> None:
        """The cluster id and the admin password outlive the processes: the storage is formatted with the
        one and holds the SCRAM credential of the other."""
        path = self.workdir / STATE_NAME
        if path.is_file():
            state = json.loads(path.read_text())
            if state.get("brokers") != self.size or state.get("security") != self.security:
                raise KafkaServerError(
                    f"{self.workdir} holds a cluster of {state.get('brokers')} {state.get('security')} "
                    f"broker(s), not {self.size} {self.security}: use another workdir"
                )
            self._cluster_id = str(state["cluster_id"])
            self.admin_password = str(state["admin_password"])
            for node, ports in zip(self._nodes, state.get("ports", []), strict=False):
                if not node.port:
                    node.port, node.controller_port = int(ports[0]), int(ports[1])
            return
        self._cluster_id = self._cluster_id or _kafka_uuid()
        self.admin_password = self.admin_password or secrets.token_hex(16)
        self._save_state()

    def _save_state(self) -> None:
        state = {
            "kafka_version": KAFKA_VERSION,
            "cluster_id": self._cluster_id,
            "brokers": self.size,
            "security": self.security,
            "admin_user": ADMIN_USER,
            "admin_password": self.admin_password,
            "ports": [[n.port, n.controller_port] for n in self._nodes],
        }
        _write_private(self.workdir / STATE_NAME, json.dumps(state, indent=2) + "\n")

    def _ports_free(self) -> bool:
        for node in self._nodes:
            for port in (node.port, node.controller_port):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    try:
                        s.bind((self.host, port))
                    except OSError:
                        return False
        return True

    def _choose_ports(self) -> None:
        ports = _free_ports(2 * self.size, self.host)
        for i, node in enumerate(self._nodes):
            node.port, node.controller_port = ports[2 * i], ports[2 * i + 1]
        self._save_state()

    def _make_keystore(self) -> None:
        """A fresh CA and server certificate, and the PKCS#12 keystore the brokers read them from."""
        pki = make_pki(self.workdir / "pki")
        keystore = self.workdir / "pki" / "node.p12"
        keystore.unlink(missing_ok=True)
        openssl(
            "pkcs12", "-export", "-in", str(pki.cert), "-inkey", str(pki.key), "-certfile", str(pki.ca),
            "-name", "kafka", "-out", str(keystore), "-passout", f"pass:{self._keystore_password}",
            cwd=self.workdir / "pki",
        )  # fmt: skip
        keystore.chmod(0o600)

    @property
    def _keystore_password(self) -> str:
        return hashlib.sha256(f"keystore:{self.admin_password}".encode()).hexdigest()[:24]

    def _server_config(self, node: _Node) -> dict[str, Any]:
        n = self.size
        rf, min_isr = min(3, n), min(2, n)
        voters = ",".join(f"{m.id}@{m.host}:{m.controller_port}" for m in self._nodes)
        listener = "SASL_SSL" if self.security == "sasl_ssl" else "PLAINTEXT"
        cfg: dict[str, Any] = {
            "process.roles": "broker,controller",
            "node.id": node.id,
            "controller.quorum.voters": voters,
            "controller.listener.names": "CONTROLLER",
            "listeners": f"{listener}://{node.host}:{node.port},CONTROLLER://{node.host}:{node.controller_port}",
            "advertised.listeners": f"{listener}://{node.host}:{node.port}",
            "inter.broker.listener.name": listener,
            "log.dirs": node.data_dir,
            # Small thread pools: a 2-core machine runs several of these at once.
            "num.network.threads": 1,
            "num.io.threads": 2,
            "background.threads": 2,
            "num.recovery.threads.per.data.dir": 1,
            "num.replica.fetchers": 1,
            # The log cleaner's dedupe buffer is heap (128 MiB by default): too much for a 256 MiB heap.
            "log.cleaner.dedupe.buffer.size": 8 * 1024 * 1024,
            # Internal topics sized for the cluster, few partitions: created fast on first use.
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": 4,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": 4,
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": min_isr,
            "share.coordinator.state.topic.num.partitions": 4,
            "default.replication.factor": rf,
            "group.initial.rebalance.delay.ms": 0,
            # No JMX MBeans for Kafka's own metrics (JmxReporter is the default): nothing reads them here,
            # and registering thousands of them cost about a second of a 3-node start on 2 cores.
            "metric.reporters": "",
            # Notice a dead broker in 6 s (default 9 s): a killed leader is replaced sooner. Heartbeats every
            # 0.5 s: a starting broker is unfenced at its first heartbeat after it caught up.
            "broker.heartbeat.interval.ms": 500,
            "broker.session.timeout.ms": 6000,
            # Elect the first controller leader (and a new one after a kill) sooner than the 1 s default.
            "controller.quorum.election.timeout.ms": 500,
        }
        if self.security == "plaintext":
            cfg["listener.security.protocol.map"] = "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
        else:
            pw = self.admin_password
            scram = "org.apache.kafka.common.security.scram.ScramLoginModule"
            plain = "org.apache.kafka.common.security.plain.PlainLoginModule"
            cfg.update(
                {
                    "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT",
                    "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
                    "sasl.mechanism.controller.protocol": "PLAIN",
                    "listener.name.sasl_ssl.sasl.enabled.mechanisms": SCRAM_MECHANISM,
                    "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
                        f'{scram} required username="{ADMIN_USER}" password="{pw}";'
                    ),
                    "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
                    "listener.name.controller.plain.sasl.jaas.config": (
                        f'{plain} required username="{ADMIN_USER}" password="{pw}" user_{ADMIN_USER}="{pw}";'
                    ),
                    "ssl.keystore.type": "PKCS12",
                    "ssl.keystore.location": self.workdir / "pki" / "node.p12",
                    "ssl.keystore.password": self._keystore_password,
                    "ssl.key.password": self._keystore_password,
                    "ssl.truststore.type": "PEM",
                    "ssl.truststore.location": self.ca_file,
                    "ssl.client.auth": "none",
                    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                    "super.users": f"User:{ADMIN_USER}",
                    "allow.everyone.if.no.acl.found": "false",
                }
            )
        cfg.update(self.extra_config)
        return cfg

    def _write_config(self, node: _Node) -> None:
        node.dir.mkdir(parents=True, exist_ok=True)
        _write_private(node.config_path, _properties(self._server_config(node)))

    def _jvm(self, main: str, args: Sequence[str], *, dump_to: Path | None = None) -> list[str]:
        cds: list[str] = []
        if dump_to is not None:
            cds = [f"-XX:ArchiveClassesAtExit={dump_to}"]
        elif self._cds is not None and self._cds.is_file():
            cds = [f"-XX:SharedArchiveFile={self._cds}"]
        return [
            self._java,
            f"-Xmx{self.heap_mb}m",
            f"-Xms{min(64, self.heap_mb)}m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-XX:-UsePerfData",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            "-Djava.net.preferIPv4Stack=true",
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
            *cds,
            *self.jvm_args,
            "-cp",
            os.pathsep.join(self._jars),
            main,
            *args,
        ]

    def _popen(self, node: _Node, cmd: list[str], banner: str) -> subprocess.Popen[bytes]:
        proc, node.log_offset = spawn_logged(
            cmd,
            node.log_path,
            banner,
            cwd=node.dir,
            die_with_parent=self.die_with_parent,
            error=KafkaServerError,
        )
        return proc

    def _format(self, deadline: float) -> None:
        """Format the storage of every node that has none, under one cluster id (and, under ``sasl_ssl``,
        with the admin's SCRAM credential in the bootstrap metadata).

        Formatting is a JVM start of its own (a second of CPU), so for a new cluster only node 1 is formatted
        by the storage tool and the others get a copy of its fresh storage with their own ``node.id`` and a new
        ``directory.id`` in ``meta.properties``: with a static quorum nothing else in it names the node (the
        bootstrap checkpoint holds the feature levels and SCRAM credentials, the same for every node).
        """
        todo = [n for n in self._nodes if not n.formatted()]
        if not todo:
            return
        first = self._nodes[0]
        if first in todo:
            self._run_storage_tool([first], deadline)
            for node in todo[1:]:
                self._clone_storage(first, node)
        else:  # node 1 has served already: its storage is no longer a blank one to copy
            self._run_storage_tool(todo, deadline)

    def _clone_storage(self, source: _Node, node: _Node) -> None:
        shutil.rmtree(node.data_dir, ignore_errors=True)
        node.dir.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source.data_dir, node.data_dir)
        meta = node.data_dir / "meta.properties"
        lines = []
        for line in meta.read_text().splitlines():
            key = line.partition("=")[0]
            if key == "node.id":
                line = f"node.id={node.id}"
            elif key == "directory.id":
                line = f"directory.id={_kafka_uuid()}"
            lines.append(line)
        meta.write_text("\n".join(lines) + "\n")
        if f"node.id={node.id}" not in lines:
            raise KafkaServerError(f"unexpected meta.properties in {source.data_dir}: no node.id to rewrite")

    def _run_storage_tool(self, nodes: Sequence[_Node], deadline: float) -> None:
        args = ["format", "--cluster-id", self._cluster_id, "--ignore-formatted"]
        if self.security == "sasl_ssl":
            args += ["--add-scram", f"{SCRAM_MECHANISM}=[name={ADMIN_USER},password={self.admin_password}]"]
        procs: list[tuple[_Node, subprocess.Popen[bytes]]] = []
        try:
            for node in nodes:
                self._write_config(node)
                cmd = self._jvm(STORAGE_TOOL, [*args, "--config", str(node.config_path)])
                procs.append((node, self._popen(node, cmd, f"format storage of node {node.id}")))
            for node, proc in procs:
                try:
                    code = proc.wait(max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise KafkaServerError(
                        f"formatting the storage of Kafka node {node.id} did not finish in time "
                        f"(log: {node.log_path})"
                    ) from None
                if code != 0 or not node.formatted():
                    raise KafkaServerError(
                        f"formatting the storage of Kafka node {node.id} failed with status {code} "
                        f"(log: {node.log_path}){self._java_hint(node)}\n"
                        f"--- last lines of the log ---\n{_tail(node.log_path, 30, node.log_offset)}"
                    )
        finally:
            for _, proc in procs:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5.0)

    def _java_hint(self, node: _Node) -> str:
        if "UnsupportedClassVersionError" in node.log_since_start():
            return f": Kafka {KAFKA_VERSION} needs Java 17 or newer, and {self._java} is older"
        return ""

    # ------------------------------------------------------------------ internals: processes
    def _spawn(self, node: _Node) -> None:
        self._write_config(node)
        dump_to: Path | None = None
        if self._cds is not None and self.size == 1 and not self._cds.is_file():
            # A one-node cluster started without an archive writes one when it exits gracefully (a node of
            # a bigger cluster may be killed at close(), see there, and the dump would be lost).
            dump_to = self._cds.with_name(f"{self._cds.name}.{os.getpid()}-{node.id}.tmp")
            dump_to.unlink(missing_ok=True)
        cmd = self._jvm(MAIN_CLASS, [str(node.config_path)], dump_to=dump_to)
        node.proc = self._popen(node, cmd, f"start #{node.starts + 1} of broker {node.id} on {node.address}")
        node.cds_dump = dump_to
        node.starts += 1

    def _signal(self, node: _Node, sig: int) -> None:
        if node.proc is not None and node.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(node.proc.pid, sig)

    def _reap(self, node: _Node, timeout: float) -> int | None:
        """Wait for a node's process to end (SIGKILL after ``timeout``) and keep the archive it wrote."""
        proc = node.proc
        if proc is None:
            return None
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal(node, signal.SIGKILL)
            proc.wait(10.0)
        dump, node.cds_dump = node.cds_dump, None
        if dump is not None and self._cds is not None:
            # Written by the JVM on its way out; a process that was killed may have left half of one.
            if proc.returncode >= 0 and dump.is_file() and dump.stat().st_size > 0:
                with contextlib.suppress(OSError):
                    os.replace(dump, self._cds)
            dump.unlink(missing_ok=True)
        return proc.returncode

    def _broker_shut_down(self, node: _Node) -> bool:
        return f"[BrokerServer id={node.id}] shut down completed" in node.log_since_start()

    def _kill_nodes(self, nodes: Iterable[_Node]) -> None:
        for node in nodes:
            self._signal(node, signal.SIGCONT)
            self._signal(node, signal.SIGKILL)
        for node in nodes:
            self._reap(node, 10.0)

    # ------------------------------------------------------------------ internals: clients, readiness
    def _client_base(self) -> dict[str, Any]:
        """Quiet clients that retry connections quickly (librdkafka backs off up to 10 s by default)."""
        return {
            "log_level": 0,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
            "error_cb": lambda err: None,
        }

    def _admin_client(self) -> Any:
        if self._admin is None:
            if not self._started:
                raise KafkaServerError("the cluster is not started: start() it first")
            self._admin = AdminClient({**self.admin_config(), **self._client_base()})
        return self._admin

    def _node_admin(self, node: _Node, user: str | None = None, password: str | None = None) -> Any:
        conf = {**self.client_config(user, password), **self._client_base()}
        conf["bootstrap.servers"] = node.address
        return AdminClient(conf)

    def _knows_acls(self, node: _Node, wanted: set[AclBinding]) -> bool:
        # None matches anything in a filter (the stubs say str).
        everything = AclBindingFilter("ANY", None, "ANY", None, None, "ANY", "ANY")  # type: ignore[arg-type]
        admin = self._node_admin(node)  # referenced until the answer is in: a destroyed client fails it
        found = admin.describe_acls(everything, request_timeout=5).result(5)
        return wanted <= set(found)

    def _authenticates(self, node: _Node, user: str, password: str) -> bool:
        try:
            self._node_admin(node, user, password).list_topics(timeout=3)
        except KafkaException:
            return False
        return True

    def _poll(
        self,
        predicate: Callable[[], _T],
        deadline: float,
        what: str,
        *,
        ignore: tuple[type[BaseException], ...] = (),
    ) -> _T:
        interval = 0.02
        last: object = None
        while True:
            try:
                value = predicate()
            except ignore as e:
                last, value = _error_text(e), None
            if value:
                return value
            if time.monotonic() >= deadline:
                raise KafkaServerError(f"timed out waiting until {what} (last: {last})")
            time.sleep(interval)  # polling a condition under a deadline
            interval = min(interval * 1.5, 0.25)

    def _await_ready(self, nodes: Sequence[_Node], deadline: float, timeout: float) -> None:
        """Until each of ``nodes`` answers a metadata request on its own listener with every running
        broker in it, or a node exits (:class:`_BindFailed` if it could not listen), or the deadline."""
        pending = list(nodes)
        errors: dict[int, str] = {}
        interval = 0.05
        while pending:
            for node in list(pending):
                assert node.proc is not None
                if node.proc.poll() is not None:
                    self._exited(node)
                if not _accepts(node.host, node.port):
                    errors[node.id] = "its listener does not accept connections yet"
                    continue
                expected = {n.id for n in self._nodes if n.running()}
                # A new client each time: its first request can only go to the one broker it knows, so
                # the answer is this node's own view (not another broker's, which may still list a node
                # that was killed a moment ago and is not back yet).
                admin = self._node_admin(node)
                try:
                    md = admin.list_topics(timeout=max(0.5, min(3.0, deadline - time.monotonic())))
                except KafkaException as e:
                    errors[node.id] = _error_text(e)
                    continue
                seen = set(md.brokers)
                if md.orig_broker_id != node.id:
                    errors[node.id] = f"broker {md.orig_broker_id} answered in its place"
                elif expected <= seen:
                    pending.remove(node)
                else:
                    errors[node.id] = f"it answered with brokers {sorted(seen)} of {sorted(expected)}"
            if not pending:
                return
            if time.monotonic() >= deadline:
                node = pending[0]
                raise KafkaServerError(
                    f"Kafka broker {node.id} on {node.address} was not ready within {timeout:.0f}s: "
                    f"{errors.get(node.id, 'no answer')} (log: {node.log_path}).\n"
                    f"--- last lines of the log ---\n{_tail(node.log_path, 40, node.log_offset)}"
                )
            time.sleep(interval)  # polling a condition under a deadline
            interval = min(interval * 1.5, 0.25)

    def _exited(self, node: _Node) -> None:
        assert node.proc is not None
        code = node.proc.poll()
        text = node.log_since_start()
        if "Address already in use" in text or "BindException" in text:
            raise _BindFailed(node.id)
        raise KafkaServerError(
            f"Kafka broker {node.id} on {node.address} exited with status {code} while starting "
            f"(log: {node.log_path}){self._java_hint(node)}\n"
            f"--- last lines of the log ---\n{_tail(node.log_path, 40, node.log_offset)}"
        )


class _BindFailed(DevKitError):
    """A node could not bind one of its ports (someone took it after we chose it)."""


# ---------------------------------------------------------------------------------------------- standalone
def main(argv: Sequence[str] | None = None) -> int:
    """Run a cluster until Ctrl-C (or SIGTERM); the bootstrap servers go to stdout, the rest to stderr."""
    parser = argparse.ArgumentParser(
        prog="python -m trimtab.devkit.kafka_server",
        description=f"Run a real Apache Kafka {KAFKA_VERSION} cluster (KRaft) on 127.0.0.1 until Ctrl-C.",
    )
    parser.add_argument(
        "--brokers", type=int, default=1, help="nodes, each broker and controller (default 1)"
    )
    parser.add_argument("--security", choices=SECURITY_MODES, default="plaintext")
    parser.add_argument(
        "--workdir", type=Path, help="keep configs, storage and logs here (default: a temp dir)"
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness")
    parser.add_argument("--check", action="store_true", help="start, print the time to ready, stop")
    args = parser.parse_args(argv)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="trimtab-kafka-"))
    cluster = KafkaCluster(workdir, brokers=args.brokers, security=args.security)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        cluster.start(timeout=args.timeout)
        ready = cluster.ready_seconds or 0.0
        what = f"{args.brokers} broker(s), {args.security}"
        if args.check:
            print(
                f"Apache Kafka {KAFKA_VERSION} ({what}) ready in {ready:.1f}s on {cluster.bootstrap_servers}"
            )
            return 0
        print(cluster.bootstrap_servers, flush=True)
        err = sys.stderr
        print(f"Apache Kafka {KAFKA_VERSION} ({what}) ready in {ready:.1f}s; workdir {workdir}", file=err)
        for b in cluster.brokers:
            print(f"  broker {b.id}: {b.address} pid {b.pid} log {cluster.log_path(b.id)}", file=err)
        if args.security == "sasl_ssl":
            print(f"  admin client settings: {json.dumps(cluster.admin_config())}", file=err)
        print("Ctrl-C stops it.", file=err, flush=True)
        reported: set[int] = set()
        while not stop.wait(1.0):
            for b in cluster.brokers:
                if b.pid is None and b.id not in reported:
                    reported.add(b.id)
                    print(f"broker {b.id} exited (log: {cluster.log_path(b.id)})", file=err, flush=True)
        return 0
    except DevKitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        cluster.close()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
