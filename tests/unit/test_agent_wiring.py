"""The agent's module structure and its start-up checks: the daemon's parts are wired in one place
(:mod:`trimtab.agent.wiring`), no two agent modules import each other, the lifecycle and the HTTP API do
not know each other, and ``trimtab agent`` refuses an unset ``broker.adapter.kind`` before it binds or
connects anything."""

from __future__ import annotations

import ast
import socket
import time
from pathlib import Path

from click.testing import CliRunner

from trimtab.agent.adapters.simulated import SimulatedBroker
from trimtab.agent.api import SimControls, create_app
from trimtab.cli.main import main
from trimtab.cluster.auth import Authenticator
from trimtab.config.settings import Settings

AGENT = Path(__file__).resolve().parents[2] / "agent"


def agent_imports() -> dict[str, set[str]]:
    """Module (``daemon``, ``adapters.base``, ...) -> the agent modules it imports, anywhere in it
    (TYPE_CHECKING blocks and function bodies included)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(AGENT.rglob("*.py")):
        rel = path.relative_to(AGENT).with_suffix("")
        name = ".".join(p for p in rel.parts if p != "__init__") or "__init__"
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for t in targets:
                if t.startswith("trimtab.agent."):
                    deps.add(t.removeprefix("trimtab.agent."))
        graph[name] = deps
    modules = set(graph)
    # Keep only real modules ("from trimtab.agent.splits import SplitRefused" -> "splits").
    return {m: {d for d in deps if d in modules and d != m} for m, deps in graph.items()}


def test_the_agent_modules_are_wired_in_one_place() -> None:
    graph = agent_imports()
    assert {"daemon", "api", "wiring", "splits", "drain", "lookup", "reconciler", "reporter"} <= set(graph)
    mutual = sorted((a, b) for a, deps in graph.items() for b in deps if a < b and a in graph.get(b, set()))
    assert not mutual, f"agent modules importing each other: {mutual}"
    assert "api" not in graph["daemon"], "the lifecycle must not know the HTTP API"
    assert "daemon" not in graph["api"], "the HTTP API must not know the lifecycle (it has a Protocol)"
    importers = {m for m, deps in graph.items() if "daemon" in deps}
    assert importers == {"wiring"}, importers


def test_sim_routes_only_with_a_simulated_broker() -> None:
    from fastapi.testclient import TestClient

    plain = TestClient(create_app(None))  # type: ignore[arg-type]
    assert not [p for p in plain.app.openapi()["paths"] if p.startswith("/v1/sim")]  # type: ignore[attr-defined]
    assert plain.get("/v1/sim/state").status_code == 404

    sim = SimulatedBroker("b1:1", Settings().sim)
    pokes: list[int] = []
    controls = SimControls(sim, lambda: pokes.append(1))
    with_sim = TestClient(create_app(None, controls, auth=Authenticator.disabled()))  # type: ignore[arg-type]
    assert with_sim.get("/v1/sim/state").json()["broker"] == "b1:1"
    r = with_sim.post("/v1/sim/load", json={"scale": 2.5})
    assert r.status_code == 200 and sim.model.scale == 2.5 and pokes == [1]


def test_agent_without_an_adapter_kind_fails_before_binding_or_connecting() -> None:
    # The HTTP port is taken and nothing listens on the ZooKeeper port: an agent that got as far as
    # binding would fail on the port, one that got as far as ZooKeeper would wait for its timeout.
    with socket.socket() as taken, socket.socket() as closed:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        closed.bind(("127.0.0.1", 0))
        t0 = time.monotonic()
        result = CliRunner().invoke(
            main,
            [
                "agent",
                "--http-port",
                str(taken.getsockname()[1]),
                "--zookeeper",
                f"127.0.0.1:{closed.getsockname()[1]}",
                "--kafka",
                f"127.0.0.1:{closed.getsockname()[1]}",
            ],
            env={"TRIMTAB_BROKER__ADAPTER__KIND": None, "TRIMTAB_CONFIG": None},
        )
        took = time.monotonic() - t0
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    message = result.stderr
    assert "broker.adapter.kind is not set" in message, message
    for choice in ("webhook", "command", "simulated"):
        assert choice in message, message
    assert "address already in use" not in message.lower(), message
    assert took < 5, took
