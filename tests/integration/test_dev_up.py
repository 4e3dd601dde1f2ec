"""The README's main command, `trimtab dev up`, run for real as a subprocess and driven through its state
file, plus the `trimtab admin` CLI against the cluster it started."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.procs import Proc, Procs
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def dev_up(procs: Procs, tmp_path: Path, *args: str, name: str) -> tuple[Proc, dict[str, Any]]:
    """Start ``trimtab dev up ARGS`` without its live view, its state file and work directory in
    ``tmp_path``; returns the process and the state file once it is written."""
    state_file = tmp_path / "state.json"
    proc = procs.trimtab(
        "dev",
        "up",
        *args,
        "--no-view",
        "--state-file",
        str(state_file),
        "--workdir",
        str(tmp_path / "work"),
        name=name,
    )
    state = wait_for(
        lambda: state_file.exists() and json.loads(state_file.read_text()),
        timeout=90,
        message=lambda: f"no state file; dev up stderr:\n{proc.stderr()[-2000:]}",
    )
    return proc, state


def test_dev_up_runs_a_cluster_scripts_can_drive(tmp_path: Path, procs: Procs) -> None:
    state_file = tmp_path / "state.json"
    proc, state = dev_up(
        procs,
        tmp_path,
        "--brokers",
        "3",
        "--namespaces",
        "4",
        "--hot",
        "1",
        "--duration",
        "25",
        "--zk-servers",
        "3",
        name="dev-up",
    )
    assert len(state["agents"]) == 3 and len(state["controllers"]) == 2
    assert len(state["zookeeper"].split(",")) == 3  # an ensemble: every node connects to all three
    assert all(a["broker"] and a["http"].startswith("http://") and a["pid"] > 0 for a in state["agents"])
    # Security is on: the state file says where the token files are (owner-only), never the tokens.
    sec = state["security"]
    admin_file, read_file = Path(sec["admin_token_file"]), Path(sec["read_token_file"])
    for f in (admin_file, read_file, Path(sec["zookeeper_digest_file"])):
        assert f.stat().st_mode & 0o777 == 0o600, f
        assert f.read_text().strip() not in state_file.read_text()
    wait_for(lambda: "--token-file" in proc.stderr(), timeout=30, message=lambda: proc.stderr()[-2000:])
    c0 = state["controllers"][0]["http"]
    assert httpx.get(f"{c0}/v1/status", timeout=10).status_code == 401
    read = {"authorization": f"Bearer {read_file.read_text().strip()}"}
    assert httpx.get(f"{c0}/v1/status", headers=read, timeout=10).status_code == 200

    # A real Prometheus (scripts/setup.sh installs it) scrapes every node, with the alert rules loaded.
    prom = state["prometheus"]["url"]

    def scraped() -> list[dict[str, object]] | None:
        targets = httpx.get(f"{prom}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        return targets if len(targets) == 5 and all(t["health"] == "up" for t in targets) else None

    wait_for(scraped, timeout=30, message=lambda: f"Prometheus at {prom} does not scrape every node")
    rules = httpx.get(f"{prom}/api/v1/rules", timeout=5).json()["data"]["groups"]
    assert any(r["name"] == "TrimtabAgentDown" for g in rules for r in g["rules"])
    assert prom in proc.stderr()

    # Lookups work through any agent, and every agent agrees on the owner.
    topic = "persistent://public/dev-test/t-0001"
    answers = [
        httpx.get(f"{a['http']}/v1/lookup", params={"topic": topic}, timeout=40).json()
        for a in state["agents"]
    ]
    assert len({a["owner"] for a in answers}) == 1, answers
    assert answers[0]["owner"] in {a["broker"] for a in state["agents"]}

    # The admin CLI reaches the leader through any controller (followers redirect).
    for c in state["controllers"]:
        out = (
            procs.run_trimtab(
                "admin",
                "--controller",
                c["http"],
                "--token-file",
                str(admin_file),
                "-o",
                "json",
                "leader",
                timeout=30,
            )
            .check()
            .json()
        )
        assert out["leader"]["term"] >= 1
    status = procs.run_trimtab(
        "admin",
        "--controller",
        state["controllers"][-1]["http"],
        "--token-file",
        str(admin_file),
        "--output",
        "json",
        "status",
        timeout=30,
    )
    brokers = status.check().json()["brokers"]
    assert set(brokers) == {a["broker"] for a in state["agents"]}

    finished = proc.wait(timeout=120).check()
    summary = finished.json()
    assert summary["brokers"] == 3 and summary["controllers"] == 2
    assert summary["lookups"]["ok"] == 4 * 64 and summary["lookups"]["failed"] == 0
    assert summary["exited_unexpectedly"] == []
    assert summary["load"]["initial_std"] is not None and summary["load"]["final_std"] is not None
    assert summary["leader"]["term"] >= 1
    assert summary["prometheus"]["url"] == prom and isinstance(summary["prometheus"]["alerts"], list)
    assert not state_file.exists(), "the state file should be removed when the cluster stops"
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{prom}/-/ready", timeout=5)  # stopped with the cluster
    # Every process it started is gone.
    for p in [*state["agents"], *state["controllers"], state["prometheus"]]:
        with pytest.raises(ProcessLookupError):
            import os

            os.kill(p["pid"], 0)


@pytest.mark.parametrize("broker_processes", [False, True], ids=["in-agent", "broker-processes"])
def test_dev_up_stops_cleanly_on_ctrl_c(tmp_path: Path, procs: Procs, broker_processes: bool) -> None:
    proc, state = dev_up(
        procs,
        tmp_path,
        *(["--broker-processes"] if broker_processes else []),
        "--brokers",
        "2",
        "--controllers",
        "1",
        "--namespaces",
        "2",
        name="dev-up-ctrl-c",
    )
    # Wait until the warm-up is done (the summary needs it), then interrupt as a user would.
    wait_for(
        lambda: "assigned bundles for" in proc.stderr(), timeout=90, message=lambda: proc.stderr()[-2000:]
    )
    if broker_processes:
        # Each broker is its own process, listed in the state file, with a timeline of what it served.
        assert len(state["brokers"]) == 2
        assert {b["broker"] for b in state["brokers"]} == {a["broker"] for a in state["agents"]}
        assert {b["pid"] for b in state["brokers"]}.isdisjoint({a["pid"] for a in state["agents"]})
        for b in state["brokers"]:
            st = httpx.get(f"{b['http']}/trimtab/v1/sim/state", timeout=5).json()
            assert st["broker"] == b["broker"]
            assert all({"op", "bundle", "mono_ns"} <= set(e) for e in st["timeline"])
        assert any(
            e["op"] == "acquire"
            for b in state["brokers"]
            for e in httpx.get(f"{b['http']}/trimtab/v1/sim/state", timeout=5).json()["timeline"]
        )
    else:
        assert state["brokers"] == []
    proc.signal_group(signal.SIGINT)
    finished = proc.wait(timeout=90).check()
    assert finished.json()["brokers"] == 2
    assert "stopped." in finished.stderr
    import os

    for p in state["agents"] + state["controllers"] + state["brokers"]:
        with pytest.raises(ProcessLookupError):
            os.kill(p["pid"], 0)
