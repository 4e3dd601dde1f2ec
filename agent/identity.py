"""Who this broker is: its id, URLs and static registration, fixed once the HTTP port is bound."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trimtab.balance.assign import BrokerInfo
from trimtab.config.settings import Settings


@dataclass(frozen=True)
class BrokerIdentity:
    id: str
    http_url: str
    service_url: str
    start_time_ms: int
    tags: Mapping[str, str] = field(default_factory=dict)
    failure_domain: str | None = None
    version: str = "1.0.0"

    @classmethod
    def from_settings(cls, s: Settings, port: int, started_at: float) -> BrokerIdentity:
        """``port`` is the bound HTTP port (the broker id defaults to host:port); ``started_at`` wall-clock
        seconds."""
        http_url = s.http_url(port)  # https:// when the agent serves TLS
        b = s.broker
        return cls(
            id=s.broker_id(port),
            http_url=http_url,
            service_url=b.service_url or http_url,
            start_time_ms=int(started_at * 1000),
            tags=dict(b.tags),
            failure_domain=b.failure_domain,
            version=b.version,
        )

    def info(self, *, draining: bool) -> BrokerInfo:
        """The registration (``brokers/<id>`` znode) to publish."""
        return BrokerInfo(
            id=self.id,
            service_url=self.service_url,
            http_url=self.http_url,
            tags=dict(self.tags),
            failure_domain=self.failure_domain,
            version=self.version,
            start_time=self.start_time_ms,
            draining=draining,
        )
