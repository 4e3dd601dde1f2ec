"""Broker adapters against real counterparts: the webhook adapter against the reference webhook server
(`trimtab sim-broker`, a real HTTP process), the command adapter against a real script, the retry wrapper,
and an agent process that manages its broker only through the webhook."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from tests.support.procs import Procs
from tests.support.waiting import wait_for
from trimtab.agent.adapters.base import BrokerSample, Lease, RetryingAdapter
from trimtab.agent.adapters.command import CommandAdapter
from trimtab.agent.adapters.webhook import WebhookAdapter
from trimtab.devkit.localcluster import LocalCluster
from trimtab.devkit.zkserver import free_port
from trimtab.errors import AdapterError

pytestmark = pytest.mark.integration

B1 = "public/default/0x00000000_0x40000000"
B2 = "public/default/0x40000000_0x80000000"


def lease(seconds: float = 30.0) -> Lease:
    """A lease that may be applied for the next minute."""
    return Lease(seconds, int((time.time() + 60) * 1000))


def _sim_broker(procs: Procs) -> str:
    port = free_port()
    procs.trimtab("sim-broker", "--port", str(port), "--broker-id", "webhook-test", name="sim-broker")
    url = f"http://127.0.0.1:{port}"
    wait_for(
        lambda: httpx.get(f"{url}/trimtab/v1/load", timeout=1).status_code == 200,
        timeout=30,
        ignore=(httpx.HTTPError,),
        message="the reference webhook server did not come up",
    )
    return url


def _state(url: str) -> dict:
    return httpx.get(f"{url}/trimtab/v1/sim/state", timeout=5).json()


def test_webhook_adapter_drives_the_reference_broker(procs: Procs) -> None:
    url = _sim_broker(procs)

    async def scenario() -> BrokerSample:
        a = WebhookAdapter(url, timeout_s=5)
        try:
            await a.acquire(B1, lease())
            await a.acquire(B1, lease())  # idempotent
            await a.acquire(B2, lease())
            await a.fence(B2)
            await a.close(B2, "pulsar://elsewhere:6650")
            await a.prewarm("public/default/0x80000000_0xc0000000")
            await a.split(
                B1, ["public/default/0x00000000_0x20000000", "public/default/0x20000000_0x40000000"]
            )
            return await a.sample()
        finally:
            await a.aclose()

    sample = asyncio.run(scenario())
    st = _state(url)
    assert st["serving"] == ["public/default/0x00000000_0x20000000", "public/default/0x20000000_0x40000000"]
    ops = [(e["op"], e["bundle"]) for e in st["timeline"]]
    assert ops[:4] == [("acquire", B1), ("acquire", B2), ("fence", B2), ("close", B2)]
    close = next(e for e in st["timeline"] if e["op"] == "close")
    assert close["detail"] == "pulsar://elsewhere:6650"
    # The sample decodes into the typed contract and reports the children now served.
    assert {b.bundle for b in sample.bundles} == set(st["serving"])
    assert sample.cpu is not None and sample.cpu.limit > 0


def test_webhook_adapter_reports_broker_errors(procs: Procs) -> None:
    url = _sim_broker(procs)

    async def bad() -> None:
        a = WebhookAdapter(url, timeout_s=5)
        try:
            await a.acquire("not a bundle", lease())
        finally:
            await a.aclose()

    with pytest.raises(AdapterError, match="HTTP 400"):
        asyncio.run(bad())

    async def unreachable() -> None:
        a = WebhookAdapter(f"http://127.0.0.1:{free_port()}", timeout_s=1)
        try:
            await a.fence(B1)
        finally:
            await a.aclose()

    with pytest.raises(AdapterError, match="fence"):
        asyncio.run(unreachable())


def _script(tmp_path: Path) -> list[str]:
    state = tmp_path / "served.txt"
    script = tmp_path / "broker-ctl.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, sys, pathlib
            op = sys.argv[1]
            body = json.loads(sys.stdin.read() or "{{}}")
            state = pathlib.Path({str(state)!r})
            served = set(state.read_text().split()) if state.exists() else set()
            if op == "acquire":
                served.add(body["bundle"])
            elif op in ("fence", "close"):
                served.discard(body["bundle"])
            elif op == "fail":
                print("broker refused", file=sys.stderr); sys.exit(3)
            elif op == "sample":
                print(json.dumps({{"bundles": [{{"bundle": b, "msg_rate_in": 10.0}} for b in sorted(served)]}}))
            state.write_text(" ".join(sorted(served)))
            """
        )
    )
    return [sys.executable, str(script)]


def test_command_adapter_runs_the_script(tmp_path: Path) -> None:
    cmd = _script(tmp_path)

    async def scenario() -> BrokerSample:
        a = CommandAdapter(cmd)
        await a.acquire(B1, lease())
        await a.acquire(B2, lease())
        await a.fence(B2)
        return await a.sample()

    sample = asyncio.run(scenario())
    assert [b.bundle for b in sample.bundles] == [B1]
    assert sample.bundles[0].msg_rate_in == 10.0
    assert sample.cpu is None  # host figures left for the agent to measure


def test_command_adapter_failures_carry_stderr(tmp_path: Path) -> None:
    a = CommandAdapter([*_script(tmp_path), "fail"])  # argv then op: the script sees "fail" first
    with pytest.raises(AdapterError, match="exit status 3: broker refused"):
        asyncio.run(a.acquire(B1, lease()))
    missing = CommandAdapter([str(tmp_path / "no-such-command")])
    with pytest.raises(AdapterError, match="cannot run"):
        asyncio.run(missing.fence(B1))


class _Flaky:
    """A broker whose acquire fails a given number of times (a stand-in for the broker, not a server)."""

    kind = "flaky"

    def __init__(self, failures: int, hang: bool = False) -> None:
        self.failures = failures
        self.hang = hang
        self.calls = 0

    async def acquire(self, bundle: str, lease: Lease) -> None:
        self.calls += 1
        if self.hang:
            await asyncio.sleep(3600)
        if self.calls <= self.failures:
            raise AdapterError("not yet")


def test_retrying_adapter_retries_with_backoff_then_gives_up() -> None:
    seen: list[tuple[str, str]] = []
    inner = _Flaky(failures=2)
    a = RetryingAdapter(
        inner, timeout_s=1, retries=3, backoff_s=0.01, observe=lambda op, r, s: seen.append((op, r))
    )  # type: ignore[arg-type]
    asyncio.run(a.acquire(B1, lease()))
    assert inner.calls == 3
    assert seen == [("acquire", "retry"), ("acquire", "retry"), ("acquire", "ok")]

    inner = _Flaky(failures=10)
    seen.clear()
    a = RetryingAdapter(
        inner, timeout_s=1, retries=2, backoff_s=0.01, observe=lambda op, r, s: seen.append((op, r))
    )  # type: ignore[arg-type]
    with pytest.raises(AdapterError, match="after 3 attempt"):
        asyncio.run(a.acquire(B1, lease()))
    assert inner.calls == 3 and seen[-1] == ("acquire", "failed")

    # No retry that would start after the lease's apply_by: the broker would refuse it (it is the
    # reconciler's to plan again with a fresh lease). The wall clock starts at 1000 s, apply_by is 1000.5 s.
    for backoff_s, calls in ((1.0, 1), (0.2, 2)):
        inner = _Flaky(failures=10)
        t0 = time.monotonic()
        a = RetryingAdapter(
            inner,
            timeout_s=1,
            retries=3,
            backoff_s=backoff_s,
            wall=lambda t0=t0: 1000.0 + time.monotonic() - t0,
        )  # type: ignore[arg-type]
        with pytest.raises(AdapterError, match="a retry would arrive after the lease's apply_by"):
            asyncio.run(a.acquire(B1, Lease(2.0, 1_000_500)))
        assert inner.calls == calls, backoff_s  # 0.2 s: a retry at 1000.2, none at 1000.6

    hung = _Flaky(failures=0, hang=True)
    a = RetryingAdapter(hung, timeout_s=0.05, retries=1, backoff_s=0.01)  # type: ignore[arg-type]
    with pytest.raises(AdapterError, match="TimeoutError"):
        asyncio.run(a.acquire(B1, lease()))
    assert hung.calls == 2


@pytest.mark.slow
def test_agent_manages_its_broker_only_through_the_webhook(tmp_path: Path, procs: Procs) -> None:
    url = _sim_broker(procs)
    with LocalCluster(tmp_path / "cluster", brokers=0, controllers=0) as cluster:
        agent = cluster.add_agent(
            args=["--set", "broker.adapter.kind=webhook", "--set", f"broker.adapter.url={url!r}"]
        )
        topic = "persistent://public/webhook/t-0001"
        answer = cluster.lookup(topic, via=agent)
        assert answer["owner"] == agent.broker
        wait_for(
            lambda: answer["bundle"] in _state(url)["serving"],
            timeout=15,
            message="webhook broker never acquired",
        )
        # The agent's load reports come from the webhook broker's sample.
        wait_for(
            lambda: cluster.get(agent, "/v1/brokers")["brokers"][agent.broker]["load"] is not None,
            timeout=30,
            message="no load report from the webhook broker",
        )
        # A transfer away is impossible (one broker); an unload through the channel reaches the broker:
        # SIGTERM drains with no other broker, so the bundle is unloaded (fenced and closed on the broker).
        assert cluster.terminate(agent.name, timeout=60) == 0
        st = _state(url)
        assert answer["bundle"] not in st["serving"]
        assert [e["op"] for e in st["timeline"] if e["bundle"] == answer["bundle"]][-2:] == ["fence", "close"]
