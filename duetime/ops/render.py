"""Records as stable JSON dicts (the `--json` contract, see README "JSON output") and as
readable text. Field names and meanings here only ever gain new keys."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from duetime.client.schedules import ScheduleInfo
from duetime.common.models import Run, from_ms
from duetime.common.overview import Overview, SchedulerInfo, WorkerInfo
from duetime.common.retrycost import as_dicts as cost_dicts
from duetime.common.schedules import stagger_for
from duetime.common.time.fmt import iso as _iso
from duetime.common.time.fmt import iso_local, relative
from duetime.common.time.spec import Cron, Trigger
from duetime.ops.inspect import LeaseInfo, RunSummary
from duetime.ops.policies import policy_lines

_TIMES = ("due", "started", "finished", "retry_at", "cancel_requested", "heartbeat")
RESULT_TEXT_CHARS = 500  # a result as text is cut here: a page or a terminal, not a dump


def _jsonish(o: Any) -> Any:
    """msgpack values JSON cannot carry: bytes as hex, anything else (datetime, Decimal,
    UUID) as its text."""
    return o.hex() if isinstance(o, bytes) else str(o)


def result_text(value: Any, limit: int = RESULT_TEXT_CHARS) -> str:
    """A stored result for a person: compact JSON on one line, cut to `limit` characters with
    an ellipsis (`--json` carries it whole)."""
    text = json.dumps(value, ensure_ascii=False, default=_jsonish, separators=(", ", ": "))
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _secs(a: datetime | None, b: datetime | None) -> float | None:
    return (a - b).total_seconds() if a and b else None


def long_run_to_dict(run: Run, now: datetime | None = None) -> dict[str, Any]:
    """A long run's progress, checkpoint and continuations (`--json` keys `progress`,
    `checkpoint`, `continuations`); ages in seconds from `now` (server time) when given."""
    p, at = run.progress, run.checkpoint_at
    return {
        "progress": None if p is None else {
            "done": p.done, "total": p.total, "note": p.note, "updated_at": _iso(p.updated_at),
            "fraction": (min(p.done / p.total, 1.0) if p.total else None),
            "age_s": _secs(now, p.updated_at)},
        "checkpoint": None if run.checkpoint_size is None else {
            "size_bytes": run.checkpoint_size, "at": _iso(at), "fence": run.checkpoint_fence,
            "age_s": _secs(now, at)},
        "continuations": run.continuations,
    }


def long_run_lines(run: Run, now: datetime | None = None) -> list[str]:
    """`runs show`'s lines for the same, when the run has any of it."""
    lines = []
    if run.progress is not None:
        p = run.progress
        of = f" of {p.total:g}" if p.total is not None else ""
        pct = f" ({min(p.done / p.total, 1.0):.0%})" if p.total else ""
        note = f"  {p.note}" if p.note else ""
        ago = f"  (updated {relative(p.updated_at, now)})" if now is not None else ""
        lines.append(f"  {'progress':<17} {p.done:g}{of}{pct}{note}{ago}")
    if run.checkpoint_size is not None:
        ago = f", {relative(run.checkpoint_at, now)}" if now is not None else ""
        lines.append(f"  {'checkpoint':<17} {run.checkpoint_size:,} bytes, written "
                     f"{_iso(run.checkpoint_at)} by fence {run.checkpoint_fence}{ago}")
    if run.continuations:
        lines.append(f"  {'continuations':<17} {run.continuations}")
    return lines


def run_to_dict(run: Run, now: datetime | None = None) -> dict[str, Any]:
    """`runs show --json`; `now` (server time) adds the ages of a long run's progress and
    checkpoint."""
    # lateness is the first attempt's: a retry starts late on purpose
    first = run.attempts[0].started if run.attempts else run.started
    return {
        "id": run.id, "task": run.task, "queue": run.queue, "state": run.state,
        "args": run.args, "kwargs": run.kwargs, "created": _iso(run.created),
        "due": _iso(run.due), "started": _iso(run.started), "finished": _iso(run.finished),
        "start_lateness_s": _secs(first, run.due), "attempt": run.attempt,
        "max_attempts": run.max_attempts,
        "fence": run.fence, "worker": run.worker, "error": run.error, "reason": run.reason,
        "owner": run.owner, "idempotency_key": run.idempotency_key, "schedule": run.schedule,
        "retry_at": _iso(run.retry_at), "replay_of": run.replay_of, "replayed_by": run.replayed_by,
        "cancel_requested": _iso(run.cancel_requested), "resolved_as": run.resolved_as,
        "heartbeat": _iso(run.heartbeat), "lease_expires": _iso(run.lease_expires),
        "tenant": run.tenant, "limited_by": run.limited_by, "result_error": run.result_error,
        "coalesced": run.coalesced, "coalesced_from": _iso(run.coalesced_from),
        "interval_start": _iso(run.interval_start), "interval_end": _iso(run.interval_end),
        "result": run.result,
        **long_run_to_dict(run, now),
        "depends_on": run.depends_on, "batch_id": run.batch_id, "batch_role": run.batch_role,
        "headers": dict(run.headers),
        "attempts": [
            {"number": a.number, "fence": a.fence, "worker": a.worker,
             "started": _iso(a.started), "ended": _iso(a.ended), "outcome": a.outcome,
             "error": a.error, "late": a.late, "late_outcome": a.late_outcome,
             "duration_s": _secs(a.ended, a.started)}
            for a in run.attempts
        ],
    }


def run_to_text(run: Run, now: datetime | None = None) -> str:
    """The record for a person: times in ISO UTC, and relative to `now` (server time) if given."""
    d = run_to_dict(run)
    lines = [f"run {run.id}  {run.state}  task={run.task} queue={run.queue}"]
    for k in ("due", "started", "finished", "start_lateness_s", "attempt", "max_attempts",
              "owner", "tenant", "limited_by", "schedule", "reason", "retry_at", "replay_of",
              "replayed_by", "cancel_requested", "resolved_as", "heartbeat", "result_error"):
        if d[k] not in (None, ""):
            text = str(d[k]).splitlines()[0]
            if k in _TIMES and now is not None:
                text += f"  ({relative(getattr(run, k), now)})"
            lines.append(f"  {k:<17} {text}")
    if run.depends_on:
        lines.append(f"  {'depends_on':<17} {' '.join(run.depends_on)}")
    if run.batch_id:
        lines.append(f"  {'batch':<17} {run.batch_id} ({run.batch_role})")
    if run.coalesced > 1:  # a catch-up run: the occurrences it stands for
        lines.append(f"  {'coalesced':<17} {run.coalesced} occurrences, from {d['coalesced_from']}")
    if run.interval_end is not None:  # a schedule's run: the data interval it covers
        lines.append(f"  {'interval':<17} {d['interval_start'] or '-'} .. {d['interval_end']}")
    lines += long_run_lines(run, now)
    if run.result is not None:
        lines.append(f"  result            {result_text(run.result)}")
    if run.error:
        lines.append(f"  error             {run.error.splitlines()[0]}")
    lines.append("  attempts:")
    for a in d["attempts"]:
        late = f" (late {a['late_outcome']})" if a["late"] and a["late_outcome"] else ""
        err = f"  {a['error'].splitlines()[0]}" if a["error"] else ""
        lines.append(f"    #{a['number']} fence={a['fence']} {a['outcome']}{late} "
                     f"worker={a['worker']} {a['started']} → {a['ended']}{err}")
    return "\n".join(lines)


def summary_to_dict(s: RunSummary) -> dict[str, Any]:
    return {
        "id": s.id, "state": s.state, "task": s.task, "queue": s.queue, "schedule": s.schedule,
        "due": _iso(s.due), "created": _iso(s.created), "started": _iso(s.started),
        "finished": _iso(s.finished), "attempt": s.attempt, "max_attempts": s.max_attempts,
        "worker": s.worker, "error": s.error, "reason": s.reason, "owner": s.owner,
        "retry_at": _iso(s.retry_at), "replay_of": s.replay_of, "replayed_by": s.replayed_by,
        "cancel_requested": s.cancel_requested, "tenant": s.tenant,
    }


def lease_to_dict(lease: LeaseInfo) -> dict[str, Any]:
    return {
        "run_id": lease.run_id, "task": lease.task, "queue": lease.queue,
        "schedule": lease.schedule, "worker": lease.worker, "fence": lease.fence,
        "attempt": lease.attempt, "lease_left_s": lease.lease_left_s,
        "last_heartbeat": _iso(lease.heartbeat), "heartbeat_age_s": lease.heartbeat_age_s,
        "started": _iso(lease.started), "running_s": lease.running_s,
        "cancel_requested": lease.cancel_requested,
    }


def worker_to_dict(w: WorkerInfo) -> dict[str, Any]:
    return {
        "id": w.id, "host": w.host, "pid": w.pid, "queues": w.queues,
        "concurrency": w.concurrency, "inflight": w.inflight, "processed": w.processed,
        "last_seen": _iso(w.last_seen), "last_seen_age_s": w.last_seen_age_s, "live": w.live,
    }


def scheduler_to_dict(s: SchedulerInfo) -> dict[str, Any]:
    return {"id": s.id, "last_seen": _iso(s.last_seen), "last_seen_age_s": s.last_seen_age_s,
            "partitions": s.partitions}


def schedule_zone(info: ScheduleInfo) -> str:
    return info.trigger.tz if isinstance(info.trigger, Cron) else "UTC"


def next_fires(info: ScheduleInfo, now: datetime, n: int = 5,
               trigger: Trigger | None = None) -> list[dict[str, Any]]:
    """The next `n` fire instants, in UTC and on the schedule's zone's wall clock.

    The first is the schedule's own cursor (`next_fire`), so the list and `next_fire` agree
    even before any scheduler ran; if it has passed unevaluated (no scheduler, or paused) it
    is marked `overdue` and the rest follow from now. No cursor: the trigger has ended.
    `trigger`: the one it fires at, its calendar applied (ScheduleStore.effective_trigger)."""
    trigger = trigger or info.trigger
    zone = ZoneInfo(schedule_zone(info))
    out: list[dict[str, Any]] = []
    nxt = info.next_fire
    while nxt is not None and len(out) < n:
        out.append({"utc": _iso(nxt), "local": iso_local(nxt, zone), "overdue": nxt < now})
        nxt = trigger.next_after(max(nxt, now))
    return out


def schedule_to_dict(info: ScheduleInfo) -> dict[str, Any]:
    return {
        "name": info.name, "trigger": info.trigger.to_dict(), "describe": info.trigger.describe(),
        "zone": schedule_zone(info), "task": info.task, "queue": info.queue, "args": info.args,
        "kwargs": info.kwargs, "catchup": info.catchup, "max_catchup": info.max_catchup,
        "miss_tolerance_s": info.miss_tolerance_s, "lateness_s": info.lateness_s,
        "overlap": info.overlap, "jitter_s": info.jitter_s, "stagger_s": info.stagger_s,
        "owner": info.owner, "tenant": info.tenant, "paused": info.paused, "pause_note": info.pause_note,
        "version": info.version, "next_fire": _iso(info.next_fire),
        "last_occurrence": _iso(info.last_occurrence), "skipped_count": info.skipped_count,
        "missed_count": info.missed_count, "materialized_count": info.materialized_count,
        "created": _iso(info.created), "updated": _iso(info.updated),
        "calendar": info.calendar, "on_excluded": info.on_excluded if info.calendar else None,
        "excluded_count": info.excluded_count,
    }


def zone_header(info: ScheduleInfo, now: datetime) -> str:
    """`Europe/Paris (now UTC+01:00, CET)`; interval and one-time triggers have no zone."""
    zone = schedule_zone(info)
    if not isinstance(info.trigger, Cron):
        return "UTC (an interval or a one-time instant does not follow a zone's clock)"
    local = now.astimezone(ZoneInfo(zone))
    minutes = int((local.utcoffset() or timedelta(0)).total_seconds() // 60)
    sign = "-" if minutes < 0 else "+"
    offset = f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
    return f"{zone} (now UTC{offset}, {local.tzname()})"


def schedule_to_text(info: ScheduleInfo, fires: list[dict[str, Any]],
                     now: datetime | None = None, policy_ms: int = 0) -> str:
    """Every instant once in one format (ISO-8601, UTC with Z; fire times also on the zone's
    clock), with how far from `now` (server time) each is."""
    now = now or datetime.now(UTC)
    d = schedule_to_dict(info)
    zone = ZoneInfo(schedule_zone(info))
    lines = [f"schedule {info.name}  {'PAUSED' if info.paused else 'active'}  {d['describe']}",
             f"  {'zone':<19} {zone_header(info, now)}"]
    instants = {"next_fire": info.next_fire, "last_occurrence": info.last_occurrence,
                "created": info.created, "updated": info.updated}
    for k in ("task", "queue", "args", "kwargs", "catchup", "max_catchup", "miss_tolerance_s",
              "lateness_s", "overlap", "jitter_s", "stagger_s", "owner", "tenant", "pause_note", "version",
              "next_fire",
              "last_occurrence", "materialized_count", "skipped_count", "missed_count", "created",
              "updated"):
        if d[k] in (None, "", [], {}):
            continue
        text = str(d[k])
        when = instants.get(k)
        if when is not None:
            text = f"{_iso(when, compact=True)}  ({relative(when, now)})"
        lines.append(f"  {k:<19} {text}")
    stagger_ms = policy_ms if info.stagger_s is None else round(info.stagger_s * 1000)
    offset = stagger_for(info.name, stagger_ms) / 1000
    if info.stagger_s is None:
        lines.append(f"  {'stagger_s':<19} the namespace policy ({stagger_ms / 1000:g} now)")
    if stagger_ms:
        lines.append(f"  {'stagger offset':<19} every run is due {offset:g}s after its fire time")
    lines += policy_lines(info, policy_ms)  # every effective policy, defaults spelled out
    if info.next_fire is None:
        lines.append("  next_fire           - (the trigger has no further occurrence)")
    if info.calendar:  # its business calendar, and what an occurrence on an excluded day does
        lines.append(f"  {'calendar':<19} {info.calendar}, on_excluded={info.on_excluded} "
                     f"({info.excluded_count} occurrence(s) excluded so far)")
    lines.append(f"  next {len(fires)} fire times ({d['zone']} / UTC):")
    rows = []
    for f in fires:
        utc = datetime.fromisoformat(f["utc"])
        note = "  overdue: not yet evaluated" if f["overdue"] else ""
        rows.append([iso_local(utc, zone, compact=True), _iso(utc, compact=True) or "",
                     relative(utc, now) + note])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))] if rows else []
    for r in rows:
        lines.append("    " + "   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


def overview_to_dict(ov: Overview) -> dict[str, Any]:
    """`duetime top --once --json` and the console's overview."""
    return {
        "time": _iso(from_ms(ov.now_ms)), "window_s": ov.window_s, "sampled": ov.sampled,
        "workers": ov.workers, "schedulers": ov.schedulers, "partitions": ov.partitions,
        "unowned_partitions": ov.unowned_partitions, "leases": ov.leases, "dead": ov.dead,
        "uncertain": ov.uncertain,
        "queues": [asdict(q) for q in sorted(ov.queues.values(), key=lambda q: q.queue)],
        "retry_cost": cost_dicts(ov.cost),
    }
