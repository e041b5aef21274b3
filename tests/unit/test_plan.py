"""Pure planning of occurrences into runs: catch-up policies, jitter, cursors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from duetime.common.schedules import jitter_for, plan
from duetime.common.timespec import At, Every

T0 = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
MIN = 60_000
every_min = Every(timedelta(minutes=1))


def test_on_time_occurrences_up_to_the_lead():
    p = plan(every_min, T0, T0 - 500, 2000, name="s", catchup="skip", max_catchup=10)
    assert [r.occurrence_ms for r in p.runs] == [T0] and p.skipped == 0 and p.next_ms == T0 + MIN


def test_nothing_due_yet_keeps_the_cursor():
    p = plan(every_min, T0, T0 - 10_000, 2000, name="s", catchup="all", max_catchup=10)
    assert p.runs == [] and p.next_ms == T0


def test_catchup_all_keeps_the_newest_max_catchup_and_skips_the_rest():
    now = T0 + 10 * MIN + 1000  # occurrences T0..T0+9min missed, T0+10min on time
    p = plan(every_min, T0, now, 2000, name="s", catchup="all", max_catchup=3)
    occ = [r.occurrence_ms for r in p.runs]
    assert occ == [T0 + 7 * MIN, T0 + 8 * MIN, T0 + 9 * MIN, T0 + 10 * MIN]
    assert p.skipped == 7 and p.next_ms == T0 + 11 * MIN


def test_catchup_latest_makes_one_run_standing_for_all_missed():
    now = T0 + 10 * MIN + 1000
    p = plan(every_min, T0, now, 2000, name="s", catchup="latest", max_catchup=3)
    first, ontime = p.runs
    assert first.occurrence_ms == T0 + 9 * MIN and first.coalesced == 10
    assert first.coalesced_from_ms == T0 and ontime.occurrence_ms == T0 + 10 * MIN
    assert p.skipped == 0


def test_catchup_skip():
    now = T0 + 10 * MIN + 1000
    p = plan(every_min, T0, now, 2000, name="s", catchup="skip", max_catchup=3)
    assert [r.occurrence_ms for r in p.runs] == [T0 + 10 * MIN] and p.skipped == 10


def test_a_short_hiccup_is_a_late_start_not_a_miss():
    p = plan(every_min, T0, T0 + 5000, 2000, name="s", catchup="skip", max_catchup=3)
    assert [r.occurrence_ms for r in p.runs] == [T0] and p.skipped == 0


def test_one_time_trigger_ends_the_cursor():
    at = At(datetime(2026, 1, 1, tzinfo=UTC))
    p = plan(at, T0, T0, 2000, name="s", catchup="all", max_catchup=3)
    assert [r.occurrence_ms for r in p.runs] == [T0] and p.next_ms is None


def test_jitter_is_stable_and_bounded():
    vals = [jitter_for("s", T0 + i * MIN, 30_000) for i in range(200)]
    assert vals == [jitter_for("s", T0 + i * MIN, 30_000) for i in range(200)]
    assert all(0 <= v < 30_000 for v in vals) and len(set(vals)) > 150
    p = plan(every_min, T0, T0, 2000, name="s", catchup="all", max_catchup=3, jitter_ms=30_000)
    assert p.runs[0].due_ms == T0 + jitter_for("s", T0, 30_000)


def test_triggers_round_trip_through_hash_fields():
    from duetime.common.schedules import trigger_fields, trigger_from_fields
    from duetime.common.timespec import Cron

    for t in (Cron("H 9 * * MON-FRI", tz="Europe/Paris", dst_gap="skip", seed="x"),
              Every(timedelta(minutes=90)), At(datetime(2026, 5, 1, tzinfo=UTC))):
        f = trigger_fields(t)
        assert all(len(str(v)) <= 64 for v in f.values())  # keeps the hash compact in Redis
        raw = {k: str(v).encode() for k, v in f.items()}
        assert trigger_from_fields(raw) == t
