"""What a type checker says about enqueueing, pinned: checked by mypy --strict in `make test`
(`.ci/typecheck.py`), never run (tests/packaging/test_enqueue_types.py makes the same calls
at run time).

Every `# type: ignore[code]` below is an error mypy must report: with `warn_unused_ignores`
an expected error that disappears fails the check, and one reported under another code is
reported as it is. `assert_type` pins what calls return.
"""

from __future__ import annotations

from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, assert_type

import duetime

app = duetime.App()


@app.task(name="send-invoice", retries=5)
async def send_invoice(invoice_id: int) -> dict[str, int]:
    return {"sent": invoice_id}


@app.task
def resize(image: str, width: int = 640, *, fmt: str = "png") -> bytes:
    return b""


@app.task
def keyed(order: int, key: str = "") -> str:
    """A parameter named like an option: passed through `.options(...).enqueue`."""
    return key


WHEN = datetime(2030, 1, 1, tzinfo=UTC)


def types_of_the_task_objects() -> None:
    # (assert_type compares parameter names too, which no annotation can spell: the calls' types)
    coro = send_invoice(44)  # called directly, it is the function
    assert_type(coro, Coroutine[Any, Any, dict[str, int]]).close()
    assert_type(resize("a.png"), bytes)
    resize("a.png", "wide")  # type: ignore[arg-type]
    assert isinstance(send_invoice.options(delay="30s"), duetime.TaskOptions)


def the_functions_arguments_are_checked() -> None:
    assert_type(send_invoice.enqueue(44), str)
    assert_type(resize.enqueue("a.png", 3, fmt="webp"), str)
    assert_type(resize.enqueue(image="a.png"), str)
    send_invoice.enqueue("not-an-int")  # type: ignore[call-overload]
    send_invoice.enqueue()  # type: ignore[call-overload]
    send_invoice.enqueue(44, 45)  # type: ignore[call-overload]
    resize.enqueue("a.png", fmt=3)  # type: ignore[call-overload]


def unknown_keywords_are_refused() -> None:
    send_invoice.enqueue(44, dely="30s")  # type: ignore[call-overload]
    resize.enqueue("a.png", widht=3)  # type: ignore[call-overload]
    send_invoice.options(dely="30s")  # type: ignore[call-arg]
    send_invoice.options(delay="30s").enqueue(44, dely="30s")  # type: ignore[call-arg]


def options_take_what_the_runtime_takes() -> None:
    # the README's own lines
    assert_type(send_invoice.options(key="invoice-43").enqueue(43), str)
    assert_type(send_invoice.options(delay="30s").enqueue(44), str)
    assert_type(send_invoice.enqueue(43, key="invoice-43"), str)
    assert_type(send_invoice.enqueue(44, delay="30s"), str)
    # durations: a string, seconds (int or float), a timedelta; instants: aware or ISO-8601
    for delay in ("30s", "1h30m", "PT1H30M", 30, 1.5, timedelta(minutes=5)):
        send_invoice.enqueue(44, delay=delay)
        send_invoice.options(delay=delay).enqueue(44)
    for at in (WHEN, "2030-01-01T00:00:00Z"):
        send_invoice.enqueue(44, at=at)
        send_invoice.options(at=at, key="k", queue="billing").enqueue(44)
    send_invoice.enqueue(44, queue="billing")
    send_invoice.enqueue(44, key="k", delay=None)
    app.enqueue(send_invoice, [44], delay="30s")
    app.enqueue(send_invoice, [44], at="2030-01-01T00:00:00Z")
    app.enqueue("send-invoice", [44], delay=timedelta(seconds=30), queue="billing")


def debounce_and_throttle_take_durations_with_a_key() -> None:
    assert_type(send_invoice.enqueue(44, key="inv", debounce="500ms"), str)
    assert_type(send_invoice.enqueue(44, key="inv", debounce=2, max_wait=timedelta(minutes=1)),
                str)
    assert_type(send_invoice.enqueue(44, key="inv", throttle=1.5), str)
    assert_type(send_invoice.options(key="inv", debounce="1s", max_wait="5s").enqueue(44), str)
    assert_type(send_invoice.options(key="inv", throttle="1h").enqueue(44), str)
    assert_type(app.enqueue("send-invoice", [44], key="inv", debounce="500ms", max_wait="1s"), str)
    assert_type(app.enqueue(send_invoice, [44], key="inv", throttle=timedelta(hours=1)), str)
    send_invoice.enqueue(44, key="inv", debounce=[1])  # type: ignore[call-overload]
    send_invoice.options(key="inv", throttle=b"1s")  # type: ignore[arg-type]
    app.enqueue(send_invoice, [44], key="inv", max_wait=object())  # type: ignore[arg-type]


def options_of_the_wrong_type_are_refused() -> None:
    send_invoice.enqueue(44, delay=[30])  # type: ignore[call-overload]
    send_invoice.enqueue(44, key=7)  # type: ignore[call-overload]
    send_invoice.options(at=1_900_000_000)  # type: ignore[arg-type]
    send_invoice.options(delay=b"30s")  # type: ignore[arg-type]
    send_invoice.options(queue=None, key=b"k")  # type: ignore[arg-type]


def through_options_the_arguments_are_checked_too() -> None:
    assert_type(send_invoice.options(delay="30s").enqueue(44), str)
    assert_type(resize.options(key="k").enqueue("a.png", fmt="webp"), str)
    send_invoice.options(delay="30s").enqueue("not-an-int")  # type: ignore[arg-type]
    resize.options(key="k").enqueue(3)  # type: ignore[arg-type]
    # a task's own parameter named like an option: only through options()
    assert_type(keyed.options(key="idem").enqueue(7, key="the function's own"), str)
    keyed.options().enqueue(7, key=8)  # type: ignore[arg-type]


def mixing_options_into_enqueue_checks_the_options_only() -> None:
    """The limit of ParamSpec: with an option among enqueue's keywords, the overload that
    matches takes the function's arguments as Any (the run time check still refuses them:
    InvalidInput). Pinned so that a change of the overloads is seen."""
    send_invoice.enqueue("not-an-int", delay="30s")
    send_invoice.enqueue(44, delay="30s", dely="30s")


async def from_asyncio_code() -> None:
    assert_type(await send_invoice.aenqueue(45), str)
    assert_type(await send_invoice.aenqueue(45, delay="30s"), str)
    assert_type(await send_invoice.options(at="2030-01-01T00:00:00Z").aenqueue(45), str)
    assert_type(await app.aenqueue(send_invoice, [45], delay="30s", at=None), str)
    await send_invoice.aenqueue("not-an-int")  # type: ignore[call-overload]
    await send_invoice.aenqueue(45, dely="30s")  # type: ignore[call-overload]
    await send_invoice.options().aenqueue(45, dely="30s")  # type: ignore[call-arg]
    assert_type(await send_invoice.aenqueue(45, key="k", debounce="500ms"), str)
    assert_type(await app.aenqueue(send_invoice, [45], key="k", throttle="1s"), str)
