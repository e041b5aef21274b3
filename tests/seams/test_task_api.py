"""The task's own API at its edges: `Retry(delay=...)` takes what `enqueue(delay=...)` takes,
task options are bounded (also when read back from what a worker published), and the
arguments of an enqueue are checked before anything is written."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest
from duetime.common.errors import InvalidInput, InvalidTime

import duetime
from duetime import App
from tests.integration.inproc import serving, until


def ns_keys(r, app) -> list[bytes]:
    """The namespace's keys but what its first use writes (`<ns>:meta`, each partition's
    `T:caps` with the layout format): what an enqueue wrote."""
    return [k for k in r.scan_iter(f"{app.keys.namespace}:*")
            if not k.endswith((b":meta", b":caps"))]


@pytest.mark.parametrize("delay, ms", [("1h", 3_600_000), (timedelta(minutes=5), 300_000),
                                       ("PT1M30S", 90_000), (2.5, 2_500), (0, 0), (None, None)])
def test_retry_delay_takes_what_enqueue_delay_takes(delay, ms):
    assert duetime.Retry(delay=delay).delay_ms == ms


@pytest.mark.parametrize("delay", ["bogus", -1, float("inf"), float("nan"), True, [1],
                                   timedelta(days=-1), "200y"])
def test_a_bad_retry_delay_is_an_error_where_it_is_written(delay):
    with pytest.raises(InvalidTime, match=r"Retry\(delay=...\)"):
        duetime.Retry(delay=delay)


@pytest.mark.parametrize("delay", ["1h", timedelta(minutes=5)])
def test_a_task_retrying_with_a_duration_string_or_timedelta_is_retried_after_it(url, namespace,
                                                                                delay):
    """Was: the executor's task died on `delay * 1000`, the run stayed running until its lease
    lapsed and ended dead with "lease expired", the cause lost."""
    app = App(redis_url=url, namespace=namespace)

    @app.task(name="later", retries=2)
    def later() -> None:
        raise duetime.Retry(delay=delay, reason="not yet")

    async def main() -> str:
        run_id = app.enqueue(later)
        async with serving(app, lease_ms=60_000):
            await until(lambda: app.get_run(run_id).state == "retrying", 20,
                        what="the run to be retrying")
        return run_id

    try:
        run = app.get_run(asyncio.run(main()))
        assert run.attempts[0].outcome != "running" and "not yet" in (run.attempts[0].error or "")
        wanted = timedelta(hours=1) if delay == "1h" else delay
        waited = run.retry_at - run.attempts[0].ended
        assert wanted - timedelta(seconds=5) <= waited <= wanted + timedelta(seconds=5), waited
    finally:
        app.close()


@pytest.mark.parametrize("option, value", [
    ("retries", float("inf")), ("retries", 1.5), ("retries", 10**9), ("retries", True),
    ("retries", -1), ("retries", "3"), ("idempotent", "no"), ("idempotent", 0),
    ("store_result", "yes"), ("owner", 5), ("owner", "x" * 300), ("owner", "a\nb"),
    ("timeout", True), ("timeout", 0), ("timeout", "bogus"), ("backoff", (5, 1)),
    ("backoff", "1s"), ("queue", 5), ("queue", ""), ("tenant", 7),
])
def test_task_options_are_validated_with_bounds(option, value):
    app = App()
    with pytest.raises(InvalidInput, match=f"{option}|queue|tenant"):
        @app.task(name="t", **{option: value})
        def t() -> None: ...
    assert "t" not in app.registry.names()


def test_the_stated_maximum_of_retries_is_accepted():
    from duetime.common.tasks import MAX_RETRIES

    app = App()

    @app.task(name="t", retries=MAX_RETRIES)
    def t() -> None: ...
    assert t.spec.max_attempts == MAX_RETRIES + 1


@pytest.mark.parametrize("published, why", [
    ({"retries": float("inf")}, "retries"), ({"retries": 1.5}, "retries"),
    ({"retries": 10**9}, "retries"), ({"idempotent": "no"}, "idempotent"),
    ({"backoff": [1, "x"]}, "backoff"), ({"queue": "a b"}, "queue"), ([1, 2], "JSON object"),
])
def test_a_bad_published_option_is_refused_naming_the_task(app, r, published, why):
    """By-name enqueue reads the options a worker published (`<ns>:tasks`): they go through
    the same checks as `@app.task`'s (was: `"retries": Infinity` made every by-name enqueue of
    the task fail with a raw OverflowError, and 1.5 became 1)."""
    producer = App(redis_url=app.redis_url, namespace=app.keys.namespace)
    r.hset(app.keys.tasks, "published.bad", json.dumps(published))
    try:
        with pytest.raises(InvalidInput, match=rf"task 'published.bad'.*{why}"):
            producer.enqueue("published.bad", [])
    finally:
        producer.close()
    assert [k for k in ns_keys(r, app) if not k.endswith(b":tasks")] == []


def test_published_options_that_are_not_json_are_refused(app, r):
    producer = App(redis_url=app.redis_url, namespace=app.keys.namespace)
    r.hset(app.keys.tasks, "published.bad", "{not json")
    try:
        with pytest.raises(InvalidInput, match="task 'published.bad'.*not JSON"):
            producer.enqueue("published.bad", [])
    finally:
        producer.close()


def test_good_published_options_are_used(app, r):
    producer = App(redis_url=app.redis_url, namespace=app.keys.namespace)
    r.hset(app.keys.tasks, "published.ok", json.dumps(
        {"retries": 7, "queue": "q1", "backoff": [2, 60], "idempotent": False, "newer": 1}))
    try:
        run = producer.get_run(producer.enqueue("published.ok", [1]))
    finally:
        producer.close()
    assert (run.max_attempts, run.queue) == (8, "q1")


@pytest.mark.parametrize("kwargs, match", [
    ({"args": None}, "args must be a list or tuple"),
    ({"args": "abc"}, "args must be a list or tuple"),
    ({"args": 5}, "args must be a list or tuple"),
    ({"args": [1], "kwargs": {1: 2}}, "kwargs must be a dict"),
    ({"args": [1], "tenant": 5}, "tenant"),
])
def test_bad_enqueue_arguments_are_clear_errors_and_write_nothing(app, r, kwargs, match):
    for call in (lambda: app.enqueue("noop", **kwargs),
                 lambda: asyncio.run(app.aenqueue("noop", **kwargs)),
                 lambda: app.enqueue_many([{"task": "noop", **kwargs}])):
        with pytest.raises(InvalidInput, match=match):
            call()
    assert ns_keys(r, app) == []
