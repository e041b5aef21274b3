"""`duetime queue pause|resume|list`: stop and restart claiming from a queue, fleet-wide."""

from __future__ import annotations

from datetime import UTC, datetime

import click

from duetime.cli.common import echo_listing, fail_cleanly, plain_app
from duetime.client.pause import QueuePause, QueuePauses


@click.group()
def queue() -> None:
    """Pause and resume queues (docs/operations.md "Pausing a queue")."""


def _store(ctx: click.Context) -> QueuePauses:
    app = plain_app(ctx)
    return QueuePauses(app.store.ready(), app.keys, app.redis_url)


def _since(at_ms: int) -> str:
    if at_ms <= 0:
        return ""
    return datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _to_dict(p: QueuePause) -> dict[str, object]:
    return {"queue": p.queue, "note": p.note, "paused_at_ms": p.at_ms}


@queue.command("pause")
@click.argument("name")
@click.option("--note", default="", help="Why it is paused (shown by list, top and doctor).")
@click.pass_context
@fail_cleanly
def pause(ctx: click.Context, name: str, note: str) -> None:
    """Stop every worker claiming from queue NAME; enqueues are still accepted."""
    _store(ctx).pause(name, note)
    click.echo(f"queue {name}: paused" + (f" ({note})" if note else ""))


@queue.command("resume")
@click.argument("name")
@click.pass_context
@fail_cleanly
def resume(ctx: click.Context, name: str) -> None:
    """Let workers claim from queue NAME again, at once."""
    was = _store(ctx).resume(name)
    click.echo(f"queue {name}: resumed" if was else f"queue {name}: was not paused")


@queue.command("list")
@click.option("--json", "as_json", is_flag=True, help="A JSON list.")
@click.pass_context
@fail_cleanly
def list_paused(ctx: click.Context, as_json: bool) -> None:
    """The paused queues."""
    found = _store(ctx).list()
    if not found and not as_json:
        click.echo("no queue is paused")
        return
    echo_listing(as_json, found, _to_dict, ("QUEUE", "PAUSED SINCE", "NOTE"),
                 lambda: [(p.queue, _since(p.at_ms), p.note) for p in found])
