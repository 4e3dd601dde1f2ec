"""``trimtab dev up``: the local cluster with a skewed synthetic load, a live view, and a JSON summary.

Steps: start ZooKeeper + Apache Kafka + agents + controllers (:class:`trimtab.devkit.localcluster.LocalCluster`);
look up every synthetic topic so its bundle gets an owner; pile the hot namespaces' bundles onto the first
broker (the skew the shedder then has to undo); show the cluster live until Ctrl-C or ``--duration``;
stop everything; print the summary. The live view goes to stderr and the summary to stdout, so scripts
can parse stdout.

With Prometheus installed (or ``--prometheus``), a real Prometheus server scrapes every agent and
controller with the deployed alert rules loaded (:mod:`trimtab.devkit.prometheus`): its URL is printed and
written to the state file, and the live view lists its pending and firing alerts.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from trimtab.agent.adapters.simulated import LoadModel
from trimtab.channel.kafka import KafkaTransport
from trimtab.channel.transport import Follower, Message
from trimtab.cluster.wiring import kafka_client_config
from trimtab.config.merge import deep_merge
from trimtab.config.settings import SimulationSettings
from trimtab.devkit.localcluster import FAST_TIMERS, ClusterError, LocalCluster
from trimtab.devkit.prometheus import INSTALL_HINT, PrometheusOptions, PrometheusServer, find_prometheus
from trimtab.errors import DevKitError


class EventTally:
    """Follows the events topic in the orchestrator to count decisions for the view and the summary."""

    def __init__(self, bootstrap: str, topic: str, client_config: dict[str, str] | None = None) -> None:
        self.kinds: Counter[str] = Counter()
        self.moves: Counter[str] = Counter()
        self.recent: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        # The nodes' own Kafka client settings (TLS, SASL): this is a Kafka client trimtab creates too.
        self.transport = KafkaTransport(bootstrap, client_id="trimtab-dev-view", client_config=client_config)
        self.follower = Follower(self.transport, topic, self._apply, low_latency=False, name="events")

    def _apply(self, msgs: list[Message]) -> None:
        with self._lock:
            for m in msgs:
                try:
                    e = orjson.loads(m.value or b"{}")
                except orjson.JSONDecodeError:
                    continue
                kind = e.get("kind", "?")
                self.kinds[kind] += 1
                if kind == "shed":
                    self.moves["shed"] += len(e.get("moves", []))
                elif kind == "heal":
                    self.moves["heal"] += int(e.get("moved", 0))
                elif kind in ("transfer", "unload"):
                    self.moves["admin"] += 1
                elif kind == "split":
                    self.moves["split"] += 1
                if kind != "assign" and not (kind == "shed" and not e.get("moves")):
                    self.recent.insert(0, e)
                    del self.recent[30:]

    def start(self) -> None:
        self.follower.start()

    def stop(self) -> None:
        self.follower.stop()
        self.transport.close()


def _describe(e: dict[str, Any]) -> str:
    t = time.strftime("%H:%M:%S", time.localtime(e.get("ts", 0) / 1000))
    kind = e.get("kind")
    if kind == "shed":
        moves = e.get("moves", [])
        first = moves[0] if moves else {}
        return f"{t} shed ({e.get('reason')}): {len(moves)} move(s), e.g. {first.get('bundle')} {first.get('src')} -> {first.get('dst')}"
    if kind == "heal":
        return f"{t} heal: {e.get('moved')} bundle(s) off {', '.join(e.get('by_failed_broker', {}))}"
    if kind in ("transfer", "unload"):
        return f"{t} {kind} {e.get('bundle')} {e.get('src')} -> {e.get('dst')} ({e.get('reason')})"
    if kind == "split":
        return f"{t} split {e.get('bundle')} ({e.get('reason')})"
    return f"{t} {kind} " + " ".join(
        f"{k}={v}" for k, v in e.items() if k in ("broker", "leader", "term", "by")
    )


def _bar(v: float | None, width: int = 20) -> Text:
    if v is None:
        return Text("no report", style="dim")
    n = max(0, min(width, round(v * width)))
    style = "red" if v > 0.85 else "yellow" if v > 0.6 else "green"
    return Text("█" * n + "░" * (width - n), style=style) + Text(f" {v:.2f}")


def active_alerts(prom: PrometheusServer | None) -> list[dict[str, Any]] | None:
    """The Prometheus server's pending and firing alerts, firing first; None without an answer."""
    if prom is None:
        return None
    try:
        alerts = prom.alerts()
    except (httpx.HTTPError, DevKitError):
        return None
    return sorted(alerts, key=lambda a: (a.get("state") != "firing", a.get("activeAt", "")))


def alerts_panel(prom: PrometheusServer, alerts: list[dict[str, Any]] | None) -> Panel:
    """One line per active alert: state, name, what it is about (its summary) and since when."""
    if alerts is None:
        body = Text("Prometheus does not answer", style="red")
    elif not alerts:
        body = Text("none pending or firing", style="green")
    else:
        body = Text()
        for a in alerts[:8]:
            firing = a.get("state") == "firing"
            since = str(a.get("activeAt", ""))[11:19]
            body.append(f"{'FIRING ' if firing else 'pending'} ", style="bold red" if firing else "yellow")
            body.append(str(a.get("labels", {}).get("alertname")), style="bold")
            body.append(f"  {a.get('annotations', {}).get('summary', '')}  (since {since} UTC)\n")
        body.rstrip()
    return Panel(body, title=f"alerts (Prometheus {prom.url})")


def render(
    cluster: LocalCluster,
    status: dict[str, Any] | None,
    tally: EventTally,
    started: float,
    state_file: Path,
    alerts: list[dict[str, Any]] | None = None,
) -> Group:
    """The live view: the leader's status, recent decisions and, with Prometheus, the active alerts."""
    prom = cluster.prometheus_server
    if status is None:
        waiting = Text("waiting for a leader...", style="yellow")
        return Group(waiting, alerts_panel(prom, alerts)) if prom is not None else Group(waiting)
    leader = status.get("leader") or {}
    header = Text.assemble(
        ("trimtab dev cluster", "bold"),
        f"  leader {leader.get('id')} (term {leader.get('term')})",
        f"  up {time.monotonic() - started:.0f}s",
        ("  SAFE MODE: " + str(status.get("safe_mode")), "red") if status.get("safe_mode") else "",
    )
    t = Table(expand=False)
    for col in ("broker", "agent", "bundles", "load (weighted max EMA)", "msg/s"):
        t.add_column(col)
    names = {n.broker: n.name for n in cluster.nodes.values() if n.broker}
    for b, info in status.get("brokers", {}).items():
        t.add_row(
            b + (" (draining)" if info.get("draining") else ""),
            names.get(b, "?"),
            str(info.get("bundles")),
            _bar(info.get("load")),
            f"{info.get('msg_rate') or 0:,.0f}",
        )
    load = status.get("load", {})
    sh = status.get("shedding", {})
    last = sh.get("last") or {}
    heal = status.get("healing", {})
    summary = Text(
        f"load avg {load.get('avg', 0):.2f}  std {load.get('std', 0):.3f} (target {load.get('target_std')})   "
        f"shedding {sh.get('strategy')}{' PAUSED' if sh.get('paused') else ''}: last {last.get('result')}/{last.get('reason')}"
        f"   moves: shed {tally.moves['shed']}, heal {tally.moves['heal']}, admin {tally.moves['admin']}"
        + (f"   failed brokers: {', '.join(heal.get('failed', {}))}" if heal.get("failed") else "")
        + "".join(
            f"\noperation {o['id']} ({o['kind']}, {o['state']}): {o['progress']['done']}/{o['progress']['total']}"
            f" -- {o['reason']}"
            for o in (status.get("operations") or {}).get("operations", [])
        )
    )
    with tally._lock:
        recent = "\n".join(_describe(e) for e in tally.recent[:8]) or "(no decisions yet)"
    a = cluster.agents[0] if cluster.agents else None
    hint = Text(
        f"agents: {' '.join(n.http for n in cluster.agents)}\ncontrollers: {' '.join(n.http for n in cluster.controller_nodes)}\n"
        f"state file: {state_file}   logs: {cluster.workdir / 'logs'}\n"
        + (f"try: curl '{a.http}/v1/lookup?topic=persistent://public/ns-0/t-0001'\n" if a else "")
        + "".join(f"{line}\n" for line in how_to_use(cluster)).rstrip("\n"),
        style="dim",
    )
    panels = [Panel(recent, title="recent decisions")]
    if prom is not None:
        panels.append(alerts_panel(prom, alerts))
    return Group(header, t, summary, *panels, hint)


def warm_up(
    cluster: LocalCluster, namespaces: list[str], sim: SimulationSettings, console: Console
) -> dict[str, int]:
    model = LoadModel(sim)
    topics = [t.name for ns in namespaces for t in model.topics(ns)]
    ok = failed = 0
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"assigning {len(topics)} topics' bundles", total=len(topics))
        with ThreadPoolExecutor(16) as pool:
            for result in pool.map(_try_lookup, [cluster] * len(topics), topics):
                ok += result
                failed += 1 - result
                progress.advance(task)
    return {"ok": ok, "failed": failed}


def _try_lookup(cluster: LocalCluster, topic: str) -> int:
    try:
        cluster.lookup(topic)
        return 1
    except Exception:
        return 0


def skew(cluster: LocalCluster, hot: list[str], console: Console) -> int:
    """Move the hot namespaces' bundles onto the first broker: the imbalance the shedder must fix."""
    target = cluster.agents[0].broker
    leader = cluster.leader()
    if leader is None or target is None:
        return 0
    moved = 0
    for bundle, rec in cluster.ownership(leader).items():
        if bundle.rsplit("/", 1)[0] in hot and rec["state"] == "owned" and rec["dst"] != target:
            r = cluster.post(leader, "/v1/admin/transfer", {"bundle": bundle, "broker": target})
            moved += r.status_code == 202
    console.print(f"skew: moved {moved} bundles of {', '.join(hot)} onto {target}")
    return moved


def dev_up(
    *,
    brokers: int,
    controllers: int,
    namespaces: int,
    hot: int,
    hot_scale: float,
    duration: float | None,
    state_file: Path,
    workdir: Path,
    view: bool,
    fast: bool,
    settings: dict[str, Any],
    broker_processes: bool = False,
    prometheus: bool | None = None,
    kafka_brokers: int = 1,
    zk_servers: int = 1,
) -> dict[str, Any]:
    """Run the dev cluster (the module docstring's steps) until Ctrl-C, SIGTERM or ``duration``; return the
    summary. The cluster is stopped and the signal handlers restored however the run ends.

    ``prometheus``: run a Prometheus server with trimtab's alert rules beside the cluster; None: when its
    binary is installed."""
    console = Console(stderr=True)
    from trimtab.cluster.logs import configure_logging

    configure_logging("warning", json_logs=False, role="dev")
    ns = [f"public/ns-{i}" for i in range(namespaces)]
    hot_ns = ns[:hot]
    cfg = deep_merge(_skewed_load_settings(hot_ns, hot_scale, fast), settings)
    if prometheus is None:
        prometheus = find_prometheus() is not None
    elif prometheus and find_prometheus() is None:
        raise ClusterError(f"--prometheus: no prometheus binary found: {INSTALL_HINT}")
    cluster = LocalCluster(
        workdir,
        brokers=brokers,
        controllers=controllers,
        settings=cfg,
        broker_processes=broker_processes,
        prometheus=PrometheusOptions() if prometheus else None,
        kafka_brokers=kafka_brokers,
        zk_servers=zk_servers,
    )
    stop = threading.Event()
    prev = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    summary: dict[str, Any] = {}
    tally: EventTally | None = None
    try:
        with console.status(
            f"starting ZooKeeper, Kafka ({kafka_brokers} brokers), "
            f"{brokers} agents and {controllers} controllers..."
        ):
            cluster.start()
        cluster.write_state(state_file)
        _print_nodes(cluster, console, started, state_file)
        from trimtab.config.loader import load_settings

        s = load_settings(cluster.config_path, environ=False)
        tally = EventTally(cluster.bootstrap_servers, s.kafka.events_topic, kafka_client_config(s))
        tally.start()
        lookups = warm_up(cluster, ns, s.sim, console)
        console.print(f"assigned bundles for {lookups['ok']} topics ({lookups['failed']} lookups failed)")
        skewed = skew(cluster, hot_ns, console) if hot_ns and brokers > 1 else 0
        time.sleep(min(3.0, s.load.report_interval_s * 3))
        initial = _status(cluster)
        _run_until_stopped(cluster, tally, stop, duration, view, initial, started, state_file, console)
        summary = _summary(
            cluster,
            tally,
            started,
            brokers=brokers,
            controllers=controllers,
            lookups=lookups,
            skewed=skewed,
            initial=initial,
            target_std=s.shedding.target_std,
            state_file=state_file,
        )
    finally:
        _shut_down(cluster, tally, prev, state_file, console)
    return summary


def _skewed_load_settings(hot_ns: list[str], hot_scale: float, fast: bool) -> dict[str, Any]:
    """The dev kit's own settings (under the caller's): a load that keeps the average broker near half
    capacity, with the hot namespaces well above it; the fast timers with ``fast``."""
    base: dict[str, Any] = FAST_TIMERS if fast else {}
    return deep_merge(
        base,
        {
            "sim": {"msg_rate_per_topic": 60.0, "namespace_scale": dict.fromkeys(hot_ns, hot_scale)},
            # Its synthetic load is public/ns-*, and the README's curl looks up public/ns-3: lookups may
            # create public/* (a deployment creates its namespaces with `trimtab admin namespaces create`).
            "namespace": {"auto_create": ["public/*"]},
        },
    )


def _print_nodes(cluster: LocalCluster, console: Console, started: float, state_file: Path) -> None:
    """Where everything listens, once the cluster is up (for curl and scripts)."""
    console.print(f"[bold]cluster up[/] in {time.monotonic() - started:.1f}s; state file {state_file}")
    for n in cluster.agents:
        console.print(f"  agent      {n.name:<14} {n.http}  broker {n.broker}")
    for n in cluster.controller_nodes:
        console.print(f"  controller {n.name:<14} {n.http}")
    for n in cluster.broker_nodes:
        console.print(f"  broker     {n.name:<14} {n.http}  (sim-broker process of {n.broker})")
    if cluster.prometheus_server is not None:
        prom = cluster.prometheus_server
        console.print(
            f"  prometheus {'':<14} {prom.url}  (alerts: {prom.url}/alerts; data in {prom.data_dir})"
        )
    for line in how_to_use(cluster):
        console.print(line, markup=False, highlight=False)


def how_to_use(cluster: LocalCluster) -> list[str]:
    """How to call the secured cluster: the admin CLI with the admin token file, curl with the read token
    (the token files' paths are in the state file too; the tokens themselves are never printed)."""
    files = cluster.token_files
    c = cluster.controller_nodes[0].http if cluster.controller_nodes else "<a controller>"
    return [
        f"admin:   .venv/bin/trimtab admin --url {c} --token-file {files['admin_token']} status",
        f'read:    curl -H "Authorization: Bearer $(cat {files["read_token"]})" {c}/v1/status',
        "public:  /v1/lookup on agents, /healthz, /readyz, /metrics (docs/security.md)",
    ]


def _run_until_stopped(
    cluster: LocalCluster,
    tally: EventTally,
    stop: threading.Event,
    duration: float | None,
    view: bool,
    initial: dict[str, Any] | None,
    started: float,
    state_file: Path,
    console: Console,
) -> None:
    """Wait for a stop signal or the end of ``duration``; with ``view``, redraw the live view every second."""
    deadline = time.monotonic() + duration if duration else None
    if view:
        prom = cluster.prometheus_server
        with Live(
            render(cluster, initial, tally, started, state_file, active_alerts(prom)),
            console=console,
            refresh_per_second=2,
        ) as live:
            while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
                stop.wait(1.0)
                live.update(
                    render(cluster, _status(cluster), tally, started, state_file, active_alerts(prom))
                )
    else:
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            stop.wait(1.0)


def _summary(
    cluster: LocalCluster,
    tally: EventTally,
    started: float,
    *,
    brokers: int,
    controllers: int,
    lookups: dict[str, int],
    skewed: int,
    initial: dict[str, Any] | None,
    target_std: float,
    state_file: Path,
) -> dict[str, Any]:
    """The JSON summary printed on stdout: the leader's final view beside the initial one, the moves and
    decisions the events topic carried, and any process that exited on its own."""
    final = _status(cluster)
    dead = [n.name for n in cluster.nodes.values() if not n.alive()]
    return {
        "duration_s": round(time.monotonic() - started, 1),
        "brokers": brokers,
        "controllers": controllers,
        "leader": (final or {}).get("leader"),
        "bundles": (final or {}).get("channel", {}).get("bundles"),
        "lookups": lookups,
        "skew_moves": skewed,
        "load": {
            "initial_std": (initial or {}).get("load", {}).get("std"),
            "final_std": (final or {}).get("load", {}).get("std"),
            "target_std": target_std,
            "final_avg": (final or {}).get("load", {}).get("avg"),
        },
        "per_broker": (final or {}).get("brokers"),
        "moves": dict(tally.moves),
        "decisions": dict(tally.kinds),
        "healing": (final or {}).get("healing"),
        "exited_unexpectedly": dead,
        "state_file": str(state_file),
        "prometheus": _prometheus_summary(cluster.prometheus_server),
    }


def _prometheus_summary(prom: PrometheusServer | None) -> dict[str, Any] | None:
    """Where Prometheus ran and the alerts active at the end (name and state), for scripts."""
    if prom is None:
        return None
    alerts = active_alerts(prom)
    return {
        "url": prom.url,
        "alerts": None
        if alerts is None
        else [{"alert": a["labels"].get("alertname"), "state": a.get("state")} for a in alerts],
    }


def _shut_down(
    cluster: LocalCluster,
    tally: EventTally | None,
    prev: dict[signal.Signals, Any],
    state_file: Path,
    console: Console,
) -> None:
    """Stop the event follower and every process (the controllers first, with SIGTERM), restore the
    signal handlers and remove the state file: the cluster is gone, so scripts must not find it."""
    with console.status("stopping..."):
        if tally is not None:
            tally.stop()
        for n in cluster.controller_nodes:
            cluster.kill(n.name, signal.SIGTERM)
        cluster.stop(graceful=True)
    for sig, h in prev.items():
        signal.signal(sig, h)
    if state_file.exists():
        state_file.unlink()
    console.print("stopped.")


def _status(cluster: LocalCluster) -> dict[str, Any] | None:
    leader = cluster.leader()
    if leader is None:
        return None
    try:
        return dict(cluster.get(leader, "/v1/status"))
    except Exception:
        return None
