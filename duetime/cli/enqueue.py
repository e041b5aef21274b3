"""`duetime enqueue`: one run of a task, by name or through the app's code."""

from __future__ import annotations

from datetime import datetime, timedelta

import click

from duetime.cli.common import app_for as _app_or_plain
from duetime.cli.common import duration_option, fail_cleanly, instant_option, parse_payload
from duetime.client.coalesce import COALESCE
from duetime.common.time.parse import DELAY


@click.command()
@click.argument("task")
@click.option("--app", "app_ref", default=None, help="module:attribute of your App (optional: "
              "without it the task is enqueued by name, with the options its workers published).")
@click.option("--args", "args_json", default="[]", help="JSON list of positional arguments.")
@click.option("--kwargs", "kwargs_json", default="{}", help="JSON object of keyword arguments.")
@instant_option("--at", default=None, help="Due at this instant.")
@duration_option("--delay", span=DELAY, default=None, help="Due this long from now.")
@click.option("--key", default=None, help="Idempotency key: the same key gives the same run "
              "(with --debounce or --throttle: the key they coalesce by).")
@duration_option("--debounce", span=COALESCE, default=None, help="With --key: while the key's "
                 "run still waits, replace its arguments and move it to now + this.")
@duration_option("--max-wait", span=COALESCE, default=None, help="With --debounce: the run is "
                 "due no later than this after the key's first enqueue.")
@duration_option("--throttle", span=COALESCE, default=None, help="With --key: one run per "
                 "window of this length; the others land on it.")
@click.option("--queue", default=None, help="Default: the task's queue.")
@click.option("--allow-unknown", is_flag=True, help="Enqueue a task no live or recent worker "
              "has published (refused otherwise: a misspelt name), with the default options.")
@click.option("--depends-on", "depends_on", multiple=True, metavar="RUN_ID",
              help="Wait (state waiting) until this run succeeded; repeatable. A dependency that "
              "fails cancels this run, unless --allow-failed-dependencies.")
@click.option("--allow-failed-dependencies", is_flag=True,
              help="Run once every dependency finished, whatever the outcome.")
@click.pass_context
@fail_cleanly
def enqueue(ctx: click.Context, task: str, app_ref: str | None, args_json: str, kwargs_json: str,
            at: datetime | None, delay: timedelta | None, key: str | None,
            debounce: timedelta | None, max_wait: timedelta | None, throttle: timedelta | None,
            queue: str | None, allow_unknown: bool, depends_on: tuple[str, ...] = (),
            allow_failed_dependencies: bool = False) -> None:
    """Create one run of TASK and print its id (with --debounce or --throttle: the id of the
    run it landed on)."""
    args, kwargs = parse_payload(args_json, kwargs_json)
    if at and delay is not None:
        raise click.UsageError("give either --at or --delay, not both")
    app = _app_or_plain(ctx, app_ref)
    run_id = app.enqueue(task, args=args, kwargs=kwargs, at=at, delay=delay, key=key, queue=queue,
                         allow_unknown=allow_unknown, debounce=debounce, max_wait=max_wait,
                         throttle=throttle, depends_on=depends_on,
                         allow_failed_dependencies=allow_failed_dependencies)
    click.echo(run_id)
