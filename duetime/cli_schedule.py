"""`duetime schedule ...`: register and manage schedules."""

from __future__ import annotations

from datetime import datetime, timedelta

import click

from duetime.cli_common import (
    duration_option,
    echo_json,
    fail_cleanly,
    instant_option,
    interrupted,
    load_app,
    parse_payload,
    plain_app,
    progress,
    server_now,
    table,
    when,
)
from duetime.common.errors import InvalidSchedule
from duetime.common.schedules import (
    CATCHUP,
    EVERY,
    JITTER,
    LATENESS,
    MISS_TOLERANCE,
    MISS_TOLERANCE_MS,
    OVERLAP,
)
from duetime.common.timefmt import format_duration
from duetime.common.timespec import At, Cron, Every, Trigger
from duetime.render import next_fires, schedule_to_dict, schedule_to_text

CRON_HELP = ("Cron expression: 5 fields (minute hour day-of-month month day-of-week) or 6 with "
             "seconds last; L, nW, d#n, Ld and H as in croniter; e.g. '30 2 * * *'.")


def _trigger(cron: str | None, tz: str, every: timedelta | None, at: datetime | None,
             dst_gap: str, dst_fold: str) -> Trigger:
    given = [o for o, v in (("--cron", cron), ("--every", every), ("--at", at)) if v is not None]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --cron, --every or --at")
    if every is not None:
        return Every(every)
    if at is not None:
        return At(at)
    try:
        return Cron(cron or "", tz=tz, dst_gap=dst_gap, dst_fold=dst_fold)
    except InvalidSchedule as exc:
        hint = "--tz" if "time zone" in str(exc) else "--cron"
        raise click.BadParameter(str(exc), param_hint=hint) from None


@click.group()
def schedule() -> None:
    """Register and manage schedules (cron in a zone, fixed intervals, one-time instants)."""


@schedule.command("add")
@click.argument("name")
@click.option("--cron", default=None, help=CRON_HELP)
@click.option("--tz", default="UTC", show_default=True, help="IANA zone of --cron.")
@duration_option("--every", span=EVERY, default=None, help="Fixed interval (zone-free).")
@instant_option("--at", default=None, help="One run at this instant.")
@click.option("--task", required=True, help="Registered task name.")
@click.option("--app", "app_ref", required=True, help="module:attribute of your App.")
@click.option("--args", "args_json", default="[]", help="JSON list of positional arguments.")
@click.option("--kwargs", "kwargs_json", default="{}", help="JSON object of keyword arguments.")
@click.option("--queue", default=None, help="Default: the task's queue.")
@click.option("--catchup", type=click.Choice(CATCHUP), default="latest", show_default=True,
              help="Missed occurrences: all (up to --max-catchup), latest (one run for all), "
              "skip (none).")
@click.option("--max-catchup", default=100, show_default=True, type=click.IntRange(1, 100_000),
              help="With --catchup all: at most this many missed occurrences run.")
@duration_option("--miss-tolerance", span=MISS_TOLERANCE, default=None,
                 help="An occurrence evaluated later than this after its instant is missed "
                 "(one whose successor is already due is missed anyway). Default "
                 f"{format_duration(timedelta(milliseconds=MISS_TOLERANCE_MS))}.")
@duration_option("--lateness", span=LATENESS, default=None,
                 help="Starting deadline: a run not started this long after its due time is "
                 "recorded as missed.")
@click.option("--overlap", type=click.Choice(OVERLAP), default="allow", show_default=True,
              help="When the previous run is still going: allow, skip, buffer_one, "
              "cancel_other.")
@duration_option("--jitter", span=JITTER, default=None,
                 help="Stable per-occurrence delay up to this, to spread a herd.")
@click.option("--owner", default=None, help="Team told about its dead letters.")
@click.option("--dst-gap", type=click.Choice(("shift", "skip")), default="shift", show_default=True,
              help="A local time that does not exist (spring forward): shift it by the gap "
              "(02:30 becomes 03:30 in New York), or skip it.")
@click.option("--dst-fold", type=click.Choice(("auto", "first", "both")), default="auto",
              show_default=True, help="A local time that occurs twice (fall back): first, both, "
              "or auto (both when the hour field starts with *, else first).")
@click.option("--paused", is_flag=True, help="Create it paused.")
@click.pass_context
@fail_cleanly
def schedule_add(ctx: click.Context, name: str, cron: str | None, tz: str, every: timedelta | None,
                 at: datetime | None, task: str, app_ref: str, args_json: str, kwargs_json: str,
                 queue: str | None, catchup: str, max_catchup: int, miss_tolerance: timedelta | None,
                 lateness: timedelta | None, overlap: str, jitter: timedelta | None,
                 owner: str | None, dst_gap: str, dst_fold: str, paused: bool) -> None:
    """Create or update schedule NAME (the same definition again changes nothing)."""
    trigger = _trigger(cron, tz, every, at, dst_gap, dst_fold)
    args, kwargs = parse_payload(args_json, kwargs_json)
    app = load_app(app_ref, ctx.obj["url"], ctx.obj["namespace"])
    status = app.schedule(name, trigger, task, args=args, kwargs=kwargs, queue=queue,
                          catchup=catchup, max_catchup=max_catchup, lateness=lateness,
                          overlap=overlap, jitter=jitter, owner=owner, paused=paused,
                          miss_tolerance=miss_tolerance)
    info = app.get_schedule(name)
    nxt = (f"next fire {when(info.next_fire, server_now(app))}" if info.next_fire
           else "no further fire time")
    click.echo(f"{status} {name}: {info.trigger.describe()}; {nxt}")


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True, help="A JSON list (absolute ISO times).")
@click.pass_context
@fail_cleanly
def schedule_list(ctx: click.Context, as_json: bool) -> None:
    """Every schedule of the namespace; NEXT and LAST in UTC and relative to now."""
    app = plain_app(ctx)
    infos = app.list_schedules()
    if as_json:
        echo_json([schedule_to_dict(i) for i in infos])
        return
    now = server_now(app)
    rows = [(i.name, i.trigger.describe(), i.task, i.queue, "paused" if i.paused else "active",
             when(i.next_fire, now), when(i.last_occurrence, now), i.materialized_count)
            for i in infos]
    click.echo(table(("NAME", "TRIGGER", "TASK", "QUEUE", "STATUS", "NEXT", "LAST", "RUNS"), rows))


@schedule.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True,
              help="Definition, state and next_fires as JSON (absolute ISO times).")
@click.pass_context
@fail_cleanly
def schedule_show(ctx: click.Context, name: str, as_json: bool) -> None:
    """A schedule's definition, state and next 5 fire times (its zone and UTC); the first is
    its next_fire, whether or not a scheduler has run yet."""
    app = plain_app(ctx)
    info = app.get_schedule(name)
    now = server_now(app)
    fires = next_fires(info, now)
    if as_json:
        echo_json({**schedule_to_dict(info), "next_fires": fires})
    else:
        click.echo(schedule_to_text(info, fires, now))


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
    """Create runs again; occurrences missed while paused follow the catch-up policy."""
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
@instant_option("--from", "start", required=True, help="First instant (inclusive).")
@instant_option("--to", "end", required=True, help="Last instant (inclusive).")
@click.pass_context
@fail_cleanly
def schedule_backfill(ctx: click.Context, name: str, start: datetime, end: datetime) -> None:
    """One run per occurrence in [--from, --to]; occurrences that have a run are left alone,
    so an interrupted backfill can simply be run again."""
    if end < start:
        raise click.BadParameter("is before --from", param_hint="--to")
    app = plain_app(ctx)
    trigger = app.get_schedule(name).trigger
    total = sum(1 for _ in trigger.occurrences(start - timedelta(microseconds=1), end))
    done = 0

    def step(n: int) -> None:
        nonlocal done
        done += n
        advance(n)

    try:
        with progress(total, "backfilling") as advance:
            occurrences, created = app.schedules.backfill(name, start, end, progress=step)
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
