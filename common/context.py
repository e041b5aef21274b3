"""`current_run()`: what a running task may know about its own execution."""

from __future__ import annotations

import re
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

_BATCH_ID = re.compile(r"^(b[0-9a-f]{20})\.")  # the pattern of client/workloads.py BATCH_ID


@dataclass
class RunContext:
    run_id: str
    task: str
    queue: str
    attempt: int
    fence: int
    worker_id: str
    idempotency_key: str
    scheduled_at: datetime | None
    schedule: str | None = None
    _lost: bool = field(default=False, repr=False)
    _lost_seen: bool = field(default=False, repr=False)

    @property
    def lease_lost(self) -> bool:
        """True once the run should stop: the lease was lost (another worker may own it),
        cancellation was requested, the task timed out or the worker is shutting down.
        Do no more external effects. (A plain flag: reads and writes are atomic under the GIL.)"""
        if self._lost:
            self._lost_seen = True
        return self._lost

    @property
    def lost_seen(self) -> bool:
        """The task read `lease_lost` as True: it may have stopped short of its work, so its
        return is no proof the work was done (the worker then runs the next attempt)."""
        return self._lost_seen

    @property
    def batch_id(self) -> str | None:
        """The batch this run is a member or a callback of (docs/workloads.md), else None:
        every run of a batch has an id starting with the batch's."""
        m = _BATCH_ID.match(self.run_id)
        return m.group(1) if m else None

    def mark_lost(self) -> None:
        self._lost = True


_current: ContextVar[RunContext | None] = ContextVar("duetime_run", default=None)


def current_run() -> RunContext:
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError("current_run() is only available inside a duetime task")
    return ctx


def set_current(ctx: RunContext | None) -> None:
    _current.set(ctx)


_worker_context: Any = None


def worker_context() -> Any:
    """The resources the worker's start hooks built (`@app.on_worker_start`), from a task."""
    if _worker_context is None:
        raise RuntimeError("worker_context() is only available inside a duetime worker")
    return _worker_context


def set_worker_context(ctx: Any) -> None:
    global _worker_context
    _worker_context = ctx
