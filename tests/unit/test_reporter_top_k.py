"""The agent's top-k report and ``shedding.shed_bundles_with_policies``: with the setting off (the default),
the report leaves out the bundles of namespaces with policies -- the shedder may not move them -- so they
do not crowd out the ones it may (Pulsar's ``TopKBundles``); with it on, they are reported like any other."""

from __future__ import annotations

import asyncio

import msgspec

from trimtab.agent.adapters.base import BrokerSample
from trimtab.agent.metrics import AgentMetrics
from trimtab.agent.reporter import HostSampler, LoadReporter
from trimtab.balance.load import BundleStats, TopBundles, Usage
from trimtab.channel.memory import MemoryLog, MemoryTransport
from trimtab.cluster.metrics import new_registry
from trimtab.config.settings import Settings


class Broker:
    kind = "fixed"

    async def sample(self) -> BrokerSample:
        bundles = [
            BundleStats(bundle="t/pinned/0x00_0x80", msg_throughput_in=900.0),
            BundleStats(bundle="t/pinned/0x80_0xff", msg_throughput_in=800.0),
            BundleStats(bundle="t/free/0x00_0x80", msg_throughput_in=300.0),
            BundleStats(bundle="t/free/0x80_0xff", msg_throughput_in=200.0),
        ]
        return BrokerSample(cpu=Usage(1, 4), memory=Usage(1, 8), bundles=bundles)


def top_report(settings: Settings) -> list[str]:
    log = MemoryLog()
    transport = MemoryTransport(log)
    reporter = LoadReporter(
        "b1",
        Broker(),  # type: ignore[arg-type]
        transport,
        settings,
        AgentMetrics.create(new_registry()),
        host=HostSampler(settings),
        has_policies=pinned,
    )
    asyncio.run(reporter.report_once())
    (rec,) = [m for m in log.messages(settings.kafka.top_bundles_topic) if m.value is not None]
    return [b.bundle for b in msgspec.json.decode(rec.value, type=TopBundles).bundles]


def pinned(bundle: str) -> bool:
    return bundle.startswith("t/pinned/")


def test_bundles_with_policies_stay_out_of_the_top_k_by_default() -> None:
    s = Settings.model_validate({"load": {"top_k": 2}})
    assert top_report(s) == ["t/free/0x00_0x80", "t/free/0x80_0xff"]


def test_with_shedding_of_policy_bundles_allowed_they_are_reported() -> None:
    s = Settings.model_validate({"load": {"top_k": 2}, "shedding": {"shed_bundles_with_policies": True}})
    assert top_report(s) == ["t/pinned/0x00_0x80", "t/pinned/0x80_0xff"]
