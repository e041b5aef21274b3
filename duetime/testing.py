"""Unit tests of your own tasks without a Redis server.

`duetime.testing.local(app)` points an App at an in-memory backend (fakeredis running
duetime's own Lua scripts, see `duetime.common.memory`) for the length of a `with` block;
`drain()` then runs what is due in-process, through the same claim, retry and completion
scripts and the same worker code a deployment uses::

    import duetime.testing
    from myproject.jobs import app, send_invoice

    def test_an_invoice_is_sent():
        with duetime.testing.local(app) as backend:
            run_id = send_invoice.enqueue(42)
            backend.drain()
            assert app.get_run(run_id).state == "succeeded"
            assert app.wait(run_id) == {"sent": 42}

    def test_a_failing_charge_ends_dead_letter():
        with duetime.testing.local(app) as backend:
            run_id = charge.enqueue(-1)
            backend.drain()  # retries run at once: their back-off is skipped
            assert app.get_run(run_id).state == "dead"

Each `local()` block gets an empty backend of its own. duetime's own test suite proves its
scripts against real Redis and Valkey servers; this backend is for your tests.
"""

from __future__ import annotations

import asyncio
import os
import time
from types import TracebackType
from typing import Any, cast

from duetime.app import App
from duetime.common import memory
from duetime.common.errors import DuetimeError

__all__ = ["LocalBackend", "local"]


class LocalBackend:
    """An App bound to an in-memory backend; see the module's docstring."""

    def __init__(self, app: App, namespace: str | None = None) -> None:
        self.app = app
        self.url = f"{memory.SCHEME}://t{os.urandom(6).hex()}"
        self.namespace = namespace
        self._saved: tuple[str, str] | None = None

    def __enter__(self) -> LocalBackend:
        self._saved = (self.app.redis_url, self.app.keys.namespace)
        self.app.configure(redis_url=self.url, namespace=self.namespace)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self._saved is not None
        url, namespace = self._saved
        self.app.configure(redis_url=url, namespace=namespace)
        memory.reset(self.url)

    def drain(self, *, retries: bool = True, delayed: bool = False, timeout: float = 30.0,
              concurrency: int = 16) -> int:
        """Run everything due now, in this process, until nothing is left to run; → attempts
        executed. `retries`: a failed attempt's back-off is skipped, so a run goes through
        all its attempts (to dead, if it keeps failing). `delayed`: runs due later run now too.
        Raises DuetimeError if work is still left after `timeout` seconds."""
        return asyncio.run(self._drain(retries, delayed, timeout, concurrency))

    async def _drain(self, retries: bool, delayed: bool, timeout: float, concurrency: int) -> int:
        from duetime.worker.runtime import Worker, WorkerConfig

        app, k = self.app, self.app.keys
        r = app.store.ready()
        queues = sorted(set(app.registry.queues())
                        | {q.decode() for q in cast(set[bytes], r.smembers(k.queues))}) or ["default"]
        cfg = WorkerConfig(queues=queues, concurrency=concurrency, claim_ahead_ms=0,
                           refresh_s=0.05, grace_s=timeout)
        worker = Worker(app.registry, self.url, k, cfg)
        running = asyncio.create_task(worker.run(handle_signals=False))
        deadline = time.monotonic() + timeout
        try:
            while True:
                await asyncio.sleep(0.01)
                if running.done():
                    running.result()  # a worker that stopped by itself: say why
                    raise DuetimeError("the in-process worker stopped before the work was done")
                if not worker.inflight and self._settled(r, queues, retries, delayed):
                    break
                if time.monotonic() > deadline:
                    raise DuetimeError(f"drain: not done after {timeout:g}s; waiting for "
                                       f"{self._pending(r, queues, worker)}")
        finally:
            worker.stop()
            await running
        return worker.processed

    def _pending(self, r: Any, queues: list[str], worker: Any) -> str:
        """The runs drain still waits for, by id, task and state (at most ten named)."""
        k = self.app.keys
        sec, usec = r.time()
        now = sec * 1000 + usec // 1000
        ids = dict.fromkeys(run_id for run_id, _ in worker.inflight)
        for p in range(k.partitions):
            ids.update(dict.fromkeys(m.decode() for m in r.zrange(k.leases(p), 0, -1)))
            for q in queues:
                for key in (k.due(p, q), k.retry(p, q)):
                    ids.update(dict.fromkeys(m.decode() for m in
                                             r.zrangebyscore(key, "-inf", now)))
        named = []
        for run_id in list(ids)[:10]:
            try:
                run = self.app.get_run(run_id)
                what = f"{run.state}, attempt {run.attempt} of {run.max_attempts}"
                named.append(f"run {run_id} ({run.task}: {what})")
            except DuetimeError as exc:
                named.append(f"run {run_id} ({exc})")
        more = f" and {len(ids) - 10} more" if len(ids) > 10 else ""
        return (", ".join(named) + more) if named else "runs the worker still holds"

    def _settled(self, r: Any, queues: list[str], retries: bool, delayed: bool) -> bool:
        """Nothing running and nothing claimable now; with `retries` (`delayed`), retries
        (later runs) are made due now first, so they run too."""
        k = self.app.keys
        sec, usec = r.time()
        now = sec * 1000 + usec // 1000
        pipe = r.pipeline(transaction=False)
        for p in range(k.partitions):
            pipe.zcard(k.leases(p))
            for q in queues:
                pipe.zrange(k.due(p, q), 0, -1, withscores=True)
                pipe.zrange(k.retry(p, q), 0, -1, withscores=True)
        res = iter(pipe.execute())
        busy, moved = False, 0
        move = r.pipeline(transaction=False)
        for p in range(k.partitions):
            leased = next(res)
            busy = busy or leased > 0
            for q in queues:
                for key, entries, early in ((k.due(p, q), next(res), delayed),
                                            (k.retry(p, q), next(res), retries)):
                    for member, score in entries:
                        if score <= now:
                            busy = True
                        elif early:
                            move.zadd(key, {member: now}, xx=True)
                            moved += 1
        if moved:
            move.execute()
            return False
        return not busy


def local(app: App, namespace: str | None = None) -> LocalBackend:
    """`with duetime.testing.local(app) as backend:` -- the app runs on an in-memory backend
    inside the block (a fresh one each time), and `backend.drain()` runs what is due."""
    return LocalBackend(app, namespace)
