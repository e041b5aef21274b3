"""`duetime calendar add|show|list|delete`: the business calendars schedules follow."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from duetime.cli.common import fail_cleanly, plain_app
from duetime.client.calendars import CalendarInfo, CalendarStore
from duetime.common.time.calendar import WEEKDAY_NAMES


@click.group()
def calendar() -> None:
    """Business calendars: holidays, explicit dates, iCalendar files, weekly business days."""


def _store(ctx: click.Context) -> CalendarStore:
    app = plain_app(ctx)
    return app.calendars


def _to_dict(i: CalendarInfo, dates: bool = True) -> dict[str, Any]:
    c = i.calendar
    d: dict[str, Any] = {
        "name": c.name, "version": c.version,
        "weekdays": [WEEKDAY_NAMES[x] for x in sorted(c.weekdays)],
        "country": i.country, "subdiv": i.subdiv,
        "explicit": [x.isoformat() for x in i.explicit], "ics_dates": i.ics_dates,
        "years": [c.first_year, c.last_year], "excluded_count": len(c.excluded),
        "updated": i.updated.isoformat() if i.updated else None,
    }
    if dates:
        d["excluded"] = [x.isoformat() for x in sorted(c.excluded)]
    return d


@calendar.command("add")
@click.argument("name")
@click.option("--country", default=None, help="Public holidays of this country (holidays "
              "package code: US, GB, DE, ...).")
@click.option("--subdiv", default=None, help="A subdivision of --country (NY, ENG, BY, ...).")
@click.option("--date", "dates", multiple=True, metavar="YYYY-MM-DD",
              help="An excluded date (repeat the option).")
@click.option("--ics", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="An iCalendar file: its all-day events are excluded days.")
@click.option("--weekdays", default="mon-fri", show_default=True,
              help="Weekly business days: names or 0 (Monday)..6, a list or a range.")
@click.pass_context
@fail_cleanly
def add(ctx: click.Context, name: str, country: str | None, subdiv: str | None,
        dates: tuple[str, ...], ics: Path | None, weekdays: str) -> None:
    """Create or change calendar NAME (a change bumps its version; schedules using it apply
    it from their next occurrence that has no run yet)."""
    status, version = _store(ctx).put(name, country, subdiv, dates, ics, weekdays)
    info = _store(ctx).get(name)
    c = info.calendar
    click.echo(f"{status} calendar {name} v{version}: {len(c.excluded)} excluded date(s) "
               f"over {c.first_year}..{c.last_year}, business days "
               f"{','.join(WEEKDAY_NAMES[x] for x in sorted(c.weekdays))}")


@calendar.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="As JSON.")
@click.pass_context
@fail_cleanly
def show(ctx: click.Context, name: str, as_json: bool) -> None:
    """A calendar's sources, version and every excluded date."""
    d = _to_dict(_store(ctx).get(name))
    if as_json:
        click.echo(json.dumps(d, indent=2))
        return
    click.echo(f"calendar {d['name']} v{d['version']}")
    src = f"{d['country']}" + (f"-{d['subdiv']}" if d["subdiv"] else "") if d["country"] else "-"
    click.echo(f"  holidays of  {src} (years {d['years'][0]}..{d['years'][1]})")
    click.echo(f"  weekdays     {','.join(d['weekdays'])}")
    click.echo(f"  explicit     {', '.join(d['explicit']) or '-'}")
    click.echo(f"  from ics     {d['ics_dates']} date(s)")
    click.echo(f"  excluded     {d['excluded_count']} date(s):")
    for x in d["excluded"]:
        click.echo(f"    {x}")


@calendar.command("list")
@click.option("--json", "as_json", is_flag=True, help="As JSON.")
@click.pass_context
@fail_cleanly
def list_(ctx: click.Context, as_json: bool) -> None:
    """Every calendar of the namespace."""
    items = [_to_dict(i, dates=False) for i in _store(ctx).list()]
    if as_json:
        click.echo(json.dumps(items, indent=2))
        return
    if not items:
        click.echo("no calendars")
    for d in items:
        src = (d["country"] or "-") + (f"-{d['subdiv']}" if d["subdiv"] else "")
        click.echo(f"{d['name']:<20} v{d['version']:<4} {src:<8} {d['excluded_count']:>5} "
                   f"date(s)  {','.join(d['weekdays'])}")


@calendar.command("delete")
@click.argument("name")
@click.pass_context
@fail_cleanly
def delete(ctx: click.Context, name: str) -> None:
    """Remove calendar NAME (schedules naming it are set aside until it exists again and they
    are registered again)."""
    _store(ctx).delete(name)
    click.echo(f"deleted calendar {name}")
