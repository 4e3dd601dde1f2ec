"""A scenario from a recorded history (``trimtab pipeline tune`` replays it under a grid of settings).

What a trimtab history holds is per-broker load reports, the top-k bundles of each report and the channel.
From them this module rebuilds what the simulator needs, bucket by bucket:

* **brokers**: the ones reporting in the first bucket start the scenario; a broker that starts reporting
  later joins (``add_brokers``); one that stops leaves -- ``remove_brokers`` when its last report was a
  tombstone (a graceful stop), ``kill`` otherwise;
* **namespaces**: every namespace seen in the channel or the top-bundles reports, with its bundle count
  (distinct bundles last seen Owned, else seen in reports) and topic count (the latest report of each
  bundle);
* **traffic**: the cluster's msg/s per bucket, as of the bucket (every member's latest report so far, not
  only those that fell into it: brokers report on their own timers), split over namespaces by their
  share of the top-bundles rates, also as of the bucket (each bundle's latest report while its reporting
  broker is a member); the first bucket sets each
  namespace's ``msg_rate`` and later buckets become ``load_scale`` events (only when a factor moved more
  than ``min_change``).

Per-topic rates are not in a history (only the top-k bundles are), so topic skew is a parameter; the
scenario reproduces the namespaces' traffic over time and the membership changes, which is what drives
shedding. Pure: rows in, a validated :class:`~trimtab.sim.scenario.Scenario` out.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from trimtab.channel.bundles import parse_bundle
from trimtab.errors import BundleError, ConfigError
from trimtab.sim.scenario import Scenario, parse_scenario


def _ns(bundle: object) -> str | None:
    if not isinstance(bundle, str):
        return None
    try:
        return parse_bundle(bundle)[0]
    except BundleError:
        return None


def _f(x: object) -> float:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(float(x)) and float(x) >= 0 else 0.0


def scenario_from_history(
    broker_load: Iterable[Mapping[str, Any]],
    top_bundles: Iterable[Mapping[str, Any]],
    channel: Iterable[Mapping[str, Any]] = (),
    *,
    bucket_s: float = 300.0,
    name: str = "history",
    seed: int = 1,
    skew: float = 0.8,
    min_change: float = 0.05,
    config: Mapping[str, Any] | None = None,
    policies: tuple[str, ...] = ("transfer",),
) -> Scenario:
    """The scenario (see the module docstring). Rows are dicts with the history tables' columns:
    broker_load ``broker, reported_at, msg_rate_in, tombstone``; top_bundles ``broker, reported_at, bundle,
    msg_rate_in, topics``; channel ``bundle, state, offset``. Raises :class:`ConfigError` when the history
    has nothing to replay."""
    loads = [
        r for r in broker_load if isinstance(r.get("broker"), str) and isinstance(r.get("reported_at"), int)
    ]
    if not any(not r.get("tombstone") for r in loads):
        raise ConfigError(
            "the history has no broker load report to replay (run `trimtab pipeline ingest` first)"
        )
    t0 = int(min(r["reported_at"] for r in loads if not r.get("tombstone")))
    bucket_ms = max(1, int(bucket_s * 1000))

    def bucket(ms: int) -> int:
        return max(0, (ms - t0) // bucket_ms)

    m = _membership(loads, bucket, bucket_s)
    t = _traffic(top_bundles, channel, bucket, m)
    if not t.namespaces:
        raise ConfigError("the history has no top-bundles report naming a namespace: nothing to replay")

    def ns_rates(k: int) -> dict[str, float]:
        parts = t.share.get(k, {})
        total = sum(parts.values())
        if total <= 0:
            return {}
        return {ns: m.total.get(k, 0.0) * v / total for ns, v in parts.items()}

    base = ns_rates(0)
    for k in sorted(t.share):  # a namespace first reported later starts from its first bucket
        for ns, v in ns_rates(k).items():
            base.setdefault(ns, v)
    specs = []
    for ns in t.namespaces:
        bundles = max(1, len(t.owned.get(ns) or t.seen.get(ns) or ()))
        topics = sum(t.topics[b][1] for b in t.seen.get(ns, ()) if b in t.topics)
        specs.append(
            {
                "name": ns,
                "bundles": bundles,
                "topics": max(bundles, topics, 1),
                "msg_rate": round(base.get(ns, 0.0), 3),
                "skew": skew,
            }
        )
    events = list(m.events)
    current = {ns: 1.0 for ns in t.namespaces}
    for k in range(1, m.end + 1):
        r_k = ns_rates(k)
        scale: dict[str, float] = {}
        for ns in t.namespaces:
            if ns not in r_k or base.get(ns, 0.0) <= 0:
                continue
            f = min(1000.0, r_k[ns] / base[ns])
            if abs(f - current[ns]) > min_change * max(current[ns], 1e-9):
                scale[ns] = round(f, 4)
                current[ns] = f
        if scale:
            events.append({"at_s": k * bucket_s, "load_scale": scale})
    events.sort(key=lambda e: (e["at_s"], sorted(e)))
    doc = {
        "name": name,
        "description": f"replayed from a history: {m.brokers} brokers, {len(t.namespaces)} namespaces, "
        f"{m.end + 1} buckets of {bucket_s:g} s",
        "seed": seed,
        "duration_s": (m.end + 1) * bucket_s,
        "brokers": {"count": m.initial},
        "namespaces": specs,
        "events": events,
        "policies": list(policies),
        "config": dict(config or {}),
        "report": {"optimum": False},
    }
    return parse_scenario(doc, "history")


@dataclass
class _Membership:
    initial: int
    brokers: int
    end: int  # the last bucket
    events: list[dict[str, Any]]
    total: dict[int, float]  # bucket -> cluster msg/s in (as of the bucket: see _membership)
    last: dict[str, int]  # broker -> the last bucket it was a member in

    def alive(self, broker: object, k: int) -> bool:
        """Whether a broker still counts in bucket ``k`` (one the history never saw report: it might)."""
        return not isinstance(broker, str) or self.last.get(broker, self.end) >= k


def _membership(loads: list[Mapping[str, Any]], bucket: Callable[[int], int], bucket_s: float) -> _Membership:
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    graceful: dict[str, bool] = {}
    rate: dict[tuple[int, str], float] = {}
    for r in sorted(loads, key=lambda r: (r["reported_at"], r["broker"])):
        b, k = r["broker"], bucket(r["reported_at"])
        last[b] = k
        graceful[b] = bool(r.get("tombstone"))
        if not r.get("tombstone"):
            first.setdefault(b, k)
            rate[(k, b)] = _f(r.get("msg_rate_in"))
    end = max(last.values())
    initial = sum(1 for k in first.values() if k == 0) or 1
    events: list[dict[str, Any]] = [{"at_s": k * bucket_s, "add_brokers": 1} for k in first.values() if k > 0]
    for b, k in last.items():
        if k < end and b in first:
            events.append({"at_s": (k + 1) * bucket_s, ("remove_brokers" if graceful[b] else "kill"): 1})
    # As of each bucket: every member's latest report so far, not only the brokers that happened to report
    # inside it (brokers report on their own timers, so a bucket shorter than a report interval would
    # otherwise see the cluster's traffic saw up and down).
    reported: dict[int, list[tuple[str, float]]] = defaultdict(list)
    for (k, b), msg in rate.items():
        reported[k].append((b, msg))
    latest: dict[str, float] = {}
    total: dict[int, float] = {}
    for k in range(end + 1):
        latest.update(reported.get(k, ()))
        total[k] = sum(msg for b, msg in latest.items() if last[b] >= k)
    return _Membership(initial, len(first), end, events, total, last)


@dataclass
class _Traffic:
    namespaces: list[str]
    share: dict[int, dict[str, float]]  # bucket -> namespace -> top-bundle msg/s, as of the bucket
    seen: dict[str, set[str]]
    owned: dict[str, set[str]]
    topics: dict[str, tuple[int, int]]  # bundle -> (reported_at, topics) of its latest report


def _traffic(
    top_bundles: Iterable[Mapping[str, Any]],
    channel: Iterable[Mapping[str, Any]],
    bucket: Callable[[int], int],
    m: _Membership,
) -> _Traffic:
    topics: dict[str, tuple[int, int]] = {}
    seen: dict[str, set[str]] = defaultdict(set)
    reports: dict[int, list[tuple[int, str, object, float]]] = defaultdict(list)
    for r in top_bundles:
        bname, at = r.get("bundle"), r.get("reported_at")
        ns = _ns(bname)
        if ns is None or not isinstance(at, int) or not isinstance(bname, str):
            continue
        reports[bucket(at)].append((at, bname, r.get("broker"), _f(r.get("msg_rate_in"))))
        seen[ns].add(bname)
        t = r.get("topics")
        if isinstance(t, int) and t >= 0 and (bname not in topics or topics[bname][0] <= at):
            topics[bname] = (at, t)
    latest: dict[str, tuple[int, object]] = {}
    for r in channel:
        bname, off = r.get("bundle"), r.get("offset")
        if not isinstance(bname, str) or _ns(bname) is None or not isinstance(off, int):
            continue
        if bname not in latest or latest[bname][0] < off:
            latest[bname] = (off, r.get("state"))
    owned: dict[str, set[str]] = defaultdict(set)
    for bname, (_off, state) in latest.items():
        if state == "owned":
            owned[_ns(bname) or ""].add(bname)
    namespaces = sorted(set(seen) | {ns for ns in owned if ns})
    # As of each bucket, as the totals: each bundle's latest report so far (a bundle reported twice in one
    # bucket counts once; one that moved counts at its new broker), while the broker that sent it is a
    # member. A bucket before any report has no shares.
    share: dict[int, dict[str, float]] = {}
    bundle_rate: dict[str, tuple[int, object, float]] = {}  # bundle -> (reported_at, broker, msg/s)
    for k in range(min(reports, default=m.end + 1), m.end + 1):
        for at, bname, broker, msg in sorted(reports.get(k, ()), key=lambda x: x[0]):
            if bname not in bundle_rate or bundle_rate[bname][0] <= at:
                bundle_rate[bname] = (at, broker, msg)
        parts: dict[str, float] = defaultdict(float)
        for bname, (_at, broker, msg) in bundle_rate.items():
            if m.alive(broker, k):
                parts[_ns(bname) or ""] += msg
        share[k] = dict(parts)
    return _Traffic(namespaces, share, seen, owned, topics)
