"""A real Prometheus server as a child process: the local cluster's (``trimtab dev up``) and the tests'.

Nothing about trimtab's alerting is known to work until a real Prometheus has evaluated it, so the dev
cluster runs one beside its nodes, with the very alert rules operators load (``deploy/prometheus/
alerts.yml``). The binary is Debian's ``prometheus`` package (``scripts/setup.sh`` installs it; found as
``$TRIMTAB_PROMETHEUS``, then ``prometheus`` on PATH, then ``/usr/bin/prometheus``).

The server listens on a free loopback port, keeps its config, targets, data and log under its own
directory (inside the cluster's workdir), runs in its own process group and dies with its parent (as the
ZooKeeper launcher's server does). Targets are file-based service discovery files rewritten atomically
whenever the cluster adds a node: Prometheus watches them, so no reload is needed, and a node that died
stays a target (its ``up`` is 0: what ``TrimtabAgentDown`` alerts on).

``/metrics`` is public on every node (cluster/auth.py: orchestrators and Prometheus reach it without a
secret), so the scrape configuration carries no token even though the local cluster runs with security
on; it does trust the cluster's CA when the nodes serve HTTPS.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from trimtab.devkit.procs import die_with_parent_hook, open_log
from trimtab.devkit.zkserver import free_port
from trimtab.errors import DevKitError

BINARY_ENV = "TRIMTAB_PROMETHEUS"
DEBIAN_BINARY = Path("/usr/bin/prometheus")
#: The repository's deploy/ folder: the dev kit ships with the repository only, never in the wheel.
DEPLOY_DIR = Path(__file__).resolve().parent.parent / "deploy"
#: The alert rules operators load (and docker-compose mounts): the dev cluster loads exactly these.
ALERT_RULES = DEPLOY_DIR / "prometheus" / "alerts.yml"
#: The scrape jobs, named as in deploy/prometheus/prometheus.yml (alerts and dashboards select on them).
AGENT_JOB = "trimtab-agent"
CONTROLLER_JOB = "trimtab-controller"
INSTALL_HINT = (
    "install Prometheus with `apt-get install prometheus` (Debian/Ubuntu) or `bash scripts/setup.sh`, or "
    f"point ${BINARY_ENV} at a prometheus binary"
)
_LOOPBACK = "127.0.0.1"


class PrometheusError(DevKitError):
    """The server could not be found or started, or its API answered with an error."""


def find_prometheus(explicit: str | None = None) -> str | None:
    """The prometheus executable (see the module docstring for the order), or None."""
    for candidate in (explicit, os.environ.get(BINARY_ENV), shutil.which("prometheus"), str(DEBIAN_BINARY)):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def find_promtool() -> str | None:
    """``promtool``, installed beside prometheus by the same package."""
    binary = find_prometheus()
    beside = Path(binary).with_name("promtool") if binary else None
    if beside is not None and beside.is_file():
        return str(beside)
    return shutil.which("promtool")


@dataclass(frozen=True)
class Target:
    """One scrape target: a node's ``host:port``, its scheme and the labels a person recognises it by."""

    address: str
    scheme: str = "http"
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PrometheusOptions:
    """How the local cluster's Prometheus runs. Short intervals, because a demo (and a test) must see a
    killed agent as down within seconds, and a handful of loopback targets costs nothing to scrape."""

    rules: tuple[Path, ...] = (ALERT_RULES,)
    scrape_interval_s: float = 2.0
    evaluation_interval_s: float = 2.0
    binary: str | None = None


_RUNNING: weakref.WeakSet[PrometheusServer] = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_RUNNING):
        with contextlib.suppress(Exception):
            server.stop(timeout=1.0)


def _duration(seconds: float) -> str:
    """A Prometheus duration (whole milliseconds: ``1500ms``; Prometheus rejects fractions)."""
    return f"{max(1, round(seconds * 1000))}ms"


class PrometheusServer:
    """One Prometheus server on 127.0.0.1 owning ``data_dir`` (config, targets, TSDB, log)."""

    def __init__(
        self, data_dir: Path | str, options: PrometheusOptions | None = None, *, ca_file: str | None = None
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.options = options or PrometheusOptions()
        self.ca_file = ca_file
        self.port = 0
        self.config_path = self.data_dir / "prometheus.yml"
        self.targets_dir = self.data_dir / "targets"
        self.log_path = self.data_dir / "prometheus.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._http = httpx.Client(timeout=10)

    # ------------------------------------------------------------------ info
    @property
    def url(self) -> str:
        return f"http://{_LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # ------------------------------------------------------------------ configuration
    def config(self) -> dict[str, Any]:
        """The configuration this server runs with (promtool checks it in the tests)."""
        o = self.options
        interval = _duration(o.scrape_interval_s)
        jobs = []
        for job in (AGENT_JOB, CONTROLLER_JOB):
            scrape: dict[str, Any] = {
                "job_name": job,
                "metrics_path": "/metrics",
                # Re-read on change (inotify); the refresh interval is only the fallback.
                "file_sd_configs": [
                    {"files": [str(self.targets_dir / f"{job}.json")], "refresh_interval": "5s"}
                ],
            }
            if self.ca_file:
                scrape["tls_config"] = {"ca_file": self.ca_file}
            jobs.append(scrape)
        return {
            "global": {
                "scrape_interval": interval,
                # A scrape must end before the next one starts (the default, 10s, would be refused).
                "scrape_timeout": _duration(min(o.scrape_interval_s, 10.0)),
                "evaluation_interval": _duration(o.evaluation_interval_s),
                "external_labels": {"cluster": "trimtab-dev"},
            },
            "rule_files": [str(Path(r).resolve()) for r in o.rules],
            "scrape_configs": jobs,
        }

    def set_targets(self, jobs: Mapping[str, Sequence[Target]]) -> None:
        """Replace the targets of the given jobs (file service discovery: each file is replaced whole, by a
        rename, so Prometheus never reads half of one)."""
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        for job, targets in jobs.items():
            groups = [
                {"targets": [t.address], "labels": {"__scheme__": t.scheme, **t.labels}} for t in targets
            ]
            path = self.targets_dir / f"{job}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(orjson.dumps(groups, option=orjson.OPT_INDENT_2))
            tmp.replace(path)

    def write_config(self) -> Path:
        """Write the configuration (and empty target files where there are none yet); its path."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # JSON is YAML: no YAML writer is needed (and none is a runtime dependency).
        self.config_path.write_bytes(orjson.dumps(self.config(), option=orjson.OPT_INDENT_2))
        for job in (AGENT_JOB, CONTROLLER_JOB):
            if not (self.targets_dir / f"{job}.json").exists():
                self.set_targets({job: []})
        return self.config_path

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 30.0, attempts: int = 3) -> PrometheusServer:
        """Start and wait until ``/-/ready``; another free port if the chosen one was taken meanwhile."""
        binary = find_prometheus(self.options.binary)
        if binary is None:
            raise PrometheusError(f"no prometheus binary found: {INSTALL_HINT}")
        self.write_config()
        for attempt in range(attempts):
            self.port = free_port()
            self._launch(binary)
            if self._wait_ready(timeout):
                _RUNNING.add(self)
                return self
            busy = "address already in use" in self.log_tail(5)
            self.stop()
            if not busy or attempt == attempts - 1:
                break
        raise PrometheusError(f"prometheus did not become ready within {timeout}s:\n{self.log_tail()}")

    def _launch(self, binary: str) -> None:
        argv = [
            binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir / 'data'}",
            "--storage.tsdb.retention.time=1d",
            f"--web.listen-address={_LOOPBACK}:{self.port}",
            "--log.level=warn",
        ]
        with open_log(self.log_path) as log:
            # Own process group (a Ctrl-C in the dev cluster's terminal does not reach it before the
            # cluster stops it), and killed if its parent dies: never left behind.
            self._proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
                preexec_fn=die_with_parent_hook(),  # noqa: PLW1509
            )

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.is_running():
            try:
                if self._http.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        return False

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (Prometheus flushes its head block), SIGKILL after ``timeout``."""
        proc, self._proc = self._proc, None
        _RUNNING.discard(self)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def close(self) -> None:
        self.stop()
        self._http.close()

    # ------------------------------------------------------------------ the HTTP API
    def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>``'s ``data``; raises :class:`PrometheusError` with Prometheus' own error
        (a PromQL syntax error, say) when the status is not ``success``."""
        r = self._http.get(f"{self.url}/api/v1/{path}", params=params)
        try:
            body = r.json()
        except ValueError:
            raise PrometheusError(f"{path}: HTTP {r.status_code} {r.text[:200]}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result (a vector's samples; a scalar or string as one pseudo-sample)."""
        data = self.api("query", query=expr)
        result = data["result"]
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": result}]
        return list(result)

    def targets(self) -> list[dict[str, Any]]:
        """The active targets, each with ``labels``, ``health`` (up/down/unknown) and ``lastError``."""
        return list(self.api("targets", state="active")["activeTargets"])

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending and firing), each with ``labels``, ``state`` and ``activeAt``."""
        return list(self.api("alerts")["alerts"])

    def rule_groups(self) -> list[dict[str, Any]]:
        """The loaded rule groups, as ``/api/v1/rules`` lists them."""
        return list(self.api("rules")["groups"])

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
