"""What every adapter shares: settings from the environment and the side counter.

Environment (set by the harness for every process of a run):
  BENCH_URL        the system's own Redis (db 0 of the fresh server of this run)
  BENCH_COUNT_URL  the side counter: db 1 of a SEPARATE loopback server, so that the
                   counting never shows in the system server's INFO commandstats / cpu (W4)
  BENCH_TAG        key tag for this system and round, e.g. "rq:w1:2"
  BENCH_MODE       "default" or "aggressive" (W3 recovery settings)
  BENCH_VARIANT    an adapter's variant, e.g. rq "simple" (SimpleWorker)
  BENCH_CONCURRENCY jobs at once in an asyncio system's worker (default 100)

Every task execution calls start(i) first thing (RPUSH "<i> <time.time()>" on
bench:<tag>:starts) and done(i) at its end (HINCRBY bench:<tag>:count <i> 1). A no-op job
calls record(i), which buffers both and lets a background thread send them every 2 ms.
Counting happens in the job itself, so losses (fields missing) and duplicates (values > 1)
are visible whatever the system believes.
"""

from __future__ import annotations

import os
import threading
import time

import redis

URL = os.environ.get("BENCH_URL", "redis://127.0.0.1:6399/0")
COUNT_URL = os.environ.get("BENCH_COUNT_URL", "redis://127.0.0.1:6398/1")
TAG = os.environ.get("BENCH_TAG", "dev")
MODE = os.environ.get("BENCH_MODE", "default")
VARIANT = os.environ.get("BENCH_VARIANT", "")
LONG_SECONDS = float(os.environ.get("BENCH_LONG_SECONDS", "5"))
# how many jobs an asyncio system runs at once in its one worker process (duetime --concurrency,
# taskiq --max-async-tasks, arq max_jobs, saq concurrency): the same for each of them, 100 by
# default (taskiq's own default); `peers_run --concurrency N` sets it for a run
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "100"))

_local = threading.local()


def _client() -> redis.Redis:
    c = getattr(_local, "client", None)
    if c is None:
        c = _local.client = redis.Redis.from_url(COUNT_URL)
    return c


def starts_key(tag: str = TAG) -> str:
    return f"bench:{tag}:starts"


def count_key(tag: str = TAG) -> str:
    return f"bench:{tag}:count"


_buffer: list[tuple[int, float]] = []
_buffer_lock = threading.Lock()
_flusher: threading.Thread | None = None
# HINCRBY of each number of a batch, as one command: the flusher runs in the worker process of
# the system measured, so its cost per job is the system's too; built as one command per job
# in a pipeline it took a Python thread ~8 us per job (34,000 jobs/s: a quarter of a core),
# enough to cap the fastest systems' drain. Same counts, on the counter server as before.
_INCR_ALL = "for i = 1, #ARGV do redis.call('HINCRBY', KEYS[1], ARGV[i], 1) end return #ARGV"


def _flush_forever() -> None:
    incr_all = _client().register_script(_INCR_ALL)
    while True:
        time.sleep(0.002)
        with _buffer_lock:
            batch = _buffer[:]
            _buffer.clear()
        if batch:
            pipe = _client().pipeline(transaction=False)
            pipe.rpush(starts_key(), *(f"{i} {t:.6f}" for i, t in batch))
            incr_all(keys=[count_key()], args=[i for i, _ in batch], client=pipe)
            pipe.execute()


def record(i: int) -> None:
    """A no-op job's whole body: its start time and its count. They are buffered in memory and
    sent by a background thread every 2 ms (one pipelined round trip per batch), identically
    for every system, so the counting costs a job microseconds, not a blocking round trip. (A
    process killed mid-batch would lose its last counts: only W1/W2 use this, nothing is killed
    there; W3's long job counts synchronously with start()/done().)"""
    global _flusher
    t = time.time()
    with _buffer_lock:
        _buffer.append((int(i), t))
        if _flusher is None:
            _flusher = threading.Thread(target=_flush_forever, daemon=True)
            _flusher.start()


def record_now(i: int) -> None:
    """record(i) in one blocking round trip: for a process that exits right after the job
    (rq's default worker forks one per job), where a buffer would die unsent."""
    t = time.time()
    pipe = _client().pipeline(transaction=False)
    pipe.rpush(starts_key(), f"{int(i)} {t:.6f}")
    pipe.hincrby(count_key(), str(int(i)), 1)
    pipe.execute()


def start(i: int) -> None:
    _client().rpush(starts_key(), f"{int(i)} {time.time():.6f}")


def done(i: int) -> None:
    _client().hincrby(count_key(), str(int(i)), 1)


def long_sync(i: int, seconds: float) -> None:
    start(i)
    time.sleep(seconds)
    done(i)


async def long_async(i: int, seconds: float) -> None:
    import asyncio

    start(i)
    await asyncio.sleep(seconds)
    done(i)
