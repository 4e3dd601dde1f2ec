"""The vocabulary every placement rule shares: brokers, names, and the one error a bad policy raises.

Kept apart from the rules so the isolation, anti-affinity and standby modules depend on nothing but this
(and each other's *functions*), and the daemons can build :class:`Broker` values from their registrations
without importing the rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from trimtab.errors import ConfigError

DEFAULT_DOMAIN = "default"
"""The failure domain of a broker that names none (Pulsar pools them under this very name, so a configured
domain called ``default`` shares it -- kept for compatibility, see docs/placement.md)."""


class PlacementConfigError(ConfigError, ValueError):
    """A placement policy that cannot be built (a regex that does not compile, a duplicate broker ...).

    Raised when the policy is *built*, never while placing: a bad regex found at placement time would turn
    every lookup of the affected namespaces into an error. It is also a :class:`ValueError` so that
    validation layers (pydantic) report it against the field that carried the bad value.
    """


@dataclass(frozen=True, slots=True, eq=True)
class Broker:
    """A live broker as placement sees it: its id, failure domain and tags (KIP-708 ``client.tag.*``).

    ``tags`` is copied into a read-only mapping so a policy built from it cannot change under a cache.
    """

    id: str
    domain: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.id:
            raise PlacementConfigError("a broker id must not be empty")
        object.__setattr__(self, "tags", MappingProxyType(dict(self.tags)))


def host_of(broker_id: str) -> str:
    """The host part of a broker id: the text before the *last* ``:`` (so ``[::1]:8080`` keeps its IPv6
    host). An id without a ``:`` is all host. Isolation regexes match this, never the port."""
    i = broker_id.rfind(":")
    return broker_id if i < 0 else broker_id[:i]


def namespace_of(bundle: str) -> str:
    """A bundle's namespace: its name minus the last ``/range`` segment (``t/ns/0x0_0x4`` -> ``t/ns``).

    Total on purpose (the daemons call it 100 000 times a pass): a name without ``/`` is its own namespace.
    The ``solve`` document refuses such names before they get here.
    """
    i = bundle.rfind("/")
    return bundle if i < 0 else bundle[:i]
