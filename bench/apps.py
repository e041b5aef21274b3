"""The bench application: one no-op task that counts itself on a side key (HINCRBY), so
losses and duplicates are seen independently of duetime's own records."""

import asyncio
import os
import threading
import time

import redis

import duetime

app = duetime.App()


class NoOp:
    """Middleware whose every hook does nothing: the cost of the hooks' machinery alone
    (`bench.throughput --middleware N` registers N of them, in the producer and the worker)."""

    def on_enqueue(self, request: object) -> None: ...
    def after_enqueue(self, request: object, error: object) -> None: ...
    def before_attempt(self, run: object) -> None: ...
    def after_attempt(self, run: object, outcome: object, error: object) -> None: ...
    def on_dead(self, run: object) -> None: ...
    def on_uncertain(self, run: object) -> None: ...


def add_middleware(n: int) -> None:
    for _ in range(n):
        app.middleware(NoOp())


add_middleware(int(os.environ.get("DUETIME_BENCH_MIDDLEWARE", "0") or 0))
_r: list[redis.Redis] = []


@app.task(name="bench.noop")
async def noop(i: int = 0) -> None:
    pass


@app.task(name="bench.sleepy")
async def sleepy(i: int = 0) -> None:
    """Waits 5 ms: runs that end one by one, not a claimed batch at once (how many outcomes
    a report flush finds waiting, `bench.throughput --task sleepy`)."""
    await asyncio.sleep(0.005)


@app.task(name="bench.counted")
async def counted(i: int = 0) -> None:
    if not _r:
        _r.append(redis.Redis.from_url(app.redis_url, db=1))
    _r[0].hincrby(f"{app.keys.namespace}:count", duetime.current_run().run_id, 1)


@app.task(name="bench.stamp")
async def stamp(i: int = 0) -> None:
    """Its first act: this machine's clock in ms (the bench's embedded server shares it)."""
    t = time.time() * 1000
    if not _r:
        _r.append(redis.Redis.from_url(app.redis_url, db=1))
    _r[0].hset(f"{app.keys.namespace}:stamps", duetime.current_run().run_id, repr(t))


_marks: list[tuple[str, float]] = []
_marks_lock = threading.Lock()
_marker: list[threading.Thread] = []


def _flush_marks() -> None:
    """Write the kept instants once they stop coming (none new for 10 ms): never in the
    middle of a herd, where encoding thousands of them would take the GIL from the very
    worker being measured (its bodies would start late because of the instrument). Marks
    that never pause (a herd spread by jitter) are written at least once a second."""
    seen, since = 0, time.monotonic()
    while True:
        time.sleep(0.01)
        if len(_marks) != seen and time.monotonic() - since < 1.0:  # still coming
            seen = len(_marks)
            continue
        since = time.monotonic()
        with _marks_lock:
            batch = _marks[:]
            _marks.clear()
        seen = 0
        if batch:
            _r[0].hset(f"{app.keys.namespace}:stamps", mapping=dict(batch))


@app.task(name="bench.mark")
async def mark(i: int = 0) -> None:
    """Like `stamp`, but buffered: the instant is kept in memory and a background thread
    writes them once they stop coming, so a herd of thousands is not timed by its own round
    trips nor by the encoding of its stamps."""
    t = time.time() * 1000
    with _marks_lock:
        _marks.append((duetime.current_run().run_id, t))
        if not _marker:
            if not _r:
                _r.append(redis.Redis.from_url(app.redis_url, db=1))
            _marker.append(threading.Thread(target=_flush_marks, daemon=True))
            _marker[0].start()
