"""Hosts of their own for the chaos suite: Linux network namespaces joined by veth pairs and a bridge, so
that links between ZooKeeper, Kafka, agents, brokers and controllers can be cut (issue 31).

A :class:`Network` is one bridge (``tt<tag>br``) with no uplink -- traffic never leaves the machine -- and
an address of its own in the root namespace, so the suite's clients and checker (which stay in the root
namespace) reach every host. Each :class:`Host` is a namespace (``tt<tag>-<name>``) with loopback up and
one veth into the bridge (``10.<a>.<b>.<n>/24``). Processes run in a host with :meth:`Network.argv`
(``ip netns exec``).

Faults work on a kernel without netfilter, tc classifiers or ``sch_netem`` (this machine's has none):

* :meth:`Network.cut` -- each side's neighbour entry for the other pinned to a hardware address nobody
  has: frames to the peer go out and are dropped by every port of the bridge, so packets vanish silently,
  as on a partitioned network (TCP retransmits and times out; nothing is refused, as a ``blackhole`` or
  ``unreachable`` route would refuse a local sender at once);
* :meth:`Network.cut` with ``oneway=True`` -- only ``a``'s entry: what ``a`` sends to ``b`` is lost, what
  ``b`` sends reaches ``a`` (its answers do not come back);
* :meth:`Network.isolate` -- a host cut from every other host and from the root namespace (:data:`ROOT`,
  where the suite's clients run);
* :meth:`Network.throttle` -- a token bucket (``tbf``) on a host's link: a slow link;
* :meth:`Network.delay` -- netem's ``delay 200ms 100ms loss 5%`` on a link, done by a process reading a
  TUN device the peer is routed into (:mod:`trimtab.devkit.netem`);
* :meth:`Network.heal` -- the routes removed.

Cleaning up is not left to the suite's ``finally``: :meth:`Network.create` starts a guardian process that
holds the read end of a pipe whose only write end is the suite's. When the suite exits -- normally or by
``kill -9`` -- the pipe closes and the guardian kills every process left in the network's namespaces and
deletes the namespaces, the veths and the bridge. :func:`sweep` removes what a guardian that was itself
killed left behind (every network whose owner is gone), and runs before each new network.

Bad input is refused: host names are short lowercase words, at most :data:`MAX_HOSTS` hosts, and only
names this module made (the ``tt`` prefix and a registered tag) are ever deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trimtab.errors import DevKitError

#: Where each network's owner is registered (tag -> the suite's pid and the names it made).
STATE_DIR = Path(os.environ.get("TRIMTAB_NETNS_STATE", "/run/trimtab-netns"))
PREFIX = "tt"
MAX_HOSTS = 60
#: The root namespace, as an end of a link (the suite's clients, and servers bound to the gateway address).
ROOT = "root"
#: A locally administered unicast hardware address no interface has: where a cut link's frames go.
NOWHERE = "02:00:5e:ff:ff:01"
_NAME = re.compile(r"^[a-z][a-z0-9]{0,7}$")
_TAG = re.compile(r"^[a-z0-9]{5}$")


class NetnsError(DevKitError):
    """A network namespace operation failed (no permission, a kernel without the feature, bad input)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and res.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {res.stderr.strip() or res.returncode}")
    return res


def _tc(*args: str) -> None:
    res = subprocess.run(["tc", *args], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise NetnsError(f"tc {' '.join(args)}: {res.stderr.strip() or res.returncode}")


def available() -> str | None:
    """None if this machine can make networks; else why not (the tests skip with that reason)."""
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    probe = f"{PREFIX}probe{os.getpid() % 100000}"
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        return f"cannot create a network namespace: {res.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True)
class Host:
    name: str
    ns: str  # the namespace
    ip: str
    veth: str  # the root-side end of its link, in the bridge


@dataclass
class Network:
    tag: str
    subnet: str  # "10.a.b": hosts are .1 to .MAX_HOSTS, the root namespace is .254
    hosts: dict[str, Host] = field(default_factory=dict)
    cuts: set[tuple[str, str]] = field(default_factory=set)  # (from, to): what `from` sends `to` is lost
    # (from, to) -> the netem process holding what `from` sends `to`
    delays: dict[tuple[str, str], subprocess.Popen[bytes]] = field(default_factory=dict)
    _guard: subprocess.Popen[bytes] | None = None
    _pipe: int | None = None

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.tag}br"

    @property
    def gateway(self) -> str:
        """The root namespace's address on the network (where the suite's clients talk from)."""
        return f"{self.subnet}.254"

    # ------------------------------------------------------------------ life cycle
    @classmethod
    def create(cls) -> Network:
        """A new, empty network with its guardian; what earlier owners left behind is swept first."""
        sweep()
        used = {line.split()[0] for line in _ip("route", "show").stdout.splitlines() if line}
        for _ in range(50):
            subnet = f"10.{secrets.randbelow(200) + 20}.{secrets.randbelow(250) + 1}"
            if f"{subnet}.0/24" not in used:
                break
        else:
            raise NetnsError("no free 10.x.y.0/24 subnet for a network")
        net = cls(tag=secrets.token_hex(3)[:5], subnet=subnet)
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        net._register()
        try:
            _ip("link", "add", net.bridge, "type", "bridge")
            _ip("addr", "add", f"{net.gateway}/24", "dev", net.bridge)
            _ip("link", "set", net.bridge, "up")
            net._start_guardian()
        except BaseException:
            net.close()
            raise
        return net

    def _register(self) -> None:
        (STATE_DIR / self.tag).write_text(json.dumps({"owner": os.getpid(), "subnet": self.subnet}))

    def _start_guardian(self) -> None:
        read, write = os.pipe()  # both ends close-on-exec: no other child of the suite holds the write end
        self._guard = subprocess.Popen(
            [sys.executable, "-m", "trimtab.devkit.netns", "guard", self.tag, str(read)],
            pass_fds=(read,),
            start_new_session=True,  # not killed with the suite's process group
            stdin=subprocess.DEVNULL,
        )
        os.close(read)
        self._pipe = write

    def close(self) -> None:
        """Everything of this network gone: its processes, namespaces, veths, bridge, registration."""
        for proc in self.delays.values():
            proc.kill()
            proc.wait()
        self.delays.clear()
        teardown(self.tag)
        if self._pipe is not None:
            os.close(self._pipe)  # the guardian finds nothing left to do and exits
            self._pipe = None
        if self._guard is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._guard.wait(10)
            self._guard = None

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ hosts
    def add_host(self, name: str) -> Host:
        if not _NAME.match(name) or name == ROOT:
            raise NetnsError(f"host name {name!r}: 1-8 lowercase letters and digits, starting with a letter")
        if name in self.hosts:
            raise NetnsError(f"host {name} exists already")
        if len(self.hosts) >= MAX_HOSTS:
            raise NetnsError(f"at most {MAX_HOSTS} hosts in a network")
        n = len(self.hosts) + 1
        host = Host(name, f"{PREFIX}{self.tag}-{name}", f"{self.subnet}.{n}", f"{PREFIX}{self.tag}{n:02d}")
        _ip("netns", "add", host.ns)
        _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.ns)
        _ip("link", "set", host.veth, "master", self.bridge, "up")
        _ip("-n", host.ns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        _ip("-n", host.ns, "link", "set", "eth0", "up")
        _ip("-n", host.ns, "link", "set", "lo", "up")
        self.hosts[name] = host
        return host

    def argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``host``'s namespace."""
        return ["ip", "netns", "exec", self.hosts[host].ns, *argv]

    # ------------------------------------------------------------------ faults
    def _end(self, name: str) -> tuple[list[str], str, str]:
        """(``ip`` arguments that select its namespace, its device on the network, its address)."""
        if name == ROOT:
            return [], self.bridge, self.gateway
        h = self.hosts[name]
        return ["-n", h.ns], "eth0", h.ip

    def cut(self, a: str, b: str, *, oneway: bool = False) -> None:
        """Cut the link between hosts ``a`` and ``b`` -- either may be :data:`ROOT` -- (``oneway``: only
        what ``a`` sends is lost)."""
        pairs = [(a, b)] if oneway else [(a, b), (b, a)]
        for src, dst in pairs:
            if (src, dst) not in self.cuts:
                at, dev, _ = self._end(src)
                ip = self._end(dst)[2]
                _ip(*at, "neigh", "replace", ip, "lladdr", NOWHERE, "dev", dev, "nud", "permanent")
                self.cuts.add((src, dst))

    def isolate(self, name: str) -> None:
        """Cut ``name`` from every other host and from the root namespace."""
        for other in [*self.hosts, ROOT]:
            if other != name:
                self.cut(name, other)

    @property
    def mark(self) -> int:
        """The firewall mark, and routing table, of the packets a netem process sends on."""
        return mark_of(self.tag)

    def delay(
        self,
        a: str,
        b: str,
        *,
        delay_ms: float = 200,
        jitter_ms: float = 100,
        loss: float = 0.05,
        oneway: bool = False,
        seed: int = 0,
    ) -> None:
        """A slow, lossy link between ``a`` and ``b`` (either may be :data:`ROOT`): each packet either
        way (``oneway``: only what ``a`` sends) held ``delay_ms ± jitter_ms`` or lost with probability
        ``loss`` -- ``tc qdisc ... netem delay 200ms 100ms loss 5%`` on each end, without netem."""
        from trimtab.devkit.netem import Shape

        shape = Shape(delay_ms, jitter_ms, loss)  # refuses nonsense before anything is changed
        for n, (src, dst) in enumerate([(a, b)] if oneway else [(a, b), (b, a)]):
            if (src, dst) in self.delays:
                continue
            at, dev, src_ip = self._end(src)
            dst_ip = self._end(dst)[2]
            tun = f"{PREFIX}{self.tag}d{dst_ip.rsplit('.', 1)[1]}"
            argv = [
                sys.executable, "-m", "trimtab.devkit.netem", tun, str(shape.delay_ms), str(shape.jitter_ms),
                str(shape.loss), str(self.mark), str(seed * 2 + n),
            ]  # fmt: skip
            proc = subprocess.Popen(
                argv if src == ROOT else self.argv(src, argv),
                stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
            )
            assert proc.stdout is not None
            ready = proc.stdout.readline()  # the device exists once it says so (or it died: b"")
            if ready.strip() != b"ready":
                proc.kill()
                raise NetnsError(f"netem on {src}->{dst} did not start (exit {proc.wait()})")
            self.delays[(src, dst)] = proc
            table = str(self.mark)
            _ip(*at, "link", "set", tun, "up")
            # Marked packets (the netem process's own) leave by the real link; the rest go into the TUN.
            _ip(*at, "route", "replace", f"{dst_ip}/32", "dev", dev, "src", src_ip, "table", table)
            if f"fwmark {hex(self.mark)} lookup {table}" not in _ip(*at, "rule", "show").stdout:
                _ip(*at, "rule", "add", "fwmark", table, "lookup", table, "pref", "100")
            _ip(*at, "route", "replace", f"{dst_ip}/32", "dev", tun, "src", src_ip)

    def _undelay(self, src: str, dst: str) -> None:
        proc = self.delays.pop((src, dst))
        proc.terminate()  # its device goes with it, and the route into the device
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        at = self._end(src)[0]
        _ip(*at, "route", "del", f"{self._end(dst)[2]}/32", "table", str(self.mark), check=False)
        if not any(s == src for s, _ in self.delays):
            _ip(*at, "rule", "del", "fwmark", str(self.mark), "lookup", str(self.mark), check=False)

    def heal(self, a: str | None = None, b: str | None = None) -> None:
        """Remove the cuts and delays between ``a`` and ``b`` (both directions); with no hosts named,
        every one."""
        for src, dst in sorted(self.delays):
            if a is None or {src, dst} == {a, b}:
                self._undelay(src, dst)
        for src, dst in sorted(self.cuts):
            if a is None or {src, dst} == {a, b}:
                # Forgotten: the next packet asks for the peer's address again.
                at, dev, _ = self._end(src)
                _ip(*at, "neigh", "del", self._end(dst)[2], "dev", dev, check=False)
                self.cuts.discard((src, dst))

    def throttle(self, host: str, rate: str = "256kbit", latency_ms: int = 400) -> None:
        """A slow link: ``host``'s traffic in both directions through a token bucket of ``rate``."""
        h = self.hosts[host]
        args = ["root", "tbf", "rate", rate, "burst", "16kbit", "latency", f"{latency_ms}ms"]
        _tc("-n", h.ns, "qdisc", "replace", "dev", "eth0", *args)
        _tc("qdisc", "replace", "dev", h.veth, *args)

    def unthrottle(self, host: str) -> None:
        h = self.hosts[host]
        for args in (
            ["-n", h.ns, "qdisc", "del", "dev", "eth0", "root"],
            ["qdisc", "del", "dev", h.veth, "root"],
        ):
            subprocess.run(["tc", *args], capture_output=True, check=False)


# ---------------------------------------------------------------------- cleaning up
def mark_of(tag: str) -> int:
    """A network's firewall mark and routing table number (unique per tag, clear of the reserved tables)."""
    return 0x1000000 + int(tag, 16)


def _namespaces(tag: str) -> list[str]:
    out = _ip("netns", "list", check=False).stdout.split("\n")
    return [line.split()[0] for line in out if line.startswith(f"{PREFIX}{tag}-")]


def teardown(tag: str) -> None:
    """Kill every process in the network's namespaces, delete them, its veths and bridge, and its
    registration. Safe to run twice, and on a network half made."""
    if not _TAG.match(tag):
        raise NetnsError(f"not a network tag: {tag!r}")
    for ns in _namespaces(tag):
        pids = _ip("netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "del", ns, check=False)  # its end of each veth goes with it, and so the pair
    links = _ip("-o", "link", "show", check=False).stdout.splitlines()
    for line in links:
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(f"{PREFIX}{tag}"):
            _ip("link", "del", name, check=False)
    # A delayed link from the root namespace: its rule and table (its TUN went with the links above, and
    # with it the netem process, whose reads fail).
    mark = str(mark_of(tag))
    while _ip("rule", "del", "fwmark", mark, "lookup", mark, check=False).returncode == 0:
        pass
    _ip("route", "flush", "table", mark, check=False)
    with contextlib.suppress(FileNotFoundError):
        (STATE_DIR / tag).unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep() -> list[str]:
    """Tear down every registered network whose owner is gone; the tags removed."""
    gone: list[str] = []
    if not STATE_DIR.is_dir():
        return gone
    for entry in sorted(STATE_DIR.iterdir()):
        if not _TAG.match(entry.name):
            continue
        try:
            owner = int(json.loads(entry.read_text())["owner"])
        except (ValueError, KeyError, TypeError, OSError):
            owner = -1
        if owner <= 0 or not _alive(owner):
            teardown(entry.name)
            gone.append(entry.name)
    return gone


def _guard(tag: str, fd: int) -> int:
    """The guardian: wait for the owner's end of the pipe to close, then tear the network down."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the suite must not skip the clean-up
    with os.fdopen(fd, "rb") as pipe:
        while pipe.read(4096):
            pass
    # The owner may have closed the network itself (nothing left) or died (everything left).
    for _ in range(3):
        try:
            teardown(tag)
            return 0
        except NetnsError:
            time.sleep(0.2)
    return 1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 3 and args[0] == "guard":
        return _guard(args[1], int(args[2]))
    if args == ["sweep"]:
        print(json.dumps({"removed": sweep()}))
        return 0
    print("usage: python -m trimtab.devkit.netns sweep", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
