"""`duetime.testing`, used the way the README shows: a user's unit test runs their tasks
through duetime's own scripts on an in-memory backend, without a server."""

from __future__ import annotations

import pytest

import duetime
import duetime.testing

app = duetime.App(redis_url="redis://127.0.0.1:1/0")  # never reached: tests run in memory
calls: list[int] = []


@app.task(name="send-invoice")
def send_invoice(invoice_id: int) -> dict:
    calls.append(invoice_id)
    return {"sent": invoice_id}


@app.task(name="charge", retries=2)
def charge(amount: int) -> None:
    if amount < 0:
        raise ValueError("negative amount")


@app.task(name="flaky-once", retries=3)
def flaky_once() -> str:
    run = duetime.current_run()
    if run.attempt == 1:
        raise duetime.Retry(delay=3600)  # an hour: drain() skips the back-off
    return f"attempt {run.attempt}"


def test_an_invoice_is_sent():
    with duetime.testing.local(app) as backend:
        run_id = send_invoice.enqueue(42)
        assert backend.drain() == 1
        assert app.get_run(run_id).state == "succeeded"
        assert app.wait(run_id) == {"sent": 42}


def test_a_failing_charge_ends_dead_after_its_retries():
    with duetime.testing.local(app) as backend:
        run_id = charge.enqueue(-1)
        backend.drain()
        run = app.get_run(run_id)
        assert run.state == "dead" and run.attempt == 3
        assert [a.outcome for a in run.attempts] == ["failed"] * 3
        with pytest.raises(duetime.RunFailed, match="negative amount"):
            app.wait(run_id)


def test_retries_delays_and_idempotency_keys_behave_as_on_a_server():
    with duetime.testing.local(app) as backend:
        retried = flaky_once.enqueue()
        later = send_invoice.enqueue(7, delay=3600)
        once = send_invoice.enqueue(8, key="invoice-8")
        assert send_invoice.enqueue(8, key="invoice-8") == once
        backend.drain()
        assert app.wait(retried) == "attempt 2"
        assert app.get_run(later).state == "scheduled"  # due in an hour: not run
        backend.drain(delayed=True)
        assert app.get_run(later).state == "succeeded"
        assert app.get_run(once).state == "succeeded"


def test_each_block_starts_empty_and_the_app_gets_its_url_back():
    with duetime.testing.local(app) as backend:
        run_id = send_invoice.enqueue(1)
        backend.drain()
    assert app.redis_url == "redis://127.0.0.1:1/0"
    with duetime.testing.local(app), pytest.raises(duetime.RunNotFound):
        app.get_run(run_id)
