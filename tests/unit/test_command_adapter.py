"""The command adapter's part of the signing contract (agent/adapters/command.py): with a key, each run
gets the signature of the equivalent webhook call in TRIMTAB_CALL_* variables -- one a broker verifies,
for the stdin bytes -- and never the key; without one, the environment is the agent's, unchanged."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from trimtab.agent.adapters.base import Lease
from trimtab.agent.adapters.command import ENV, ENV_METHOD, ENV_TARGET, CommandAdapter
from trimtab.agent.adapters.signing import Verifier
from trimtab.errors import ConfigError, SignatureRefused

KEY = b"0123456789abcdef0123456789abcdef"
ME = "broker-1:6650"
B1 = "public/default/0x00000000_0x40000000"


def recorder(tmp_path: Path) -> tuple[list[str], Path]:
    """A broker-ctl script that records, per run, its operation, stdin and environment."""
    out = tmp_path / "runs.jsonl"
    script = tmp_path / "broker-ctl.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, os, sys
            stdin = sys.stdin.buffer.read()
            with open({str(out)!r}, "a") as f:
                f.write(json.dumps({{"op": sys.argv[1], "stdin": stdin.decode(), "env": dict(os.environ)}}) + "\\n")
            if sys.argv[1] == "sample":
                print('{{"bundles": []}}')
            if sys.argv[1] == "renew":
                print('{{"not_serving": []}}')
            """
        )
    )
    return [sys.executable, str(script)], out


def runs(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def headers_from(env: dict[str, str]) -> dict[str, str]:
    return {header: env[var] for header, var in ENV.items()}


def test_each_run_gets_a_signature_a_broker_verifies_and_never_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIMTAB_BROKER__ADAPTER__HMAC_KEY", KEY.decode())
    cmd, out = recorder(tmp_path)
    a = CommandAdapter(cmd, hmac_key=KEY, broker_id=ME)
    lease = Lease(8.0, int(time.time() * 1000) + 60_000)

    async def scenario() -> None:
        await a.acquire(B1, lease)
        await a.renew([B1], lease)
        await a.close(B1, "pulsar://b2:6650")
        await a.sample()

    asyncio.run(scenario())
    verifier = Verifier(KEY, ME)
    seen = runs(out)
    assert [r["op"] for r in seen] == ["acquire", "renew", "close", "sample"]
    for run in seen:
        env = run["env"]
        assert "TRIMTAB_BROKER__ADAPTER__HMAC_KEY" not in env
        assert KEY.decode() not in json.dumps(env)
        method, target = env[ENV_METHOD], env[ENV_TARGET]
        if run["op"] == "sample":
            assert (method, target) == ("GET", "/trimtab/v1/load")
            body = b""  # stdin is "{}", but a GET has no body
        else:
            assert (method, target) == ("POST", f"/trimtab/v1/bundles/{run['op']}")
            body = run["stdin"].encode()
        verifier.verify(headers_from(env), method, target, body)
        # Forwarded twice (or to another broker), it is refused.
        with pytest.raises(SignatureRefused, match="replayed"):
            verifier.verify(headers_from(env), method, target, body)
        with pytest.raises(SignatureRefused, match="wrong_broker"):
            Verifier(KEY, "broker-2:6650").verify(headers_from(env), method, target, body)


def test_without_a_key_the_environment_is_the_agents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIMTAB_TEST_MARKER", "kept")
    cmd, out = recorder(tmp_path)
    asyncio.run(CommandAdapter(cmd).fence(B1))
    (run,) = runs(out)
    assert run["env"]["TRIMTAB_TEST_MARKER"] == "kept"
    assert not [k for k in run["env"] if k.startswith("TRIMTAB_CALL_")]


def test_a_signing_command_adapter_needs_the_broker_id() -> None:
    with pytest.raises(ConfigError, match="broker id"):
        CommandAdapter(["true"], hmac_key=KEY)
