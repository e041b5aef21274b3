"""`duetime limits set|clear|list`: concurrency and rate limits claim.lua enforces."""

from __future__ import annotations

from datetime import timedelta

import click

from duetime.cli.common import duration_option, echo_listing, fail_cleanly, plain_app
from duetime.client.limits import PER, Limit, Limits, make_limit
from duetime.common.limit_fields import KINDS


@click.group()
def limits() -> None:
    """Concurrency and rate limits per tenant, queue and task (docs/fairness.md)."""


def _store(ctx: click.Context) -> Limits:
    app = plain_app(ctx)
    return Limits(app.store.ready(), app.keys, app.redis_url)


def _to_dict(lim: Limit) -> dict[str, object]:
    return {"kind": lim.kind, "name": lim.name, "concurrency": lim.concurrency,
            "rate": lim.rate, "per_s": lim.per_ms / 1000, "burst": lim.burst,
            "weight": lim.weight}


@limits.command("set")
@click.argument("kind", type=click.Choice(KINDS))
@click.argument("name")
@click.option("--concurrency", type=int, default=None,
              help="At most this many of its runs running at once.")
@click.option("--rate", type=float, default=None, help="At most this many starts per --per.")
@duration_option("--per", span=PER, default="1s", show_default=True,
                 help="The interval --rate counts over.")
@click.option("--burst", type=float, default=None,
              help="Starts allowed at once after an idle spell (default: --rate).")
@click.option("--weight", type=int, default=None,
              help="A tenant's share of claims against the other tenants of its partition "
                   "(1..1000, default 1).")
@click.pass_context
@fail_cleanly
def set_limit(ctx: click.Context, kind: str, name: str, concurrency: int | None,
              rate: float | None, per: timedelta, burst: float | None,
              weight: int | None) -> None:
    """Set (replace) the limit of a tenant, queue or task; no option clears it."""
    lim = make_limit(kind, name, concurrency, rate, per, burst, weight)
    _store(ctx).set(lim)
    click.echo(f"{lim.scope}: " + (
        ", ".join(x for x in (
            f"concurrency {lim.concurrency}" if lim.concurrency is not None else "",
            f"rate {lim.rate:g} per {lim.per_ms / 1000:g}s" if lim.rate is not None else "",
            f"weight {lim.weight}" if lim.weight is not None else "") if x)
        or "cleared"))


@limits.command("clear")
@click.argument("kind", type=click.Choice(KINDS))
@click.argument("name")
@click.pass_context
@fail_cleanly
def clear_limit(ctx: click.Context, kind: str, name: str) -> None:
    """Remove the limits of a tenant, queue or task."""
    _store(ctx).clear(kind, name)
    click.echo(f"{kind}:{name}: cleared")


@limits.command("list")
@click.option("--json", "as_json", is_flag=True, help="A JSON list.")
@click.pass_context
@fail_cleanly
def list_limits(ctx: click.Context, as_json: bool) -> None:
    """The limits set in the namespace."""
    found = _store(ctx).list()
    echo_listing(as_json, found, _to_dict,
                 ("KIND", "NAME", "CONCURRENCY", "RATE", "PER", "BURST", "WEIGHT"), lambda: [
                     (lim.kind, lim.name, lim.concurrency or "",
                      "" if lim.rate is None else f"{lim.rate:g}", f"{lim.per_ms / 1000:g}s",
                      "" if lim.burst is None else f"{lim.burst:g}", lim.weight or "")
                     for lim in found])


@limits.command("payload")
@click.argument("size", required=False)
@click.pass_context
@fail_cleanly
def payload_cap(ctx: click.Context, size: str | None) -> None:
    """Show, set (SIZE: 4096, 64KiB, 1MB...) or clear (SIZE `none`) the namespace's payload
    cap: enqueue.lua refuses a run whose payload is larger, whatever the client's max_payload."""
    from duetime.client.caps import parse_size, read_payload_cap, set_payload_cap

    app = plain_app(ctx)
    if size is None:
        cap = read_payload_cap(app.store.client, app.keys, app.redis_url)
        click.echo(f"max_payload: {cap} bytes" if cap else "max_payload: none")
        return
    cap = None if size.strip().lower() == "none" else parse_size(size)
    set_payload_cap(app.store.ready(), app.keys, app.redis_url, cap)
    click.echo(f"max_payload: {cap} bytes" if cap else "max_payload: none")
