"""``trimtab bench lookup | shed | failover | storm | hostile | agent-memory``: the click commands of the
lookup, shedding, failover, lookup-storm, hostile-client and agent-memory benchmarks. :func:`register`
attaches them to the ``bench`` group of :mod:`bench.cli` with that module's helpers (logs to stderr, one
JSON object on stdout), so every benchmark behaves the same way.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import click

from trimtab.devkit.bench.common import BenchError

_helpers: dict[str, Any] = {}


def register(
    group: click.Group,
    *,
    logs_to_stderr: Callable[[], AbstractContextManager[None]],
    emit: Callable[[dict[str, object], str | None], None],
) -> None:
    _helpers.update(logs=logs_to_stderr, emit=emit)
    for cmd in (lookup_cmd, shed_cmd, failover_cmd, storm_cmd, hostile_cmd, agent_memory_cmd):
        group.add_command(cmd)


def _run(name: str, fn: Callable[[], dict[str, Any]], output: str | None) -> None:
    logs: Callable[[], AbstractContextManager[None]] = _helpers["logs"]
    try:
        with logs():
            result = fn()
    except BenchError as e:
        click.echo(f"bench {name} FAILED (no figures reported): {e}", err=True)
        sys.exit(1)
    _helpers["emit"](result, output)


def _settings(sets: tuple[str, ...]) -> dict[str, Any]:
    from trimtab.config.loader import parse_assignments
    from trimtab.errors import ConfigError

    try:
        return parse_assignments(list(sets))
    except ConfigError as e:
        raise click.BadParameter(str(e), param_hint="--set") from None


output_option = click.option(
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Also write the JSON to this file.",
)
# The failover-shaped benchmarks (failover, storm): a broker owning many bundles is killed.
victim_bundles_option = click.option(
    "--bundles",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="Bundles the killed broker owns.",
)
per_namespace_option = click.option(
    "--per-namespace",
    type=click.IntRange(min=1, max=4096),
    default=1000,
    show_default=True,
    help="Bundles per namespace (namespace.default_bundles).",
)
session_timeout_option = click.option(
    "--session-timeout-s",
    type=click.FloatRange(min=1, max=120),
    default=4.0,
    show_default=True,
    help="zookeeper.session_timeout_s: the detection time.",
)
workdir_option = click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    default=None,
    help="Cluster directory (ZooKeeper data, configs, logs); default a temporary one, removed after a "
    "successful run and kept after a failed one.",
)


@click.command("lookup")
@click.option(
    "--topics",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="Topics assigned first, then looked up.",
)
@click.option(
    "--lookups", type=click.IntRange(min=1), default=5000, show_default=True, help="Measured owned lookups."
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=12,
    show_default=True,
    help="Keep-alive connections (spread over the 3 agents).",
)
@click.option(
    "--assign-samples",
    type=click.IntRange(min=1),
    default=240,
    show_default=True,
    help="Sequential lookups of unowned bundles.",
)
@click.option(
    "--rtt-samples",
    type=click.IntRange(min=1),
    default=600,
    show_default=True,
    help="Raw produce->consume round trips.",
)
@click.option(
    "--follower-samples",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="Round trips through the channel Follower.",
)
@click.option(
    "--alternative-fetch-wait-ms",
    type=click.IntRange(min=0, max=500),
    default=5,
    show_default=True,
    help="Repeat with this kafka.fetch_wait_max_ms (0: no repeat).",
)
@click.option(
    "--one-core-seconds",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="Each wrk run of the one-core phase (one agent pinned to CPU 0, wrk to CPU 1; 0: skip it).",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="SECTION.FIELD=VALUE",
    help="Cluster setting for both runs (repeatable).",
)
@click.option("--seed", type=int, default=1, show_default=True)
@workdir_option
@output_option
def lookup_cmd(
    topics: int,
    lookups: int,
    concurrency: int,
    assign_samples: int,
    rtt_samples: int,
    follower_samples: int,
    alternative_fetch_wait_ms: int,
    one_core_seconds: float,
    sets: tuple[str, ...],
    seed: int,
    workdir: str | None,
    output: str | None,
) -> None:
    """Owned-lookup latency and throughput, assignment latency vs the raw Kafka round trip."""
    from trimtab.devkit.bench.lookup import run

    settings = _settings(sets)
    _run(
        "lookup",
        lambda: run(
            topics=topics,
            lookups=lookups,
            concurrency=concurrency,
            assign_samples=assign_samples,
            rtt_samples=rtt_samples,
            follower_samples=follower_samples,
            alternative_fetch_wait_ms=alternative_fetch_wait_ms or None,
            one_core_seconds=one_core_seconds,
            settings=settings,
            seed=seed,
            workdir=Path(workdir) if workdir else None,
        ),
        output,
    )


@click.command("shed")
@click.option("--brokers", type=click.IntRange(min=4), default=1000, show_default=True)
@click.option("--bundles", type=click.IntRange(min=8), default=100_000, show_default=True)
@click.option(
    "--runs",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="Timed decisions (fresh state each).",
)
@click.option("--seed", type=int, default=1, show_default=True)
@output_option
def shed_cmd(brokers: int, bundles: int, runs: int, seed: int, output: str | None) -> None:
    """One shedding decision (TransferShedder, ThresholdShedder) over brokers x bundles."""
    from trimtab.devkit.bench.shed import run

    if bundles < 2 * brokers:
        raise click.BadParameter(
            f"need at least 2 bundles per broker ({2 * brokers})", param_hint="--bundles"
        )
    _run("shed", lambda: run(brokers=brokers, bundles=bundles, runs=runs, seed=seed), output)


@click.command("failover")
@victim_bundles_option
@per_namespace_option
@click.option("--agents", type=click.IntRange(min=3), default=4, show_default=True)
@click.option("--controllers", type=click.IntRange(min=1), default=2, show_default=True)
@session_timeout_option
@click.option(
    "--raised",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    show_default=True,
    help="Repeat with raised healing throttles (auto: if the defaults miss the target).",
)
@click.option(
    "--timeout-s",
    type=click.FloatRange(min=1),
    default=180.0,
    show_default=True,
    help="Give up waiting for the failover after detection + this.",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="SECTION.FIELD=VALUE",
    help="Cluster setting for every run (repeatable), e.g. healing.max_in_flight_per_broker=2000.",
)
@click.option(
    "--standbys",
    type=click.IntRange(min=0, max=16),
    default=0,
    show_default=True,
    help="Also run the failover cold and with this many warm standbys per bundle, side by side.",
)
@workdir_option
@output_option
def failover_cmd(
    bundles: int,
    per_namespace: int,
    agents: int,
    controllers: int,
    session_timeout_s: float,
    raised: str,
    timeout_s: float,
    sets: tuple[str, ...],
    standbys: int,
    workdir: str | None,
    output: str | None,
) -> None:
    """kill -9 a broker owning many bundles: time until every one is owned elsewhere, never two owners."""
    from trimtab.devkit.bench.failover import run

    settings = _settings(sets)
    _run(
        "failover",
        lambda: run(
            bundles=bundles,
            per_namespace=per_namespace,
            agents=agents,
            controllers=controllers,
            session_timeout_s=session_timeout_s,
            raised=raised,
            timeout_s=timeout_s,
            settings=settings,
            workdir=Path(workdir) if workdir else None,
            standbys=standbys,
        ),
        output,
    )


@click.command("storm")
@victim_bundles_option
@per_namespace_option
@click.option(
    "--agents", type=click.IntRange(min=3), default=5, show_default=True, help="Agents, the victim included."
)
@click.option(
    "--topics-per-bundle",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Topics looked up per bundle (lookups = bundles x this).",
)
@click.option(
    "--clients",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Concurrent keep-alive connections, spread over the surviving agents.",
)
@session_timeout_option
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="SECTION.FIELD=VALUE",
    help="Cluster setting (repeatable).",
)
@workdir_option
@output_option
def storm_cmd(
    bundles: int,
    per_namespace: int,
    agents: int,
    topics_per_bundle: int,
    clients: int,
    session_timeout_s: float,
    sets: tuple[str, ...],
    workdir: str | None,
    output: str | None,
) -> None:
    """kill -9 a broker owning many bundles while 1 000 clients look up its topics: time from the
    detection to the last answer, errors, assignments per bundle."""
    from trimtab.devkit.bench.storm import run

    settings = _settings(sets)
    _run(
        "storm",
        lambda: run(
            bundles=bundles,
            per_namespace=per_namespace,
            agents=agents,
            per_bundle=topics_per_bundle,
            clients=clients,
            session_timeout_s=session_timeout_s,
            settings=settings,
            workdir=Path(workdir) if workdir else None,
        ),
        output,
    )


@click.command("hostile")
@workdir_option
@output_option
def hostile_cmd(workdir: str | None, output: str | None) -> None:
    """Hostile clients against a live agent whose broker holds leases (docs/security.md, "Hostile
    clients"): a 100 MB body without a token, slowloris, a connection flood, a stalled body... with
    /healthz latency, the agent's memory, lease expiries and refusals by reason."""
    from trimtab.devkit.bench.hostile import run

    _run("hostile", lambda: run(Path(workdir) if workdir else None), output)


@click.command("agent-memory")
@click.option(
    "--bundles",
    type=click.IntRange(min=1),
    default=1_000_000,
    show_default=True,
    help="Bundles in the channel the agent tracks.",
)
@click.option(
    "--owners",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Brokers (not registered) the bundles are owned by.",
)
@click.option(
    "--samples", type=click.IntRange(min=1), default=5, show_default=True, help="RSS samples, 1 s apart."
)
@workdir_option
@output_option
def agent_memory_cmd(
    bundles: int, owners: int, samples: int, workdir: str | None, output: str | None
) -> None:
    """The resident memory of a real agent process tracking 1 000 000 bundles (real ZooKeeper and Kafka):
    agent_rss_mb_1m_bundles, its peak and what an agent costs on an empty channel."""
    from trimtab.devkit.bench.agent_memory import run

    _run(
        "agent-memory",
        lambda: run(
            bundles=bundles,
            owners=owners,
            samples=samples,
            workdir=Path(workdir) if workdir else None,
        ),
        output,
    )
