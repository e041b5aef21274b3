"""duetime.integrations.otel through the real OpenTelemetry SDK (its in-memory exporter): one
trace from a handler's span through the enqueue to every attempt, one span per attempt with
retries numbered, errors recorded, the attempt's span current in the task body, schedule runs
named by their schedule."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

import duetime  # noqa: E402
from duetime.integrations.otel import OpenTelemetry  # noqa: E402
from tests.integration.inproc import drain  # noqa: E402

pytestmark = pytest.mark.scripts


@pytest.fixture
def traced(own_app: duetime.App) -> tuple[duetime.App, InMemorySpanExporter, TracerProvider]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    own_app.middleware(OpenTelemetry(tracer_provider=provider))
    return own_app, exporter, provider


def _by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def test_one_trace_from_the_handler_through_the_enqueue_to_every_attempt(traced):
    app, exporter, provider = traced
    seen: list[tuple[int, int]] = []  # (trace id, span id) current in the body, per attempt

    @app.task(name="otel.flaky", retries=2, backoff=(0, 0), queue="billing", owner="payments",
              tenant="acme")
    def flaky(order: int) -> int:
        ctx = trace.get_current_span().get_span_context()
        seen.append((ctx.trace_id, ctx.span_id))
        if duetime.current_run().attempt == 1:
            raise ConnectionError("gateway down")
        return order

    handler_tracer = provider.get_tracer("the-web-app")
    with handler_tracer.start_as_current_span("POST /orders") as handler:
        run_id = flaky.enqueue(44)
    asyncio.run(drain(app, queues=["billing"]))
    assert app.wait(run_id, 30) == 44

    spans = exporter.get_finished_spans()
    [producer] = _by_name(spans, "send billing")
    attempts = sorted(_by_name(spans, "process billing"),
                      key=lambda s: s.attributes["duetime.attempt"])
    assert len(spans) == 4 and len(attempts) == 2  # handler, enqueue, one span per attempt
    trace_id = handler.get_span_context().trace_id
    assert {s.context.trace_id for s in spans} == {trace_id}
    assert producer.kind == SpanKind.PRODUCER
    assert producer.parent.span_id == handler.get_span_context().span_id
    for n, span in enumerate(attempts, start=1):
        assert span.kind == SpanKind.CONSUMER
        assert span.parent.span_id == producer.context.span_id
        assert span.attributes["duetime.attempt"] == n
        assert (span.attributes["messaging.system"], span.attributes["messaging.destination.name"],
                span.attributes["messaging.message.id"], span.attributes["duetime.task"],
                span.attributes["duetime.owner"], span.attributes["duetime.tenant"]) == (
            "duetime", "billing", run_id, "otel.flaky", "payments", "acme")
    assert producer.attributes["messaging.message.id"] == run_id
    assert producer.attributes["messaging.operation.type"] == "send"
    assert attempts[0].attributes["messaging.operation.type"] == "process"
    # the failed attempt: status ERROR and the exception as an event; the retry succeeded
    first, second = attempts
    assert first.status.status_code == StatusCode.ERROR
    assert first.attributes["duetime.outcome"] == "failed"
    [event] = [e for e in first.events if e.name == "exception"]
    assert event.attributes["exception.type"] == "ConnectionError"
    assert event.attributes["exception.message"] == "gateway down"
    assert second.status.status_code != StatusCode.ERROR and not second.events
    assert second.attributes["duetime.outcome"] == "succeeded"
    # the attempt's span was current in the (sync) task body
    assert seen == [(s.context.trace_id, s.context.span_id) for s in attempts]


def test_an_async_body_runs_in_its_attempts_span_and_aenqueue_is_traced(traced):
    app, exporter, provider = traced
    inner: list[int] = []

    @app.task(name="otel.async")
    async def work() -> None:
        with provider.get_tracer("task-code").start_as_current_span("query") as q:
            inner.append(q.get_span_context().span_id)

    async def main() -> str:
        run_id = await work.aenqueue()
        await drain(app)
        await app.await_result(run_id, 30)
        return run_id

    run_id = asyncio.run(main())
    spans = exporter.get_finished_spans()
    [producer] = _by_name(spans, "send default")
    [attempt] = _by_name(spans, "process default")
    [query] = _by_name(spans, "query")
    assert producer.parent is None  # no span was current at the enqueue: the trace starts there
    assert attempt.parent.span_id == producer.context.span_id
    assert query.parent.span_id == attempt.context.span_id  # the task's own span: a child
    assert attempt.attributes["messaging.message.id"] == run_id


def test_a_schedule_run_is_named_by_its_schedule(traced):
    app, exporter, _ = traced

    @app.task(name="otel.nightly")
    def nightly() -> None:
        pass

    app.schedule("nightly-report", duetime.Cron("0 3 * * *"), nightly)
    run_id = app.trigger("nightly-report")
    asyncio.run(drain(app))
    assert app.get_run(run_id).state == "succeeded"
    [attempt] = _by_name(exporter.get_finished_spans(), "process default")
    assert attempt.parent is None  # made by the scheduler's side: no producer span
    assert attempt.attributes["duetime.schedule"] == "nightly-report"
    assert "duetime.scheduled_at" in attempt.attributes


def test_a_failed_enqueue_ends_its_span_with_the_error(traced):
    app, exporter, _ = traced

    @app.task(name="otel.bad")
    def bad(x: int) -> None:
        pass

    with pytest.raises(duetime.InvalidInput):
        app.enqueue(bad, "not a list")  # type: ignore[arg-type]
    [producer] = _by_name(exporter.get_finished_spans(), "send default")
    assert producer.status.status_code == StatusCode.ERROR
    assert [e.name for e in producer.events] == ["exception"]
