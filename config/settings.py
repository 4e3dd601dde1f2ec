"""Every trimtab knob, in one pydantic model.

Precedence: built-in defaults < config file (TOML) < environment (``TRIMTAB_<SECTION>__<FIELD>``) < command
line flags. Each field's description names the Pulsar (or Kafka/Cruise Control) setting it mirrors in
brackets, so operators can carry their tuning over; docs/configuration.md is generated from this file.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

Pct = Annotated[float, Field(ge=0, le=100)]
# librdkafka settings whose values are secrets (sasl.password, ssl.key.password, sasl.jaas.config,
# sasl.oauthbearer.client.secret, ssl.key.pem...): masked wherever the configuration is shown.
_SECRET_KAFKA_KEY = re.compile(r"password|secret|jaas|key\.pem|token|credential", re.IGNORECASE)
Seconds = Annotated[float, Field(gt=0)]


MIN_TOKEN_CHARS = 16
# The least time, after an in-flight record is written, that a broker must have to take the bundle
# under a lease (channel.in_flight_timeout_s - broker.adapter.lease_margin_s; see the validator below).
MIN_ACQUIRE_WINDOW_S = 1.0


def valid_token(token: str) -> bool:
    """A bearer token trimtab accepts: long enough not to be guessed, no whitespace (it is one header word)."""
    return len(token) >= MIN_TOKEN_CHARS and not any(c.isspace() for c in token)


def valid_digest(credentials: str) -> bool:
    """ZooKeeper digest credentials: ``user:password``, both non-empty, no whitespace."""
    user, sep, password = credentials.partition(":")
    return bool(sep and user and password) and not any(c.isspace() for c in credentials)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ClusterSettings(Section):
    name: str = Field(
        "local",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="Cluster name; ZooKeeper state lives under <zookeeper.root>/<name>. [clusterName]",
    )


class ZooKeeperSettings(Section):
    hosts: str = Field(
        "127.0.0.1:2181", description="ZooKeeper connect string host:port[,host:port]. [metadataStoreUrl]"
    )
    root: str = Field(
        "/trimtab", pattern=r"^/[^\s]*$", description="Root znode; each cluster uses <root>/<cluster.name>."
    )
    session_timeout_s: float = Field(
        10.0,
        ge=1,
        le=120,
        description="ZooKeeper session timeout: how long a dead agent's broker znode survives, i.e. the failure "
        "detection time. [metadataStoreSessionTimeoutMillis]",
    )
    connect_timeout_s: Seconds = Field(
        15.0, description="How long start-up waits for a first ZooKeeper connection."
    )
    auth_digest: SecretStr | None = Field(
        None,
        description="ZooKeeper digest credentials user:password (docs/security.md). When set (or "
        "auth_digest_file), the session authenticates with them and every znode trimtab creates gets ACLs: all "
        "rights for this identity, read-only for everyone else. Every node of a cluster must use the same. "
        "Prefer auth_digest_file or TRIMTAB_ZOOKEEPER__AUTH_DIGEST to keep it out of config files.",
    )
    auth_digest_file: str | None = Field(
        None, description="File holding the ZooKeeper digest credentials (first line, user:password)."
    )


class KafkaSettings(Section):
    bootstrap_servers: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers (host:port,...).")
    client_config: dict[str, str] = Field(
        default_factory=dict,
        description="Extra librdkafka settings for every Kafka client trimtab creates (security.protocol, "
        "sasl.*, ssl.*...; docs/security.md). Values of secret-looking keys (password, secret, jaas...) are "
        "masked when the configuration is shown; keep them in client_config_file instead.",
    )
    client_config_file: str | None = Field(
        None,
        description="A librdkafka properties file (key=value lines, # comments) merged over client_config at "
        "start-up: where sasl.password, ssl.key.password and other secrets belong. Never shown or logged.",
    )
    channel_topic: str = Field(
        "trimtab-channel",
        description="Bundle state channel (never compacted; time/size retention). "
        "[persistent://pulsar/system/loadbalancer-service-unit-state]",
    )
    snapshot_topic: str = Field(
        "trimtab-channel-snapshot", description="Compacted channel snapshots, written by the leader."
    )
    broker_load_topic: str = Field(
        "trimtab-broker-load", description="Compacted broker load reports. [loadbalancer-broker-load-data]"
    )
    top_bundles_topic: str = Field(
        "trimtab-top-bundles",
        description="Compacted top-k bundle loads per broker. [loadbalancer-top-bundles-load-data]",
    )
    events_topic: str = Field("trimtab-events", description="Append-only decision and audit events.")
    standby_topic: str = Field(
        "trimtab-standbys",
        description="Compacted warm-standby sets, one key per bundle (the brokers that pre-warm it), "
        "written by the leader when placement.standby_replicas > 0.",
    )
    channel_partitions: int = Field(
        4,
        ge=1,
        le=1024,
        description="Partitions of the channel when trimtab creates it. Never change it later.",
    )
    replication_factor: int = Field(
        -1, ge=-1, le=32, description="Replication factor for topics trimtab creates (-1: broker default)."
    )
    min_insync_replicas: int | None = Field(
        None,
        ge=1,
        le=32,
        description="min.insync.replicas of the topics trimtab creates. Unset: 2 when replication_factor is 3 "
        "or more (an acknowledged write is on two brokers, and one broker may be down), else the broker's "
        "default.",
    )
    channel_retention_ms: int = Field(
        604_800_000,
        ge=3_600_000,
        description="retention.ms of the channel when trimtab creates it (7 days). History older than this is "
        "deleted; nodes bootstrap from the leader's snapshots, written every channel.snapshot_interval_s.",
    )
    compacted_segment_ms: int = Field(
        3_600_000,
        ge=1,
        description="segment.ms of the compacted topics trimtab creates (1 hour). The log cleaner only compacts "
        "closed segments: this bounds how long a dead broker's tombstoned load report or an old snapshot's "
        "chunks stay before compaction can remove them.",
    )
    min_cleanable_dirty_ratio: float = Field(
        0.1,
        gt=0,
        le=1,
        description="min.cleanable.dirty.ratio of the compacted topics trimtab creates: how much of a log may "
        "be superseded values before the cleaner runs (Kafka's default, 0.5, keeps twice what is needed).",
    )
    delete_retention_ms: int = Field(
        86_400_000,
        ge=1,
        description="delete.retention.ms of the compacted topics trimtab creates (1 day): how long a tombstone "
        "stays after compaction, so that a node reading the topic sees the delete and not only the value "
        "before it. Keep it far above the longest time a node takes to read a topic.",
    )
    fetch_wait_max_ms: int = Field(
        100,
        ge=1,
        le=500,
        description="fetch.wait.max.ms of channel readers: how long Kafka may hold a fetch that finds no new "
        "record. Kafka answers a waiting fetch as soon as a record arrives, so this does not delay the "
        "channel; it bounds how often an idle reader asks again (each node, each broker). Lower it only for a "
        "Kafka that does not wake waiting fetches (librdkafka's mock cluster).",
    )
    linger_ms: float = Field(
        5.0,
        ge=0,
        le=1000,
        description="Producer linger.ms for channel writes (librdkafka's default). Shorter saves a few "
        "milliseconds per channel hop of a lookup, but a failover's thousands of records then go out in "
        "more, smaller batches, which costs every node CPU.",
    )

    @field_serializer("client_config", when_used="json")
    def _mask_secrets(self, value: dict[str, str]) -> dict[str, str]:
        """``trimtab config show`` (JSON) never prints a password that was put in client_config."""
        return {k: "**********" if _SECRET_KAFKA_KEY.search(k) else v for k, v in value.items()}


class AdapterSettings(Section):
    kind: Literal["simulated", "webhook", "command"] | None = Field(
        None,
        description="How the agent talks to its broker: webhook (the HTTP contract in docs/broker-adapter.md) or "
        "command. Required to run an agent: no default, so an agent deployed beside a real broker never "
        "manages a fake one. simulated (a built-in synthetic broker) is for the local cluster, tests and "
        "benchmarks.",
    )
    url: str | None = Field(None, description="Webhook base URL (kind=webhook), e.g. http://127.0.0.1:8081.")
    command: list[str] = Field(
        default_factory=list,
        description="Command and arguments (kind=command); the operation and a JSON body are passed on stdin.",
    )
    timeout_s: Seconds = Field(10.0, description="Timeout of one adapter call.")
    retries: int = Field(
        3, ge=0, le=20, description="Retries of a failed adapter call (exponential backoff)."
    )
    backoff_s: Seconds = Field(0.2, description="First retry delay; doubles each retry.")
    lease_s: float | None = Field(
        None,
        gt=0,
        description="Lease the broker grants on every bundle it acquires; the agent renews it every third of "
        "the lease and the broker stops serving a bundle whose lease ran out without being told "
        "(docs/broker-adapter.md). Must satisfy zookeeper.session_timeout_s >= lease_s + lease_margin_s, so "
        "that every lease of a failed agent has ended before the leader reassigns its bundles. Default: "
        "zookeeper.session_timeout_s - lease_margin_s.",
    )
    lease_margin_s: float = Field(
        2.0,
        ge=0.5,
        description="Safety margin between a lease's end and the earliest moment the agent's ZooKeeper session "
        "can expire: covers request delivery to the broker (a lease request older than half of it is "
        "refused by the broker) and clock-rate drift.",
    )
    hmac_key: SecretStr | None = Field(
        None,
        description="Shared secret (at least 16 bytes) that signs every webhook call for this broker's id "
        "(broker.id), with a timestamp and a one-time nonce: HMAC-SHA256 over the scheme tag, broker id, "
        "method, path and query, timestamp, nonce and body; headers X-Trimtab-Broker, X-Trimtab-Timestamp, "
        "X-Trimtab-Nonce and X-Trimtab-Signature. The broker refuses forged calls, calls meant for another "
        "broker, and replays (docs/broker-adapter.md, 'Signed calls'). The command adapter passes the same "
        "signature to its script in TRIMTAB_CALL_* variables. Prefer hmac_key_file or "
        "TRIMTAB_BROKER__ADAPTER__HMAC_KEY to keep it out of config files.",
    )
    hmac_key_file: str | None = Field(
        None, description="File holding the webhook HMAC key (first line); read at start-up."
    )


class CapacitySettings(Section):
    cpu_cores: float | None = Field(None, gt=0, description="CPU limit in cores (default: the host's).")
    memory_bytes: int | None = Field(None, gt=0, description="Memory limit in bytes (default: the host's).")
    bandwidth_in_bytes: float = Field(
        125_000_000.0,
        gt=0,
        description="Inbound bandwidth limit, bytes/s. [loadBalancerOverrideBrokerNicSpeedGbps]",
    )
    bandwidth_out_bytes: float = Field(
        125_000_000.0,
        gt=0,
        description="Outbound bandwidth limit, bytes/s. [loadBalancerOverrideBrokerNicSpeedGbps]",
    )


class BrokerSettings(Section):
    id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$",
        description="Stable broker id (default host:port of the agent's HTTP address). [brokerId = host:webPort]",
    )
    service_url: str | None = Field(
        None,
        description="URL clients are redirected to, e.g. pulsar://host:6650 (default: the agent's HTTP URL).",
    )
    tags: dict[str, str] = Field(
        default_factory=dict, description="Free-form tags (zone, rack, cluster, ...). [KIP-708 client.tag.*]"
    )
    failure_domain: str | None = Field(
        None, description="Failure domain this broker belongs to. [PIP-7 failureDomain]"
    )
    version: str = Field("1.0.0", description="Broker version, for the version filter. [brokerVersion]")
    capacity: CapacitySettings = Field(default_factory=CapacitySettings)
    adapter: AdapterSettings = Field(default_factory=AdapterSettings)


class HttpSettings(Section):
    host: str = Field("127.0.0.1", description="HTTP listen address of the agent or controller.")
    port: int = Field(8080, ge=0, le=65535, description="HTTP port (0 picks a free one).")
    advertised_host: str | None = Field(
        None, description="Host other nodes use to reach this one (default: host)."
    )
    tls_cert_file: str | None = Field(
        None,
        description="PEM certificate (chain) of this node: serve HTTPS instead of HTTP (with tls_key_file). "
        "The URLs this node advertises become https://.",
    )
    tls_key_file: str | None = Field(None, description="PEM private key of tls_cert_file.")
    tls_ca_file: str | None = Field(
        None,
        description="PEM CA bundle trimtab's own HTTP clients trust when they call other nodes over HTTPS "
        "(the controller forwarding to agents, the local cluster's helpers); default: the system's.",
    )
    # Limits on what one client may cost a node (docs/security.md, "Hostile clients"): every port of an
    # agent is reachable by the brokers' clients, so none of these may be unbounded.
    max_body_bytes: int = Field(
        65_536,
        ge=1024,
        le=64 << 20,
        description="Largest request body a route accepts unless it declares its own limit (413 beyond it; "
        "the connection is closed without reading the rest). Admin bodies are a few hundred bytes.",
    )
    max_json_depth: int = Field(
        32,
        ge=4,
        le=512,
        description="Deepest nesting of arrays and objects a JSON body may have (400 beyond it): trimtab's "
        "bodies are at most 4 deep, and deep nesting is a way to exhaust a parser's stack.",
    )
    header_timeout_s: Seconds = Field(
        10.0,
        le=300,
        description="A connection must deliver a request's complete head (request line and headers) within "
        "this long of opening, or of the previous response, or it is closed (slowloris).",
    )
    body_timeout_s: Seconds = Field(
        10.0,
        le=300,
        description="A request's complete body must arrive within this long of its head, or the node answers "
        "408 and closes the connection.",
    )
    send_timeout_s: Seconds = Field(
        10.0,
        le=300,
        description="A response the client does not read: once the node's send buffer for a connection is "
        "full, the client must make room within this long or the connection is closed (a slow reader "
        "would otherwise hold a connection, and its response, for ever).",
    )
    keep_alive_timeout_s: Seconds = Field(
        5.0,
        ge=1,
        le=300,
        description="An idle keep-alive connection with no new request is closed after this long.",
    )
    max_connections: int = Field(
        1000,
        ge=16,
        le=100_000,
        description="Open connections this node serves at once. Beyond it, a new connection evicts the "
        "longest-idle one that has no request in progress (so probes still get in during a flood), or is "
        "closed at once when every connection is busy. Kept below the open-file limit, which the node "
        "raises to its hard limit at start.",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Addresses (or CIDR networks) of reverse proxies whose X-Forwarded-For / "
        "X-Forwarded-Proto headers are believed: the client address logged, rate-limited and "
        "counted is then the one the proxy names. Empty (default): forwarded headers are ignored.",
    )

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies_are_addresses(cls, v: list[str]) -> list[str]:
        for item in v:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or CIDR network") from None
        return v


class AgentSettings(Section):
    drain_timeout_s: Seconds = Field(
        60.0, description="SIGTERM drain: how long to wait for owned bundles to move before exiting anyway."
    )
    lookup_cache_s: float = Field(
        2.0, ge=0, description="How long a namespace's bundle layout is cached between checks."
    )
    lookup_rate_per_client: float = Field(
        1000.0,
        ge=0,
        description="Lookups per second one client address may make to this agent, sustained (a token bucket "
        "per address: the request's client address, the TCP peer's unless http.trusted_proxies names it, so "
        "clients behind one proxy or NAT share a bucket). Over it, "
        "a lookup is refused with 429 and Retry-After, counted in trimtab_lookups_total{result="
        '"rate_limited"}. The default is about a twelfth of what one agent answers on one core (about '
        "12 000 owned lookups/s, docs/benchmarks.md): a flood from one address cannot take the agent from the "
        "others, while an application that reconnects everything at once passes on the burst "
        "(lookup_burst_per_client); raise it for a proxy or a broker that asks for all its clients. 0 "
        "disables the limit (docs/security.md).",
    )
    lookup_burst_per_client: int = Field(
        10_000,
        ge=1,
        le=10_000_000,
        description="Lookups one client address may make at once before lookup_rate_per_client applies (the "
        "bucket's size). The default is twice a Pulsar client's maxConcurrentLookupRequest (5000): an "
        "application reconnecting all its producers and consumers at once after a failover passes.",
    )
    lookup_rate_max_clients: int = Field(
        10_000,
        ge=1,
        le=10_000_000,
        description="Client addresses whose lookup rate is tracked (least recently seen forgotten first; "
        "about 250 bytes each, 2.5 MB at the default). A forgotten client starts again with a full bucket.",
    )


class NamespaceSettings(Section):
    default_bundles: int = Field(
        4, ge=1, le=4096, description="Bundles of a new namespace. [defaultNumberOfNamespaceBundles]"
    )
    auto_create: list[
        Annotated[str, Field(pattern=r"^[A-Za-z0-9_.=:*?\[\]!-]{1,128}(/[A-Za-z0-9_.=:*?\[\]!-]{1,128})?$")]
    ] = Field(
        default_factory=list,
        description="Namespaces a topic lookup may create when they do not exist yet: tenants (every namespace "
        'of the tenant) or tenant/namespace patterns, fnmatch globs matched part by part, e.g. ["public/*", '
        '"iot-*"]. Empty (the default), as in Pulsar: lookups never create a namespace, an operator does '
        "(trimtab admin namespaces create, POST /v1/admin/namespaces), and a lookup of a topic in a namespace "
        "that does not exist answers 404. Anything listed here can be created by anyone who can reach an "
        "agent's public lookup endpoint (docs/security.md).",
    )


class ChannelSettings(Section):
    in_flight_timeout_s: Seconds = Field(
        30.0,
        description="How long a lookup waits on an in-flight bundle, and when the leader treats an in-flight state "
        "as stuck. A broker may take a bundle in flight to it only until this long minus "
        "broker.adapter.lease_margin_s after the record was written, so start-up refuses a value below "
        "lease_margin_s + 1 s; keep several seconds of that window on a loaded machine. "
        "[loadBalancerInFlightServiceUnitStateWaitingTimeInMillis]",
    )
    tombstone_delay_s: float = Field(
        3600.0,
        ge=30,
        description="Free/Deleted entries are tombstoned after this long. "
        "[loadBalancerServiceUnitStateTombstoneDelayTimeInSeconds]",
    )
    monitor_interval_s: Seconds = Field(
        60.0,
        description="Leader ownership monitor period. [loadBalancerServiceUnitStateMonitorIntervalInSeconds]",
    )
    snapshot_interval_s: Seconds = Field(60.0, description="Leader writes a channel snapshot this often.")
    snapshot_chunk_bundles: int = Field(2000, ge=10, le=100_000, description="Bundles per snapshot message.")


class LoadSettings(Section):
    report_interval_s: Seconds = Field(
        5.0, description="Agents sample load this often. [loadBalancerReportUpdateMinIntervalMillis]"
    )
    report_max_interval_s: Seconds = Field(
        900.0, description="Publish at least this often. [loadBalancerReportUpdateMaxIntervalMinutes]"
    )
    report_threshold_pct: Pct = Field(
        10.0,
        description="Publish when any figure moved more than this. [loadBalancerReportUpdateThresholdPercentage]",
    )
    ttl_s: Seconds = Field(
        1800.0, description="Readers ignore older reports. [loadBalancerBrokerLoadDataTTLInSeconds]"
    )
    history_weight: float = Field(
        0.9,
        ge=0,
        lt=1,
        description="EMA weight of history, h in ema = h*ema + (1-h)*x. [loadBalancerHistoryResourcePercentage]",
    )
    cpu_weight: float = Field(1.0, ge=0, description="[loadBalancerCPUResourceWeight]")
    memory_weight: float = Field(1.0, ge=0, description="[loadBalancerMemoryResourceWeight]")
    bandwidth_in_weight: float = Field(1.0, ge=0, description="[loadBalancerBandwidthInResourceWeight]")
    bandwidth_out_weight: float = Field(1.0, ge=0, description="[loadBalancerBandwidthOutResourceWeight]")
    top_k: int = Field(
        10,
        ge=1,
        le=1000,
        description="Bundles per top-bundles report. [loadBalancerMaxNumberOfBundlesInBundleLoadReport]",
    )


class AssignmentSettings(Section):
    average_usage_diff_threshold_pct: Pct = Field(
        10.0,
        description="Brokers with ema + this <= average are preferred. "
        "[loadBalancerAverageResourceUsageDifferenceThresholdPercentage]",
    )
    broker_max_topics: int = Field(
        50_000,
        ge=1,
        description="Brokers at or above this many topics get no new bundles. [loadBalancerBrokerMaxTopics]",
    )
    prefer_later_versions: bool = Field(
        False, description="Assign only to brokers on the newest version. [preferLaterVersions]"
    )


class SheddingSettings(Section):
    enabled: bool = Field(True, description="[loadBalancerSheddingEnabled]")
    strategy: Literal["transfer", "threshold"] = Field(
        "transfer",
        description="TransferShedder or the classic ThresholdShedder. [loadBalancerLoadSheddingStrategy]",
    )
    interval_s: Seconds = Field(60.0, description="[loadBalancerSheddingIntervalMinutes]")
    target_std: float = Field(
        0.25, gt=0, le=1, description="Target std of broker load. [loadBalancerBrokerLoadTargetStd]"
    )
    hit_count_threshold: int = Field(
        3,
        ge=0,
        description="Trigger must hold more than this many cycles. [loadBalancerSheddingConditionHitCountThreshold]",
    )
    overload_threshold_pct: Pct = Field(85.0, description="[loadBalancerBrokerOverloadedThresholdPercentage]")
    max_broker_pairs: int = Field(3, ge=1, description="[loadBalancerMaxNumberOfBrokerSheddingPerCycle]")
    bundle_grace_s: float = Field(
        1800.0,
        ge=0,
        description="Do not move a bundle again within this. [loadBalancerSheddingGracePeriodMinutes]",
    )
    broker_cooldown_s: float = Field(
        180.0, ge=0, description="Pause after a broker shed. [loadBalanceSheddingDelayInSeconds]"
    )
    transfer_enabled: bool = Field(
        True,
        description="Transfer to a chosen broker instead of a plain unload. [loadBalancerTransferEnabled]",
    )
    plan: Literal["to_target", "half_gap"] = Field(
        "to_target",
        description="TransferShedder's plan. to_target: bundle by bundle, only until the trigger no longer "
        "holds (fewest moves). half_gap: Pulsar's TransferShedder loop -- the most with the least loaded "
        "brokers, each source's top bundles lightest first up to half the pair's gap, swapping bundles back "
        "from the destination when the next one would overshoot (more even, more moves).",
    )
    threshold_pct: float = Field(
        10.0,
        gt=0,
        le=100,
        description="ThresholdShedder margin over the average. [loadBalancerBrokerThresholdShedderPercentage]",
    )
    min_unload_throughput_bytes: float = Field(
        10 * 1024 * 1024,
        ge=0,
        description="ThresholdShedder skips smaller offloads. [loadBalancerBundleUnloadMinThroughputThreshold]",
    )
    lower_boundary_enabled: bool = Field(
        False,
        description="ThresholdShedder (strategy = threshold): when a cycle shed nothing but some broker is "
        "below avg - threshold_pct, the most loaded broker with two or more bundles sheds threshold_pct x 50% "
        "of its throughput (min_unload_throughput_bytes still applies), toward the least loaded. "
        "[lowerBoundarySheddingEnabled]",
    )
    isolate_hot_bundles: bool = Field(
        False,
        description="Give a hot topic cut out into a bundle of its own (split.hot_topic_share) a broker to itself: "
        "while that one-hash bundle alone carries at least half an average broker's load, the transfer shedder "
        "moves the other bundles of its broker's top-k report to the least loaded brokers that may take them "
        "without passing overload_threshold_pct, whatever the spread of load (decision reason "
        "isolate_hot_bundle; skip reason no_headroom), moves nothing onto that broker and never moves the hot "
        "bundle itself off it (skip reason isolated_hot). Off: the hot bundle shares its broker like any other.",
    )
    shed_bundles_with_policies: bool = Field(
        False,
        description="Let the shedder move bundles of namespaces with an isolation policy or an anti-affinity "
        "group (within what the policies allow). Off: those stay where placement put them, whatever the load "
        "(skip reason has_policies), and agents leave them out of their top-k reports so they do not crowd "
        "out the bundles the shedder may move. [loadBalancerSheddingBundlesWithPoliciesEnabled]",
    )
    unload_timeout_s: Seconds = Field(
        60.0,
        description="How long a shedding cycle's moves may take: the next cycle waits for them this long "
        "(skip reason unloads_in_flight); a move not done by then failed -- counted as timed_out in "
        "trimtab_shedding_moves_total, logged as unload_timed_out, and not remembered as moved (no grace "
        "period, no cool-down). [namespaceBundleUnloadingTimeoutMs]",
    )


class SplitSettings(Section):
    enabled: bool = Field(True, description="[loadBalancerAutoBundleSplitEnabled]")
    interval_s: Seconds = Field(60.0, description="[loadBalancerSplitIntervalMinutes]")
    max_topics: int = Field(1000, ge=1, description="[loadBalancerNamespaceBundleMaxTopics]")
    max_sessions: int = Field(
        1000, ge=0, description="Producers+consumers; 0 disables. [loadBalancerNamespaceBundleMaxSessions]"
    )
    max_msg_rate: float = Field(
        30_000, gt=0, description="msg/s in+out. [loadBalancerNamespaceBundleMaxMsgRate]"
    )
    max_bandwidth_mbytes: float = Field(
        100, gt=0, description="MB/s in+out. [loadBalancerNamespaceBundleMaxBandwidthMbytes]"
    )
    hit_count_threshold: int = Field(
        3, ge=0, description="[loadBalancerNamespaceBundleSplitConditionHitCountThreshold]"
    )
    max_bundles_per_namespace: int = Field(128, ge=1, description="[loadBalancerNamespaceMaximumBundles]")
    max_splits_per_cycle: int = Field(10, ge=1, description="[loadBalancerMaxNumberOfBundlesToSplitPerCycle]")
    algorithm: Literal[
        "range_equally_divide",
        "topic_count_equally_divide",
        "specified_positions_divide",
        "flow_or_qps_equally_divide",
    ] = Field("range_equally_divide", description="[defaultNamespaceBundleSplitAlgorithm]")
    auto_unload: bool = Field(
        False,
        description="Unload the children of an automatic split once it is done, so the next lookups place "
        "them on the least loaded brokers; off, they stay on the parent's owner until the shedder moves "
        "them (as in Pulsar's extensible load manager). [loadBalancerAutoUnloadSplitBundlesEnabled]",
    )
    flow_or_qps_diff_threshold_pct: Pct = Field(10.0, description="[flowOrQpsDifferenceThresholdPercentage]")
    hot_topic_share: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Hot-topic isolation: when a bundle over a split limit has one topic carrying at least this "
        "share of its message rate or throughput, the split cuts just around that topic's hash, so the topic "
        "gets a bundle of its own (whatever split.algorithm says). Splitting by range cannot help a bundle "
        "whose load is one topic (Pulsar #3419). None: off.",
    )


class MergeSettings(Section):
    """Automatic merging of cold neighbouring bundles (docs/operations.md, "Merging bundles"). Pulsar splits
    but never merges: after a traffic peak a namespace keeps every bundle its splits made."""

    enabled: bool = Field(
        False,
        description="Merge cold neighbouring bundles automatically. Each agent merges pairs of bundles it owns "
        "both of (the owner decides, as for splits); a pair owned by two brokers waits until one owns both.",
    )
    interval_s: Seconds = Field(300.0, description="How often each agent checks its bundles for merges.")
    max_topics: int = Field(100, ge=0, description="A bundle is cold with at most this many topics.")
    max_sessions: int = Field(
        100, ge=0, description="... at most this many producers+consumers (0: not checked)."
    )
    max_msg_rate: float = Field(1_000.0, ge=0, description="... at most this many msg/s in+out.")
    max_bandwidth_mbytes: float = Field(5.0, ge=0, description="... at most this many MB/s in+out.")
    split_fraction: float = Field(
        0.5,
        gt=0,
        le=1,
        description="A pair merges only if its sum stays at or below this fraction of every split limit "
        "(split.max_*): a merge the next split check would undo is churn.",
    )
    min_bundles_per_namespace: int = Field(
        4,
        ge=1,
        description="Merging never takes a namespace below this many bundles: what is left above it (less "
        "the merges in flight) is shared between the brokers owning its bundles, so agents checking at the "
        "same moment cannot overshoot together.",
    )
    hit_count_threshold: int = Field(
        3, ge=0, description="A pair must be cold in more than this many consecutive checks."
    )
    max_merges_per_cycle: int = Field(
        10, ge=1, description="Merges one agent starts per check, at most, over all namespaces."
    )


class HealingSettings(Section):
    grace_s: float = Field(
        0.0,
        ge=-1,
        description="Wait this long after a broker's znode vanished before reassigning its bundles; -1 disables "
        "auto-healing. [KIP-46 failure interval; Cruise Control broker.failure.self.healing.threshold.ms]",
    )
    alert_after_s: float = Field(
        600.0,
        ge=0,
        description="Raise the failed-broker alert when a failed broker's bundles are not all reassigned this "
        "long after its first failure, whatever held them (grace period, healing disabled or paused, no "
        "allowed destination): trimtab_healing_overdue_brokers, alert TrimtabBundlesStuckOnFailedBroker, "
        "log broker_failure_alert. 0: as soon as a failure leaves bundles behind. "
        "[broker.failure.alert.threshold.ms]",
    )
    max_in_flight: int = Field(
        10_000,
        ge=1,
        description="Cluster-wide reassignments in flight (Assigning). Bundles of stateless brokers are cheap "
        "to acquire, so the default lets a 10 000-bundle broker fail over in one round; lower it if taking "
        "bundles over is expensive for your brokers. Live: `trimtab admin settings set` changes it at run "
        "time (the next healing round uses it). [max.num.cluster.movements]",
    )
    max_in_flight_per_broker: int = Field(
        5000,
        ge=1,
        description="Reassignments in flight into one broker. Live, as max_in_flight. "
        "[num.concurrent.partition.movements.per.broker]",
    )
    chunk_size: int = Field(500, ge=1, le=10_000, description="Bundles per persisted reassignment chunk.")
    mass_failure_max_brokers: int = Field(
        10,
        ge=1,
        description="More failed brokers than this pauses healing. [fixable.failed.broker.count.threshold]",
    )
    mass_failure_max_fraction: float = Field(
        0.4,
        gt=0,
        le=1,
        description="A larger failed fraction pauses healing. [fixable.failed.broker.percentage.threshold]",
    )
    safe_mode_settle_s: float = Field(
        180.0,
        ge=0,
        description="After the leader's ZooKeeper session comes back, wait this long before destructive work. [MAX_CLEAN_UP_DELAY_TIME_IN_SECS]",
    )


class OperationSettings(Section):
    """The leader's operations (docs/operations.md): shedding moves, operators' transfers, unloads and drains,
    maintenance -- and the splits, merges and healing plans it follows -- each a record in ZooKeeper that a
    new leader resumes."""

    interval_s: Seconds = Field(1.0, description="How often the leader advances the running operations.")
    max_in_flight: int = Field(
        1000,
        ge=1,
        description="Bundles in flight (Releasing, Assigning) cluster-wide, whoever moved them, above which no "
        "operation starts another move. [max.num.cluster.movements]",
    )
    max_in_flight_per_broker: int = Field(
        200,
        ge=1,
        description="Bundles in flight out of or into one broker above which no operation starts another move "
        "off or onto it. [num.concurrent.partition.movements.per.broker]",
    )
    max_in_flight_per_namespace: int | None = Field(
        None,
        ge=1,
        description="Bundles of one namespace in flight above which no operation starts another move in it "
        "(none: no limit of its own). Namespaces share the cluster's budget round-robin whatever this is.",
    )
    republish_after_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="A move whose record has not reached the channel this long after it was published is "
        "proposed again, with the same version (at most one of the two can apply).",
    )
    maintenance_max_per_domain: int = Field(
        1,
        ge=1,
        description="Brokers of one failure domain in maintenance at once (`trimtab admin maintenance start`); "
        "one more is refused with the reason. Brokers without a failure domain each count as their own.",
    )
    keep_finished: int = Field(
        200,
        ge=0,
        le=10_000,
        description="Finished operations (done, failed, cancelled) kept in ZooKeeper for `admin ops list`; the "
        "oldest are deleted beyond this.",
    )


class PlacementSettings(Section):
    failure_domains_enabled: bool = Field(
        False, description="Spread anti-affinity groups over failure domains. [failureDomainsEnabled]"
    )
    standby_replicas: int = Field(
        0, ge=0, le=16, description="Warm standbys per bundle. [num.standby.replicas]"
    )
    awareness_tags: list[str] = Field(
        default_factory=list,
        description="Ordered tag dimensions standbys avoid sharing, e.g. [zone, cluster]. [rack.aware.assignment.tags]",
    )
    standby_interval_s: float = Field(
        30.0,
        gt=0,
        description="How often the leader brings the standby sets up to date: a round repairs the bundles "
        "whose owner changed since the last one, keeping every standby that is still right (every bundle is "
        "checked after a change of brokers or policies and every 10 minutes); a bundle's key is rewritten "
        "only when its set changed.",
    )
    forced_awareness: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Tag -> expected values; never place two copies in one value, hold standbys back instead. "
        "[cluster.routing.allocation.awareness.force.*.values]",
    )


class SimulationSettings(Section):
    """The built-in simulated broker: synthetic topics with deterministic, skewed rates. A topic's load is a
    function of its name only, so a bundle's load follows it from broker to broker."""

    seed: int = Field(1, description="Seed of the synthetic load.")
    topics_per_namespace: int = Field(
        64, ge=1, le=100_000, description="Synthetic topics per namespace (t-0000...)."
    )
    msg_rate_per_topic: float = Field(
        100.0, ge=0, description="Mean msg/s of a synthetic topic (in; out is the same)."
    )
    msg_size_bytes: int = Field(1024, ge=1, description="Synthetic message size.")
    skew: float = Field(1.1, ge=0, le=5, description="Zipf exponent of topic rates (0 = uniform).")
    namespace_scale: dict[str, float] = Field(
        default_factory=dict, description='Per-namespace load multiplier, e.g. {"tenant/hot" = 5.0}.'
    )
    capacity_msg_rate: float = Field(
        50_000.0, gt=0, description="Total msg/s at which a simulated broker reads 100% CPU."
    )
    sessions_per_topic: int = Field(2, ge=0, description="Producers+consumers per synthetic topic.")
    acquire_delay_ms: float = Field(0.0, ge=0, description="Simulated time to take over a bundle.")
    warm_acquire_delay_ms: float = Field(
        0.0, ge=0, description="Simulated time to take over a bundle the broker pre-warmed (a warm standby)."
    )
    release_delay_ms: float = Field(0.0, ge=0, description="Simulated time to fence/close a bundle.")
    honour_leases: bool = Field(
        True,
        description="Stop serving a bundle when its lease runs out. false makes a broker that ignores leases: "
        "only for showing (in the chaos suite's self-test) what happens without them.",
    )


class ControllerSettings(Section):
    id: str | None = Field(None, description="Controller id (default hostname-pid).")
    resign_unready_after_s: float = Field(
        60.0,
        ge=5,
        description="A leader whose channel replica has not been ready (caught up) for this long resigns, "
        "and a controller stands for election only while its replica is ready: a leader that cannot recover "
        "its view would otherwise keep the leadership, deciding nothing, while a healthy controller waits.",
    )


class SecuritySettings(Section):
    """Who may call the admin API (docs/security.md). Tokens come from files (one per line, re-read when the
    file changes, so rotation needs no restart) and/or the environment; they are never shown or logged."""

    auth: Literal["required", "disabled"] = Field(
        "required",
        description="required: every admin and view endpoint needs a bearer token (probes, /metrics, lookups "
        "and the API spec stay public); a daemon with no token configured refuses to start. disabled: no "
        "checks at all -- only for demos and tests, never on a network anyone else can reach.",
    )
    admin_tokens_file: str | None = Field(
        None,
        description="File of admin tokens (every endpoint), one per line; blank lines and # comments are "
        "ignored. Re-read when it changes. The first token is the one this node presents to its peers.",
    )
    read_tokens_file: str | None = Field(
        None, description="File of read tokens (views only: GET endpoints), same format as admin_tokens_file."
    )
    admin_token: SecretStr | None = Field(
        None,
        description="One more admin token, usually from TRIMTAB_SECURITY__ADMIN_TOKEN (at least 16 characters).",
    )
    read_token: SecretStr | None = Field(
        None,
        description="One more read token, usually from TRIMTAB_SECURITY__READ_TOKEN (at least 16 characters).",
    )


class LoggingSettings(Section):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    json_logs: bool = Field(True, description="JSON lines (true) or human-readable console output (false).")


class Settings(BaseSettings):
    """All of trimtab's configuration. Sections mirror docs/design.md: channel (section 3), load (4), assignment,
    shedding, split and healing (5), placement (6)."""

    model_config = SettingsConfigDict(
        env_prefix="TRIMTAB_", env_nested_delimiter="__", extra="forbid", validate_assignment=True
    )

    cluster: ClusterSettings = Field(default_factory=ClusterSettings)
    zookeeper: ZooKeeperSettings = Field(default_factory=ZooKeeperSettings)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    broker: BrokerSettings = Field(default_factory=BrokerSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)
    namespace: NamespaceSettings = Field(default_factory=NamespaceSettings)
    channel: ChannelSettings = Field(default_factory=ChannelSettings)
    load: LoadSettings = Field(default_factory=LoadSettings)
    assignment: AssignmentSettings = Field(default_factory=AssignmentSettings)
    shedding: SheddingSettings = Field(default_factory=SheddingSettings)
    split: SplitSettings = Field(default_factory=SplitSettings)
    merge: MergeSettings = Field(default_factory=MergeSettings)
    healing: HealingSettings = Field(default_factory=HealingSettings)
    operations: OperationSettings = Field(default_factory=OperationSettings)
    placement: PlacementSettings = Field(default_factory=PlacementSettings)
    controller: ControllerSettings = Field(default_factory=ControllerSettings)
    sim: SimulationSettings = Field(default_factory=SimulationSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    security: SecuritySettings = Field(default_factory=SecuritySettings)

    @model_validator(mode="after")
    def _cross_field(self) -> Settings:
        if self.channel.tombstone_delay_s < self.channel.in_flight_timeout_s:
            raise ValueError(
                "channel.tombstone_delay_s must be >= channel.in_flight_timeout_s "
                "(Pulsar refuses the same combination)"
            )
        if self.load.report_interval_s > self.load.report_max_interval_s:
            raise ValueError("load.report_interval_s must be <= load.report_max_interval_s")
        if self.load.ttl_s < self.load.report_max_interval_s:
            raise ValueError("load.ttl_s must be >= load.report_max_interval_s, or fresh brokers look stale")
        if self.healing.max_in_flight_per_broker > self.healing.max_in_flight:
            raise ValueError("healing.max_in_flight_per_broker must be <= healing.max_in_flight")
        if self.broker.adapter.kind == "webhook" and not self.broker.adapter.url:
            raise ValueError("broker.adapter.url is required when broker.adapter.kind is webhook")
        if self.broker.adapter.kind == "command" and not self.broker.adapter.command:
            raise ValueError("broker.adapter.command is required when broker.adapter.kind is command")
        return self

    @model_validator(mode="after")
    def _security(self) -> Settings:
        h, z, sec = self.http, self.zookeeper, self.security
        if bool(h.tls_cert_file) != bool(h.tls_key_file):
            raise ValueError("http.tls_cert_file and http.tls_key_file go together: set both or neither")
        if z.auth_digest is not None and z.auth_digest_file:
            raise ValueError("set zookeeper.auth_digest or zookeeper.auth_digest_file, not both")
        if z.auth_digest is not None and not valid_digest(z.auth_digest.get_secret_value()):
            raise ValueError("zookeeper.auth_digest must look like user:password")
        for name, token in (("admin_token", sec.admin_token), ("read_token", sec.read_token)):
            if token is not None and not valid_token(token.get_secret_value()):
                raise ValueError(
                    f"security.{name} must be at least {MIN_TOKEN_CHARS} characters without whitespace"
                )
        return self

    @model_validator(mode="after")
    def _in_flight_leaves_time_to_acquire(self) -> Settings:
        # An agent may lease a bundle in flight to it only until the leader's monitor could force the
        # record onward: record time + in_flight_timeout_s - lease_margin_s (agent.leases.lease_bound).
        # Below a second of that window no broker takes a new bundle in time: every lookup of an unowned
        # bundle waits and fails, or -- under load -- some do.
        c, a = self.channel, self.broker.adapter
        if c.in_flight_timeout_s < a.lease_margin_s + MIN_ACQUIRE_WINDOW_S:
            raise ValueError(
                f"channel.in_flight_timeout_s ({c.in_flight_timeout_s:g}) must be at least "
                f"broker.adapter.lease_margin_s ({a.lease_margin_s:g}) + {MIN_ACQUIRE_WINDOW_S:g}: a broker may "
                "take a bundle in flight to it only until in_flight_timeout_s - lease_margin_s after the record "
                "was written, and a shorter window leaves new bundles unassigned. Raise in_flight_timeout_s "
                "(default 30) or lower lease_margin_s."
            )
        return self

    @model_validator(mode="after")
    def _lease_fits_session(self) -> Settings:
        # The leader reassigns a failed agent's bundles once its ZooKeeper session expired; every lease the
        # agent granted must have ended by then (docs/broker-adapter.md, "Leases").
        a, st = self.broker.adapter, self.zookeeper.session_timeout_s
        if a.lease_margin_s >= st:
            raise ValueError(
                f"broker.adapter.lease_margin_s ({a.lease_margin_s:g}) must be below "
                f"zookeeper.session_timeout_s ({st:g})"
            )
        if a.lease_s is not None and a.lease_s + a.lease_margin_s > st:
            raise ValueError(
                f"broker.adapter.lease_s ({a.lease_s:g}) + lease_margin_s ({a.lease_margin_s:g}) must not exceed "
                f"zookeeper.session_timeout_s ({st:g}): a broker could still serve a failed agent's bundles "
                "after the leader gave them to another broker. Shorten the lease or lengthen the session timeout."
            )
        return self

    # ------------------------------------------------------------------ derived
    @property
    def zk_path(self) -> str:
        return f"{self.zookeeper.root.rstrip('/')}/{self.cluster.name}"

    def lease_s(self) -> float:
        """The broker lease: ``broker.adapter.lease_s``, or as long as the session timeout allows."""
        a = self.broker.adapter
        return a.lease_s if a.lease_s is not None else self.zookeeper.session_timeout_s - a.lease_margin_s

    def advertised_host(self) -> str:
        return self.http.advertised_host or self.http.host

    def http_url(self, port: int) -> str:
        """The URL this node advertises: https:// when it serves TLS (``http.tls_cert_file``)."""
        scheme = "https" if self.http.tls_cert_file else "http"
        return f"{scheme}://{self.advertised_host()}:{port}"

    def broker_id(self, port: int | None = None) -> str:
        return self.broker.id or f"{self.advertised_host()}:{port if port is not None else self.http.port}"

    def controller_id(self) -> str:
        import os

        return self.controller.id or f"{socket.gethostname()}-{os.getpid()}"
