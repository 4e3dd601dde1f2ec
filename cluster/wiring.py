"""Building the shared clients from settings, the same way in every daemon (and in the tools).

Secrets kept out of the TOML (docs/security.md) are read here, at start-up: the Kafka client properties file
and the ZooKeeper digest file. A file that cannot be used is a :class:`ConfigError` naming the setting and the
path -- never the content.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from pathlib import Path

from trimtab.channel.kafka import KafkaTransport
from trimtab.channel.transport import Transport
from trimtab.cluster.auth import Authenticator
from trimtab.cluster.http import check_tls_files
from trimtab.cluster.topics import prepare_topics, topic_specs
from trimtab.cluster.zk import ZkSession
from trimtab.config.settings import Settings, valid_digest
from trimtab.errors import ConfigError


def check_security(s: Settings) -> None:
    """Raise :class:`ConfigError` unless every security setting can be used: a token when authentication
    is required, readable token files, TLS certificate and key, the ZooKeeper digest and the Kafka client
    properties file. Daemons call it before binding or connecting anything."""
    Authenticator.from_settings(s.security)
    check_tls_files(s.http)
    zk_auth_digest(s)
    kafka_client_config(s)


def _read_secret_file(setting: str, path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{setting} ({path}): the file does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{setting} ({path}): cannot read the file ({type(e).__name__})") from None


def parse_properties(text: str, where: str) -> dict[str, str]:
    """``key=value`` lines (librdkafka's and Kafka's client.properties format): blank lines and lines
    starting with ``#`` or ``!`` are ignored, whitespace around key and value is dropped. A line without
    ``=`` is a :class:`ConfigError` naming ``where`` and the line number, not its content."""
    out: dict[str, str] = {}
    # Only real line ends end a line (not the form feeds and separators str.splitlines also splits on).
    for n, raw in enumerate(text.replace("\r\n", "\n").replace("\r", "\n").split("\n"), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{where}, line {n}: expected key=value")
        out[key.strip()] = value.strip()
    return out


def kafka_client_config(s: Settings) -> dict[str, str]:
    """The librdkafka settings every Kafka client trimtab creates gets: ``kafka.client_config``, then
    ``kafka.client_config_file`` over it (the place for sasl.password and friends)."""
    k = s.kafka
    out = dict(k.client_config)
    if k.client_config_file:
        where = f"kafka.client_config_file ({k.client_config_file})"
        out.update(
            parse_properties(_read_secret_file("kafka.client_config_file", k.client_config_file), where)
        )
    return out


def kafka_transport(s: Settings, client_id: str) -> KafkaTransport:
    """The Kafka transport every trimtab process uses: topics it creates on first use made as
    cluster/topics.py says (the channel never compacted, the snapshot topic with one partition...), channel
    readers tuned by ``kafka.fetch_wait_max_ms``; every client it makes (producer, readers, metadata, admin)
    carries :func:`kafka_client_config` -- TLS and SASL included."""
    k = s.kafka
    return KafkaTransport(
        k.bootstrap_servers,
        client_config=kafka_client_config(s),
        client_id=client_id,
        linger_ms=k.linger_ms,
        fetch_wait_max_ms=k.fetch_wait_max_ms,
        topics=topic_specs(k),
        replication_factor=k.replication_factor,
    )


def ensure_topics(
    s: Settings, client_id: str, *, create: bool = True, only: Collection[str] | None = None
) -> None:
    """What a daemon runs at start, before it reports ready (and ``trimtab topics ensure`` runs): every
    topic trimtab needs exists (created where missing and allowed) and can be relied on -- else a
    :class:`trimtab.errors.TopicError` saying which topic, which setting and the fix. Kafka refusing the
    credentials or not answering is a :class:`trimtab.errors.TransportError` saying so. ``only``: just
    these topics (a tool that reads one or two of them)."""
    config = {"bootstrap.servers": s.kafka.bootstrap_servers, "client.id": client_id, "log_level": 3}
    specs = [t for t in topic_specs(s.kafka) if only is None or t.name in only]
    prepare_topics(
        {**config, **kafka_client_config(s)},
        specs,
        create=create,
        replication=s.kafka.replication_factor,
    )


def _no_topic_check() -> None:
    """A transport the caller made (tests, the simulator): its topics are the caller's business."""


def kafka_clients(
    s: Settings, client_id: str, transport: Transport | None = None
) -> tuple[Transport, Callable[[], None]]:
    """A daemon's transport and its start-up topic check: the Kafka transport of ``s`` and
    :func:`ensure_topics`, unless the caller passed a transport of its own."""
    if transport is not None:
        return transport, _no_topic_check
    return kafka_transport(s, client_id), functools.partial(ensure_topics, s, client_id)


def zk_auth_digest(s: Settings) -> str | None:
    """The ZooKeeper digest credentials (``user:password``): ``zookeeper.auth_digest``, or the first line of
    ``zookeeper.auth_digest_file``; None when neither is set."""
    z = s.zookeeper
    if z.auth_digest is not None:
        return z.auth_digest.get_secret_value()
    if not z.auth_digest_file:
        return None
    lines = [
        line.strip()
        for line in _read_secret_file("zookeeper.auth_digest_file", z.auth_digest_file).splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    if not lines or not valid_digest(lines[0]):
        raise ConfigError(
            f"zookeeper.auth_digest_file ({z.auth_digest_file}): expected one line user:password"
        )
    return lines[0]


def zk_session(s: Settings) -> ZkSession:
    z = s.zookeeper
    return ZkSession(
        z.hosts,
        session_timeout_s=z.session_timeout_s,
        connect_timeout_s=z.connect_timeout_s,
        auth_digest=zk_auth_digest(s),
    )
