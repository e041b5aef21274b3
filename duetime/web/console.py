"""What each page shows, read through the code behind the CLI's `--json` views: the same
Inspector, doctor checks and schedule store, turned into dicts by the same `*_to_dict`
functions. Payloads are not even read from Redis unless a page asks for one run's or
schedule's (client/fields.py)."""

from __future__ import annotations

import time
from dataclasses import asdict
from datetime import datetime
from typing import Any, cast

from duetime.app import App
from duetime.client.runs import keyed_run_id
from duetime.client.schedules import ScheduleStore
from duetime.common import series
from duetime.common.connection import redact, server_time_ms, translated
from duetime.common.models import from_ms
from duetime.ops.admin import RunAdmin
from duetime.ops.doctor import run_checks
from duetime.ops.inspect import GROUPS, Inspector, Position, RunPage, newest_field_counts, page_runs
from duetime.ops.render import (
    lease_to_dict,
    next_fires,
    overview_to_dict,
    result_text,
    run_to_dict,
    schedule_to_dict,
    scheduler_to_dict,
    summary_to_dict,
    worker_to_dict,
)
from duetime.ops.schedule_listing import SCHEDULE_ORDERS, page_schedules
from duetime.web.plots import chart, sparkline
from duetime.web.timeline import timeline

PAGE = 50
OWNER_SAMPLE = 1000  # dead letters read to count them by owner
COUNT_BUDGET = 3000  # dead letters examined to count those a replay-all filter matches
ACTIVITY_SAMPLE = 400  # recent runs read for the "now" numbers (rate, lateness, dead per queue)
DOCTOR_TTL_S = 5.0  # the overview refreshes every few seconds; the checks need not
SERIES_WINDOWS = {"1h": "10s", "24h": "5m"}
PLOTTED = (("backlog", "backlog", ""), ("running", "running", ""),
           ("finished_per_s", "finished/s", "/s"), ("lateness_p50_s", "late p50", "s"),
           ("lateness_p99_s", "late p99", "s"), ("dead", "dead", ""))


def _hidden(d: dict[str, Any], show_payload: bool) -> dict[str, Any]:
    if not show_payload:
        d = {k: v for k, v in d.items() if k not in ("args", "kwargs", "result")}
    return d


def throughput(points: list[series.Point], queue: str, t0: int, t1: int, step_ms: int
               ) -> dict[str, Any]:
    """A queue's finish rate over the window as a chart with axes, and the window's totals
    read off the same samples: processed (runs finished, succeeded or dead: the rate times
    each step) and failed (dead letters added from one sample to the next). Estimates, as the
    samples are: each rate is measured over the minute before its sample."""
    rates = [(p.t_ms, (p.queues.get(queue) or {}).get("finished_per_s")) for p in points]
    processed = sum((v or 0.0) * step_ms / 1000 for _, v in rates)
    deads = [(p.queues.get(queue) or {}).get("dead") for p in points]
    failed = sum(max(0.0, (b or 0.0) - (a or 0.0)) for a, b in zip(deads, deads[1:], strict=False)
                 if a is not None and b is not None)
    return {"svg": chart(rates, t0, t1, f"{queue} processed", "runs/s"),
            "processed": round(processed), "failed": round(failed)}


class Console:
    def __init__(self, app: App) -> None:
        self.app = app
        client = app.store.client  # no `ready()`: reading writes nothing to the namespace
        self.insp = Inspector(client, app.keys, app.redis_url)
        self.admin = RunAdmin(client, app.keys, app.redis_url)
        self.schedules = ScheduleStore(client, app.keys, app.redis_url)
        self._doctor: tuple[float, dict[str, Any]] | None = None

    # -- the header of every page ----------------------------------------------------------
    def where(self) -> dict[str, Any]:
        return {"redis": redact(self.app.redis_url), "namespace": self.app.keys.namespace,
                "partitions": self.app.keys.partitions}

    def now(self) -> datetime:
        with translated(self.app.redis_url):
            now = from_ms(server_time_ms(self.insp.client))
        assert now is not None
        return now

    # -- overview -------------------------------------------------------------------------
    def doctor(self) -> dict[str, Any]:
        """`duetime doctor --json`, cached for a few seconds."""
        if self._doctor is None or time.monotonic() - self._doctor[0] > DOCTOR_TTL_S:
            findings = run_checks(self.insp.client, self.app.keys, self.app.redis_url)
            self._doctor = (time.monotonic(), {
                **self.where(), "fatal": any(f.level == "fatal" for f in findings),
                "findings": [asdict(f) for f in findings]})
        return self._doctor[1]

    def overview(self, window: str = "1h") -> dict[str, Any]:
        step = SERIES_WINDOWS.get(window, "10s")
        ov = self.insp.overview(activity=True, window_s=60.0, sample=ACTIVITY_SAMPLE, cost=True)
        top = overview_to_dict(ov)  # `duetime top --once --json`
        step_ms, cap = series.STEPS[step]
        points = series.read(self.insp.client, self.app.redis_url, self.app.keys.series(step),
                             ov.now_ms - step_ms * cap, cap)
        # the window, or less while fewer samples exist (a young namespace): no empty stretch
        t0 = max(ov.now_ms - step_ms * cap, points[0].t_ms - step_ms) if points else ov.now_ms - step_ms * cap
        t1 = ov.now_ms
        plots: dict[str, dict[str, Any]] = {}
        charts: dict[str, dict[str, Any]] = {}
        for q in top["queues"]:
            name = q["queue"]
            plots[name] = {
                field: sparkline([(p.t_ms, (p.queues.get(name) or {}).get(field)) for p in points],
                                 t0, t1, f"{name} {label}", unit)
                for field, label, unit in PLOTTED}
            charts[name] = throughput(points, name, t0, t1, step_ms)
        return {"top": top, "plots": plots, "charts": charts, "samples": len(points), "step": step,
                "window": window,
                "workers": [worker_to_dict(w) for w in self.insp.workers()],
                "schedulers": [scheduler_to_dict(s) for s in self.insp.schedulers()],
                "doctor": self.doctor()}

    # -- runs -----------------------------------------------------------------------------
    def runs(self, state: str | None = None, queue: str | None = None, task: str | None = None,
             schedule: str | None = None, owner: str | None = None, after: str | None = None,
             limit: int = PAGE) -> dict[str, Any]:
        pos = Position.decode(after, [g[0] for g in GROUPS]) if after else None
        page: RunPage = page_runs(self.insp, state, queue, task, schedule, owner, pos, limit)
        return {"runs": [summary_to_dict(s) for s in page.runs], "examined": page.examined,
                "next": page.next.encode() if page.next else None, "filtered": page.filtered}

    def run(self, run_id: str, show_payload: bool = False) -> dict[str, Any]:
        """`duetime runs show --json`, without args/kwargs unless asked for; each attempt
        with its place on a common time axis (percent left, width) for the timeline."""
        run = self.insp.get_run(run_id, large=show_payload)  # hidden: not even read
        d = _hidden(run_to_dict(run, self.now()), show_payload)
        if show_payload and run.result is not None:  # read with the payload, shown bounded
            d["result_text"] = result_text(run.result)
        starts = [a.started for a in run.attempts if a.started]
        if starts:
            now = self.now()
            t0 = min(starts)
            t1 = max([now if a.ended is None else a.ended for a in run.attempts] + [t0])
            span = max((t1 - t0).total_seconds(), 1e-3)
            for a, out in zip(run.attempts, d["attempts"], strict=True):
                if a.started:
                    left = (a.started - t0).total_seconds() / span * 100
                    width = ((a.ended or now) - a.started).total_seconds() / span * 100
                    out["bar"] = (round(left, 2), round(max(width, 0.5), 2))
        return d

    def search(self, text: str) -> list[dict[str, str]]:
        """What `text` names: a run (by id), a schedule (by name), runs by idempotency key (the
        key's run id for each task this namespace knows, in its own partition or pinned to a
        tenant's: see client/runs.py keyed_run_id and Keyspace.pin_run_id). Reads only."""
        k, client = self.app.keys, self.insp.client
        tasks = set(self.app.registry.names())
        with translated(self.app.redis_url):
            for key in (k.tasks, k.task_seen):
                names = cast(list[bytes], client.hkeys(key))  # no duetime client decodes
                tasks |= {t.decode(errors="replace") for t in names}
            candidates: list[tuple[str, str, str]] = [("run", text, k.run(k.partition_of_run(text), text))]
            candidates.append(("schedule", text, k.sched(k.partition_of_schedule(text), text)))
            for task in sorted(tasks):
                keyed = keyed_run_id(task, text)
                ids = dict.fromkeys([keyed] + [k.pin_run_id(keyed, p) for p in range(k.partitions)])
                candidates += [(f"key of {task}", rid, k.run(k.partition_of_run(rid), rid))
                               for rid in ids]
            pipe = client.pipeline(transaction=False)
            for kind, target, key in candidates:
                if kind == "schedule":  # its packed record, or a record of the old layout
                    pipe.hget(k.scheds(k.partition_of_schedule(target)), target)
                    pipe.exists(key)
                else:
                    pipe.exists(key)
            found = pipe.execute()
            packed, side = found.pop(1), found.pop(1)  # the schedule's two reads
            found.insert(1, packed is not None or bool(side))
        hits, seen = [], set()
        for (kind, target, _), there in zip(candidates, found, strict=True):
            if there and (kind, target) not in seen:
                seen.add((kind, target))
                hits.append({"kind": kind, "target": target})
        return hits

    def queues(self) -> list[str]:
        return self.insp.queues()

    def dead_owners(self) -> dict[str, Any]:
        """Dead letters counted by owner among the newest OWNER_SAMPLE (all of them if fewer)."""
        total = self.admin.count_dead()
        owners, read = newest_field_counts(self.insp, "dead", "owner", OWNER_SAMPLE)
        return {"total": total, "sampled": read, "complete": read >= total,
                "owners": sorted(owners.items(), key=lambda kv: (-kv[1], kv[0]))}

    def count_matching_dead(self, queue: str | None, task: str | None, owner: str | None,
                            budget: int = COUNT_BUDGET) -> tuple[int, bool]:
        """→ (dead letters matching, exact?): at most `budget` index entries are examined."""
        if not (queue or task or owner):
            return self.admin.count_dead(), True
        page = page_runs(self.insp, "dead", queue, task, None, owner, None, budget, budget)
        return len(page.runs), page.next is None

    # -- schedules ------------------------------------------------------------------------
    def schedule_page(self, order: str = "created", after: str | None = None) -> dict[str, Any]:
        pos = Position.decode(after, SCHEDULE_ORDERS) if after else None
        infos, nxt = page_schedules(self.schedules, order, pos, PAGE)
        return {"schedules": [_hidden(schedule_to_dict(i), False) | {
                    "quarantined": i.quarantined, "problem": i.problem} for i in infos],
                "next": nxt.encode() if nxt else None, "order": order}

    def schedule(self, name: str, until: datetime | None = None, show_payload: bool = False
                 ) -> dict[str, Any]:
        """`duetime schedule show --json` (next fire times in the zone and UTC), and the
        timeline of past occurrences up to `until`."""
        info = self.schedules.get(name, payload=show_payload)
        now = self.now()
        occurrences, older = timeline(self.schedules, info, until or now, now)
        return {"schedule": _hidden(schedule_to_dict(info), show_payload) | {
                    "quarantined": info.quarantined, "problem": info.problem},
                "next_fires": next_fires(info, now, 10, self.schedules.effective_trigger(info)),
                "timeline": occurrences, "older": older,
                "until": until}

    # -- batches (docs/workloads.md) -----------------------------------------------------------
    def batches(self, limit: int = 100) -> dict[str, Any]:
        return {"batches": [{**asdict(b), "pending": b.pending}
                            for b in self.app.list_batches(limit)]}

    def batch(self, batch_id: str, limit: int = 200) -> dict[str, Any]:
        """A batch, its callbacks and its first `limit` members with their states."""
        b = self.app.get_batch(batch_id)
        summaries = self.insp._summaries(self.app.batch_members(batch_id, limit))
        cbs = self.insp._summaries(list(b.callbacks.values()))
        return {"batch": {**asdict(b), "pending": b.pending},
                "callbacks": [{"role": role, "id": rid, "state": s.state if s else "gone"}
                              for (role, rid), s in zip(b.callbacks.items(), cbs, strict=True)],
                "members": [{"id": s.id, "state": s.state, "task": s.task, "reason": s.reason}
                            for s in summaries if s is not None]}

    # -- leases and processes ---------------------------------------------------------------
    def leases(self, limit: int = 200) -> dict[str, Any]:
        held = self.insp.leases()
        rows = []
        for lease in held[:limit]:
            d = lease_to_dict(lease)
            left, age = lease.lease_left_s, lease.heartbeat_age_s
            # a heartbeat sets the expiry to heartbeat + lease length: left / (left + age) is
            # the share of the lease still to run
            d["lease_fraction"] = (max(0.0, min(1.0, left / (left + age))) if left is not None
                                   and age is not None and left + age > 0 else 0.0)
            rows.append(d)
        return {"leases": rows, "total": len(held)}

    def workers(self, include_gone: bool = False) -> dict[str, Any]:
        """`duetime workers --json`."""
        return {"workers": [worker_to_dict(w) for w in self.insp.workers(include_gone)],
                "schedulers": [scheduler_to_dict(s) for s in self.insp.schedulers()]}
