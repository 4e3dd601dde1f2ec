"""docker-compose.yml's services as local processes: there is no Docker engine here, so the compose test
(tests/integration/test_compose_processes.py) runs each service's command and environment *as shipped*
against a real ZooKeeper and a real Kafka, and this module is the little of compose it needs.

What stands in for what Docker would do, and nothing else:

* **Images.** A service built from ``.`` (or using the image those services build) runs the Dockerfile's
  final-stage ``ENTRYPOINT`` (``trimtab``, installed in this virtualenv) or its own ``entrypoint``, with
  the service's ``command``, and the Dockerfile's ``ENV`` under the service's ``environment`` (merged as
  YAML anchors give it). ``zookeeper:*`` is :class:`trimtab.devkit.zkserver.ZooKeeperServer`,
  ``apache/kafka:*`` is :class:`trimtab.devkit.kafka_server.KafkaCluster` (one KRaft node, with the
  ``KAFKA_*`` settings of the service that are not about listeners or storage).
* **Volumes.** A service's mount targets are replaced, in its command and environment only, by their host
  sources: a bind mount by the repository's file (``./deploy/config/trimtab.toml``), a named volume by a
  directory of the test's (:meth:`Compose.volume_dir`). Files *named inside* a mounted file are not
  rewritten: the test checks the config names none.
* **Network.** Every service gets its own loopback address, 127.0.1.<2+i> in file order, and its name is
  written into ``/etc/hosts`` for the duration (:func:`hosts_entries`; root only), so ``zookeeper:2181``,
  ``kafka:9092`` and ``agent-1:8080`` resolve as in compose's network and the three agents can all listen
  on port 8080. A container's ``0.0.0.0`` is all of *its own* interfaces: an environment value of exactly
  ``0.0.0.0`` becomes the service's address. The containers run as root here (the image's user is 10001).
* **Interpolation.** ``$$`` is a literal ``$``; any other ``$`` is refused (the tests set no variables).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.procs import REPO_ROOT
from trimtab.devkit.kafka_server import KafkaCluster

COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "Dockerfile"
KAFKA_POM = REPO_ROOT / "devkit" / "kafka" / "pom.xml"
HOSTS_FILE = Path("/etc/hosts")
ADDRESS_PREFIX = "127.0.1."
FIRST_HOST = 2  # 127.0.1.1 is often the machine's own name

# The apache/kafka image's settings that KafkaCluster owns (listeners, quorum, storage, identity).
_KAFKA_OWNED = {
    "node.id",
    "process.roles",
    "listeners",
    "advertised.listeners",
    "controller.listener.names",
    "listener.security.protocol.map",
    "controller.quorum.voters",
    "log.dirs",
}

# The zookeeper image's environment -> zoo.cfg (its docker-entrypoint.sh); it listens on 2181.
_ZOO_CFG = {
    "ZOO_TICK_TIME": "tickTime",
    "ZOO_INIT_LIMIT": "initLimit",
    "ZOO_SYNC_LIMIT": "syncLimit",
    "ZOO_MAX_CLIENT_CNXNS": "maxClientCnxns",
    "ZOO_MAX_SESSION_TIMEOUT": "maxSessionTimeout",
    "ZOO_4LW_COMMANDS_WHITELIST": "4lw.commands.whitelist",
    "ZOO_AUTOPURGE_PURGEINTERVAL": "autopurge.purgeInterval",
    "ZOO_AUTOPURGE_SNAPRETAINCOUNT": "autopurge.snapRetainCount",
}
ZOOKEEPER_IMAGE_PORT = 2181


class ComposeError(AssertionError):
    """docker-compose.yml uses something this emulation does not do: a failure, never a silent skip."""


def interpolate(value: str) -> str:
    """Compose's variable substitution with no variables set: ``$$`` is ``$``; ``$X`` is refused."""
    if re.search(r"\$(?!\$)", value.replace("$$", "")):
        raise ComposeError(f"compose variable substitution is not emulated: {value!r}")
    return value.replace("$$", "$")


def _words(value: Any) -> list[str]:
    """A command or entrypoint: a list as it is, a string split as compose splits it."""
    if value is None:
        return []
    if isinstance(value, str):
        return [interpolate(w) for w in shlex.split(value)]
    return [interpolate(str(w)) for w in value]


# ---------------------------------------------------------------------------------------------- Dockerfile
@dataclass(frozen=True)
class Image:
    """What the Dockerfile's final stage gives a container: its entrypoint and environment."""

    entrypoint: list[str]
    env: dict[str, str]


def dockerfile_image(path: Path = DOCKERFILE) -> Image:
    """The final stage's ``ENTRYPOINT`` (exec form) and ``ENV`` (``k=v`` form, continuation lines joined)."""
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    last_from = max(i for i, ln in enumerate(lines) if ln.upper().startswith("FROM "))
    entrypoint: list[str] = []
    env: dict[str, str] = {}
    for ln in lines[last_from:]:
        instruction, _, rest = ln.partition(" ")
        if instruction.upper() == "ENTRYPOINT":
            entrypoint = [str(w) for w in yaml.safe_load(rest)]
        elif instruction.upper() == "ENV":
            for pair in shlex.split(rest):
                k, sep, v = pair.partition("=")
                if not sep:
                    raise ComposeError(f"{path}: only `ENV key=value` is understood, not {ln!r}")
                env[k] = v
    if not entrypoint:
        raise ComposeError(f"{path}: the final stage has no exec-form ENTRYPOINT")
    return Image(entrypoint, env)


def executable(name: str) -> str:
    """An image's program as installed here: this virtualenv's (``trimtab``, ``python``) first."""
    venv = Path(sys.executable).parent / name
    if venv.is_file():
        return str(venv)
    raise ComposeError(f"{name} is not installed in {venv.parent}")


# ---------------------------------------------------------------------------------------------- the file
@dataclass(frozen=True)
class Service:
    name: str
    spec: dict[str, Any]

    @property
    def image(self) -> str:
        return str(self.spec.get("image", ""))

    @property
    def built_here(self) -> bool:
        return self.spec.get("build") in (".", "./")

    @property
    def command(self) -> list[str]:
        return _words(self.spec.get("command"))

    @property
    def entrypoint(self) -> list[str] | None:
        return _words(self.spec["entrypoint"]) if "entrypoint" in self.spec else None

    @property
    def environment(self) -> dict[str, str]:
        env = self.spec.get("environment") or {}
        if isinstance(env, list):
            env = dict(item.split("=", 1) for item in env)
        return {str(k): interpolate(str(v)) for k, v in env.items() if v is not None}

    @property
    def depends_on(self) -> dict[str, str]:
        """Service -> condition (``service_started`` for the short form)."""
        deps = self.spec.get("depends_on") or {}
        if isinstance(deps, list):
            return dict.fromkeys(deps, "service_started")
        return {str(k): str((v or {}).get("condition", "service_started")) for k, v in deps.items()}

    @property
    def published(self) -> dict[int, int]:
        """Host port -> container port of ``ports: ["8081:8080"]``."""
        out: dict[int, int] = {}
        for p in self.spec.get("ports") or []:
            host, _, container = str(p).rpartition(":")
            out[int(host.rpartition(":")[2])] = int(container.split("/")[0])
        return out


class Compose:
    """docker-compose.yml, parsed (anchors and ``<<`` merge keys resolved by YAML), with the host side of
    its volumes under ``volumes_root``."""

    def __init__(self, path: Path = COMPOSE_FILE, volumes_root: Path | None = None) -> None:
        self.path = path
        self.text = path.read_text()
        self.doc: dict[str, Any] = yaml.safe_load(self.text)
        self.services = {name: Service(name, spec or {}) for name, spec in self.doc["services"].items()}
        self.volumes_root = volumes_root
        self.addresses = {name: f"{ADDRESS_PREFIX}{FIRST_HOST + i}" for i, name in enumerate(self.services)}

    def service(self, name: str) -> Service:
        return self.services[name]

    def trimtab_image(self) -> str:
        """The image the services built from ``.`` are tagged with."""
        return next(s.image for s in self.services.values() if s.built_here)

    def runs_trimtab(self, s: Service) -> bool:
        return s.built_here or (s.image != "" and s.image == self.trimtab_image())

    def order(self) -> list[Service]:
        """Every service after the ones it depends on (file order otherwise)."""
        done: list[Service] = []
        seen: set[str] = set()

        def visit(name: str, path: tuple[str, ...]) -> None:
            if name in seen:
                return
            if name in path:
                raise ComposeError(f"depends_on cycle: {' -> '.join((*path, name))}")
            for dep in self.services[name].depends_on:
                visit(dep, (*path, name))
            seen.add(name)
            done.append(self.services[name])

        for name in self.services:
            visit(name, ())
        return done

    def one_shot(self, s: Service) -> bool:
        """Another service waits for it to *complete*: it is run to its end, not kept running."""
        return any(
            o.depends_on.get(s.name) == "service_completed_successfully" for o in self.services.values()
        )

    # ------------------------------------------------------------------ volumes
    def volume_dir(self, volume: str) -> Path:
        if self.volumes_root is None:
            raise ComposeError("no volumes_root: named volumes need a directory")
        path = self.volumes_root / volume
        path.mkdir(parents=True, exist_ok=True)
        return path

    def mounts(self, s: Service) -> dict[str, str]:
        """Container path -> host path of every volume of ``s``."""
        out: dict[str, str] = {}
        for v in s.spec.get("volumes") or []:
            if not isinstance(v, str):
                raise ComposeError(f"{s.name}: only the short volume syntax is emulated, not {v!r}")
            source, target = v.split(":")[:2]
            if source.startswith((".", "/")):
                host = (self.path.parent / source).resolve()
                if not host.exists():
                    raise ComposeError(f"{s.name}: bind mount source {source} does not exist")
                out[target] = str(host)
            else:
                out[target] = str(self.volume_dir(source))
        return out

    def localize(self, s: Service, text: str) -> str:
        """``text`` with every mount target of ``s`` replaced by its host path (longest target first)."""
        for target, host in sorted(self.mounts(s).items(), key=lambda kv: -len(kv[0])):
            text = re.sub(re.escape(target) + r"(?=$|[/\s\"'),;:])", host.replace("\\", "\\\\"), text)
        return text

    # ------------------------------------------------------------------ processes
    def argv(self, s: Service, image: Image) -> list[str]:
        """``<entrypoint> <command>`` of a trimtab-image service, its program as installed here."""
        entry = s.entrypoint if s.entrypoint is not None else image.entrypoint
        words = [self.localize(s, w) for w in [*entry, *s.command]]
        if not words:
            raise ComposeError(f"{s.name}: nothing to run")
        return [executable(words[0]), *words[1:]]

    def env(self, s: Service, image: Image) -> dict[str, str]:
        """The image's ENV under the service's environment; mount targets and ``0.0.0.0`` localized."""
        merged = {**image.env, **s.environment}
        return {
            k: self.addresses[s.name] if v == "0.0.0.0" else self.localize(s, v) for k, v in merged.items()
        }

    # ------------------------------------------------------------------ the ZooKeeper service
    def zookeeper_config(self, s: Service) -> dict[str, str]:
        """The official zookeeper image's ``ZOO_*`` variables as ``zoo.cfg`` lines; one it does not know
        here fails the test (so a new setting in docker-compose.yml is not silently dropped)."""
        out: dict[str, str] = {}
        for k, v in s.environment.items():
            if k not in _ZOO_CFG:
                raise ComposeError(f"{s.name}: {k} is not emulated (tests/support/compose.py _ZOO_CFG)")
            out[_ZOO_CFG[k]] = v
        return out

    # ------------------------------------------------------------------ the Kafka service
    def kafka_version(self, s: Service) -> str:
        m = re.fullmatch(r"apache/kafka(?:-native)?:([0-9][0-9.]*)", s.image)
        if not m:
            raise ComposeError(f"{s.name}: {s.image!r} is not an apache/kafka:<version> image")
        return m.group(1)

    def kafka_server_properties(self, s: Service) -> dict[str, str]:
        """The apache/kafka image's ``KAFKA_*`` variables as server properties (``___`` is ``-``, ``__``
        is ``_``, ``_`` is ``.``), less what :data:`_KAFKA_OWNED` leaves to KafkaCluster."""
        out: dict[str, str] = {}
        for k, v in s.environment.items():
            if not k.startswith("KAFKA_"):
                continue
            prop = k[6:].lower().replace("___", "-").replace("__", "\0").replace("_", ".").replace("\0", "_")
            if prop not in _KAFKA_OWNED:
                out[prop] = v
        return out

    def kafka_advertised(self, s: Service) -> tuple[str, int]:
        """(host, port) of the service's PLAINTEXT advertised listener: where compose's clients connect."""
        for listener in s.environment["KAFKA_ADVERTISED_LISTENERS"].split(","):
            name, _, hostport = listener.partition("://")
            if name == "PLAINTEXT":
                host, _, port = hostport.rpartition(":")
                return host, int(port)
        raise ComposeError(f"{s.name}: no PLAINTEXT advertised listener")


def pom_kafka_version(path: Path = KAFKA_POM) -> str:
    m = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", path.read_text())
    if not m:
        raise ComposeError(f"{path}: no <kafka.version>")
    return m.group(1)


# ---------------------------------------------------------------------------------------------- Kafka
class ComposeKafka(KafkaCluster):
    """One KRaft node as :class:`KafkaCluster` runs it (its own listeners on 127.0.0.1 random ports, which
    its readiness check and the quorum use) plus one more listener, ``COMPOSE``, bound where compose's
    clients look for the broker and advertising compose's name for it, so a client that bootstraps from
    ``kafka:9092`` is told ``kafka:9092`` again. It extends ``_server_config``, the one place the node's
    properties are made, because the listener list holds ports chosen at :meth:`start`."""

    def __init__(
        self, workdir: Path, *, bind: tuple[str, int], advertised: tuple[str, int], **kwargs: Any
    ) -> None:
        super().__init__(workdir, brokers=1, **kwargs)
        self.compose_bind = bind
        self.compose_advertised = advertised

    def _server_config(self, node: Any) -> dict[str, Any]:
        cfg = super()._server_config(node)
        (host, port), (ahost, aport) = self.compose_bind, self.compose_advertised
        cfg["listeners"] = f"{cfg['listeners']},COMPOSE://{host}:{port}"
        cfg["advertised.listeners"] = f"{cfg['advertised.listeners']},COMPOSE://{ahost}:{aport}"
        cfg["listener.security.protocol.map"] = f"{cfg['listener.security.protocol.map']},COMPOSE:PLAINTEXT"
        return cfg


# ---------------------------------------------------------------------------------------------- /etc/hosts
def _strip_block(text: str, begin: str, end: str) -> str:
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.strip() == begin:
            inside = True
        elif inside and line.strip() == end:
            inside = False
        elif not inside:
            out.append(line)
    return "".join(out)


@contextlib.contextmanager
def hosts_entries(addresses: Mapping[str, str], path: Path = HOSTS_FILE) -> Iterator[None]:
    """``address name`` lines in ``path`` between markers for the duration, removed after (and any block
    a killed earlier run left behind removed first). The file is rewritten in place: /etc/hosts may be a
    bind mount, which a rename would break."""
    begin, end = "# >>> trimtab compose test", "# <<< trimtab compose test"
    if not os.access(path, os.W_OK):
        raise ComposeError(f"{path} is not writable: the compose test maps service names there (run as root)")
    original = _strip_block(path.read_text(), begin, end)
    if original and not original.endswith("\n"):
        original += "\n"
    block = "".join(f"{ip} {name}\n" for name, ip in addresses.items())
    path.write_text(f"{original}{begin}\n{block}{end}\n")
    try:
        yield
    finally:
        path.write_text(_strip_block(path.read_text(), begin, end))
