"""Runs of a task this worker does not know: given back for a worker that knows it.

In a rolling deploy that adds task `b`, the old workers still running claim runs of `b`; one
that removes a task leaves runs of it queued while the last old workers drain. Such a run goes
back to its queue unstarted, its attempt not counted (handback.lua), as long as some live
worker has said, within the grace period (`--unknown-task-grace`, 10 minutes by default), that
it has the task's code. Workers say so in `<ns>:task_seen` (task -> ms) when they start and
every SEEN_EVERY_S after. Only when nobody has known the task for the whole grace period,
counted from the later of that and the run's due time, is the run dead-lettered, with that
reason. A doubt (Redis would not answer the look-up) hands the run back: a dead letter is never
the answer to a question nobody could ask.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import redis.asyncio as aredis
from duetime.common.keys import Keyspace
from duetime.common.logs import get as get_logger
from duetime.common.loops import pause
from duetime.common.outage import bounded
from duetime.common.tasks import Registry
from duetime.common.time.fmt import format_duration
from duetime.worker.clock import ServerClock
from duetime.worker.errors import ANY_REDIS_ERROR

log = get_logger("duetime.worker")

SEEN_EVERY_S = 30.0  # much shorter than any grace period allowed (at least 1 s: see below)
CACHE_S = 1.0  # a worker meeting many runs of one unknown task looks it up once a second
HANDBACK_FIRST_MS = 250  # a run handed back waits this long, doubling per hand-back of it,
HANDBACK_LONGEST_MS = 5_000  # up to this: no worker claims it again in a hot loop


class UnknownTasks:
    def __init__(self, client: aredis.Redis, keys: Keyspace, registry: Registry,
                 clock: ServerClock, grace_ms: int, worker_id: str) -> None:
        self.client, self.keys, self.registry, self.clock = client, keys, registry, clock
        self.grace_ms, self.worker_id = grace_ms, worker_id
        self._seen: dict[str, tuple[float, int | None]] = {}  # task -> (looked up at, ms)
        self.handed_back = 0  # runs this worker gave back

    async def publish(self) -> None:
        """Say that this worker, live now, has the code of its tasks."""
        names = self.registry.names()
        if names:
            now = int(self.clock.now_ms())
            await self.client.hset(self.keys.task_seen, mapping=dict.fromkeys(names, now))

    async def run(self, closing: asyncio.Event) -> None:
        """Publish every SEEN_EVERY_S until `closing` (common/loops.py); a failure is logged
        and tried again next time."""
        while not await pause(closing, SEEN_EVERY_S):
            try:
                await self.publish()
            except ANY_REDIS_ERROR as exc:
                log.warning("could not publish this worker's tasks", error=bounded(exc),
                            worker_id=self.worker_id)

    async def last_seen(self, task: str) -> int | None:
        """When a live worker last published `task` (ms), None if never or unreadable."""
        hit = self._seen.get(task)
        if hit is not None and time.monotonic() - hit[0] < CACHE_S:
            return hit[1]
        raw = await self.client.hget(self.keys.task_seen, task)
        try:
            ms = int(raw) if raw is not None else None
        except ValueError:  # a damaged entry counts as never seen
            ms = None
        self._seen[task] = (time.monotonic(), ms)
        return ms

    async def verdict(self, task: str, due_ms: float) -> str | None:
        """None: hand the run back. Otherwise why it is to be dead-lettered."""
        try:
            seen = await self.last_seen(task)
        except ANY_REDIS_ERROR as exc:
            log.warning("could not look up who knows a task; handing the run back",
                        task=task, error=bounded(exc), worker_id=self.worker_id)
            return None
        now = self.clock.now_ms()
        if now - max(seen or 0, due_ms) < self.grace_ms:
            return None
        last = "never" if seen is None else f"{_ms(now - seen)} ago"
        known = ", ".join(self.registry.names()) or "none"
        return (f"unknown task {task!r}: no live worker has published it for the grace period "
                f"of {_ms(self.grace_ms)} (last published: {last}; registered here: {known})")


def _ms(ms: float) -> str:
    return format_duration(timedelta(milliseconds=int(ms)))
