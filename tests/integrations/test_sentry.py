"""duetime.integrations.sentry through the real sentry-sdk, its events caught by a transport
of the test's own (no network): failed attempts and dead letters as events, tagged and with
the run's context, no payload unless asked."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

sentry_sdk = pytest.importorskip("sentry_sdk")

from sentry_sdk.envelope import Envelope  # noqa: E402
from sentry_sdk.transport import Transport  # noqa: E402

import duetime  # noqa: E402
from duetime.integrations.sentry import Sentry  # noqa: E402
from tests.integration.inproc import drain  # noqa: E402

pytestmark = pytest.mark.scripts
EVENTS: list[dict[str, Any]] = []


class Capture(Transport):
    """Keeps every event sent, in memory."""

    def capture_envelope(self, envelope: Envelope) -> None:
        event = envelope.get_event()
        if event is not None:
            EVENTS.append(event)

    def flush(self, timeout: float, callback: Any = None) -> None:
        pass


@pytest.fixture
def events(request: pytest.FixtureRequest) -> Iterator[list[dict[str, Any]]]:
    """Sentry on, every event kept; `attach_stacktrace` as the test's parameter says, else
    the installed sentry-sdk's default (off in 2.x, on from 3.0)."""
    EVENTS.clear()
    attach = getattr(request, "param", None)
    sentry_sdk.init(dsn="https://public@sentry.invalid/1", transport=Capture,
                    default_integrations=False,
                    **({} if attach is None else {"attach_stacktrace": attach}))
    yield EVENTS
    sentry_sdk.get_client().close()
    sentry_sdk.init(default_integrations=False)  # no DSN: off, and nothing left patched in this process


def _frames(event: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for v in event["exception"]["values"] for f in v["stacktrace"]["frames"]]


# a stack attached to a message (sentry-sdk's `attach_stacktrace`, the default from 3.0) is
# taken after every event processor ran, with its frames' locals: the dead letter's event
# must carry none, whichever the setting
@pytest.mark.parametrize("events", [None, False, True], indirect=True,
                         ids=["sdk-default", "no-attach", "attach-stacktrace"])
def test_failed_attempts_and_the_dead_letter_are_events(own_app: duetime.App, events):
    own_app.middleware(Sentry())

    @own_app.task(name="sentry.charge", retries=1, backoff=(0, 0), queue="billing",
                  owner="payments", tenant="acme")
    def charge(card: str) -> None:
        secret = card  # noqa: F841 - a local the event must not carry
        raise LookupError("card declined")

    card = f"card-{uuid.uuid4().hex}"  # made here: the source text shown in frames lacks it
    run_id = charge.enqueue(card)
    asyncio.run(drain(own_app, queues=["billing"]))
    assert own_app.get_run(run_id).state == "dead"
    failures = [e for e in events if "exception" in e]
    [dead] = [e for e in events if "exception" not in e]
    assert len(failures) == 2 and len(events) == 3
    for n, event in enumerate(failures, start=1):
        assert event["exception"]["values"][-1]["type"] == "LookupError"
        assert event["exception"]["values"][-1]["value"] == "card declined"
        assert {k: event["tags"][k] for k in ("duetime.task", "duetime.queue", "duetime.owner",
                                              "duetime.tenant")} == {
            "duetime.task": "sentry.charge", "duetime.queue": "billing",
            "duetime.owner": "payments", "duetime.tenant": "acme"}
        assert event["contexts"]["duetime"]["run_id"] == run_id
        assert event["contexts"]["duetime"]["attempt"] == n
        # the task's frame is there, its arguments are not
        assert any(f.get("function") == "charge" for f in _frames(event))
        assert all("vars" not in f for f in _frames(event))
        assert card not in repr(event)
    assert dead["level"] == "error" and "dead-lettered" in dead["message"]
    assert dead["tags"]["duetime.task"] == "sentry.charge"
    assert dead["contexts"]["duetime"]["run_id"] == run_id
    assert dead["fingerprint"] == ["duetime-dead-letter", "sentry.charge"]
    assert "card declined" in dead["extra"]["last_error"]
    assert card not in repr(dead)


def test_the_payload_only_when_asked_and_dead_letters_only(own_app: duetime.App, events):
    own_app.middleware(Sentry(include_args=True, failed_attempts=False))

    @own_app.task(name="sentry.fatal")
    def fatal(order: int) -> None:
        raise duetime.Fatal(f"order {order} is gone")

    @own_app.task(name="sentry.ok")
    def ok() -> int:
        return 1

    fatal.enqueue(44)
    ok.enqueue()
    asyncio.run(drain(own_app))
    [dead] = events  # failed attempts off: the dead letter alone; a success sends nothing
    assert dead["contexts"]["duetime.args"] == {"args": [44], "kwargs": {}}
    assert "order 44 is gone" in dead["extra"]["last_error"]


def test_with_include_args_the_frames_keep_their_variables(own_app: duetime.App, events):
    own_app.middleware(Sentry(include_args=True))

    @own_app.task(name="sentry.retry", retries=0)
    def once(order: int) -> None:
        raise RuntimeError("no")

    once.enqueue(7)
    asyncio.run(drain(own_app))
    failure = next(e for e in events if "exception" in e)
    [frame] = [f for f in _frames(failure) if f.get("function") == "once"]
    assert frame["vars"]["order"] == "7"
    assert failure["contexts"]["duetime.args"] == {"args": [7], "kwargs": {}}
