"""`duetime schedule ...`: register and manage schedules."""

from __future__ import annotations

from datetime import datetime, timedelta

import click

from duetime.app import App
from duetime.cli_common import (
    echo_json,
    fail_cleanly,
    interrupted,
    load_app,
    parse_instant,
    parse_payload,
    plain_app,
    progress,
    short_time,
    table,
)
from duetime.common.connection import server_time_ms, translated
from duetime.common.schedules import CATCHUP, OVERLAP, at_ms
from duetime.common.timespec import At, Cron, Every, InvalidSchedule, Trigger, parse_duration
from duetime.render import next_fires, schedule_to_dict, schedule_to_text


def _duration(text: str | None, option: str) -> timedelta | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except InvalidSchedule as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


def _trigger(cron: str | None, tz: str, every: str | None, at: str | None, dst_gap: str,
             dst_fold: str) -> Trigger:
    given = [o for o, v in (("--cron", cron), ("--every", every), ("--at", at)) if v is not None]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --cron, --every or --at")
    try:
        if cron is not None:
            return Cron(cron, tz=tz, dst_gap=dst_gap, dst_fold=dst_fold)
        if every is not None:
            interval = _duration(every, "--every")
            assert interval is not None
            return Every(interval)
    except InvalidSchedule as exc:
        hint = "--tz" if "time zone" in str(exc) else given[0]
        raise click.BadParameter(str(exc), param_hint=hint) from None
    assert at is not None
    return At(parse_instant(at, "--at"))


def _now(app: App) -> datetime:
    """Fire times are listed from the server's clock, the one that decides them."""
    with translated(app.redis_url):
        return at_ms(server_time_ms(app.store.client))


@click.group()
def schedule() -> None:
    """Register and manage schedules (cron in a zone, fixed intervals, one-time instants)."""


@schedule.command("add")
@click.argument("name")
@click.option("--cron", default=None, help="5-field cron expression, e.g. '30 2 * * *'.")
@click.option("--tz", default="UTC", show_default=True, help="IANA zone of --cron.")
@click.option("--every", default=None, help="Fixed interval, e.g. 15m, 1h30m.")
@click.option("--at", default=None, help="One run at this ISO-8601 instant (with offset).")
@click.option("--task", required=True, help="Registered task name.")
@click.option("--app", "app_ref", required=True, help="module:attribute of your App.")
@click.option("--args", "args_json", default="[]", help="JSON list of positional arguments.")
@click.option("--kwargs", "kwargs_json", default="{}", help="JSON object of keyword arguments.")
@click.option("--queue", default=None, help="Default: the task's queue.")
@click.option("--catchup", type=click.Choice(CATCHUP), default="latest", show_default=True)
@click.option("--max-catchup", default=100, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--lateness", default=None, help="Starting deadline, e.g. 5m (later: missed).")
@click.option("--overlap", type=click.Choice(OVERLAP), default="allow", show_default=True)
@click.option("--jitter", default=None, help="Random delay up to this, e.g. 30s.")
@click.option("--owner", default=None, help="Team told about its dead letters.")
@click.option("--dst-gap", type=click.Choice(("shift", "skip")), default="shift", show_default=True)
@click.option("--dst-fold", type=click.Choice(("auto", "first", "both")), default="auto",
              show_default=True)
@click.option("--paused", is_flag=True, help="Create it paused.")
@click.pass_context
@fail_cleanly
def schedule_add(ctx: click.Context, name: str, cron: str | None, tz: str, every: str | None,
                 at: str | None, task: str, app_ref: str, args_json: str, kwargs_json: str,
                 queue: str | None, catchup: str, max_catchup: int, lateness: str | None,
                 overlap: str, jitter: str | None, owner: str | None, dst_gap: str, dst_fold: str,
                 paused: bool) -> None:
    """Create or update schedule NAME (the same definition again changes nothing)."""
    trigger = _trigger(cron, tz, every, at, dst_gap, dst_fold)
    args, kwargs = parse_payload(args_json, kwargs_json)
    late, jit = _duration(lateness, "--lateness"), _duration(jitter, "--jitter")
    app = load_app(app_ref, ctx.obj["url"], ctx.obj["namespace"])
    status = app.schedule(name, trigger, task, args=args, kwargs=kwargs, queue=queue,
                          catchup=catchup, max_catchup=max_catchup, lateness=late, overlap=overlap,
                          jitter=jit, owner=owner, paused=paused)
    info = app.get_schedule(name)
    nxt = f"next fire {info.next_fire.isoformat()}" if info.next_fire else "no further fire time"
    click.echo(f"{status} {name}: {info.trigger.describe()}; {nxt}")


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@fail_cleanly
def schedule_list(ctx: click.Context, as_json: bool) -> None:
    """Every schedule of the namespace."""
    infos = plain_app(ctx).list_schedules()
    if as_json:
        echo_json([schedule_to_dict(i) for i in infos])
        return
    rows = [(i.name, i.trigger.describe(), i.task, i.queue, "paused" if i.paused else "active",
             short_time(i.next_fire), short_time(i.last_occurrence), i.materialized_count)
            for i in infos]
    click.echo(table(("NAME", "TRIGGER", "TASK", "QUEUE", "STATUS", "NEXT", "LAST", "RUNS"), rows))


@schedule.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@fail_cleanly
def schedule_show(ctx: click.Context, name: str, as_json: bool) -> None:
    """A schedule's definition, state and next 5 fire times (its zone and UTC)."""
    app = plain_app(ctx)
    info = app.get_schedule(name)
    fires = next_fires(info, _now(app))
    if as_json:
        echo_json({**schedule_to_dict(info), "next_fires": fires})
    else:
        click.echo(schedule_to_text(info, fires))


@schedule.command("pause")
@click.argument("name")
@click.option("--note", default="", help="Why (shown by `schedule show`).")
@click.pass_context
@fail_cleanly
def schedule_pause(ctx: click.Context, name: str, note: str) -> None:
    """Stop creating runs; on resume, missed occurrences follow the catch-up policy."""
    plain_app(ctx).pause(name, note)
    click.echo(f"paused {name}")


@schedule.command("resume")
@click.argument("name")
@click.pass_context
@fail_cleanly
def schedule_resume(ctx: click.Context, name: str) -> None:
    plain_app(ctx).resume(name)
    click.echo(f"resumed {name}")


@schedule.command("trigger")
@click.argument("name")
@click.pass_context
@fail_cleanly
def schedule_trigger(ctx: click.Context, name: str) -> None:
    """Run the schedule now, outside its trigger; prints the run id."""
    click.echo(plain_app(ctx).trigger(name))


@schedule.command("backfill")
@click.argument("name")
@click.option("--from", "start", required=True, help="ISO-8601 instant (with offset).")
@click.option("--to", "end", required=True, help="ISO-8601 instant (with offset), inclusive.")
@click.pass_context
@fail_cleanly
def schedule_backfill(ctx: click.Context, name: str, start: str, end: str) -> None:
    """One run per occurrence in [--from, --to]; occurrences that have a run are left alone,
    so an interrupted backfill can simply be run again."""
    t0, t1 = parse_instant(start, "--from"), parse_instant(end, "--to")
    if t1 < t0:
        raise click.BadParameter("is before --from", param_hint="--to")
    app = plain_app(ctx)
    trigger = app.get_schedule(name).trigger
    total = sum(1 for _ in trigger.occurrences(t0 - timedelta(milliseconds=1), t1))
    done = 0

    def step(n: int) -> None:
        nonlocal done
        done += n
        advance(n)

    try:
        with progress(total, "backfilling") as advance:
            occurrences, created = app.schedules.backfill(name, t0, t1, progress=step)
    except KeyboardInterrupt:
        interrupted(done, total, "occurrences", f"duetime schedule backfill {name} ...")
    click.echo(f"{occurrences} occurrence(s), {created} run(s) created "
               f"({occurrences - created} existed already)")


@schedule.command("delete")
@click.argument("name")
@click.pass_context
@fail_cleanly
def schedule_delete(ctx: click.Context, name: str) -> None:
    """Remove the definition; its runs stay (history), runs not yet started still run."""
    plain_app(ctx).delete_schedule(name)
    click.echo(f"deleted {name}")
