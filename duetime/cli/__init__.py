"""The `duetime` command: the global options, and every subcommand by the module that holds it.

Subcommands are imported when invoked (or when `--help` lists them), so a worker or scheduler
process loads its own command's modules and nothing of the operator tools, the console or the
other commands (tests/packaging/test_process_modules.py)."""

from __future__ import annotations

import os

import click

from duetime import __version__
from duetime.cli.common import ENV_NS, ENV_URL, DuetimeGroup
from duetime.common import logs
from duetime.common.durability import ENV_REPLICAS, ENV_TIMEOUT

COMMANDS = {  # name -> (module, attribute)
    "worker": ("duetime.cli.worker", "worker"),
    "scheduler": ("duetime.cli.scheduler", "scheduler"),
    "reaper": ("duetime.cli.scheduler", "reaper"),
    "enqueue": ("duetime.cli.enqueue", "enqueue"),
    "demo": ("duetime.cli.demo", "demo"),
    "dev": ("duetime.cli.dev", "dev"),
    "schedule": ("duetime.cli.schedule", "schedule"),
    "runs": ("duetime.cli.runs", "runs"),
    "dead": ("duetime.cli.runs", "dead"),
    "uncertain": ("duetime.cli.runs", "uncertain"),
    "leases": ("duetime.cli.ops", "leases"),
    "workers": ("duetime.cli.ops", "workers"),
    "top": ("duetime.cli.ops", "top"),
    "doctor": ("duetime.cli.ops", "doctor"),
    "keys": ("duetime.cli.ops", "keys"),
    "migrate": ("duetime.cli.ops", "migrate"),
    "web": ("duetime.cli.web", "web"),
    "limits": ("duetime.cli.limits", "limits"),
    "queue": ("duetime.cli.queue", "queue"),
    "calendar": ("duetime.cli.calendar", "calendar"),
    "batches": ("duetime.cli.batches", "batches"),
    "retention": ("duetime.cli.retention", "retention"),
    "outbox": ("duetime.cli.outbox", "outbox"),
}


@click.group(cls=DuetimeGroup, lazy_commands=COMMANDS)
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
    if namespace is not None and not namespace.strip():
        # an empty namespace would silently mean the default one: another team's keys
        raise click.BadParameter("must not be empty (omit it for the default, 'duetime')",
                                 param_hint="--namespace")
    if namespace is not None:
        from duetime.common.errors import InvalidInput
        from duetime.common.names import check_name

        try:
            check_name("namespace", namespace)
        except InvalidInput as exc:
            raise click.BadParameter(str(exc), param_hint="--namespace") from None
    # every client this process (and the worker processes it starts) makes follows it
    if durability == "async":
        os.environ[ENV_REPLICAS] = "0"
    elif durability == "replicated" and int(os.environ.get(ENV_REPLICAS) or 0) < 1:
        os.environ[ENV_REPLICAS] = "1"
    ctx.obj = {"url": redis_url, "namespace": namespace}


if __name__ == "__main__":  # pragma: no cover
    main()
