"""The `duetime` command: wires the components together for operators."""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

import click

from common import logs, metrics
from common.errors import DuetimeError, InvalidInput
from duetime.app import App

ENV_URL, ENV_NS = "DUETIME_REDIS_URL", "DUETIME_NAMESPACE"


def fail_cleanly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """duetime's own errors become one line on stderr and exit code 1, not a traceback."""

    @functools.wraps(fn)
    def wrapper(*a: Any, **kw: Any) -> Any:
        try:
            return fn(*a, **kw)
        except DuetimeError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)

    return wrapper


def load_app(ref: str, url: str | None, namespace: str | None) -> App:
    """`package.module:attr` → the App object (operator configuration, never data)."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise click.BadParameter(f"expected module:attribute, got {ref!r}", param_hint="--app")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {module_name!r}: {exc}", param_hint="--app") from None
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise click.BadParameter(f"{ref!r} is not a duetime App", param_hint="--app")
    app.configure(redis_url=url, namespace=namespace)
    return app


def parse_seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for suffix in ("ms", "s", "m", "h"):
        if text.endswith(suffix) and text[: -len(suffix)].replace(".", "", 1).isdigit():
            return float(text[: -len(suffix)]) * units[suffix]
    try:
        return float(text)
    except ValueError:
        raise click.BadParameter(f"not a duration: {text!r} (e.g. 500ms, 10s, 2m)") from None


@click.group()
@click.option("--redis-url", envvar=ENV_URL, default=None, help=f"Redis URL (env {ENV_URL}).")
@click.option("--namespace", envvar=ENV_NS, default=None, help=f"Key namespace (env {ENV_NS}).")
@click.option("--log-level", default="INFO", show_default=True)
@click.pass_context
def main(ctx: click.Context, redis_url: str | None, namespace: str | None, log_level: str) -> None:
    """duetime: a Redis-backed distributed job scheduler."""
    logs.configure(log_level)
    ctx.obj = {"url": redis_url, "namespace": namespace}


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
@click.option("--metrics-port", default=None, type=int, help="Serve Prometheus metrics here.")
@click.pass_context
@fail_cleanly
def worker(ctx: click.Context, app_ref: str, queues: str | None, concurrency: int,
           processes: int, lease: str, grace: str, metrics_port: int | None) -> None:
    """Execute runs: claim, run, heartbeat, report."""
    if processes > 1:
        _supervise(processes, metrics_port)
        return
    from worker.runtime import Worker, WorkerConfig

    app = load_app(app_ref, ctx.obj["url"], ctx.obj["namespace"])
    qs = [q.strip() for q in (queues or ",".join(app.registry.queues() or ["default"])).split(",")
          if q.strip()]
    for q in qs:
        from common.names import check_name

        check_name("queue", q)
    app.store.ready()  # clear error now if Redis is down or the partition count differs
    metrics.serve(metrics_port)
    cfg = WorkerConfig(queues=qs, concurrency=concurrency, lease_ms=int(parse_seconds(lease) * 1000),
                       grace_s=parse_seconds(grace))
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
    from scheduler.reaper import Reaper

    app = load_app(app_ref, ctx.obj["url"], ctx.obj["namespace"]) if app_ref else App(
        redis_url=ctx.obj["url"], namespace=ctx.obj["namespace"])
    app.store.ready()
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
@click.option("--metrics-port", default=None, type=int)
@click.pass_context
@fail_cleanly
def scheduler(ctx: click.Context, app_ref: str | None, lead: str, tick: str, reap_tick: str,
              retention: str, miss_tolerance: str, metrics_port: int | None) -> None:
    """Evaluate schedules into runs, and recover expired leases (run two or more)."""
    from scheduler.service import run_scheduler

    app = _app_or_plain(ctx, app_ref)
    app.store.ready()
    metrics.serve(metrics_port)
    run_scheduler(app.redis_url, app.keys, lead_ms=int(parse_seconds(lead) * 1000),
                  tick_s=parse_seconds(tick), reap_tick_s=parse_seconds(reap_tick),
                  miss_tolerance_ms=int(parse_seconds(miss_tolerance) * 1000),
                  retention_ms=int(parse_seconds(retention) * 1000))


# -- client commands --------------------------------------------------------------------
def _app_or_plain(ctx: click.Context, app_ref: str | None) -> App:
    if app_ref:
        return load_app(app_ref, ctx.obj["url"], ctx.obj["namespace"])
    return App(redis_url=ctx.obj["url"], namespace=ctx.obj["namespace"])


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
    try:
        args, kwargs = json.loads(args_json), json.loads(kwargs_json)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"bad JSON: {exc}") from None
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise click.BadParameter("--args must be a JSON list and --kwargs a JSON object")
    when = None
    if at:
        try:
            when = datetime.fromisoformat(at)
        except ValueError:
            raise click.BadParameter(f"not an ISO-8601 instant: {at!r}") from None
        if when.tzinfo is None:
            raise InvalidInput(f"--at {at!r} has no UTC offset; add one (e.g. +00:00)")
    app = _app_or_plain(ctx, app_ref)
    run_id = app.enqueue(task, args=args, kwargs=kwargs, at=when,
                         delay=parse_seconds(delay) if delay else None, key=key, queue=queue)
    click.echo(run_id)


@main.group()
def runs() -> None:
    """Inspect runs."""


@runs.command("show")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@fail_cleanly
def runs_show(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """A run's record and every attempt."""
    from duetime.render import run_to_dict, run_to_text

    run = _app_or_plain(ctx, None).get_run(run_id)
    click.echo(json.dumps(run_to_dict(run), indent=2) if as_json else run_to_text(run))


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


if __name__ == "__main__":  # pragma: no cover
    main()
