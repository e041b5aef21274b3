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
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
import redis

from duetime.app import App
from duetime.common import logs
from duetime.common.connection import DEFAULT_URL, redact, server_time_ms, translated
from duetime.common.durability import ENV_REPLICAS, ENV_TIMEOUT
from duetime.common.errors import DamagedState, DuetimeError, InvalidInput, InvalidSchedule, InvalidTime
from duetime.common.keys import stored_partitions
from duetime.common.time.fmt import human_duration, iso, relative
from duetime.common.time.parse import Span, from_ms, parse_instant

if TYPE_CHECKING:
    from duetime.ops.admin import RunAdmin
    from duetime.ops.inspect import Inspector

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
X = TypeVar("X")

ENV_URL, ENV_NS = "DUETIME_REDIS_URL", "DUETIME_NAMESPACE"
EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


GLOBAL_OPTIONS = ("--redis-url", "--namespace", "--log-level")  # each takes a value


def hoist_global_options(args: list[str]) -> list[str]:
    """`duetime runs list --redis-url U` means `duetime --redis-url U runs list`: the global
    options may come after the subcommand too (they are moved before it); a `--json` given
    before the subcommand goes to the command that prints."""
    head, i = [], 0
    while i < len(args) and args[i].startswith("-"):  # what comes before the subcommand
        head.append(args[i])
        if args[i] in GLOBAL_OPTIONS and i + 1 < len(args):
            head.append(args[i + 1])
            i += 1
        i += 1
    moved, kept, tail, j = [], [], args[i:], 0
    while j < len(tail):
        a = tail[j]
        if a == "--":
            kept += tail[j:]
            break
        if a.split("=", 1)[0] in GLOBAL_OPTIONS:
            take = 1 if "=" in a or j + 1 == len(tail) else 2
            moved += tail[j : j + take]
            j += take
            continue
        kept.append(a)
        j += 1
    if "--json" in head and kept:
        head.remove("--json")
        kept.append("--json")
    return head + moved + kept


class DuetimeGroup(click.Group):
    """Usage errors as one line on stderr (exit 2) instead of click's three-line block; global
    options accepted after the subcommand too."""

    def __init__(self, *args: Any, lazy_commands: dict[str, tuple[str, str]] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands or {})  # name -> (module, attribute)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy_commands:
            module, attr = self.lazy_commands[cmd_name]
            command = getattr(importlib.import_module(module), attr)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if ctx.parent is None:
            args = hoist_global_options(list(args))
        return super().parse_args(ctx, args)

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
    except Exception as exc:  # noqa: BLE001 - the user's module failed: say so, in one line
        raise click.BadParameter(f"importing {module_name!r} raised {type(exc).__name__}: {exc}",
                                 param_hint="--app") from None
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise click.BadParameter(f"{ref!r} is not a duetime App", param_hint="--app")
    app.configure(redis_url=url, namespace=namespace)
    # an app made with wait_replicas=N: the worker's or scheduler's own clients follow it,
    # unless --durability or the environment said otherwise
    if app.durability.on and not os.environ.get(ENV_REPLICAS):
        os.environ[ENV_REPLICAS] = str(app.durability.replicas)
        os.environ[ENV_TIMEOUT] = str(app.durability.timeout_ms)
    return app


def plain_app(ctx: click.Context, wait_as: str | None = None) -> App:
    """An App without tasks, for commands that only read or manage records. Its partition
    count is the namespace's own (from `<ns>:meta`), so any namespace can be inspected; it
    writes nothing until a command changes something. `wait_as`: a long-running process of
    that role, which waits for a server not up yet (common/startup.py) instead of failing."""
    url, ns = ctx.obj["url"], ctx.obj["namespace"]
    app = App(redis_url=url, namespace=ns)
    note_default_server(ctx, app)
    if wait_as is not None:
        from duetime.common.startup import answers, wait_for_server

        wait_for_server(lambda: answers(app.store.client), app.redis_url, wait_as)
    with translated(app.redis_url):
        raw = app.store.client.hget(app.keys.meta, "partitions")
    try:
        stored = stored_partitions(raw, app.keys.meta)
    except DamagedState as exc:
        app.close()
        raise click.ClickException(str(exc)) from None
    if stored is not None and stored != app.keys.partitions:
        app.close()
        app = App(redis_url=url, namespace=ns, partitions=stored)
    return app


def note_default_server(ctx: click.Context, app: App) -> None:
    """With no URL configured, say once (stderr) which server is read, rather than silently
    reading 127.0.0.1:6379."""
    root = ctx.find_root()
    if root.obj.get("url") or os.environ.get(ENV_URL) or root.obj.get("noted"):
        return
    root.obj["noted"] = True
    click.echo(f"note: no --redis-url or {ENV_URL} given: using {redact(app.redis_url)} "
               f"(namespace {app.keys.namespace!r})", err=True)


def app_for(ctx: click.Context, app_ref: str | None, wait_as: str | None = None) -> App:
    if not app_ref:
        return plain_app(ctx, wait_as)
    app = load_app(app_ref, ctx.obj["url"], ctx.obj["namespace"])
    if wait_as is not None:
        from duetime.common.startup import answers, wait_for_server

        wait_for_server(lambda: answers(app.store.client), app.redis_url, wait_as)
    return app


def inspector(app: App) -> Inspector:
    from duetime.ops.inspect import Inspector  # operator tools: loaded by the commands that use them

    return Inspector(app.store.client, app.keys, app.redis_url)


def admin(app: App) -> RunAdmin:
    from duetime.ops.admin import RunAdmin

    return RunAdmin(app.store.client, app.keys, app.redis_url)


# -- parsing ----------------------------------------------------------------------------
# click >= 8.4 makes ParamType generic; subscripting it would fail on the 8.1 floor
class DurationParam(click.ParamType):  # type: ignore[type-arg]
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


class InstantParam(click.ParamType):  # type: ignore[type-arg]  # as DurationParam
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


def run_id_arg(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A RUN_ID argument checked before anything is read (one error line, no round trip)."""
    if value is not None:
        from duetime.common.names import check_name

        try:
            check_name("run id", value)
        except InvalidInput as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    return value


def _json(text: str, option: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"bad JSON: {exc}", param_hint=option) from None
    except RecursionError:
        raise click.BadParameter("nested too deeply", param_hint=option) from None


def parse_payload(args_json: str, kwargs_json: str) -> tuple[list[Any], dict[str, Any]]:
    args, kwargs = _json(args_json, "--args"), _json(kwargs_json, "--kwargs")
    if not isinstance(args, list):
        raise click.BadParameter("must be a JSON list", param_hint="--args")
    if not isinstance(kwargs, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--kwargs")
    return args, kwargs


# -- output -----------------------------------------------------------------------------
human_s = human_duration  # the table form of a measured duration (one formatter, in common/time/fmt.py)


def when(dt: datetime | None, now: datetime) -> str:
    """An instant for a table: ISO UTC to the second and how far from now, e.g.
    `2026-03-08T07:30:00Z (in 3 minutes)`; '-' for none."""
    return f"{iso(dt, compact=True)} ({relative(dt, now)})" if dt else "-"


def server_now(app: App) -> datetime:
    """The server's clock: it decides when runs are due, so relative times are measured on it."""
    with translated(app.redis_url):
        return from_ms(server_time_ms(app.store.client))


def _jsonable(o: Any) -> Any:
    """msgpack values JSON cannot carry: bytes as hex, anything else as its text."""
    return o.hex() if isinstance(o, bytes) else str(o)


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=_jsonable))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if c in (None, "") else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def echo_listing(as_json: bool, items: Sequence[X], to_dict: Callable[[X], object],
                 headers: Sequence[str], rows: Callable[[], Sequence[Sequence[Any]]]) -> None:
    """A listing: a JSON list (one object per item), or a table whose rows `rows()` builds
    (only then: a table may need the server's time, JSON never does)."""
    if as_json:
        echo_json([to_dict(i) for i in items])
    else:
        click.echo(table(headers, rows()))


@contextlib.contextmanager
def progress(total: int, label: str) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr (stdout stays clean for --json and ids); yields `advance(n)`."""
    with click.progressbar(length=max(total, 1), label=label, file=sys.stderr,
                           show_pos=True) as bar:
        yield bar.update


def interrupted(done: int, total: int, what: str, again: str) -> NoReturn:
    """Ctrl-C in a bulk operation: every step is atomic, so say where it stopped and exit."""
    click.echo(f"\ninterrupted after {done} of {total} {what}; each was done completely, "
               f"none partly. Run `{again}` again to continue.", err=True)
    sys.exit(EXIT_INTERRUPTED)


def counted(total: int, label: str, what: str, again: str,
            work: Callable[[Callable[[int], None]], T]) -> T:
    """`work(step)` under a progress bar of `total`, `step(n)` saying n more are done; Ctrl-C
    says how many of the `total` `what` were done and how to go on (`interrupted`)."""
    done = 0

    def step(n: int) -> None:
        nonlocal done
        done += n
        advance(n)

    try:
        with progress(total, label) as advance:
            return work(step)
    except KeyboardInterrupt:
        interrupted(done, total, what, again)


METRICS_PORT = click.IntRange(1, 65535)
METRICS_PORT_HELP = "Serve /metrics, /healthz and /readyz on this port."
METRICS_HOST_HELP = "Address the metrics port listens on (0.0.0.0 in a container)."


def metrics_options(port_note: str = "") -> Callable[[F], F]:
    """--metrics-port and --metrics-host of a long-running process (`port_note` added to the
    port's help)."""
    def wrap(f: F) -> F:
        f = click.option("--metrics-host", default="127.0.0.1", show_default=True,
                         help=METRICS_HOST_HELP)(f)
        return click.option("--metrics-port", default=None, type=METRICS_PORT,
                            help=f"{METRICS_PORT_HELP} {port_note}".rstrip())(f)
    return wrap


def announce(ctx: click.Context, app: App, role: str) -> None:
    """Long-running processes say which Redis and namespace they act on; falling back to the
    default URL is a warning, since a reaper on the wrong server reaps someone else's runs."""
    log = logs.get("duetime.cli")
    where = {"redis": redact(app.redis_url), "namespace": app.keys.namespace, "role": role}
    if not ctx.obj["url"] and not os.environ.get(ENV_URL) and app.redis_url == DEFAULT_URL:
        log.warning(f"no --redis-url or {ENV_URL} given: using the default server", **where)
    else:
        log.info("connected", **where)

