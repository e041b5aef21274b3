"""The test application: every task counts its executions in Redis, keyed by run id, so a
test sees duplicates and losses independently of duetime's own bookkeeping."""

from __future__ import annotations

import asyncio
import time

import duetime
from tests.apps import OwnClient

app = duetime.App()
r = OwnClient(app)  # the tasks' own client: r()


def count_key() -> str:
    return f"{app.keys.namespace}:test:count"


def started_key(run_id: str) -> str:
    return f"{app.keys.namespace}:test:started:{run_id}"


def record() -> duetime.RunContext:
    run = duetime.current_run()
    r().hincrby(count_key(), run.run_id, 1)
    r().set(started_key(run.run_id), run.attempt)
    return run


@app.task(name="noop")
def noop(i: int = 0) -> None:
    record()


@app.task(name="anoop")
async def anoop(i: int = 0) -> None:
    record()


@app.task(name="slow", backoff=(0.1, 0.2))
def slow(seconds: float) -> None:
    record()
    time.sleep(seconds)


@app.task(name="aslow", backoff=(0.1, 0.2))
async def aslow(seconds: float) -> None:
    record()
    await asyncio.sleep(seconds)


def stamps_key() -> str:
    return f"{app.keys.namespace}:test:stamps"


@app.task(name="stamp")
async def stamp() -> None:
    """Its first act: this machine's clock (the test servers share it) at its start, in ms."""
    t = time.time() * 1000
    r().hset(stamps_key(), duetime.current_run().run_id, repr(t))


def data_intervals_key() -> str:
    return f"{app.keys.namespace}:test:data_intervals"


@app.task(name="interval")
def interval() -> None:
    """Records the data interval its run covers, as `current_run()` gives it."""
    run = duetime.current_run()
    start, end = run.interval_start, run.interval_end
    r().hset(data_intervals_key(), run.run_id,
             f"{start.isoformat() if start else '-'} {end.isoformat() if end else '-'}")


_running = 0


@app.task(name="overlapping")
async def overlapping(seconds: float) -> None:
    """Keeps the highest number of runs executing at once in this process (one event loop)."""
    global _running
    record()
    _running += 1
    try:
        r().execute_command("EVAL", "local n = tonumber(ARGV[1]) if n > tonumber("
                            "redis.call('GET', KEYS[1]) or 0) then redis.call('SET', KEYS[1], n)"
                            " end", 1, f"{app.keys.namespace}:test:max_running", _running)
        await asyncio.sleep(seconds)
    finally:
        _running -= 1


@app.task(name="flaky", retries=2, backoff=(0.2, 0.4))
def always_fails() -> None:
    record()
    raise RuntimeError("boom")


@app.task(name="fatal", retries=5)
def fatal() -> None:
    record()
    raise duetime.Fatal("cannot ever work")


@app.task(name="retry_later", retries=3)
def retry_later(delay: float) -> None:
    run = record()
    if run.attempt == 1:
        raise duetime.Retry(delay=delay)


@app.task(name="nonidem", idempotent=False, backoff=(0.1, 0.2))
def nonidem(seconds: float) -> None:
    record()
    time.sleep(seconds)


@app.task(name="timeout", timeout=0.3, retries=0)
async def times_out() -> None:
    record()
    await asyncio.sleep(5)


@app.task(name="context")
def context() -> None:
    run = record()
    r().hset(f"{app.keys.namespace}:test:ctx:{run.run_id}", mapping={
        "attempt": run.attempt, "key": run.idempotency_key, "worker": run.worker_id,
        "scheduled": run.scheduled_at.isoformat() if run.scheduled_at else "",
        "lost": int(run.lease_lost),
    })


def intervals_key() -> str:
    return f"{app.keys.namespace}:test:intervals"


@app.task(name="sched.slow", retries=0)
async def sched_slow(seconds: float) -> None:
    run = record()
    start = time.time()
    try:
        await asyncio.sleep(seconds)
    finally:
        r().rpush(intervals_key(), f"{run.run_id}|{start}|{time.time()}")


def journal(path: str) -> list[tuple[str, int, float]]:
    """The (event, attempt, time) lines `journaled` wrote, in order."""
    try:
        with open(path) as f:
            return [(e, int(a), float(t)) for e, a, t in (ln.split() for ln in f if ln.strip())]
    except FileNotFoundError:
        return []


@app.task(name="journaled", backoff=(0.1, 0.2))
def journaled(path: str, seconds: float, fail_attempt: int = 0) -> None:
    """A sync task that notes its start and end in a file, outside Redis and outside duetime:
    how often, and whether at once, it really ran. Attempt `fail_attempt` raises at its end."""
    run = record()
    with open(path, "a") as f:
        f.write(f"start {run.attempt} {time.time()}\n")
    time.sleep(seconds)
    with open(path, "a") as f:
        f.write(f"end {run.attempt} {time.time()}\n")
    if run.attempt == fail_attempt:
        raise RuntimeError("failed at its end")


@app.task(name="retry_always", retries=1)
def retry_always() -> None:
    record()
    raise duetime.Retry(reason="not yet")


@app.task(name="leaky", retries=0)
def leaky(secret: str) -> None:
    """Fails with its argument in the exception text (as `d[key]` does)."""
    record()
    raise KeyError(secret)


@app.task(name="add")
def add(a: int, b: int) -> dict:
    return {"sum": a + b, "parts": [a, b]}


@app.task(name="aadd")
async def aadd(a: int, b: int) -> int:
    return a + b


@app.task(name="keeps_nothing", store_result=False)
def keeps_nothing() -> str:
    return "a result nobody should store"


@app.task(name="billing.flaky", retries=3, backoff=(0.1, 0.2), owner="billing")
def billing_flaky(seconds: float) -> str:
    """Fails its first two attempts after `seconds` of work, then succeeds: the cost of
    retries, per task and owner."""
    run = record()
    time.sleep(seconds)
    if run.attempt <= 2:
        raise RuntimeError(f"card network timeout (attempt {run.attempt})")
    return "charged"


def ljournal_key() -> str:
    return f"{app.keys.namespace}:test:journal"


_JOURNAL = ("local t = redis.call('TIME') redis.call('RPUSH', KEYS[1], ARGV[1] .. '|' .. "
            "ARGV[2] .. '|' .. (t[1] * 1000 + math.floor(t[2] / 1000)))")


def ljournal(kind: str) -> None:
    """'s' or 'e' with the run id and the server's time, appended atomically: the order of the
    list is the order on the server, for the limit tests' external account of what ran when."""
    r().execute_command("EVAL", _JOURNAL, 1, ljournal_key(), kind, duetime.current_run().run_id)


@app.task(name="limited", tenant="acme", backoff=(0.1, 0.2))
async def limited(seconds: float = 0.0) -> None:
    """Journals its start and end around a sleep (tenant acme by default)."""
    ljournal("s")
    try:
        await asyncio.sleep(seconds)
    finally:
        ljournal("e")


@app.task(name="slimited", backoff=(0.1, 0.2))
def slimited(seconds: float = 0.0) -> None:
    """The sync twin of `limited`, without a default tenant."""
    ljournal("s")
    try:
        time.sleep(seconds)
    finally:
        ljournal("e")


def gate_key(gate: str) -> str:
    return f"{app.keys.namespace}:test:gate:{gate}"


@app.task(name="limited_gated", tenant="acme", backoff=(0.1, 0.2))
async def limited_gated(gate: str) -> None:
    """`limited`, running until the test opens its gate (sets gate_key(gate)) instead of for
    a time: a test decides when it ends, whatever the machine's speed."""
    ljournal("s")
    try:
        while not r().exists(gate_key(gate)):
            await asyncio.sleep(0.02)
    finally:
        ljournal("e")
