"""The `duetime` command: wires the components together for operators."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from typing import Any

import click

from duetime import __version__
from duetime.app import App
from duetime.cli_common import (
    ENV_NS,
    ENV_URL,
    DuetimeGroup,
    fail_cleanly,
    load_app,
    parse_instant,
    parse_payload,
    parse_seconds,
)
from duetime.cli_common import (
    app_for as _app_or_plain,
)
from duetime.common import logs, metrics
from duetime.common.connection import DEFAULT_URL, redact


@click.group(cls=DuetimeGroup)
@click.option("--redis-url", envvar=ENV_URL, default=None, help=f"Redis URL (env {ENV_URL}).")
@click.option("--namespace", envvar=ENV_NS, default=None, help=f"Key namespace (env {ENV_NS}).")
@click.option("--log-level", default="INFO", show_default=True)
@click.version_option(__version__, "--version", prog_name="duetime", message="%(prog)s %(version)s")
@click.pass_context
def main(ctx: click.Context, redis_url: str | None, namespace: str | None, log_level: str) -> None:
    """duetime: a Redis-backed distributed job scheduler."""
    logs.configure(log_level)
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


# -- worker -------------------------------------------------------------------------------
@main.command()
@click.option("--app", "app_ref", required=True, help="module:attribute of your App.")
@click.option("--queues", default=None, help="Comma-separated, highest priority first "
              "(default: the queues of the app's tasks).")
@click.option("--concurrency", default=16, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--processes", default=1, show_default=True, type=click.IntRange(1, 256))
@click.option("--lease", default="10s", show_default=True, help="Lease length; heartbeats "
              "renew it every third of it.")
@click.option("--grace", default="30s", show_default=True, help="SIGTERM: time in-flight runs "
              "get to finish before they are released.")
@click.option("--claim-ahead", default="10ms", show_default=True, help="Claim runs due this "
              "soon and start each exactly at its due time (0 = claim only when due).")
@click.option("--metrics-port", default=None, type=int, help="Serve Prometheus metrics here.")
@click.pass_context
@fail_cleanly
def worker(ctx: click.Context, app_ref: str, queues: str | None, concurrency: int,
           processes: int, lease: str, grace: str, claim_ahead: str,
           metrics_port: int | None) -> None:
    """Execute runs: claim, run, heartbeat, report."""
    if processes > 1:
        _supervise(processes, metrics_port)
        return
    from duetime.worker.runtime import Worker, WorkerConfig

    app = load_app(app_ref, ctx.obj["url"], ctx.obj["namespace"])
    qs = [q.strip() for q in (queues or ",".join(app.registry.queues() or ["default"])).split(",")
          if q.strip()]
    for q in qs:
        from duetime.common.names import check_name

        check_name("queue", q)
    app.store.ready().sadd(app.keys.queues, *qs)  # clear error now if Redis is down
    announce(ctx, app, "worker")
    metrics.serve(metrics_port)
    cfg = WorkerConfig(queues=qs, concurrency=concurrency, lease_ms=int(parse_seconds(lease) * 1000),
                       grace_s=parse_seconds(grace),
                       claim_ahead_ms=int(parse_seconds(claim_ahead) * 1000))
    w = Worker(app.registry, app.redis_url, app.keys, cfg)
    asyncio.run(w.run())
    # threads of sync tasks that outlived the grace period were released; do not wait for them
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _supervise(n: int, metrics_port: int | None) -> None:
    """--processes N: N single-process workers with the same options; signals forwarded."""
    argv = [a for a in sys.argv[1:]]
    cleaned: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--processes", "--metrics-port"):
            skip = True
            continue
        if a.startswith(("--processes=", "--metrics-port=")):
            continue
        cleaned.append(a)
    children = []
    for i in range(n):
        extra = ["--metrics-port", str(metrics_port + i)] if metrics_port else []
        children.append(subprocess.Popen([sys.executable, "-m", "duetime", *cleaned, *extra]))

    def forward(signum: int, _frame: Any) -> None:
        for c in children:
            if c.poll() is None:
                c.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [c.wait() for c in children]
    sys.exit(max(codes))


# -- reaper / scheduler ---------------------------------------------------------------
RETENTION_HELP = "How long finished runs (succeeded, missed, skipped, cancelled) are kept."


def _run_reaper(ctx: click.Context, app_ref: str | None, tick: str, retention: str,
                metrics_port: int | None) -> None:
    from duetime.scheduler.reaper import Reaper

    app = load_app(app_ref, ctx.obj["url"], ctx.obj["namespace"]) if app_ref else App(
        redis_url=ctx.obj["url"], namespace=ctx.obj["namespace"])
    app.store.ready()
    announce(ctx, app, "reaper")
    metrics.serve(metrics_port)
    reaper = Reaper(app.redis_url, app.keys, tick_s=parse_seconds(tick),
                    retention_ms=int(parse_seconds(retention) * 1000))
    signal.signal(signal.SIGTERM, lambda *_: reaper.stop())
    signal.signal(signal.SIGINT, lambda *_: reaper.stop())
    reaper.run()


@main.command()
@click.option("--app", "app_ref", default=None, help="module:attribute (optional for the reaper).")
@click.option("--tick", default="500ms", show_default=True)
@click.option("--retention", default="24h", show_default=True, help=RETENTION_HELP)
@click.option("--metrics-port", default=None, type=int)
@click.pass_context
@fail_cleanly
def reaper(ctx: click.Context, app_ref: str | None, tick: str, retention: str,
           metrics_port: int | None) -> None:
    """Recover runs whose lease expired (retry, uncertain or dead)."""
    _run_reaper(ctx, app_ref, tick, retention, metrics_port)


@main.command()
@click.option("--app", "app_ref", default=None, help="module:attribute (optional).")
@click.option("--lead", default="2s", show_default=True,
              help="Create runs this long before they are due.")
@click.option("--tick", default="250ms", show_default=True)
@click.option("--reap-tick", default="500ms", show_default=True)
@click.option("--retention", default="24h", show_default=True, help=RETENTION_HELP)
@click.option("--miss-tolerance", default="10s", show_default=True,
              help="An occurrence evaluated later than this after its instant was missed and "
              "follows the schedule's catch-up policy.")
@click.option("--gauges-every", default="5s", show_default=True,
              help="How often the queue gauges (backlog, oldest due, ...) are recomputed.")
@click.option("--metrics-port", default=None, type=int)
@click.pass_context
@fail_cleanly
def scheduler(ctx: click.Context, app_ref: str | None, lead: str, tick: str, reap_tick: str,
              retention: str, miss_tolerance: str, gauges_every: str,
              metrics_port: int | None) -> None:
    """Evaluate schedules into runs, and recover expired leases (run two or more)."""
    from duetime.scheduler.service import run_scheduler

    app = _app_or_plain(ctx, app_ref)
    app.store.ready()
    announce(ctx, app, "scheduler")
    metrics.serve(metrics_port)
    run_scheduler(app.redis_url, app.keys, lead_ms=int(parse_seconds(lead) * 1000),
                  tick_s=parse_seconds(tick), reap_tick_s=parse_seconds(reap_tick),
                  miss_tolerance_ms=int(parse_seconds(miss_tolerance) * 1000),
                  retention_ms=int(parse_seconds(retention) * 1000),
                  gauge_interval_s=parse_seconds(gauges_every))


# -- client commands --------------------------------------------------------------------


@main.command()
@click.argument("task")
@click.option("--app", "app_ref", required=True)
@click.option("--args", "args_json", default="[]", help="JSON list of positional arguments.")
@click.option("--kwargs", "kwargs_json", default="{}", help="JSON object of keyword arguments.")
@click.option("--at", default=None, help="ISO-8601 instant with offset.")
@click.option("--delay", default=None, help="e.g. 30s, 5m.")
@click.option("--key", default=None, help="Idempotency key.")
@click.option("--queue", default=None)
@click.pass_context
@fail_cleanly
def enqueue(ctx: click.Context, task: str, app_ref: str, args_json: str, kwargs_json: str,
            at: str | None, delay: str | None, key: str | None, queue: str | None) -> None:
    """Create one run of TASK and print its id."""
    args, kwargs = parse_payload(args_json, kwargs_json)
    if at and delay:
        raise click.UsageError("give either --at or --delay, not both")
    when = parse_instant(at, "--at") if at else None
    app = _app_or_plain(ctx, app_ref)
    run_id = app.enqueue(task, args=args, kwargs=kwargs, at=when,
                         delay=parse_seconds(delay) if delay else None, key=key, queue=queue)
    click.echo(run_id)


# -- demo -------------------------------------------------------------------------------
@main.command()
@click.option("--runs", "count", default=300, show_default=True)
@click.option("--workers", default=2, show_default=True)
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
    from duetime.cli_ops import doctor, keys, leases, top, workers
    from duetime.cli_runs import dead, runs, uncertain
    from duetime.cli_schedule import schedule
    from duetime.cli_web import web

    for command in (schedule, runs, dead, uncertain, leases, workers, top, doctor, keys, dev, web):
        main.add_command(command)


_register()

if __name__ == "__main__":  # pragma: no cover
    main()
