"""Tasks for the dependency and batch tests: each records its run in Redis, so a test counts
executions (callbacks exactly once) independently of duetime's own bookkeeping."""

from __future__ import annotations

import duetime
from tests.apps import OwnClient

app = duetime.App()
r = OwnClient(app)  # the tasks' own client: r()


def ran_key() -> str:
    return f"{app.keys.namespace}:test:ran"


def seen_batch_key() -> str:
    return f"{app.keys.namespace}:test:batch_seen"


@app.task(name="w.step", retries=0)
def step(i: int, die: bool = False) -> int:
    """A link of a chain: returns i * 10, or dies for good."""
    r().hincrby(ran_key(), duetime.current_run().run_id, 1)
    if die:
        raise duetime.Fatal(f"step {i} dies")
    return i * 10


@app.task(name="w.plus_dep", retries=0)
def plus_dep(dep_id: str) -> int:
    """Reads its dependency's result through get_run."""
    return int(app.get_run(dep_id).result) + 1


# retries: a member meant to fail raises Fatal (dead at once, retries or not); anything else
# that breaks its body -- its own HINCRBY timing out on a machine at load 20 -- is retried, as
# a real task's would be, instead of counting as the member's failure (a CI run under load saw
# 5 of 2,000 such members end dead with retries=0)
@app.task(name="w.member", retries=2, backoff=(0, 0))  # a retry is due at once: a burst runs it
def member(i: int, fail: bool = False) -> int:
    r().hincrby(ran_key(), duetime.current_run().run_id, 1)
    if fail:
        raise duetime.Fatal(f"member {i} fails")
    return i


@app.task(name="w.spawner", retries=0)
def spawner(n: int) -> None:
    """A member that adds n more members to its own batch."""
    bid = duetime.current_run().batch_id
    assert bid is not None
    app.batch_add(bid, [(member, [1000 + i]) for i in range(n)])


# retried like any run: a SIGKILL may land while a callback runs (its lease then expires and
# the reaper retries it); the callback is still created and released once
@app.task(name="w.callback", retries=5, backoff=(0.05, 0.1))
def callback(role: str) -> None:
    run = duetime.current_run()
    r().hincrby(ran_key(), run.run_id, 1)
    r().rpush(seen_batch_key(), f"{role}|{run.batch_id}")


@app.task(name="w.busy", retries=5, backoff=(0.05, 0.1))
def busy(i: int, fail: bool = False) -> int:
    """A member that takes a little while (so a SIGKILL lands mid-run) and may fail for good."""
    import time

    time.sleep(0.02)
    r().hincrby(ran_key(), duetime.current_run().run_id, 1)
    if fail:
        raise duetime.Fatal(f"member {i} fails")
    return i


@app.task(name="w.busy_spawner", retries=5, backoff=(0.05, 0.1))
def busy_spawner(i: int, children: list[bool]) -> int:
    """A member that adds one busy member per entry of `children` (True: it fails for good) to
    its own batch, with ids fixed by keys: an attempt killed after its batch_add and run again
    adds the same runs, which exist already (create-once), so the batch's size is known."""
    import time

    run = duetime.current_run()
    bid = run.batch_id
    assert bid is not None
    app.batch_add(bid, [{"task": busy, "args": [100_000 * (i + 1) + j, fail],
                         "key": f"{run.run_id}.{j}"} for j, fail in enumerate(children)])
    time.sleep(0.02)
    r().hincrby(ran_key(), run.run_id, 1)
    return i
