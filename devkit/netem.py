"""A slow, lossy link without ``sch_netem``: packets to one peer pass through a TUN device and a process
that holds each one for a random delay, drops some, and sends the rest on (issue 31's ``netem_delay``).

This machine's kernel has no ``sch_netem`` (``tc qdisc add ... netem`` answers "Specified qdisc kind is
unknown"), no netfilter and no tc classifiers. It does have TUN devices and policy routing, which are
enough to do what netem does on one direction of one link, at packet level:

* in the sending host's namespace, the peer's address is routed (a ``/32``, more specific than the
  network's ``/24``) into a TUN device this process reads -- every IP packet the host sends the peer,
  TCP segments, retransmissions and ACKs alike, reaches it and nothing else does;
* each packet is dropped with probability ``loss``, or held for ``delay ± jitter`` (uniform, netem's
  default) and written to a raw IP socket carrying a firewall mark; a routing rule sends marked packets
  by a table of their own, where the peer is on the real link -- so they leave as if never diverted.

Like netem with jitter, packets may be reordered; TCP sees real delay, loss, retransmission and
reordering. The device is not persistent: when this process dies (``kill -9`` included), the device and
the routes into it go, and the link is whole again. :meth:`~trimtab.devkit.netns.Network.delay` sets it
up and :meth:`~trimtab.devkit.netns.Network.heal` takes it down.
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
SO_MARK = 36
MTU = 65535


@dataclass(frozen=True)
class Shape:
    """One direction of a link: mean delay, jitter (uniform ±), loss probability."""

    delay_ms: float
    jitter_ms: float
    loss: float

    def __post_init__(self) -> None:
        if not (0 <= self.jitter_ms <= self.delay_ms <= 60_000):
            raise ValueError(
                f"delay {self.delay_ms} ms ± {self.jitter_ms} ms: need 0 <= jitter <= delay <= 60 s"
            )
        if not (0 <= self.loss < 1):
            raise ValueError(f"loss {self.loss}: need 0 <= loss < 1")

    def hold_s(self, rng: random.Random) -> float | None:
        """How long to hold one packet, in seconds; None: drop it."""
        if self.loss and rng.random() < self.loss:
            return None
        return max(0.0, self.delay_ms + rng.uniform(-self.jitter_ms, self.jitter_ms)) / 1000


def open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def run(name: str, shape: Shape, mark: int, seed: int) -> int:
    """Read packets from the TUN device ``name`` until it goes or a signal stops us; send each on after its
    hold, marked ``mark``. Prints ``ready`` once the device exists."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    tun = open_tun(name)
    out = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    out.setsockopt(socket.SOL_SOCKET, SO_MARK, mark)
    rng = random.Random(seed)
    held: list[tuple[float, int, bytes]] = []
    n = 0
    print("ready", flush=True)
    while True:
        timeout = max(0.0, held[0][0] - time.monotonic()) if held else 1.0
        readable, _, _ = select.select([tun], [], [], timeout)
        if readable:
            while True:
                try:
                    pkt = os.read(tun, MTU)
                except BlockingIOError:
                    break
                except OSError:
                    return 0  # the device was deleted: the link is whole again
                if len(pkt) < 20 or pkt[0] >> 4 != 4:
                    continue  # not IPv4 (the network is IPv4 only)
                hold = shape.hold_s(rng)
                if hold is not None:
                    n += 1
                    heapq.heappush(held, (time.monotonic() + hold, n, pkt))
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, _, pkt = heapq.heappop(held)
            dst = socket.inet_ntoa(pkt[16:20])
            with contextlib.suppress(OSError):  # a cut link, a full buffer: lost, as on a real link
                out.sendto(pkt, (dst, 0))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 6:
        print(
            "usage: python -m trimtab.devkit.netem DEVICE DELAY_MS JITTER_MS LOSS MARK SEED", file=sys.stderr
        )
        return 2
    name, delay, jitter, loss, mark, seed = args
    return run(name, Shape(float(delay), float(jitter), float(loss)), int(mark), int(seed))


if __name__ == "__main__":
    raise SystemExit(main())
