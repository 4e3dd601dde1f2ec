"""``trimtab bench ...``: the benchmarks, each printing one JSON object to stdout (progress on stderr).

Registered in ``trimtab.cli`` with ``main.add_command(bench)``; also runnable alone as
``python -m bench.cli channel ...``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import orjson
import structlog

from trimtab.devkit.bench.pipeline import WARMUP_RECORDS


@contextlib.contextmanager
def _logs_to_stderr() -> Iterator[None]:
    """structlog prints to stdout by default, and stdout carries the JSON alone: send warnings and worse
    to stderr while the bench runs, then put the previous configuration back (the bench also runs
    in-process, e.g. under pytest)."""
    was_configured = structlog.is_configured()
    old = structlog.get_config()
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
    try:
        yield
    finally:
        if was_configured:
            structlog.configure(**old)
        else:
            structlog.reset_defaults()


def _emit(result: dict[str, object], output: str | None) -> None:
    data = orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n"
    if output:
        Path(output).write_bytes(data)
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
def bench() -> None:
    """Benchmarks (docs/design.md section 11). Each prints one JSON object with its targets beside it."""


@bench.command("channel")
@click.option(
    "--records",
    type=click.IntRange(min=2),
    default=1_000_000,
    show_default=True,
    help="Messages in the generated channel log.",
)
@click.option(
    "--bundles",
    type=click.IntRange(min=1),
    default=100_000,
    show_default=True,
    help="Distinct bundles the log tracks.",
)
@click.option(
    "--runs",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="In-memory replay runs (the median is the headline).",
)
@click.option(
    "--kafka-runs",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Runs of each Kafka bootstrap measurement (median reported).",
)
@click.option(
    "--memory-bundles",
    type=click.IntRange(min=0),
    default=1_000_000,
    show_default=True,
    help="Bundles of the owned-only table for bytes_per_bundle_1m_bundles (0 to skip).",
)
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the log generator.")
@click.option("--skip-kafka", is_flag=True, help="Only the in-memory parts (replay, memory).")
@click.option(
    "--instructions",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Also count instructions per replayed record under valgrind's callgrind, over the first N "
    "records of the log (0: skip; 200000 takes ~40 s). Repeatable where wall-clock rates are not.",
)
@click.option(
    "--gc-freeze/--no-gc-freeze",
    default=True,
    show_default=True,
    help="gc.freeze() the generated log before measuring.",
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Also write the JSON to this file.",
)
def channel_cmd(
    records: int,
    bundles: int,
    runs: int,
    kafka_runs: int,
    memory_bundles: int,
    seed: int,
    skip_kafka: bool,
    instructions: int,
    gc_freeze: bool,
    output: str | None,
) -> None:
    """Channel replay speed, bootstrap over the Kafka protocol, and memory per bundle."""
    from trimtab.devkit.bench.channel import run
    from trimtab.devkit.bench.common import BenchError

    if records < 2 * bundles:
        raise click.BadParameter(
            f"need at least 2 records per bundle ({2 * bundles})", param_hint="--records"
        )
    try:
        with _logs_to_stderr():
            result = run(
                records=records,
                bundles=bundles,
                runs=runs,
                seed=seed,
                skip_kafka=skip_kafka,
                kafka_runs=kafka_runs,
                memory_bundles=memory_bundles,
                gc_freeze=gc_freeze,
                instructions=instructions,
            )
    except BenchError as e:
        click.echo(f"bench channel FAILED (no figures reported): {e}", err=True)
        sys.exit(1)
    _emit(result, output)


# lookup, shed and failover (lookup.py, shed.py, failover.py here; commands in commands.py)
from trimtab.devkit.bench.commands import register as _register_commands  # noqa: E402

_register_commands(bench, logs_to_stderr=_logs_to_stderr, emit=_emit)


if __name__ == "__main__":
    bench()


@bench.command("placement")
@click.option(
    "--bundles", type=click.IntRange(min=2000), default=100_000, show_default=True, help="Owned bundles."
)
@click.option("--seed", type=int, default=7, show_default=True)
@click.option("--output", type=click.Path(dir_okay=False), help="Also write the JSON to this file.")
def placement_cmd(bundles: int, seed: int, output: str | None) -> None:
    """Placement candidates for every bundle with isolation, domains and anti-affinity (target < 1 s)."""
    from trimtab.devkit.bench.placement import bench as run

    result = run(bundles, seed=seed)
    result["meets_targets"] = {"candidates_s": result["candidates_cold_s"] <= result["target_candidates_s"]}
    _emit(result, output)


@bench.command("compiled")
@click.option("--records", type=click.IntRange(min=2), default=1_000_000, show_default=True)
@click.option("--bundles", type=click.IntRange(min=1), default=100_000, show_default=True)
@click.option("--runs", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--output", type=click.Path(dir_okay=False), help="Also write the JSON to this file.")
def compiled_cmd(records: int, bundles: int, runs: int, output: str | None) -> None:
    """Replay with the channel's resolve and table modules compiled by mypyc vs interpreted (a prototype:
    what compiling the hot loop buys towards 1 000 000 records/s)."""
    from trimtab.devkit.bench.compiled import run

    _emit(run(records=records, bundles=bundles, runs=runs), output)


@bench.command("pipeline")
@click.option("--records", type=click.IntRange(min=1000), default=10_000_000, show_default=True)
@click.option("--bundles", type=click.IntRange(min=1), default=100_000, show_default=True)
@click.option(
    "--masters",
    default="local[1],local[2]",
    show_default=True,
    help="Spark masters to measure, comma-separated.",
)
@click.option(
    "--tasks", type=click.IntRange(min=1), default=8, show_default=True, help="Reading and fold tasks."
)
@click.option("--split-bytes", type=click.IntRange(min=1), default=64 << 20, show_default=True)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Measure every master this many times, interleaved; medians and the scaling of each round.",
)
@click.option(
    "--warmup-records",
    type=click.IntRange(min=0),
    default=WARMUP_RECORDS,
    show_default=True,
    help="Records of the export each fresh JVM compacts before the timed run.",
)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--driver-memory", default="4g", show_default=True)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".trimtab/bench-pipeline"),
    show_default=True,
    help="Where the generated export is kept (reused by later runs with the same records, bundles and seed).",
)
@click.option("--output", type=click.Path(dir_okay=False), help="Also write the JSON to this file.")
def pipeline_cmd(
    records: int,
    bundles: int,
    masters: str,
    tasks: int,
    split_bytes: int,
    rounds: int,
    warmup_records: int,
    seed: int,
    driver_memory: str,
    workdir: Path,
    output: str | None,
) -> None:
    """Channel compaction on Spark, local[1] vs local[2], beside the in-process replay of the same export
    (target: local[2]/local[1] >= 1.7). Needs the spark extra."""
    from trimtab.devkit.bench.common import BenchError, progress_printer
    from trimtab.devkit.bench.pipeline import run as run_pipeline
    from trimtab.pipeline.common import spark_missing

    missing = spark_missing()
    if missing is not None:
        raise click.ClickException(missing)
    if records < 2 * bundles:
        raise click.BadParameter(
            f"need at least 2 records per bundle ({2 * bundles})", param_hint="--records"
        )
    try:
        result = run_pipeline(
            records=records,
            bundles=bundles,
            seed=seed,
            masters=[m.strip() for m in masters.split(",") if m.strip()],
            tasks=tasks,
            split_bytes=split_bytes,
            rounds=rounds,
            warmup_records=warmup_records,
            workdir=workdir,
            driver_memory=driver_memory,
            progress=progress_printer("pipeline"),
        )
    except BenchError as e:
        click.echo(f"bench pipeline FAILED (no figures reported): {e}", err=True)
        sys.exit(1)
    _emit(result, output)


@bench.command("sim-profile")
@click.option(
    "--scenario",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Scenario file (default: the shipped 100-broker x 10 000-bundle one).",
)
@click.option("--output", type=click.Path(dir_okay=False), help="Also write the JSON to this file.")
def sim_profile_cmd(scenario: Path | None, output: str | None) -> None:
    """How fast the simulator could ever run the daemons' jobs: production code's share of a run."""
    from trimtab.devkit.bench.balance import production_share

    _emit(production_share(scenario, progress=lambda m: click.echo(m, err=True)), output)


@bench.command("kafka-restarts")
@click.option(
    "--cycles", type=click.IntRange(min=1), default=8, show_default=True, help="Whole-cluster restarts."
)
@click.option(
    "--followers", type=click.IntRange(min=1), default=6, show_default=True, help="Followers (nodes)."
)
@click.option("--brokers", type=click.IntRange(min=1), default=3, show_default=True, help="Kafka brokers.")
@click.option("--seed", type=int, default=1, show_default=True, help="Seeds the outages and the pauses.")
@click.option(
    "--outage-s",
    "outages",
    multiple=True,
    type=click.FloatRange(min=0),
    help="Outage lengths drawn from (repeatable; default 5, 15 and 30 s).",
)
@click.option("--output", type=click.Path(dir_okay=False), help="Also write the JSON to this file.")
def kafka_restarts_cmd(
    cycles: int, followers: int, brokers: int, seed: int, outages: tuple[float, ...], output: str | None
) -> None:
    """Stop and start a whole real Kafka cluster again and again: does every channel follower read again?"""
    from trimtab.devkit.bench.kafka_restarts import OUTAGES_S, run

    with _logs_to_stderr():
        result = run(
            cycles=cycles,
            followers=followers,
            brokers=brokers,
            seed=seed,
            outages_s=outages or OUTAGES_S,
            progress=lambda m: click.echo(m, err=True),
        )
    _emit(result, output)


@bench.command("balance")
@click.option(
    "--scenario",
    "scenarios",
    multiple=True,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Run these scenario files instead of the shipped suite (repeatable).",
)
@click.option("--no-tuned", is_flag=True, help="Skip the scale-out run with the tuned cadence settings.")
@click.option("--output", type=click.Path(dir_okay=False), help="Also write the JSON to this file.")
def balance_cmd(scenarios: tuple[Path, ...], no_tuned: bool, output: str | None) -> None:
    """The scenario suite in the simulator: trimtab's shedders, Pulsar's legacy ones and the exact optimum."""
    from trimtab.devkit.bench.balance import run as run_balance

    result = run_balance(
        list(scenarios) or None, tuned=not no_tuned, progress=lambda m: click.echo(m, err=True)
    )
    _emit(result, output)
