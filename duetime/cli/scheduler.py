"""`duetime scheduler` and `duetime reaper`: the evaluator, the reaper and the gauges. Imports
the scheduler's own modules only: no operator tool, console or other command."""

from __future__ import annotations

import signal
from datetime import timedelta

import click

from duetime.app import App
from duetime.cli.common import (
    announce,
    duration_option,
    fail_cleanly,
    load_app,
    metrics_options,
)
from duetime.cli.common import app_for as _app_or_plain
from duetime.common import metrics
from duetime.common.schedules import MISS_TOLERANCE
from duetime.common.startup import answers, wait_for_server, warn_unverified_tls
from duetime.common.time.parse import GAUGES_EVERY, LEAD, RETENTION, TICK, duration_ms

RETENTION_HELP = "How long finished runs (succeeded, missed, skipped, cancelled) are kept."


def _run_reaper(ctx: click.Context, app_ref: str | None, tick: timedelta, retention: timedelta,
                metrics_port: int | None, metrics_host: str = "127.0.0.1") -> None:
    from duetime.scheduler.reaper import Reaper

    app = load_app(app_ref, ctx.obj["url"], ctx.obj["namespace"]) if app_ref else App(
        redis_url=ctx.obj["url"], namespace=ctx.obj["namespace"])
    metrics.serve(metrics_port, metrics_host, role="reaper")
    wait_for_server(lambda: answers(app.store.client), app.redis_url, "reaper")
    app.store.ready()
    announce(ctx, app, "reaper")
    reaper = Reaper(app.redis_url, app.keys, tick_s=tick.total_seconds(),
                    retention_ms=duration_ms(retention))
    signal.signal(signal.SIGTERM, lambda *_: reaper.stop())
    signal.signal(signal.SIGINT, lambda *_: reaper.stop())
    reaper.run()


@click.command()
@click.option("--app", "app_ref", default=None, help="module:attribute (optional for the reaper).")
@duration_option("--tick", span=TICK, default="500ms", show_default=True,
                 help="How often expired leases are looked for.")
@duration_option("--retention", span=RETENTION, default="24h", show_default=True,
                 help=RETENTION_HELP)
@metrics_options()
@click.pass_context
@fail_cleanly
def reaper(ctx: click.Context, app_ref: str | None, tick: timedelta, retention: timedelta,
           metrics_port: int | None, metrics_host: str) -> None:
    """Recover runs whose lease expired (retry, uncertain or dead)."""
    _run_reaper(ctx, app_ref, tick, retention, metrics_port, metrics_host)


@click.command()
@click.option("--app", "app_ref", default=None, help="module:attribute (optional).")
@duration_option("--lead", span=LEAD, default="2s", show_default=True,
                 help="Create runs this long before they are due.")
@duration_option("--tick", span=TICK, default="250ms", show_default=True,
                 help="How often due schedules are evaluated.")
@duration_option("--reap-tick", span=TICK, default="500ms", show_default=True,
                 help="How often expired leases are looked for.")
@duration_option("--retention", span=RETENTION, default="24h", show_default=True,
                 help=RETENTION_HELP)
@duration_option("--miss-tolerance", span=MISS_TOLERANCE, default=None,
                 help="Override every schedule's own miss tolerance (default: each schedule's, "
                 "set with `schedule add --miss-tolerance`, 1m unless given).")
@duration_option("--gauges-every", span=GAUGES_EVERY, default="5s", show_default=True,
                 help="How often the queue gauges (backlog, oldest due, ...) are recomputed.")
@metrics_options()
@click.pass_context
@fail_cleanly
def scheduler(ctx: click.Context, app_ref: str | None, lead: timedelta, tick: timedelta,
              reap_tick: timedelta, retention: timedelta, miss_tolerance: timedelta | None,
              gauges_every: timedelta, metrics_port: int | None, metrics_host: str) -> None:
    """Evaluate schedules into runs, and recover expired leases (run two or more)."""
    from duetime.scheduler.service import run_scheduler

    # the queue gauges exist from the first scrape (at 0, for the default queue), though the
    # queues Redis knows are read once it answers: a scrape meanwhile sees every family
    metrics.preset_queue_gauges(["default"])
    metrics.serve(metrics_port, metrics_host, role="scheduler")  # unready while it waits
    app = _app_or_plain(ctx, app_ref, wait_as="scheduler")
    warn_unverified_tls(app.redis_url, "scheduler")
    client = app.store.ready()
    announce(ctx, app, "scheduler")
    known = {q.decode() if isinstance(q, bytes) else q for q in client.smembers(app.keys.queues)}
    metrics.preset_queue_gauges(sorted(known | set(app.registry.queues()) | {"default"}))
    run_scheduler(app.redis_url, app.keys, lead_ms=duration_ms(lead),
                  tick_s=tick.total_seconds(), reap_tick_s=reap_tick.total_seconds(),
                  miss_tolerance_ms=None if miss_tolerance is None else duration_ms(miss_tolerance),
                  retention_ms=duration_ms(retention),
                  gauge_interval_s=gauges_every.total_seconds())


