"""`duetime web`: the operator console in a browser (the `web` extra)."""

from __future__ import annotations

import ipaddress
import re

import click

from duetime.cli.common import fail_cleanly, plain_app
from duetime.common.connection import redact

ENV_TOKEN = "DUETIME_WEB_WRITE_TOKEN"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def valid_host(host: str) -> bool:
    """An IP address or a DNS host name (RFC 1123 labels)."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    name = host[:-1] if host.endswith(".") else host
    return 0 < len(name) <= 253 and all(_LABEL.fullmatch(x) for x in name.split("."))


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (anything but loopback exposes the console).")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535),
              help="Port the console listens on.")
@click.option("--write-token", envvar=ENV_TOKEN, default=None,
              help=f"Allow actions (pause, trigger, replay, resolve, cancel) to whoever enters this "
              f"token in the browser; without it the console only reads. Prefer env {ENV_TOKEN} "
              "(a command line is visible to other users).")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="A host name the console answers to besides the bound address and the "
              "loopback names (repeatable): any other Host header is refused (DNS rebinding).")
@click.pass_context
@fail_cleanly
def web(ctx: click.Context, host: str, port: int, write_token: str | None,
        allowed_hosts: tuple[str, ...]) -> None:
    """Serve the web console: overview, schedules, runs, dead letters, uncertain runs, leases,
    workers. Read-only unless given a write token."""
    from duetime.web.security import MIN_TOKEN

    if not valid_host(host):
        raise click.BadParameter(f"{host!r} is neither an IP address nor a host name",
                                 param_hint="--host")
    for name in allowed_hosts:
        if not valid_host(name):
            raise click.BadParameter(f"{name!r} is neither an IP address nor a host name",
                                     param_hint="--allowed-host")

    if write_token is not None and len(write_token) < MIN_TOKEN:
        raise click.BadParameter(f"must be at least {MIN_TOKEN} characters (e.g. the output of "
                                 "`openssl rand -hex 16`)", param_hint="--write-token")
    try:
        import uvicorn

        from duetime.web.server import create_app
    except ImportError as exc:
        raise click.ClickException(f"the web console needs its extra: pip install 'duetime[web]' "
                                   f"({exc})") from None
    app = plain_app(ctx, wait_as="web")  # waits for a server not up yet; bad auth exits
    mode = "writes need the token" if write_token else "read-only"
    click.echo(f"duetime web: http://{host}:{port}/ -- {redact(app.redis_url)} namespace "
               f"{app.keys.namespace!r} ({mode})", err=True)
    if not _loopback(host):
        click.echo(f"warning: listening on {host}: anyone who reaches this address sees the "
                   "console (put it behind your own authentication)", err=True)
    names = [*allowed_hosts, *([] if host in ("0.0.0.0", "::") else [host])]
    uvicorn.run(create_app(app, write_token, names, port), host=host, port=port, log_level="warning",
                access_log=False, server_header=False)
