"""`duetime demo`: a scheduler-less tour — enqueue a few hundred runs, drain them with two
worker processes and a reaper, then print what happened to every run."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import ExitStack
from datetime import timedelta

import click

from duetime.app import App
from duetime.ops.render import run_to_text


def run_demo(url: str | None, count: int, workers: int) -> None:
    with ExitStack() as stack:
        if not url:
            from duetime.embedded import local_server

            server = stack.enter_context(local_server())
            url = server.url
            click.echo(f"started an embedded {server.kind.capitalize()} server at {url}")
        namespace = f"demo{os.getpid()}"
        from duetime import demo_app

        app: App = demo_app.app
        app.configure(redis_url=url, namespace=namespace)

        items: list[tuple[object, list[object]]] = []
        for i in range(count):
            if i % 50 == 7:
                items.append((demo_app.broken, [i]))
            elif i % 10 == 3:
                items.append((demo_app.flaky, [i]))
            else:
                items.append((demo_app.resize, [f"img-{i}.png", 640]))
        t0 = time.perf_counter()
        ids = app.enqueue_many(items)
        delayed = app.enqueue(demo_app.resize, ["later.png", 320], delay=timedelta(seconds=1))
        ids.append(delayed)
        click.echo(f"enqueued {len(ids)} runs in {(time.perf_counter() - t0) * 1000:.0f} ms "
                   f"(one of them due in 1 s)")

        from duetime.scheduler.reaper import Reaper

        reaper = Reaper(url, app.keys, tick_s=0.5)
        threading.Thread(target=reaper.run, daemon=True).start()
        env = {**os.environ, "DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": namespace}
        procs = [
            subprocess.Popen([sys.executable, "-m", "duetime", "--log-level", "WARNING", "worker",
                              "--app", "duetime.demo_app:app", "--concurrency", "32",
                              "--grace", "5s"], env=env)
            for _ in range(workers)
        ]
        click.echo(f"started {workers} worker processes: {[p.pid for p in procs]}")
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                states = Counter(app.get_run(r).state for r in ids)
                if states["succeeded"] + states["dead"] == len(ids):
                    break
                time.sleep(0.3)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(15)
            reaper.stop()
        elapsed = time.perf_counter() - t0
        runs = [app.get_run(r) for r in ids]
        states = Counter(r.state for r in runs)
        by_worker = Counter(r.worker.split(":")[1] if r.worker else "-" for r in runs)
        retried = sum(1 for r in runs if len(r.attempts) > 1)
        click.echo(f"\nall {len(ids)} runs finished in {elapsed:.2f} s: {dict(states)}")
        click.echo(f"runs per worker pid: {dict(by_worker)}; runs retried once: {retried}")
        flaky = next(r for r in runs if r.task == "demo.flaky")
        dead = next(r for r in runs if r.state == "dead")
        click.echo("\na flaky run (failed, retried with backoff, succeeded):")
        click.echo(run_to_text(flaky))
        click.echo("\na dead-lettered run (raised Fatal; owner is told who fixes it):")
        click.echo(run_to_text(dead))
        app.close()
