"""A transactional outbox on PostgreSQL: runs that exist only if the caller's transaction
commits, and database effects a retried attempt does not repeat (docs/howto/outbox.md).

`enqueue(conn, task, args, ...)` writes a row of `duetime_outbox` in the caller's open
transaction; `relay_once` / `relay` (the `duetime outbox relay` command) move committed rows to
Redis, the row's id as the run's idempotency key, and delete them in the same database
transaction after the enqueue succeeded. A rolled-back transaction leaves no row, so no run; a
relay killed between the enqueue and its commit leaves the rows locked-then-released, and the
next relay enqueues the same keys again: the same runs, never two.

`once(conn, effect_key)` records a task's own database effect in the task's transaction
(`duetime_effects`, a unique key): False if an earlier attempt's transaction already committed
it, so a retry skips what was done.

`conn` is a psycopg 3 connection, a SQLAlchemy `Connection` or `Session`, or anything with a
DB-API `cursor()` taking `%(name)s` parameters (Django's `django.db.connection`). Nothing here
commits the caller's transaction. Needs the `outbox` extra (psycopg 3, SQLAlchemy 2) only for
what it uses: SQLAlchemy objects are recognised without importing SQLAlchemy otherwise.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from duetime.common.errors import InvalidInput
from duetime.common.names import check_name
from duetime.common.time.parse import parse_duration, parse_instant

if TYPE_CHECKING:
    from duetime.app import App
    from duetime.client.runs import EnqueueRequest

TABLE = "duetime_outbox"
EFFECTS = "duetime_effects"

#: The tables, for a migration tool of your own (`create_table` runs exactly this).
DDL = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    id uuid PRIMARY KEY,
    task text NOT NULL,
    payload jsonb NOT NULL,
    options jsonb NOT NULL DEFAULT '{{}}',
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS {TABLE}_created_at ON {TABLE} (created_at);
CREATE TABLE IF NOT EXISTS {EFFECTS} (
    key text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

_NAMED = re.compile(r"(?<!:):([a-z_]+)")


def _is_sqlalchemy(conn: Any) -> bool:
    return type(conn).__module__.startswith("sqlalchemy")


def _execute(conn: Any, sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    """Run one statement on the caller's connection, in its current transaction; the rows
    it returns (none for a statement without RETURNING)."""
    params = params or {}
    if _is_sqlalchemy(conn):
        from sqlalchemy import text

        result = conn.execute(text(sql), params)
        return [tuple(row) for row in result] if result.returns_rows else []
    with conn.cursor() as cur:
        cur.execute(_NAMED.sub(r"%(\1)s", sql), params)
        return [tuple(row) for row in cur.fetchall()] if cur.description else []


def create_table(conn: Any) -> None:
    """Create `duetime_outbox` and `duetime_effects` if they do not exist (in the caller's
    transaction: commit it). The statements are `DDL`."""
    for statement in DDL.split(";"):
        if statement.strip():
            _execute(conn, statement)


def enqueue(conn: Any, task: Any, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
            *, queue: str | None = None, at: datetime | str | None = None,
            delay: timedelta | float | str | None = None, key: str | None = None,
            tenant: str | None = None, priority: int = 0) -> str:
    """Write a run request into the outbox, in `conn`'s open transaction; returns the row's
    id (a UUID), which becomes the run's idempotency key (`outbox:<id>`) unless `key` is given.

    `task` is a `duetime.Task` or a task name. The arguments must be JSON values (the payload
    is `{"args": [...], "kwargs": {...}}` in a jsonb column, readable with psql); a Task's
    arguments are checked against its function here, before anything is written. `delay`
    counts from the row's `created_at` (the database's clock), `at` is an aware instant."""
    name = task if isinstance(task, str) else getattr(getattr(task, "spec", None), "name", None)
    check_name("task", name)
    assert isinstance(name, str)
    kwargs = dict(kwargs or {})
    fn = getattr(task, "fn", None)
    if fn is not None:
        import inspect

        try:
            inspect.signature(fn).bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidInput(f"arguments for {name!r} do not match its signature: {exc}") from None
    try:
        payload = json.dumps({"args": list(args), "kwargs": kwargs}, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"outbox arguments must be JSON values: {exc}") from None
    options: dict[str, Any] = {}
    if queue is not None:
        options["queue"] = check_name("queue", queue)
    if tenant is not None:
        options["tenant"] = check_name("tenant", tenant)
    if key is not None:
        options["key"] = check_name("key", key)
    if at is not None and delay is not None:
        raise InvalidInput("give at= or delay=, not both")
    if at is not None:
        options["at"] = parse_instant(at, what="at").isoformat()
    if delay is not None:
        options["delay"] = parse_duration(delay, what="delay").total_seconds()
    if priority:
        if not isinstance(priority, int) or not 1 <= priority <= 100:
            raise InvalidInput(f"priority must be 1..100, got {priority!r}")
        options["priority"] = priority
    row_id = str(uuid.uuid4())
    _execute(conn, f"INSERT INTO {TABLE} (id, task, payload, options) "
                   "VALUES (:id, :task, CAST(:payload AS jsonb), CAST(:options AS jsonb))",
             {"id": row_id, "task": name, "payload": payload, "options": json.dumps(options)})
    return row_id


def once(conn: Any, effect_key: str) -> bool:
    """Record the effect `effect_key` in `conn`'s open transaction: True the first time
    (do the effect, in this same transaction), False if a committed transaction already
    recorded it (skip it). A concurrent transaction holding the same key makes this wait for
    its end, then answers by its outcome."""
    if not isinstance(effect_key, str) or not effect_key:
        raise InvalidInput(f"effect_key must be a non-empty string, got {effect_key!r}")
    rows = _execute(conn, f"INSERT INTO {EFFECTS} (key) VALUES (:key) "
                          "ON CONFLICT (key) DO NOTHING RETURNING key", {"key": effect_key})
    return bool(rows)


def run_key(row_id: str) -> str:
    """The idempotency key of an outbox row's run (when the row names none of its own)."""
    return f"outbox:{row_id}"


def _request(app: App, row: tuple[Any, ...]) -> EnqueueRequest:
    """A row as the request `enqueue` would make. A task this process has no code for takes
    the options its workers published; one nobody published is enqueued with the defaults
    (never refused: a row that can never be relayed would hold back none, but sit for ever):
    its run is dead-lettered by a worker if no code for it exists, where an operator sees it."""
    from duetime.client.runs import EnqueueRequest

    row_id, task, payload, options, created_at = row
    payload = payload if isinstance(payload, dict) else json.loads(payload)
    options = options if isinstance(options, dict) else json.loads(options)
    at: datetime | str | None = options.get("at")
    if options.get("delay") is not None:
        at = created_at.astimezone(UTC) + timedelta(seconds=options["delay"])
    return EnqueueRequest(app._resolve(task, allow_unknown=True), payload.get("args", []),
                          payload.get("kwargs", {}), at=at,
                          key=options.get("key") or run_key(str(row_id)),
                          queue=options.get("queue"), tenant=options.get("tenant"),
                          priority=int(options.get("priority", 0)))


def relay_once(conn: Any, app: App, batch: int = 100,
               after_enqueue: Callable[[list[str]], None] | None = None) -> int:
    """Move up to `batch` committed rows to Redis in one transaction of `conn` (a psycopg 3
    connection not in autocommit): lock them (`FOR UPDATE SKIP LOCKED`, so relays running
    beside each other take different rows), enqueue them, delete them, commit. Returns how
    many rows were relayed. If the enqueue fails, the transaction rolls back and the rows stay
    for the next try. `after_enqueue` (tests) is called with the run ids before the commit."""
    with conn.transaction():
        rows = _execute(conn, f"SELECT id, task, payload, options, created_at FROM {TABLE} "
                              "ORDER BY created_at LIMIT :n FOR UPDATE SKIP LOCKED", {"n": batch})
        if not rows:
            return 0
        reqs = [_request(app, row) for row in rows]
        run_ids = app.store.enqueue_many(reqs)
        app._remember_queues({r.spec.queue if r.queue is None else r.queue for r in reqs})
        if after_enqueue is not None:
            after_enqueue(run_ids)
        _execute(conn, f"DELETE FROM {TABLE} WHERE id = ANY(:ids)", {"ids": [row[0] for row in rows]})
    return len(rows)


def relay(dsn: str, app: App, batch: int = 100, interval: float = 0.5, once_only: bool = False,
          stop: Callable[[], bool] = lambda: False) -> int:
    """The relay loop of `duetime outbox relay`: batches while rows are waiting, else a pause
    of `interval` seconds; `once_only` stops when the table is empty (and raises what failed).
    A failed batch (Redis or the database unreachable) rolls back, is logged, and is tried
    again after `interval`, on a new database connection if the old one broke. Returns the
    rows moved."""
    import psycopg
    import structlog

    log = structlog.get_logger("duetime.outbox")
    total = 0
    conn: psycopg.Connection[Any] | None = None
    try:
        while not stop():
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(dsn)
                n = relay_once(conn, app, batch)
            except Exception as exc:  # the rows stay where they are: try again later
                log.error("outbox_relay_failed", error=str(exc).splitlines()[0] if str(exc) else "",
                          error_type=type(exc).__name__)
                if once_only:
                    raise
                if isinstance(exc, psycopg.OperationalError) and conn is not None:
                    conn.close()
                time.sleep(interval)
                continue
            total += n
            if n:
                log.info("outbox_relayed", rows=n, total=total)
            elif once_only:
                break
            else:
                time.sleep(interval)
    finally:
        if conn is not None:
            conn.close()
    return total


__all__ = ["DDL", "EFFECTS", "TABLE", "create_table", "enqueue", "once", "relay", "relay_once",
           "run_key"]
