"""`duetime dev`: a whole deployment on one machine — an embedded server (unless a Redis URL is
configured), a scheduler (evaluator, reaper, gauges) and worker processes — running until
Ctrl-C. With `--app`, the workers run your app and restart when its code changes (`duetime
worker --reload`); without, they run the demo app and sample schedules are declared."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from contextlib import ExitStack
from datetime import timedelta

import click

from duetime.app import App
from duetime.common import metrics
from duetime.common.time.spec import Cron, Every

SAMPLES = (
    ("dev.thumbnails", Every(timedelta(seconds=5)), "demo.resize", ["thumb.png", 128]),
    ("dev.flaky-import", Every(timedelta(seconds=15)), "demo.flaky", [0]),
    ("dev.nightly-report", Cron("30 2 * * *", tz="Europe/Paris"), "demo.resize", ["report.png", 2048]),
)


def run_dev(url: str | None, namespace: str | None, workers: int, metrics_port: int | None,
            app_ref: str | None = None, reload: bool = False) -> None:
    from duetime.scheduler.evaluator import Evaluator
    from duetime.scheduler.gauges import Gauges
    from duetime.scheduler.reaper import Reaper

    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    embedded = not url
    with ExitStack() as stack:
        if not url:
            from duetime.embedded import local_server

            server = stack.enter_context(local_server())
            url = server.url
            click.echo(f"started an embedded {server.kind.capitalize()} server at {url}")
        app: App
        if app_ref is None:
            from duetime import demo_app

            app, worker_app = demo_app.app, "duetime.demo_app:app"
        else:
            from duetime.cli.common import load_app

            app, worker_app = load_app(app_ref, None, None), app_ref
        app.configure(redis_url=url, namespace=namespace)
        app.store.ready()
        ns = app.keys.namespace
        created = []
        for name, trigger, task, args in SAMPLES if app_ref is None else ():
            status = app.schedule(name, trigger, task, args, catchup="latest")
            click.echo(f"schedule {name}: {trigger.describe()} ({status})")
            if status == "created":
                created.append(name)
        metrics.serve(metrics_port, role="scheduler")
        parts: list[Evaluator | Reaper | Gauges] = [
            Evaluator(url, app.keys, lead_ms=1000), Reaper(url, app.keys, tick_s=0.5),
            Gauges(url, app.keys, interval_s=2.0)]
        threads = [threading.Thread(target=x.run, name=type(x).__name__, daemon=True) for x in parts]
        for t in threads:
            t.start()
        env = {**os.environ, "DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": ns}
        procs = []
        for i in range(workers):
            extra = ["--metrics-port", str(metrics_port + 1 + i)] if metrics_port else []
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "duetime", "--log-level", "WARNING", "worker", "--app",
                 worker_app, "--concurrency", "16", "--grace", "5s", *extra,
                 *(["--reload"] if reload else [])],
                env=env, start_new_session=True))
        click.echo(f"scheduler running here; {workers} worker process(es) of {worker_app}"
                   f"{' (restarted on code changes)' if reload else ''}: {[p.pid for p in procs]}")
        click.echo("\nin another shell:\n"
                   f"  export DUETIME_REDIS_URL={url} DUETIME_NAMESPACE={ns}\n"
                   "  duetime top            # live view\n"
                   "  duetime runs list      # what ran, what is due\n"
                   "  duetime schedule list\n"
                   "Ctrl-C stops everything.", err=False)
        try:
            while not stop.wait(0.5):
                for p in procs:
                    if p.poll() is not None:
                        click.echo(f"worker {p.pid} exited with {p.returncode}", err=True)
                        stop.set()
        finally:
            click.echo("stopping workers and the scheduler ...")
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
            for x in parts:
                x.stop()
            for t in threads:
                t.join(5)
            if not embedded:
                _remove_samples(app, created)
            app.close()
        click.echo("stopped")


def _remove_samples(app: App, names: list[str]) -> None:
    """On a real server, leave it as found: delete the sample schedules this run created (not
    ones that were there before — another `duetime dev` may be using them) and cancel their
    runs that had not started, which no worker would otherwise pick up."""
    from duetime.ops.inspect import Inspector

    insp = Inspector(app.store.client, app.keys, app.redis_url)
    cancelled = 0
    for name in names:
        app.delete_schedule(name)
        for state in ("scheduled", "retrying"):
            for run in insp.list_runs(state, schedule=name, limit=1000).runs:
                app.cancel(run.id, reason="duetime dev stopped")
                cancelled += 1
    if names:
        click.echo(f"removed the sample schedules it created ({', '.join(names)}); "
                   f"cancelled {cancelled} run(s) not started")
