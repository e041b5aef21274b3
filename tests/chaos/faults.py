"""Faults the harness injects, and the log of when each one happened.

The log is the checker's evidence: an expired lease or an interrupted execution is legitimate
only if a fault that affects its holder was in force at the time; a run lost by the server is
forgiven only inside the window its restart mode may lose (AOF `everysec` + SIGKILL: the
last ~1 s of acknowledged writes, Redis's documented durability; 2 s are allowed, as Redis
skips an fsync while the previous one is still running).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from duetime.embedded import EmbeddedServer

EVERYSEC_LOSS_S = 2.0

# Faults after which a lease may expire, and a run be retried, legitimately.
LEASE_BREAKERS = frozenset({"sigkill", "sigstop", "sigterm", "cut", "stall", "server_sigkill",
                            "server_shutdown", "halfopen", "reset", "partition"})
SERVER_WIDE = frozenset({"server_sigkill", "server_shutdown", "oom"})


@dataclass
class Fault:
    kind: str
    target: str  # a fleet member ('w1', 's2'), or 'server'
    start: float
    end: float | None = None  # None while in force; instantaneous faults end when they start
    detail: dict[str, Any] = field(default_factory=dict)

    def covers(self, t0: float, t1: float, after: float = 0.0) -> bool:
        """In force at some time of [t0, t1], or ended at most `after` seconds before t1."""
        end = self.end if self.end is not None else float("inf")
        return self.start <= t1 and end + after >= t0


class FaultLog:
    def __init__(self) -> None:
        self.faults: list[Fault] = []
        self._open: dict[tuple[str, str], Fault] = {}
        self._lock = threading.Lock()

    def note(self, kind: str, target: str, **detail: Any) -> Fault:
        t = time.time()
        f = Fault(kind, target, t, t, detail)
        with self._lock:
            self.faults.append(f)
        return f

    def begin(self, kind: str, target: str, **detail: Any) -> Fault:
        f = Fault(kind, target, time.time(), None, detail)
        with self._lock:
            self.faults.append(f)
            self._open[(kind, target)] = f
        return f

    def end(self, kind: str, target: str) -> None:
        with self._lock:
            f = self._open.pop((kind, target), None)
        if f is not None:
            f.end = time.time()

    def of(self, *kinds: str) -> list[Fault]:
        return [f for f in self.faults if f.kind in kinds]

    def loss_windows(self) -> list[tuple[float, float]]:
        """Intervals whose acknowledged writes a restart mode was allowed to lose."""
        return [(f.start - EVERYSEC_LOSS_S, f.start) for f in self.of("server_sigkill")
                if f.detail.get("fsync") == "everysec"]

    def lossy(self, t: float | None, slack: float = 0.05) -> bool:
        if t is None:
            return False
        return any(lo - slack <= t <= hi + slack for lo, hi in self.loss_windows())

    def summary(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.faults:
            if f.kind != "start":
                key = f.kind if "fsync" not in f.detail else f"{f.kind}({f.detail['fsync']})"
                out[key] = out.get(key, 0) + 1
        return out


class ServerControl:
    """Restarts and memory pressure of the one server every process talks to."""

    def __init__(self, server: EmbeddedServer, faults: FaultLog) -> None:
        self.server, self.faults = server, faults

    def client(self) -> redis.Redis:
        # no retries: a SHUTDOWN sent again after the server left would wait out the backoff
        return redis.Redis(port=self.server.port, socket_connect_timeout=2, socket_timeout=5,
                           retry=Retry(NoBackoff(), 0))

    def set_fsync(self, mode: str) -> None:
        c = self.client()
        c.config_set("appendfsync", mode)
        c.close()

    def sigkill_restart(self, fsync: str, down_s: float) -> None:
        """SIGKILL the server (what the AOF holds survives), then start it on its port."""
        self.set_fsync(fsync)
        if fsync == "everysec":
            time.sleep(0.3)  # the switch itself fsyncs; let writes accumulate after it
        f = self.faults.begin("server_sigkill", "server", fsync=fsync)
        self.server.kill()
        time.sleep(down_s)
        self._start()
        self.faults.end(f.kind, "server")

    def shutdown_restart(self, fsync: str, down_s: float) -> None:
        """SHUTDOWN (the server flushes and fsyncs its AOF and exits), then start it."""
        self.set_fsync(fsync)
        f = self.faults.begin("server_shutdown", "server", fsync=fsync)
        proc = self.server.process
        c = self.client()
        with contextlib.suppress(redis.ConnectionError):  # no reply: the server is gone
            c.shutdown()
        c.close()
        if proc is not None:
            proc.wait(30)
        self.server.kill()  # forgets the exited process (no signal reaches a dead one)
        time.sleep(down_s)
        self._start()
        self.faults.end(f.kind, "server")

    def _start(self) -> None:
        self.server.start(timeout=60)

    def oom(self, seconds: float) -> None:
        """maxmemory below used memory (the server's policy is noeviction: writes are refused,
        nothing is evicted), for `seconds`, then unlimited again."""
        c = self.client()
        used = int(c.info("memory")["used_memory"])
        f = self.faults.begin("oom", "server", used=used)
        c.config_set("maxmemory", used // 2)
        try:
            time.sleep(seconds)
        finally:
            c.config_set("maxmemory", 0)
            c.close()
            self.faults.end(f.kind, "server")
