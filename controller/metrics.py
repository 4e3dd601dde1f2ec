"""The controller's Prometheus metrics (one factory, injected registry, bounded labels)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from trimtab.cluster.runner import job_failures_counter


@dataclass
class ControllerMetrics:
    leader: Gauge
    term: Gauge
    elections: Counter
    safe_mode: Gauge
    shed_cycles: Counter
    unloads: Counter
    shed_moves: Counter
    shed_seconds: Histogram
    load_avg: Gauge
    load_std: Gauge
    broker_load: Gauge
    overrides: Counter
    job_failures: Counter
    failed_brokers: Gauge
    healing_pending: Gauge
    healing_overdue: Gauge
    healing_paused: Gauge
    broker_failures: Counter
    snapshots: Counter
    snapshot_bundles: Gauge
    snapshot_seconds: Histogram
    monitor_runs: Counter
    admin: Counter
    standby_coverage: Gauge
    standby_missing: Gauge
    standby_writes: Counter
    operations: Gauge
    operation_moves: Counter
    operation_waits: Counter
    # The brokers trimtab_broker_load_ratio has a series for: a broker that left loses its series, so the
    # label's values stay bounded by the live brokers and a dead broker's last load raises no alert.
    load_brokers: set[str] = field(default_factory=set)

    @classmethod
    def create(cls, r: CollectorRegistry) -> ControllerMetrics:
        m = cls(
            leader=Gauge(
                "trimtab_controller_leader", "1 on the controller that currently leads.", registry=r
            ),
            term=Gauge(
                "trimtab_controller_term", "Leader term this controller holds (0 when following).", registry=r
            ),
            elections=Counter(
                "trimtab_controller_elections_total", "Leaderships won by this controller.", registry=r
            ),
            safe_mode=Gauge(
                "trimtab_controller_safe_mode",
                "1 while destructive work is held back (ZooKeeper session lost or settling after a reconnect).",
                registry=r,
            ),
            shed_cycles=Counter(
                "trimtab_shedding_cycles_total",
                "Shedding cycles by result (success, skip, failure) and reason "
                "(overloaded, underloaded, balanced, hit_count, cool_down, no_load_data, no_brokers, no_bundles, paused, safe_mode, "
                "unloads_in_flight, operations_not_loaded).",
                ["result", "reason"],
                registry=r,
            ),
            unloads=Counter(
                "trimtab_unloads_total",
                "Bundle moves published, by kind (transfer, unload) and reason (overloaded, underloaded, admin).",
                ["kind", "reason"],
                registry=r,
            ),
            shed_moves=Counter(
                "trimtab_shedding_moves_total",
                "Moves the shedder published, by how they ended: completed (the bundle left the in-flight "
                "states within shedding.unload_timeout_s) or timed_out (it did not: the move failed, and is not "
                "remembered as moved).",
                ["result"],
                registry=r,
            ),
            shed_seconds=Histogram(
                "trimtab_shedding_decision_seconds", "Time to compute one shedding decision.", registry=r
            ),
            load_avg=Gauge(
                "trimtab_broker_load_avg_ratio",
                "Average broker load (weighted max EMA, 1 = 100%).",
                registry=r,
            ),
            load_std=Gauge("trimtab_broker_load_std_ratio", "Standard deviation of broker load.", registry=r),
            broker_load=Gauge(
                "trimtab_broker_load_ratio",
                "Latest load (weighted max EMA) per broker, as the last shedding cycle saw it (live brokers "
                "with fresh load reports).",
                ["broker"],
                registry=r,
            ),
            job_failures=job_failures_counter(r),
            overrides=Counter(
                "trimtab_overrides_total",
                "Forced channel records by reason (failed_broker, stuck, tombstone) and result (published, failed).",
                ["reason", "result"],
                registry=r,
            ),
            failed_brokers=Gauge(
                "trimtab_failed_brokers", "Brokers recorded as failed and not yet healed.", registry=r
            ),
            healing_pending=Gauge(
                "trimtab_healing_pending_bundles",
                "Bundles still waiting to be moved off failed brokers.",
                registry=r,
            ),
            healing_overdue=Gauge(
                "trimtab_healing_overdue_brokers",
                "Failed brokers whose bundles are not all reassigned healing.alert_after_s after their first "
                "failure (set by the leader): the failed-broker alert.",
                registry=r,
            ),
            healing_paused=Gauge(
                "trimtab_healing_paused",
                "1 while self-healing is paused, by reason (mass_failure, disabled).",
                ["reason"],
                registry=r,
            ),
            broker_failures=Counter(
                "trimtab_broker_failures_total",
                "Failed-broker records by event (recorded, cancelled, healed).",
                ["event"],
                registry=r,
            ),
            snapshots=Counter(
                "trimtab_snapshots_total", "Channel snapshots by result.", ["result"], registry=r
            ),
            snapshot_bundles=Gauge(
                "trimtab_snapshot_bundles", "Bundles in the last snapshot written.", registry=r
            ),
            snapshot_seconds=Histogram(
                "trimtab_snapshot_duration_seconds", "Time to write one snapshot.", registry=r
            ),
            monitor_runs=Counter(
                "trimtab_monitor_runs_total", "Ownership monitor runs by result.", ["result"], registry=r
            ),
            admin=Counter(
                "trimtab_admin_requests_total",
                "Admin operations by op and result.",
                ["op", "result"],
                registry=r,
            ),
            standby_coverage=Gauge(
                "trimtab_standby_coverage_ratio",
                "Owned bundles that have all placement.standby_replicas warm standbys, as a fraction "
                "(1 when standbys are off or nothing is owned); set by the leader.",
                registry=r,
            ),
            standby_missing=Gauge(
                "trimtab_standby_missing",
                "Warm standbys the leader could not place (no broker allowed by the policies and tags).",
                registry=r,
            ),
            standby_writes=Counter(
                "trimtab_standby_writes_total",
                "Standby-set records written by the leader, by kind (set, tombstone) and result.",
                ["kind", "result"],
                registry=r,
            ),
            operations=Gauge(
                "trimtab_operations",
                "Operations the leader holds, by kind (shed, transfer, unload, drain, maintenance) and state "
                "(pending, running, paused, done, failed, cancelled); set by the leader.",
                ["kind", "state"],
                registry=r,
            ),
            operation_moves=Counter(
                "trimtab_operation_moves_total",
                "Moves of operations that ended, by kind and outcome (moved, already_there, moved_on, "
                "superseded, gone, cancelled).",
                ["kind", "outcome"],
                registry=r,
            ),
            operation_waits=Counter(
                "trimtab_operation_waits_total",
                "Moves of operations that could have started in a pass but did not, by reason "
                "(throttled_cluster, throttled_broker, throttled_namespace, arriving -- the bundle is still on its way to "
                "the broker it is to leave --, safe_mode).",
                ["reason"],
                registry=r,
            ),
        )
        # Present at 0 from the start: increase() then counts a new leader's first snapshot, and
        # TrimtabSnapshotsNotWritten sees a leader whose every write fails.
        for result in ("written", "failed"):
            m.snapshots.labels(result)
        return m
