"""Broker adapters; :func:`build_adapter` picks one from ``broker.adapter.kind``."""

from __future__ import annotations

from trimtab.agent.adapters.base import BrokerAdapter
from trimtab.agent.adapters.simulated import SimulatedBroker
from trimtab.config.settings import Settings
from trimtab.errors import ConfigError


def require_adapter_kind(settings: Settings) -> str:
    """``broker.adapter.kind``; :class:`ConfigError` when it is unset (there is no default)."""
    kind = settings.broker.adapter.kind
    if kind is None:
        raise ConfigError(
            "broker.adapter.kind is not set: an agent must be told how to reach its broker -- webhook (with "
            "broker.adapter.url, see docs/broker-adapter.md) or command (with broker.adapter.command). "
            '"simulated" runs a synthetic broker and is only for the local cluster, tests and benchmarks.'
        )
    return kind


def build_adapter(settings: Settings, broker_id: str) -> tuple[BrokerAdapter, SimulatedBroker | None]:
    """The broker adapter ``broker.adapter`` describes, and the simulated broker if that is the one."""
    a = settings.broker.adapter
    kind = require_adapter_kind(settings)
    if kind == "webhook":
        from trimtab.agent.adapters.webhook import WebhookAdapter

        assert a.url is not None  # checked by the settings validator
        return WebhookAdapter(a.url, a.timeout_s), None
    if kind == "command":
        from trimtab.agent.adapters.command import CommandAdapter

        return CommandAdapter(a.command), None
    cap = settings.broker.capacity
    sim = SimulatedBroker(
        broker_id,
        settings.sim,
        cpu_cores=cap.cpu_cores or 4.0,
        memory_bytes=float(cap.memory_bytes or 8 << 30),
        bandwidth_in=cap.bandwidth_in_bytes,
        bandwidth_out=cap.bandwidth_out_bytes,
    )
    return sim, sim
