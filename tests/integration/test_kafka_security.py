"""Kafka security for real (docs/security.md, "Kafka ACLs"): the documented ACLs, granted on a real Apache
Kafka cluster with SCRAM over TLS and the ``StandardAuthorizer`` (no ACL, no access), are enough for each role
and no more.

One module-scoped local cluster (``LocalCluster(kafka_security="sasl_ssl")``: ZooKeeper, one Kafka broker,
two agents, one controller as ``trimtab`` processes). The topics are created beforehand by the admin (the
super user): no role may create them. Three SCRAM principals, ``trimtab-agent``, ``trimtab-controller`` and
``trimtab-pipeline``, each get exactly the ACLs :data:`trimtab.cluster.kafka_acls.KAFKA_ACLS` lists for their
role (the table docs/security.md shows; tests/unit/test_kafka_acls.py checks the two agree), and each node is
started with its role's ``kafka.client_config_file``.

* Enough: with those principals, lookups are answered, an admin transfer moves a bundle, the controller
  writes snapshots, and after an agent is killed the controller heals its bundles onto the survivor; no node
  logs an authorization failure on the way.
* No more: the agent's principal may write the channel but not the snapshot topic (the produce is refused
  with TOPIC_AUTHORIZATION_FAILED); the pipeline's reads what ``trimtab pipeline ingest`` reads (through
  the reader ingest uses, ``trimtab.pipeline.kafka_io``), but neither the snapshot topic nor a write to the
  channel.
* A wrong password is refused at start, within a bound, with one line that says authentication failed (and
  never shows the password) -- not a hang or silent retries. The same ``--set kafka.client_config_file`` the
  nodes are started with is what fails here, so it is proven to reach the agent's Kafka clients.
"""

from __future__ import annotations

import re
import secrets
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import KafkaError, Producer

from tests.integration.test_controller import topic_in
from tests.support.procs import Procs
from tests.support.waiting import wait_for
from trimtab.channel.bundles import BundleLayout
from trimtab.channel.kafka import KafkaTransport
from trimtab.cluster.kafka_acls import ROLES, Role, acl_bindings, acls_for
from trimtab.cluster.wiring import parse_properties
from trimtab.config.loader import load_settings
from trimtab.config.settings import Settings
from trimtab.devkit.kafka_server import KafkaCluster
from trimtab.devkit.localcluster import ClusterError, LocalCluster, Node
from trimtab.pipeline.common import PipelineError
from trimtab.pipeline.kafka_io import client_config, read_range, resolve_bounds, split_ranges, watermarks

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SESSION_TIMEOUT_S = 3.0
SETTINGS: dict[str, Any] = {
    "load": {"report_interval_s": 0.5, "report_max_interval_s": 5},
    "zookeeper": {"session_timeout_s": SESSION_TIMEOUT_S},
    # Only the test moves bundles (the transfer), and the healer (the kill).
    "shedding": {"enabled": False},
    "channel": {"monitor_interval_s": 1, "snapshot_interval_s": 2, "in_flight_timeout_s": 5},
    "healing": {"safe_mode_settle_s": 2, "grace_s": 1, "mass_failure_max_fraction": 0.5},
    "namespace": {"default_bundles": 8},
}
NAMESPACE = "public/acl"
QUIET = {"log_level": 0, "error_cb": lambda err: None}
# What a node logs when the broker refused it something (librdkafka's wording of the *_AUTHORIZATION_FAILED
# errors: "Topic authorization failed", "Group authorization failed", "Cluster authorization failed").
REFUSED = re.compile(r"authori[sz]ation[ _]failed|not authori[sz]ed", re.IGNORECASE)


@dataclass
class Secured:
    cluster: LocalCluster
    kafka: KafkaCluster
    settings: Settings
    properties: dict[Role, Path]  # each role's kafka.client_config_file
    passwords: dict[Role, str]

    def role_args(self, role: Role) -> list[str]:
        return ["--set", f"kafka.client_config_file={str(self.properties[role])!r}"]

    def client(self, role: Role) -> dict[str, Any]:
        """librdkafka settings as ``role``: the bootstrap servers and the role's properties file."""
        props = parse_properties(self.properties[role].read_text(), str(self.properties[role]))
        return {"bootstrap.servers": self.kafka.bootstrap_servers, **props}

    def owners(self, via: Node | None = None) -> dict[str, str | None]:
        """bundle -> owner (None unless Owned), in ``via``'s view (the leader's by default)."""
        table = self.cluster.ownership(via or self.leader())
        return {b: r["dst"] if r["state"] == "owned" else None for b, r in table.items()}

    def leader(self) -> Node:
        leader = wait_for(self.cluster.leader, 30, interval=0.1, message="a leading controller")
        assert leader is not None
        return leader


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    workdir = tmp_path_factory.mktemp("kafka-acls")
    # No node yet: the principals and their ACLs come first.
    cluster = LocalCluster(workdir, brokers=0, controllers=0, settings=SETTINGS, kafka_security="sasl_ssl")
    try:
        cluster.start(timeout=180)
        kafka = cluster.kafka
        assert isinstance(kafka, KafkaCluster) and kafka.security == "sasl_ssl"
        s = load_settings(cluster.config_path, environ=False)
        properties: dict[Role, Path] = {}
        passwords: dict[Role, str] = {}
        for role in ROLES:
            user, password = f"trimtab-{role}", secrets.token_urlsafe(18)
            kafka.create_user(user, password)
            kafka.create_acls(acl_bindings(role, f"User:{user}", s.kafka))
            passwords[role] = password
            properties[role] = kafka.write_client_properties(
                cluster.security_dir / f"kafka-{role}.properties", user, password
            )
        sec = Secured(cluster, kafka, s, properties, passwords)
        for _ in range(2):
            cluster.add_agent(wait=False, args=sec.role_args("agent"))
        cluster.add_controller(wait=False, args=sec.role_args("controller"))
        cluster.wait_ready(120)
        yield sec
    finally:
        for name in list(cluster.nodes):
            print(f"--- {name} ---\n{cluster.log_tail(name, 15)}")
        cluster.stop()


def delivery(
    conf: dict[str, Any], topic: str, *, idempotent: bool, timeout: float = 30.0
) -> KafkaError | None:
    """Produce one record to ``topic`` and return the delivery report's error (None: written)."""
    reports: list[KafkaError | None] = []
    producer = Producer(
        {**conf, **QUIET, "enable.idempotence": idempotent, "message.timeout.ms": int(timeout * 1000)}
    )
    producer.produce(topic, key=b"acl-test", value=b"{}", on_delivery=lambda err, msg: reports.append(err))
    wait_for(
        lambda: producer.poll(0.2) >= 0 and reports, timeout + 10, message=f"a delivery report ({topic})"
    )
    return reports[0]


# ---------------------------------------------------------------------------------------------- enough


def test_each_role_runs_the_cluster_with_only_its_acls(secured: Secured) -> None:
    c, k = secured.cluster, secured.settings.kafka
    assert {a.role for a in acls_for("agent")} == {"agent"}
    bundles = list(BundleLayout.default(NAMESPACE, 8).bundles)

    # Lookups: each assigns its bundle (an agent writes Assigning records to the channel).
    def look(bundle: str) -> dict[str, Any]:
        return wait_for(
            lambda: c.lookup(topic_in(bundle)),
            60,
            interval=0.2,
            message=f"a lookup in {bundle}",
            ignore=(ClusterError, httpx.HTTPError),
        )

    for b in bundles:
        assert look(b)["bundle"] == b
    brokers = sorted(str(n.broker) for n in c.agents)
    wait_for(
        lambda: all(secured.owners().get(b) in brokers for b in bundles),
        60,
        interval=0.2,
        message=lambda: f"every bundle owned in the leader's view: {secured.owners()}",
    )

    # An admin transfer: the controller writes Releasing, the agents fence, hand over and acquire.
    leader = secured.leader()
    bundle = bundles[0]
    src = secured.owners()[bundle]
    dst = next(b for b in brokers if b != src)
    r = c.post(leader, "/v1/admin/transfer", {"bundle": bundle, "broker": dst})
    assert r.status_code == 202, r.text
    wait_for(
        lambda: secured.owners().get(bundle) == dst, 30, interval=0.1, message=f"{bundle} moved to {dst}"
    )
    wait_for(
        lambda: bundle in c.get(c.by_broker(dst), "/v1/sim/state")["serving"],
        30,
        interval=0.1,
        message=f"{dst} serves {bundle}",
    )

    # The controller writes snapshots with its principal (WRITE on the snapshot topic).
    admin = KafkaTransport(secured.kafka.bootstrap_servers, client_config=secured.kafka.admin_config())
    try:
        wait_for(
            lambda: admin.watermarks(k.snapshot_topic, 0)[1] > 0,
            60,
            interval=0.2,
            message="a snapshot written by the controller",
        )
    finally:
        admin.close()

    # Healing: kill the agent that owns the transferred bundle; the controller moves all of its bundles.
    victim = c.by_broker(dst)
    survivor = next(b for b in brokers if b != dst)
    lost = [b for b, o in secured.owners().items() if o == dst]
    assert bundle in lost
    c.kill(victim.name, signal.SIGKILL)
    victim.proc.wait(10)
    wait_for(
        lambda: all(secured.owners().get(b) == survivor for b in bundles),
        SESSION_TIMEOUT_S * 3 + 60,
        interval=0.2,
        message=lambda: f"every bundle healed onto {survivor}: {secured.owners()}",
    )
    assert look(bundle)["owner"] == survivor

    # Nothing was refused along the way (the ACLs are enough), in any node's log.
    for name, node in c.nodes.items():
        text = node.log.read_text(errors="replace")
        refused = [line for line in text.splitlines() if REFUSED.search(line)]
        assert not refused, f"{name} was refused something:\n" + "\n".join(refused[:5])


# ---------------------------------------------------------------------------------------------- no more


def test_an_agent_may_write_the_channel_but_not_the_snapshot_topic(secured: Secured) -> None:
    k = secured.settings.kafka
    agent = secured.client("agent")
    # As the transport writes (idempotent, acks=all): the channel takes it...
    assert delivery(agent, k.channel_topic, idempotent=True) is None
    # ...the snapshot topic does not: only a controller may write snapshots.
    refused = delivery(agent, k.snapshot_topic, idempotent=True)
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, refused
    # The controller's principal may (the control of the line above).
    assert delivery(secured.client("controller"), k.snapshot_topic, idempotent=True) is None


def test_the_pipeline_reads_what_ingest_reads_and_writes_nothing(secured: Secured) -> None:
    k = secured.settings.kafka
    # At least one channel record to read, whatever ran before (written as the admin).
    assert delivery(secured.kafka.admin_config(), k.channel_topic, idempotent=True) is None
    conf = client_config(
        secured.kafka.bootstrap_servers,
        parse_properties(secured.properties["pipeline"].read_text(), "pipeline properties"),
    )
    counts: dict[str, int] = {}
    for topic in (k.channel_topic, k.broker_load_topic, k.top_bundles_topic, k.events_topic):
        bounds = resolve_bounds(conf, topic)
        read = 0
        for r in split_ranges(topic, bounds, 10_000):
            for batch in read_range(conf, r, idle_timeout=30):
                read += len(batch)
        assert read == sum(e - s for s, e in bounds.values()), topic
        counts[topic] = read
    assert counts[k.channel_topic] > 0 and counts[k.broker_load_topic] > 0, counts
    # Not the snapshot topic (ingest does not read it), and no write anywhere. Not idempotent: an idempotent
    # producer would be refused a producer id first (no WRITE on any topic).
    with pytest.raises(PipelineError, match=r"(?i)authoriz"):
        watermarks(conf, k.snapshot_topic, timeout=15)
    pipeline = secured.client("pipeline")
    refused = delivery(pipeline, k.channel_topic, idempotent=False)
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, refused


def run_with_wrong_password(
    secured: Secured, tmp_path: Path, user: str, *args: str, within_s: float, says: str
) -> None:
    """Run ``trimtab <args>`` with a wrong Kafka password for ``user``: it must exit 1 within ``within_s``
    with one line starting with ``says`` that names the authentication failure, and never show the
    password (librdkafka's own log lines may come before or after that line)."""
    password = "not-" + secrets.token_urlsafe(12)
    wrong = secured.kafka.write_client_properties(tmp_path / "wrong.properties", user, password)
    procs = Procs(tmp_path / "procs")
    began = time.monotonic()
    try:
        done = procs.run_trimtab(
            *args,
            "--config",
            str(secured.cluster.config_path),
            "--set",
            f"kafka.client_config_file={str(wrong)!r}",
            timeout=90,
        )
    finally:
        procs.close()
    took = time.monotonic() - began
    assert done.returncode == 1, done.describe()
    assert took < within_s, f"trimtab {args[0]} took {took:.0f}s to give up"
    (reason,) = [line for line in done.stderr.splitlines() if line.startswith(says)]
    assert re.search(r"(?i)authentication", reason), reason
    assert password not in done.stderr + done.stdout


def test_a_wrong_password_stops_an_agent_at_start_saying_so(secured: Secured, tmp_path: Path) -> None:
    run_with_wrong_password(
        secured,
        tmp_path,
        "trimtab-agent",
        "agent",
        "--http-port",
        "0",
        "--broker-id",
        "wrong-password:1",
        within_s=60,
        says="agent failed:",
    )


def test_a_wrong_password_makes_channel_dump_say_so_at_once(secured: Secured, tmp_path: Path) -> None:
    """The operator's tool too: one line naming the authentication failure, not a metadata timeout."""
    run_with_wrong_password(
        secured, tmp_path, "trimtab-controller", "channel", "dump", "--json", within_s=30, says="Error:"
    )
