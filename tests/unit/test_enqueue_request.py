"""`App.enqueue` builds its request option by option (duetime/app.py `_enqueue_request`), each
by name, so mypy matches them against enqueue's parameters and EnqueueRequest's fields: every
option reaches the request, and a misspelt one is a TypeError before any I/O. No server: the
app's URL is a port nothing listens on, and the store's send is replaced."""

from __future__ import annotations

import asyncio
import inspect
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import duetime
from duetime import app as app_mod
from duetime.client.runs import EnqueueRequest

NOWHERE = "redis://127.0.0.1:1/0"  # any I/O fails (RedisUnavailable), never a TypeError


@pytest.fixture
def sent(monkeypatch):
    """An app whose enqueue hands its request here instead of to Redis."""
    app = duetime.App(redis_url=NOWHERE, namespace="reqs")

    @app.task(name="t")
    def t(a: int, b: int = 0) -> None: ...

    got: list[EnqueueRequest] = []

    def enqueue(req: EnqueueRequest) -> str:
        got.append(req)
        return "r1"

    async def aenqueue_many(reqs: list[EnqueueRequest]) -> list[str]:
        got.extend(reqs)
        return ["r1"]

    async def astore() -> Any:
        return app.store

    async def aremember(queues: set[str]) -> None: ...

    monkeypatch.setattr(app.store, "enqueue", enqueue)
    monkeypatch.setattr(app.store, "aenqueue_many", aenqueue_many)
    monkeypatch.setattr(app, "_remember_queues", lambda queues: None)
    monkeypatch.setattr(app, "_astore", astore)
    monkeypatch.setattr(app, "_aremember_queues", aremember)
    app.test_task = t  # type: ignore[attr-defined]
    app.test_sent = got  # type: ignore[attr-defined]
    return app


def test_the_request_takes_every_option_of_enqueue_by_name():
    """A parameter added to enqueue must be given to the request by name (mypy then checks
    its type against EnqueueRequest's field); enqueue's own parameters are the only others."""
    options = set(inspect.signature(duetime.App.enqueue).parameters) - set(app_mod._NOT_OPTIONS)
    request = inspect.signature(app_mod._enqueue_request).parameters
    assert set(request) - {"spec"} == options
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for n, p in request.items() if n != "spec")


OPTIONS: dict[str, Any] = dict(
    kwargs={"b": 2}, at=datetime(2030, 1, 1, tzinfo=UTC), delay=timedelta(seconds=5),
    key="k1", queue="billing", tenant="acme", priority=7, debounce="10s", max_wait=60.0,
    throttle=None, depends_on=["dep-1", "dep-2"], allow_failed_dependencies=True)


def _expected(app: Any) -> EnqueueRequest:
    return EnqueueRequest(app.registry.resolve(app.test_task), [1], {"b": 2},
                          at=OPTIONS["at"], delay=OPTIONS["delay"], key="k1", queue="billing",
                          tenant="acme", priority=7, debounce="10s", max_wait=60.0,
                          throttle=None, depends_on=("dep-1", "dep-2"),
                          allow_failed_dependencies=True)


def test_each_option_of_enqueue_reaches_the_request(sent):
    assert sent.enqueue(sent.test_task, [1], **OPTIONS) == "r1"
    assert asyncio.run(sent.aenqueue(sent.test_task, [1], **OPTIONS)) == "r1"
    assert sent.test_sent == [_expected(sent)] * 2
    sent.test_sent.clear()
    sent.enqueue(sent.test_task, [1])
    [req] = sent.test_sent
    assert (req.kwargs, req.at, req.delay, req.key, req.queue, req.tenant, req.priority,
            req.depends_on, req.allow_failed_dependencies) == ({}, None, None, None, None,
                                                                None, 0, (), False)


def test_a_misspelt_option_is_a_type_error_before_any_io():
    app = duetime.App(redis_url=NOWHERE, namespace="reqs")

    @app.task(name="t")
    def t(a: int) -> None: ...

    with pytest.raises(TypeError, match="dely"):
        app.enqueue(t, [1], dely="30s")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="dely"):
        asyncio.run(app.aenqueue(t, [1], dely="30s"))  # type: ignore[call-arg]
    with pytest.raises(duetime.RedisUnavailable):  # spelt right, the call does reach for Redis
        app.enqueue(t, [1], delay="30s")
