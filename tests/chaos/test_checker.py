"""The invariant checker catches each kind of breach (so a clean chaos run means something),
and forgives a breach only inside the window a restart mode may lose."""

from __future__ import annotations

from datetime import timedelta

import duetime
from tests.apps import chaos as chaos_app
from tests.chaos.checker import Checker, Report
from tests.chaos.faults import Fault, FaultLog
from tests.chaos.journal import Execution
from tests.chaos.load import ScheduleSpec, Submitted
from tests.chaos.snapshot import Entry, Record, Snapshot

T0 = 1_800_000_000.0
NOW = T0 + 100
W1, W2 = "host:101:aa", "host:202:bb"
PIDS = {101: "w1", 202: "w2"}


def entry(fence: int, worker: str, start: float, end: float, outcome: str, error: str = "",
          n: int | None = None) -> Entry:
    return Entry(n or fence, fence, worker, start, end, outcome, error, False, "")


def record(rid: str, state: str, attempts: list[Entry], task: str = "chaos.quick",
           **fields: str) -> Record:
    f = {"state": state, "task": task, "queue": "default", "fence": str(len(attempts)),
         "attempt": str(len(attempts)), "max_attempts": "7", "due": str(int(T0 * 1000)),
         **fields}
    return Record(rid, 0, f, attempts)


def execution(rid: str, fence: int, pid: int, start: float, end: float | None,
              outcome: str = "ok", task: str = "chaos.quick") -> Execution:
    worker = W1 if pid == 101 else W2
    return Execution(rid, task, fence, fence, pid, worker, start, end, outcome if end else "")


def check(records: list[Record], executions: list[Execution], faults: FaultLog | None = None,
          submitted: list[str] | None = None, specs: list[ScheduleSpec] | None = None,
          schedules: dict[str, dict[str, str]] | None = None) -> Report:
    index: dict[str, dict[str, float]] = {}
    where = {"succeeded": "done", "dead": "dead", "uncertain": "uncertain", "missed": "done",
             "skipped": "done", "running": "leases"}
    for r in records:
        name = where.get(r.state, f"due:{r.queue}" if r.state == "scheduled" else "retry:default")
        index.setdefault(name, {})[r.id] = 0.0
    snap = Snapshot(NOW, {r.id: r for r in records}, index, schedules or {})
    subs = [Submitted(rid, "chaos.quick", rid, T0, T0 + 0.01) for rid in
            (submitted if submitted is not None else [r.id for r in records if "@" not in r.id])]
    return Checker(snap, executions, faults or FaultLog(), subs, specs or [], 2.0, PIDS,
                   NOW - 10).run()


def ok_run(rid: str = "r1", start: float = T0 + 1) -> tuple[Record, Execution]:
    return (record(rid, "succeeded", [entry(1, W1, start, start + 0.1, "succeeded")]),
            execution(rid, 1, 101, start + 0.01, start + 0.05))


def killed(pid: int, at: float, name: str = "w1") -> Fault:
    return Fault("sigkill", name, at, at, {"pid": pid})


def test_a_clean_story_passes() -> None:
    r, x = ok_run()
    assert check([r], [x]).ok


def test_an_acknowledged_run_without_a_record_is_lost() -> None:
    r, x = ok_run()
    rep = check([r], [x], submitted=["r1", "gone"])
    assert any("gone" in v and "lost" in v for v in rep.violations)


def test_a_record_in_no_index_has_vanished() -> None:
    r, x = ok_run()
    rep = check([r], [x])
    assert rep.ok
    snap_less = check([r], [x])
    # the same record, but its index entry deleted
    checker_input = Snapshot(NOW, {"r1": r}, {}, {})
    rep = Checker(checker_input, [x], FaultLog(), [Submitted("r1", "t", "k", T0, T0)], [], 2.0,
                  PIDS).run()
    assert snap_less.ok and any("not in the done index" in v for v in rep.violations)


def test_a_run_left_scheduled_or_running_is_not_settled() -> None:
    r = record("r1", "scheduled", [])
    r2 = record("r2", "running", [])
    rep = check([r, r2], [])
    assert any("r1: still scheduled" in v for v in rep.violations)
    assert any("r2: still running" in v for v in rep.violations)


def test_overlap_is_allowed_only_after_the_earlier_lease_expired() -> None:
    # w1 ran fence 1 from T0+1 to T0+5; w2 started fence 2 at T0+4
    a1 = entry(1, W1, T0 + 1, T0 + 3.5, "unknown", "lease expired")
    a2 = entry(2, W2, T0 + 3.9, T0 + 4.5, "succeeded")
    x1 = execution("r1", 1, 101, T0 + 1.01, T0 + 5)
    x2 = execution("r1", 2, 202, T0 + 4, T0 + 4.4)
    stalled = FaultLog()
    stalled.faults.append(Fault("stall", "w1", T0 + 1.5, T0 + 5))
    assert check([record("r1", "succeeded", [a1, a2])], [x1, x2], stalled).ok

    # the history says attempt 1 failed: the overlap has no excuse
    a1_failed = entry(1, W1, T0 + 1, T0 + 3.5, "failed", "boom")
    rep = check([record("r1", "succeeded", [a1_failed, a2])], [x1, x2], stalled)
    assert any("overlapped" in v for v in rep.violations)

    # the lease was settled only after the second execution started
    a1_late = entry(1, W1, T0 + 1, T0 + 4.2, "unknown", "lease expired")
    rep = check([record("r1", "succeeded", [a1_late, a2])], [x1, x2], stalled)
    assert any("overlapped" in v for v in rep.violations)


def test_two_executions_under_one_fence_are_two_owners() -> None:
    r = record("r1", "succeeded", [entry(1, W1, T0 + 1, T0 + 2, "succeeded")])
    xs = [execution("r1", 1, 101, T0 + 1, T0 + 1.5), execution("r1", 1, 202, T0 + 1.7, T0 + 1.9)]
    rep = check([r], xs)
    assert any("two executions hold fence 1" in v for v in rep.violations)


def test_a_lease_expiry_needs_a_fault_on_its_holder() -> None:
    a1 = entry(1, W1, T0 + 1, T0 + 3.5, "unknown", "lease expired")
    a2 = entry(2, W2, T0 + 3.6, T0 + 4, "succeeded")
    xs = [execution("r1", 1, 101, T0 + 1.01, None), execution("r1", 2, 202, T0 + 3.7, T0 + 3.8)]
    rec = record("r1", "succeeded", [a1, a2])
    rep = check([rec], xs)
    assert any("expired, but no fault hit its holder" in v for v in rep.violations)

    other = FaultLog()
    other.faults.append(killed(202, T0 + 1.2, "w2"))  # the wrong worker
    assert not check([rec], xs, other).ok
    right = FaultLog()
    right.faults.append(killed(101, T0 + 1.2))
    assert check([rec], xs, right).ok


def test_the_history_must_agree_with_the_journal() -> None:
    # Redis accepted a success the execution never returned
    r = record("r1", "succeeded", [entry(1, W1, T0 + 1, T0 + 2, "succeeded")])
    rep = check([r], [execution("r1", 1, 101, T0 + 1, T0 + 1.5, outcome="raised")])
    assert any("accepted as succeeded" in v for v in rep.violations)
    # two successes accepted for one run
    two = record("r2", "succeeded", [entry(1, W1, T0 + 1, T0 + 2, "succeeded"),
                                     entry(2, W1, T0 + 3, T0 + 4, "succeeded")])
    rep = check([two], [execution("r2", 1, 101, T0 + 1, T0 + 1.5),
                        execution("r2", 2, 101, T0 + 3, T0 + 3.5)])
    assert any("2 successes accepted" in v for v in rep.violations)


def test_outcomes_must_match_what_was_injected() -> None:
    failing_ok = record("f1", "succeeded", [entry(1, W1, T0 + 1, T0 + 2, "succeeded")],
                        task=chaos_app.failing.name)
    idem_uncertain = record("u1", "uncertain", [entry(1, W1, T0 + 1, T0 + 2, "unknown",
                                                      "lease expired")])
    quick_dead = record("d1", "dead", [entry(1, W1, T0 + 1, T0 + 2, "failed", "boom")],
                        reason="boom")
    missed = record("m1", "missed", [])
    rep = check([failing_ok, idem_uncertain, quick_dead, missed],
                [execution("f1", 1, 101, T0 + 1, T0 + 1.5, task=chaos_app.failing.name),
                 execution("d1", 1, 101, T0 + 1, T0 + 1.5, outcome="raised")])
    text = "\n".join(rep.violations)
    assert "f1: a chaos.failing run ended succeeded" in text
    assert "u1 (chaos.quick): uncertain" in text
    assert "d1 (chaos.quick): dead" in text
    assert "m1: missed" in text


def test_every_occurrence_of_a_schedule_needs_exactly_its_run() -> None:
    spec = ScheduleSpec("s", duetime.Every(timedelta(seconds=1)), chaos_app.tick)
    created = int(T0 * 1000)
    runs = [record(f"s@{created + k * 1000}", "succeeded", [], schedule="s",
                   occurrence=str(created + k * 1000)) for k in range(1, 93)]
    del runs[10]  # one occurrence without its run
    runs.append(record(f"s@{created + 1500}", "succeeded", [], schedule="s",
                       occurrence=str(created + 1500)))  # one run of a non-occurrence
    rep = check(runs, [], specs=[spec], schedules={"s": {"created": str(created)}})
    text = "\n".join(rep.violations)
    assert "schedule s: 1 occurrence(s) without a run" in text
    assert f"non-occurrences [{created + 1500}]" in text


def test_losses_inside_an_everysec_kill_window_are_allowed_and_reported_apart() -> None:
    r, x = ok_run()
    faults = FaultLog()
    faults.faults.append(Fault("server_sigkill", "server", T0 + 0.5, T0 + 1,
                               {"fsync": "everysec"}))
    rep = check([r], [x], faults, submitted=["r1", "gone"])  # 'gone' acked at T0 + 0.01
    assert rep.ok and any("gone" in a for a in rep.allowed)

    always = FaultLog()
    always.faults.append(Fault("server_sigkill", "server", T0 + 0.5, T0 + 1, {"fsync": "always"}))
    rep = check([r], [x], always, submitted=["r1", "gone"])
    assert any("gone" in v for v in rep.violations)


def test_a_server_restart_explains_the_expiries_it_caused_but_not_later_ones() -> None:
    a1 = entry(1, W1, T0 + 1, T0 + 4, "unknown", "lease expired")
    a2 = entry(2, W2, T0 + 4.1, T0 + 4.5, "succeeded")
    xs = [execution("r1", 1, 101, T0 + 1.01, T0 + 1.5), execution("r1", 2, 202, T0 + 4.2, T0 + 4.3)]
    rec = record("r1", "succeeded", [a1, a2])
    restart = FaultLog()
    restart.faults.append(Fault("server_shutdown", "server", T0 + 2, T0 + 3, {"fsync": "always"}))
    assert check([rec], xs, restart).ok
    long_ago = FaultLog()  # the server came back 10 s before the lease expired
    long_ago.faults.append(Fault("server_shutdown", "server", T0 - 12, T0 - 11, {"fsync": "always"}))
    assert any("no fault hit its holder" in v for v in check([rec], xs, long_ago).violations)
    oom = FaultLog()  # at maxmemory heartbeats go on: memory pressure explains no expiry
    oom.faults.append(Fault("oom", "server", T0 + 2, T0 + 3))
    assert any("no fault hit its holder" in v for v in check([rec], xs, oom).violations)


def test_a_skip_needs_another_run_of_its_schedule_running_at_that_moment() -> None:
    runner = record("chaos-skip@1000", "succeeded", [entry(1, W1, T0 + 1, T0 + 3.5, "succeeded")],
                    schedule="chaos-skip", occurrence="1000")
    skipped = record("chaos-skip@2000", "skipped", [], schedule="chaos-skip", occurrence="2000",
                     finished=str(int((T0 + 2) * 1000)))
    late = record("chaos-skip@3000", "skipped", [], schedule="chaos-skip", occurrence="3000",
                  finished=str(int((T0 + 5) * 1000)))
    x = execution("chaos-skip@1000", 1, 101, T0 + 1.01, T0 + 3.4, task="chaos.long_tick")
    rep = check([runner, skipped, late], [x], submitted=[])
    assert not any("chaos-skip@2000: skipped" in v for v in rep.violations)
    assert any("chaos-skip@3000: skipped" in v for v in rep.violations)


def test_a_success_adopted_from_an_older_body_on_the_same_worker_is_no_phantom() -> None:
    """The worker claimed the run again (fence 2) while fence 1's body still ran on it, waited
    for that body and reported its success under fence 2."""
    a1 = entry(1, W1, T0 + 1, T0 + 3, "unknown", "lease expired")
    a2 = entry(2, W1, T0 + 3.1, T0 + 4.1, "succeeded")
    stopped = FaultLog()
    stopped.faults.append(Fault("sigstop", "w1", T0 + 1.5, T0 + 3.05, {"pid": 101}))
    body = execution("r1", 1, 101, T0 + 1.01, T0 + 4.0)
    assert check([record("r1", "succeeded", [a1, a2])], [body], stopped).ok
    elsewhere = execution("r1", 1, 202, T0 + 1.01, T0 + 4.0)  # another process's body: no
    rep = check([record("r1", "succeeded", [a1, a2])], [elsewhere], stopped)
    assert any("accepted as succeeded, but its execution never ran" in v for v in rep.violations)
