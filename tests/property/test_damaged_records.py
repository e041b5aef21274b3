"""Property tests of damaged records: run and schedule hashes whose fields were overwritten by
hand (or by another client) with arbitrary values, in front of a real worker and scheduler.

Every damaged run ends `dead` with a reason, or -- damaged in a field that does not matter
to it -- runs as if untouched (`succeeded`); every damaged schedule ends quarantined with a
reason (in the quarantine index, out of the evaluator's), or keeps firing; and the worker and
scheduler processes keep serving throughout.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from duetime.common.models import STATES
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

import duetime
from duetime.embedded import EmbeddedServer
from tests import schedrec
from tests.apps import chaos as chaos_app
from tests.chaos.fleet import Fleet, chaos_fleet
from tests.conftest import SERVER_KINDS, wait_for

pytestmark = [pytest.mark.scripts, pytest.mark.slow]
# no shrinking: each example waits on real processes, so shrinking a failure took over five
# minutes in a loaded CI run (the example as drawn is reported instead)
CI = settings(derandomize=True, max_examples=8, deadline=None,
              phases=[Phase.explicit, Phase.reuse, Phase.generate],
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

RUN_FIELDS = ("state", "queue", "attempt", "fence", "max_attempts", "backoff_base",
              "backoff_max", "timeout", "idempotent", "payload", "task", "due", "key", "owner",
              "created")
SCHED_FIELDS = ("t.kind", "t.expr", "t.tz", "t.interval_us", "t.anchor", "t.instant", "next_ms",
                "version", "catchup", "max_catchup", "jitter_ms", "queue", "task", "payload",
                "lateness_ms", "overlap", "paused", "last_ms")
junk = (st.binary(max_size=10)
        | st.sampled_from([b"", b"0", b"-1", b"1e999", b"nan", b"99999999999999999999", b"zzz",
                           b"\xff\xfe", b"cron", b"every", b"at", b"* * * * *", b"1", b"default",
                           b"chaos.tick", b"\x92\x90\x80", b"\x92\x01\x02"]))
# a state overwritten with another valid state is not detectable damage; see
# test_a_run_forced_to_running_without_a_lease for the one that would hang
run_damage = st.dictionaries(st.sampled_from(RUN_FIELDS), junk, min_size=1, max_size=4).filter(
    lambda d: d.get("state", b"x").decode(errors="replace") not in STATES)
sched_damage = st.dictionaries(st.sampled_from(SCHED_FIELDS), junk, min_size=1, max_size=4)


@pytest.fixture(scope="module", params=SERVER_KINDS)
def fleet(request: pytest.FixtureRequest, servers: dict[str, EmbeddedServer],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    server = servers[request.param]
    namespace = f"dmg{uuid.uuid4().hex[:8]}"
    workdir = Path(tmp_path_factory.mktemp("damaged"))
    with chaos_fleet(server.port, server.url, namespace, workdir) as f:
        f.add("scheduler", "--tick", "100ms", "--reap-tick", "100ms")
        # a task name damaged into another valid name ("zzz") is a task no live worker has
        # published: dead-lettered after the rolling-deploy grace, kept short here (its own
        # tests are in tests/seams); an invalid one ('') is dead-lettered at once
        f.add("worker", "--lease", "1s", "--concurrency", "8", "--unknown-task-grace", "1s")
        r = chaos_app.app.store.ready()
        wait_for(lambda: r.zcard(chaos_app.app.keys.workers) >= 1, 30, what="the worker")
        yield f


def still_serving(fleet: Fleet) -> None:
    for m in fleet.members:
        assert m.alive(), f"{m.name} died; its log: {fleet.last_line(m)}"


def run_key(run_id: str) -> str:
    k = chaos_app.app.keys
    return k.run(k.partition_of_run(run_id), run_id)


def sched_key(name: str) -> str:
    k = chaos_app.app.keys
    return k.sched(k.partition_of_schedule(name), name)


@CI
@given(st.lists(run_damage, min_size=1, max_size=3), st.lists(sched_damage, min_size=1, max_size=2))
# drawn once and failed: a cursor past any instant was planned from and parked for good. The
# draws are derandomized but not fixed: Hypothesis also draws constants it reads from the
# project's modules loaded in the process, so they change with the code and with what ran
# before in the process (why this one was drawn with the Valkey half alone, not run whole)
@example(runs=[{"state": b"zzz"}], schedules=[{"next_ms": b"99999999999999999999"}])
def test_damaged_runs_end_dead_with_a_reason_and_damaged_schedules_are_quarantined(
        fleet: Fleet, runs: list[dict[str, bytes]], schedules: list[dict[str, bytes]]) -> None:
    app, k = chaos_app.app, chaos_app.app.keys
    r = app.store.ready()
    run_ids = []
    for damage in runs:
        run_id = chaos_app.quick.options(key=uuid.uuid4().hex, delay=0.4).enqueue(0.0)
        r.hset(run_key(run_id), mapping=damage)  # before it is due: the worker meets it damaged
        run_ids.append((run_id, damage))
    names = []
    for damage in schedules:
        name = f"dmg-{uuid.uuid4().hex[:8]}"
        app.schedule(name, duetime.Every(timedelta(seconds=1)), chaos_app.tick, catchup="all")
        before = app.get_schedule(name).materialized_count
        schedrec.edit(r, k, name, **{f.decode() if isinstance(f, bytes) else f: v
                                     for f, v in damage.items()})  # where each is stored
        names.append((name, damage, before))

    def run_settled(run_id: str) -> bool:
        return r.hget(run_key(run_id), "state") in (b"succeeded", b"dead")

    def sched_settled(name: str, before: int) -> bool:
        info = app.get_schedule(name)
        return bool(info.quarantined) or info.paused or info.materialized_count >= before + 2

    wait_for(lambda: all(run_settled(i) for i, _ in run_ids)
             and all(sched_settled(n, b) for n, _, b in names), 60,
             what=f"damaged runs {runs} and schedules {schedules} to settle")
    for run_id, damage in run_ids:
        h = r.hgetall(run_key(run_id))
        state = h[b"state"]
        p = k.partition_of_run(run_id)
        if state == b"dead":
            assert h.get(b"reason"), (damage, h)
            assert r.zscore(k.dead(p), run_id) is not None, (damage, "dead but not in the dead set")
        else:
            assert r.zscore(k.done(p), run_id) is not None, (damage, "succeeded but not in done")
    for name, damage, _ in names:
        info = app.get_schedule(name)
        p = k.partition_of_schedule(name)
        if info.quarantined:
            assert r.zscore(k.quarantine(p), name) is not None, damage
            assert r.zscore(k.sched_due(p), name) in (None, float("inf")), damage  # never due
        app.delete_schedule(name)
    still_serving(fleet)


def test_the_processes_still_serve_after_the_damage(fleet: Fleet) -> None:
    """Runs after the property test (same module fleet): an ordinary run still succeeds."""
    run_id = chaos_app.quick.enqueue(0.0)
    wait_for(lambda: chaos_app.app.get_run(run_id).state == "succeeded", 20,
             what="an ordinary run to succeed")
    still_serving(fleet)


def test_a_run_forced_to_running_without_a_lease_is_dead_lettered(fleet: Fleet) -> None:
    """A state overwritten with `running` while the run waits in its due set: no lease holds
    it, so nothing would ever finish or recover it."""
    app, k = chaos_app.app, chaos_app.app.keys
    r = app.store.ready()
    run_id = chaos_app.quick.options(delay=0.4).enqueue(0.0)
    r.hset(run_key(run_id), "state", "running")
    wait_for(lambda: r.hget(run_key(run_id), "state") != b"running", 10,
             what="the run to leave a state no lease backs")
    h = r.hgetall(run_key(run_id))
    assert h[b"state"] == b"dead" and b"lease" in h[b"reason"], h
    assert r.zscore(k.dead(k.partition_of_run(run_id)), run_id) is not None
    still_serving(fleet)
