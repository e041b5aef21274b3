"""A worker's settings, checked once: a bad value must never reach the loops (a lease of 0
would make the heartbeat loop spin and every run lapse at once)."""

from __future__ import annotations

import math
import os
import re
import socket
from dataclasses import dataclass, field

from duetime.common.codec import DEFAULT_MAX_PAYLOAD
from duetime.common.errors import InvalidInput
from duetime.common.names import check_name

MIN_LEASE_MS = 100  # heartbeats go every third of the lease: shorter would be a busy loop
MAX_LEASE_MS = 24 * 3600 * 1000
MAX_CONCURRENCY = 10_000
MAX_WEIGHT = 1000
MIN_REFRESH_S = 0.01
DEFAULT_UNKNOWN_TASK_GRACE_MS = 10 * 60 * 1000
MAX_UNKNOWN_TASK_GRACE_MS = 30 * 24 * 3600 * 1000
LOG_ERROR_TEXT_ENV = "DUETIME_LOG_ERROR_TEXT"


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(2).hex()}"


def _log_error_text_default() -> bool:
    """DUETIME_LOG_ERROR_TEXT=0 keeps task exception messages (which may quote arguments) out
    of the logs: only the exception type is logged. The run record keeps the full text."""
    return os.environ.get(LOG_ERROR_TEXT_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


@dataclass
class WorkerConfig:
    queues: list[str]
    concurrency: int = 16
    lease_ms: int = 10_000
    grace_s: float = 30.0
    # safety net only: wake notices and claim replies carry due times (an idle worker's reads)
    refresh_s: float = 30.0
    # runs due this soon are claimed now and started at their due time (never before): the
    # claim's round trip no longer adds to start lateness
    claim_ahead_ms: int = 10
    worker_id: str = field(default_factory=default_worker_id)
    log_error_text: bool = field(default_factory=_log_error_text_default)
    max_result: int = DEFAULT_MAX_PAYLOAD  # a task's return value is stored up to this size
    # queue -> weight: claims shared in proportion (no starvation); None: strict priority in
    # the order of `queues` (see worker/due.py)
    queue_weights: dict[str, int] | None = None
    # a run of a task this worker does not know goes back to its queue for a worker that
    # knows it; dead-lettered once no live worker has published the task for this long
    unknown_task_grace_ms: int = DEFAULT_UNKNOWN_TASK_GRACE_MS
    # process isolation (worker/isolation.py): the App's 'module:attribute' the child
    # processes import (`--app`); SIGTERM → SIGKILL grace of a child past its timeout; the
    # resident size a child may reach (bytes; None: no cap)
    app_ref: str | None = None
    kill_grace_s: float = 5.0
    max_task_memory: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise InvalidInput naming the first bad setting."""
        if isinstance(self.queues, str) or not isinstance(self.queues, list | tuple) or not self.queues:
            raise InvalidInput(f"queues must be a non-empty list of queue names, got {self.queues!r}")
        for q in self.queues:
            check_name("queue", q)
        if len(set(self.queues)) != len(self.queues):
            raise InvalidInput(f"queues must not repeat a name, got {list(self.queues)!r}")
        _int_in("concurrency", self.concurrency, 1, MAX_CONCURRENCY)
        _int_in("lease_ms", self.lease_ms, MIN_LEASE_MS, MAX_LEASE_MS)
        _int_in("claim_ahead_ms", self.claim_ahead_ms, 0, self.lease_ms - 1,
                " (shorter than the lease)")
        _number_in("grace_s", self.grace_s, 0.0, 24 * 3600.0)
        _number_in("refresh_s", self.refresh_s, MIN_REFRESH_S, 3600.0)
        check_name("worker id", self.worker_id)
        _int_in("max_result", self.max_result, 1, 512 * 1024 * 1024)
        _int_in("unknown_task_grace_ms", self.unknown_task_grace_ms, 1, MAX_UNKNOWN_TASK_GRACE_MS)
        _number_in("kill_grace_s", self.kill_grace_s, 0.0, 3600.0)
        if self.max_task_memory is not None:
            _int_in("max_task_memory", self.max_task_memory, 16 * 1024 * 1024, 1 << 50)
        if self.app_ref is not None and (not isinstance(self.app_ref, str)
                                         or not all(self.app_ref.partition(":")[::2])):
            raise InvalidInput(f"worker app_ref must be 'module:attribute', got {self.app_ref!r}")
        if self.queue_weights is not None:
            if set(self.queue_weights) != set(self.queues):
                raise InvalidInput("queue_weights must give a weight to every queue served")
            for q, w in self.queue_weights.items():
                _int_in(f"weight of queue {q!r}", w, 1, MAX_WEIGHT)


_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def parse_queues(text: str) -> tuple[list[str], dict[str, int] | None]:
    """`--queues a,b` (strict priority, first first) or `--queues high:5,low:1` (weights: a
    queue without one weighs 1). A name may hold ':' as long as what follows is not a number."""
    names: list[str] = []
    weights: dict[str, int] = {}
    weighted = False
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        name, sep, w = item.rpartition(":")
        if sep and name and _NUMBER.fullmatch(w):  # a weight, to be checked: not part of a name
            if not w.isdigit() or not 1 <= int(w) <= MAX_WEIGHT:
                raise InvalidInput(f"queue {name!r}: weight must be an integer in "
                                   f"1..{MAX_WEIGHT}, got {w!r}")
            weighted = True
            check_name("queue", name)
            names.append(name)
            weights[name] = int(w)
        else:
            check_name("queue", item)
            names.append(item)
            weights[item] = 1
    if not names:
        raise InvalidInput(f"--queues names no queue, got {text!r}")
    return names, (weights if weighted else None)


def _int_in(name: str, value: object, lo: int, hi: int, note: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"worker {name} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise InvalidInput(f"worker {name} must be in {lo}..{hi}{note}, got {value}")


def _number_in(name: str, value: object, lo: float, hi: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"worker {name} must be a finite number, got {value!r}")
    if not lo <= value <= hi:
        raise InvalidInput(f"worker {name} must be in {lo:g}..{hi:g} seconds, got {value:g}")
