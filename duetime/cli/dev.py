"""`duetime dev`: scheduler, workers and sample schedules on one machine until Ctrl-C."""

from __future__ import annotations

import click

from duetime.cli.common import fail_cleanly


@click.command()
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 64),
              help="Worker processes to start (each runs the demo app's tasks).")
@click.option("--metrics-port", default=None, type=int,
              help="Scheduler metrics here; worker i on the port + 1 + i.")
@click.pass_context
@fail_cleanly
def dev(ctx: click.Context, workers: int, metrics_port: int | None) -> None:
    """Run a scheduler, worker processes and sample schedules of the demo app until Ctrl-C.

    Uses DUETIME_REDIS_URL when set; otherwise starts an embedded Valkey server."""
    from duetime.dev import run_dev

    run_dev(ctx.obj["url"], ctx.obj["namespace"], workers, metrics_port)
