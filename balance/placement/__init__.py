"""Placement policies (docs/design.md section 6, docs/placement.md): isolation, anti-affinity over failure
domains, the shedder's move guards, and tag-aware warm standbys -- a pure core the daemons call.

Build a :class:`PlacementPolicy` from the live brokers and the policies, wrap it with the ownership index
in a :class:`Placement`, then ask ``candidates``/``may_unload``/``may_transfer``/``standbys``. The rules
also exist as plain functions (``isolation_candidates``, ``anti_affinity_filter``, ``place_standbys``)
for callers that hold their own state.
"""

from __future__ import annotations

from trimtab.balance.placement.affinity import CandidateLayout, anti_affinity_filter, group_key
from trimtab.balance.placement.core import NamespaceRules, Placement, PlacementPolicy
from trimtab.balance.placement.isolation import (
    IsolationPolicy,
    is_shared,
    isolation_candidates,
    policy_for,
    sorted_policies,
)
from trimtab.balance.placement.model import (
    DEFAULT_DOMAIN,
    Broker,
    PlacementConfigError,
    host_of,
    namespace_of,
)
from trimtab.balance.placement.standby import StandbySpec, forced_caps, forced_ok, place_standbys

__all__ = [
    "DEFAULT_DOMAIN",
    "Broker",
    "CandidateLayout",
    "IsolationPolicy",
    "NamespaceRules",
    "Placement",
    "PlacementConfigError",
    "PlacementPolicy",
    "StandbySpec",
    "anti_affinity_filter",
    "forced_caps",
    "forced_ok",
    "group_key",
    "host_of",
    "is_shared",
    "isolation_candidates",
    "namespace_of",
    "place_standbys",
    "policy_for",
    "sorted_policies",
]
