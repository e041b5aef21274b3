"""`duetime worker`: a worker process (or N of them under a supervisor). Imports the worker
runtime only: a worker process loads no operator tool, console or other command."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import click
import redis

from duetime.app import App
from duetime.cli.common import (
    announce,
    duration_option,
    fail_cleanly,
    load_app,
    metrics_options,
)
from duetime.common import logs, metrics
from duetime.common.errors import RedisRefused, RedisUnavailable
from duetime.common.startup import answers, wait_for_server, warn_unverified_tls
from duetime.common.time.parse import (
    CLAIM_AHEAD,
    GRACE,
    KILL_GRACE,
    LEASE,
    UNKNOWN_GRACE,
    duration_ms,
)


@click.command()
@click.option("--app", "app_ref", required=True, help="module:attribute of your App.")
@click.option("--queues", default=None, help="Comma-separated, highest priority first "
              "(default: the queues of the app's tasks); or with weights, high:5,low:1, to share "
              "claims in proportion without starving any queue.")
@click.option("--concurrency", default=16, show_default=True, type=click.IntRange(1, 10_000),
              help="Runs executed at once by each process.")
@click.option("--processes", default=1, show_default=True, type=click.IntRange(1, 256),
              help="Worker processes, each with these options (signals are forwarded).")
@duration_option("--lease", span=LEASE, default="10s", show_default=True,
                 help="Lease length; heartbeats renew it every third of it.")
@duration_option("--grace", span=GRACE, default="30s", show_default=True,
                 help="SIGTERM: time in-flight runs get to finish before they are released.")
@duration_option("--claim-ahead", span=CLAIM_AHEAD, default="10ms", show_default=True,
                 help="Claim runs due this soon and start each exactly at its due time "
                 "(0 = claim only when due).")
@duration_option("--unknown-task-grace", span=UNKNOWN_GRACE, default="10m", show_default=True,
                 help="A run of a task this worker does not know goes back to its queue for a "
                 "worker that knows it; it is dead-lettered once no live worker has published "
                 "the task for this long.")
@click.option("--max-task-memory", default=None, metavar="SIZE",
              help="Resident memory a task process may reach (tasks declared "
              "isolation=\"process\"), e.g. 512MiB, 2GiB, 800MB; past it the process is "
              "killed and the attempt fails. Default: no cap.")
@duration_option("--kill-grace", span=KILL_GRACE, default="5s", show_default=True,
                 help="A task process past its timeout (or memory cap) gets SIGTERM, then "
                 "SIGKILL after this long.")
@metrics_options("Process i of --processes: port + i.")
@click.option("--burst", is_flag=True, help="Stop, exit 0, once idle: nothing of its own "
              "running, every outcome recorded, no run of its queues due now (runs due later "
              "are not waited for). For tests, CI and batch jobs; one process only.")
@click.option("--reload", is_flag=True, help="Development: restart the worker when a .py file "
              "under --reload-dir changes (needs the `dev` extra: watchfiles).")
@click.option("--reload-dir", "reload_dirs", multiple=True, metavar="DIR",
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A folder --reload watches (repeatable; default: the current folder).")
@click.pass_context
@fail_cleanly
def worker(ctx: click.Context, app_ref: str, queues: str | None, concurrency: int,
           processes: int, lease: timedelta, grace: timedelta, claim_ahead: timedelta,
           unknown_task_grace: timedelta, max_task_memory: str | None, kill_grace: timedelta,
           metrics_port: int | None, metrics_host: str, burst: bool, reload: bool,
           reload_dirs: tuple[Path, ...]) -> None:
    """Execute runs: claim, run, heartbeat, report."""
    if reload_dirs and not reload:
        raise click.UsageError("--reload-dir needs --reload")
    if reload:
        if burst:
            raise click.UsageError("--burst stops when idle: drop --reload")
        _reload(app_ref, reload_dirs or (Path.cwd(),), grace)
        return
    if burst and processes > 1:
        # the supervisor restarts a child that exits: N burst workers would never end
        raise click.UsageError("--burst runs one worker process: drop --processes")
    if processes > 1:
        _supervise(processes, metrics_port)
        return
    from duetime.worker.runtime import Worker, WorkerConfig, tune_gc

    app = load_app(app_ref, ctx.obj["url"], ctx.obj["namespace"])
    from duetime.worker.config import parse_queues
    from duetime.worker.isolation import parse_size

    # everything is checked before the first write to Redis: a refused option writes nothing
    qs, weights = parse_queues(queues or ",".join(app.registry.queues() or ["default"]))
    cfg = WorkerConfig(queues=qs, concurrency=concurrency, lease_ms=duration_ms(lease),
                       grace_s=grace.total_seconds(), claim_ahead_ms=duration_ms(claim_ahead),
                       max_result=app.max_payload, queue_weights=weights,
                       unknown_task_grace_ms=duration_ms(unknown_task_grace),
                       app_ref=app_ref, kill_grace_s=kill_grace.total_seconds(),
                       max_task_memory=None if max_task_memory is None
                       else parse_size(max_task_memory))
    metrics.preset(app.registry.names(), qs,
                   {n: app.registry.get(n).owner or "" for n in app.registry.names()})
    metrics.serve(metrics_port, metrics_host, role="worker")
    warn_unverified_tls(app.redis_url, "worker")
    wait_for_server(lambda: answers(app.store.client), app.redis_url, "worker")
    register(app, qs)
    announce(ctx, app, "worker")
    w = Worker(app.registry, app.redis_url, app.keys, cfg)
    tune_gc()  # this process is the worker's own (an embedded Worker leaves the GC alone)
    asyncio.run(w.run(until_idle=burst))
    # threads of sync tasks that outlived the grace period were released; do not wait for them
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def register(app: App, qs: list[str], wait: Callable[[], object] | None = None) -> None:
    """Record the worker's queue names (the list `top` and the gauges read) and its tasks'
    options (producers without the code enqueue by name with them). The server may go away
    between the start-up probe and these writes (a restart): they are retried once it answers
    again, as the probe is, instead of the worker exiting with a connection error."""
    while True:
        try:
            client = app.store.ready()
            try:
                client.sadd(app.keys.queues, *qs)
                app.publish_tasks()
            except (redis.exceptions.OutOfMemoryError, RedisRefused) as exc:
                if isinstance(exc, RedisRefused) and exc.code != "OOM":
                    raise
                # at maxmemory the worker still starts (heartbeats go on, claims wait);
                # enqueues and the next worker start record the names and the task options
                logs.get("duetime.cli").warning("redis is at maxmemory: queue names and task "
                                                "options not recorded yet", queues=qs)
            return
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                RedisUnavailable) as exc:
            logs.get("duetime.cli").warning("redis went away during start-up; waiting for it "
                                            "again", error=str(exc)[:200])
            (wait or (lambda: wait_for_server(lambda: answers(app.store.client), app.redis_url,
                                              "worker")))()


def _reload(app_ref: str, dirs: tuple[Path, ...], grace: timedelta) -> None:
    """Run the worker as a child and replace it on code changes (duetime/cli/reload.py)."""
    try:
        import watchfiles  # noqa: F401 - the extra's presence, checked before anything starts
    except ImportError:
        raise click.ClickException("--reload needs its extra: pip install 'duetime[dev]' "
                                   "(watchfiles)") from None
    from duetime.cli.reload import Reloader, child_argv

    # the app must import before the loop starts: a wrong --app is one error line, not a
    # child that fails at every change
    load_app(app_ref, None, None)
    sys.exit(Reloader(child_argv(sys.argv[1:]), dirs, grace.total_seconds()).run())


def _supervise(n: int, metrics_port: int | None) -> None:
    """--processes N: N single-process workers with the same options, each on its own metrics
    port; a child that dies is restarted (duetime/supervise.py); signals are forwarded."""
    from duetime.supervise import supervise

    sys.exit(supervise(sys.argv[1:], n, metrics_port))


