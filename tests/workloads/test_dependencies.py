"""depends_on and chain: a run waits (state `waiting`) until its dependencies succeeded; a
dependency that fails cancels it with a reason naming that dependency, unless
allow_failed_dependencies; across partitions too (the relay), on the 3+3 cluster."""

from __future__ import annotations

import pytest
from duetime.common.errors import UnknownDependency
from duetime.common.scripts import Scripts
from duetime.scheduler.relay import relay_once

from tests.apps import workloads as w
from tests.integration.inproc import burst

pytestmark = pytest.mark.scripts


def settle(app) -> None:
    """Run what is due, relaying notices between partitions, until nothing moves."""
    s = Scripts(app.store.client)
    while True:
        n = burst(app).processed
        if relay_once(app.store.client, app.keys, s) == 0 and n == 0:
            return


def ran(app) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in w.r().hgetall(w.ran_key()).items()}


def test_chain_of_five_where_the_third_dies_cancels_four_and_five(wapp):
    ids = wapp.chain([(w.step, [1]), (w.step, [2]), (w.step, [3, True]), (w.step, [4]),
                      (w.step, [5])])
    assert [wapp.get_run(i).state for i in ids] == ["scheduled"] + ["waiting"] * 4
    assert wapp.get_run(ids[1]).depends_on == [ids[0]]
    burst(wapp)
    states = [wapp.get_run(i).state for i in ids]
    assert states == ["succeeded", "succeeded", "dead", "cancelled", "cancelled"]
    assert f"dependency {ids[2]} ended dead" == wapp.get_run(ids[3]).reason
    assert f"dependency {ids[3]} ended cancelled" == wapp.get_run(ids[4]).reason
    assert ids[3] not in ran(wapp) and ids[4] not in ran(wapp)
    assert wapp.get_run(ids[1]).result == 20


def test_allow_failed_dependencies_runs_them_after_a_death(wapp):
    a = wapp.enqueue(w.step, [1, True])
    b = wapp.enqueue(w.step, [2], depends_on=[a], allow_failed_dependencies=True)
    c = wapp.enqueue(w.step, [3], depends_on=[b])
    settle(wapp)
    assert [wapp.get_run(i).state for i in (a, b, c)] == ["dead", "succeeded", "succeeded"]


def test_a_dependent_reads_its_dependencys_result(wapp):
    a = wapp.enqueue(w.step, [4])
    b = wapp.enqueue(w.plus_dep, [a], depends_on=[a])
    settle(wapp)
    assert wapp.get_run(b).result == 41


def test_a_dependency_finished_before_the_enqueue_counts_at_once(wapp):
    ok, bad = wapp.enqueue(w.step, [1]), wapp.enqueue(w.step, [2, True])
    burst(wapp)
    released = wapp.enqueue(w.step, [3], depends_on=[ok])
    cancelled = wapp.enqueue(w.step, [4], depends_on=[ok, bad])
    assert wapp.get_run(released).state == "scheduled"
    assert wapp.get_run(cancelled).state == "cancelled"
    assert wapp.get_run(cancelled).reason == f"dependency {bad} ended dead"


def test_an_unknown_dependency_is_refused_and_nothing_is_written(wapp, r):
    with pytest.raises(UnknownDependency, match="nope"):
        wapp.enqueue(w.step, [1], depends_on=["nope"])
    assert not [k for k in r.scan_iter(f"{wapp.keys.namespace}:*run:*")]


def test_cancelling_a_waiting_run_cancels_its_dependents(wapp):
    a = wapp.enqueue(w.step, [1], delay="1h")
    b = wapp.enqueue(w.step, [2], depends_on=[a])
    c = wapp.enqueue(w.step, [3], depends_on=[b])
    assert wapp.cancel(b) == "cancelled"
    settle(wapp)
    assert wapp.get_run(c).state == "cancelled"
    assert wapp.get_run(c).reason == f"dependency {b} ended cancelled"


def test_task_enqueue_and_by_name_take_depends_on(wapp):
    a = w.step.enqueue(1)
    b = w.step.enqueue(2, depends_on=[a])
    c = w.step.options(depends_on=[b]).enqueue(3)
    d = wapp.enqueue("w.step", [4], depends_on=[c])
    assert [wapp.get_run(i).state for i in (b, c, d)] == ["waiting"] * 3
    settle(wapp)
    assert [wapp.get_run(i).state for i in (a, b, c, d)] == ["succeeded"] * 4


def _other_partition_pair(app) -> tuple[str, str]:
    """Ids of two runs in different partitions."""
    k = app.keys
    a = "depa0"
    b = next(f"depb{i}" for i in range(1000)
             if k.partition_of_run(f"depb{i}") != k.partition_of_run(a))
    return a, b


def test_a_dependency_in_another_partition_notifies_through_the_relay(wapp):
    from duetime.client.runs import EnqueueRequest

    a, b = _other_partition_pair(wapp)
    store = wapp.store
    spec = wapp.registry.resolve(w.step)
    store.enqueue_many([EnqueueRequest(spec, [1], run_id=a)])
    store.enqueue_many([EnqueueRequest(spec, [2], run_id=b, depends_on=(a,))])
    assert wapp.get_run(b).state == "waiting"
    burst(wapp)  # a succeeds; b's partition learns it only through the relay
    assert wapp.get_run(a).state == "succeeded"
    assert wapp.get_run(b).state == "waiting"
    assert relay_once(store.client, wapp.keys, Scripts(store.client)) == 1
    assert relay_once(store.client, wapp.keys, Scripts(store.client)) == 0
    assert wapp.get_run(b).state == "scheduled"
    burst(wapp)
    assert wapp.get_run(b).state == "succeeded"


@pytest.mark.scripts(memory="the in-memory server keeps no commandstats to count list reads by")
def test_the_reaper_reads_dependency_lists_only_where_a_relay_notice_points(wapp, url):
    """The script that leaves a notice for another partition publishes `r|<partition>|<ms>`
    on the schedulers' wake channel; the reaper's relay reads the lists of the partitions it
    was told of, and of every partition only at its safety read: a pass told of nothing sends
    no list read (an idle namespace costs nothing per tick)."""
    from duetime.common.wake import parse_scheduler_notice
    from duetime.scheduler.reaper import Reaper

    from duetime.client.runs import EnqueueRequest

    a, b = _other_partition_pair(wapp)
    store, k = wapp.store, wapp.keys
    spec = wapp.registry.resolve(w.step)
    store.enqueue_many([EnqueueRequest(spec, [1], run_id=a)])
    store.enqueue_many([EnqueueRequest(spec, [2], run_id=b, depends_on=(a,))])
    reaper = Reaper(url, k)
    sub = store.client.pubsub()
    try:
        assert reaper.relay_once() == 0  # its first pass is a safety read of every partition

        def lranges() -> int:
            return int(store.client.info("commandstats").get("cmdstat_lrange", {}).get("calls", 0))

        before = lranges()
        assert reaper.relay_once() == 0
        assert lranges() == before  # told of nothing: no list read
        sub.subscribe(k.sched_wake)
        assert sub.get_message(timeout=10)["type"] == "subscribe"
        burst(wapp)  # a succeeds; its notice for b waits in a's partition
        assert wapp.get_run(b).state == "waiting"
        notices = []
        while (m := sub.get_message(timeout=10)) is not None:
            if m["type"] == "message" and (n := parse_scheduler_notice(m["data"])) and n[0] == "r":
                notices.append(n[1])
                break
        assert notices == [k.partition_of_run(a)]
        reaper.told_relay(notices[0])
        assert reaper.relay_once() == 1
        assert wapp.get_run(b).state == "scheduled"
    finally:
        sub.close()
        reaper.close()


def test_a_notice_applied_twice_counts_once(wapp):
    from duetime.common import transitions as tr

    a = wapp.enqueue(w.step, [1], delay="1h")
    a2 = wapp.enqueue(w.step, [2], delay="1h")
    b = wapp.enqueue(w.step, [3], depends_on=[a, a2])
    p = wapp.keys.partition_of_run(b)
    keys, args = tr.deps_apply(wapp.keys, p, [(b, a, "succeeded"), (b, a, "succeeded")])
    Scripts(wapp.store.client).deps_apply(keys=keys, args=args)
    assert wapp.get_run(b).state == "waiting"  # a2 is still pending
    keys, args = tr.deps_apply(wapp.keys, p, [(b, a2, "succeeded")])
    Scripts(wapp.store.client).deps_apply(keys=keys, args=args)
    assert wapp.get_run(b).state == "scheduled"


def test_aenqueue_takes_depends_on(wapp):
    import asyncio

    a = wapp.enqueue(w.step, [1], delay="1h")
    b = asyncio.run(wapp.aenqueue(w.step, [2], depends_on=[a]))
    c = asyncio.run(w.step.aenqueue(3, depends_on=[b]))
    assert wapp.get_run(b).depends_on == [a] and wapp.get_run(c).depends_on == [b]
    assert wapp.get_run(c).state == "waiting"
