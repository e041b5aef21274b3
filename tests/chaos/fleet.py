"""The duetime processes of a chaos run: workers and schedulers, each connected to the server
through its own proxy link, so a fault can cut, stall or slow one process's connections.

Processes write their logs to files (a pipe nobody reads would fill and block them), and
every signal the fleet sends is written to the fault log with its time, which is how the
checker attributes an interrupted execution or an expired lease to a fault.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.chaos.faults import FaultLog
from tests.chaos.journal import ENV as JOURNAL_ENV
from tests.chaos.netns import Netns
from tests.chaos.proxy import Link, ProxyHub

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.chaos:app"


@dataclass
class Exit:
    """A process that ended without the harness stopping it."""

    name: str
    pid: int
    code: int | None
    lived_s: float
    last_line: str


@dataclass
class Member:
    """One duetime process and the proxy link it talks through."""

    role: str  # 'worker' | 'scheduler'
    name: str  # w1, s2, ... stable across restarts of this slot
    link: Link
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None
    pids: list[int] = field(default_factory=list)  # every pid this slot ran, oldest first
    stopped: bool = False
    held_down: bool = False  # killed or stopping on purpose: the supervisor leaves it
    started_at: float = 0.0
    netns: Netns | None = None  # runs inside it, its link on the host end of the veth pair

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Fleet:
    def __init__(self, server_port: int, namespace: str, workdir: Path, faults: FaultLog,
                 hub: ProxyHub, latency: tuple[float, float] | None = None) -> None:
        self.server_port, self.namespace, self.workdir = server_port, namespace, workdir
        self.faults, self.hub = faults, hub
        self.latency = latency  # s: (lo, hi) on every link, every connection, both ways
        self.members: list[Member] = []
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.journal = workdir / "journal"
        self.exits: list[Exit] = []
        self._lock = threading.RLock()
        self._supervising = threading.Event()
        self._supervisor: threading.Thread | None = None

    def env(self, link: Link) -> dict[str, str]:
        return {**os.environ, "DUETIME_REDIS_URL": link.url(), "DUETIME_NAMESPACE": self.namespace,
                "PYTHONPATH": str(ROOT), JOURNAL_ENV: str(self.journal)}

    def add(self, role: str, *args: str, netns: Netns | None = None) -> Member:
        """A process of `role`; with `netns`, it runs inside that namespace and reaches the
        server through a link on the host end of its veth pair."""
        n = sum(1 for m in self.members if m.role == role) + 1
        link = self.hub.link(self.server_port, netns.host_ip if netns else "127.0.0.1")
        if self.latency is not None:
            link.latency(*self.latency)
        m = Member(role, f"{role[0]}{n}", link, list(args), netns=netns)
        self.members.append(m)
        self.start(m)
        return m

    def supervise(self) -> None:
        """Restart any process that ended by itself, as systemd's Restart=always would (a
        process started while the server is down exits with one error line, by design)."""
        def loop() -> None:
            while not self._supervising.wait(0.3):
                with self._lock:
                    for m in self.members:
                        if m.proc is None or m.held_down or m.proc.poll() is None:
                            continue
                        self.exits.append(Exit(m.name, m.proc.pid, m.proc.returncode,
                                               time.monotonic() - m.started_at, self.last_line(m)))
                        self.faults.note("exited", m.name, pid=m.proc.pid, code=m.proc.returncode)
                        self.start(m)
        self._supervisor = threading.Thread(target=loop, name="chaos-supervisor", daemon=True)
        self._supervisor.start()

    def last_line(self, m: Member) -> str:
        try:
            lines = (self.logs / f"{m.name}.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        errors = [ln for ln in lines if ln.startswith("error:") or "Traceback" in ln]
        return (errors or lines or [""])[-1][:300]

    def start(self, m: Member) -> None:
        with self._lock:
            self._start(m)

    def _start(self, m: Member) -> None:
        cmd = [*(m.netns.prefix() if m.netns else []),
               sys.executable, "-m", "duetime", "--log-level", "INFO", m.role]
        if m.role == "worker":
            cmd += ["--app", APP]
        cmd += m.args
        log = open(self.logs / f"{m.name}.log", "ab")  # noqa: SIM115 - owned by the process
        m.proc = subprocess.Popen(cmd, env=self.env(m.link), cwd=ROOT, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        m.pids.append(m.proc.pid)
        m.stopped = m.held_down = False
        m.started_at = time.monotonic()
        self.faults.note("start", m.name, pid=m.proc.pid)

    def of(self, role: str) -> list[Member]:
        return [m for m in self.members if m.role == role]

    # -- faults ----------------------------------------------------------------------------
    def kill(self, m: Member, **detail: object) -> None:
        """SIGKILL: the process dies at once, its leases expire later."""
        with self._lock:
            m.held_down = True
        if not m.alive():
            return
        assert m.proc is not None
        if m.stopped:
            self.cont(m)
        m.proc.send_signal(signal.SIGKILL)
        m.proc.wait()
        self.faults.note("sigkill", m.name, pid=m.proc.pid, **detail)

    def stop(self, m: Member) -> None:
        """SIGSTOP: frozen, connections open; its leases expire while it is frozen."""
        if m.alive() and not m.stopped:
            assert m.proc is not None
            m.proc.send_signal(signal.SIGSTOP)
            m.stopped = True
            self.faults.begin("sigstop", m.name, pid=m.proc.pid)

    def cont(self, m: Member) -> None:
        if m.alive() and m.stopped:
            assert m.proc is not None
            m.proc.send_signal(signal.SIGCONT)
            m.stopped = False
            self.faults.end("sigstop", m.name)

    def terminate(self, m: Member, timeout: float = 40.0) -> int | None:
        """SIGTERM and wait: the graceful stop (in-flight runs get their grace, then are
        released)."""
        with self._lock:
            m.held_down = True
        if not m.alive():
            return m.proc.returncode if m.proc else None
        assert m.proc is not None
        if m.stopped:
            self.cont(m)
        self.faults.note("sigterm", m.name, pid=m.proc.pid)
        m.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = m.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(m)
            code = None
        self.faults.note("exited", m.name, pid=m.proc.pid)
        return code

    def restart(self, m: Member) -> None:
        self.kill(m)
        self.start(m)

    def pid_names(self) -> dict[int, str]:
        return {pid: m.name for m in self.members for pid in m.pids}

    def close(self) -> None:
        self._supervising.set()
        if self._supervisor is not None:
            self._supervisor.join(5)
        for m in self.members:
            if m.alive():
                self.kill(m)


@contextlib.contextmanager
def chaos_fleet(port: int, url: str, namespace: str, workdir: Path) -> Iterator[Fleet]:
    """An empty fleet of the chaos app on the server at `port` (`url`), each member behind its
    own link of a new proxy hub, the app configured for `namespace`; all closed afterwards."""
    from tests.apps import chaos as chaos_app

    hub = ProxyHub()
    f = Fleet(port, namespace, workdir, FaultLog(), hub)
    chaos_app.app.configure(redis_url=url, namespace=namespace)
    try:
        yield f
    finally:
        f.close()
        hub.close()
        chaos_app.app.close()
