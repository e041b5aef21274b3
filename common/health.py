"""Liveness and readiness of a long-running process, for an orchestrator's probes.

Each loop of the process reports here: `beat(name)` once per iteration (the loop is alive if it
goes round again in time), `ready(name, ok, reason)` after each call to Redis (the part can work
or not, and why). The metrics HTTP server answers `/healthz` and `/readyz` from these reports.

A Redis outage makes a process unready, never dead: restarting it would not bring Redis back,
and its loops keep retrying. Dead means a loop stopped going round (stuck in a call, a
deadlock, a dead thread): then a restart is the cure.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_WITHIN_S = 60.0


@dataclass(frozen=True)
class Verdict:
    """One probe's answer: the HTTP status and its one-line JSON body."""

    ok: bool
    checks: dict[str, dict[str, object]]
    status: str

    @property
    def http_status(self) -> int:
        return 200 if self.ok else 503

    def body(self) -> bytes:
        return json.dumps({"status": self.status, "checks": self.checks},
                          separators=(",", ":"), sort_keys=True).encode() + b"\n"


class Health:
    """What the loops of this process last said about themselves (thread-safe)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._beats: dict[str, tuple[float, float]] = {}  # name -> (last beat, allowed silence)
        self._ready: dict[str, tuple[bool, str]] = {}

    def beat(self, name: str, within_s: float = DEFAULT_WITHIN_S) -> None:
        """`name`'s loop went round; it counts as stuck if it does not again within `within_s`."""
        with self._lock:
            self._beats[name] = (self._clock(), within_s)

    def ready(self, name: str, ok: bool = True, reason: str = "") -> None:
        """Whether `name` can do its work now; `reason` says why not (one line, no secrets)."""
        if not ok:
            reason = (reason.strip().splitlines() or ["not ready"])[0][:300]
        with self._lock:
            self._ready[name] = (ok, "" if ok else reason)

    def expect(self, name: str) -> None:
        """`name` is part of this process: the process is not ready until it reported ready
        (a scheduler whose evaluator is up but whose reaper is not yet is still starting)."""
        with self._lock:
            self._ready.setdefault(name, (False, "starting"))

    def forget(self, name: str) -> None:
        with self._lock:
            self._beats.pop(name, None)
            self._ready.pop(name, None)

    def clear(self) -> None:
        with self._lock:
            self._beats.clear()
            self._ready.clear()

    def liveness(self) -> Verdict:
        """Alive unless a loop that beats has been silent longer than it allowed. A process
        whose loops have not reported yet is alive: its HTTP thread answers, nothing is stuck."""
        now = self._clock()
        with self._lock:
            beats = dict(self._beats)
        checks: dict[str, dict[str, object]] = {}
        for name, (last, within) in sorted(beats.items()):
            silent = round(now - last, 3)
            checks[name] = {"ok": silent <= within, "silent_s": silent}
        ok = all(c["ok"] for c in checks.values())
        return Verdict(ok, checks, "ok" if ok else "stuck")

    def readiness(self) -> Verdict:
        """Ready when at least one part reported, every part's last report was ok, and no loop
        is stuck: before the first report the process is still starting."""
        live = self.liveness()
        with self._lock:
            ready = dict(self._ready)
        checks: dict[str, dict[str, object]] = {}
        for name, (ok, reason) in sorted(ready.items()):
            checks[name] = {"ok": ok} if ok else {"ok": False, "reason": reason}
        for name, c in live.checks.items():
            if not c["ok"]:
                checks[name] = {"ok": False, "reason": f"loop silent for {c['silent_s']}s"}
        if not checks:
            return Verdict(False, {}, "starting")
        ok = all(c["ok"] for c in checks.values())
        return Verdict(ok, checks, "ok" if ok else "unready")
