"""`duetime batches list|show|cancel`: batches and their callbacks (docs/workloads.md)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime

import click

from duetime.cli.common import echo_json, echo_listing, fail_cleanly, plain_app, table
from duetime.client.workloads import Batch


def _when(ms: int | None) -> str:
    if not ms:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _to_dict(b: Batch) -> dict[str, object]:
    return {**asdict(b), "pending": b.pending, "callbacks": b.callbacks}


@click.group()
def batches() -> None:
    """Batches: their counts, members and callbacks."""


@batches.command("list")
@click.option("--limit", default=100, show_default=True, help="At most this many, newest first.")
@click.option("--json", "as_json", is_flag=True, help="A JSON list.")
@click.pass_context
@fail_cleanly
def list_batches(ctx: click.Context, limit: int, as_json: bool) -> None:
    """The namespace's batches, newest first."""
    found = plain_app(ctx).list_batches(limit)
    echo_listing(as_json, found, _to_dict,
                 ["batch", "state", "total", "pending", "succeeded", "failed", "created"],
                 lambda: [[b.id, b.state + (" (cancelled)" if b.cancelled else ""), b.total,
                           b.pending, b.succeeded, b.failed, _when(b.created_ms)]
                          for b in found])


@batches.command("show")
@click.argument("batch_id")
@click.option("--members", "n_members", default=20, show_default=True,
              help="List this many members with their states.")
@click.option("--json", "as_json", is_flag=True, help="A JSON object.")
@click.pass_context
@fail_cleanly
def show(ctx: click.Context, batch_id: str, n_members: int, as_json: bool) -> None:
    """One batch: counts, state, callbacks and members."""
    app = plain_app(ctx)
    b = app.get_batch(batch_id)
    members = app.batch_members(batch_id, n_members)
    states = {m: app.get_run(m).state for m in members}
    cbs = {role: (rid, app.get_run(rid).state) for role, rid in b.callbacks.items()}
    if as_json:
        echo_json({**_to_dict(b), "members": [{"run": m, "state": s} for m, s in states.items()],
                   "callback_states": {role: s for role, (_, s) in cbs.items()}})
        return
    click.echo(f"batch {b.id}: {b.state}" + (" (cancelled)" if b.cancelled else ""))
    click.echo(f"  total {b.total}, pending {b.pending}, succeeded {b.succeeded}, "
               f"failed {b.failed}; created {_when(b.created_ms)}"
               + (f", finished {_when(b.finished_ms)}" if b.finished_ms else ""))
    if cbs:
        click.echo(table(["callback", "run", "state"],
                         [[role, rid, s] for role, (rid, s) in cbs.items()]))
    click.echo(table(["member", "state"], [[m, s] for m, s in states.items()]))


@batches.command("cancel")
@click.argument("batch_id")
@click.option("--reason", default="batch cancelled by an operator", show_default=True,
              help="Recorded on every run it cancels.")
@click.pass_context
@fail_cleanly
def cancel(ctx: click.Context, batch_id: str, reason: str) -> None:
    """Cancel a batch: its waiting callbacks and its unfinished members."""
    members, asked, cbs = plain_app(ctx).cancel_batch(batch_id, reason)
    click.echo(f"batch {batch_id}: {members} member(s) cancelled, {asked} running asked to "
               f"stop, {cbs} callback(s) cancelled")
