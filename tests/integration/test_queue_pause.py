"""Queue pause (duetime/client/pause.py, claim.lua KEYS[12]): a paused queue accepts
enqueues and claims nothing, on every partition, until resumed; the pause is kept in Redis,
so a new worker and a restarted server (AOF) still see it. Negatives are proven by a direct
claim call returning no run, never by sleeping."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from click.testing import CliRunner
from duetime.common import transitions as tr
from duetime.common.connection import server_time_ms, sync_client
from duetime.common.errors import InvalidInput
from duetime.common.scripts import Scripts

from duetime.cli import main as cli
from duetime.client.pause import QueuePauses
from duetime.embedded import EmbeddedServer, free_port
from tests.apps import basic
from tests.conftest import wait_for
from tests.integration.inproc import burst, serving, until

pytestmark = pytest.mark.scripts


def claim_everywhere(app, queue: str = "default") -> tuple[list[str], list[int | None]]:
    """A direct claim on every partition of `queue` → (run ids claimed, next_due per partition)."""
    r = sync_client(app.redis_url)
    scripts, got, nexts = Scripts(r), [], []
    try:
        for p in range(app.keys.partitions):
            keys, args = tr.claim(app.keys, p, queue, "probe", 100, 60_000)
            reply = tr.parse_claim(scripts.claim(keys=keys, args=args))
            got += [c.run_id for c in reply.runs]
            nexts.append(reply.next_due_ms)
    finally:
        r.close()
    return got, nexts


def test_a_paused_queue_accepts_runs_claims_none_and_runs_them_once_resumed(app):
    app.pause_queue("default", note="maintenance")
    ids = [app.enqueue(basic.noop, [i]) for i in range(20)]  # accepted while paused
    assert all(app.get_run(i).state == "scheduled" for i in ids)
    clock = sync_client(app.redis_url)
    before = server_time_ms(clock)
    got, nexts = claim_everywhere(app)
    after = server_time_ms(clock)
    clock.close()
    assert got == []
    # the worker is told to look again a second later, not spin: a next time on every
    # partition, between the clock reads around the claims (a read after them, in whole
    # seconds, failed when the claims took a loaded machine over a second)
    assert all(n is not None and before <= n <= after + 5_000 for n in nexts), nexts
    assert all(app.get_run(i).state == "scheduled" for i in ids)  # nothing was touched
    # another queue is not paused
    other = app.enqueue(basic.noop, [0], queue="other")
    assert claim_everywhere(app, "other")[0] == [other]

    app.resume_queue("default")
    w = burst(app)
    assert w.processed == 20
    assert all(app.get_run(i).state == "succeeded" for i in ids)


def test_the_pause_outlives_workers_and_a_resume_reaches_a_serving_worker(app):
    app.pause_queue("default")
    run = app.enqueue(basic.noop, [1])
    for _ in range(2):  # a worker, then a new one (a restart): each reads the heads, claims
        assert burst(app).processed == 0  # and takes nothing
    assert app.get_run(run).state == "scheduled"
    assert claim_everywhere(app)[0] == []

    async def main() -> None:
        async with serving(app):
            await asyncio.to_thread(app.resume_queue, "default")
            await until(lambda: app.get_run(run).state == "succeeded", 30,
                        what="the run, once its queue is resumed")

    asyncio.run(main())


@pytest.mark.scripts(memory="restarts a server process")
def test_the_pause_survives_a_redis_restart_with_aof(namespace):
    server = EmbeddedServer("redis", port=free_port(),
                            extra=["--appendonly", "yes", "--appendfsync", "always"]).start()
    app = basic.app
    app.configure(redis_url=server.url, namespace=namespace)
    try:
        app.pause_queue("default", note="until the partner is back")
        run = app.enqueue(basic.noop, [1])
        server.stop()  # graceful: SIGTERM, the AOF is flushed
        server.start()
        app.close()  # its pooled connections died with the server
        assert claim_everywhere(app)[0] == []
        assert [p.note for p in QueuePauses(app.store.ready(), app.keys, app.redis_url).list()] \
            == ["until the partner is back"]
        app.resume_queue("default")
        assert burst(app).processed == 1
        assert app.get_run(run).state == "succeeded"
    finally:
        app.close()
        server.stop()


def test_bad_input_is_refused_and_changes_nothing(app):
    for queue, note in (("", ""), ("a|b", ""), ("default", "x" * 501), ("default", 3)):
        with pytest.raises(InvalidInput):
            app.pause_queue(queue, note=note)  # type: ignore[arg-type]
    assert QueuePauses(app.store.ready(), app.keys, app.redis_url).list() == []
    run = app.enqueue(basic.noop, [1])
    assert claim_everywhere(app)[0] == [run]


def test_cli_pause_list_resume(app):
    env = {"DUETIME_REDIS_URL": app.redis_url, "DUETIME_NAMESPACE": app.keys.namespace}
    runner = CliRunner()

    def duetime(*args: str) -> str:
        res = runner.invoke(cli, list(args), env=env, catch_exceptions=False)
        assert res.exit_code == 0, res.output
        return res.stdout  # the command's output alone: a log line goes to stderr

    assert "no queue is paused" in duetime("queue", "list")
    assert "paused (deploy)" in duetime("queue", "pause", "default", "--note", "deploy")
    listed = json.loads(duetime("queue", "list", "--json"))
    assert [(x["queue"], x["note"]) for x in listed] == [("default", "deploy")]
    assert "default" in duetime("queue", "list") and "deploy" in duetime("queue", "list")
    run = app.enqueue(basic.noop, [1])
    assert claim_everywhere(app)[0] == []
    assert "resumed" in duetime("queue", "resume", "default")
    assert "was not paused" in duetime("queue", "resume", "default")
    assert claim_everywhere(app)[0] == [run]
    res = runner.invoke(cli, ["queue", "pause", "a|b"], env=env)
    assert res.exit_code == 2 and "error:" in res.output


@pytest.mark.scripts(memory="doctor reads INFO, which the in-memory backend has not")
def test_top_doctor_and_the_gauge_show_a_paused_queue(app):
    from duetime.common import metrics
    from duetime.scheduler.gauges import Gauges

    env = {"DUETIME_REDIS_URL": app.redis_url, "DUETIME_NAMESPACE": app.keys.namespace}
    runner = CliRunner()
    app.enqueue(basic.noop, [1])
    app.enqueue(basic.noop, [1], queue="other")
    g = Gauges(app.redis_url, app.keys)
    try:
        g.update()
        assert metrics.QUEUE_PAUSED.labels("default")._value.get() == 0
        app.pause_queue("default", note="db migration")
        g.update()
        assert metrics.QUEUE_PAUSED.labels("default")._value.get() == 1
        assert metrics.QUEUE_PAUSED.labels("other")._value.get() == 0
    finally:
        g.client.close()

    top = runner.invoke(cli, ["top", "--once"], env=env)
    assert top.exit_code == 0, top.output
    assert "default (paused)" in top.output and "db migration" in top.output
    assert "other (paused)" not in top.output
    as_json = json.loads(runner.invoke(cli, ["top", "--once", "--json"], env=env).stdout)
    paused = {q["queue"]: (q["paused"], q["pause_note"]) for q in as_json["queues"]}
    assert paused["default"] == (True, "db migration") and paused["other"] == (False, "")

    doctor = runner.invoke(cli, ["doctor"], env=env)
    assert "queue 'default' is paused (db migration)" in doctor.output, doctor.output
    assert "duetime queue resume default" in doctor.output
    app.resume_queue("default")
    assert "is paused" not in runner.invoke(cli, ["doctor"], env=env).output
    g = Gauges(app.redis_url, app.keys)
    try:
        g.update()
        assert metrics.QUEUE_PAUSED.labels("default")._value.get() == 0
    finally:
        g.client.close()


def test_a_resume_publishes_a_wake_for_every_partition_of_the_queue(app):
    from duetime.common.wake import parse_worker_wake

    app.pause_queue("default")
    r = sync_client(app.redis_url)
    sub = r.pubsub(ignore_subscribe_messages=True)
    try:
        sub.subscribe(app.keys.wake_channel)
        # the server has the subscription before the resume publishes (a 5 s read that
        # returned None whether or not the confirmation had come proved nothing, and a late
        # confirmation then read as a missing wake)
        wait_for(lambda: dict(r.pubsub_numsub(app.keys.wake_channel)).get(
            app.keys.wake_channel.encode(), 0) >= 1, 60, what="the subscription")
        app.resume_queue("default")
        got: set[int] = set()
        deadline = time.monotonic() + 60
        while len(got) < app.keys.partitions and time.monotonic() < deadline:
            msg = sub.get_message(timeout=1)  # None: nothing yet, or the confirmation
            if msg is None:
                continue
            parsed = parse_worker_wake(msg["data"], app.keys.partitions)
            assert parsed is not None and parsed[1] == "default", msg
            got.add(parsed[0])
        assert got == set(range(app.keys.partitions)), f"wakes received: {sorted(got)}"
    finally:
        sub.close()
        r.close()
