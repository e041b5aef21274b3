"""`duetime retention set|show|clear`: how long finished runs are kept, per state."""

from __future__ import annotations

import click

from duetime.cli.common import echo_json, fail_cleanly, plain_app
from duetime.client.retention import RetentionStore
from duetime.common.errors import InvalidInput
from duetime.common.retention import STATES, parse_one
from duetime.common.time.fmt import format_duration


def _store(ctx: click.Context) -> RetentionStore:
    app = plain_app(ctx)
    return RetentionStore(app.store.ready(), app.keys, app.redis_url)


def _scope(queue: str | None, task: str | None) -> tuple[str, str | None]:
    if queue and task:
        raise click.UsageError("give --queue or --task, not both")
    return ("queue", queue) if queue else ("task", task) if task else ("namespace", None)


def _text(ms: int) -> str:
    from datetime import timedelta

    return "never deleted" if ms == 0 else format_duration(timedelta(milliseconds=ms))


@click.group()
def retention() -> None:
    """Retention of finished runs by state, per namespace, queue or task (docs/operations.md)."""


@retention.command("set")
@click.option("--queue", default=None, help="Only runs of this queue.")
@click.option("--task", default=None, help="Only runs of this task (wins over --queue).")
@click.option("--all", "every", default=None, metavar="DURATION|never",
              help="Every state at once (then the per-state options).")
@click.pass_context
@fail_cleanly
def retention_set(ctx: click.Context, queue: str | None, task: str | None, every: str | None,
                  **per_state: str | None) -> None:
    """Keep finished runs this long (a duration such as 24h, 30d, or `never`); the reapers
    apply it from their next sweep (a minute at most)."""
    scope, name = _scope(queue, task)
    by_state: dict[str, int] = {}
    try:
        if every is not None:
            by_state = dict.fromkeys(STATES, parse_one(every, "--all"))
        for s in STATES:
            v = per_state.get(s)
            if v is not None:
                by_state[s] = parse_one(v, f"--{s}")
    except InvalidInput as exc:
        raise click.BadParameter(str(exc)) from None
    if not by_state:
        raise click.UsageError("nothing to set: give --all or a state (--succeeded 24h, ...)")
    now = _store(ctx).set(scope, name, by_state)
    where = "namespace" if scope == "namespace" else f"{scope} {name}"
    click.echo(f"retention of {where}: " + ", ".join(f"{s} {_text(now[s])}" for s in STATES if s in now))


for _state in reversed(STATES):
    retention_set = click.option(f"--{_state}", _state, default=None, metavar="DURATION|never",
                                 help=f"Runs {_state}.")(retention_set)


@retention.command("clear")
@click.option("--queue", default=None, help="The overrides of this queue.")
@click.option("--task", default=None, help="The overrides of this task.")
@click.pass_context
@fail_cleanly
def retention_clear(ctx: click.Context, queue: str | None, task: str | None) -> None:
    """Remove one scope's overrides (the next scope out applies)."""
    scope, name = _scope(queue, task)
    click.echo("cleared" if _store(ctx).clear(scope, name) else "nothing was set there")


@retention.command("show")
@click.option("--json", "as_json", is_flag=True,
              help="defaults, set (per scope) and effective (what the reapers apply) as JSON.")
@click.pass_context
@fail_cleanly
def retention_show(ctx: click.Context, as_json: bool) -> None:
    """The defaults, what is set per namespace, queue and task, and what the reapers apply."""
    shown = _store(ctx).show()
    if as_json:
        echo_json(shown)
        return
    click.echo("defaults (built in; succeeded, cancelled, skipped, missed follow the reaper's "
               "--retention, 24h unless given):")
    for s in STATES:
        click.echo(f"  {s:<10} {_text(shown['defaults'][s])}")
    for scope, by_state in shown["set"].items():
        label = "namespace" if scope == "*" else scope
        click.echo(f"{label}:")
        for s in STATES:
            if s in by_state:
                click.echo(f"  {s:<10} {_text(by_state[s])}")
    tasks = {k: v for k, v in shown["effective"].items() if k.startswith("t:")}
    if tasks:
        click.echo("applied per task (set, or from @app.task(retention=...)):")
        for k, v in tasks.items():
            click.echo(f"  {k[2:]}  {_text(v)}")
