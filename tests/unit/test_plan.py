"""Pure planning of occurrences into runs: catch-up policies, jitter, cursors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from duetime.common.schedules import jitter_for, plan
from duetime.common.time.spec import At, Every

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
    from duetime.common.time.spec import Cron

    for t in (Cron("H 9 * * MON-FRI", tz="Europe/Paris", dst_gap="skip", seed="x"),
              Every(timedelta(minutes=90)), At(datetime(2026, 5, 1, tzinfo=UTC))):
        f = trigger_fields(t)
        assert all(len(str(v)) <= 64 for v in f.values())  # keeps the hash compact in Redis
        raw = {k: str(v).encode() for k, v in f.items()}
        assert trigger_from_fields(raw) == t


# -- catch-up: an occurrence whose successor is already due is missed --------------------
SEC = 1000
every_s = Every(timedelta(seconds=1))


def test_a_seven_second_outage_of_a_1s_schedule_runs_none_of_the_seven_with_skip():
    # the scheduler was down from T0 to T0 + 7.2 s: occurrences T0 .. T0+6s each have a
    # successor already due; T0+7s is the current one. A 10 s tolerance used to run all 8.
    p = plan(every_s, T0, T0 + 7 * SEC + 200, 0, name="s", catchup="skip", max_catchup=100,
             tolerance_ms=10_000)
    assert [r.occurrence_ms for r in p.runs] == [T0 + 7 * SEC]
    assert p.skipped == 7 and p.next_ms == T0 + 8 * SEC


def test_successor_rule_applies_to_latest_and_all_too():
    latest = plan(every_s, T0, T0 + 7 * SEC + 200, 0, name="s", catchup="latest",
                  max_catchup=100, tolerance_ms=10_000)
    first, current = latest.runs
    assert (first.occurrence_ms, first.coalesced, first.coalesced_from_ms) == (T0 + 6 * SEC, 7, T0)
    assert current.occurrence_ms == T0 + 7 * SEC
    everything = plan(every_s, T0, T0 + 7 * SEC + 200, 0, name="s", catchup="all",
                      max_catchup=3, tolerance_ms=10_000)
    assert [r.occurrence_ms for r in everything.runs] == [T0 + s * SEC for s in (4, 5, 6, 7)]
    assert everything.skipped == 4


def test_the_default_tolerance_keeps_a_daily_job_after_a_short_outage():
    daily = Every(timedelta(days=1))
    # evaluated 30 s late (a scheduler restart): still on time with the 60 s default
    p = plan(daily, T0, T0 + 30 * SEC, 0, name="d", catchup="skip", max_catchup=1)
    assert [r.occurrence_ms for r in p.runs] == [T0] and p.skipped == 0
    # two minutes late: missed, and skip drops it
    p = plan(daily, T0, T0 + 120 * SEC, 0, name="d", catchup="skip", max_catchup=1)
    assert p.runs == [] and p.skipped == 1 and p.next_ms == T0 + 86_400_000
    # a schedule's own longer tolerance keeps it
    p = plan(daily, T0, T0 + 120 * SEC, 0, name="d", catchup="skip", max_catchup=1,
             tolerance_ms=300_000)
    assert [r.occurrence_ms for r in p.runs] == [T0]


def test_default_miss_tolerance_is_one_minute_and_stored_per_schedule():
    from duetime.common.schedules import MISS_TOLERANCE_MS, ScheduleDef

    assert MISS_TOLERANCE_MS == 60_000
    assert ScheduleDef.durations(None, None) == (0, 0, 60_000)
    assert ScheduleDef.durations("5m", 1.5, "PT2M") == (300_000, 1_500, 120_000)
    base = dict(name="s", trigger=every_s, task="t", queue="q", payload=b"")
    default = ScheduleDef(**base)
    custom = ScheduleDef(**base, miss_tolerance_ms=5_000)
    assert default.fields()["miss_tolerance_ms"] == 60_000
    assert custom.fields()["miss_tolerance_ms"] == 5_000
    assert default.def_hash() != custom.def_hash()
    # hashed only away from its default: definitions stored before the field keep their hash
    without = dict(default.fields())
    del without["miss_tolerance_ms"]
    del without["stagger_ms"]  # `auto` (the policy), likewise hashed only when the schedule has its own
    assert default.def_hash() == _hash_of(without)


def _hash_of(f: dict) -> str:
    import hashlib

    h = hashlib.sha256()
    for k in sorted(f):
        v = f[k]
        h.update(k.encode() + b"\0" + (v if isinstance(v, bytes) else str(v).encode()) + b"\0")
    return h.hexdigest()[:16]


def test_schedule_durations_are_bounded():
    import pytest
    from duetime.common.errors import InvalidInput
    from duetime.common.schedules import ScheduleDef

    for bad, words in (("-1s", "expected a number"), (float("nan"), "finite"),
                       ("400d", "too large"), ("soon", "invalid lateness 'soon'")):
        with pytest.raises(InvalidInput, match=words):
            ScheduleDef.durations(bad, None)
    with pytest.raises(InvalidInput, match="miss tolerance '1y'"):
        ScheduleDef.durations(None, None, "1y")


# -- intervals that are not whole milliseconds -----------------------------------------------
def test_an_interval_of_a_seventh_of_a_minute_advances_one_occurrence_per_step():
    # 8.571428 s: each occurrence maps to the first ms at or after it. Before, the cursor was
    # truncated, next_after found the same occurrence again, and one evaluation walked 100k
    # copies of it without moving the cursor (the schedule froze, the evaluator spun).
    anchor = datetime(2026, 1, 1, tzinfo=UTC)
    seventh = Every(timedelta(minutes=1) / 7, anchor=anchor)
    start = int(anchor.timestamp() * 1000)
    p = plan(seventh, start, start + 60_001, 0, name="s", catchup="all", max_catchup=100,
             tolerance_ms=120_000)
    occ = [r.occurrence_ms for r in p.runs]
    assert len(occ) == 8 and occ[0] == start and len(set(occ)) == 8
    interval_us = seventh.interval // timedelta(microseconds=1)  # 8571429: anchor + k * that
    assert occ == [start + -(-(k * interval_us) // 1000) for k in range(8)]
    assert p.next_ms == start + -(-(8 * interval_us) // 1000) and p.next_ms > occ[-1]


def test_a_sub_millisecond_one_time_instant_is_not_walked_again():
    from duetime.common.time.parse import from_ms, to_ms

    at = At(datetime(2026, 1, 1, 0, 0, 0, 400, tzinfo=UTC))
    cursor = to_ms(at.next_after(from_ms(T0 - 5)), ceil=True)  # as the upsert computes it
    assert cursor == T0 + 1  # never due before its instant
    p = plan(at, cursor, T0 + 10, 0, name="s", catchup="all", max_catchup=3)
    assert [r.occurrence_ms for r in p.runs] == [T0 + 1] and p.next_ms is None


def test_intervals_under_a_millisecond_are_refused_for_a_schedule():
    import pytest
    from duetime.common.errors import InvalidSchedule
    from duetime.common.schedules import ScheduleDef

    with pytest.raises(InvalidSchedule, match="every interval 500us is shorter than 1ms"):
        ScheduleDef(name="s", trigger=Every(timedelta(microseconds=500)), task="t", queue="q",
                    payload=b"")
    ScheduleDef(name="s", trigger=Every(timedelta(minutes=1) / 7), task="t", queue="q",
                payload=b"")
