"""`duetime dev`: scheduler and workers on one machine until Ctrl-C: for your own app
(`--app`, workers restarted on code changes), or the demo app with sample schedules."""

from __future__ import annotations

import click

from duetime.cli.common import fail_cleanly


@click.command()
@click.option("--app", "app_ref", default=None, metavar="MODULE:ATTR",
              help="Your App: its workers run your tasks and restart when a .py file in the "
              "current folder changes (--no-reload: they do not). Default: the demo app, with "
              "sample schedules.")
@click.option("--reload/--no-reload", default=True, show_default=True,
              help="With --app: restart the workers on code changes (the `dev` extra).")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 64),
              help="Worker processes to start.")
@click.option("--metrics-port", default=None, type=int,
              help="Scheduler metrics here; worker i on the port + 1 + i.")
@click.pass_context
@fail_cleanly
def dev(ctx: click.Context, app_ref: str | None, reload: bool, workers: int,
        metrics_port: int | None) -> None:
    """Run a scheduler and worker processes until Ctrl-C: for your app (`--app`), or the demo
    app with sample schedules.

    Uses DUETIME_REDIS_URL when set; otherwise starts an embedded Valkey server."""
    from duetime.dev import run_dev

    if app_ref is not None:
        from duetime.cli.common import load_app

        load_app(app_ref, None, None)  # a wrong --app is one error line before anything starts
        if reload:
            try:
                import watchfiles  # noqa: F401
            except ImportError:
                raise click.ClickException("reloading needs the `dev` extra: pip install "
                                           "'duetime[dev]' (or --no-reload)") from None
    run_dev(ctx.obj["url"], ctx.obj["namespace"], workers, metrics_port, app_ref,
            reload and app_ref is not None)
