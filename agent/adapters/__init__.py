"""Broker adapters; :func:`build_adapter` picks one from ``broker.adapter.kind``."""

from __future__ import annotations

from pathlib import Path

from trimtab.agent.adapters.base import BrokerAdapter
from trimtab.agent.adapters.signing import MIN_KEY_BYTES
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


def hmac_key(settings: Settings) -> bytes | None:
    """The webhook signing key from ``broker.adapter.hmac_key`` or the first line of ``hmac_key_file``;
    :class:`ConfigError` (naming the file, never its content) when the file is unusable."""
    a = settings.broker.adapter
    if a.hmac_key is not None:
        key = a.hmac_key.get_secret_value().encode()
    elif a.hmac_key_file is not None:
        try:
            lines = Path(a.hmac_key_file).read_bytes().splitlines()
        except OSError as e:
            raise ConfigError(f"broker.adapter.hmac_key_file {a.hmac_key_file}: {e.strerror}") from e
        key = lines[0].strip() if lines else b""
    else:
        return None
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(
            f"the webhook HMAC key must be at least {MIN_KEY_BYTES} bytes (broker.adapter.hmac_key[_file])"
        )
    return key


def build_adapter(settings: Settings, broker_id: str) -> tuple[BrokerAdapter, SimulatedBroker | None]:
    """The broker adapter ``broker.adapter`` describes, and the simulated broker if that is the one."""
    a = settings.broker.adapter
    kind = require_adapter_kind(settings)
    if kind == "webhook":
        from trimtab.agent.adapters.webhook import WebhookAdapter

        assert a.url is not None  # checked by the settings validator
        # Calls are signed for this broker's id: a call captured on its way to one broker is refused by
        # every other (docs/broker-adapter.md, "Signed calls").
        return WebhookAdapter(a.url, a.timeout_s, hmac_key=hmac_key(settings), broker_id=broker_id), None
    if kind == "command":
        from trimtab.agent.adapters.command import CommandAdapter

        return CommandAdapter(a.command, hmac_key=hmac_key(settings), broker_id=broker_id), None
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
