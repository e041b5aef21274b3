"""Replicated durability on a single server without replicas: every state change is followed
by a WAIT whose reply the caller never sees, and an enqueue no replica confirmed says so.
(The cluster cases, a primary killed and a replica stopped, are in test_failover.py.)"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from duetime.common import transitions as tr
from duetime.common.connection import async_client, sync_client
from duetime.common.durability import Durability
from duetime.common.errors import InvalidInput
from duetime.common.scripts import Scripts

import duetime
from tests.apps import failover as fo


def _app(url: str, **kw) -> duetime.App:
    app = duetime.App(redis_url=url, namespace=f"d{uuid.uuid4().hex[:8]}", **kw)
    app.registry.add(fo.work.spec)
    return app


def test_an_enqueue_no_replica_confirmed_raises_and_the_run_exists(url):
    app = _app(url, wait_replicas=1, wait_timeout_ms=50)
    with pytest.raises(duetime.NotReplicated, match="created on the primary") as exc:
        app.enqueue(fo.work, [7])
    [rid] = exc.value.ids
    assert exc.value.unreplicated == [rid]
    assert app.get_run(rid).args == [7]
    with pytest.raises(duetime.NotReplicated) as many:
        app.enqueue_many([(fo.work, [i]) for i in range(300)])
    assert len(many.value.unreplicated) == 300
    app.close()


def test_without_it_nothing_waits(url):
    app = _app(url, wait_replicas=0)
    assert app.get_run(app.enqueue(fo.work, [1])).args == [1]
    app.close()


def test_wait_replies_are_taken_off_the_results(url):
    """A pipeline of two scripts and a read: the caller gets three replies, not four."""
    keys = duetime.App(namespace="d" + uuid.uuid4().hex[:8]).keys
    client = sync_client(url, durability=Durability(1, 20))
    pipe = client.pipeline(transaction=False)
    for rid in ("a", "b"):
        ks, args = tr.enqueue(keys, 0, "default", ["task", "x"], [(rid, "", 0, ["payload", b"p"])])
        Scripts(client).enqueue(keys=ks, args=args, client=pipe)
    pipe.zcard(keys.due(0, "default"))
    assert pipe.execute() == [1, 1, 2]
    assert [(s.acked, s.wanted) for s in pipe.duetime_shorts] == [(0, 1)]
    reads = client.pipeline(transaction=False)
    reads.zcard(keys.due(0, "default"))
    assert reads.execute() == [2] and reads.duetime_shorts == []  # reads are not waited for
    client.close()


def test_the_asyncio_client_waits_too(url):
    keys = duetime.App(namespace="d" + uuid.uuid4().hex[:8]).keys

    async def main() -> tuple[list, list, int]:
        client = async_client(url, durability=Durability(1, 20))
        pipe = client.pipeline(transaction=False)
        ks, args = tr.enqueue(keys, 1, "default", ["task", "x"], [("c", "", 0, ["payload", b"p"])])
        await Scripts(client).enqueue(keys=ks, args=args, client=pipe)
        out = await pipe.execute()
        lone = await Scripts(client).enqueue(keys=ks, args=args)  # exists already: 0 created
        await client.aclose()
        return out, pipe.duetime_shorts, lone

    out, shorts, lone = asyncio.run(main())
    assert out == [1] and len(shorts) == 1 and lone == 0


@pytest.mark.parametrize("kw", [{"wait_replicas": -1}, {"wait_replicas": "1"},
                                {"wait_replicas": 1, "wait_timeout_ms": 0}])
def test_bad_settings_are_refused(kw):
    with pytest.raises(InvalidInput, match="wait_"):
        duetime.App(**kw)


def test_the_environment_sets_it(monkeypatch):
    monkeypatch.setenv("DUETIME_WAIT_REPLICAS", "2")
    monkeypatch.setenv("DUETIME_WAIT_TIMEOUT_MS", "250")
    assert duetime.App().durability == Durability(2, 250)
    assert duetime.App(wait_replicas=0).durability.replicas == 0
    monkeypatch.setenv("DUETIME_WAIT_REPLICAS", "two")
    with pytest.raises(InvalidInput, match="DUETIME_WAIT_REPLICAS"):
        duetime.App()
