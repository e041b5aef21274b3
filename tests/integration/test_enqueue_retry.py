"""An enqueue rides out a failover for a bounded time, and a resent chunk creates nothing twice.

A single server stands in for a failing-over primary here (the cluster case runs in
tests/integration/test_failover.py): it is killed, and started again while the enqueue
retries; or a reply is lost after the script ran."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import redis
from duetime.common.errors import EnqueueIncomplete, InvalidInput, RedisUnavailable

import duetime
from duetime.embedded import EmbeddedServer
from tests.apps import failover as fo


@pytest.fixture
def server():
    s = EmbeddedServer("redis").start()
    yield s
    s.stop()


def _app(url: str, retry_s: float | None) -> duetime.App:
    app = duetime.App(redis_url=url, namespace=f"r{uuid.uuid4().hex[:8]}", enqueue_retry_s=retry_s)
    app.registry.add(fo.work.spec)
    return app


def test_an_enqueue_waits_for_the_server_to_come_back(server):
    # the bound the enqueue retries within: generous, as the server's restart is a process
    # start (10 s left a loaded machine 9 s for it)
    app = _app(server.url, 60.0)
    app.enqueue(fo.work, [0])  # connected, namespace recorded
    server.kill()
    threading.Timer(1.0, server.start).start()
    t0 = time.monotonic()
    ids = app.enqueue_many([(fo.work, [i]) for i in range(50)])
    assert time.monotonic() - t0 >= 0.9
    app.close()
    assert [app.get_run(i).args for i in ids] == [[i] for i in range(50)]


def test_past_the_bound_the_error_says_what_to_do(server):
    app = _app(server.url, 1.0)
    app.enqueue(fo.work, [0])
    server.kill()
    gave_up_after = r"gave up after retrying for \d\.\d s.*enqueue_retry_s"
    # it retried within its bound, then stopped, naming it (how soon is a latency: not here)
    with pytest.raises(RedisUnavailable, match=gave_up_after) as gave_up:
        app.enqueue(fo.work, [1])
    assert "now 1 s" in str(gave_up.value)
    with pytest.raises(EnqueueIncomplete, match="enqueue_retry_s") as stopped:
        app.enqueue_many([(fo.work, [i]) for i in range(3)])
    assert len(stopped.value.not_created) + len(stopped.value.unknown) == 3


def test_a_single_server_fails_at_once_by_default(server):
    app = _app(server.url, None)
    app.enqueue(fo.work, [0])
    server.kill()
    with pytest.raises(RedisUnavailable) as exc:
        app.enqueue(fo.work, [1])
    assert "gave up" not in str(exc.value)  # no retry loop ran: it failed on the first try


def test_a_chunk_whose_reply_was_lost_is_resent_and_created_once(server, monkeypatch):
    """The script ran, the connection broke before its reply: the retry sends the same ids,
    enqueue.lua finds them and creates nothing twice."""
    app = _app(server.url, 5.0)
    app.enqueue(fo.work, [0])
    real = redis.client.Pipeline.execute
    lost = []

    def execute(self, raise_on_error=True):
        result = real(self, raise_on_error=raise_on_error)
        if not lost:
            lost.append(result)
            raise redis.ConnectionError("Connection closed by server (simulated lost reply)")
        return result

    monkeypatch.setattr(redis.client.Pipeline, "execute", execute)
    ids = app.enqueue_many([(fo.work, [i]) for i in range(300)])
    monkeypatch.undo()
    assert lost and lost[0]  # the first pass ran on the server
    r = redis.Redis.from_url(server.url)
    due = sum(r.zcard(app.keys.due(p, "default")) for p in range(app.keys.partitions))
    assert due == 301 and len(set(ids)) == 300
    assert all(app.get_run(i).state == "scheduled" for i in ids[::29])


def test_aenqueue_waits_for_the_server_too(server):
    import asyncio

    app = _app(server.url, 10.0)

    async def main() -> list[str]:
        await app.aenqueue(fo.work, [0])
        server.kill()
        threading.Timer(1.0, server.start).start()
        ids = await app.aenqueue_many([(fo.work, [i]) for i in range(20)])
        return [(await app.aget_run(i)).args for i in ids]

    assert asyncio.run(main()) == [[i] for i in range(20)]


@pytest.mark.parametrize("bad", [-1, "10", True, 1e9])
def test_a_bad_retry_bound_is_refused(bad):
    with pytest.raises(InvalidInput, match="enqueue_retry_s"):
        duetime.App(enqueue_retry_s=bad)
