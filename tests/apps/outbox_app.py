"""The outbox tests' application: a task whose database effect goes through `outbox.once`
on the private PostgreSQL (DSN from DUETIME_TEST_PG_DSN), and a plain counting task."""

from __future__ import annotations

import os
import time

import psycopg

import duetime
from duetime import outbox
from tests.apps.basic import r

app = duetime.App()


def key(what: str) -> str:
    return f"{app.keys.namespace}:test:{what}"


@app.task(name="outbox.count")
def count(i: int, note: str = "") -> None:
    run = duetime.current_run()
    r().hincrby(key("count"), run.run_id, 1)


@app.task(name="outbox.credit", backoff=(0.1, 0.2))
def credit(account: int, cents: int) -> None:
    """Credits an account once per run, however many attempts run: the effect and its record
    commit together. The first attempt then hangs (after its commit) for the test to SIGKILL
    its worker."""
    run = duetime.current_run()
    with psycopg.connect(os.environ["DUETIME_TEST_PG_DSN"]) as conn, conn.transaction():
        done = not outbox.once(conn, f"credit:{run.run_id}")
        if not done:
            conn.execute("UPDATE accounts SET cents = cents + %s WHERE id = %s", (cents, account))
    r().rpush(key("attempts"), f"{run.attempt}:{'skipped' if done else 'applied'}")
    if run.attempt == 1:
        time.sleep(3600)  # committed; the test kills this worker now
