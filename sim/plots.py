"""PNG plots of a simulation: per-broker load over time (one chart per policy), load std against the target
(all policies on one chart), and cumulative shedding moves (all policies on one chart)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trimtab.sim.engine import RunResult


def plot_all(out: Path, report: dict[str, Any], runs: dict[str, RunResult]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    start = report["measure_from_s"]
    target = report["balance_target_std"]
    for policy, run in runs.items():
        fig, ax = plt.subplots(figsize=(9, 4.5))
        brokers = sorted({b for s in run.samples for b in s.loads})
        for b in brokers:
            ts = [s.t for s in run.samples if b in s.loads]
            ys = [100 * s.loads[b] for s in run.samples if b in s.loads]
            ax.plot(ts, ys, linewidth=0.8)
        ax.axvline(start, color="grey", linestyle=":", linewidth=1)
        ax.set(title=f"{report['scenario']}: broker load, {policy}", xlabel="time (s)", ylabel="load (%)")
        ax.grid(alpha=0.3)
        path = out / f"load-{policy}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for policy, run in runs.items():
        ax.plot([s.t for s in run.samples], [s.std for s in run.samples], label=policy, linewidth=1.2)
    ax.axhline(target, color="black", linestyle="--", linewidth=1, label="target")
    ax.axvline(start, color="grey", linestyle=":", linewidth=1)
    ax.set(title=f"{report['scenario']}: load std", xlabel="time (s)", ylabel="std of broker load")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "std.png", dpi=100)
    plt.close(fig)
    written.append(out / "std.png")

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for policy, run in runs.items():
        ax.step([s.t for s in run.samples], [s.moves for s in run.samples], where="post", label=policy)
    opt = report.get("optimum")
    if opt and opt.get("moves") is not None:
        ax.axhline(opt["moves"], color="black", linestyle="--", linewidth=1, label="exact minimum")
    ax.set(
        title=f"{report['scenario']}: cumulative shedding moves", xlabel="time (s)", ylabel="bundles moved"
    )
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "moves.png", dpi=100)
    plt.close(fig)
    written.append(out / "moves.png")
    return written
