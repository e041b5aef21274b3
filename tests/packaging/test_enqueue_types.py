"""The calls tests/typecheck/check_enqueue.py pins for mypy, made at run time against a real
server: what mypy accepts works (every form of duration and instant the options' annotations
name), what it refuses is refused here too before anything is written (InvalidInput for
arguments the function cannot take and for bad option values, TypeError for an unknown option
of `options()`), and the one gap ParamSpec leaves (the function's arguments beside an option
in `enqueue`) is caught here."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
import redis

import duetime

WHEN = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
def tapp(url: str, namespace: str):
    app = duetime.App(redis_url=url, namespace=namespace)

    @app.task(name="send-invoice", retries=5)
    async def send_invoice(invoice_id: int) -> dict[str, int]:
        return {"sent": invoice_id}

    @app.task(name="keyed")
    def keyed(order: int, key: str = "") -> str:
        return key

    app.test_tasks = (send_invoice, keyed)  # type: ignore[attr-defined]
    yield app
    app.close()


def _keys(url: str, namespace: str) -> set[bytes]:
    return set(redis.Redis.from_url(url).scan_iter(f"{namespace}:*"))


def _delay(app: duetime.App, run_id: str) -> timedelta:
    run = app.get_run(run_id)
    assert run.due is not None and run.created is not None
    return run.due - run.created


def test_the_readmes_calls_and_every_accepted_form_of_the_options(tapp):
    send_invoice, _ = tapp.test_tasks
    assert tapp.get_run(send_invoice.enqueue(44)).args == [44]
    first = send_invoice.enqueue(43, key="invoice-43")
    assert send_invoice.enqueue(43, key="invoice-43") == first
    thirty = _delay(tapp, send_invoice.enqueue(44, delay="30s"))
    assert timedelta(seconds=29) < thirty <= timedelta(seconds=31)
    for delay, seconds in (("1h30m", 5400), ("PT1H30M", 5400), (30, 30), (1.5, 1.5),
                           (timedelta(minutes=5), 300)):
        for run_id in (send_invoice.enqueue(44, delay=delay),
                       send_invoice.options(delay=delay).enqueue(44)):
            assert abs(_delay(tapp, run_id) - timedelta(seconds=seconds)) < timedelta(seconds=1), delay
    for at in (WHEN, "2030-01-01T00:00:00Z"):
        bound = send_invoice.options(at=at, key=f"k-{type(at).__name__}", queue="billing")
        for run_id in (send_invoice.enqueue(44, at=at), bound.enqueue(44)):
            assert tapp.get_run(run_id).due == WHEN
    run = tapp.get_run(send_invoice.enqueue(44, queue="billing"))
    assert (run.queue, run.args) == ("billing", [44])
    for run_id in (tapp.enqueue(send_invoice, [44], delay="30s"),
                   tapp.enqueue("send-invoice", [44], delay=timedelta(seconds=30), queue="billing")):
        assert timedelta(seconds=29) < _delay(tapp, run_id) <= timedelta(seconds=31)
    assert tapp.get_run(tapp.enqueue(send_invoice, [44], at="2030-01-01T00:00:00Z")).due == WHEN


def test_what_mypy_refuses_is_refused_before_anything_is_written(tapp, url, namespace):
    send_invoice, keyed = tapp.test_tasks
    send_invoice.enqueue(1)  # the namespace's own keys exist from here on
    before = _keys(url, namespace)
    refused = {
        "cannot take these arguments": [
            lambda: send_invoice.enqueue(44, dely="30s"),
            lambda: send_invoice.enqueue(),
            lambda: send_invoice.enqueue(44, 45),
            lambda: send_invoice.options(delay="30s").enqueue(44, dely="30s"),
            # the gap ParamSpec leaves: mypy takes these (an option among the keywords), run
            # time does not
            lambda: send_invoice.enqueue(44, delay="30s", dely="30s"),
            lambda: send_invoice.enqueue(delay="30s"),
        ],
        "delay": [lambda: send_invoice.enqueue(44, delay=[30]),
                  lambda: send_invoice.options(delay=b"30s").enqueue(44)],
        "at": [lambda: send_invoice.options(at=1_900_000_000).enqueue(44)],
        "key": [lambda: send_invoice.enqueue(44, key=7)],
    }
    for match, calls in refused.items():
        for call in calls:
            with pytest.raises(duetime.InvalidInput, match=match):
                call()
    with pytest.raises(TypeError, match="dely"):
        send_invoice.options(dely="30s")  # type: ignore[call-arg]
    with pytest.raises(duetime.InvalidInput, match="cannot take these arguments"):
        asyncio.run(send_invoice.aenqueue(45, dely="30s"))
    assert _keys(url, namespace) == before


def test_an_option_keyword_is_the_option_and_options_pass_the_functions_own(tapp):
    _, keyed = tapp.test_tasks
    run = tapp.get_run(keyed.enqueue(7, key="idem"))
    assert (run.key, run.args, run.kwargs) == ("idem", [7], {})
    run = tapp.get_run(keyed.options(key="idem-2").enqueue(7, key="the function's own"))
    assert (run.key, run.args, run.kwargs) == ("idem-2", [7], {"key": "the function's own"})


def test_from_asyncio_code(tapp):
    send_invoice, _ = tapp.test_tasks

    async def main() -> list[str]:
        return [await send_invoice.aenqueue(45), await send_invoice.aenqueue(45, delay="30s"),
                await send_invoice.options(at="2030-01-01T00:00:00Z").aenqueue(45),
                await tapp.aenqueue(send_invoice, [45], delay="30s", at=None)]

    now, later, at, app_later = asyncio.run(main())
    assert _delay(tapp, now) < timedelta(seconds=1)
    assert timedelta(seconds=29) < _delay(tapp, later) <= timedelta(seconds=31)
    assert timedelta(seconds=29) < _delay(tapp, app_later) <= timedelta(seconds=31)
    assert tapp.get_run(at).due == WHEN
