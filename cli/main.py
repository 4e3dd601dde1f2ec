"""The ``trimtab`` command line (click).

Daemons (``agent``, ``controller``), operator tooling (``channel``, ``admin``, ``config``), the local
cluster (``dev up``) and benchmarks (``bench``). Every daemon command takes ``--config FILE`` and repeated
``--set section.field=value`` on top of the environment, and exits with status 2 and a clear message on
invalid configuration.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import click
import orjson

from trimtab.cli.admin import admin
from trimtab.cli.common import config_option, set_option, settings_from, settings_layers, write_atomically
from trimtab.cli.pipeline import pipeline
from trimtab.config.settings import Settings
from trimtab.errors import ConfigError, TransportError

if TYPE_CHECKING:
    from rich.text import Text

    from trimtab.channel.transport import Message, Transport


def _emit_json(obj: Any) -> None:
    sys.stdout.buffer.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
    sys.stdout.flush()


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="trimtab")
def main() -> None:
    """trimtab: shard ownership and load balancing for clusters of stateless serving brokers."""
    from trimtab.cluster.logs import configure_logging

    # Until a command configures its own: human-readable warnings, and tracebacks without local variables
    # (structlog's default would print every frame's locals, secrets included).
    configure_logging("warning", json_logs=False)


# ---------------------------------------------------------------------------------------------- daemons
def daemon_options(fn: Any) -> Any:
    for opt in reversed(
        [
            config_option,
            set_option,
            click.option("--zookeeper", default=None, help="ZooKeeper hosts (zookeeper.hosts)."),
            click.option("--kafka", default=None, help="Kafka bootstrap servers (kafka.bootstrap_servers)."),
            click.option("--cluster", default=None, help="Cluster name (cluster.name)."),
            click.option("--http-host", default=None, help="HTTP listen address (http.host)."),
            click.option(
                "--http-port", type=int, default=None, help="HTTP port, 0 for any free one (http.port)."
            ),
        ]
    ):
        fn = opt(fn)
    return fn


#: The setting each of the daemons' flags sets (over the config file and --set).
_DAEMON_FLAGS = {
    "zookeeper": "zookeeper.hosts",
    "kafka": "kafka.bootstrap_servers",
    "cluster": "cluster.name",
    "http_host": "http.host",
    "http_port": "http.port",
    "broker_id": "broker.id",
    "controller_id": "controller.id",
}


def _daemon_settings(config_file: str | None, sets: tuple[str, ...], flags: dict[str, Any]) -> Settings:
    return settings_from(config_file, sets, **{_DAEMON_FLAGS[k]: v for k, v in flags.items()})


def _run_daemon(role: str, wiring: Any, process: str, s: Settings) -> None:
    """Check ``s`` with ``wiring.check`` (before binding or connecting anything: exit 2 on invalid
    settings), configure logging, run ``wiring.<process>`` on an event loop, and turn a start-up failure
    into a clear exit 1."""
    import asyncio

    from trimtab.cluster.logs import configure_logging

    try:
        wiring.check(s)
    except ConfigError as e:
        click.echo(f"{role}: invalid configuration: {e}", err=True)
        sys.exit(2)
    build = getattr(wiring, process)

    import uvloop

    configure_logging(s.logging.level, s.logging.json_logs, role=role)
    try:
        # uvloop: the event loop in C (libuv) -- a lookup answered from the table costs a fraction of what
        # it costs on asyncio's selector loop (docs/benchmarks.md, "lookups at wire speed").
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            code = runner.run(build(s).run())
    except Exception as e:
        import structlog

        reason = failure_reason(e)
        structlog.get_logger("trimtab").exception(f"{role}_failed", error=reason)
        click.echo(f"{role} failed: {reason}", err=True)
        sys.exit(1)
    sys.exit(code)


def failure_reason(e: BaseException) -> str:
    """What to tell the operator about a daemon that could not run: the error's message, or -- for the
    library errors that have none (kazoo's ``NoAuthError()`` prints as nothing) -- what it means."""
    from kazoo.exceptions import NoAuthError

    if isinstance(e, NoAuthError):
        return (
            "ZooKeeper refused this node's credentials (NoAuthError) on one of trimtab's znodes: their ACLs "
            "grant another identity; check zookeeper.auth_digest or auth_digest_file (docs/security.md)"
        )
    return str(e) or type(e).__name__


@main.command()
@daemon_options
@click.option("--broker-id", default=None, help="Stable broker id (broker.id; default host:port).")
def agent(config_file: str | None, sets: tuple[str, ...], **flags: Any) -> None:
    """Run the sidecar agent for one broker."""
    from trimtab.agent import wiring

    _run_daemon("agent", wiring, "AgentProcess", _daemon_settings(config_file, sets, flags))


@main.command()
@daemon_options
@click.option("--controller-id", default=None, help="Controller id (controller.id; default host:port).")
def controller(config_file: str | None, sets: tuple[str, ...], **flags: Any) -> None:
    """Run a controller (several may run; one is elected leader)."""
    from trimtab.controller import wiring

    _run_daemon("controller", wiring, "ControllerProcess", _daemon_settings(config_file, sets, flags))


@main.command("sim-broker")
@config_option
@set_option
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8081, show_default=True)
@click.option("--broker-id", default="sim-broker", show_default=True)
def sim_broker(config_file: str | None, sets: tuple[str, ...], host: str, port: int, broker_id: str) -> None:
    """Serve a simulated broker over the webhook contract: the reference implementation, and the separate
    broker process of `dev up --broker-processes` and the chaos suite. It signs nothing and verifies
    signatures when broker.adapter.hmac_key[_file] is set (the agent's own config can be passed as is);
    signed calls name the broker they are for, so --broker-id must then be the agent's broker.id.
    It serves behind the same HTTP guard as the daemons (the http.* limits) and logs JSON lines."""
    import uvicorn

    from trimtab.agent.adapters import hmac_key
    from trimtab.agent.adapters.simulated import SimulatedBroker
    from trimtab.agent.adapters.webhook_server import create_app
    from trimtab.cluster.http import bind, server_config
    from trimtab.cluster.http_guard import Refusals
    from trimtab.cluster.logs import configure_logging

    s = settings_from(config_file, sets)
    app = create_app(SimulatedBroker(broker_id, s.sim), hmac_key=hmac_key(s))
    configure_logging(s.logging.level, s.logging.json_logs, role="sim-broker", broker=broker_id)
    try:
        sock = bind(host, port)
    except OSError as e:
        raise click.ClickException(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    uvicorn.Server(server_config(app, s.http, Refusals())).run(sockets=[sock])


# ---------------------------------------------------------------------------------------------- channel
@main.group()
def channel() -> None:
    """Inspect the bundle state channel."""


_BAD_LINES_SHOWN = 5  # bad lines named on stderr by `channel replay`; the count covers all of them


@channel.command("replay")
@click.argument("file", type=click.File("rb"))
@click.option("--json", "as_json", is_flag=True, help="Print {table, stats} as JSON.")
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=None,
    help="Channel partition count: skip records outside their home partition crc32(key) % N, as a node "
    "does (default: the export header's; without either, no partition check).",
)
def channel_replay(file: Any, as_json: bool, partitions: int | None) -> None:
    """Replay a channel export (JSON lines, docs/protocol.md section 8: what `channel dump --export`
    writes, or {"key": bundle, "value": record|null} per line) and show the resolved table, exactly as
    every node computes it from the same messages. Lines that are not export lines are counted as skipped
    (bad_line) and the first few are named on stderr."""
    from trimtab.channel.replayfile import replay_lines, table_report

    bad_lines = 0

    def on_bad_line(lineno: int, why: str) -> None:
        nonlocal bad_lines
        bad_lines += 1
        if bad_lines <= _BAD_LINES_SHOWN:
            click.echo(f"line {lineno}: not an export line ({why}); skipped as bad_line", err=True)

    view = replay_lines(file, partitions=partitions, on_bad_line=on_bad_line)
    if bad_lines > _BAD_LINES_SHOWN:
        click.echo(f"... {bad_lines} bad lines in all", err=True)
    report = table_report(view)
    if as_json:
        _emit_report(report)
        return
    _print_table(report["table"])
    stats = report["stats"]
    click.echo(
        f"accepted {stats['accepted']}  rejected {stats['rejected']} {stats['rejected_by_reason']}  "
        f"skipped {stats['skipped']} {stats['skipped_by_reason']}"
    )


def _emit_report(report: dict[str, Any]) -> None:
    """Like _emit_json, with an encoder that cannot fail on anything the channel put in the report."""
    from trimtab.channel.replayfile import report_json

    sys.stdout.buffer.write(report_json(report))
    sys.stdout.flush()


def _cell(value: object) -> Text:
    """A table cell that shows exactly the characters of ``value``: broker ids and writers come off the
    channel and anyone can write there, so they are never read as rich markup (``[bold]``, ``[link=...]``)
    and control characters (terminal escape sequences) are shown escaped, not sent to the terminal."""
    from rich.text import Text

    text = "" if value is None else str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return Text(text)


def _print_table(table: dict[str, dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table("bundle", "state", "dst", "src", "version", "force", "writer")
    for bundle, rec in table.items():
        t.add_row(
            _cell(bundle),
            _cell(rec["state"]),
            _cell(rec["dst"]),
            _cell(rec["src"]),
            _cell(rec["version"]),
            _cell(rec["force"]),
            _cell(rec["writer"]),
        )
    Console().print(t)


@channel.command("dump")
@config_option
@set_option
@click.option("--bootstrap-servers", default=None, help="Kafka bootstrap servers (kafka.bootstrap_servers).")
@click.option("--topic", default=None, help="Channel topic (kafka.channel_topic).")
@click.option("--no-snapshot", is_flag=True, help="Replay the whole channel instead of snapshot + tail.")
@click.option("--json", "as_json", is_flag=True, help="Print {table, stats} as JSON.")
@click.option(
    "--export",
    "export_to",
    default=None,
    metavar="FILE",
    help="Instead of resolving the channel, write every retained message (from the low watermarks, "
    "snapshots ignored) to FILE ('-': stdout) in the export format `channel replay` reads.",
)
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for catch-up.")
def channel_dump(
    config_file: str | None,
    sets: tuple[str, ...],
    bootstrap_servers: str | None,
    topic: str | None,
    no_snapshot: bool,
    as_json: bool,
    export_to: str | None,
    timeout: float,
) -> None:
    """Read the live channel to its end and show the resolved table (or, with --export, save the raw
    channel: replaying that file gives what `dump --no-snapshot` gives now)."""
    from trimtab.channel.client import ChannelClient
    from trimtab.channel.replayfile import table_report
    from trimtab.cluster.logs import configure_logging
    from trimtab.cluster.wiring import ensure_topics, kafka_transport

    if export_to is not None and as_json:
        raise click.UsageError(
            "--export writes the raw channel, not a table; replay it with `trimtab channel replay FILE --json`"
        )
    s = settings_from(
        config_file, sets, **{"kafka.bootstrap_servers": bootstrap_servers, "kafka.channel_topic": topic}
    )
    configure_logging("warning", json_logs=True)
    k = s.kafka
    reads = {k.channel_topic} if no_snapshot or export_to is not None else {k.channel_topic, k.snapshot_topic}
    try:
        # The topics it reads, checked as a daemon checks them (never created): refused credentials, a
        # missing topic or the wrong kind of topic is one clear line at once, not a metadata timeout.
        ensure_topics(s, "trimtab-channel-dump", create=False, only=reads)
        transport = kafka_transport(s, "trimtab-channel-dump")  # reads kafka.client_config_file
    except (ConfigError, TransportError) as e:
        raise click.ClickException(str(e)) from None
    if export_to is not None:
        try:
            _export_channel(transport, s.kafka.channel_topic, export_to, timeout)
        finally:
            transport.close()
        return
    client = ChannelClient(
        transport,
        s.kafka.channel_topic,
        s.kafka.snapshot_topic,
        use_snapshot=not no_snapshot,
    )
    try:
        try:
            client.start()
        except Exception as e:  # an unusable snapshot topic, an unreachable cluster: say which, no trace
            raise click.ClickException(f"cannot read {s.kafka.channel_topic}: {e}") from None
        if not client.wait_ready(timeout):
            raise click.ClickException(
                f"did not catch up with {s.kafka.channel_topic} within {timeout}s "
                f"(error: {client.error or 'none'}; lag {client.lag()})"
            )
        report = table_report(client.table)
        if client.snapshot is not None:
            report["snapshot"] = client.snapshot.manifest.id
    finally:
        client.stop()
        transport.close()
    if as_json:
        _emit_report(report)
    else:
        _print_table(report["table"])
        click.echo(f"stats {report['stats']}")


def _export_channel(transport: Transport, topic: str, export_to: str, timeout: float) -> None:
    """Write every message of ``topic`` from the low to the high watermarks seen at the start, raw bytes
    and all, in per-partition order. A file is written beside its destination and renamed into place only
    when complete, so a failed export never leaves a truncated file that looks like a whole channel."""
    from trimtab.channel.replayfile import export_lines
    from trimtab.channel.snapshot import read_all

    counts: dict[int, int] = {}

    def counted(messages: Iterable[Message]) -> Iterator[Message]:
        for m in messages:
            counts[m.partition] = counts.get(m.partition, 0) + 1
            yield m

    def write(out: BinaryIO) -> int:
        partitions = transport.partitions(topic)
        for line in export_lines(
            counted(read_all(transport, topic, timeout)), topic=topic, partitions=partitions
        ):
            out.write(line)
        out.flush()
        return partitions

    try:
        if export_to == "-":
            partitions = write(sys.stdout.buffer)
        else:
            partitions = write_atomically(Path(export_to), write)
    except Exception as e:  # the cluster, the file system: an operator error, told plainly
        raise click.ClickException(f"export of {topic} failed: {type(e).__name__}: {e}") from None
    total = sum(counts.values())
    where = "stdout" if export_to == "-" else export_to
    click.echo(
        f"exported {total} messages of {topic} ({partitions} partitions; per partition "
        f"{dict(sorted(counts.items()))}) to {where}",
        err=True,
    )


# ---------------------------------------------------------------------------------------------- admin
main.add_command(admin)  # cli/admin.py (docs/admin-cli.md): imports only click until it is run
main.add_command(pipeline)  # cli/pipeline.py (docs/pipeline.md): PySpark is imported only when a job runs


# ---------------------------------------------------------------------------------------------- dev
@main.group()
def dev() -> None:
    """The local development cluster."""


@dev.command("up")
@click.option("--brokers", default=4, show_default=True, help="Agents (each beside a simulated broker).")
@click.option("--controllers", default=2, show_default=True)
@click.option("--namespaces", default=8, show_default=True, help="Synthetic namespaces public/ns-0...")
@click.option(
    "--hot", default=2, show_default=True, help="How many namespaces carry extra load (piled on one broker)."
)
@click.option("--hot-scale", default=3.0, show_default=True, help="Load multiplier of the hot namespaces.")
@click.option(
    "--duration", type=float, default=None, help="Stop after this many seconds (default: until Ctrl-C)."
)
@click.option(
    "--state-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path(".trimtab/dev-state.json"),
    show_default=True,
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".trimtab/dev"),
    show_default=True,
)
@click.option("--no-view", is_flag=True, help="No live view (for scripts; the summary still goes to stdout).")
@click.option(
    "--production-timers", is_flag=True, help="Keep production timers (shedding every minute, ...)."
)
@click.option(
    "--broker-processes",
    is_flag=True,
    help="Run each simulated broker as its own process (trimtab sim-broker) behind the webhook adapter, so "
    "pausing or killing an agent leaves its broker running, as beside a real broker.",
)
@click.option(
    "--prometheus/--no-prometheus",
    default=None,
    help="Run a Prometheus server scraping every node, with trimtab's alert rules (deploy/prometheus); "
    "its URL is printed and the live view shows its alerts. Default: when the prometheus binary is installed.",
)
@click.option(
    "--kafka-brokers",
    type=click.IntRange(min=1, max=5),
    default=1,
    show_default=True,
    help="Apache Kafka (KRaft) brokers, from the dev kit's cache (scripts/setup.sh fetches it); with 3 or more "
    "the topics are replicated 3 times, min.insync.replicas 2.",
)
@click.option(
    "--zk-servers",
    type=click.Choice(["1", "3", "5"]),
    default="1",
    show_default=True,
    help="ZooKeeper servers on loopback: 3 or 5 make an ensemble (kill its leader and watch trimtab carry on).",
)
@config_option
@set_option
def dev_up(
    brokers: int,
    controllers: int,
    namespaces: int,
    hot: int,
    hot_scale: float,
    duration: float | None,
    state_file: Path,
    workdir: Path,
    no_view: bool,
    production_timers: bool,
    broker_processes: bool,
    prometheus: bool | None,
    kafka_brokers: int,
    zk_servers: str,
    config_file: str | None,
    sets: tuple[str, ...],
) -> None:
    """Start ZooKeeper, Kafka, agents and controllers on this machine, assign a skewed synthetic
    load, and show the cluster balancing itself. Ctrl-C stops everything; --duration ends with a JSON
    summary on stdout."""
    import shutil

    run = _devkit("trimtab.devkit.devup").dev_up
    prom = _devkit("trimtab.devkit.prometheus")
    if prometheus and prom.find_prometheus() is None:
        raise click.ClickException(f"--prometheus: no prometheus binary found: {prom.INSTALL_HINT}")

    if brokers < 1 or controllers < 0:
        raise click.BadParameter("need at least one broker")
    overrides = settings_layers(config_file, sets)  # deep-merged: --set a.b.c keeps a.b's other keys
    if workdir.exists():
        shutil.rmtree(workdir)
    summary = run(
        brokers=brokers,
        controllers=controllers,
        namespaces=namespaces,
        hot=min(hot, namespaces),
        hot_scale=hot_scale,
        duration=duration,
        state_file=state_file,
        workdir=workdir,
        view=not no_view,
        fast=not production_timers,
        settings=overrides,
        broker_processes=broker_processes,
        prometheus=prometheus,
        kafka_brokers=kafka_brokers,
        zk_servers=int(zk_servers),
    )
    _emit_json(summary)


# ---------------------------------------------------------------------------------------------- docs
@main.group()
def placement() -> None:
    """Placement policies: isolation, anti-affinity, standbys (docs/placement.md)."""


@placement.command("solve")
@click.argument("file")
def placement_solve(file: str) -> None:
    """Answer a placement document's queries (FILE, or - for stdin) as JSON: "where would this go?"

    Exit codes: 0 answered, 2 the document is invalid (the message names the field)."""
    from trimtab.cli.placement_solve import solve_main

    sys.exit(solve_main(file))


@main.command("sim")
@click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object on stdout.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write report.json, series.json and PNG plots (load, std, moves) into this directory.",
)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    type=click.Choice(
        ["transfer", "threshold", "legacy-overload", "legacy-threshold", "legacy-uniform", "none"]
    ),
    help="Run only these policies (repeatable; default: the scenario's).",
)
@click.option("--seed", type=int, default=None, help="Override the scenario's seed.")
def sim_cmd(
    scenario: Path, as_json: bool, out: Path | None, policies: tuple[str, ...], seed: int | None
) -> None:
    """Run SCENARIO.yaml in virtual time with the daemons' own jobs, each policy side by side
    (docs/simulator.md). Deterministic: the same scenario and seed give byte-identical JSON.

    Exit codes: 0 ran (whatever the figures), 2 the scenario is invalid (the message names the field)."""
    from trimtab.sim.run import main_json, simulate, write_outputs
    from trimtab.sim.scenario import load_scenario

    try:
        sc = load_scenario(scenario)
        if seed is not None:
            sc = sc.model_copy(update={"seed": seed})
    except ConfigError as e:
        click.echo(str(e), err=True)
        sys.exit(2)
    except ImportError as e:
        click.echo(f"trimtab sim needs the simulator extra: pip install 'trimtab[sim]' ({e})", err=True)
        sys.exit(2)
    report, runs = simulate(sc, list(policies) or None, progress=lambda m: click.echo(m, err=True))
    data = main_json(report)
    if out is not None:
        for p in write_outputs(out, report, runs, data):
            click.echo(f"wrote {p}", err=True)
    if as_json:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        _print_sim_table(report)


def _print_sim_table(report: dict[str, Any]) -> None:
    click.echo(
        f"{report['scenario']}: balance target std {report['balance_target_std']:g}, measured from "
        f"{report['measure_from_s']:g} s"
    )
    click.echo(
        f"{'policy':18} {'balanced after':>15} {'moves':>6} {'unserved b*s':>13} {'peak':>6} {'osc':>4} {'viol':>5}"
    )
    for name, r in report["policies"].items():
        ttb = "never" if r["time_to_balance_s"] is None else f"{r['time_to_balance_s']:g} s"
        click.echo(
            f"{name:18} {ttb:>15} {r['moves']:>6} {r['unserved_bundle_s']:>13.1f} "
            f"{r['peak_broker_load']:>6.2f} {r['oscillations']:>4} {r['violations_total']:>5}"
        )
    opt = report.get("optimum")
    if opt:
        click.echo(
            f"exact minimum moves to bring every broker within +-{opt['band']:g}: {opt['moves']} ({opt['status']})"
        )


@main.command("docs")
@click.option(
    "--out", type=click.Path(file_okay=False, path_type=Path), default=Path("docs"), show_default=True
)
def docs_cmd(out: Path) -> None:
    """Regenerate every generated file: configuration.md, the OpenAPI specs (agent, controller, broker
    webhook contract), the rooms picture in architecture.md (from the imports) and, in the repository, the
    Kubernetes PrometheusRule (from deploy/prometheus/alerts.yml). Tests fail when one is stale."""
    from trimtab.agent.adapters.simulated import SimulatedBroker
    from trimtab.agent.adapters.webhook_server import create_app as webhook_app
    from trimtab.agent.api import create_app as agent_app
    from trimtab.config.docs import render_markdown
    from trimtab.config.settings import SimulationSettings
    from trimtab.controller.api import create_app as controller_app

    out.mkdir(parents=True, exist_ok=True)
    (out / "configuration.md").write_text(render_markdown())
    specs = {
        "webhook-openapi.json": webhook_app(SimulatedBroker("doc", SimulationSettings())).openapi(),
        # The apps only touch the daemon inside request handlers, so no daemon is needed for the spec.
        "agent-openapi.json": agent_app(None).openapi(),  # type: ignore[arg-type]
        "controller-openapi.json": controller_app(None).openapi(),  # type: ignore[arg-type]
    }
    for name, spec in specs.items():
        (out / name).write_bytes(
            orjson.dumps(spec, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
        )
    arch = out / "architecture.md"
    root = Path(__file__).resolve().parents[1]  # the repository (an installed trimtab has no rooms to read)
    if arch.exists() and (root / "channel").is_dir():  # the picture lives in the page, between its markers
        from trimtab.cli.rooms import doors, mermaid, with_picture

        arch.write_text(with_picture(arch.read_text(), mermaid(doors(root))))
        kustomize = _devkit("trimtab.devkit.kustomize")  # the dev kit is there wherever the rooms are
        kustomize.PROMETHEUS_RULE.write_text(kustomize.prometheus_rule())
    click.echo(
        f"wrote {out / 'configuration.md'}, {', '.join(specs)}, the rooms in {arch} and the PrometheusRule"
    )


# ---------------------------------------------------------------------------------------------- config
@main.group("config")
def config_group() -> None:
    """Show, check and document configuration."""


@config_group.command("show")
@config_option
@set_option
def config_show(config_file: str | None, sets: tuple[str, ...]) -> None:
    """Print the effective configuration (defaults < file < environment < flags) as JSON."""
    _emit_json(settings_from(config_file, sets).model_dump(mode="json"))


@config_group.command("check")
@config_option
@set_option
def config_check(config_file: str | None, sets: tuple[str, ...]) -> None:
    """Validate configuration; exit 2 with the problems if it is invalid."""
    settings_from(config_file, sets)
    click.echo("configuration is valid")


@config_group.command("docs")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=None)
def config_docs(output: Path | None) -> None:
    """Generate the configuration reference (docs/configuration.md)."""
    from trimtab.config.docs import render_markdown

    text = render_markdown()
    if output:
        output.write_text(text)
    else:
        click.echo(text)


# ---------------------------------------------------------------------------------------------- topics
@main.group("topics")
def topics_group() -> None:
    """Make and check trimtab's Kafka topics (cluster/topics.py is the one source of truth)."""


def _topics_run(config_file: str | None, sets: tuple[str, ...], kafka: str | None, *, create: bool) -> None:
    from trimtab.cluster.topics import topic_specs
    from trimtab.cluster.wiring import ensure_topics
    from trimtab.errors import TrimtabError

    s = settings_from(config_file, sets, **{"kafka.bootstrap_servers": kafka})
    try:
        ensure_topics(s, "trimtab-topics", create=create)
    except TrimtabError as e:
        click.echo(f"topics: {e}", err=True)
        sys.exit(1)
    for spec in topic_specs(s.kafka):
        click.echo(f"{spec.name}: ok")


@topics_group.command("ensure")
@config_option
@set_option
@click.option("--kafka", default=None, help="Kafka bootstrap servers (kafka.bootstrap_servers).")
def topics_ensure(config_file: str | None, sets: tuple[str, ...], kafka: str | None) -> None:
    """Create every missing topic as trimtab needs it, then check them all; exit 1 naming each problem.
    What docker-compose's kafka-init runs, and what to run as a principal allowed to create topics where
    the daemons' principals are not (docs/operations.md)."""
    _topics_run(config_file, sets, kafka, create=True)


@topics_group.command("check")
@config_option
@set_option
@click.option("--kafka", default=None, help="Kafka bootstrap servers (kafka.bootstrap_servers).")
def topics_check(config_file: str | None, sets: tuple[str, ...], kafka: str | None) -> None:
    """Check, without creating anything, that every topic exists and can be relied on (cleanup policy,
    partition count); exit 1 naming each problem -- what a daemon checks at start."""
    _topics_run(config_file, sets, kafka, create=False)


@topics_group.command("show")
@config_option
@set_option
def topics_show(config_file: str | None, sets: tuple[str, ...]) -> None:
    """Print every topic trimtab needs with its partitions and configuration, as JSON."""
    from trimtab.cluster.topics import topic_specs

    s = settings_from(config_file, sets)
    _emit_json(
        [
            {
                "name": t.name,
                "setting": t.setting,
                "partitions": t.partitions,
                "exact_partitions": t.exact_partitions,
                "replication_factor": s.kafka.replication_factor,
                "config": t.topic_config(),
            }
            for t in topic_specs(s.kafka)
        ]
    )


# ---------------------------------------------------------------------------------------------- chaos
@main.command("chaos")
@click.option(
    "--duration", type=float, default=300.0, show_default=True, help="Seconds of faults (whole rounds)."
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    default=None,
    help="Run exactly this many rounds (each injects every chosen kind once, in a random order) instead "
    "of --duration: a fault count that does not depend on how fast the machine is.",
)
@click.option("--brokers", default=4, show_default=True)
@click.option("--controllers", default=2, show_default=True)
@click.option("--namespaces", default=6, show_default=True)
@click.option("--seed", default=1, show_default=True)
@click.option(
    "--faults",
    default=None,
    help="Comma-separated fault kinds (default: every kind the cluster's shape allows, clock_skew too -- the network faults "
    "with --hosts, the ensemble's with --zk-servers 3 too; `trimtab chaos --faults help` lists them, "
    "docs/reliability.md says what each does).",
)
@click.option(
    "--zk-servers",
    type=click.Choice(["1", "3", "5"]),
    default="1",
    show_default=True,
    help="ZooKeeper servers: 3 or 5 make an ensemble (kill_zk_leader, partition_zk_member).",
)
@click.option(
    "--hosts",
    is_flag=True,
    help="Every node on a host of its own (Linux network namespaces, root only): the network faults.",
)
@click.option(
    "--kafka-brokers",
    type=click.IntRange(min=1, max=5),
    default=3,
    show_default=True,
    help="Apache Kafka brokers (with 1, kill_kafka_leader is a Kafka outage until the broker is back).",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".trimtab/chaos"),
    show_default=True,
)
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write the JSON here."
)
@click.option(
    "--markdown", type=click.Path(dir_okay=False, path_type=Path), default=None, help="A table for docs."
)
@config_option
@set_option
def chaos_cmd(
    duration: float,
    rounds: int | None,
    brokers: int,
    controllers: int,
    namespaces: int,
    seed: int,
    faults: str | None,
    zk_servers: str,
    hosts: bool,
    kafka_brokers: int,
    workdir: Path,
    out: Path | None,
    markdown: Path | None,
    config_file: str | None,
    sets: tuple[str, ...],
) -> None:
    """Run the chaos suite on a local cluster (loopback only) and print its report as JSON: faults
    injected, double-serving windows (must be 0), bundles lost (must be 0), unavailability p50/p99/max.
    Exit status 1 when the run failed its promise. docs/reliability.md explains the figures. ``--config``
    and ``--set`` go on top of the suite's own settings (e.g. ``--set namespace.default_bundles=100`` for a
    cluster tracking 100 bundles per namespace)."""
    import shutil

    from trimtab.cluster.logs import configure_logging

    configure_logging("info", json_logs=False, role="chaos")  # progress on stderr, the report on stdout
    runner = _devkit("trimtab.devkit.chaos.runner")
    if faults == "help":
        click.echo("\n".join(runner.ALL_FAULTS))
        return
    default = runner.FAULT_KINDS + runner.CLOCK_FAULTS + (runner.NET_FAULTS if hosts else ())
    default += runner.ZK_FAULTS if hosts and int(zk_servers) > 1 else ()
    kinds = tuple(k.strip() for k in faults.split(",") if k.strip()) if faults else default
    unknown = sorted(set(kinds) - set(runner.ALL_FAULTS))
    if unknown:
        raise click.BadParameter(f"unknown fault kinds {unknown}; choose from {', '.join(runner.ALL_FAULTS)}")
    if workdir.exists():
        shutil.rmtree(workdir)
    cfg = runner.ChaosConfig(
        workdir=workdir,
        duration_s=duration,
        rounds=rounds,
        brokers=brokers,
        controllers=controllers,
        namespaces=namespaces,
        seed=seed,
        faults=kinds,
        kafka_brokers=kafka_brokers,
        zk_servers=int(zk_servers),
        hosts=hosts,
        settings=settings_layers(config_file, sets),
    )
    try:
        report = runner.run_chaos(cfg)
    except _devkit("trimtab.devkit.localcluster").ClusterError as e:
        raise click.ClickException(str(e)) from None
    text = report.to_json()
    if out is not None:
        out.write_text(text + "\n")
    if markdown is not None:
        markdown.write_text(report.to_markdown())
    click.echo(text)
    sys.exit(0 if report.passed else 1)


# ---------------------------------------------------------------------------------------------- bench
_DEVKIT_MISSING = (
    "the development kit (the local cluster and the benchmarks) ships with the source repository, not with "
    "this installation: clone the repository and use ./scripts/run.sh"
)


def _devkit(module: str) -> Any:
    """A module of ``trimtab.devkit``, or a clear error where it is not installed (the wheel, the image)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and e.name.startswith("trimtab.devkit"):
            raise click.ClickException(_DEVKIT_MISSING) from None
        raise


class _Benchmarks(click.Group):
    """``trimtab bench``: its commands live in the dev kit, loaded only when they are asked for, so that
    ``trimtab --help`` works where the dev kit is not installed."""

    def _real(self) -> click.Group:
        group: click.Group = _devkit("trimtab.devkit.bench.cli").bench
        return group

    def list_commands(self, ctx: click.Context) -> list[str]:
        try:
            return self._real().list_commands(ctx)
        except click.ClickException:
            return []

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self._real().get_command(ctx, cmd_name)


@main.group(cls=_Benchmarks)
def bench() -> None:
    """Benchmarks (docs/benchmarks.md). Each prints one JSON object with its targets beside it."""


if __name__ == "__main__":
    main()
