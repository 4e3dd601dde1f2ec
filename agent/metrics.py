"""The agent's Prometheus metrics, built once against an injected registry (bounded label values only)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from trimtab.cluster.runner import job_failures_counter

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
#: ``trimtab_lookups_total`` results of lookups refused before any work: a namespace nobody created (and
#: lookups may not), and a client over its rate (docs/security.md, "Namespaces and lookup limits").
NAMESPACE_NOT_FOUND = "namespace_not_found"
RATE_LIMITED = "rate_limited"
REFUSED_LOOKUPS = (NAMESPACE_NOT_FOUND, RATE_LIMITED)


@dataclass(eq=False)
class AgentMetrics:
    lookups: Counter
    lookup_seconds: Histogram
    reactions: Counter
    reaction_seconds: Histogram
    owned_bundles: Gauge
    adapter_calls: Counter
    adapter_seconds: Histogram
    reports: Counter
    splits: Counter
    merges: Counter
    assignments: Counter
    registered: Gauge
    draining: Gauge
    zk_connected: Gauge
    ready: Gauge
    standby_bundles: Gauge
    prewarms: Counter
    lease_renewals: Counter
    lease_confirmations: Counter
    leases_lost: Counter
    job_failures: Counter
    lease_remaining: Gauge
    fenced_all: Counter

    # The per-bundle path (a failover makes one agent take thousands of bundles) resolves its labelled
    # children once per label set: ``labels()`` takes a lock and builds a key on every call.
    @functools.cache  # noqa: B019 - one instance per process, the cache lives as long as it
    def lookup_result(self, result: str) -> tuple[Any, Any]:
        """``trimtab_lookups_total`` and ``trimtab_lookup_seconds`` of ``result`` (a bounded set): every
        lookup counts once, and the label look-up is not paid again per lookup."""
        return self.lookups.labels(result), self.lookup_seconds.labels(result)

    def lookup_done(self, result: str, seconds: float | None = None) -> None:
        """Count a lookup by ``result``, and time it when ``seconds`` is given."""
        counted, timed = self.lookup_result(result)
        counted.inc()
        if seconds is not None:
            timed.observe(seconds)

    @functools.cache  # noqa: B019
    def reaction(self, kind: str, result: str) -> Any:
        return self.reactions.labels(kind, result)

    @functools.cache  # noqa: B019
    def reaction_time(self, kind: str) -> Any:
        return self.reaction_seconds.labels(kind)

    @functools.cache  # noqa: B019
    def adapter_call(self, op: str, result: str) -> Any:
        return self.adapter_calls.labels(op, result)

    @functools.cache  # noqa: B019
    def adapter_time(self, op: str) -> Any:
        return self.adapter_seconds.labels(op)

    def observe_adapter(self, op: str, result: str, secs: float) -> None:
        """The :class:`agent.adapters.base.RetryingAdapter` observer: one adapter call's result and time."""
        self.adapter_call(op, result).inc()
        self.adapter_time(op).observe(secs)

    @classmethod
    def create(cls, registry: CollectorRegistry) -> AgentMetrics:
        lookups = Counter(
            "trimtab_lookups_total",
            "Topic lookups by result: owned (answered at once), assigned (this agent assigned it), waited "
            "(an in-flight bundle settled), timeout, bad_request, unavailable, namespace_not_found (404: the "
            "namespace does not exist and namespace.auto_create does not allow it), rate_limited (429: the "
            "client's agent.lookup_rate_per_client was spent).",
            ["result"],
            registry=registry,
        )
        # The refusals an attack makes exist from the start at 0, so that increase() sees the first one.
        for result in REFUSED_LOOKUPS:
            lookups.labels(result)
        return cls(
            lookups=lookups,
            lookup_seconds=Histogram(
                "trimtab_lookup_duration_seconds",
                "Lookup latency.",
                ["result"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            ),
            reactions=Counter(
                "trimtab_reactions_total",
                "Ownership steps this agent carried out, by kind (assign, transfer_out, unload, split, ...) and result.",
                ["kind", "result"],
                registry=registry,
            ),
            reaction_seconds=Histogram(
                "trimtab_reaction_duration_seconds",
                "Time to carry out one reaction.",
                ["kind"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            ),
            owned_bundles=Gauge(
                "trimtab_owned_bundles", "Bundles this agent's broker is serving.", registry=registry
            ),
            adapter_calls=Counter(
                "trimtab_adapter_calls_total",
                "Broker adapter calls by operation and result (ok, retry, failed).",
                ["op", "result"],
                registry=registry,
            ),
            adapter_seconds=Histogram(
                "trimtab_adapter_call_duration_seconds",
                "Adapter call latency.",
                ["op"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            ),
            reports=Counter(
                "trimtab_load_reports_total",
                "Load report cycles: published (reason first/changed/interval/forced) or skipped (unchanged), or failed.",
                ["result", "reason"],
                registry=registry,
            ),
            splits=Counter(
                "trimtab_splits_total",
                "Split decisions by reason (topics, sessions, msg_rate, bandwidth, admin) and result "
                "(published, skipped reasons, failed).",
                ["reason", "result"],
                registry=registry,
            ),
            merges=Counter(
                "trimtab_merges_total",
                "Automatic merge checks of pairs of neighbouring bundles, by result: started, refused, "
                "aborted_half_written, or why the pair was skipped (not_owned, owners_differ, merged_exists, "
                "no_stats, hot, would_split, hit_count, overlaps, min_bundles, cycle_limit, layout_unavailable, "
                "bad_bundle_name).",
                ["result"],
                registry=registry,
            ),
            assignments=Counter(
                "trimtab_assignments_total",
                "Assigning records this agent published for unowned bundles, by result (published: handed to the producer; failed: Kafka did not take it).",
                ["result"],
                registry=registry,
            ),
            registered=Gauge(
                "trimtab_broker_registered",
                "1 while the broker's ZooKeeper registration exists.",
                registry=registry,
            ),
            standby_bundles=Gauge(
                "trimtab_agent_standby_bundles",
                "Bundles this broker stands by for (warm standbys the leader assigned it).",
                registry=registry,
            ),
            prewarms=Counter(
                "trimtab_prewarms_total",
                "Pre-warm requests to the broker, by result (ok, failed).",
                ["result"],
                registry=registry,
            ),
            draining=Gauge(
                "trimtab_agent_draining", "1 while the agent drains before exiting.", registry=registry
            ),
            zk_connected=Gauge(
                "trimtab_zookeeper_connected",
                "1 while the ZooKeeper session is connected.",
                registry=registry,
            ),
            ready=Gauge(
                "trimtab_agent_ready",
                "1 once the agent serves lookups (registered, caught up).",
                registry=registry,
            ),
            lease_renewals=Counter(
                "trimtab_lease_renewals_total",
                "Lease renewal rounds, by result: ok, failed (the broker did not answer in time), "
                "zk_unconfirmed (the ZooKeeper session could not be confirmed: leases are left to run out).",
                ["result"],
                registry=registry,
            ),
            lease_confirmations=Counter(
                "trimtab_lease_session_confirmations_total",
                "ZooKeeper round trips that confirm the session broker leases rest on, by result (ok, failed).",
                ["result"],
                registry=registry,
            ),
            job_failures=job_failures_counter(registry),
            leases_lost=Counter(
                "trimtab_leases_lost_total",
                "Bundles the broker said it no longer served when their lease was renewed (it ran out).",
                registry=registry,
            ),
            lease_remaining=Gauge(
                "trimtab_lease_remaining_seconds",
                "How long a lease granted now could run, from the last ZooKeeper confirmation (0: none).",
                registry=registry,
            ),
            fenced_all=Counter(
                "trimtab_fence_all_total",
                "Times the agent fenced everything its broker served at once, by reason "
                "(session_lost, startup, shutdown).",
                ["reason"],
                registry=registry,
            ),
        )
