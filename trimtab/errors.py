"""Every error trimtab raises on purpose, under one root.

``except TrimtabError`` catches what trimtab means to raise and nothing it does not (a bug still
surfaces as itself). Every exception class defined anywhere in trimtab is one (tests/unit/test_error_tree.py
checks it, and that the tree below is exactly the classes' hierarchy: a class added without being drawn
here fails that test). The one exception is ``pipeline.ingest.SimulatedCrash``, a test's stand-in for
``kill -9``: a ``BaseException`` on purpose, so that no ``except Exception`` cleans up after it.

How errors reach the outside, each in one place:

* **HTTP.** Routes *raise*; one handler per app (``trimtab.cluster.http_errors.install_error_handlers``)
  renders every failure as ``{"error": "...", "retryable": ...}`` with its status. A
  :class:`RequestError` carries its status, whether retrying can help, and any header the refusal needs
  (a ``Bearer`` challenge, ``Retry-After``); the other trimtab errors that may reach a route are given
  theirs by ``http_errors.refusal_of`` (ZooKeeper unavailable or contended: 503, retryable; a znode left
  unreadable or refused to this node: 500); malformed JSON, failed validation and unknown routes get
  400/404/405; anything unexpected 500, logged with its traceback.
* **ZooKeeper.** kazoo's exceptions become :class:`ZooKeeperError`\\ s at one boundary
  (``trimtab.cluster.zk.zk_call``), which also retries connection losses through kazoo's ``KazooRetry``.
* **The command line.** ``click.ClickException``\\ s (``cli.admin.AdminError``, with its exit code) or a
  clean ``exit 2`` for a :class:`ConfigError`.

The tree (``[module]``: a class defined outside this one, relative to ``trimtab``)::

    TrimtabError
    ├── ConfigError                 settings that do not validate (the message names the setting)
    │   └── PlacementConfigError    [balance.placement.model] a placement policy that does not validate
    ├── StartupError                a daemon could not start (the message says what it waited for)
    ├── BadExportLine               a line of a channel export that is not one (``channel replay``)
    ├── BundleError                 a bundle name, range or split that does not make sense
    ├── DocumentError               [cli.placement_solve] a ``placement solve`` document, naming each bad field
    ├── IntentRefused               [channel.intents] the bundle's record does not allow this write
    ├── OperationRefused            [balance.operations] an operator's verb the operation's state refuses
    ├── TransportError              Kafka refused or could not be reached
    │   ├── HistoryGap              records were deleted before this node read them
    │   ├── SnapshotTopicError      the snapshot topic is unusable as configured
    │   └── TopicError              a topic is missing or misconfigured (policy, partitions)
    ├── ZooKeeperError              ZooKeeper could not be used (kazoo's errors, mapped in cluster.zk)
    │   ├── ZkUnavailable           no session, or no answer after the command retries (HTTP 503)
    │   ├── ZkAccessDenied          the znodes' ACLs grant another identity (HTTP 500)
    │   ├── ZkConflict              a compare-and-set kept losing to other writers (HTTP 503)
    │   │   └── OperationConflict   [controller.operation_store] an operation written by another controller
    │   └── ZnodeUnreadable         a znode that does not decode, left as it is (HTTP 500)
    │       └── NamespaceUnreadable a namespace's policy znode: its bundle layout is unknown
    ├── AdapterError                the broker adapter failed (the broker, not trimtab)
    │   ├── LeaseRefused            a lease that came too late or ran out before the acquire finished
    │   └── LeaseUnavailable        the agent cannot vouch for a lease (session not confirmed)
    ├── RequestError                refused with an HTTP status (retryable or not)
    │   ├── NotLeader               sent to a follower: redirect to the leader (or 503 without one)
    │   ├── LookupTimeout           an in-flight bundle did not settle in time (503, retryable)
    │   ├── NamespaceNotFound       the namespace does not exist, and may not be created here (404)
    │   ├── AuthRefused             no valid bearer token (401), or one whose role cannot do this (403)
    │   ├── SignatureRefused        a webhook call a broker must not act on (unsigned, stale, replayed...)
    │   ├── SplitRefused            [agent.splits] a split the agent will not start
    │   └── _Refused                [cluster.http_guard] a request the guard ends before the app sees it
    ├── PipelineError               [pipeline.common] a Spark job that cannot run or finish
    ├── AdminError                  [cli.admin] a failed ``trimtab admin`` call (a ClickException too)
    │   ├── Refused                 [cli.admin] the server said no (4xx): exit 1
    │   ├── Unavailable             [cli.admin] no answer, or a temporary refusal: exit 3
    │   └── Unexpected              [cli.admin] an answer the CLI cannot trust: exit 4
    ├── DevKitError                 the local cluster, the ZooKeeper launcher, a benchmark
    │   ├── BenchError              [devkit.bench.common] a benchmark's own checks failed
    │   ├── ClusterError            [devkit.localcluster] the local cluster could not start or run
    │   ├── KafkaServerError        [devkit.kafka_server] the Apache Kafka launcher
    │   ├── KustomizeError          [devkit.kustomize] the Kubernetes overlays do not build
    │   ├── NetnsError              [devkit.netns] the chaos suite's network hosts (namespaces, links)
    │   ├── PkiError                [devkit.pki] the dev kit's certificates
    │   ├── PrometheusError         [devkit.prometheus] the Prometheus launcher
    │   ├── ZooKeeperServerError    [devkit.zkserver] the ZooKeeper launcher
    │   └── _BindFailed             [devkit.kafka_server] a Kafka node lost a port (retried inside)
    ├── _Bad                        [channel.replayfile] one bad export line (becomes a skip, inside)
    ├── _Disconnected               [cluster.http_guard] the client left mid-body (nothing to answer)
    └── _Moved                      [agent.lookup] the bundle was split while a lookup waited (inside)
"""

from __future__ import annotations

from collections.abc import Mapping


class TrimtabError(Exception):
    """The root of every error trimtab raises on purpose."""


class ConfigError(TrimtabError):
    """Settings that do not validate; the message names the setting and what is wrong."""


class StartupError(TrimtabError):
    """A daemon could not start; the message says what it waited for and why it gave up."""


class BadExportLine(TrimtabError):
    """A line of a channel export that is not an export line; the message says why."""


class BundleError(TrimtabError):
    """A name, range or split request that does not make sense; the message says why."""


class TransportError(TrimtabError):
    """The backend refused or could not be reached; the message says which and what to check."""


class HistoryGap(TransportError):
    """Records a reader had not read yet are gone (retention deleted them): reading on would silently
    skip history. Raised instead of jumping to the first retained offset."""

    def __init__(self, topic: str, partition: int, position: int, low: int | None) -> None:
        self.topic = topic
        self.partition = partition
        self.position = position
        self.low = low
        first = "unknown" if low is None else str(low)
        super().__init__(
            f"{topic}[{partition}]: records from offset {position} were deleted before this node read them "
            f"(first retained offset: {first}); raise the topic's retention or snapshot more often"
        )


class SnapshotTopicError(TransportError):
    """The snapshot topic is not usable as configured (the message names it and says what to do)."""


class TopicError(TransportError):
    """A topic trimtab needs is missing and cannot be created, or exists in a form it cannot rely on (the
    wrong cleanup policy or partition count): each problem names the topic, the setting and the fix."""


class ZooKeeperError(TrimtabError):
    """ZooKeeper could not be used (no session, or data that does not decode). kazoo's own exceptions
    become these at one boundary, ``trimtab.cluster.zk.zk_call``."""


class ZkUnavailable(ZooKeeperError):
    """No ZooKeeper session (within the connect timeout), or no answer after the command retries: the
    same request may succeed later. The message names ZooKeeper and what it did not do (it is shown as it
    is, in a log line or a 503)."""


class ZkAccessDenied(ZooKeeperError):
    """ZooKeeper refused this node's credentials for one of trimtab's znodes (their ACLs name another
    identity): the message names the znode and what to check."""


class ZkConflict(ZooKeeperError):
    """A compare-and-set (read, decide, one versioned write) lost to other writers on every attempt: the
    same request, later, reads the new version and may succeed. Nothing was written."""


class ZnodeUnreadable(ZooKeeperError):
    """A znode whose data does not decode (the message names it and why). Nothing overwrites it: what it
    held is unknown, and only an operator can decide what to do with it."""


class NamespaceUnreadable(ZnodeUnreadable):
    """A namespace's policy znode does not decode: its bundle layout is unknown (the message says why)."""


class AdapterError(TrimtabError):
    """A broker adapter call failed: the broker refused, timed out or could not be reached."""


class LeaseRefused(AdapterError):
    """A lease request came too late (past its ``apply_by_ms``) or ran out before the broker finished
    acquiring; nothing was served under it. The agent retries with a fresh lease."""


class LeaseUnavailable(AdapterError):
    """The agent cannot vouch for a lease: its ZooKeeper session was not confirmed recently enough, so
    another broker may be given its bundles before a new lease would end."""


#: The statuses a refusal is retryable with unless it says otherwise: a timeout, too many requests, a
#: service unavailable *now* (no leader yet, ZooKeeper contended, a bundle in flight) are temporary.
RETRYABLE_STATUSES = frozenset({408, 429, 503})


class RequestError(TrimtabError):
    """An operation refused with an HTTP status, a message meant for the caller, whether retrying (the
    same request, later) can succeed -- by default, when the status is one of :data:`RETRYABLE_STATUSES`
    -- and the response headers the refusal needs (a challenge, ``Retry-After``). Routes raise it; the one
    error handler of every app renders it (``trimtab.cluster.http_errors``)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        retryable: bool | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = status in RETRYABLE_STATUSES if retryable is None else retryable
        self.headers: dict[str, str] = dict(headers or {})


class NotLeader(RequestError):
    """A leader-only request reached a follower: redirect to ``leader_url``, or 503 while there is none."""

    def __init__(self, leader_url: str | None) -> None:
        super().__init__(
            503, "this controller is not the leader; no leader is elected right now", retryable=True
        )
        self.leader_url = leader_url


class LookupTimeout(RequestError):
    """A bundle in flight did not settle within the lookup timeout: retry."""

    def __init__(self, message: str) -> None:
        super().__init__(503, message, retryable=True)


class NamespaceNotFound(RequestError):
    """The namespace does not exist (no znode under ``admin/namespaces``) and the caller may not create it:
    a lookup that ``namespace.auto_create`` does not allow, an admin call about an unknown namespace (404).
    ``message`` says how an operator creates it, where that helps."""

    def __init__(self, namespace: str, message: str | None = None) -> None:
        super().__init__(404, message or f"namespace {namespace} does not exist")
        self.namespace = namespace


#: The ``WWW-Authenticate`` challenges of a 401: a daemon's API wants a bearer token, a broker's webhook a
#: signed call (docs/security.md, docs/broker-adapter.md).
BEARER_CHALLENGE = 'Bearer realm="trimtab"'
HMAC_CHALLENGE = 'Trimtab-HMAC realm="trimtab-webhook"'


class AuthRefused(RequestError):
    """The caller is not allowed: no token or one nobody configured (401, answered with a ``Bearer``
    challenge), or a token whose role does not cover the call (403). ``reason`` is ``missing``,
    ``invalid`` or ``forbidden`` (the label of ``trimtab_http_auth_failures_total``). The message never
    contains the token."""

    def __init__(self, status: int, message: str, *, reason: str) -> None:
        # A 401 says how to authenticate (RFC 6750): the challenge goes with the refusal wherever it is sent.
        super().__init__(
            status,
            message,
            retryable=False,
            headers={"www-authenticate": BEARER_CHALLENGE} if status == 401 else None,
        )
        self.reason = reason


class DevKitError(TrimtabError):
    """The development kit failed: the local cluster, the ZooKeeper launcher, a benchmark's own checks."""


class SignatureRefused(RequestError):
    """A webhook call the broker must not act on. ``reason`` is a stable label (a metric label, the sim
    broker's ``refused_calls``); the message says what was wrong, never the key. 401 except for
    ``replay_cache_full`` (503, retryable: the broker cannot currently prove the call is new)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(
            status,
            f"webhook call refused ({reason}): {message}",
            retryable=status == 503,
            headers={"www-authenticate": HMAC_CHALLENGE} if status == 401 else None,
        )
        self.reason = reason
