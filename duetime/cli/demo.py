"""`duetime demo`: a few hundred runs drained by two worker processes."""

from __future__ import annotations

import click

from duetime.cli.common import fail_cleanly


@click.command()
@click.option("--runs", "count", default=300, show_default=True, type=click.IntRange(1, 1_000_000),
              help="Runs to enqueue.")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 64),
              help="Worker processes to start.")
@click.pass_context
@fail_cleanly
def demo(ctx: click.Context, count: int, workers: int) -> None:
    """Enqueue a few hundred runs and watch two worker processes drain them.

    Uses DUETIME_REDIS_URL when set; otherwise starts an embedded Valkey server."""
    from duetime.demo import run_demo

    run_demo(ctx.obj["url"], count, workers)
