"""`duetime schedule ...`: register and manage schedules."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import click

from duetime.app import App
from duetime.cli.common import (
    F,
    counted,
    duration_option,
    echo_json,
    echo_listing,
    fail_cleanly,
    inspector,
    instant_option,
    load_app,
    parse_payload,
    plain_app,
    progress,
    server_now,
    table,
    when,
)
from duetime.common.errors import DuetimeError, InvalidSchedule
from duetime.common.schedules import (
    CATCHUP,
    EVERY,
    JITTER,
    LATENESS,
    MISS_TOLERANCE,
    MISS_TOLERANCE_MS,
    OVERLAP,
    STAGGER,
    effective_stagger_ms,
    parse_stagger,
    run_id_for,
    stagger_for,
)
from duetime.common.time.fmt import format_duration
from duetime.common.time.fmt import iso as _iso
from duetime.common.time.parse import Span
from duetime.common.time.parse import from_ms as _from_ms
from duetime.common.time.spec import At, Cron, Every, Trigger
from duetime.ops.render import next_fires, schedule_to_dict, schedule_to_text
from duetime.ops.schedule_listing import lint_schedules
from duetime.ops.surge import (
    DEFAULT_MAX_PER_SECOND,
    MAX_OCCURRENCES,
    Profile,
    Suggestion,
    profile,
    suggest_stagger,
    walk,
)

HORIZON = Span(timedelta(minutes=1), timedelta(days=31))
PROGRESS_FROM = 2000  # schedules: a progress bar on stderr from this many

CRON_HELP = ("Cron expression: 5 fields (minute hour day-of-month month day-of-week) or 6 with "
             "seconds last; L, nW, d#n, Ld and H as in croniter; e.g. '30 2 * * *'.")


def _stagger_ms(value: str | None, option: str = "--stagger") -> int | None:
    try:
        return parse_stagger(value)
    except DuetimeError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


def _trigger(cron: str | None, tz: str | None, every: timedelta | None, at: datetime | None,
             dst_gap: str, dst_fold: str) -> Trigger:
    given = [o for o, v in (("--cron", cron), ("--every", every), ("--at", at)) if v is not None]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --cron, --every or --at")
    if tz is not None and cron is None:  # it would be ignored: --every and --at are zone-free
        raise click.UsageError(f"--tz applies to --cron only, not to {given[0]}")
    tz = tz or "UTC"
    if every is not None:
        return Every(every)
    if at is not None:
        return At(at)
    try:
        return Cron(cron or "", tz=tz, dst_gap=dst_gap, dst_fold=dst_fold)
    except InvalidSchedule as exc:
        hint = "--tz" if "time zone" in str(exc) else "--cron"
        raise click.BadParameter(str(exc), param_hint=hint) from None


# `schedule add` warns above this rate: at 1 ms a schedule makes 86 million runs a day (tens
# of GB of run records within the retention, with or without a worker to run them)
WARN_INTERVAL = timedelta(seconds=1)


@click.group()
def schedule() -> None:
    """Register and manage schedules (cron in a zone, fixed intervals, one-time instants)."""


@schedule.command("add")
@click.argument("name")
@click.option("--cron", default=None, help=CRON_HELP)
@click.option("--tz", default=None, help="IANA zone of --cron (default UTC).")
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
@click.option("--stagger", default=None, metavar="DURATION|auto",
              help="Stable per-schedule offset up to this (from a hash of the name), so "
              "schedules written alike do not fire in the same second; auto (the default): "
              "the namespace policy (`schedule policy set`); 0: exactly on time.")
@click.option("--dst-gap", type=click.Choice(("shift", "skip")), default="shift", show_default=True,
              help="A local time that does not exist (spring forward): shift it by the gap "
              "(02:30 becomes 03:30 in New York), or skip it.")
@click.option("--dst-fold", type=click.Choice(("auto", "first", "both")), default="auto",
              show_default=True, help="A local time that occurs twice (fall back): first, both, "
              "or auto (both when the hour field starts with *, else first).")
@click.option("--pause-after-failures", type=click.IntRange(1, 1_000_000_000), default=None,
              help="Guardrail: pause after this many consecutive occurrences ended dead.")
@instant_option("--start", default=None, help="Guardrail: no occurrence before this.")
@instant_option("--end", default=None, help="Guardrail: no occurrence after this.")
@click.option("--max-runs", type=click.IntRange(1, 1_000_000_000), default=None,
              help="Guardrail: stop after this many runs.")
@click.option("--calendar", default=None, metavar="NAME",
              help="A business calendar (`duetime calendar add`): occurrences on its excluded "
              "days follow --on-excluded.")
@click.option("--on-excluded", type=click.Choice(("skip", "next", "previous")), default="skip",
              show_default=True, help="With --calendar: skip an occurrence on an excluded day, "
              "or move it to the same local time on the next or previous business day.")
@click.option("--paused", is_flag=True, help="Create it paused.")
@click.pass_context
@fail_cleanly
def schedule_add(ctx: click.Context, name: str, cron: str | None, tz: str | None, every: timedelta | None,
                 at: datetime | None, task: str, app_ref: str, args_json: str, kwargs_json: str,
                 queue: str | None, catchup: str, max_catchup: int, miss_tolerance: timedelta | None,
                 lateness: timedelta | None, overlap: str, jitter: timedelta | None,
                 owner: str | None, stagger: str | None, dst_gap: str, dst_fold: str,
                 pause_after_failures: int | None, start: datetime | None, end: datetime | None,
                 max_runs: int | None, calendar: str | None, on_excluded: str,
                 paused: bool) -> None:
    """Create or update schedule NAME (the same definition again changes nothing)."""
    if calendar is None and on_excluded != "skip":
        raise click.UsageError("--on-excluded needs --calendar")
    trigger = _trigger(cron, tz, every, at, dst_gap, dst_fold)
    _stagger_ms(stagger)  # a bad value is refused before the app is loaded
    args, kwargs = parse_payload(args_json, kwargs_json)
    app = load_app(app_ref, ctx.obj["url"], ctx.obj["namespace"])
    status = app.schedule(name, trigger, task, args=args, kwargs=kwargs, queue=queue,
                          catchup=catchup, max_catchup=max_catchup, lateness=lateness,
                          overlap=overlap, jitter=jitter, owner=owner, paused=paused,
                          miss_tolerance=miss_tolerance, stagger=stagger,
                          pause_after_failures=pause_after_failures, start=start, end=end,
                          max_runs=max_runs, calendar=calendar, on_excluded=on_excluded)
    info = app.get_schedule(name)
    nxt = (f"next fire {when(info.next_fire, server_now(app))}" if info.next_fire
           else "no further fire time")
    click.echo(f"{status} {name}: {info.trigger.describe()}; {nxt}")
    if every is not None and every < WARN_INTERVAL:
        per_day = timedelta(days=1) / every
        click.echo(f"warning: schedule {name} fires more than once a second (every "
                   f"{format_duration(every)}: {per_day:,.0f} runs a day, each kept for the "
                   "retention); is that meant?", err=True)


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True, help="A JSON list (absolute ISO times).")
@click.pass_context
@fail_cleanly
def schedule_list(ctx: click.Context, as_json: bool) -> None:
    """Every schedule of the namespace; NEXT and LAST in UTC and relative to now."""
    app = plain_app(ctx)
    infos = app.list_schedules() if as_json else app.schedules.list(payload=False)  # no args shown

    def rows() -> list[tuple[Any, ...]]:
        now = server_now(app)
        return [(i.name, i.trigger.describe(), i.task, i.queue,
                 "paused" if i.paused else "active", when(i.next_fire, now),
                 when(i.last_occurrence, now), i.materialized_count) for i in infos]

    echo_listing(as_json, infos, schedule_to_dict,
                 ("NAME", "TRIGGER", "TASK", "QUEUE", "STATUS", "NEXT", "LAST", "RUNS"), rows)


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
    fires = next_fires(info, now, trigger=app.schedules.effective_trigger(info))
    policy_ms = app.schedules.stagger_policy()
    if as_json:
        own = None if info.stagger_s is None else round(info.stagger_s * 1000)
        offset = stagger_for(info.name, effective_stagger_ms(own, policy_ms)) / 1000
        from duetime.ops.policies import policies_dict

        echo_json({**schedule_to_dict(info), "next_fires": fires, "stagger_offset_s": offset,
                   "policies": policies_dict(info, policy_ms)})
    else:
        click.echo(schedule_to_text(info, fires, now, policy_ms))


def _on_one(cmd: str) -> Callable[[F], click.Command]:
    """`duetime schedule <cmd> NAME`: a command on one schedule, its errors said cleanly."""
    def wrap(f: F) -> click.Command:
        return schedule.command(cmd)(click.argument("name")(click.pass_context(fail_cleanly(f))))
    return wrap


@_on_one("pause")
@click.option("--note", default="", help="Why (shown by `schedule show`).")
def schedule_pause(ctx: click.Context, name: str, note: str) -> None:
    """Stop creating runs; on resume, missed occurrences follow the catch-up policy."""
    plain_app(ctx).pause(name, note)
    click.echo(f"paused {name}")


@_on_one("resume")
def schedule_resume(ctx: click.Context, name: str) -> None:
    """Create runs again; occurrences missed while paused follow the catch-up policy."""
    plain_app(ctx).resume(name)
    click.echo(f"resumed {name}")


@_on_one("trigger")
def schedule_trigger(ctx: click.Context, name: str) -> None:
    """Run the schedule now, outside its trigger; prints the run id."""
    click.echo(plain_app(ctx).trigger(name))


@_on_one("backfill")
@instant_option("--from", "start", required=True, help="First instant (inclusive).")
@instant_option("--to", "end", required=True, help="Last instant (inclusive).")
@click.option("--dry-run", is_flag=True,
              help="List the runs (occurrence and data interval) it would create; create none.")
def schedule_backfill(ctx: click.Context, name: str, start: datetime, end: datetime,
                      dry_run: bool = False) -> None:
    """One run per occurrence in [--from, --to] (its calendar applied), in order, each with
    its data interval (the previous occurrence to its own); occurrences that have a run are
    left alone, so an interrupted backfill can simply be run again."""
    if end < start:
        raise click.BadParameter("is before --from", param_hint="--to")
    app = plain_app(ctx)
    intervals = app.schedules.backfill_intervals(name, start, end)
    if dry_run:
        for s, o in intervals:
            click.echo(f"{run_id_for(name, o)}  interval {iso_ms(s) if s else '-'} .. {iso_ms(o)}")
        click.echo(f"{len(intervals)} occurrence(s); dry run, nothing created")
        return
    occurrences, created = counted(
        len(intervals), "backfilling", "occurrences", f"duetime schedule backfill {name} ...",
        lambda step: app.schedules.backfill(name, start, end, progress=step))
    click.echo(f"{occurrences} occurrence(s), {created} run(s) created "
               f"({occurrences - created} existed already)")


def iso_ms(ms: int) -> str:
    return _iso(_from_ms(ms)) or "-"


@_on_one("delete")
def schedule_delete(ctx: click.Context, name: str) -> None:
    """Remove the definition; its runs stay (history), runs not yet started still run."""
    plain_app(ctx).delete_schedule(name)
    click.echo(f"deleted {name}")


# -- surges ---------------------------------------------------------------------------------
@schedule.group("policy")
def schedule_policy() -> None:
    """The namespace's defaults for schedules registered without their own (stagger)."""


@schedule_policy.command("show")
@click.option("--json", "as_json", is_flag=True, help="As JSON: {stagger_s}.")
@click.pass_context
@fail_cleanly
def policy_show(ctx: click.Context, as_json: bool) -> None:
    """The default stagger schedules without their own apply."""
    ms = plain_app(ctx).schedules.stagger_policy()
    if as_json:
        echo_json({"stagger_s": ms / 1000})
    else:
        click.echo(f"stagger {format_duration(timedelta(milliseconds=ms)) if ms else 'none'}")


@schedule_policy.command("set")
@click.option("--stagger", required=True, metavar="DURATION",
              help="Default stagger of the schedules that have none of their own (0: none); "
              f"range {STAGGER}.")
@click.pass_context
@fail_cleanly
def policy_set(ctx: click.Context, stagger: str) -> None:
    """Set the default stagger; the schedulers apply it to runs they create from then on."""
    ms = _stagger_ms(stagger)
    if ms is None:
        raise click.BadParameter("give a duration (0: no default stagger)", param_hint="--stagger")
    plain_app(ctx).schedules.set_stagger_policy(ms)
    click.echo(f"stagger policy {format_duration(timedelta(milliseconds=ms)) if ms else 'none'}")


def _capacity(app: App) -> tuple[int, str]:
    """The default target: what the live workers can start at once."""
    live = [w for w in inspector(app).workers() if w.live]
    total = sum(w.concurrency for w in live)
    if total:
        return total, f"the live workers' total concurrency ({len(live)} worker(s))"
    return DEFAULT_MAX_PER_SECOND, f"no live worker: the default {DEFAULT_MAX_PER_SECOND}"


@schedule.command("migrate")
@click.option("--dry-run", is_flag=True, help="Count what would be converted; write nothing.")
@click.pass_context
@fail_cleanly
def schedule_migrate(ctx: click.Context, dry_run: bool) -> None:
    """Convert schedules written before the packed schedule record (one hash of named fields
    each) in place: same definition, version, cursor and pause; quarantined ones are left
    for the registration that fixes them. Safe while schedulers run (compare-and-set per
    schedule); not needed for correctness: both layouts are read (docs/keys.md)."""
    store = plain_app(ctx).schedules
    total = len(store.legacy_names())
    with _maybe_progress(total >= PROGRESS_FROM, total, "converting schedules") as advance:
        counts = store.migrate(dry_run, advance)
    verb = "would convert" if dry_run else "converted"
    click.echo(f"{counts['old']} schedule(s) in the old layout: {verb} {counts['converted']}, "
               f"left {counts['quarantined']} quarantined (converted when registered again)"
               + (f"; {counts['gone']} index entr(ies) without a record" if counts["gone"] else ""))


@schedule.command("lint")
@duration_option("--horizon", span=HORIZON, default="24h", show_default=True,
                 help="How far ahead to count runs.")
@click.option("--max-per-second", type=click.IntRange(1, 10_000_000), default=None,
              help="Target: at most this many runs due in one second. Default: the live "
              f"workers' total concurrency ({DEFAULT_MAX_PER_SECOND} when none is live).")
@click.option("--top", "top_n", type=click.IntRange(1, 1000), default=10, show_default=True,
              help="How many of the busiest seconds to show.")
@click.option("--json", "as_json", is_flag=True, help="The profile and the suggestion as JSON.")
@click.pass_context
@fail_cleanly
def schedule_lint(ctx: click.Context, horizon: timedelta, max_per_second: int | None,
                  top_n: int, as_json: bool) -> None:
    """Surges: runs due per second over the horizon, the busiest seconds and their schedules,
    and the default stagger that would keep every second at or under the target."""
    app = plain_app(ctx)
    began = time.perf_counter()
    target, source = (max_per_second, "--max-per-second") if max_per_second else _capacity(app)
    policy_ms = app.schedules.stagger_policy()
    total = sum(1 for _ in app.schedules.names())
    show = total >= PROGRESS_FROM and not as_json
    start = int(server_now(app).timestamp() * 1000)
    span = int(horizon.total_seconds() * 1000)
    with _maybe_progress(show, total, "reading schedules") as advance:
        scheds, inactive, unreadable = lint_schedules(app.schedules, advance)
    with _maybe_progress(show, len(scheds), "walking triggers") as advance:
        walks = walk(scheds, start, span, advance)
    prof = profile(scheds, start, span, max_per_second=target, policy_ms=policy_ms, top=top_n,
                   walks=walks)
    sugg = suggest_stagger(scheds, start, span, max_per_second=target, policy_ms=policy_ms,
                           peak=prof.peak, walks=walks)
    elapsed = time.perf_counter() - began
    if as_json:
        echo_json(lint_to_dict(prof, sugg, policy_ms, source, inactive, unreadable, elapsed))
    else:
        click.echo(lint_to_text(prof, sugg, policy_ms, source, inactive, unreadable, elapsed))


@contextmanager
def _maybe_progress(show: bool, total: int, label: str) -> Iterator[Callable[[int], None] | None]:
    if not show:
        yield None
        return
    with progress(total, label) as advance:
        yield advance


# -- surges (`duetime schedule lint`) --------------------------------------------------------
def lint_to_dict(prof: Profile, sugg: Suggestion, policy_ms: int, source: str, inactive: int,
                 unreadable: int, elapsed_s: float) -> dict[str, Any]:
    return {
        "start": _iso(_from_ms(prof.start_ms)), "horizon_s": prof.horizon_ms / 1000,
        "schedules": prof.schedules, "inactive": inactive, "unreadable": unreadable,
        "runs": prof.runs, "evaluations": prof.evaluations, "policy_stagger_s": policy_ms / 1000,
        "max_per_second": prof.max_per_second, "max_per_second_from": source,
        "peak": prof.peak, "busy_seconds": prof.busy_seconds, "over": prof.over,
        "flat": prof.flat,
        "hot": [{"second": _iso(_from_ms(h.second_ms)), "count": h.count,
                 "schedules": list(h.schedules), "more": h.more} for h in prof.hot],
        "suggestion": {"stagger_s": None if sugg.stagger_ms is None else sugg.stagger_ms / 1000,
                       "peak_after": sugg.peak_after, "needed": sugg.needed,
                       "reason": sugg.reason},
        "truncated": prof.truncated[:100], "elapsed_s": round(elapsed_s, 3),
    }


def lint_to_text(prof: Profile, sugg: Suggestion, policy_ms: int, source: str, inactive: int,
                 unreadable: int, elapsed_s: float) -> str:
    horizon = format_duration(timedelta(milliseconds=prof.horizon_ms))
    policy = format_duration(timedelta(milliseconds=policy_ms)) if policy_ms else "none"
    lines = [f"{prof.schedules} active schedule(s), {prof.runs} run(s) in the next {horizon} "
             f"({prof.evaluations} distinct trigger(s) walked, {elapsed_s:.1f}s); "
             f"stagger policy: {policy}",
             f"target: at most {prof.max_per_second} run(s) due in one second ({source})"]
    skipped = [f"{inactive} paused or quarantined"] if inactive else []
    skipped += [f"{unreadable} unreadable"] if unreadable else []
    if skipped:
        lines.append(f"not counted: {', '.join(skipped)}")
    if prof.truncated:
        lines.append(f"counted up to {MAX_OCCURRENCES} occurrences each: "
                     f"{', '.join(prof.truncated[:5])}")
    if prof.flat:
        lines.append(f"flat: no second holds more than {prof.max_per_second} run(s) "
                     f"(busiest: {prof.peak})")
        return "\n".join(lines)
    lines += ["", f"{prof.over} second(s) above {prof.max_per_second}; the busiest:"]
    rows = [(_iso(_from_ms(h.second_ms), compact=True) or "", h.count,
             ", ".join(h.schedules) + (f" (+{h.more} more)" if h.more else ""))
            for h in prof.hot]
    lines.append(table(("SECOND (UTC)", "RUNS", "SCHEDULES"), rows))
    lines.append("")
    if sugg.stagger_ms is not None:
        width = format_duration(timedelta(milliseconds=sugg.stagger_ms))
        lines.append(f"suggested stagger: {width} ({sugg.reason}): "
                     f"`duetime schedule policy set --stagger {width}`")
    else:
        lines.append(f"no stagger suggested: {sugg.reason}")
    return "\n".join(lines)
