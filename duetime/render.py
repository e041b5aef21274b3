"""Runs as stable JSON dicts (the `--json` contract) and as readable text."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from common.models import Run


def _iso(dt: datetime | None) -> str | None:
    return dt.isoformat().replace("+00:00", "Z") if dt else None


def run_to_dict(run: Run) -> dict[str, Any]:
    lateness = None
    if run.started and run.due:
        lateness = (run.started - run.due).total_seconds()
    return {
        "id": run.id, "task": run.task, "queue": run.queue, "state": run.state,
        "args": run.args, "kwargs": run.kwargs, "created": _iso(run.created),
        "due": _iso(run.due), "started": _iso(run.started), "finished": _iso(run.finished),
        "start_lateness_s": lateness, "attempt": run.attempt, "max_attempts": run.max_attempts,
        "fence": run.fence, "worker": run.worker, "error": run.error, "reason": run.reason,
        "owner": run.owner, "idempotency_key": run.idempotency_key, "schedule": run.schedule,
        "retry_at": _iso(run.retry_at),
        "attempts": [
            {"number": a.number, "fence": a.fence, "worker": a.worker,
             "started": _iso(a.started), "ended": _iso(a.ended), "outcome": a.outcome,
             "error": a.error, "late": a.late, "late_outcome": a.late_outcome}
            for a in run.attempts
        ],
    }


def run_to_text(run: Run) -> str:
    d = run_to_dict(run)
    lines = [f"run {run.id}  {run.state}  task={run.task} queue={run.queue}"]
    for k in ("due", "started", "finished", "start_lateness_s", "attempt", "max_attempts",
              "owner", "schedule", "reason", "retry_at"):
        if d[k] not in (None, ""):
            lines.append(f"  {k:<17} {str(d[k]).splitlines()[0]}")
    if run.error:
        lines.append(f"  error             {run.error.splitlines()[0]}")
    lines.append("  attempts:")
    for a in d["attempts"]:
        late = f" (late {a['late_outcome']})" if a["late"] and a["late_outcome"] else ""
        err = f"  {a['error'].splitlines()[0]}" if a["error"] else ""
        lines.append(f"    #{a['number']} fence={a['fence']} {a['outcome']}{late} "
                     f"worker={a['worker']} {a['started']} → {a['ended']}{err}")
    return "\n".join(lines)
