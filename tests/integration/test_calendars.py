"""Business calendars and data intervals end to end: calendars stored in the namespace and read
back as dates, the evaluator skipping or rolling occurrences on excluded days (skipped runs
with the calendar's name and version, counters), intervals on normal, catch-up and backfill
runs, and a US (New York) and a UK holiday calendar on a daily 09:00 schedule over 2026-2027
matching the `holidays` package."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import holidays
import pytest
from click.testing import CliRunner
from duetime.common.connection import server_time_ms
from duetime.common.time.parse import from_ms, to_ms
from duetime.scheduler.evaluator import Evaluator

import duetime
from duetime.cli import main
from tests.apps import basic
from tests.integration.inproc import burst
from tests.integration.test_schedules import runs_of

DAY_MS = 86_400_000


def _midnight_ms(ms: int, days: int = 0) -> int:
    return (ms // DAY_MS + days) * DAY_MS


_EVALUATORS: dict[str, Evaluator] = {}


def _evaluate_at(url, app, at_ms: int) -> Evaluator:
    """The test's evaluator (one: it keeps its partitions) with its clock at `at_ms`: time is
    moved, not slept through."""
    ev = _EVALUATORS.get(app.keys.namespace)
    if ev is None:
        ev = _EVALUATORS[app.keys.namespace] = Evaluator(url, app.keys, lead_ms=0,
                                                         miss_tolerance_ms=1000)
    ev._now_ms = lambda: at_ms  # type: ignore[method-assign]
    ev.tick()
    return ev


@pytest.mark.parametrize(("country", "subdiv", "zone"), [("US", "NY", "America/New_York"),
                                                         ("GB", None, "Europe/London")])
def test_a_holiday_calendar_on_a_daily_0900_schedule_matches_the_holidays_package(
        app, country, subdiv, zone):
    """Every business day of 2026-2027 fires, every holiday and weekend does not (skip) or
    rolls to the next business day (next), through the stored calendar and a backfill."""
    assert app.calendar("biz", country=country, subdiv=subdiv) == "created"
    assert app.calendar("biz", country=country, subdiv=subdiv) == "unchanged"
    expected_off = set(holidays.country_holidays(country, subdiv=subdiv, years=[2026, 2027]))
    stored = app.get_calendar("biz").calendar
    assert {d for d in stored.excluded if d.year in (2026, 2027)} == expected_off
    days = [date(2026, 1, 1) + timedelta(days=i) for i in range((date(2028, 1, 1) - date(2026, 1, 1)).days)]
    business = [d for d in days if d.weekday() < 5 and d not in expected_off]
    tz = ZoneInfo(zone)
    lo, hi = datetime(2026, 1, 1, tzinfo=tz), datetime(2027, 12, 31, 23, 59, tzinfo=tz)

    app.schedule("daily", duetime.Cron("0 9 * * *", tz=zone), basic.noop, calendar="biz")
    assert app.backfill("daily", lo, hi) == (len(business), len(business))
    fired = sorted(run.due.astimezone(tz) for run in runs_of(app, "daily"))
    assert [f.date() for f in fired] == business
    assert all((f.hour, f.minute) == (9, 0) for f in fired)

    app.schedule("rolled", duetime.Cron("0 9 * * *", tz=zone), basic.noop, calendar="biz",
                 on_excluded="next")
    # every day's 09:00 lands on a business day: the business days themselves, each once
    # (a holiday's and a weekend's occurrences roll onto the next business day's 09:00)
    assert app.backfill("rolled", lo, hi)[0] == len(business)
    app.schedule("back", duetime.Cron("0 9 * * *", tz=zone), basic.noop, calendar="biz",
                 on_excluded="previous")
    got = app.schedules.backfill_intervals("back", lo, hi)
    assert [from_ms(o).astimezone(tz).date() for _, o in got] == business


def test_the_evaluator_records_excluded_occurrences_as_skipped_and_rolls(app, url):
    now = server_time_ms(app.store.client)
    tomorrow = from_ms(_midnight_ms(now, 1)).date()
    app.calendar("off", dates=[tomorrow], weekdays="mon-sun")
    app.schedule("hourly-skip", duetime.Cron("0 * * * *"), basic.noop, calendar="off",
                 catchup="all")
    app.schedule("hourly-next", duetime.Cron("0 * * * *"), basic.noop, calendar="off",
                 on_excluded="next", catchup="all")
    info = app.get_schedule("hourly-skip")
    assert info.calendar == "off" and info.on_excluded == "skip"
    # evaluated at noon the day after tomorrow: today's remaining hours ran (caught up),
    # tomorrow's 24 are skipped (skip) or rolled onto the day after's same hours (next)
    at = _midnight_ms(now, 2) + 12 * 3_600_000 + 500
    _evaluate_at(url, app, at)
    runs = runs_of(app, "hourly-skip")
    skipped = [r for r in runs if r.state == "skipped"]
    assert [from_ms(int(r.id.rsplit("@", 1)[1])).date() for r in skipped] == [tomorrow] * 24
    assert {r.reason for r in skipped} == {"excluded by calendar off v1"}
    info = app.get_schedule("hourly-skip")
    assert info.excluded_count == 24 and info.skipped_count == 24
    assert all(r.due.date() != tomorrow for r in runs if r.state == "scheduled")
    rolled = runs_of(app, "hourly-next")
    assert not [r for r in rolled if r.due.date() == tomorrow]
    after = [r for r in rolled if r.due.date() == tomorrow + timedelta(days=1)]
    assert len(after) == 13  # 00:00..12:00, each once although two occurrences land on it
    # the first run after the excluded day: its interval starts at the last hour before it
    first_after = min((r for r in runs if r.state == "scheduled" and r.due.date() > tomorrow),
                      key=lambda r: r.due)
    assert first_after.interval_start == from_ms(_midnight_ms(now, 1) - 3_600_000)
    assert first_after.interval_end == first_after.due
    # the timeline shows the skipped occurrence with its reason
    from duetime.web.timeline import timeline

    occ, _ = timeline(app.schedules, app.get_schedule("hourly-skip"), from_ms(at), from_ms(at),
                      count=48)
    excluded = [o for o in occ if o.utc.date() == tomorrow]
    assert excluded and all(o.status == "skipped" and "calendar off v1" in o.detail for o in excluded)
    occ, _ = timeline(app.schedules, app.get_schedule("hourly-next"), from_ms(at), from_ms(at),
                      count=48)
    moved = [o for o in occ if o.utc.date() == tomorrow]
    assert moved and all(o.status == "moved" and o.run_id == f"hourly-next@{o.ms + DAY_MS}"
                         for o in moved)


def test_a_calendar_edited_applies_from_the_next_occurrence_without_a_run(app, url):
    now = server_time_ms(app.store.client)
    day2 = from_ms(_midnight_ms(now, 2)).date()
    app.calendar("edit", weekdays="mon-sun")
    app.schedule("edited", duetime.Cron("0 6 * * *"), basic.noop, calendar="edit", catchup="all")
    _evaluate_at(url, app, _midnight_ms(now, 1) + 6 * 3_600_000 + 100)  # day 1's 06:00 runs
    assert app.calendar("edit", dates=[day2], weekdays="mon-sun") == "updated"
    assert app.get_calendar("edit").version == 2
    _evaluate_at(url, app, _midnight_ms(now, 3) + 6 * 3_600_000 + 100)
    runs = {r.due.date(): r for r in runs_of(app, "edited")}
    assert runs[day2].state == "skipped" and runs[day2].reason == "excluded by calendar edit v2"
    assert runs[day2 + timedelta(days=1)].state == "scheduled"
    assert runs[day2 + timedelta(days=1)].interval_start == runs[day2 - timedelta(days=1)].due


def test_intervals_on_normal_and_catch_up_runs(app, url):
    now = server_time_ms(app.store.client)
    app.schedule("iv", duetime.Every(timedelta(minutes=10)), basic.noop, catchup="latest")
    cursor = to_ms(app.get_schedule("iv").next_fire)
    _evaluate_at(url, app, cursor + 100)  # on time: one run for its own ten minutes
    first = runs_of(app, "iv")
    assert len(first) == 1
    assert (first[0].interval_start, first[0].interval_end) == (
        from_ms(cursor - 600_000), from_ms(cursor))
    # six occurrences missed: one catch-up run covering all of them
    _evaluate_at(url, app, cursor + 6 * 600_000 + 5000)  # past the tolerance: all six missed
    catch = [r for r in runs_of(app, "iv") if r.coalesced > 1]
    assert len(catch) == 1 and catch[0].coalesced == 6
    assert catch[0].interval_start == from_ms(cursor)  # from the last run's occurrence
    assert catch[0].interval_end == from_ms(cursor + 6 * 600_000)
    assert now < cursor + 600_000


def test_backfill_one_run_per_interval_in_order_once(app, url):
    app.calendar("wk")  # Monday-Friday
    app.schedule("bf", duetime.Cron("0 0 * * *"), basic.noop, calendar="wk")
    lo, hi = "2026-03-02T00:00:00Z", "2026-03-15T23:59:00Z"  # two weeks, Monday to Sunday
    runner = CliRunner()
    env = {"DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": app.keys.namespace}
    dry = runner.invoke(main, ["schedule", "backfill", "bf", "--from", lo, "--to", hi, "--dry-run"],
                        env=env)
    assert dry.exit_code == 0, dry.output
    assert "10 occurrence(s); dry run" in dry.output and runs_of(app, "bf") == []
    assert "interval 2026-03-06T00:00:00Z .. 2026-03-09T00:00:00Z" in dry.output  # Fri -> Mon
    res = runner.invoke(main, ["schedule", "backfill", "bf", "--from", lo, "--to", hi], env=env)
    assert res.exit_code == 0, res.output
    assert app.backfill("bf", lo, hi) == (10, 0)  # again: create-once ids, nothing doubled
    runs = runs_of(app, "bf")
    assert len(runs) == 10
    for a, b in zip(runs, runs[1:], strict=False):
        assert b.interval_start == a.interval_end == a.due
    assert runs[0].interval_start == datetime(2026, 2, 27, tzinfo=UTC)  # the Friday before
    shown = runner.invoke(main, ["runs", "show", runs[1].id, "--json"], env=env)
    assert shown.exit_code == 0, shown.output
    d = json.loads(shown.stdout)
    assert (d["interval_start"], d["interval_end"]) == ("2026-03-02T00:00:00Z", "2026-03-03T00:00:00Z")


def test_calendar_cli_add_show_list_delete(app, url, tmp_path):
    runner = CliRunner()
    env = {"DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": app.keys.namespace}
    ics = ("BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//t//t//EN\r\nBEGIN:VEVENT\r\nUID:1\r\n"
           "DTSTART;VALUE=DATE:20260703\r\nDTEND;VALUE=DATE:20260704\r\nSUMMARY:Shutdown\r\n"
           "RRULE:FREQ=YEARLY\r\nEND:VEVENT\r\nBEGIN:VEVENT\r\nUID:2\r\n"
           "DTSTART:20260705T100000Z\r\nSUMMARY:timed, not a day off\r\nEND:VEVENT\r\n"
           "END:VCALENDAR\r\n")
    (tmp_path / "plant.ics").write_text(ics)
    res = runner.invoke(main, ["calendar", "add", "plant", "--ics", str(tmp_path / "plant.ics"),
                               "--date", "2026-12-24", "--weekdays", "mon-sat"], env=env)
    assert res.exit_code == 0, res.output
    assert "created calendar plant v1" in res.output
    cal = app.get_calendar("plant").calendar
    assert date(2026, 7, 3) in cal.excluded and date(2027, 7, 3) in cal.excluded  # RRULE
    assert date(2026, 7, 5) not in cal.excluded and date(2026, 12, 24) in cal.excluded
    assert cal.weekdays == frozenset(range(6))
    shown = runner.invoke(main, ["calendar", "show", "plant", "--json"], env=env)
    assert json.loads(shown.stdout)["version"] == 1
    listed = runner.invoke(main, ["calendar", "list"], env=env)
    assert "plant" in listed.output
    assert runner.invoke(main, ["calendar", "delete", "plant"], env=env).exit_code == 0
    gone = runner.invoke(main, ["calendar", "show", "plant"], env=env)
    assert gone.exit_code != 0 and "no calendar" in gone.output


def test_schedule_add_takes_a_calendar_and_show_honours_it(app, url):
    runner = CliRunner()
    env = {"DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": app.keys.namespace}
    app.calendar("cli-cal", weekdays="mon-fri")
    res = runner.invoke(main, ["schedule", "add", "weekday-9", "--cron", "0 9 * * *", "--tz",
                               "Europe/Paris", "--task", "noop", "--app",
                               "tests.apps.basic:app", "--calendar", "cli-cal",
                               "--on-excluded", "next"], env=env)
    assert res.exit_code == 0, res.output
    info = app.get_schedule("weekday-9")
    assert (info.calendar, info.on_excluded) == ("cli-cal", "next")
    shown = runner.invoke(main, ["schedule", "show", "weekday-9", "--json"], env=env)
    fires = [datetime.fromisoformat(f["utc"].replace("Z", "+00:00"))
             for f in json.loads(shown.stdout)["next_fires"]]
    assert fires and all(f.astimezone(ZoneInfo("Europe/Paris")).weekday() < 5 for f in fires)
    bad = runner.invoke(main, ["schedule", "add", "x", "--every", "1h", "--task", "noop",
                               "--app", "tests.apps.basic:app", "--on-excluded", "next"], env=env)
    assert bad.exit_code == 2 and "--on-excluded needs --calendar" in bad.output


def test_a_task_reads_its_data_interval_from_current_run(app):
    app.calendar("wk2")  # Monday-Friday
    app.schedule("ctx", duetime.Cron("0 0 * * *"), basic.interval, calendar="wk2")
    assert app.backfill("ctx", "2026-03-05T00:00:00Z", "2026-03-09T00:00:00Z") == (3, 3)
    burst(app)
    got = {k.decode(): v.decode() for k, v in app.store.client.hgetall(basic.data_intervals_key()).items()}
    ms = [int(datetime(2026, 3, d, tzinfo=UTC).timestamp() * 1000) for d in (4, 5, 6, 9)]
    assert got == {  # Thursday, Friday, then Monday: its interval spans the weekend
        f"ctx@{ms[i + 1]}": f"{from_ms(ms[i]).isoformat()} {from_ms(ms[i + 1]).isoformat()}"
        for i in range(3)}


def test_an_edited_calendar_moves_a_far_cursor_at_once(app, url):
    """The edit brings the schedule due (its cursor is a day away), so the evaluator plans it
    again with the new version without waiting for the old cursor."""
    app.calendar("far", weekdays="mon-sun")
    app.schedule("far-s", duetime.Cron("0 6 * * *"), basic.noop, calendar="far")
    cursor = app.get_schedule("far-s").next_fire
    now = server_time_ms(app.store.client)
    _evaluate_at(url, app, now)  # nothing due: the cursor stays
    assert app.get_schedule("far-s").next_fire == cursor
    app.calendar("far", dates=[cursor.date()], weekdays="mon-sun")
    _evaluate_at(url, app, now + 1000)
    info = app.get_schedule("far-s")
    assert info.next_fire == cursor + timedelta(days=1) and runs_of(app, "far-s") == []
    assert "far v2" in app.schedules.effective_trigger(info).describe()
