"""Every error trimtab raises on purpose, under one root.

``except TrimtabError`` catches what trimtab means to raise and nothing it does not (a bug still
surfaces as itself). Errors that reach an HTTP client are :class:`RequestError`\\ s: they carry the status
and whether retrying can help, and every API turns them -- and malformed JSON, failed validation, unknown
routes and unexpected failures -- into the same body, ``{"error": "...", "retryable": ...}``
(``trimtab.cluster.http.install_error_handlers``).

The tree::

    TrimtabError
    ├── ConfigError                 settings that do not validate (the message names the setting)
    ├── StartupError                a daemon could not start (the message says what it waited for)
    ├── BundleError                 a bundle name, range or split that does not make sense
    ├── BadExportLine               a line of a channel export that is not one (``channel replay``)
    ├── TransportError              Kafka refused or could not be reached
    │   ├── HistoryGap              records were deleted before this node read them
    │   ├── SnapshotTopicError      the snapshot topic is unusable as configured
    │   └── TopicError              a topic is missing or misconfigured (policy, partitions)
    ├── ZooKeeperError
    │   ├── ZkUnavailable           no ZooKeeper session
    │   └── NamespaceUnreadable     a namespace's policy znode does not decode
    ├── AdapterError                the broker adapter failed (the broker, not trimtab)
    ├── RequestError                refused with an HTTP status (retryable or not)
    │   ├── NotLeader               sent to a follower: redirect to the leader (or 503 without one)
    │   ├── LookupTimeout           an in-flight bundle did not settle in time (503, retryable)
    │   ├── NamespaceNotFound       the namespace does not exist, and may not be created here (404)
    │   ├── SignatureRefused        a webhook call a broker must not act on (unsigned, stale, replayed...)
    │   └── AuthRefused             no valid bearer token (401), or one whose role cannot do this (403)
    └── DevKitError                 the local cluster, the ZooKeeper launcher, a benchmark
"""

from __future__ import annotations


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
    """ZooKeeper could not be used (no session, or data that does not decode)."""


class ZkUnavailable(ZooKeeperError):
    """No ZooKeeper session (within the connect timeout)."""


class ZkAccessDenied(ZooKeeperError):
    """ZooKeeper refused this node's credentials for one of trimtab's znodes (their ACLs name another
    identity): the message names the znode and what to check."""


class NamespaceUnreadable(ZooKeeperError):
    """A namespace's policy znode does not decode: its bundle layout is unknown (the message says why)."""


class AdapterError(TrimtabError):
    """A broker adapter call failed: the broker refused, timed out or could not be reached."""


class LeaseRefused(AdapterError):
    """A lease request came too late (past its ``apply_by_ms``) or ran out before the broker finished
    acquiring; nothing was served under it. The agent retries with a fresh lease."""


class LeaseUnavailable(AdapterError):
    """The agent cannot vouch for a lease: its ZooKeeper session was not confirmed recently enough, so
    another broker may be given its bundles before a new lease would end."""


class RequestError(TrimtabError):
    """An operation refused with an HTTP status, a message meant for the caller, and whether retrying (the
    same request, later) can succeed."""

    def __init__(self, status: int, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable


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


class AuthRefused(RequestError):
    """The caller is not allowed: no token or one nobody configured (401, answered with a ``Bearer``
    challenge), or a token whose role does not cover the call (403). ``reason`` is ``missing``,
    ``invalid`` or ``forbidden`` (the label of ``trimtab_http_auth_failures_total``). The message never
    contains the token."""

    def __init__(self, status: int, message: str, *, reason: str) -> None:
        super().__init__(status, message)
        self.reason = reason


class DevKitError(TrimtabError):
    """The development kit failed: the local cluster, the ZooKeeper launcher, a benchmark's own checks."""


class SignatureRefused(RequestError):
    """A webhook call the broker must not act on. ``reason`` is a stable label (a metric label, the sim
    broker's ``refused_calls``); the message says what was wrong, never the key. 401 except for
    ``replay_cache_full`` (503, retryable: the broker cannot currently prove the call is new)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(status, f"webhook call refused ({reason}): {message}", retryable=status == 503)
        self.reason = reason
