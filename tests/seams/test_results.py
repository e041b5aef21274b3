"""A task's return value through `wait` / `await_result`: the common types round-trip; one
that cannot be stored leaves the run succeeded and makes waiting raise ResultNotStored saying
why (was: `None`, the result gone with only a log warning)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import msgpack
import pytest

import duetime
from duetime import App, ResultNotStored
from duetime.ops.render import run_to_dict, run_to_text
from tests.integration.inproc import serving, until

VALUES = {
    "aware": datetime(2026, 3, 8, 2, 30, 0, 123456, tzinfo=timezone(timedelta(hours=5, minutes=30))),
    "naive": datetime(1999, 12, 31, 23, 59, 59),
    "utc": datetime(2026, 1, 1, tzinfo=UTC),
    "date": date(2026, 2, 28),
    "decimal": Decimal("-12345678901234567890.000000000000000001"),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "nested": {"when": [date(2020, 1, 1), Decimal("1.5")], "id": uuid.UUID(int=1), "n": 3},
}


def _app(url: str, namespace: str) -> App:
    app = App(redis_url=url, namespace=namespace)

    @app.task(name="returns")
    def returns(kind: str) -> object:
        return VALUES[kind]

    @app.task(name="unstorable")
    def unstorable() -> object:
        return object()

    @app.task(name="big")
    def big() -> str:
        return "x" * 5000

    return app


def _finish(app: App, ids: list[str], **settings: object) -> None:
    async def main() -> None:
        async with serving(app, **settings):
            await until(lambda: all(app.get_run(i).state == "succeeded" for i in ids), 30,
                        what="the runs to succeed")
    asyncio.run(main())


def test_common_types_round_trip_through_wait_and_await_result(url, namespace):
    app = _app(url, namespace)
    try:
        ids = {k: app.enqueue("returns", [k]) for k in VALUES}
        _finish(app, list(ids.values()))
        for kind, run_id in ids.items():
            got = app.wait(run_id, 5)
            assert got == VALUES[kind] and type(got) is type(VALUES[kind]), kind
            if isinstance(got, datetime):
                assert got.utcoffset() == VALUES[kind].utcoffset()
            assert asyncio.run(app.await_result(run_id, 5)) == VALUES[kind]
    finally:
        app.close()


@pytest.mark.parametrize("task, settings, why", [
    ("unstorable", {}, "not msgpack-serialisable.*object"),
    ("big", {"max_result": 1000}, "over the 1000-byte cap"),
])
def test_a_result_that_cannot_be_stored_makes_wait_raise_saying_why(url, namespace, task,
                                                                     settings, why):
    app = _app(url, namespace)
    try:
        run_id = app.enqueue(task)
        _finish(app, [run_id], **settings)
        run = app.get_run(run_id)
        assert run.state == "succeeded"  # its effect happened: not retried
        assert len(run.attempts) == 1
        with pytest.raises(ResultNotStored, match=why) as info:
            app.wait(run_id, 5)
        assert info.value.run.id == run_id and isinstance(info.value, duetime.DuetimeError)
        with pytest.raises(ResultNotStored, match=why):
            asyncio.run(app.await_result(run_id, 5))
        assert "result not stored" in run_to_text(run)
        assert "result not stored" in run_to_dict(run)["result_error"]
    finally:
        app.close()


def test_results_stored_before_the_extension_types_still_read(url, namespace, r):
    """A result written as plain msgpack (by an older worker) reads as before; an extension
    code this version does not know reads as an ExtType, not as an error."""
    app = _app(url, namespace)
    try:
        run_id = app.enqueue("returns", ["date"])
        _finish(app, [run_id])
        key = app.keys.run(app.keys.partition_of_run(run_id), run_id)
        r.hset(key, "result", msgpack.packb({"old": [1, "two", b"3"]}, use_bin_type=True))
        assert app.wait(run_id, 5) == {"old": [1, "two", b"3"]}
        r.hset(key, "result", msgpack.packb(msgpack.ExtType(42, b"future")))
        assert app.wait(run_id, 5) == msgpack.ExtType(42, b"future")
        r.hset(key, "result", msgpack.packb(msgpack.ExtType(1, b"not a time")))
        with pytest.raises(ResultNotStored, match="unreadable result"):
            app.wait(run_id, 5)
    finally:
        app.close()
