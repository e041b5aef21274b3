"""Debounce by key (lua/enqueue/coalesce.lua): while the key's run still waits, an enqueue
replaces its arguments and moves its due time to now + debounce, never past its first enqueue
+ max_wait; once it started, the next enqueue creates a new run. The script takes now from the
server (TIME), so the debounce is set long enough that the enqueues of a test all fall inside
it, and max_wait is proven on the run's due score with its first enqueue moved back (time
controlled through the record, never slept through)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from duetime.common import transitions as tr
from duetime.common.connection import sync_client
from duetime.common.errors import InvalidInput
from duetime.common.scripts import Scripts

from duetime.cli import main as cli
from tests.apps import basic
from tests.conftest import wait_for
from tests.integration.inproc import burst, due_now

pytestmark = pytest.mark.scripts


def runs_of(app) -> list[str]:
    """Every run record of the namespace (what was created, whatever the ids returned say)."""
    r = sync_client(app.redis_url)
    try:
        return sorted(k.decode().rsplit(":", 1)[1] for k in
                      r.scan_iter(f"{app.keys.namespace}:*run:*", count=1000)
                      if b":run:" in k)
    finally:
        r.close()


def due_score(app, run_id: str) -> int:
    r = sync_client(app.redis_url)
    try:
        p = app.keys.partition_of_run(run_id)
        return int(r.zscore(app.keys.due(p, "default"), run_id))
    finally:
        r.close()


def server_ms(app) -> int:
    s, us = sync_client(app.redis_url).time()
    return s * 1000 + us // 1000


def claim_all(app, queue: str = "default") -> list[str]:
    """A direct claim on every partition (what a worker would be handed)."""
    r = sync_client(app.redis_url)
    scripts, got = Scripts(r), []
    try:
        for p in range(app.keys.partitions):
            keys, args = tr.claim(app.keys, p, queue, "probe", 100, 60_000)
            got += [c.run_id for c in tr.parse_claim(scripts.claim(keys=keys, args=args)).runs]
    finally:
        r.close()
    return got


def test_a_thousand_enqueues_make_one_run_with_the_last_arguments(app):
    before = server_ms(app)
    ids = [app.enqueue(basic.noop, [i], key="doc-7", debounce="500s") for i in range(1000)]
    assert len(set(ids)) == 1  # every call says which run it landed on: the one run
    assert runs_of(app) == [ids[0]]
    run = app.get_run(ids[0])
    assert run.state == "scheduled" and run.args == [999]
    # due 500 s after the last enqueue (the server's clock), not after the first
    assert due_score(app, ids[0]) >= before + 500_000
    due_now(app, ids[0])
    w = burst(app)
    assert w.processed == 1
    assert basic.r().hgetall(basic.count_key()) == {ids[0].encode(): b"1"}
    assert app.get_run(ids[0]).state == "succeeded"


def test_the_due_time_moves_with_each_enqueue_and_never_earlier(app, r):
    rid = app.enqueue(basic.noop, [0], key="k", debounce="600s")
    run_key = app.keys.run(app.keys.partition_of_run(rid), rid)
    first = due_score(app, rid)
    r.hset(run_key, "created", int(r.hget(run_key, "created")) - 5_000)  # (no max_wait: no cap)
    r.zadd(app.keys.due(app.keys.partition_of_run(rid), "default"), {rid: first - 5_000})
    assert app.enqueue(basic.noop, [1], key="k", debounce="600s") == rid
    assert due_score(app, rid) >= first  # moved to now + 600 s again
    assert int(r.hget(run_key, "due")) == due_score(app, rid)
    assert r.hget(run_key, "joined") == b"1"  # one enqueue joined it


def test_once_started_the_next_enqueue_makes_a_new_run(app):
    rid = app.enqueue(basic.noop, [0], key="k", debounce="600s")
    due_now(app, rid)
    assert claim_all(app) == [rid]  # started: no longer waiting
    again = app.enqueue(basic.noop, [1], key="k", debounce="600s")
    assert again != rid
    assert app.get_run(again).args == [1] and app.get_run(rid).args == [0]
    assert app.enqueue(basic.noop, [2], key="k", debounce="600s") == again
    assert app.get_run(again).args == [2]


def test_max_wait_caps_the_due_time_at_the_first_enqueue_plus_max_wait(app, r):
    rid = app.enqueue(basic.noop, [0], key="k", debounce="10s", max_wait="30s")
    run_key = app.keys.run(app.keys.partition_of_run(rid), rid)
    created = int(r.hget(run_key, "created"))
    assert due_score(app, rid) <= created + 30_000
    # the key's first enqueue was 25 s ago (its record's clock moved back, nothing slept)
    r.hset(run_key, "created", created - 25_000)
    assert app.enqueue(basic.noop, [1], key="k", debounce="10s", max_wait="30s") == rid
    assert due_score(app, rid) == created - 25_000 + 30_000  # capped, not now + 10 s
    assert int(r.hget(run_key, "due")) == created + 5_000
    # enqueues keep coming: the due time stays at the cap, the arguments follow the last one
    for i in range(2, 50):
        assert app.enqueue(basic.noop, [i], key="k", debounce="10s", max_wait="30s") == rid
        assert due_score(app, rid) == created + 5_000
    assert app.get_run(rid).args == [49]


def test_under_a_steady_stream_runs_are_no_more_than_max_wait_apart(app, r):
    """Each run's due time is at most max_wait after the first enqueue that landed on it,
    and the next run's first enqueue comes right after the previous one started: in due-time
    terms a key is served at least once per max_wait however often it is enqueued."""
    for _round in range(5):
        ids = set()
        for i in range(100):
            ids.add(app.enqueue(basic.noop, [i], key="stream", debounce="20s", max_wait="60s"))
            if i == 50:  # time passes: the round's first enqueue is now 55 s ago
                (rid,) = ids
                rk = app.keys.run(app.keys.partition_of_run(rid), rid)
                r.hset(rk, "created", int(r.hget(rk, "created")) - 55_000)
        (rid,) = ids
        rk = app.keys.run(app.keys.partition_of_run(rid), rid)
        c, d = int(r.hget(rk, "created")), due_score(app, rid)
        # 55 s after its first enqueue, now + 20 s would pass the cap: due at exactly c + 60 s
        assert d == c + 60_000
        due_now(app, rid)
        assert claim_all(app) == [rid]
    assert len(runs_of(app)) == 5


@pytest.mark.parametrize("kw, why", [
    ({"debounce": "1s"}, "needs key="),
    ({"key": "k", "debounce": "1s", "throttle": "1s"}, "not both"),
    ({"key": "k", "debounce": "2s", "max_wait": "1s"}, "at least the debounce"),
    ({"key": "k", "max_wait": "1s"}, "give debounce="),
    ({"key": "k", "debounce": "1s", "delay": "5s"}, "without at= or delay="),
    ({"key": "k", "debounce": "0s"}, "too small"),
    ({"key": "k", "debounce": "soon"}, "debounce"),
])
def test_combinations_that_mean_nothing_are_refused_before_anything_is_written(app, kw, why):
    with pytest.raises(InvalidInput, match=why):
        app.enqueue(basic.noop, [0], **kw)
    assert runs_of(app) == []


def test_durations_in_every_form_and_the_typed_forms_agree(app):
    from datetime import timedelta

    a = basic.noop.enqueue(1, key="a", debounce=timedelta(minutes=10))
    assert basic.noop.options(key="a", debounce=600).enqueue(2) == a
    assert basic.noop.enqueue(3, key="a", debounce="10m", max_wait="1h") == a
    assert app.enqueue("noop", [4], key="a", debounce=600.0) == a  # by name
    assert app.get_run(a).args == [4]
    assert runs_of(app) == [a]


def test_plain_key_is_unchanged_and_separate_from_debounce(app):
    k1 = app.enqueue(basic.noop, [1], key="same")
    assert app.enqueue(basic.noop, [2], key="same") == k1  # drop duplicates: first wins
    assert app.get_run(k1).args == [1]
    d = app.enqueue(basic.noop, [3], key="same", debounce="600s")
    assert d != k1
    # the debounced run lives in the key's partition (the one key= alone picks)
    assert app.keys.partition_of_run(d) == app.keys.partition_of_run(k1)


def test_enqueue_many_and_aenqueue_land_on_the_same_run(app):
    import asyncio

    ids = app.enqueue_many([{"task": basic.noop, "args": [i], "key": "m", "debounce": "600s"}
                            for i in range(450)]  # three script calls in one partition
                           + [{"task": basic.noop, "args": [0], "key": "other"}])
    assert len(set(ids[:450])) == 1 and ids[450] != ids[0]
    assert app.get_run(ids[0]).args == [449]

    async def more() -> list[str]:
        one = await app.aenqueue(basic.noop, [1000], key="m", debounce="600s")
        many = await app.aenqueue_many([{"task": basic.noop, "args": [1001], "key": "m",
                                         "debounce": "600s"}])
        return [one, *many]

    assert asyncio.run(more()) == [ids[0], ids[0]]
    assert app.get_run(ids[0]).args == [1001]


def test_the_cli_prints_the_run_it_landed_on(app):
    base = ["--redis-url", app.redis_url, "--namespace", app.keys.namespace, "enqueue", "noop",
            "--key", "c", "--debounce", "500s", "--max-wait", "1h", "--allow-unknown"]
    one = CliRunner().invoke(cli, [*base, "--args", "[1]"])
    two = CliRunner().invoke(cli, [*base, "--args", "[2]"])
    assert one.exit_code == 0 and two.exit_code == 0, (one.output, two.output)
    # the id is the last line (a by-name enqueue warns on stderr, mixed in by CliRunner)
    first, second = (x.output.strip().splitlines()[-1] for x in (one, two))
    assert first == second
    assert app.get_run(first).args == [2]
    bad = CliRunner().invoke(cli, [*base[:-3], "--throttle", "1s", "--allow-unknown"])
    assert bad.exit_code != 0 and "not both" in bad.output


@pytest.mark.slow
@pytest.mark.scripts(memory="a worker process needs a real server")
def test_none_lost_when_the_worker_is_sigkilled(app, procs):
    """Debounced enqueues to 20 keys while a worker serves them and is SIGKILLed halfway:
    afterwards every run any call landed on has succeeded, and each key's last arguments were
    run (the enqueue after a kill either joined a waiting run or made a new one). While no
    worker is running, two enqueues of a key must land on one run: nothing can start it in
    between, so that coalescing is certain whatever the machine's speed (elsewhere it depends
    on whether the worker claimed the run first)."""
    worker = procs.worker("--concurrency", "4", "--lease", "2s")
    procs.reaper("100ms")
    last: dict[str, tuple[str, int]] = {}
    landed: set[str] = set()
    offline: dict[str, set[str]] = {}  # key -> the runs its enqueues landed on, no worker up
    for i in range(600):
        key = f"key-{i % 20}"
        rid = app.enqueue(basic.noop, [i], key=key, debounce="50ms", max_wait="200ms")
        landed.add(rid)
        last[key] = (rid, i)
        if 300 < i <= 340:
            offline.setdefault(key, set()).add(rid)
        if i == 300:
            worker.kill()  # SIGKILL: no release, leases lapse
            worker.wait()
        if i == 340:
            worker = procs.worker("--concurrency", "4", "--lease", "2s")
        if i % 60 == 0 and not 300 <= i < 340:
            # some runs start (one more has executed), so later enqueues make new runs
            ran = basic.r().hlen(basic.count_key())
            wait_for(lambda n=ran: basic.r().hlen(basic.count_key()) > n, timeout=60,
                     what=f"a debounced run to execute after enqueue {i}")

    def all_done() -> bool:
        return all(app.get_run(x).state == "succeeded" for x in landed)

    wait_for(all_done, timeout=60, what="every debounced run to succeed")
    counts = basic.r().hgetall(basic.count_key())
    assert all(counts.get(x.encode()) for x in landed)  # each run executed (at least once)
    for key, (rid, i) in last.items():
        assert app.get_run(rid).args == [i], key  # the last arguments of the key were run
    # with no worker up, each key's two enqueues were coalesced into one run
    assert len(offline) == 20 and all(len(ids) == 1 for ids in offline.values()), offline
    assert len(landed) < 600
