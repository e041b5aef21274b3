"""Long runs in the worker: checkpoints, progress and continuations (docs/states.md, "Long
runs").

- Before a task body starts, `prepare` binds the attempt's `current_run()` to this worker's
  event loop and Redis client, so `checkpoint(state)` (a sync task, from its thread) and
  `await acheckpoint(state)` (an async task, on the loop) reach checkpoint.lua, and gives it
  the run's checkpoint as `checkpoint_state`. A first claim (fence 1) has none, so only a
  later claim (a retry, a recovery, a continuation) reads it: one HGET, none on the hot path;
  a first claim's context is bound only when its first checkpoint is written (`later`).
- Progress is not sent by the task: the lease keeper puts what changed since its last beat on
  the next heartbeat (`progress_arg`, then `RunContext.progress_delivered`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis.asyncio as aredis
from duetime.common import transitions as tr
from duetime.common.codec import CHECKPOINT_MAX_BYTES, unpack_checkpoint
from duetime.common.context import RunContext
from duetime.common.errors import Fatal
from duetime.common.keys import Keyspace
from duetime.common.logs import get as get_logger
from duetime.common.loops import loop_timeout
from duetime.common.scripts import Scripts

if TYPE_CHECKING:
    from duetime.worker.execution import Execution

log = get_logger("duetime.worker")


class Checkpoints:
    def __init__(self, client: aredis.Redis, scripts: Scripts, keys: Keyspace, worker_id: str,
                 lease_ms: int) -> None:
        self.client, self.scripts, self.keys, self.worker_id = client, scripts, keys, worker_id
        self.timeout_s = lease_ms / 1000  # a write not answered within a lease: an error
        self.written = 0  # checkpoints stored
        self.refused = 0  # checkpoints refused: the attempt's fence was no longer the run's

    async def prepare(self, ex: Execution) -> None:
        """Bind the attempt's context; read the run's checkpoint unless this is its first claim.
        A checkpoint that cannot be read (written by hand) dead-letters the run, as an
        unreadable payload does: starting over from nothing could redo hours of work."""
        ctx = ex.ctx
        state: Any = None
        if ctx.fence > 1:
            raw = await self.client.hget(self.keys.run(ex.partition, ctx.run_id), "checkpoint")
            if raw:
                try:
                    state = unpack_checkpoint(raw if isinstance(raw, bytes) else raw.encode())
                except Exception as exc:  # noqa: BLE001 - it will never decode: no retry
                    raise Fatal(f"checkpoint unreadable: {exc}") from None
        ctx.checkpoint_state = state
        self._bind_ctx(ex.partition, asyncio.get_running_loop(), ctx)

    def later(self, partition: int) -> Callable[[RunContext], None]:
        """What a first claim (fence 1: no checkpoint yet) of `partition` needs, for
        `RunContext._bind_later`: the binding `prepare` makes, done only when the run first
        writes a checkpoint (from its thread, for a sync task: the loop is taken here, on
        it). One per claimed batch, instead of a binding per run that most runs never use.
        `prepare` binds a later claim's context the same way, at once."""
        return functools.partial(self._bind_ctx, partition, asyncio.get_running_loop())

    def _bind_ctx(self, partition: int, loop: asyncio.AbstractEventLoop, ctx: RunContext) -> None:
        """Checkpoints of `ctx` go to `write` on `loop`; it starts from its checkpoint_state."""
        ctx.bind_checkpoints(functools.partial(self.write, partition, ctx), loop,
                             ctx.checkpoint_state)

    async def write(self, partition: int, ctx: RunContext, data: bytes) -> bool:
        keys, args = tr.checkpoint(self.keys, partition, ctx.run_id, self.worker_id,
                                   ctx.fence, data, CHECKPOINT_MAX_BYTES)
        async with loop_timeout(self.timeout_s):  # a free loop's time (common/loops.py)
            reply = tr.status(await self.scripts.checkpoint(keys=keys, args=args,
                                                            client=self.client))
        if reply == b"stored":
            self.written += 1
            return True
        self.refused += 1
        log.warning("checkpoint refused: the attempt no longer holds the run", run_id=ctx.run_id,
                    task=ctx.task, attempt=ctx.attempt, fence=ctx.fence,
                    worker_id=self.worker_id, reply=reply.decode(errors="replace"))
        return False


def progress_arg(ex: Execution) -> tuple[str, int]:
    """The progress to put on this heartbeat ('' when unchanged since the last one sent), and
    its sequence number, for `progress_delivered` once the beat was answered."""
    p = ex.ctx.pending_progress()
    return ("", 0) if p is None else (p[1], p[0])
