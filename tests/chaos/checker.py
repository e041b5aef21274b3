"""The invariant checker: what ran (the journal), what was injected (the fault log, the load
generator's acknowledged runs, the schedules) and what Redis says (a snapshot) must tell one
story.

Invariants (a breach is a *violation*; a breach the restart mode was allowed to cause -- AOF
`everysec` + SIGKILL loses the last ~1 s of acknowledged writes -- is reported apart, as
*allowed*):

1. every run is terminal or legitimately pending (uncertain, or due in the future);
2. no run vanished: each record is in the index its state needs, every acknowledged run
   exists, and no record exists that nobody created;
3. one owner per attempt: no two executions share a (run, fence); two executions of a run
   overlap only if the earlier attempt's lease had expired (its history entry says
   `unknown`, settled before the later one started -- fences order them) or it was released
   at shutdown;
4. the attempt history agrees with the journal: an accepted success was executed with that
   fence and returned; a failure raised; at most one success per run is accepted;
5. every expired lease and every interrupted attempt is explained by a fault that hit its
   holder (a kill, a stop, a cut or stalled link, a server restart);
6. every occurrence of every schedule has exactly one run, and none exists for a non-
   occurrence;
7. the counts of retried, dead, uncertain, missed and skipped runs are what was injected:
   `chaos.failing` runs are dead, `chaos.flaky` runs failed once, only interrupted
   non-idempotent runs are uncertain, only the unserved schedule's runs are missed, and every
   skipped run had a run of its schedule running at that moment.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from duetime.common.models import TERMINAL

from tests.apps import chaos as chaos_app
from tests.chaos.faults import LEASE_BREAKERS, FaultLog
from tests.chaos.journal import Execution
from tests.chaos.load import NOWHERE, ScheduleSpec, Submitted
from tests.chaos.snapshot import Entry, Record, Snapshot

TOL = 0.005  # s: times from the server's TIME and this machine's clock (one clock, rounding)
STATE_INDEX = {"running": "leases", "dead": "dead", "uncertain": "uncertain",
               **{s: "done" for s in TERMINAL if s != "dead"}}
MISSED_SCHEDULE = "chaos-missed"
SKIP_SCHEDULE = "chaos-skip"
PAUSE_SLACK = 3.0  # s: occurrences this close to the pause may or may not have a run


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    allowed: list[str] = field(default_factory=list)
    counts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def text(self, limit: int = 40) -> str:
        lines = [f"violations: {len(self.violations)}"]
        lines += [f"  - {v}" for v in self.violations[:limit]]
        lines.append(f"allowed by the restart mode's durability: {len(self.allowed)}")
        lines += [f"  - {a}" for a in self.allowed[:limit]]
        lines += [f"{k}: {v}" for k, v in self.counts.items()]
        return "\n".join(lines)


def _pid_of(worker_id: str) -> int | None:
    """Worker ids are `host:pid:random`."""
    parts = worker_id.split(":")
    try:
        return int(parts[-2])
    except (IndexError, ValueError):
        return None


def _t(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S.%f")[:-3]


class Checker:
    def __init__(self, snap: Snapshot, executions: list[Execution], faults: FaultLog,
                 submitted: list[Submitted], specs: list[ScheduleSpec], lease_s: float,
                 pid_names: dict[int, str], paused_at: float | None = None) -> None:
        self.snap, self.execs, self.faults = snap, executions, faults
        self.submitted, self.specs, self.lease_s = submitted, specs, lease_s
        self.pid_names, self.paused_at = pid_names, paused_at
        self.report = Report()
        self.by_run: dict[str, list[Execution]] = defaultdict(list)
        for x in executions:
            self.by_run[x.run].append(x)
        self._by_schedule: dict[str, list[Record]] | None = None
        self.deaths: dict[int, float] = {}
        for f in faults.faults:
            if f.kind in ("sigkill", "exited") and "pid" in f.detail:
                self.deaths.setdefault(f.detail["pid"], f.start)

    # -- reporting --------------------------------------------------------------------------
    def bad(self, text: str, *times: float | None) -> None:
        """A violation, unless it touches a window the restart mode may lose."""
        if any(self.faults.lossy(t) for t in times):
            self.report.allowed.append(text)
        else:
            self.report.violations.append(text)

    def run(self) -> Report:
        self.check_records()
        self.check_submitted()
        self.check_executions()
        self.check_history()
        self.check_expiries()
        self.check_outcomes()
        self.check_schedules()
        self.measure()
        return self.report

    # -- 1, 2: states and indexes ------------------------------------------------------------
    def check_records(self) -> None:
        snap, pending = self.snap, 0
        for r in snap.runs.values():
            st = r.state
            if st == "scheduled":
                sched = snap.schedules.get(r.schedule, {})
                if not (snap.member(f"due:{r.queue}", r.id) or sched.get("buffered") == r.id):
                    self.bad(f"{r.id}: scheduled but in no due set (vanished from every index)")
                due = r.ms("due") or 0
                if due <= snap.now - 1.0:
                    self.bad(f"{r.id}: still scheduled, due {_t(due)}, at {_t(snap.now)}")
                else:
                    pending += 1
            elif st == "retrying":
                if not snap.member(f"retry:{r.queue}", r.id):
                    self.bad(f"{r.id}: retrying but in no retry set")
                self.bad(f"{r.id}: still retrying after the load stopped (retry_at "
                         f"{_t(r.ms('retry_at'))})")
            elif st in STATE_INDEX:
                if not snap.member(STATE_INDEX[st], r.id):
                    self.bad(f"{r.id}: {st} but not in the {STATE_INDEX[st]} index")
                if st == "running":
                    self.bad(f"{r.id}: still running after the load stopped")
            else:
                self.bad(f"{r.id}: state {st!r} is not a run state")
        self.report.counts["runs"] = len(snap.runs)
        self.report.counts["pending (due in the future)"] = pending

    def check_submitted(self) -> None:
        acked = {s.run_id: s for s in self.submitted if s.acked is not None}
        unacked = {s.run_id for s in self.submitted if s.acked is None}
        names = {s.name for s in self.specs}
        for rid, s in acked.items():
            if rid not in self.snap.runs:
                self.bad(f"{rid} ({s.task}): acknowledged at {_t(s.acked)}, but no record "
                         "exists (lost)", s.acked)
        for rid in self.snap.runs:
            if rid in acked or rid in unacked:
                continue
            if "@" not in rid or rid.rsplit("@", 1)[0] not in names:
                self.bad(f"{rid}: a run record nobody created")
        self.report.counts["ad-hoc runs acknowledged"] = len(acked)
        self.report.counts["ad-hoc runs never acknowledged (gave up)"] = len(unacked)

    # -- 3: one owner per attempt ---------------------------------------------------------
    def end_of(self, x: Execution) -> float:
        """When the body stopped running: its end, its process's death, or never."""
        if x.end is not None:
            return x.end
        return self.deaths.get(x.pid, float("inf"))

    def check_executions(self) -> None:
        overlaps_expired = overlaps_released = 0
        for rid, xs in self.by_run.items():
            r = self.snap.runs.get(rid)
            if r is None:
                self.bad(f"{rid}: executed (fence {xs[0].fence}) but has no record",
                         *(x.start for x in xs))
                continue
            seen: dict[int, Execution] = {}
            for x in xs:
                if x.fence in seen:
                    first = seen[x.fence]
                    self.bad(f"{rid}: two executions hold fence {x.fence} (pids {first.pid} and "
                             f"{x.pid}, started {_t(first.start)} and {_t(x.start)})",
                             first.start, x.start)
                seen[x.fence] = x
                current = int(r.f.get("fence") or 0)
                if x.fence > current:
                    self.bad(f"{rid}: executed with fence {x.fence}, above the record's fence "
                             f"{current}", x.start)
            for i, a in enumerate(xs):
                for b in xs[i + 1:]:
                    if a.fence == b.fence or self.end_of(a) <= b.start + TOL:
                        continue
                    earlier, later = (a, b) if a.fence < b.fence else (b, a)
                    e = r.entry(earlier.fence)
                    if e and e.outcome == "unknown" and e.end is not None and e.end <= later.start + TOL:
                        overlaps_expired += 1
                    elif e and e.outcome == "released" and e.end is not None \
                            and e.end <= later.start + TOL:
                        overlaps_released += 1
                    else:
                        self.bad(f"{rid}: executions of fences {earlier.fence} and {later.fence} "
                                 f"overlapped ({_t(earlier.start)}..{_t(self.end_of(earlier))} "
                                 f"and {_t(later.start)}) but attempt {earlier.fence}'s history "
                                 f"says {e.outcome if e else 'nothing'}"
                                 f"{'' if e is None else ' at ' + _t(e.end)}",
                                 earlier.start, later.start)
        self.report.counts["overlapping executions after a lease expiry"] = overlaps_expired
        self.report.counts["overlapping executions after a release at shutdown"] = overlaps_released

    # -- 4: history agrees with the journal --------------------------------------------------
    def check_history(self) -> None:
        for r in self.snap.runs.values():
            xs = {x.fence: x for x in self.by_run.get(r.id, [])}
            wins = [e for e in r.attempts if e.outcome == "succeeded"]
            if len(wins) > 1:
                self.bad(f"{r.id}: {len(wins)} successes accepted (fences "
                         f"{[e.fence for e in wins]})", *(e.end for e in wins))
            if r.state == "succeeded" and not wins:
                self.bad(f"{r.id}: succeeded, but no attempt entry says so", r.ms("finished"))
            for e in r.attempts:
                x = xs.get(e.fence)
                if e.outcome == "succeeded" and x is None and self._adopted(r, e):
                    self.report.counts["successes adopted from an older attempt's body"] = \
                        self.report.counts.get("successes adopted from an older attempt's body", 0) + 1
                    continue
                if e.outcome == "succeeded" and (x is None or x.outcome != "ok"):
                    self.bad(f"{r.id}: attempt {e.fence} accepted as succeeded, but its execution "
                             f"{'never ran' if x is None else 'ended ' + (x.outcome or 'never')}",
                             e.end, x.start if x else None)
                if e.outcome == "failed" and (x is None or x.outcome != "raised"):
                    self.bad(f"{r.id}: attempt {e.fence} recorded as failed, but its execution "
                             f"{'never ran' if x is None else 'ended ' + (x.outcome or 'never')}",
                             e.end, x.start if x else None)
                if e.late and e.late_outcome == "succeeded" and e.outcome != "succeeded" and (
                        x is None or x.outcome != "ok"):
                    self.bad(f"{r.id}: a late success of attempt {e.fence} with no execution "
                             "that returned", e.end)
            for fence, x in xs.items():
                e = r.entry(fence)
                if e is None and r.state in TERMINAL | {"uncertain"} and int(
                        r.f.get("fence") or 0) != fence:
                    self.bad(f"{r.id}: execution with fence {fence} (pid {x.pid}) left no attempt "
                             "entry", x.start, x.end)
                elif e is None and int(r.f.get("fence") or 0) == fence and r.state in TERMINAL:
                    # the last attempt of a finished run is always pushed when it ends
                    self.bad(f"{r.id}: its last attempt (fence {fence}) has no entry", x.start, x.end)

    def _adopted(self, r: Record, e: Entry) -> bool:
        """A worker that claimed a run again while its older attempt's body still ran there may
        wait for that body and report its success under the new fence, rather than run the
        work twice: the body that returned is an older fence's, on the same process, ending
        after the new claim."""
        pid = _pid_of(e.worker)
        return any(y.fence < e.fence and y.outcome == "ok" and y.pid == pid and y.end is not None
                   and e.start is not None and y.end >= e.start - TOL
                   for y in self.by_run.get(r.id, []))

    # -- 5: expiries are explained -----------------------------------------------------------
    def explained(self, e: Entry, kinds: frozenset[str] = LEASE_BREAKERS) -> bool:
        return self.explaining(e, kinds) is not None

    def explaining(self, e: Entry, kinds: frozenset[str] = LEASE_BREAKERS) -> str | None:
        """The kind of the first fault that explains an attempt's end, or None."""
        pid = _pid_of(e.worker)
        name = self.pid_names.get(pid) if pid is not None else None
        t0, t1 = e.start or 0.0, e.end or self.snap.now
        for f in self.faults.faults:
            if f.kind not in kinds:
                continue
            if f.target == "server":
                if f.covers(t0, t1, after=self.lease_s + 2.0):
                    return f.kind
            elif f.target == name and f.detail.get("pid") in (None, pid):
                if f.kind in ("sigkill", "sigterm"):
                    if f.start <= t1 + TOL:
                        return f.kind
                elif f.covers(t0, t1, after=self.lease_s + 2.0):
                    return f.kind
        return None

    def check_expiries(self) -> None:
        expired = shutdown = 0
        for r in self.snap.runs.values():
            for e in r.attempts:
                if e.outcome == "unknown" and e.error == "lease expired":
                    expired += 1
                    if not self.explained(e):
                        self.bad(f"{r.id}: the lease of attempt {e.fence} (worker {e.worker}, "
                                 f"{_t(e.start)}..{_t(e.end)}) expired, but no fault hit its holder",
                                 e.start, e.end)
                elif e.outcome == "released" or e.error == "interrupted by worker shutdown":
                    shutdown += 1
                    if not self.explained(e, frozenset({"sigterm"})):
                        self.bad(f"{r.id}: attempt {e.fence} was given back ({e.outcome}) by "
                                 f"worker {e.worker}, which was not shutting down", e.end)
        self.report.counts["lease expiries (each explained by a fault)"] = expired
        self.report.counts["attempts given back at shutdown"] = shutdown

    # -- 7: outcomes match what was injected -------------------------------------------------
    def check_outcomes(self) -> None:
        c: dict[str, int] = defaultdict(int)
        acked = {s.run_id for s in self.submitted if s.acked is not None}
        for r in self.snap.runs.values():
            st, task = r.state, r.task
            failed = [e for e in r.attempts if e.outcome == "failed"]
            expired = [e for e in r.attempts if e.outcome == "unknown"]
            if failed or expired:
                c["retried (observed)"] += 1 if len(r.attempts) > 1 or st == "retrying" else 0
            if task == chaos_app.failing.name:
                c["injected: failing runs"] += r.id in acked
                if st != "dead":
                    self.bad(f"{r.id}: a chaos.failing run ended {st}, not dead")
                for e in failed:
                    if chaos_app.FAILURE not in e.error:
                        self.bad(f"{r.id}: failed with {e.error[:80]!r}, not the injected error")
            elif task == chaos_app.flaky.name:
                c["injected: flaky runs"] += r.id in acked
                for e in failed:
                    if e.n != 1 or chaos_app.FIRST_ATTEMPT_FAILURE not in e.error:
                        self.bad(f"{r.id}: attempt {e.n} failed ({e.error[:60]!r}); only the "
                                 "first attempt of a flaky run fails")
                c["retried after the injected first-attempt failure"] += bool(failed)
            elif task == chaos_app.nonidem.name:
                c["injected: non-idempotent runs"] += r.id in acked
            if st == "dead":
                c["dead (observed)"] += 1
                if task == chaos_app.failing.name:
                    c["dead: injected failure"] += 1
                elif r.attempts and all(e.outcome in ("unknown", "failed") for e in r.attempts) \
                        and len(r.attempts) >= int(r.f.get("max_attempts") or 0):
                    c["dead: attempts used up by faults"] += 1
                else:
                    self.bad(f"{r.id} ({task}): dead ({r.f.get('reason', '')[:80]!r}) without an "
                             "injected failure or its attempts used up by faults")
            elif st == "uncertain":
                c["uncertain (observed)"] += 1
                last = r.attempts[-1] if r.attempts else None
                if r.f.get("idempotent") != "0" or last is None or last.outcome != "unknown":
                    self.bad(f"{r.id} ({task}): uncertain, but it is not a non-idempotent run "
                             "whose last attempt was interrupted")
                else:
                    c["uncertain: interrupted non-idempotent runs"] += 1
            elif st == "missed":
                c["missed (observed)"] += 1
                if r.schedule != MISSED_SCHEDULE or r.queue != NOWHERE:
                    self.bad(f"{r.id}: missed, but only the unserved schedule's runs may be")
            elif st == "skipped":
                c["skipped (observed)"] += 1
                if r.schedule != SKIP_SCHEDULE or not self._skip_justified(r):
                    self.bad(f"{r.id}: skipped at {_t(r.ms('finished'))}, but no other run of "
                             f"{r.schedule or 'its schedule'} was running then")
            elif st == "succeeded":
                c["succeeded"] += 1
            elif st == "cancelled":
                self.bad(f"{r.id}: cancelled, but nothing cancelled it")
            if task == chaos_app.nonidem.name and st == "uncertain":
                pass
            elif task == chaos_app.nonidem.name and st not in ("succeeded", "dead"):
                self.bad(f"{r.id}: a non-idempotent run ended {st}")
        missed_runs = [r for r in self.snap.runs.values() if r.schedule == MISSED_SCHEDULE]
        c["injected: runs of the unserved schedule (all must be missed)"] = len(missed_runs)
        for r in missed_runs:
            if r.state not in ("missed", "scheduled"):
                self.bad(f"{r.id}: a run nobody serves ended {r.state}, not missed")
        self.report.counts.update(dict(sorted(c.items())))

    def _skip_justified(self, r: Record) -> bool:
        """Another run of the schedule held its running slot (claimed, not yet settled) when
        this one was skipped."""
        t = r.ms("finished")
        if t is None:
            return False
        if self._by_schedule is None:
            self._by_schedule = defaultdict(list)
            for run in self.snap.runs.values():
                if run.schedule:
                    self._by_schedule[run.schedule].append(run)
        for o in self._by_schedule.get(r.schedule, []):
            if o.id == r.id:
                continue
            for e in o.attempts:
                if e.start is not None and e.start - TOL <= t <= (e.end or self.snap.now) + TOL:
                    return True
            if o.state == "running" and (o.ms("started") or 0) <= t:
                return True
        return False

    # -- 6: schedules -----------------------------------------------------------------------
    def check_schedules(self) -> None:
        runs_of: dict[str, list[Record]] = defaultdict(list)
        for r in self.snap.runs.values():
            if r.schedule:
                runs_of[r.schedule].append(r)
        for spec in self.specs:
            h = self.snap.schedules.get(spec.name)
            if h is None:
                self.bad(f"schedule {spec.name}: its record is gone")
                continue
            if h.get("quarantined"):
                self.bad(f"schedule {spec.name}: quarantined ({h['quarantined'][:80]})")
            runs = runs_of.get(spec.name, [])
            occ = sorted(int(r.f.get("occurrence") or 0) for r in runs)
            for r in runs:
                if r.id != f"{spec.name}@{r.f.get('occurrence')}":
                    self.bad(f"schedule {spec.name}: run {r.id} is not named for its occurrence")
                if r.f.get("coalesced"):
                    self.bad(f"schedule {spec.name}: run {r.id} coalesced {r.f['coalesced']} "
                             "occurrences (catch-up `all` never coalesces)")
            # every occurrence from its creation to a little before the pause must have its
            # run; those just before and after the pause (--lead 2s) may or may not
            created = int(h.get("created") or 0)
            end = int(((self.paused_at or self.snap.now) + PAUSE_SLACK) * 1000)
            every = self._occurrences(spec, created - 1000, end)  # its cursor was read earlier
            required = [o for o in every if created < o <= end - 2 * PAUSE_SLACK * 1000]
            missing = sorted(set(required) - set(occ))
            extra = sorted(set(occ) - set(every))
            if missing:
                self.bad(f"schedule {spec.name}: {len(missing)} occurrence(s) without a run, "
                         f"first {_t(missing[0] / 1000)}", *(m / 1000 for m in missing[:50]))
            if extra:
                self.bad(f"schedule {spec.name}: runs for non-occurrences {extra[:5]}")
            self.report.counts[f"schedule {spec.name}: occurrences with a run"] = len(occ)
            if spec.name == SKIP_SCHEDULE:
                skipped = sum(r.state == "skipped" for r in runs)
                if int(h.get("skipped_count") or 0) != skipped:
                    self.bad(f"schedule {spec.name}: skipped_count {h.get('skipped_count')} but "
                             f"{skipped} skipped runs")
            if spec.name == MISSED_SCHEDULE:
                missed = sum(r.state == "missed" for r in runs)
                if int(h.get("missed_count") or 0) != missed:
                    self.bad(f"schedule {spec.name}: missed_count {h.get('missed_count')} but "
                             f"{missed} missed runs")

    @staticmethod
    def _occurrences(spec: ScheduleSpec, after_ms: int, last_ms: int) -> list[int]:
        """The trigger's occurrences in (after_ms, last_ms]."""
        trig = spec.trigger
        out: list[int] = []
        t = datetime.fromtimestamp(after_ms / 1000, UTC)
        while True:
            nxt = trig.next_after(t)  # type: ignore[attr-defined]
            if nxt is None or int(nxt.timestamp() * 1000) > last_ms:
                return out
            out.append(int(nxt.timestamp() * 1000))
            t = nxt

    def restart_modes(self) -> None:
        """Per server restart: its mode, how long the server was away, the leases that expired
        because of it, and the acknowledged runs it lost (allowed only for everysec+SIGKILL)."""
        acked = [s for s in self.submitted if s.acked is not None]
        out = []
        for f in self.faults.of("server_sigkill", "server_shutdown"):
            end = f.end or f.start
            expired = sum(1 for r in self.snap.runs.values() for e in r.attempts
                          if e.outcome == "unknown" and e.end is not None
                          and f.start <= e.end <= end + self.lease_s + 2.0)
            lost = sum(1 for s in acked if f.start - 2.5 <= (s.acked or 0) <= f.start
                       and s.run_id not in self.snap.runs)
            out.append(f"{f.kind.removeprefix('server_')}/{f.detail.get('fsync')}: away "
                       f"{end - f.start:.1f}s, leases expired {expired}, acknowledged runs lost {lost}")
        self.report.counts["server restarts"] = out

    # -- measurements ------------------------------------------------------------------------
    def measure(self) -> None:
        """Duplicate executions (a run's body run again after an execution that did not fail)
        and how soon a killed or frozen worker's runs started again."""
        dup = 0
        causes: dict[str, int] = {}
        for rid, xs in self.by_run.items():
            r = self.snap.runs.get(rid)
            for i in range(1, len(xs)):
                before = [p for p in xs[:i] if p.outcome != "raised"]
                if before:
                    dup += 1
                    # the attempt displaced: the lower fence of the two (a stale holder's
                    # body may start after a newer attempt's, when its start was delayed)
                    lower = min(before[-1].fence, xs[i].fence)
                    e = r.entry(lower) if r else None
                    cause = ("no attempt entry" if e is None else "release at shutdown"
                             if e.outcome == "released" else
                             f"lease expiry after {self.explaining(e) or 'no fault'}"
                             if e.outcome == "unknown" else
                             f"earlier attempt {e.outcome}{' (a late result accepted)' if e.late else ''}"
                             f"{', its lease expired' if e.error == 'lease expired' else ''}")
                    causes[cause] = causes.get(cause, 0) + 1
        self.report.counts["duplicate executions (each after an explained expiry or release)"] = dup
        self.report.counts["duplicate executions by cause"] = causes
        gaps: dict[str, list[float]] = {}
        for f in self.faults.of("sigkill", "sigstop", "halfopen", "partition"):
            pid = f.detail.get("pid")
            pids = {pid} if pid else {q for q, n in self.pid_names.items() if n == f.target}
            kind = f"{f.kind} with a backlog of {f.detail['backlog']} runs" if f.detail.get(
                "backlog") else f.kind
            held = {x.run for x in self.execs
                    if x.pid in pids and x.start <= f.start and (x.end is None or x.end > f.start)}
            for rid in held:
                later = [x.start for x in self.by_run[rid] if x.start > f.start
                         and x.pid not in pids]
                if later:
                    # a server outage or OOM meanwhile holds the reaper back: counted apart
                    during = any(g.kind in ("server_sigkill", "server_shutdown", "oom")
                                 and g.covers(f.start, min(later)) for g in self.faults.faults)
                    key = f"{kind}, server away or at maxmemory meanwhile" if during else kind
                    gaps.setdefault(key, []).append(min(later) - f.start)
        for kind, g in gaps.items():
            self.report.counts[f"{kind}: runs restarted elsewhere"] = len(g)
            self.report.counts[f"{kind}: restart delay worst/median s"] = (
                round(max(g), 3), round(statistics.median(g), 3))
        late = sum(1 for r in self.snap.runs.values() for e in r.attempts if e.late)
        self.report.counts["late results refused (recorded on their attempt)"] = late
        self.restart_modes()
        self.report.counts["executions"] = len(self.execs)
        self.report.counts["faults"] = self.faults.summary()
