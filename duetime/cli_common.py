"""What every `duetime` command module shares: one-line errors, app loading, parsing and
output helpers (tables, JSON, progress bars on stderr so stdout stays parseable)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

import click
import redis

from duetime.app import App
from duetime.common.admin import RunAdmin
from duetime.common.connection import server_time_ms, translated
from duetime.common.errors import DuetimeError, InvalidInput, InvalidSchedule, InvalidTime
from duetime.common.inspect import Inspector
from duetime.common.timefmt import human_duration, iso, relative
from duetime.common.timeparse import Span, from_ms, parse_instant

F = TypeVar("F", bound=Callable[..., Any])

ENV_URL, ENV_NS = "DUETIME_REDIS_URL", "DUETIME_NAMESPACE"
EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


class DuetimeGroup(click.Group):
    """Usage errors as one line on stderr (exit 2) instead of click's three-line block."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else exc.format_message())
            sys.exit(EXIT_USAGE)
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
            click.echo(f"error: {_one_line(exc.format_message())}{hint}", err=True)
            sys.exit(EXIT_USAGE)
        except click.ClickException as exc:
            click.echo(f"error: {_one_line(exc.format_message())}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("aborted", err=True)
            sys.exit(EXIT_FAILED)
        sys.exit(rv if isinstance(rv, int) else 0)


def fail_cleanly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """duetime's own errors become one line on stderr, not a traceback: bad input exits 2
    (like a usage error), anything else that failed (not found, refused, Redis down) exits 1."""

    @functools.wraps(fn)
    def wrapper(*a: Any, **kw: Any) -> Any:
        try:
            return fn(*a, **kw)
        except (InvalidInput, InvalidSchedule) as exc:
            click.echo(f"error: {_one_line(str(exc))}", err=True)
            sys.exit(EXIT_USAGE)
        except DuetimeError as exc:
            click.echo(f"error: {_one_line(str(exc))}", err=True)
            sys.exit(EXIT_FAILED)
        except redis.RedisError as exc:
            click.echo(f"error: redis: {_one_line(str(exc))}", err=True)
            sys.exit(EXIT_FAILED)

    return wrapper


# -- apps -------------------------------------------------------------------------------
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


def plain_app(ctx: click.Context) -> App:
    """An App without tasks, for commands that only read or manage records. Its partition
    count is the namespace's own (from `<ns>:meta`), so any namespace can be inspected; it
    writes nothing until a command changes something."""
    url, ns = ctx.obj["url"], ctx.obj["namespace"]
    app = App(redis_url=url, namespace=ns)
    with translated(app.redis_url):
        stored = app.store.client.hget(app.keys.meta, "partitions")
    if stored is not None and int(stored) != app.keys.partitions:
        app.close()
        app = App(redis_url=url, namespace=ns, partitions=int(stored))
    return app


def app_for(ctx: click.Context, app_ref: str | None) -> App:
    return load_app(app_ref, ctx.obj["url"], ctx.obj["namespace"]) if app_ref else plain_app(ctx)


def inspector(app: App) -> Inspector:
    return Inspector(app.store.client, app.keys, app.redis_url)


def admin(app: App) -> RunAdmin:
    return RunAdmin(app.store.client, app.keys, app.redis_url)


# -- parsing ----------------------------------------------------------------------------
class DurationParam(click.ParamType):
    """A duration option read by the one duration parser and checked against its bounds; a
    bad one is a usage error (one `error:` line naming the option, exit 2)."""

    name = "duration"

    def __init__(self, span: Span) -> None:
        self.span = span

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> timedelta:
        if isinstance(value, timedelta):
            return value
        try:
            return self.span.parse(value)
        except InvalidTime as exc:
            self.fail(str(exc), param, ctx)


class InstantParam(click.ParamType):
    """An ISO-8601 instant with a UTC offset, 1970..9999, as an aware UTC datetime."""

    name = "instant"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            return parse_instant(value)
        except InvalidTime as exc:
            self.fail(str(exc), param, ctx)


def duration_option(*decls: str, span: Span, help: str, **kw: Any) -> Callable[[F], F]:
    """A click option taking a duration; its help states the accepted range."""
    return click.option(*decls, type=DurationParam(span), metavar="DURATION",
                        help=f"{help} Range {span}; e.g. 500ms, 1.5s, 1h30m, PT1H30M.", **kw)


def instant_option(*decls: str, help: str, **kw: Any) -> Callable[[F], F]:
    return click.option(*decls, type=InstantParam(), metavar="INSTANT",
                        help=f"{help} ISO-8601 with a UTC offset, e.g. 2026-03-08T02:30:00Z.",
                        **kw)


def parse_payload(args_json: str, kwargs_json: str) -> tuple[list[Any], dict[str, Any]]:
    try:
        args = json.loads(args_json)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"bad JSON: {exc}", param_hint="--args") from None
    try:
        kwargs = json.loads(kwargs_json)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"bad JSON: {exc}", param_hint="--kwargs") from None
    if not isinstance(args, list):
        raise click.BadParameter("must be a JSON list", param_hint="--args")
    if not isinstance(kwargs, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--kwargs")
    return args, kwargs


# -- output -----------------------------------------------------------------------------
human_s = human_duration  # the table form of a measured duration (one formatter, in timefmt)


def when(dt: datetime | None, now: datetime) -> str:
    """An instant for a table: ISO UTC to the second and how far from now, e.g.
    `2026-03-08T07:30:00Z (in 3 minutes)`; '-' for none."""
    return f"{iso(dt, compact=True)} ({relative(dt, now)})" if dt else "-"


def server_now(app: App) -> datetime:
    """The server's clock: it decides when runs are due, so relative times are measured on it."""
    with translated(app.redis_url):
        return from_ms(server_time_ms(app.store.client))


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if c in (None, "") else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


@contextlib.contextmanager
def progress(total: int, label: str) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr (stdout stays clean for --json and ids); yields `advance(n)`."""
    with click.progressbar(length=max(total, 1), label=label, file=sys.stderr,
                           show_pos=True) as bar:
        yield bar.update


def interrupted(done: int, total: int, what: str, again: str) -> None:
    """Ctrl-C in a bulk operation: every step is atomic, so say where it stopped and exit."""
    click.echo(f"\ninterrupted after {done} of {total} {what}; each was done completely, "
               f"none partly. Run `{again}` again to continue.", err=True)
    sys.exit(EXIT_INTERRUPTED)
