"""`duetime leases|workers|top|doctor|keys|migrate`: the operator's view of a live namespace, and
moving it on to a new layout format."""

from __future__ import annotations

import signal
import sys
import threading
import time
from dataclasses import asdict
from datetime import timedelta

import click

from duetime.cli.common import (
    app_for,
    duration_option,
    echo_json,
    fail_cleanly,
    inspector,
    plain_app,
    progress,
    table,
)
from duetime.common.connection import redact
from duetime.common.overview import Overview
from duetime.common.retrycost import MINUTE_MS, minute_of
from duetime.common.time.fmt import ago, format_duration, human_duration, iso
from duetime.common.time.parse import REFRESH, WAIT, WINDOW, from_ms
from duetime.ops.doctor import run_checks
from duetime.ops.keyguide import KeyGuide
from duetime.ops.render import lease_to_dict, overview_to_dict, scheduler_to_dict, worker_to_dict


@click.command()
@click.option("--json", "as_json", is_flag=True, help="A JSON list (absolute ISO times).")
@click.pass_context
@fail_cleanly
def leases(ctx: click.Context, as_json: bool) -> None:
    """Who owns which running run: worker, fence, lease time left, last heartbeat."""
    held = inspector(plain_app(ctx)).leases()
    if as_json:
        echo_json([lease_to_dict(lease) for lease in held])
        return
    rows = [(lease.run_id, lease.task, lease.queue, lease.worker or "(expired: reaper recovers it)",
             lease.fence, human_duration(lease.lease_left_s), ago(lease.heartbeat_age_s),
             human_duration(lease.running_s),
             "cancel requested" if lease.cancel_requested else "")
            for lease in held]
    click.echo(table(("RUN", "TASK", "QUEUE", "WORKER", "FENCE", "LEASE LEFT", "HEARTBEAT",
                      "RUNNING", "NOTE"), rows))


@click.command()
@click.option("--all", "include_gone", is_flag=True, help="Also workers that stopped heartbeating.")
@click.option("--wait-for", default=0, type=click.IntRange(0), metavar="N",
              help="First wait (up to --timeout) until N workers are live; exit 1 if not.")
@duration_option("--timeout", span=WAIT, default="30s", show_default=True,
                 help="How long --wait-for waits.")
@click.option("--json", "as_json", is_flag=True, help='{"workers": [...], "schedulers": [...]}')
@click.pass_context
@fail_cleanly
def workers(ctx: click.Context, include_gone: bool, wait_for: int, timeout: timedelta,
            as_json: bool) -> None:
    """Live workers (queues, concurrency, in-flight, last seen) and schedulers."""
    insp = inspector(plain_app(ctx))
    deadline = time.monotonic() + timeout.total_seconds()
    while wait_for and len([w for w in insp.workers() if w.live]) < wait_for:
        if time.monotonic() > deadline:
            click.echo(f"error: fewer than {wait_for} live workers after "
                       f"{format_duration(timeout)}", err=True)
            ctx.exit(1)
        time.sleep(0.1)
    ws, ss = insp.workers(include_gone), insp.schedulers()
    if as_json:
        echo_json({"workers": [worker_to_dict(w) for w in ws],
                   "schedulers": [scheduler_to_dict(s) for s in ss]})
        return
    click.echo(table(("WORKER", "QUEUES", "CONCURRENCY", "IN-FLIGHT", "PROCESSED", "LAST SEEN", "STATUS"),
                     [(w.id, ",".join(w.queues), w.concurrency, w.inflight, w.processed,
                       ago(w.last_seen_age_s), "live" if w.live else "gone")
                      for w in ws]))
    click.echo()
    click.echo(table(("SCHEDULER", "PARTITIONS", "LAST SEEN"),
                     [(s.id, len(s.partitions), ago(s.last_seen_age_s)) for s in ss]))


# -- top ------------------------------------------------------------------------------------
def render_frame(ov: Overview, title: str) -> str:
    owned = ov.partitions - len(ov.unowned_partitions)
    head = [
        f"{title}   {iso(from_ms(ov.now_ms), compact=True)}",
        f"workers {ov.workers} live · schedulers {ov.schedulers} ({owned}/{ov.partitions} "
        f"partitions owned) · running {ov.leases} · uncertain {ov.uncertain} · dead {ov.dead}",
        "",
    ]
    rows = [(q.queue + (" (paused)" if q.paused else ""), q.backlog,
             ago(q.oldest_due_age_s) if q.backlog else "-",
             q.scheduled_later, q.running, q.retrying, f"{q.finished_per_s:.1f}",
             human_duration(q.lateness_p50_s), human_duration(q.lateness_p99_s), q.dead)
            for q in sorted(ov.queues.values(), key=lambda q: q.queue)]
    body = table(("QUEUE", "BACKLOG", "OLDEST DUE", "LATER", "RUNNING", "RETRYING",
                  f"DONE/s({ov.window_s:g}s)", "LATE p50", "LATE p99", "DEAD"), rows)
    note = ["", "(rates, lateness and dead per queue are from a sample of recent runs)"] \
        if ov.sampled else []
    paused = [q for q in sorted(ov.queues.values(), key=lambda q: q.queue) if q.paused]
    if paused:  # duetime queue pause: enqueues wait, nothing is claimed
        note += ["", "paused (nothing claimed; duetime queue resume NAME): " + ", ".join(
            q.queue + (f" ({q.pause_note})" if q.pause_note else "") for q in paused)]
    return "\n".join(head + [body] + note + cost_section(ov))


def cost_section(ov: Overview, limit: int = 10) -> list[str]:
    """The cost of retries per task and owner, costliest first: attempts, attempts that did
    not succeed and the execution time they took, in total and in the recent window."""
    if not ov.cost:
        return []
    since = iso(from_ms(minute_of(ov.now_ms - ov.window_s * 1000) * MINUTE_MS), compact=True)
    rows = [(c.task, c.owner or "-", c.attempts, c.failed, human_duration(c.failed_s),
             c.recent_attempts, c.recent_failed, human_duration(c.recent_failed_s))
            for c in ov.cost[:limit]]
    more = [f"(+{len(ov.cost) - limit} more tasks: --json lists all)"] if len(ov.cost) > limit else []
    return ["", f"retry cost per task (recent: since {since}, the whole minutes covering the "
            "window)",
            table(("TASK", "OWNER", "ATTEMPTS", "FAILED", "FAILED TIME", "RECENT", "RECENT FAILED",
                   "RECENT FAILED TIME"), rows), *more]


@click.command()
@duration_option("--interval", span=REFRESH, default="2s", show_default=True,
                 help="Refresh period.")
@duration_option("--window", span=WINDOW, default="60s", show_default=True,
                 help="Rate and lateness window.")
@click.option("--once", is_flag=True, help="Print one frame and exit (no screen control).")
@click.option("--json", "as_json", is_flag=True, help="With --once: the frame's numbers as JSON.")
@click.pass_context
@fail_cleanly
def top(ctx: click.Context, interval: timedelta, window: timedelta, once: bool,
        as_json: bool) -> None:
    """Live view per queue: backlog, running, finish rate, start lateness p50/p99, retries, dead;
    and the cost of retries per task and owner (attempts, failed attempts and their time)."""
    app = plain_app(ctx)
    insp = inspector(app)
    period, window_s = interval.total_seconds(), window.total_seconds()
    title = f"duetime top — namespace {app.keys.namespace!r} on {redact(app.redis_url)}"
    if once or as_json:
        ov = insp.overview(activity=True, window_s=window_s, cost=True)
        if as_json:
            echo_json(overview_to_dict(ov))
        else:
            click.echo(render_frame(ov, title))
        return
    # Ctrl-C (or SIGTERM) sets a flag the loop reads between frames, rather than raising
    # KeyboardInterrupt wherever the main thread happens to be: inside a Redis call or a
    # library's cleanup, an exception there is at the mercy of code that is not ours, and a
    # `top` that ignores Ctrl-C is the one thing an operator's live view must never do.
    # A second Ctrl-C raises as usual: a frame stuck on a server that does not answer still
    # quits.
    stop = threading.Event()

    def quit_(*_: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = {sig: signal.signal(sig, quit_) for sig in (signal.SIGINT, signal.SIGTERM)}
    out = sys.stdout
    out.write("\x1b[?25l")  # hide the cursor while redrawing
    try:
        while not stop.is_set():
            frame = render_frame(insp.overview(activity=True, window_s=window_s, cost=True),
                                 title + f"   (every {format_duration(interval)}; Ctrl-C quits)")
            out.write("\x1b[H" + frame.replace("\n", "\x1b[K\n") + "\x1b[K\n\x1b[J")
            out.flush()
            stop.wait(period)
    except KeyboardInterrupt:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        out.write("\x1b[?25h\n")
        out.flush()


# -- doctor / keys --------------------------------------------------------------------------
MARK = {"ok": "ok   ", "info": "info ", "warn": "WARN ", "fatal": "FATAL"}


@click.command()
@click.option("--app", "app_ref", default=None, help="module:attribute: also check its partition count.")
@click.option("--json", "as_json", is_flag=True, help="The findings as JSON.")
@click.pass_context
@fail_cleanly
def doctor(ctx: click.Context, app_ref: str | None, as_json: bool) -> None:
    """Check the server and the deployment; exit 1 on a fatal finding."""
    from duetime.app import App

    app = app_for(ctx, app_ref) if app_ref else App(redis_url=ctx.obj["url"],
                                                     namespace=ctx.obj["namespace"])
    findings = run_checks(app.store.client, app.keys, app.redis_url,
                          app.keys.partitions if app_ref else None, surges=True)
    fatal = any(f.level == "fatal" for f in findings)
    if as_json:
        echo_json({"url": redact(app.redis_url), "namespace": app.keys.namespace, "fatal": fatal,
                   "findings": [asdict(f) for f in findings]})
    else:
        click.echo(f"duetime doctor: {redact(app.redis_url)} namespace {app.keys.namespace!r}")
        for f in findings:
            click.echo(f"  {MARK[f.level]} {f.check}: {f.message}")
            if f.advice and f.level != "ok":
                click.echo(f"        → {f.advice}")
        click.echo("fatal problems found" if fatal else "no fatal problems")
    ctx.exit(1 if fatal else 0)


@click.command()
@click.option("--run", "run_id", default=None, help="Print the key of this run's record "
              "(--json: all its keys).")
@click.option("--json", "as_json", is_flag=True, help="The layout as JSON.")
@click.pass_context
@fail_cleanly
def keys(ctx: click.Context, run_id: str | None, as_json: bool) -> None:
    """The key layout of the live namespace, with a redis-cli command for each key type."""
    app = plain_app(ctx)
    guide = KeyGuide(app.store.client, app.keys, app.redis_url)
    if run_id:
        from duetime.common.names import check_name

        check_name("run id", run_id)
        rk = guide.run_keys(run_id)
        if as_json:
            echo_json(rk)
        else:
            click.echo(rk["run"])
        return
    docs = guide.layout()
    if as_json:
        echo_json({
            "namespace": app.keys.namespace, "partitions": app.keys.partitions,
            "prefixes": [app.keys.prefix(p) for p in range(app.keys.partitions)],
            "keys": [{**asdict(d), "redis_cli": guide.redis_cli(d.command)} for d in docs],
        })
        return
    k = app.keys
    click.echo(f"namespace {k.namespace!r}: {k.partitions} partitions; T = a partition's prefix, "
               f"{k.prefix(0)} ... {k.prefix(k.partitions - 1)}")
    click.echo("(every key of a partition shares its {hash tag}: one cluster slot per partition)\n")
    for d in docs:
        click.echo(f"{d.pattern:<24} {d.type:<8} {d.holds}")
        mark = "" if d.live else "   # (no such key right now)"
        click.echo(f"    {guide.redis_cli(d.command)}{mark}")


# -- migrate --------------------------------------------------------------------------------
@click.command()
@click.option("--dry-run", is_flag=True, help="Say what would be done; write nothing.")
@click.option("--force", is_flag=True,
              help="Migrate although live workers of an older release serve the namespace.")
@click.pass_context
@fail_cleanly
def migrate(ctx: click.Context, dry_run: bool, force: bool) -> None:
    """Move the namespace on to the layout format this release writes (once no process of
    the previous release serves it: docs/operations.md, "Upgrades and the namespace format")."""
    from duetime.ops import migrate as mig

    app = plain_app(ctx)
    client, keys, url = app.store.ready(), app.keys, app.redis_url
    p = mig.plan(client, keys, url)
    if not p.needed:
        click.echo(f"namespace {keys.namespace!r} holds format {p.current}: nothing to migrate"
                   + ("" if dry_run else "; partitions marked again"))
        if not dry_run:  # finishes a migration interrupted between the meta and a partition
            mig.migrate(client, keys, url, p)
        return
    for w in p.blockers:
        click.echo(f"live worker {w.id} (host {w.host or '?'}, pid {w.pid or '?'}) reads formats "
                   f"up to {w.formats or 2}: it would misread format {p.target}", err=True)
    if p.blockers and not force:
        click.echo(f"error: {len(p.blockers)} live worker(s) of an older release; upgrade or "
                   "stop them first (or --force)", err=True)
        ctx.exit(1)
    if dry_run:
        click.echo(f"would move namespace {keys.namespace!r} from format {p.current} to "
                   f"{p.target}: <ns>:meta, then {p.partitions} partitions; no record rewritten")
        return
    with progress(p.partitions, "marking partitions") as advance:
        mig.migrate(client, keys, url, p, advance)
    click.echo(f"namespace {keys.namespace!r} moved from format {p.current} to {p.target} "
               f"({p.partitions} partitions)")
