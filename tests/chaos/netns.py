"""A network namespace joined to this host by a veth pair, so a process inside it can be cut
off from Redis by the kernel itself: `partition()` takes the host end of the link down (no
FIN, no RST: packets are dropped, the kernel's retransmission timers, keepalive and
TCP_USER_TIMEOUT are what the process meets), `heal()` brings it up again.

The two ends get the addresses of a private /30 (10.213.0.0/16 cut into blocks of 4, one
picked from the pid, so parallel test processes do not collide), and the names carry the pid
too. Redis is reached from inside at `host_ip` (a proxy link or a server bound there). Created
and removed by the caller (`with Netns() as ns:`); removal also runs on failure.

`available()` says why not where namespaces cannot be made (not root, no CAP_NET_ADMIN, no
iproute2): tests skip with that reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from itertools import count

_serial = count()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=10)


def available() -> str | None:
    """None if this process may create network namespaces, else why not."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN)"
    name = f"dtprobe{os.getpid()}"
    r = _ip("netns", "add", name, check=False)
    if r.returncode != 0:
        return f"`ip netns add` is not permitted here: {r.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


class Netns:
    def __init__(self) -> None:
        n = next(_serial)
        tag = f"{os.getpid() % 100000}{n}"
        self.name = f"dtns{tag}"
        self.host_if, self.ns_if = f"dth{tag}", f"dtn{tag}"  # at most 15 characters
        block = ((os.getpid() * 8 + n) % 16384) * 4
        base = f"10.213.{block // 256}."
        self.host_ip, self.ns_ip = f"{base}{block % 256 + 1}", f"{base}{block % 256 + 2}"
        self.partitioned = False
        self.partitions: list[tuple[float, float | None]] = []  # (down, up) times, epoch s

    def __enter__(self) -> Netns:
        try:
            _ip("netns", "add", self.name)
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _ip("link", "set", self.ns_if, "netns", self.name)
            _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            self.exec_ip("addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
            self.exec_ip("link", "set", self.ns_if, "up")
            self.exec_ip("link", "set", "lo", "up")
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def exec_ip(self, *args: str) -> None:
        _ip("netns", "exec", self.name, "ip", *args)

    def prefix(self) -> list[str]:
        """What runs a command inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def partition(self) -> None:
        _ip("link", "set", self.host_if, "down")
        self.partitioned = True
        self.partitions.append((time.time(), None))

    def heal(self) -> None:
        _ip("link", "set", self.host_if, "up")
        self.partitioned = False
        if self.partitions and self.partitions[-1][1] is None:
            self.partitions[-1] = (self.partitions[-1][0], time.time())

    def remove(self) -> None:
        """The link and the namespace, whatever state they are in (deleting the namespace
        deletes its end of the pair, which deletes the other)."""
        with contextlib.suppress(Exception):
            _ip("link", "del", self.host_if, check=False)
        with contextlib.suppress(Exception):
            _ip("netns", "del", self.name, check=False)
