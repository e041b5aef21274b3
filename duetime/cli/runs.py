"""`duetime runs|dead|uncertain`: inspect runs and act on them (cancel, replay, resolve, purge)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import click

from duetime.cli.common import (
    F,
    admin,
    counted,
    duration_option,
    echo_json,
    echo_listing,
    fail_cleanly,
    inspector,
    instant_option,
    interrupted,
    plain_app,
    progress,
    run_id_arg,
    server_now,
    table,
    when,
)
from duetime.common.errors import InvalidState, RunFailed, WaitTimeout
from duetime.common.models import STATES, Run
from duetime.common.time.fmt import format_duration
from duetime.common.time.parse import WAIT, to_ms
from duetime.ops.inspect import RunSummary
from duetime.ops.render import run_to_dict, run_to_text, summary_to_dict

UNLIMITED = 10**9


def _info(s: RunSummary) -> str:
    text = s.error or s.reason or ""
    if s.replayed_by:
        text = f"replayed by {s.replayed_by}" + (f"; {text}" if text else "")
    if s.cancel_requested and s.state == "running":
        text = "cancel requested"
    return text[:80]


def _when(s: RunSummary, now: datetime) -> str:
    if s.state == "running":
        return f"started {when(s.started, now)}"
    if s.state == "retrying":
        return f"retry {when(s.retry_at, now)}"
    if s.state == "scheduled":
        return f"due {when(s.due, now)}"
    return f"ended {when(s.finished, now)}"


def _print_runs(runs: list[RunSummary], as_json: bool, truncated: bool, now: datetime) -> None:
    if as_json:
        echo_json([summary_to_dict(s) for s in runs])
        return
    rows = [(s.id, s.state, s.task, s.queue, s.schedule, _when(s, now),
             f"{s.attempt}/{s.max_attempts}", _info(s)) for s in runs]
    click.echo(table(("ID", "STATE", "TASK", "QUEUE", "SCHEDULE", "WHEN", "ATTEMPT", "INFO"), rows))
    if truncated:
        click.echo("(stopped early: too many finished runs to examine; narrow with --state, "
                   "--schedule or --queue)", err=True)


# -- runs -------------------------------------------------------------------------------
@click.group()
def runs() -> None:
    """Inspect runs; cancel, replay or wait for one."""


@runs.command("list")
@click.option("--state", type=click.Choice(STATES), default=None, help="Only runs in this state.")
@click.option("--schedule", default=None, help="Only runs of this schedule.")
@click.option("--queue", default=None, help="Only runs of this queue.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000),
              help="At most this many runs.")
@click.option("--json", "as_json", is_flag=True,
              help="A JSON list (fields: see README); times are absolute ISO-8601 UTC.")
@click.pass_context
@fail_cleanly
def runs_list(ctx: click.Context, state: str | None, schedule: str | None, queue: str | None,
              limit: int, as_json: bool) -> None:
    """Runs: running, retrying and scheduled first (soonest first), then uncertain, dead and
    finished (newest first)."""
    app = plain_app(ctx)
    listing = inspector(app).list_runs(state, schedule, queue, limit)
    _print_runs(listing.runs, as_json, listing.truncated, server_now(app))


def _showing(group: click.Group) -> Callable[[F], click.Command]:
    """`<group> show RUN_ID [--json]`."""
    def wrap(f: F) -> click.Command:
        f = click.option("--json", "as_json", is_flag=True,
                         help="The record as JSON (absolute ISO times).")(f)
        f = click.argument("run_id", callback=run_id_arg)(f)
        return group.command("show")(click.pass_context(fail_cleanly(f)))
    return wrap


def _show_run(ctx: click.Context, run_id: str, as_json: bool, state: str | None = None) -> Run:
    """Print a run's record, JSON or text; `state`: the run must be in it (InvalidState)."""
    app = plain_app(ctx)
    run = inspector(app).get_run(run_id)
    if state is not None and run.state != state:
        raise InvalidState(f"run {run_id} is not {state} (state {run.state}); "
                           "see `duetime runs show`")
    if as_json:
        echo_json(run_to_dict(run, server_now(app)))  # now: a long run's ages
    else:
        click.echo(run_to_text(run, server_now(app)))
    return run


@_showing(runs)
def runs_show(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """A run's record and every attempt: worker, start, end, outcome, error; lateness."""
    _show_run(ctx, run_id, as_json)


@runs.command("cancel")
@click.argument("run_id", callback=run_id_arg)
@click.option("--reason", default="cancelled by an operator", show_default=True,
              help="Recorded on the run.")
@click.pass_context
@fail_cleanly
def runs_cancel(ctx: click.Context, run_id: str, reason: str) -> None:
    """Cancel a run: at once if it has not started; a running one stops at its worker's next
    heartbeat."""
    outcome, detail = admin(plain_app(ctx)).cancel(run_id, reason)
    if outcome == "cancelled":
        click.echo(f"cancelled {run_id} (it was {detail})")
    else:
        click.echo(f"cancel requested for {run_id}: worker {detail} stops it at its next "
                   "heartbeat and records it as cancelled")


@runs.command("replay")
@click.argument("run_id", callback=run_id_arg)
@click.option("--force", is_flag=True, help="Also replay a run that succeeded.")
@click.option("--note", default="", help="Recorded on the old run.")
@click.pass_context
@fail_cleanly
def runs_replay(ctx: click.Context, run_id: str, force: bool, note: str) -> None:
    """A new run doing a finished run's work again (same task, payload and idempotency key),
    linked to it; prints the new run's id."""
    new_id, created = admin(plain_app(ctx)).replay(run_id, force, note)
    if not created:
        click.echo(f"{run_id} was already replayed as:", err=True)
    click.echo(new_id)


@runs.command("wait")
@click.argument("run_id", callback=run_id_arg)
@duration_option("--timeout", span=WAIT, default="60s", show_default=True,
                 help="Give up (exit 1) after this long.")
@click.option("--json", "as_json", is_flag=True,
              help="Print {id, state, result, error} as JSON (the task's return value).")
@click.pass_context
@fail_cleanly
def runs_wait(ctx: click.Context, run_id: str, timeout: timedelta, as_json: bool) -> None:
    """Wait until a run ends (woken when it does, no polling); prints its state, or with
    --json its result. Exit 0 if it succeeded, 1 otherwise."""
    app = plain_app(ctx)
    try:
        result, state, error = app.wait(run_id, timeout.total_seconds()), "succeeded", None
    except RunFailed as exc:
        result, state, error = None, exc.state, exc.error
    except WaitTimeout as exc:
        click.echo(f"error: run {run_id} still {exc.state} after {format_duration(timeout)}",
                   err=True)
        ctx.exit(1)
    if as_json:
        echo_json({"id": run_id, "state": state, "result": result, "error": error})
    else:
        click.echo(state)
        if error:
            click.echo(error.splitlines()[0], err=True)
    ctx.exit(0 if state == "succeeded" else 1)


# -- dead letters -------------------------------------------------------------------------
@click.group()
def dead() -> None:
    """Dead-lettered runs: failed for good (fatal error or attempts exhausted)."""


def _index_listing(index: str) -> Callable[[F], F]:
    """The options of `dead list` and `uncertain list`: --queue, --limit, --json."""
    def wrap(f: F) -> F:
        f = click.option("--json", "as_json", is_flag=True,
                         help="A JSON list (absolute ISO times).")(f)
        f = click.option("--limit", default=50, show_default=True,
                         type=click.IntRange(1, 100_000), help="At most this many runs.")(f)
        return click.option("--queue", default=None, help=f"Only {index} runs of this queue.")(f)
    return wrap


def _list_index(ctx: click.Context, index: str, queue: str | None, limit: int, as_json: bool,
                header: tuple[str, ...], row: Callable[[RunSummary, datetime], tuple[Any, ...]]
                ) -> None:
    """The runs of the dead or uncertain index, newest first: JSON, or one table row each."""
    app = plain_app(ctx)
    listing = inspector(app).list_runs(index, None, queue, limit)

    def rows() -> list[tuple[Any, ...]]:
        now = server_now(app)
        return [row(s, now) for s in listing.runs]

    echo_listing(as_json, listing.runs, summary_to_dict, header, rows)


@dead.command("list")
@_index_listing("dead")
@click.pass_context
@fail_cleanly
def dead_list(ctx: click.Context, queue: str | None, limit: int, as_json: bool) -> None:
    """Dead letters not yet replayed or purged, newest first."""
    _list_index(ctx, "dead", queue, limit, as_json,
                ("ID", "TASK", "QUEUE", "OWNER", "DIED", "ATTEMPTS", "ERROR"),
                lambda s, now: (s.id, s.task, s.queue, s.owner, when(s.finished, now), s.attempt,
                                (s.error or s.reason or "")[:80]))


@_showing(dead)
def dead_show(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """A dead run's record, its error and every attempt."""
    run = _show_run(ctx, run_id, as_json, "dead")
    if not as_json and run.error:
        click.echo("  full error:\n    " + run.error.replace("\n", "\n    "))


@dead.command("replay")
@click.argument("run_id", required=False, callback=run_id_arg)
@click.option("--all", "replay_all", is_flag=True, help="Every dead run (of --queue / --task).")
@click.option("--queue", default=None, help="With --all: only this queue.")
@click.option("--task", default=None, help="With --all: only this task.")
@click.option("--json", "as_json", is_flag=True, help="Print {old, new} pairs as JSON.")
@click.pass_context
@fail_cleanly
def dead_replay(ctx: click.Context, run_id: str | None, replay_all: bool, queue: str | None,
                task: str | None, as_json: bool) -> None:
    """Replay one dead run, or all of them; prints the new run ids."""
    if bool(run_id) == replay_all:
        raise click.UsageError("give a RUN_ID or --all (not both)")
    app = plain_app(ctx)
    adm = admin(app)
    if run_id:
        run = inspector(app).get_run(run_id)
        if run.state != "dead":
            raise InvalidState(f"run {run_id} is not dead (state {run.state}); "
                               "use `duetime runs replay`")
        ids = [run_id]
    else:
        listing = inspector(app).list_runs("dead", None, queue, UNLIMITED, UNLIMITED)
        ids = [s.id for s in listing.runs if task is None or s.task == task]
    pairs: list[dict[str, str]] = []
    try:
        with progress(len(ids), "replaying") as advance:
            for old in ids:
                new, _ = adm.replay(old)
                pairs.append({"old": old, "new": new})
                advance(1)
    except KeyboardInterrupt:
        interrupted(len(pairs), len(ids), "dead runs replayed", "duetime dead replay --all")
    if as_json:
        echo_json(pairs)
    else:
        for pair in pairs:
            click.echo(f"{pair['old']} -> {pair['new']}")
        click.echo(f"replayed {len(pairs)} dead run(s)", err=True)


@dead.command("purge")
@instant_option("--before", default=None, help="Only runs dead-lettered before this instant.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
@fail_cleanly
def dead_purge(ctx: click.Context, before: datetime | None, yes: bool) -> None:
    """Delete dead runs for good (records and attempt histories)."""
    before_ms = to_ms(before) if before else None
    adm = admin(plain_app(ctx))
    total = adm.count_dead(before_ms)
    if total == 0:
        click.echo("no dead runs to purge")
        return
    if not yes:
        click.confirm(f"delete {total} dead run(s) for good?", abort=True, err=True)
    purged = counted(total, "purging", "dead runs purged", "duetime dead purge",
                     lambda step: adm.purge_dead(before_ms, step))
    click.echo(f"purged {purged} dead run(s)")


# -- uncertain ----------------------------------------------------------------------------
@click.group()
def uncertain() -> None:
    """Runs whose outcome is unknown (non-idempotent task, worker lost): an operator decides."""


@uncertain.command("list")
@_index_listing("uncertain")
@click.pass_context
@fail_cleanly
def uncertain_list(ctx: click.Context, queue: str | None, limit: int, as_json: bool) -> None:
    """Uncertain runs, newest first."""
    _list_index(ctx, "uncertain", queue, limit, as_json,
                ("ID", "TASK", "QUEUE", "OWNER", "SINCE", "LAST WORKER", "REASON"),
                lambda s, now: (s.id, s.task, s.queue, s.owner, when(s.finished, now), s.worker,
                                (s.reason or "")[:80]))


@uncertain.command("resolve")
@click.argument("run_id", callback=run_id_arg)
@click.option("--as", "verdict", required=True, type=click.Choice(("succeeded", "failed", "replay")),
              help="succeeded: it happened; failed: dead-letter it; replay: run it again.")
@click.option("--note", default="", help="Recorded on the run.")
@click.pass_context
@fail_cleanly
def uncertain_resolve(ctx: click.Context, run_id: str, verdict: str, note: str) -> None:
    """Record what happened to an uncertain run."""
    result = admin(plain_app(ctx)).resolve(run_id, verdict, note)
    if verdict == "replay":
        click.echo(f"resolved {run_id}: replayed as", err=True)
        click.echo(result)
    else:
        click.echo(f"resolved {run_id}: now {result}")
