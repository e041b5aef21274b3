"""The `duetime` command: wires the components together for operators."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from datetime import datetime, timedelta

import click
import redis

from duetime import __version__
from duetime.app import App
from duetime.cli_common import (
    ENV_NS,
    ENV_URL,
    DuetimeGroup,
    duration_option,
    fail_cleanly,
    instant_option,
    load_app,
    parse_payload,
)
from duetime.cli_common import (
    app_for as _app_or_plain,
)
from duetime.common import logs, metrics
from duetime.common.connection import DEFAULT_URL, redact
from duetime.common.durability import ENV_REPLICAS, ENV_TIMEOUT
from duetime.common.errors import RedisRefused
from duetime.common.schedules import MISS_TOLERANCE
from duetime.common.timeparse import (
    CLAIM_AHEAD,
    DELAY,
    GAUGES_EVERY,
    GRACE,
    LEAD,
    LEASE,
    RETENTION,
    TICK,
    duration_ms,
)


@click.group(cls=DuetimeGroup)
@click.option("--redis-url", envvar=ENV_URL, default=None, help=f"Redis URL (env {ENV_URL}).")
@click.option("--namespace", envvar=ENV_NS, default=None, help=f"Key namespace (env {ENV_NS}).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(logs.LEVELS, case_sensitive=False),
              help="DEBUG, INFO, WARNING or ERROR (logs go to stderr).")
@click.option("--durability", default=None, type=click.Choice(["async", "replicated"]),
              help="replicated: every state change waits for a replica to have it (WAIT; "
              f"{ENV_REPLICAS} replicas, default 1, {ENV_TIMEOUT} ms, default 1000); async: "
              "Redis's own replication (the default).")
@click.version_option(__version__, "--version", prog_name="duetime", message="%(prog)s %(version)s")
@click.pass_context
def main(ctx: click.Context, redis_url: str | None, namespace: str | None, log_level: str,
         durability: str | None) -> None:
    """duetime: a Redis-backed distributed job scheduler."""
    logs.configure(log_level)
    # every client this process (and the worker processes it starts) makes follows it
    if durability == "async":
        os.environ[ENV_REPLICAS] = "0"
    elif durability == "replicated" and int(os.environ.get(ENV_REPLICAS) or 0) < 1:
        os.environ[ENV_REPLICAS] = "1"
    ctx.obj = {"url": redis_url, "namespace": namespace}


def announce(ctx: click.Context, app: App, role: str) -> None:
    """Long-running processes say which Redis and namespace they act on; falling back to the
    default URL is a warning, since a reaper on the wrong server reaps someone else's runs."""
    log = logs.get("duetime.cli")
    where = {"redis": redact(app.redis_url), "namespace": app.keys.namespace, "role": role}
    if not ctx.obj["url"] and not os.environ.get(ENV_URL) and app.redis_url == DEFAULT_URL:
        log.warning(f"no --redis-url or {ENV_URL} given: using the default server", **where)
    else:
        log.info("connected", **where)


METRICS_PORT = click.IntRange(1, 65535)
METRICS_PORT_HELP = "Serve /metrics, /healthz and /readyz on this port."
METRICS_HOST_HELP = "Address the metrics port listens on (0.0.0.0 in a container)."


# -- worker -------------------------------------------------------------------------------
@main.command()
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
@click.option("--metrics-port", default=None, type=METRICS_PORT,
              help=METRICS_PORT_HELP + " Process i of --processes: port + i.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help=METRICS_HOST_HELP)
@click.pass_context
@fail_cleanly
def worker(ctx: click.Context, app_ref: str, queues: str | None, concurrency: int,
           processes: int, lease: timedelta, grace: timedelta, claim_ahead: timedelta,
           metrics_port: int | None, metrics_host: str) -> None:
    """Execute runs: claim, run, heartbeat, report."""
    if processes > 1:
        _supervise(processes, metrics_port)
        return
    from duetime.worker.runtime import Worker, WorkerConfig

    app = load_app(app_ref, ctx.obj["url"], ctx.obj["namespace"])
    from duetime.worker.config import parse_queues

    qs, weights = parse_queues(queues or ",".join(app.registry.queues() or ["default"]))
    client = app.store.ready()  # clear error now if Redis is down
    try:
        client.sadd(app.keys.queues, *qs)  # the queue list `top` and the gauges read
        app.publish_tasks()  # producers without the code enqueue by name with these options
    except (redis.exceptions.OutOfMemoryError, RedisRefused) as exc:
        if isinstance(exc, RedisRefused) and exc.code != "OOM":
            raise
        # at maxmemory the worker still starts (heartbeats go on, claims wait); enqueues and
        # the next worker start record the names and the task options
        logs.get("duetime.cli").warning("redis is at maxmemory: queue names and task options "
                                        "not recorded yet", queues=qs)
    announce(ctx, app, "worker")
    metrics.preset(app.registry.names(), qs,
                   {n: app.registry.get(n).owner or "" for n in app.registry.names()})
    metrics.serve(metrics_port, metrics_host, role="worker")
    cfg = WorkerConfig(queues=qs, concurrency=concurrency, lease_ms=duration_ms(lease),
                       grace_s=grace.total_seconds(), claim_ahead_ms=duration_ms(claim_ahead),
                       max_result=app.max_payload, queue_weights=weights)
    w = Worker(app.registry, app.redis_url, app.keys, cfg)
    asyncio.run(w.run())
    # threads of sync tasks that outlived the grace period were released; do not wait for them
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _supervise(n: int, metrics_port: int | None) -> None:
    """--processes N: N single-process workers with the same options, each on its own metrics
    port; a child that dies is restarted (duetime/supervise.py); signals are forwarded."""
    from duetime.supervise import supervise

    sys.exit(supervise(sys.argv[1:], n, metrics_port))


# -- reaper / scheduler ---------------------------------------------------------------
RETENTION_HELP = "How long finished runs (succeeded, missed, skipped, cancelled) are kept."


def _run_reaper(ctx: click.Context, app_ref: str | None, tick: timedelta, retention: timedelta,
                metrics_port: int | None, metrics_host: str = "127.0.0.1") -> None:
    from duetime.scheduler.reaper import Reaper

    app = load_app(app_ref, ctx.obj["url"], ctx.obj["namespace"]) if app_ref else App(
        redis_url=ctx.obj["url"], namespace=ctx.obj["namespace"])
    app.store.ready()
    announce(ctx, app, "reaper")
    metrics.serve(metrics_port, metrics_host, role="reaper")
    reaper = Reaper(app.redis_url, app.keys, tick_s=tick.total_seconds(),
                    retention_ms=duration_ms(retention))
    signal.signal(signal.SIGTERM, lambda *_: reaper.stop())
    signal.signal(signal.SIGINT, lambda *_: reaper.stop())
    reaper.run()


@main.command()
@click.option("--app", "app_ref", default=None, help="module:attribute (optional for the reaper).")
@duration_option("--tick", span=TICK, default="500ms", show_default=True,
                 help="How often expired leases are looked for.")
@duration_option("--retention", span=RETENTION, default="24h", show_default=True,
                 help=RETENTION_HELP)
@click.option("--metrics-port", default=None, type=METRICS_PORT, help=METRICS_PORT_HELP)
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help=METRICS_HOST_HELP)
@click.pass_context
@fail_cleanly
def reaper(ctx: click.Context, app_ref: str | None, tick: timedelta, retention: timedelta,
           metrics_port: int | None, metrics_host: str) -> None:
    """Recover runs whose lease expired (retry, uncertain or dead)."""
    _run_reaper(ctx, app_ref, tick, retention, metrics_port, metrics_host)


@main.command()
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
@click.option("--metrics-port", default=None, type=METRICS_PORT, help=METRICS_PORT_HELP)
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help=METRICS_HOST_HELP)
@click.pass_context
@fail_cleanly
def scheduler(ctx: click.Context, app_ref: str | None, lead: timedelta, tick: timedelta,
              reap_tick: timedelta, retention: timedelta, miss_tolerance: timedelta | None,
              gauges_every: timedelta, metrics_port: int | None, metrics_host: str) -> None:
    """Evaluate schedules into runs, and recover expired leases (run two or more)."""
    from duetime.scheduler.service import run_scheduler

    app = _app_or_plain(ctx, app_ref)
    client = app.store.ready()
    announce(ctx, app, "scheduler")
    known = {q.decode() if isinstance(q, bytes) else q for q in client.smembers(app.keys.queues)}
    metrics.preset_queue_gauges(sorted(known | set(app.registry.queues()) | {"default"}))
    metrics.serve(metrics_port, metrics_host, role="scheduler")
    run_scheduler(app.redis_url, app.keys, lead_ms=duration_ms(lead),
                  tick_s=tick.total_seconds(), reap_tick_s=reap_tick.total_seconds(),
                  miss_tolerance_ms=None if miss_tolerance is None else duration_ms(miss_tolerance),
                  retention_ms=duration_ms(retention),
                  gauge_interval_s=gauges_every.total_seconds())


# -- client commands --------------------------------------------------------------------


@main.command()
@click.argument("task")
@click.option("--app", "app_ref", default=None, help="module:attribute of your App (optional: "
              "without it the task is enqueued by name, with the options its workers published).")
@click.option("--args", "args_json", default="[]", help="JSON list of positional arguments.")
@click.option("--kwargs", "kwargs_json", default="{}", help="JSON object of keyword arguments.")
@instant_option("--at", default=None, help="Due at this instant.")
@duration_option("--delay", span=DELAY, default=None, help="Due this long from now.")
@click.option("--key", default=None, help="Idempotency key: the same key gives the same run.")
@click.option("--queue", default=None, help="Default: the task's queue.")
@click.pass_context
@fail_cleanly
def enqueue(ctx: click.Context, task: str, app_ref: str | None, args_json: str, kwargs_json: str,
            at: datetime | None, delay: timedelta | None, key: str | None,
            queue: str | None) -> None:
    """Create one run of TASK and print its id."""
    args, kwargs = parse_payload(args_json, kwargs_json)
    if at and delay is not None:
        raise click.UsageError("give either --at or --delay, not both")
    app = _app_or_plain(ctx, app_ref)
    run_id = app.enqueue(task, args=args, kwargs=kwargs, at=at, delay=delay, key=key, queue=queue)
    click.echo(run_id)


# -- demo -------------------------------------------------------------------------------
@main.command()
@click.option("--runs", "count", default=300, show_default=True, help="Runs to enqueue.")
@click.option("--workers", default=2, show_default=True, help="Worker processes to start.")
@click.pass_context
@fail_cleanly
def demo(ctx: click.Context, count: int, workers: int) -> None:
    """Enqueue a few hundred runs and watch two worker processes drain them.

    Uses DUETIME_REDIS_URL when set; otherwise starts an embedded Valkey server."""
    from duetime.demo import run_demo

    run_demo(ctx.obj["url"], count, workers)


def _register() -> None:
    """The operator command groups live in their own modules (duetime/cli_*.py)."""
    from duetime.cli_dev import dev
    from duetime.cli_limits import limits
    from duetime.cli_ops import doctor, keys, leases, top, workers
    from duetime.cli_runs import dead, runs, uncertain
    from duetime.cli_schedule import schedule
    from duetime.cli_web import web

    for command in (schedule, runs, dead, uncertain, leases, workers, top, doctor, keys, dev, web,
                    limits):
        main.add_command(command)


_register()

if __name__ == "__main__":  # pragma: no cover
    main()
