"""`current_run()`: what a running task may know about its own execution."""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from duetime.common.codec import pack_checkpoint, unpack_checkpoint
from duetime.common.errors import CheckpointRefused, InvalidInput

PROGRESS_NOTE_MAX = 200  # characters of a progress note kept (a longer one is cut)

# how a worker writes a checkpoint for an attempt: the packed state -> stored (True) or refused
# because the attempt's fence is no longer the run's (False); run on the worker's event loop
CheckpointWriter = Callable[[bytes], Awaitable[bool]]
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
    # a schedule's run: the data interval it covers, from the previous occurrence of its
    # trigger (calendar applied) to its own; a catch-up run standing for several occurrences
    # covers all of them. None for other runs.
    interval_start: datetime | None = None
    interval_end: datetime | None = None
    _lost: bool = field(default=False, repr=False)
    _lost_seen: bool = field(default=False, repr=False)
    # the state the last checkpoint of the run stored (None: none yet, a first attempt):
    # read by the worker before the body starts, updated by this attempt's own checkpoints
    checkpoint_state: Any = None
    _writer: CheckpointWriter | None = field(default=None, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    # the last progress reported, (sequence, JSON), and the sequence the heartbeat last sent
    _progress: tuple[int, str] | None = field(default=None, repr=False)
    _progress_sent: int = field(default=0, repr=False)
    # binds `_writer` and `_loop` the first time a checkpoint is written (the worker's, for a
    # first claim): most runs never checkpoint, so they are not bound up front, per run
    _bind_later: Callable[[RunContext], None] | None = field(default=None, repr=False)

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

    # -- long runs: checkpoints and progress (docs/states.md "Long runs") -------------------
    def checkpoint(self, state: Any) -> None:
        """Store `state` (msgpack, at most 64 KiB) as the run's checkpoint, for the next
        attempt or continuation to read as `checkpoint_state`. Returns once Redis stored it.
        Only the attempt holding the run's current fence may write: a stale attempt (its lease
        expired and the run was claimed again) gets CheckpointRefused, nothing is stored and
        `lease_lost` becomes True. For sync tasks (they run in the worker's threads); an async
        task awaits `acheckpoint`, since this call would block the loop it runs on."""
        data = pack_checkpoint(state)
        writer, loop = self._checkpoint_target()
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("checkpoint() would block the event loop this async task runs "
                               "on: use `await current_run().acheckpoint(state)`")
        stored = asyncio.run_coroutine_threadsafe(_write(writer, data), loop).result()
        self._checkpointed(stored, data)

    async def acheckpoint(self, state: Any) -> None:
        """`checkpoint` for async tasks (and any coroutine, on any loop)."""
        data = pack_checkpoint(state)
        writer, loop = self._checkpoint_target()
        if asyncio.get_running_loop() is loop:
            stored = await writer(data)
        else:
            stored = await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(_write(writer, data), loop))
        self._checkpointed(stored, data)

    def progress(self, done: float, total: float | None = None, note: str | None = None) -> None:
        """Report how far the run is: kept here and sent with the worker's next heartbeat (no
        round trip per call), which writes it to the run record if this attempt still holds
        the run. `done` and `total` are finite numbers >= 0; `note` is cut to 200 characters."""
        body: dict[str, Any] = {"done": _amount(done, "done")}
        if total is not None:
            body["total"] = _amount(total, "total")
        if note is not None:
            if not isinstance(note, str):
                raise InvalidInput(f"progress(note=...) must be a string, got {note!r}")
            body["note"] = note[:PROGRESS_NOTE_MAX]
        seq = self._progress[0] + 1 if self._progress else 1
        self._progress = (seq, json.dumps(body, ensure_ascii=False, separators=(",", ":")))

    def pending_progress(self) -> tuple[int, str] | None:
        """The worker: the progress not sent yet, as (sequence, JSON); None when unchanged."""
        p = self._progress
        return None if p is None or p[0] == self._progress_sent else p

    def progress_delivered(self, seq: int) -> None:
        """The worker: a heartbeat carrying progress `seq` was answered."""
        if seq > self._progress_sent:
            self._progress_sent = seq

    def bind_checkpoints(self, writer: CheckpointWriter, loop: asyncio.AbstractEventLoop,
                         state: Any) -> None:
        """The worker: where this attempt's checkpoints go, and the one it starts from."""
        self._writer, self._loop, self.checkpoint_state = writer, loop, state

    async def store_checkpoint(self, data: bytes) -> bool:
        """The worker, for a task in a child process (worker/isolation.py): write a state the
        child packed through this attempt's fenced writer, on the loop it runs on → stored
        (then `checkpoint_state`) or refused (then `lease_lost`); what the write raised is
        raised. RuntimeError when no writer is bound."""
        writer, _ = self._checkpoint_target()
        stored = await writer(data)
        if stored:
            self.checkpoint_state = unpack_checkpoint(data)
        else:
            self.mark_lost()
        return stored

    def _checkpoint_target(self) -> tuple[CheckpointWriter, asyncio.AbstractEventLoop]:
        if self._writer is None and self._bind_later is not None:
            self._bind_later(self)
        if self._writer is None or self._loop is None:
            raise RuntimeError("checkpoints are only available inside a task run by a duetime "
                               "worker")
        return self._writer, self._loop

    def _checkpointed(self, stored: bool, data: bytes) -> None:
        if not stored:
            self.mark_lost()
            raise CheckpointRefused(
                f"checkpoint of run {self.run_id} refused: attempt {self.attempt} (fence "
                f"{self.fence}) no longer holds the run (its lease expired and it was claimed "
                "again, or it ended); nothing was stored, stop this attempt")
        self.checkpoint_state = unpack_checkpoint(data)


async def _write(writer: CheckpointWriter, data: bytes) -> bool:
    return await writer(data)


def _amount(x: Any, name: str) -> int | float:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or x < 0:
        raise InvalidInput(f"progress({name}=...) must be a finite number >= 0, got {x!r}")
    return x


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
