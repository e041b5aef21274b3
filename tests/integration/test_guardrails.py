"""Schedule guardrails: pause_after_failures, start, end, max_runs (docs/operations.md).

Time is controlled: occurrences are made due at once with backfill (runs of past
occurrences, ids `<schedule>@<ms>` like the evaluator's), and the evaluator is given a lead
long enough to reach the bounds in one tick -- nothing waits for the clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from duetime.common import metrics
from duetime.scheduler.evaluator import Evaluator

import duetime
from tests import schedrec
from tests.apps import basic
from tests.integration.inproc import burst

DAY = datetime(2026, 1, 5, tzinfo=UTC)
HOURLY = duetime.Cron("0 * * * *")


def _hours(app, name: str, first: int, n: int) -> list[str]:
    """Make the runs of hours first..first+n-1 of DAY (due now: they are past)."""
    start = DAY + timedelta(hours=first)
    assert app.backfill(name, start, start + timedelta(hours=n - 1)) == (n, n)
    return [f"{name}@{int((start + timedelta(hours=h)).timestamp() * 1000)}" for h in range(n)]


def _sched(app, name: str) -> dict[str, str]:
    h = schedrec.record(app.store.client, app.keys, name)  # either layout, by field name
    return {k.decode(): v.decode(errors="replace") for k, v in h.items() if k != b"payload"}


def _auto_paused_total() -> float:
    return metrics.AUTO_PAUSED._value.get()


def test_pauses_after_exactly_n_consecutive_dead_occurrences_never_cancels_or_replays(app):
    app.schedule("guard", HOURLY, basic.fatal, pause_after_failures=3)
    _hours(app, "guard", 0, 2)
    burst(app)
    s = _sched(app, "guard")
    assert s["fail_streak"] == "2" and s["paused"] == "0"

    # a cancel does not count (nor reset)
    (cancelled,) = _hours(app, "guard", 2, 1)
    app.cancel(cancelled)
    burst(app)
    assert app.get_run(cancelled).state == "cancelled"
    assert _sched(app, "guard")["fail_streak"] == "2"

    # an operator's replay that dies again does not count
    dead = next(i for i in _hours(app, "guard", 3, 1))
    app.resume("guard")  # (not paused: resuming is harmless) -- but it resets the count
    assert "fail_streak" not in _sched(app, "guard")
    burst(app)
    assert app.get_run(dead).state == "dead"
    assert _sched(app, "guard")["fail_streak"] == "1"
    replay = app.replay(dead)
    burst(app)
    assert app.get_run(replay).state == "dead"
    assert _sched(app, "guard")["fail_streak"] == "1"

    # a success resets the count
    app.schedule("guard", HOURLY, basic.noop, pause_after_failures=3)
    (ok,) = _hours(app, "guard", 4, 1)
    burst(app)
    assert app.get_run(ok).state == "succeeded"
    assert "fail_streak" not in _sched(app, "guard")

    # then exactly three dead occurrences in a row pause it, with a note, event and metric
    app.schedule("guard", HOURLY, basic.fatal, pause_after_failures=3)
    before = _auto_paused_total()
    _hours(app, "guard", 5, 2)
    burst(app)
    assert not app.get_schedule("guard").paused
    _hours(app, "guard", 7, 1)
    burst(app)
    info = app.get_schedule("guard")
    assert info.paused
    assert info.pause_note.startswith("paused after 3 consecutive dead runs; last error:")
    assert "cannot ever work" in info.pause_note
    assert info.guardrails["auto_paused"] == 3 and info.guardrails["fail_streak"] == 3
    assert _auto_paused_total() == before + 1
    p = app.keys.partition_of_schedule("guard")
    events = app.store.client.xrange(app.keys.events(p))
    assert [e for _, e in events if e[b"event"] == b"schedule_auto_paused"]
    # never due while paused (every schedule stays in its due index, a paused one at +inf)
    assert app.store.client.zscore(app.keys.sched_due(p), "guard") == float("inf")
    # resuming resets the count and the mark
    app.resume("guard")
    s = _sched(app, "guard")
    assert s["paused"] == "0" and "fail_streak" not in s and "auto_paused" not in s


def test_without_the_guardrail_dead_runs_never_pause(app):
    app.schedule("free", HOURLY, basic.fatal)
    _hours(app, "free", 0, 4)
    burst(app)
    assert not app.get_schedule("free").paused
    assert app.get_schedule("free").guardrails["fail_streak"] == 4


def test_max_runs_stops_after_n_runs_made_once(app, url):
    app.schedule("capped", duetime.Every(timedelta(minutes=1)), basic.noop, max_runs=3,
                 catchup="all")
    ev = Evaluator(url, app.keys, lead_ms=10 * 60_000)
    ev.tick()
    ev.tick()  # a second evaluation makes nothing more
    info = app.get_schedule("capped")
    assert info.materialized_count == 3 and info.next_fire is None
    assert info.guardrails["runs_made"] == 3 and info.guardrails["ended"] == "max_runs"
    # raising the cap goes on from the next occurrence without a run
    app.schedule("capped", duetime.Every(timedelta(minutes=1)), basic.noop, max_runs=5,
                 catchup="all")
    assert app.get_schedule("capped").guardrails["ended"] == ""
    ev.tick()
    info = app.get_schedule("capped")
    assert info.materialized_count == 5 and info.next_fire is None


def test_start_and_end_bound_the_occurrences(app, url):
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    start, end = now + timedelta(minutes=3), now + timedelta(minutes=6, seconds=30)
    app.schedule("window", duetime.Every(timedelta(minutes=1)), basic.noop, start=start,
                 end=end.isoformat())
    info = app.get_schedule("window")
    assert info.next_fire == start
    ev = Evaluator(url, app.keys, lead_ms=30 * 60_000)
    ev.tick()
    info = app.get_schedule("window")
    assert info.materialized_count == 4  # minutes 3, 4, 5, 6: none after end
    assert info.next_fire is None and info.guardrails["ended"] == "end"
    # a schedule whose end is past has no cursor at all
    app.schedule("over", duetime.Every(timedelta(minutes=1)), basic.noop,
                 end=now - timedelta(hours=1))
    assert app.get_schedule("over").next_fire is None


def test_bad_guardrails_are_refused(app):
    every = duetime.Every(timedelta(minutes=1))
    with pytest.raises(duetime.InvalidSchedule, match="naive"):
        app.schedule("g", every, basic.noop, start=datetime(2026, 1, 1))
    with pytest.raises(duetime.InvalidSchedule, match="before start"):
        app.schedule("g", every, basic.noop, start=DAY, end=DAY - timedelta(days=1))
    with pytest.raises(duetime.InvalidSchedule, match="pause_after_failures"):
        app.schedule("g", every, basic.noop, pause_after_failures=-1)
    with pytest.raises(duetime.InvalidSchedule, match="max_runs"):
        app.schedule("g", every, basic.noop, max_runs="3")  # type: ignore[typeddict-item]


def test_guardrails_unset_keep_the_definition_hash_and_are_cleared_when_removed(app):
    every = duetime.Every(timedelta(minutes=1))
    d = app.schedule_def("h", every, basic.noop)
    assert "max_runs" not in d.fields()
    app.schedule("h", every, basic.noop, max_runs=2, pause_after_failures=4)
    assert app.get_schedule("h").guardrails["max_runs"] == 2
    app.schedule("h", every, basic.noop)
    g = app.get_schedule("h").guardrails
    assert g["max_runs"] == 0 and g["pause_after_failures"] == 0


def test_schedule_add_guardrails_and_show_spells_every_default(app, url, namespace):
    from tests.integration.opkit import as_json, cli, ok

    app_ref = "tests.apps.basic:app"
    ok(cli(url, namespace, "schedule", "add", "plain", "--every", "1h", "--task", "noop",
           "--app", app_ref))
    text = ok(cli(url, namespace, "schedule", "show", "plain"))
    for line in ("catch-up: latest (default)", "max catch-up: 100 (default)",
                 "miss tolerance: 1m (default)", "lateness: none (no starting deadline) (default)",
                 "overlap: allow (default)", "jitter: none (default)",
                 "stagger: namespace policy (none) (default)", "calendar: none (default)",
                 "pause after failures: never (now 0 consecutive dead runs) (default)",
                 "start: none (default)", "end: none (default)",
                 "max runs: none (unlimited) (default)"):
        assert f"    {line}\n" in text + "\n", line
    ok(cli(url, namespace, "schedule", "add", "guarded", "--every", "1h", "--task", "noop",
           "--app", app_ref, "--overlap", "skip", "--pause-after-failures", "5",
           "--start", "2030-01-01T00:00:00Z", "--end", "2031-01-01T00:00:00Z",
           "--max-runs", "10"))
    text = ok(cli(url, namespace, "schedule", "show", "guarded"))
    assert "    overlap: skip\n" in text
    assert "    pause after failures: 5 consecutive dead runs (now 0)\n" in text
    assert "    start: 2030-01-01T00:00:00Z\n" in text and "    max runs: 10 (10 remaining)\n" in text
    shown = as_json(cli(url, namespace, "schedule", "show", "guarded", "--json"))
    pol = shown["policies"]
    assert pol["overlap"] == {"value": "skip", "default": False, "text": "skip"}
    assert pol["catchup"]["default"] is True and pol["calendar"]["value"] is None
    assert pol["pause_after_failures"]["value"] == 5 and pol["max_runs_remaining"]["value"] == 10
    assert pol["start"]["value"] == "2030-01-01T00:00:00Z"
    assert shown["next_fire"] == "2030-01-01T00:00:00Z"


def test_a_lease_expired_for_good_counts_in_the_reaper_s_step(app, url):
    """The dead transition of reap.lua (lease expired, no attempt left) counts too, and the
    reaper -- the process whose script paused the schedule -- counts the metric."""
    from duetime.common import transitions as tr
    from duetime.common.scripts import Scripts
    from duetime.scheduler.reaper import Reaper

    app.schedule("leased", HOURLY, basic.times_out, pause_after_failures=1)  # retries=0
    (run_id,) = _hours(app, "leased", 0, 1)
    k, r = app.keys, app.store.client
    p = k.partition_of_run(run_id)
    keys, args = tr.claim(k, p, "default", "w", 10, 60_000, 0)
    claimed = tr.parse_claim(Scripts(r).claim(keys=keys, args=args)).runs
    assert [c.run_id for c in claimed] == [run_id]
    r.zadd(k.leases(p), {run_id: 0})  # the lease expired: its worker is gone
    before = _auto_paused_total()
    rp = Reaper(url, k)
    try:
        assert rp.reap_once() == 1
    finally:
        rp.close()
    assert app.get_run(run_id).state == "dead"
    info = app.get_schedule("leased")
    assert info.paused and "paused after 1 consecutive dead runs; last error: lease expired" in (
        info.pause_note or "")
    assert _auto_paused_total() == before + 1
