"""The bench application: one no-op task that counts itself on a side key (HINCRBY), so
losses and duplicates are seen independently of duetime's own records."""

import time

import redis

import duetime

app = duetime.App()
_r: list[redis.Redis] = []


@app.task(name="bench.noop")
async def noop(i: int = 0) -> None:
    pass


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
