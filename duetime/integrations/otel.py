"""OpenTelemetry traces for duetime (`pip install 'duetime[otel]'`, docs/integrations.md):

    from duetime.integrations.otel import OpenTelemetry
    app.middleware(OpenTelemetry())

A span for each enqueue (kind PRODUCER, `send <queue>`), a child of whatever span is current
where the enqueue is called (an HTTP handler's), and one for each attempt (kind CONSUMER,
`process <queue>`), a child of the enqueue's span: the producer's trace context travels on
the run (its `traceparent` header, stored on the run record), so one trace runs from the
request through the enqueue to every attempt, retries included (`duetime.attempt` numbers
them). The attempt's span is current while the task body runs: spans the task makes (its
HTTP calls, its queries) are its children. A failed attempt's span has status ERROR and the
exception recorded as an event.

Attributes follow the OpenTelemetry messaging conventions where they fit (`messaging.system`
"duetime", `messaging.destination.name` the queue, `messaging.message.id` the run id,
`messaging.operation.type` "send" / "process", `messaging.operation.name` "enqueue" /
"process"), and duetime's own: `duetime.task`, `duetime.attempt`, `duetime.outcome`,
`duetime.schedule`, `duetime.tenant`, `duetime.owner`. Runs of schedules are created by the
scheduler, which runs no middleware: their attempts start a trace of their own, and carry
`duetime.schedule` (the schedule's name) and `duetime.scheduled_at`, by which every run of a
schedule is found.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import SpanKind, Status, StatusCode

from duetime.common.middleware import FAILED, EnqueueInfo, Middleware, RunInfo

SYSTEM = "duetime"


def _common(task: str, queue: str, run_id: str, tenant: str | None, owner: str | None,
            schedule: str | None) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "messaging.system": SYSTEM, "messaging.destination.name": queue,
        "messaging.message.id": run_id, "duetime.task": task,
    }
    if tenant:
        attrs["duetime.tenant"] = tenant
    if owner:
        attrs["duetime.owner"] = owner
    if schedule:
        attrs["duetime.schedule"] = schedule
    return attrs


class OpenTelemetry(Middleware):
    """The middleware. `tracer_provider`: the provider to take the tracer from (default: the
    global one); `propagator`: how the trace context is written on the run and read back
    (default: the global propagator, W3C trace context and baggage unless configured)."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None,
                 propagator: TextMapPropagator | None = None) -> None:
        from duetime import __version__

        self.tracer = trace.get_tracer("duetime", __version__, tracer_provider=tracer_provider)
        self.propagator = propagator

    def _inject(self, headers: dict[str, str], ctx: otel_context.Context) -> None:
        if self.propagator is not None:
            self.propagator.inject(headers, context=ctx)
        else:
            propagate.inject(headers, context=ctx)

    def _extract(self, headers: Mapping[str, str]) -> otel_context.Context:
        carrier = dict(headers)
        if self.propagator is not None:
            return self.propagator.extract(carrier)
        return propagate.extract(carrier)

    # -- the producer ---------------------------------------------------------------------
    def on_enqueue(self, request: EnqueueInfo) -> None:
        attrs = _common(request.task, request.queue, request.run_id, request.tenant,
                        request.owner, request.schedule)
        attrs["messaging.operation.type"] = "send"
        attrs["messaging.operation.name"] = "enqueue"
        span = self.tracer.start_span(f"send {request.queue}", kind=SpanKind.PRODUCER,
                                      attributes=attrs)
        request.state[self] = span
        self._inject(request.headers, trace.set_span_in_context(span))

    def after_enqueue(self, request: EnqueueInfo, error: BaseException | None) -> None:
        span = request.state.pop(self, None)
        if span is None:
            return
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:300]))
        span.end()

    # -- the worker -----------------------------------------------------------------------
    def before_attempt(self, run: RunInfo) -> None:
        attrs = _common(run.task, run.queue, run.run_id, run.tenant, run.owner, run.schedule)
        attrs["messaging.operation.type"] = "process"
        attrs["messaging.operation.name"] = "process"
        attrs["duetime.attempt"] = run.attempt
        if run.scheduled_at is not None and run.schedule:
            attrs["duetime.scheduled_at"] = run.scheduled_at.isoformat()
        parent = self._extract(run.headers) if run.headers else None
        span = self.tracer.start_span(f"process {run.queue}", context=parent,
                                      kind=SpanKind.CONSUMER, attributes=attrs)
        token = otel_context.attach(trace.set_span_in_context(span))
        run.state[self] = (span, token)

    def after_attempt(self, run: RunInfo, outcome: str, error: BaseException | None) -> None:
        got = run.state.pop(self, None)
        if got is None:
            return
        span, token = got
        span.set_attribute("duetime.outcome", outcome)
        if outcome == FAILED and error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:300]))
        try:
            otel_context.detach(token)
        finally:
            span.end()
