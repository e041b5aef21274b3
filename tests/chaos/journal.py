"""The execution journal: every execution of a chaos task appends a line when it starts and
one when its body ends, to a file of its own process, outside Redis.

It is what the invariant checker trusts when it compares Redis's story (states, fences,
attempt histories) with what really ran. Appends are plain writes flushed to the kernel (no
fsync): a SIGKILLed process loses nothing it wrote, and the server's restarts do not touch
it. A start without an end is an execution its process did not live (or was not let) to
finish.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

ENV = "DUETIME_CHAOS_JOURNAL"

_lock = threading.Lock()
_file: dict[int, IO[str]] = {}  # pid -> its file (a forked child opens its own)


def _out() -> IO[str]:
    pid = os.getpid()
    f = _file.get(pid)
    if f is None:
        where = Path(os.environ[ENV])
        where.mkdir(parents=True, exist_ok=True)
        f = _file[pid] = open(where / f"{pid}.jsonl", "a", buffering=1)  # noqa: SIM115
    return f


def append(entry: dict[str, Any]) -> None:
    line = json.dumps(entry, separators=(",", ":")) + "\n"
    with _lock:
        f = _out()
        f.write(line)
        f.flush()


@dataclass
class Execution:
    """One execution of a run's body: (run, attempt, fence, pid, start, end)."""

    run: str
    task: str
    attempt: int
    fence: int
    pid: int
    worker: str
    start: float  # epoch seconds, this machine's clock (the test servers share it)
    end: float | None = None  # None: the body never ended (its process was killed)
    outcome: str = ""  # 'ok' | 'raised' | 'cancelled' (async task cancelled)
    lost: bool = False  # current_run().lease_lost when the body ended
    lost_at: float | None = None  # when a task watching lease_lost saw it turn true

    @property
    def key(self) -> tuple[str, int]:
        return (self.run, self.fence)


def now() -> float:
    return time.time()


def read(directory: Path) -> list[Execution]:
    """Every execution in the journal, in start order. A start and its end are matched by
    (pid, run, fence): a process runs one attempt of a run at a time under one fence."""
    started: dict[tuple[int, str, int], Execution] = {}
    out: list[Execution] = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in _lines(path.read_text().splitlines()):
            e = json.loads(line)
            k = (e["pid"], e["run"], e["fence"])
            if e["e"] == "start":
                x = Execution(e["run"], e["task"], e["attempt"], e["fence"], e["pid"],
                              e["worker"], e["t"])
                started[k] = x
                out.append(x)
            elif e["e"] == "lost" and k in started:
                started[k].lost_at = e["t"]
            elif k in started:
                x = started.pop(k)
                x.end, x.outcome, x.lost = e["t"], e["outcome"], e.get("lost", False)
    out.sort(key=lambda x: x.start)
    return out


def _lines(lines: Iterable[str]) -> Iterable[str]:
    for line in lines:
        if line.endswith("}"):  # a line cut short by a SIGKILL mid-write is dropped
            yield line
