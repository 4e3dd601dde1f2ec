"""A real, standalone ZooKeeper server as a child process: for the test fixtures and ``trimtab dev up``.

No pytest here, and no kazoo at import time. The server is ``org.apache.zookeeper.server.ZooKeeperServerMain``
(standalone, no quorum) started with the machine's Java and one of these classpaths, first found wins:

1. the ``classpath`` argument;
2. ``$TRIMTAB_ZK_CLASSPATH`` (a ``:``-separated list of jars, as for ``java -cp``);
3. Debian's ``zookeeper`` package: the minimal set of unversioned jars in ``/usr/share/java`` (the netty
   jars are required: without them every client connection dies with ``NoClassDefFoundError``);
4. the ZooKeeper jars that an installed ``pyspark`` wheel ships in ``pyspark/jars``.

Readiness is polled, never slept for: the server is up when it answers the ``ruok`` four-letter word with
``imok`` *and* ``srvr`` reports a mode (ZooKeeper answers ``ruok`` a little before it serves requests).

The server runs in its own process group (so a Ctrl-C in the terminal that started the dev cluster does
not reach it before we stop it in order) and writes its log to ``<data_dir>/zookeeper.log``; errors carry
the tail of that log. Servers still running when the interpreter exits are killed by an ``atexit`` hook,
and on Linux a server started from the main thread also dies with its parent (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from trimtab.devkit.procs import spawn_logged
from trimtab.errors import DevKitError

MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
CLASSPATH_ENV = "TRIMTAB_ZK_CLASSPATH"
DEBIAN_JAVA_DIR = Path("/usr/share/java")
# The minimal working set from Debian's zookeeper package (unversioned symlinks, all must exist).
DEBIAN_JARS: tuple[str, ...] = (
    "zookeeper.jar",
    "zookeeper-jute.jar",
    "slf4j-api.jar",
    "slf4j-simple.jar",
    "commons-cli.jar",
    "metrics-core.jar",
    "snappy-java.jar",
    "netty-buffer.jar",
    "netty-codec.jar",
    "netty-common.jar",
    "netty-handler.jar",
    "netty-resolver.jar",
    "netty-transport.jar",
    "netty-transport-native-epoll.jar",
    "netty-transport-native-unix-common.jar",
)
# Jars taken from pyspark/jars. The first two groups are required; the others are what ZooKeeper's
# server links against (logging backend, metrics, compression, command line) when present.
PYSPARK_REQUIRED: tuple[str, ...] = ("zookeeper-[0-9]*.jar", "zookeeper-jute-*.jar", "netty-*.jar")
PYSPARK_OPTIONAL: tuple[str, ...] = (
    "slf4j-api-*.jar",
    "log4j-slf4j*-impl-*.jar",
    "log4j-api-*.jar",
    "log4j-core-*.jar",
    "metrics-core-*.jar",
    "snappy-java-*.jar",
    "commons-cli-*.jar",
    "commons-io-*.jar",
)
INSTALL_HINT = (
    "install ZooKeeper with `apt-get install zookeeper` (Debian/Ubuntu: jars in /usr/share/java) or run "
    "`bash scripts/setup.sh`, or point $TRIMTAB_ZK_CLASSPATH at the ZooKeeper server jars "
    "(zookeeper, zookeeper-jute, netty-*, slf4j-*)"
)
LOG_NAME = "zookeeper.log"
CONFIG_NAME = "zoo.cfg"
_LOOPBACK = "127.0.0.1"


class ZooKeeperServerError(DevKitError):
    """The server could not be found, started or stopped; the message says what to do."""


# ---------------------------------------------------------------------------------------------- discovery
def _debian_classpath() -> list[str] | None:
    jars = [DEBIAN_JAVA_DIR / name for name in DEBIAN_JARS]
    if all(j.is_file() for j in jars):
        return [str(j) for j in jars]
    return None


def _pyspark_classpath() -> list[str] | None:
    try:
        spec = importlib.util.find_spec("pyspark")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        jar_dir = Path(location) / "jars"
        if not jar_dir.is_dir():
            continue
        found: list[str] = []
        for pattern in PYSPARK_REQUIRED:
            matches = sorted(str(p) for p in jar_dir.glob(pattern))
            if not matches:
                break
            found.extend(matches)
        else:
            for pattern in PYSPARK_OPTIONAL:
                found.extend(sorted(str(p) for p in jar_dir.glob(pattern)))
            return list(dict.fromkeys(found))
    return None


def find_classpath(explicit: str | Sequence[str] | None = None) -> str:
    """The server classpath (see the module docstring for the order); raises with an install hint."""
    if explicit:
        return explicit if isinstance(explicit, str) else os.pathsep.join(explicit)
    env = os.environ.get(CLASSPATH_ENV, "").strip()
    if env:
        missing = [
            p for p in env.split(os.pathsep) if p and not any(ch in p for ch in "*?") and not Path(p).exists()
        ]
        if missing:
            raise ZooKeeperServerError(f"${CLASSPATH_ENV} names jars that do not exist: {missing}")
        return env
    for source in (_debian_classpath, _pyspark_classpath):
        jars = source()
        if jars:
            return os.pathsep.join(jars)
    raise ZooKeeperServerError(f"no ZooKeeper server jars found: {INSTALL_HINT}")


def find_java(explicit: str | None = None) -> str:
    """The ``java`` executable: the argument, then ``$JAVA_HOME/bin/java``, then ``java`` on PATH."""
    if explicit:
        return explicit
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    on_path = shutil.which("java")
    if on_path:
        return on_path
    raise ZooKeeperServerError(
        "no Java runtime found (checked $JAVA_HOME/bin/java and PATH): install Java 17 "
        "(`apt-get install openjdk-17-jre-headless` or `bash scripts/setup.sh`)"
    )


# ---------------------------------------------------------------------------------------------- probing
def free_port(host: str = _LOOPBACK) -> int:
    """A port that was free a moment ago (the caller retries if someone else takes it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def four_letter_word(host: str, port: int, word: str, timeout: float = 1.0) -> str:
    """Send a ZooKeeper four-letter word and return the whole answer ('' if the server closed at once)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(word.encode("ascii"))
        s.shutdown(socket.SHUT_WR)
        chunks: list[bytes] = []
        while True:
            data = s.recv(4096)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks).decode("utf-8", "replace")


def _tail(path: Path, lines: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read()
    except OSError:
        return "(no log)"
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


# ---------------------------------------------------------------------------------------------- cleanup
_RUNNING: weakref.WeakSet[ZooKeeperServer] = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_RUNNING):
        with contextlib.suppress(Exception):
            server.kill()


# ---------------------------------------------------------------------------------------------- server
class ZooKeeperServer:
    """One ZooKeeper server on ``address`` (127.0.0.1 unless it runs in a host of its own), owning
    ``data_dir`` (config, data, log): standalone, or member ``myid`` of ``quorum`` (id -> ``ip:peer:election``;
    :class:`ZooKeeperEnsemble` builds those). ``run_in`` is the argv prefix that runs it somewhere else (a
    network namespace: ``Network.argv``).

    ``port=0`` picks a free port at the first :meth:`start`; :meth:`restart` keeps it (and the data), so
    clients reconnect to the same address and find what they wrote.

    ``tick_ms`` is 100: ZooKeeper expires sessions on its tick grid, rounding each deadline up to the next
    tick, so a dead client is noticed up to a tick after its session timeout. With 500 ms the failover
    benchmark's detection read 3.88 - 4.33 s for a 4-s session; with 100 ms, 3.64 - 4.02 s.
    """

    def __init__(
        self,
        data_dir: Path | str,
        port: int = 0,
        *,
        tick_ms: int = 100,
        min_session_ms: int = 1000,
        max_session_ms: int = 60_000,
        java: str | None = None,
        classpath: str | Sequence[str] | None = None,
        force_sync: bool = False,
        heap_mb: int = 256,
        jvm_args: Iterable[str] = (),
        extra_config: Mapping[str, Any] | None = None,
        die_with_parent: bool = True,
        address: str = _LOOPBACK,
        run_in: Sequence[str] = (),
        myid: int | None = None,
        quorum: Mapping[int, str] | None = None,
    ) -> None:
        if (myid is None) != (quorum is None) or (quorum is not None and myid not in quorum):
            raise ZooKeeperServerError("a quorum member needs its myid among the quorum's ids")
        self.address = address
        self.run_in = list(run_in)
        self.myid = myid
        self.quorum = dict(quorum) if quorum is not None else None
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self._auto_port = port == 0
        self.tick_ms = tick_ms
        self.min_session_ms = min_session_ms
        self.max_session_ms = max_session_ms
        self._java = java
        self._classpath = classpath
        # fsync off survives a killed server (the page cache keeps the writes), not a machine crash:
        # right for tests and the dev cluster, wrong for production (which does not use this class).
        self.force_sync = force_sync
        self.heap_mb = heap_mb
        self.jvm_args = list(jvm_args)
        self.extra_config = dict(extra_config or {})
        self.die_with_parent = die_with_parent
        self.log_path = self.data_dir / LOG_NAME
        self.config_path = self.data_dir / CONFIG_NAME
        self.starts = 0
        self._restarting = False
        self._log_offset = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ info
    @property
    def host(self) -> str:
        return self.address

    @property
    def hosts(self) -> str:
        """The kazoo/ZooKeeper connect string, ``<address>:<port>`` (append a chroot as needed)."""
        if not self.port:
            raise ZooKeeperServerError("the server has no port yet: start() it first")
        return f"{self.address}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines)

    def _log_since_start(self) -> str:
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._log_offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def four_letter_word(self, word: str, timeout: float = 1.0) -> str:
        return four_letter_word(self.address, self.port, word, timeout)

    def mode(self) -> str | None:
        """``leader``, ``follower`` or ``standalone`` while it serves; None when it does not (a quorum
        member without a quorum, a stopped server)."""
        try:
            answer = self.four_letter_word("srvr")
        except OSError:
            return None
        for line in answer.splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None

    def is_serving(self) -> bool:
        """True if *this* server answers on its port right now: ``ruok`` is ``imok``, ``srvr`` reports a
        mode, and ``envi`` shows our data dir as the working directory (not someone else on the port)."""
        if not self.port or not self.is_running():
            return False
        try:
            return (
                self.four_letter_word("ruok") == "imok"
                and "Mode:" in self.four_letter_word("srvr")
                and f"user.dir={self.data_dir}\n" in self.four_letter_word("envi")
            )
        except OSError:
            return False

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"ZooKeeperServer({self.data_dir}, port={self.port}, {state}, pid={self.pid})"

    # ------------------------------------------------------------------ lifecycle
    def _write_config(self) -> None:
        data = self.data_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        cfg: dict[str, Any] = {
            "tickTime": self.tick_ms,
            "dataDir": data,
            "clientPort": self.port,
            "clientPortAddress": self.address,
            "maxClientCnxns": 0,
            "admin.enableServer": "false",
            "4lw.commands.whitelist": "ruok,srvr,mntr,stat,cons,envi",
            "minSessionTimeout": self.min_session_ms,
            "maxSessionTimeout": self.max_session_ms,
            "forceSync": "yes" if self.force_sync else "no",
            "autopurge.snapRetainCount": 3,
            "autopurge.purgeInterval": 1,
            **self.extra_config,
        }
        if self.quorum is not None:
            # Ticks of 100 ms: a follower has 5 s to connect and sync to a new leader, 2 s to answer it.
            cfg |= {"initLimit": 50, "syncLimit": 20}
            cfg |= {f"server.{i}": peer for i, peer in sorted(self.quorum.items())}
            (data / "myid").write_text(f"{self.myid}\n")
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in cfg.items()))

    def _command(self) -> list[str]:
        return [
            *self.run_in,
            find_java(self._java),
            f"-Xmx{self.heap_mb}m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.net.preferIPv4Stack=true",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd HH:mm:ss.SSS",
            *self.jvm_args,
            "-cp",
            find_classpath(self._classpath),
            MAIN_CLASS if self.quorum is None else QUORUM_MAIN_CLASS,
            str(self.config_path),
        ]

    def _spawn(self) -> subprocess.Popen[bytes]:
        cmd = self._command()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        proc, self._log_offset = spawn_logged(
            cmd,
            self.log_path,
            f"start #{self.starts + 1} on port {self.port}",
            cwd=self.data_dir,
            die_with_parent=self.die_with_parent,
            error=ZooKeeperServerError,
        )
        return proc

    def start(self, timeout: float = 30.0) -> ZooKeeperServer:
        """Start the server and wait until it serves. Idempotent if it is already running."""
        with self._lock:
            if self.is_running():
                return self
            deadline = time.monotonic() + timeout
            attempt = 0
            while True:
                attempt += 1
                if self._auto_port and (self.port == 0 or attempt > 1):
                    self.port = free_port()
                self._proc = self._spawn()
                self.starts += 1
                _RUNNING.add(self)
                outcome = self._wait_serving(deadline)
                if outcome == "serving":
                    return self
                bind_failed = "Address already in use" in self._log_since_start()
                if outcome == "exited" and bind_failed and time.monotonic() < deadline:
                    if self._auto_port:
                        continue  # someone took the free port we picked: pick another
                    if self._restarting:
                        time.sleep(0.1)  # the old socket lingers a moment after a kill: try again
                        continue
                code = self._proc.poll()
                self._terminate(signal.SIGKILL, 5.0)
                if outcome == "timeout":
                    what = f"did not serve within {timeout}s"
                elif bind_failed:
                    what = f"could not listen: port {self.port} is in use"
                else:
                    what = f"exited with status {code}"
                raise ZooKeeperServerError(
                    f"ZooKeeper on {self.address}:{self.port} {what} (log: {self.log_path}).\n"
                    f"--- last lines of the log ---\n{self.log_tail(40)}"
                )

    def spawn(self) -> None:
        """Start the process without waiting for it to serve: a quorum member serves only once a majority
        of its ensemble runs, so :class:`ZooKeeperEnsemble` spawns them all, then waits for each."""
        with self._lock:
            if self.is_running():
                return
            if not self.port:
                raise ZooKeeperServerError("an ensemble member needs its port chosen before it is spawned")
            self._proc = self._spawn()
            self.starts += 1
            _RUNNING.add(self)

    def wait_serving(self, timeout: float = 30.0) -> None:
        """Wait until the spawned server serves; raises with the tail of its log if it exits or times out."""
        outcome = self._wait_serving(time.monotonic() + timeout)
        if outcome != "serving":
            what = "exited" if outcome == "exited" else f"did not serve within {timeout}s"
            raise ZooKeeperServerError(
                f"ZooKeeper server {self.myid} on {self.address}:{self.port} {what} (log: {self.log_path}).\n"
                f"--- last lines of the log ---\n{self.log_tail(40)}"
            )

    def _wait_serving(self, deadline: float) -> str:
        assert self._proc is not None
        interval = 0.02
        while True:
            if self._proc.poll() is not None:
                return "exited"
            if self.is_serving():
                return "serving"
            if time.monotonic() >= deadline:
                return "timeout"
            time.sleep(interval)  # polling a condition under a deadline
            interval = min(interval * 1.5, 0.2)

    def _terminate(self, sig: signal.Signals, timeout: float) -> int | None:
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5.0)
        _RUNNING.discard(self)
        return proc.returncode

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds. Returns the exit status (None if never run)."""
        with self._lock:
            return self._terminate(signal.SIGTERM, timeout)

    def kill(self) -> int | None:
        """SIGKILL, no goodbye (fault injection: sessions stay open on the server until it restarts)."""
        with self._lock:
            return self._terminate(signal.SIGKILL, 5.0)

    def restart(self, timeout: float = 30.0, *, kill: bool = False) -> ZooKeeperServer:
        """Stop (or kill) and start again on the same port with the same data."""
        with self._lock:
            if kill:
                self.kill()
            else:
                self.stop()
            was_auto, self._auto_port = self._auto_port, False
            self._restarting = True
            try:
                return self.start(timeout)
            finally:
                self._auto_port = was_auto
                self._restarting = False

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# ---------------------------------------------------------------------------------------------- ensemble
class ZooKeeperEnsemble:
    """Three (or any odd number of) ZooKeeper servers in one quorum: a leader change can happen under
    trimtab (issue 31). Each server is on its own address and ports -- loopback with free ports, or, with
    ``hosts`` (``(address, argv prefix)`` per server, e.g. a network namespace each), the standard ports on
    each host's address, so links between members can be cut.

    :attr:`connect` is the connect string listing every member; :meth:`leader` finds the current leader by
    asking each member's ``srvr``; killing it makes the others elect a new one."""

    def __init__(
        self,
        data_dir: Path | str,
        size: int = 3,
        *,
        hosts: Sequence[tuple[str, Sequence[str]]] | None = None,
        **server_kw: Any,
    ) -> None:
        if size < 1 or size % 2 == 0 or size > 9:
            raise ZooKeeperServerError(f"an ensemble of {size}: use an odd number from 1 to 9")
        if hosts is not None and len(hosts) != size:
            raise ZooKeeperServerError(f"{len(hosts)} hosts for an ensemble of {size}")
        root = Path(data_dir)
        places = list(hosts) if hosts is not None else [(_LOOPBACK, ())] * size
        ports: list[tuple[int, int, int]] = []
        for address, _ in places:
            if hosts is not None:
                ports.append((2181, 2888, 3888))
            else:
                ports.append((free_port(address), free_port(address), free_port(address)))
        quorum = {
            i + 1: f"{a}:{p[1]}:{p[2]}" for i, ((a, _), p) in enumerate(zip(places, ports, strict=True))
        }
        self.servers = [
            ZooKeeperServer(
                root / f"zk{i + 1}",
                ports[i][0],
                address=address,
                run_in=run_in,
                myid=i + 1,
                quorum=quorum,
                **server_kw,
            )
            for i, (address, run_in) in enumerate(places)
        ]

    @property
    def connect(self) -> str:
        """Every member's client address, the connect string for kazoo and trimtab's settings."""
        return ",".join(s.hosts for s in self.servers)

    def start(self, timeout: float = 60.0) -> ZooKeeperEnsemble:
        for s in self.servers:
            s.spawn()
        for s in self.servers:
            s.wait_serving(timeout)
        return self

    def leader(self) -> int | None:
        """The index of the member that leads now, or None while there is no leader."""
        for i, s in enumerate(self.servers):
            if s.is_running() and s.mode() == "leader":
                return i
        return None

    def restart(self, i: int, timeout: float = 60.0) -> None:
        """Start member ``i`` again (same ports and data) and wait until it serves."""
        self.servers[i].spawn()
        self.servers[i].wait_serving(timeout)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def __enter__(self) -> ZooKeeperEnsemble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------------------------------------- sessions
def expire_session(hosts: str, client_id: tuple[int, bytes], timeout: float = 10.0) -> None:
    """Expire a ZooKeeper session on the *server*, as a real expiry would.

    Opens a second connection that resumes the victim's session (``client_id`` is ``(session id,
    password)``, e.g. ``victim.client_id``) and closes it: the server ends the session, drops its
    ephemeral nodes and tells the victim, which goes LOST. (kazoo's harness ``expire_session`` only fakes
    it on the client side; the server keeps the session and its ephemerals until the timeout.)
    """
    from kazoo.client import KazooClient

    twin = KazooClient(hosts=hosts, client_id=client_id, timeout=timeout)
    try:
        twin.start(timeout=timeout)
        twin.stop()
    finally:
        twin.close()
