"""docker-compose.yml, run as shipped, without Docker: its ZooKeeper and Kafka as the real servers of the dev
kit, every trimtab service as ``<the image's ENTRYPOINT> <command>`` with its environment, each service on
its own loopback address under its compose name (``/etc/hosts``), up to the lookup the file's own header
tells users to curl. What is emulated, and how, is in tests/support/compose.py.

Root only (it edits /etc/hosts for its duration, as the sandbox and CI run): elsewhere it fails, loudly.
"""

from __future__ import annotations

import contextlib
import functools
import re
import subprocess
import time
import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from kazoo.client import KazooClient
from kazoo.security import make_digest_acl_credential

from tests.support.compose import (
    ZOOKEEPER_IMAGE_PORT,
    Compose,
    ComposeError,
    ComposeKafka,
    Image,
    Service,
    dockerfile_image,
    executable,
    hosts_entries,
    pom_kafka_version,
)
from tests.support.procs import Proc, Procs
from tests.support.waiting import wait_for
from trimtab.cluster.topics import topic_specs
from trimtab.config.loader import load_settings
from trimtab.devkit.kafka_server import KAFKA_VERSION, cache_root
from trimtab.devkit.zkserver import ZooKeeperServer, four_letter_word

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The header's own instructions: the lookup, and the admin token read from a controller's secrets volume.
LOOKUP = re.compile(r"curl '(http://localhost:(\d+)(/v1/lookup\?topic=[^']+))'")
TOKEN = re.compile(r"exec (\S+) cat (\S+)\)")
STATUS = re.compile(r"curl -H \"Authorization: Bearer \$T\" http://localhost:(\d+)(/v1/status)")


class Stack:
    """The services of one compose run, started in dependency order; what it skipped, and why."""

    def __init__(self, compose: Compose, image: Image, procs: Procs, work: Path, stack: Any) -> None:
        self.compose = compose
        self.image = image
        self.procs = procs
        self.work = work
        self.exit = stack
        self.daemons: dict[str, Proc] = {}
        self.skipped: list[str] = []
        self.notes: list[str] = []
        self.timings: list[tuple[str, float]] = []  # (service, when its start began)

    def up(self) -> None:
        for s in self.compose.order():
            self.timings.append((s.name, time.monotonic()))
            if s.image.startswith("zookeeper:"):
                self.zookeeper(s)
            elif s.image.startswith("apache/kafka:") and "KAFKA_PROCESS_ROLES" in s.environment:
                self.kafka(s)
            elif self.compose.runs_trimtab(s):
                self.trimtab(s)
            elif self.compose.one_shot(s):
                self.foreign_one_shot(s)
            else:
                self.skipped.append(s.name)  # Prometheus, Grafana: nothing depends on them

    def address(self, s: Service) -> str:
        return self.compose.addresses[s.name]

    def zookeeper(self, s: Service) -> None:
        # ZooKeeperServer checks readiness on 127.0.0.1, so it listens on every address (as a container
        # does on its own interfaces); clients reach it by name, at the service's address.
        config = {**self.compose.zookeeper_config(s), "clientPortAddress": "0.0.0.0"}
        # ... and its readiness check also asks `envi` (is it *our* server on the port?): allowed too.
        words = config.get("4lw.commands.whitelist", "ruok,srvr").split(",")
        config["4lw.commands.whitelist"] = ",".join(dict.fromkeys([*words, "ruok", "srvr", "envi"]))
        server = ZooKeeperServer(self.work / s.name, port=ZOOKEEPER_IMAGE_PORT, extra_config=config)
        self.exit.callback(server.stop)
        server.start()
        assert four_letter_word(s.name, ZOOKEEPER_IMAGE_PORT, "ruok") == "imok"  # compose's healthcheck

    def kafka(self, s: Service) -> None:
        version = self.compose.kafka_version(s)
        assert version == KAFKA_VERSION == pom_kafka_version(), "compose's Kafka is not the one tested"
        host, port = self.compose.kafka_advertised(s)
        assert host == s.name, f"{s.name} advertises {host}"
        cluster = ComposeKafka(
            self.work / s.name,
            bind=(self.address(s), port),
            advertised=(host, port),
            extra_config=self.compose.kafka_server_properties(s),
        )
        self.exit.callback(cluster.close)
        cluster.start(timeout=60)
        # compose's healthcheck lists topics: here through the name and port compose's clients use.
        admin = AdminClient({"bootstrap.servers": f"{host}:{port}"})
        admin.list_topics(timeout=10)

    def trimtab(self, s: Service) -> None:
        proc = self.procs.spawn(
            self.compose.argv(s, self.image), name=s.name, env=self.compose.env(s, self.image)
        )
        if self.compose.one_shot(s):
            proc.wait(30).check()
        else:
            self.daemons[s.name] = proc

    def foreign_one_shot(self, s: Service) -> None:
        """A one-shot service on another image: only kafka-init on apache/kafka is known (it creates the
        topics with kafka-topics.sh)."""
        script = "\n".join(s.command)
        if "kafka-topics.sh" not in script:
            raise ComposeError(f"{s.name}: a one-shot service on {s.image} is not emulated")
        bin_dir = cache_root() / f"kafka-{KAFKA_VERSION}" / "bin"
        if (bin_dir / "kafka-topics.sh").is_file():
            entry = s.entrypoint or []
            argv = [*entry, *s.command]
            argv = [a.replace("/opt/kafka/bin", str(bin_dir)) for a in argv]
            self.procs.spawn(argv, name=s.name, env=s.environment).wait(60).check()
            return
        # No Kafka distribution here (the dev kit has the server jars only): create what trimtab's own
        # topic list says, with the settings every trimtab service of this file runs with.
        note = (
            f"{s.name} runs kafka-topics.sh from {s.image} and there is no {bin_dir}/kafka-topics.sh: "
            "its topics were created from trimtab.cluster.topics.topic_specs instead"
        )
        self.notes.append(note)
        warnings.warn(note, stacklevel=1)
        settings = self.trimtab_settings()
        admin = AdminClient({"bootstrap.servers": settings.kafka.bootstrap_servers})
        futures = admin.create_topics(
            [
                NewTopic(
                    spec.name,
                    spec.partitions,
                    settings.kafka.replication_factor,
                    config=spec.topic_config(),
                )
                for spec in topic_specs(settings.kafka)
            ],
            request_timeout=15,
        )
        for future in futures.values():
            future.result(timeout=30)

    def trimtab_settings(self) -> Any:
        """The settings of the first long-running trimtab service (the shared config file and env)."""
        s = next(
            x for x in self.compose.order() if self.compose.runs_trimtab(x) and not self.compose.one_shot(x)
        )
        env = self.compose.env(s, self.image)
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                if k.startswith("TRIMTAB_") and k != "TRIMTAB_CONFIG":
                    mp.setenv(k, v)
            return load_settings(env["TRIMTAB_CONFIG"])

    def healthy(self, name: str) -> bool:
        """The service's own compose healthcheck, run here: its 127.0.0.1 is the service's address."""
        s = self.compose.service(name)
        test = [str(w) for w in s.spec["healthcheck"]["test"]]
        assert test[0] == "CMD", test
        argv = [executable(test[1]), *(w.replace("127.0.0.1", self.address(s)) for w in test[2:])]
        try:
            return subprocess.run(argv, capture_output=True, timeout=15, check=False).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def report(self) -> str:
        died = {n: p.returncode for n, p in self.daemons.items() if not p.is_running()}
        return f"daemons that exited: {died}\n{self.procs.report()}"


def test_compose_services_run_as_processes_up_to_a_lookup(tmp_path: Path, procs: Procs) -> None:
    compose = Compose(volumes_root=tmp_path / "volumes")
    image = dockerfile_image()
    assert image.entrypoint == ["trimtab"], image
    # Only container paths in commands and environments are mapped to the host: the mounted config file
    # must not name any (outside comments).
    config_text = "\n".join(
        line.split("#", 1)[0] for line in (Path(__file__).parents[2] / "deploy/config/trimtab.toml").open()
    )
    for s in compose.services.values():
        for target in compose.mounts(s):
            assert target not in config_text, f"deploy/config/trimtab.toml names {target}, a mount target"

    header = compose.text.split("\nx-", 1)[0]
    lookup = LOOKUP.search(header)
    assert lookup, "docker-compose.yml's header no longer shows the lookup to curl"
    front = next(s for s in compose.services.values() if int(lookup[2]) in s.published)
    lookup_url = f"http://{front.name}:{front.published[int(lookup[2])]}{lookup[3]}"

    procs.cwd = tmp_path / "workdir"  # the image's WORKDIR is its own empty directory
    procs.cwd.mkdir()
    with contextlib.ExitStack() as exit_stack:
        exit_stack.enter_context(hosts_entries(compose.addresses))
        stack = Stack(compose, image, procs, tmp_path, exit_stack)
        stack.up()
        stack.timings.append(("(all started)", time.monotonic()))
        assert stack.skipped == ["prometheus", "grafana"], stack.skipped
        assert set(stack.daemons) == {"controller-1", "controller-2", "agent-1", "agent-2", "agent-3"}

        def looked_up() -> Any:
            assert all(p.is_running() for p in stack.daemons.values()), stack.report()
            r = httpx.get(lookup_url, timeout=5)
            if r.status_code == 503:
                return None  # retryable: the cluster is still forming
            assert r.status_code == 200, f"GET {lookup_url}: {r.status_code} {r.text}"
            return r.json()

        answer = wait_for(
            looked_up, timeout=35, interval=0.2, message=stack.report, ignore=(httpx.TransportError,)
        )
        stack.timings.append(("(lookup answered)", time.monotonic()))
        brokers = {compose.service(n).command[-1] for n in stack.daemons if n.startswith("agent-")}
        assert answer["owner"] in brokers, answer
        assert answer["topic"] == "persistent://public/default/orders", answer

        # Every long-running service passes its own compose healthcheck.
        for name in stack.daemons:
            wait_for(functools.partial(stack.healthy, name), timeout=15, interval=0.2, message=stack.report)

        stack.timings.append(("(all healthy)", time.monotonic()))

        assert_admin_status_works(compose, header)
        assert_znodes_belong_to_the_generated_digest(stack)
        t0 = stack.timings[0][1]
        print("\n".join(f"{t - t0:6.1f}s {what}" for what, t in stack.timings))


def assert_admin_status_works(compose: Compose, header: str) -> None:
    """The header's admin call: the token read from a controller's secrets volume, its status endpoint."""
    token_m, status_m = TOKEN.search(header), STATUS.search(header)
    assert token_m and status_m, "docker-compose.yml's header no longer shows the admin status call"
    token = Path(compose.localize(compose.service(token_m[1]), token_m[2])).read_text().strip()
    ctl = next(s for s in compose.services.values() if int(status_m[1]) in s.published)
    status_url = f"http://{ctl.name}:{ctl.published[int(status_m[1])]}{status_m[2]}"
    assert httpx.get(status_url, timeout=5).status_code == 401
    status = httpx.get(status_url, headers={"Authorization": f"Bearer {token}"}, timeout=5)
    assert status.status_code == 200, status.text


def assert_znodes_belong_to_the_generated_digest(stack: Stack) -> None:
    """trimtab's znodes carry the digest identity trimtab-secrets generated (zookeeper.digest)."""
    settings = stack.trimtab_settings()
    digest = Path(settings.zookeeper.auth_digest_file).read_text().strip()
    user, _, password = digest.partition(":")
    zk = KazooClient(hosts=settings.zookeeper.hosts, auth_data=[("digest", digest)])
    zk.start(timeout=15)
    try:
        acls, _ = zk.get_acls(f"{settings.zookeeper.root}/{settings.cluster.name}")
    finally:
        zk.stop()
        zk.close()
    ids = {(a.id.scheme, a.id.id) for a in acls}
    assert ("digest", make_digest_acl_credential(user, password)) in ids, ids
