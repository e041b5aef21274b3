"""`duetime worker --processes N`: N single-process workers, kept at N.

A child that dies (killed, crashed) is started again after a back-off that doubles while it
keeps dying young, so a crash loop costs a start every 30 s at most, not a spinning CPU. Its
runs are not lost meanwhile: their leases expire and the reaper hands them to another worker.

A child that exits 2 was given bad input (an unknown option, an --app that does not import):
every child has the same options, so the supervisor stops them all and exits 2 at once. A child
that keeps failing right after start (GIVE_UP_AFTER times in a row, e.g. Redis unreachable)
makes the supervisor stop and exit 1, for the service manager above it to decide.

SIGTERM and SIGINT are forwarded to every child (each in its own process group, so a Ctrl-C
reaches a child once, through here); the supervisor exits when they all have.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from duetime.common import logs
from duetime.common.children import die_with_parent, without_options

EXIT_USAGE = 2
RESTART_MIN_S = 1.0
RESTART_MAX_S = 30.0
STABLE_S = 30.0  # a child that ran this long was healthy: its next death restarts it quickly
GIVE_UP_AFTER = 5  # deaths in a row, each before STABLE_S, before the supervisor gives up

log = logs.get("duetime.supervisor")


def child_argv(argv: Sequence[str], n: int, metrics_port: int | None) -> list[list[str]]:
    """The command lines of the N children: this one without --processes, each child on its
    own metrics port (port, port+1, ...)."""
    cleaned = without_options(argv, (), ("--processes", "--metrics-port"))
    base = [sys.executable, "-m", "duetime", *cleaned]
    return [[*base, *(["--metrics-port", str(metrics_port + i)] if metrics_port else [])]
            for i in range(n)]


def describe(code: int) -> str:
    """A child's return code as an operator reads it: `exit 1`, `SIGKILL`."""
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit {code}"


@dataclass
class Slot:
    index: int
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    failures: int = 0  # deaths in a row, each before STABLE_S
    restart_at: float | None = None


class Supervisor:
    def __init__(self, argvs: list[list[str]], clock: Callable[[], float] = time.monotonic,
                 restart_min_s: float = RESTART_MIN_S, restart_max_s: float = RESTART_MAX_S,
                 stable_s: float = STABLE_S, give_up_after: int = GIVE_UP_AFTER) -> None:
        self.slots = [Slot(i, a) for i, a in enumerate(argvs)]
        self.clock = clock
        self.restart_min_s, self.restart_max_s = restart_min_s, restart_max_s
        self.stable_s, self.give_up_after = stable_s, give_up_after
        self.stopping = False
        self.exit_code = 0
        self.restarts = 0

    def spawn(self, slot: Slot) -> None:
        slot.proc = subprocess.Popen(slot.argv, process_group=0, preexec_fn=die_with_parent)
        slot.started, slot.restart_at = self.clock(), None
        log.info("worker process started", slot=slot.index, pid=slot.proc.pid)

    def signal_all(self, signum: int) -> None:
        for s in self.slots:
            if s.proc is not None and s.proc.poll() is None:
                s.proc.send_signal(signum)

    def stop(self, signum: int = signal.SIGTERM, code: int | None = None) -> None:
        """Stop restarting, pass `signum` on to the children; `code` is the exit status to
        report if no child reports a worse one."""
        self.stopping = True
        if code is not None:
            self.exit_code = max(self.exit_code, code)
        for s in self.slots:
            s.restart_at = None
        self.signal_all(signum)

    def step(self) -> bool:
        """Look at every child once: note deaths, restart the due ones. False when done."""
        now = self.clock()
        for s in self.slots:
            if s.proc is not None and (code := s.proc.poll()) is not None:
                self._exited(s, code, now)
            elif s.proc is None and s.restart_at is not None and now >= s.restart_at and not self.stopping:
                self.spawn(s)
        return not (self.stopping and all(s.proc is None for s in self.slots))

    def _exited(self, s: Slot, code: int, now: float) -> None:
        pid, ran = s.proc.pid if s.proc else 0, now - s.started
        s.proc = None
        if self.stopping:
            # a child stopped by the forwarded signal reports 0 (or the signal itself)
            if code not in (0, -signal.SIGTERM, -signal.SIGINT):
                self.exit_code = max(self.exit_code, code if code > 0 else 128 - code)
            return
        if code == EXIT_USAGE:
            log.error("worker process refused its options; stopping all, not restarting",
                      slot=s.index, pid=pid, exit=describe(code))
            self.stop(code=EXIT_USAGE)
            return
        s.failures = s.failures + 1 if ran < self.stable_s else 1
        if s.failures >= self.give_up_after:
            log.error("worker process keeps dying right after start; stopping all",
                      slot=s.index, pid=pid, exit=describe(code), deaths_in_a_row=s.failures)
            self.stop(code=1)
            return
        delay = min(self.restart_max_s, self.restart_min_s * 2 ** (s.failures - 1))
        s.restart_at = now + delay
        self.restarts += 1
        log.warning("worker process died; restarting", slot=s.index, pid=pid, exit=describe(code),
                    ran_s=round(ran, 1), restart_in_s=delay, deaths_in_a_row=s.failures)

    def run(self, poll_s: float = 0.2) -> int:
        def forward(signum: int, _frame: Any) -> None:
            log.info("stopping worker processes", signal=signal.Signals(signum).name)
            self.stop(signum)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            for s in self.slots:
                self.spawn(s)
            while self.step():
                time.sleep(poll_s)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self.exit_code


def supervise(argv: Sequence[str], n: int, metrics_port: int | None) -> int:
    return Supervisor(child_argv(argv, n, metrics_port)).run()

