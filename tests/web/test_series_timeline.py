"""What the console plots and the schedule timeline, against a real Valkey: the per-queue
samples schedulers keep (one per step, whoever writes first, capped), and what became of each
occurrence of a schedule (read by derived run id)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from duetime.common import series
from duetime.common import transitions as tr
from duetime.common.models import from_ms, to_ms
from duetime.common.schedules import run_id_for
from duetime.common.scripts import Scripts
from duetime.scheduler.gauges import Gauges

import duetime
from duetime.ops.inspect import Inspector
from duetime.web.timeline import timeline
from tests.apps import webapp
from tests.integration.opkit import Driver


def test_one_sample_per_step_whichever_scheduler_writes_it_and_the_stream_is_capped(wapp):
    wapp.enqueue_many([(webapp.slow, [1.0])] * 7)
    insp = Inspector(wapp.store.client, wapp.keys, wapp.redis_url)
    steps = {"fast": (300, 4)}
    a, b = series.SeriesWriter(insp, steps), series.SeriesWriter(insp, steps)
    key = wapp.keys.series("fast")
    # the writers' clock is the test's: early in a step, so both writers see the same one
    clock = [(insp.now_ms() // 300 + 1) * 300 + 10]
    insp.now_ms = lambda: clock[0]  # type: ignore[method-assign]
    assert a.record() == ["fast"]
    assert b.record() == [] and a.record() == []  # the step has its point
    points = series.read(wapp.store.client, wapp.redis_url, key)
    assert len(points) == 1 and points[0].queues["default"]["backlog"] == 7
    assert points[0].t_ms % 300 == 0
    for _ in range(6):
        clock[0] += 310  # into the next step
        assert (a.record() or b.record()) == ["fast"]
    points = series.read(wapp.store.client, wapp.redis_url, key)
    assert len(points) == 4 and [p.t_ms for p in points] == sorted({p.t_ms for p in points})


def test_two_schedulers_writing_one_step_at_once_is_not_an_error(wapp):
    """Both read 'no point yet' before either writes: the second XADD is refused by the stream
    (same id); that is the design, not a failure (it killed a scheduler's gauges thread)."""
    insp = Inspector(wapp.store.client, wapp.keys, wapp.redis_url)
    steps = {"race": (60_000, 4)}
    a, b = series.SeriesWriter(insp, steps), series.SeriesWriter(insp, steps)
    b._heads = lambda names: [[] for _ in names]  # b read the stream before a wrote
    assert a.record() == ["race"]
    assert b.record() == []  # its XADD is refused as a duplicate of this step, quietly
    assert len(series.read(wapp.store.client, wapp.redis_url, wapp.keys.series("race"))) == 1


def test_the_scheduler_gauges_record_the_consoles_samples(wapp):
    wapp.enqueue_many([(webapp.slow, [1.0])] * 3)
    g = Gauges(wapp.redis_url, wapp.keys)
    g.update()
    for step in series.STEPS:
        (point,) = series.read(wapp.store.client, wapp.redis_url, wapp.keys.series(step))
        assert point.queues["default"]["backlog"] == 3
    g.client.close()


def _materialize(wapp, name: str, runs: list[tuple[int, int, int]]) -> None:
    """Runs of a schedule through materialize.lua: (occurrence ms, coalesced, first ms)."""
    k = wapp.keys
    p = k.partition_of_schedule(name)
    flat: list[object] = []
    for occ, n, first in runs:
        flat += [run_id_for(name, occ), occ, occ, n, first]
    keys, args = tr.materialize(k, p, name, "default", flat)
    assert Scripts(wapp.store.client).materialize(keys=keys, args=args)[0] == b"ok"


def test_the_timeline_says_what_became_of_each_occurrence(wapp):
    name = "minutely"
    wapp.schedule(name, duetime.Every(timedelta(minutes=1)), webapp.tick, catchup="latest")
    store = wapp.schedules
    now = from_ms(Inspector(wapp.store.client, wapp.keys, wapp.redis_url).now_ms())
    assert now is not None
    info = store.get(name)
    minute = 60_000
    top = to_ms(info.next_fire) - minute  # the newest occurrence at or before now
    occ = [top - i * minute for i in range(8)][::-1]  # oldest first
    # occ[7] stands for occ[5..7] (catch-up), occ[4] ran late, occ[3] dead, occ[2] waiting;
    # occ[0], occ[1] have no run
    _materialize(wapp, name, [(occ[7], 3, occ[5]), (occ[4], 1, occ[4]), (occ[3], 1, occ[3]),
                              (occ[2], 1, occ[2])])
    d = Driver(wapp)
    claimed = {c.run_id: (p, c) for p, c in d.claim_all()}
    p, c = claimed[run_id_for(name, occ[4])]
    keys, args = tr.complete(wapp.keys, p, [(c.run_id, c.fence)])
    d.scripts.complete(keys=keys, args=args)
    p, c = claimed[run_id_for(name, occ[3])]
    d.fail(p, c, "fatal")
    info = store.get(name)
    assert info.created is not None
    # up to its creation: the occurrences before it, whose runs were made by hand above
    rows, _ = timeline(store, info, info.created, now, count=8)
    got = {o.ms: o for o in rows}
    assert [o.ms for o in rows] == occ[::-1]  # newest first
    assert got[occ[7]].status == "running" and "stood for 3" in got[occ[7]].detail
    assert got[occ[6]].status == got[occ[5]].status == "coalesced"
    assert got[occ[6]].run_id == run_id_for(name, occ[7])
    assert got[occ[4]].status == "late" and got[occ[4]].lateness_s > 60
    assert got[occ[3]].status == "dead"
    assert got[occ[2]].status == "running"  # claimed, never reported
    assert {got[occ[1]].status, got[occ[0]].status} <= {"no-record", "skipped"}
    assert all(not o.zone_changed for o in rows)


def test_the_timeline_marks_a_dst_change_in_the_zone_of_a_cron(wapp):
    wapp.schedule("paris", duetime.Cron("30 2 * * *", tz="Europe/Paris"), webapp.tick)
    store = wapp.schedules
    info = store.get("paris")
    until = datetime(2026, 4, 2, tzinfo=UTC)
    rows, older = timeline(store, info, until, datetime.now(UTC), count=6)
    assert [r.local.utcoffset() for r in rows[-2:]] == [timedelta(hours=1)] * 2
    changed = [r for r in rows if r.zone_changed]
    assert len(changed) == 1 and changed[0].local.utcoffset() == timedelta(hours=2)
    assert older is not None and older < rows[-1].utc
