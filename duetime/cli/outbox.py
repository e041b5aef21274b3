"""`duetime outbox`: the transactional outbox's relay and its tables (duetime/outbox.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import click

from duetime.cli.common import EXIT_FAILED, announce, app_for, fail_cleanly


@contextmanager
def _db_errors() -> Iterator[None]:
    """A database error is one `error:` line and exit 1, like a Redis one."""
    import psycopg

    try:
        yield
    except psycopg.Error as exc:
        click.echo(f"error: postgresql: {' '.join(str(exc).split())}", err=True)
        sys.exit(EXIT_FAILED)


@click.group()
def outbox() -> None:
    """The transactional outbox on PostgreSQL (docs/howto/outbox.md)."""


@outbox.command()
@click.option("--dsn", envvar="DUETIME_OUTBOX_DSN", required=True,
              help="PostgreSQL connection string (env DUETIME_OUTBOX_DSN).")
@click.option("--batch", default=100, show_default=True, type=click.IntRange(1, 10_000),
              help="Rows moved per database transaction.")
@click.option("--interval", default=0.5, show_default=True, type=click.FloatRange(0.01, 60),
              help="Seconds between looks at an empty table.")
@click.option("--once", "once_only", is_flag=True, help="Stop when the table is empty.")
@click.option("--app", "app_ref", default=None, help="module:attribute of your App (optional: "
              "without it runs are enqueued by name, with the options their workers published).")
@click.pass_context
@fail_cleanly
def relay(ctx: click.Context, dsn: str, batch: int, interval: float, once_only: bool,
          app_ref: str | None) -> None:
    """Move committed outbox rows to Redis and delete them; any number may run at once."""
    from duetime import outbox as ob

    app = app_for(ctx, app_ref)
    announce(ctx, app, "outbox-relay")  # which Redis it fills (never the DSN: it may hold a password)
    with _db_errors():
        moved = ob.relay(dsn, app, batch=batch, interval=interval, once_only=once_only)
    if once_only:
        click.echo(f"relayed {moved} rows")


@outbox.command("create-table")
@click.option("--dsn", envvar="DUETIME_OUTBOX_DSN", required=True,
              help="PostgreSQL connection string (env DUETIME_OUTBOX_DSN).")
@fail_cleanly
def create_table(dsn: str) -> None:
    """Create duetime_outbox and duetime_effects if they do not exist."""
    import psycopg

    from duetime import outbox as ob

    with _db_errors(), psycopg.connect(dsn) as conn:
        ob.create_table(conn)
    click.echo("ok")
