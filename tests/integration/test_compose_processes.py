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
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka.admin import AdminClient
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
    interpolate,
    pom_kafka_version,
)
from tests.support.procs import Proc, Procs
from tests.support.waiting import wait_for
from trimtab.config.loader import load_settings
from trimtab.devkit.kafka_server import KAFKA_VERSION
from trimtab.devkit.zkserver import ZooKeeperServer, four_letter_word

# The header's own instructions: the lookup, and the admin token read from a controller's secrets volume.
LOOKUP = re.compile(r"curl '(http://localhost:(\d+)(/v1/lookup\?topic=[^']+))'")
TOKEN = re.compile(r"exec (\S+) cat (\S+)\)")
STATUS = re.compile(r"curl -H \"Authorization: Bearer \$T\" http://localhost:(\d+)(/v1/status)")


class Stack:
    """The services of one compose run, started in dependency order; what it skipped, and why."""

    def __init__(
        self, compose: Compose, image: Image, procs: Procs, work: Path, stack: contextlib.ExitStack
    ) -> None:
        self.compose = compose
        self.image = image
        self.procs = procs
        self.work = work
        self.exit = stack
        self.daemons: dict[str, Proc] = {}
        self.skipped: list[str] = []
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
                raise ComposeError(f"{s.name}: a one-shot service on {s.image} is not emulated")
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
        if not self.procs.procs:  # stop trimtab's processes before the ZooKeeper and Kafka they use
            self.exit.callback(self.procs.close)
        proc = self.procs.spawn(
            self.compose.argv(s, self.image), name=s.name, env=self.compose.env(s, self.image)
        )
        if self.compose.one_shot(s):
            proc.wait(30).check()
        else:
            self.daemons[s.name] = proc

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
        return f"{self.timeline()}\ndaemons that exited: {died}\n{self.procs.report()}"

    def timeline(self) -> str:
        t0 = self.timings[0][1] if self.timings else 0.0
        return "\n".join(f"{t - t0:6.1f}s {what}" for what, t in self.timings)


@pytest.mark.integration
@pytest.mark.slow
def test_compose_services_run_as_processes_up_to_a_lookup(tmp_path: Path, procs: Procs) -> None:
    compose = Compose(volumes_root=tmp_path / "volumes")
    image = dockerfile_image()
    assert image.entrypoint == ["trimtab"], image
    # Only container paths in commands and environments are mapped to the host: a mounted file (the
    # config) must not name any, outside comments.
    targets = {t for s in compose.services.values() for t in compose.mounts(s)}
    for s in compose.services.values():
        for host in compose.mounts(s).values():
            if Path(host).is_file():
                text = "\n".join(ln.split("#", 1)[0] for ln in Path(host).read_text().splitlines())
                assert not [t for t in targets if t in text], f"{host} names a mount target"

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
            looked_up, timeout=60, interval=0.2, message=stack.report, ignore=(httpx.TransportError,)
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
        print(stack.timeline())  # shown with -s: where the time went


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


# --------------------------------------------------------------------------- the emulation itself (fast)
def test_the_emulation_reads_compose_as_docker_would(tmp_path: Path) -> None:
    compose = Compose(volumes_root=tmp_path)
    image = dockerfile_image()
    agent = compose.service("agent-1")
    # Anchors merged: the shared environment plus the agent's own; the image's ENV beneath.
    env = compose.env(agent, image)
    assert env["TRIMTAB_CONFIG"] == str(compose.path.parent / "deploy/config/trimtab.toml")
    assert env["TRIMTAB_SECURITY__ADMIN_TOKENS_FILE"] == str(tmp_path / "trimtab-secrets" / "admin.tokens")
    assert env["TRIMTAB_HTTP__HOST"] == compose.addresses["agent-1"] != compose.addresses["agent-2"]
    assert env["TRIMTAB_HTTP__PORT"] == "8080" and env["TRIMTAB_HTTP__ADVERTISED_HOST"] == "agent-1"
    assert compose.argv(agent, image)[1:] == ["agent", "--broker-id", "agent-1:8080"]
    assert Path(compose.argv(agent, image)[0]).name == "trimtab"
    names = [s.name for s in compose.order()]
    assert (
        names.index("zookeeper") < names.index("kafka") < names.index("kafka-init") < names.index("agent-1")
    )
    assert compose.one_shot(compose.service("trimtab-secrets")) and not compose.one_shot(agent)
    kafka = compose.service("kafka")
    props = compose.kafka_server_properties(kafka)
    assert props["auto.create.topics.enable"] == "false" and "listeners" not in props
    assert compose.kafka_advertised(kafka) == ("kafka", 9092)


def test_interpolation_and_mount_rewriting() -> None:
    assert interpolate("a $$t b") == "a $t b"
    with pytest.raises(ComposeError):
        interpolate("${HOME}/x")
    compose = Compose()
    s = Service("x", {"volumes": ["./deploy/config:/etc/cfg:ro"]})
    assert compose.localize(s, "/etc/cfg/a.toml /etc/cfgX '/etc/cfg'") == (
        f"{compose.path.parent}/deploy/config/a.toml /etc/cfgX '{compose.path.parent}/deploy/config'"
    )


def test_hosts_entries_are_removed_after(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(
        "127.0.0.1 localhost\n# >>> trimtab compose test\n127.0.1.9 stale\n# <<< trimtab compose test\n"
    )
    with hosts_entries({"kafka": "127.0.1.3"}, path=hosts):
        assert "127.0.1.3 kafka\n" in hosts.read_text() and "stale" not in hosts.read_text()
    assert hosts.read_text() == "127.0.0.1 localhost\n"
