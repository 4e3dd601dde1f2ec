"""Warm standbys on the wire (docs/placement.md, "Warm standbys"): the leader's standby sets, one compacted
record per bundle on ``kafka.standby_topic`` -- ``{"brokers": [id, ...], "term": n}``, a tombstone when the
bundle needs none -- followed by every agent (to pre-warm what it stands by for) and every controller (so
healing prefers a standby, and a new leader starts from its predecessor's sets).

Keyed by bundle rather than by broker so that a change rewrites only the bundles it touches and no record
grows with the cluster.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import msgspec

from trimtab.balance.assign import BrokerInfo, PlacementRule


class StandbySet(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    brokers: list[str]
    term: int = 0


class StandbyIndex:
    """Who stands by for what, as last published; thread-safe (fed from a topic follower's thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._of: dict[str, tuple[str, ...]] = {}
        self._listeners: list[Callable[[str], None]] = []

    def add_listener(self, fn: Callable[[str], None]) -> None:
        """``fn(bundle)`` after each record of the topic is read (the reader's thread)."""
        self._listeners.append(fn)

    def changed(self, bundle: str, value: StandbySet | None) -> None:
        """A :class:`~trimtab.cluster.kvview.KeyValueView` listener."""
        with self._lock:
            if value is None or not value.brokers:
                self._of.pop(bundle, None)
            else:
                self._of[bundle] = tuple(value.brokers)
        for fn in self._listeners:
            fn(bundle)

    def of(self, bundle: str) -> tuple[str, ...]:
        """The bundle's standbys in pick order (most preferred first); empty if none."""
        with self._lock:
            return self._of.get(bundle, ())

    def snapshot(self) -> dict[str, tuple[str, ...]]:
        with self._lock:
            return dict(self._of)

    def standing_by(self, broker: str) -> set[str]:
        """The bundles ``broker`` stands by for."""
        with self._lock:
            return {b for b, brokers in self._of.items() if broker in brokers}


def prefer_standbys(standbys: Callable[[str], tuple[str, ...]], restrict: PlacementRule) -> PlacementRule:
    """A placement rule that keeps, among the brokers ``restrict`` allows, the bundle's warm standbys when
    any is there -- they take it over fastest -- and all allowed brokers otherwise."""

    def rule(bundle: str, brokers: dict[str, BrokerInfo]) -> dict[str, BrokerInfo]:
        allowed = restrict(bundle, brokers)
        warm = {b: allowed[b] for b in standbys(bundle) if b in allowed}
        return warm or allowed

    return rule


def prefer_standby_set(
    standbys: Callable[[str], tuple[str, ...]], allowed: Callable[[str], frozenset[str]]
) -> Callable[[str], frozenset[str]]:
    """The same preference as :func:`prefer_standbys`, over sets of broker ids (healing plans)."""

    def rule(bundle: str) -> frozenset[str]:
        ok = allowed(bundle)
        warm = ok.intersection(standbys(bundle))
        return warm or ok

    return rule
