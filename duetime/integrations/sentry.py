"""Sentry for duetime (`pip install 'duetime[sentry]'`, docs/integrations.md):

    import sentry_sdk
    from duetime.integrations.sentry import Sentry

    sentry_sdk.init(dsn=...)
    app.middleware(Sentry())

Each failed attempt is an event (its exception, with the traceback of the task), and each run
this worker's report dead-letters is one more (level error, grouped per task), both tagged
`duetime.task`, `duetime.queue`, `duetime.owner`, `duetime.tenant`, with the run id, attempt,
schedule and worker in the `duetime` context. No payload is sent unless asked: the task's
arguments are left out, and so are the local variables of the traceback's frames (where
Sentry would otherwise show the task function's arguments); `include_args=True` sends both.
`failed_attempts=False` reports dead letters only (a retried failure is then no event).
A run the reaper dead-letters (its lease expired on its last attempt) is not seen here: the
scheduler process runs no middleware (see the dead-letter metric and `duetime dead`).
"""

from __future__ import annotations

from typing import Any

import sentry_sdk

from duetime.common.middleware import FAILED, Middleware, RunInfo


def _without_locals(event: dict[str, Any], hint: dict[str, Any]) -> dict[str, Any]:
    """Drop the local variables of every frame (they hold the task's arguments), wherever the
    event carries a stack trace: its exceptions' (chained ones too), its threads', its own.
    The whole event is walked, not the places one sentry-sdk version puts them."""
    _drop_vars(event)
    return event


def _drop_vars(node: Any) -> None:
    if isinstance(node, dict):
        frames = node.get("frames")
        if isinstance(frames, list):
            for frame in frames:
                if isinstance(frame, dict):
                    frame.pop("vars", None)
        for value in node.values():
            if isinstance(value, dict | list):
                _drop_vars(value)
    elif isinstance(node, list):
        for value in node:
            if isinstance(value, dict | list):
                _drop_vars(value)


class Sentry(Middleware):
    def __init__(self, include_args: bool = False, failed_attempts: bool = True) -> None:
        self.include_args, self.failed_attempts = include_args, failed_attempts

    def _fill(self, scope: Any, run: RunInfo) -> None:
        scope.set_tag("duetime.task", run.task)
        scope.set_tag("duetime.queue", run.queue)
        if run.owner:
            scope.set_tag("duetime.owner", run.owner)
        if run.tenant:
            scope.set_tag("duetime.tenant", run.tenant)
        scope.set_context("duetime", {
            "run_id": run.run_id, "attempt": run.attempt, "schedule": run.schedule,
            "worker_id": run.worker_id, "idempotency_key": run.idempotency_key,
        })
        if self.include_args:
            scope.set_context("duetime.args", {"args": list(run.args), "kwargs": dict(run.kwargs)})
        else:
            scope.add_event_processor(_without_locals)

    def after_attempt(self, run: RunInfo, outcome: str, error: BaseException | None) -> None:
        if outcome != FAILED or error is None or not self.failed_attempts:
            return
        with sentry_sdk.new_scope() as scope:
            self._fill(scope, run)
            sentry_sdk.capture_exception(error)

    def on_dead(self, run: RunInfo) -> None:
        with sentry_sdk.new_scope() as scope:
            self._fill(scope, run)
            scope.fingerprint = ["duetime-dead-letter", run.task]
            if run.error:
                scope.set_extra("last_error", run.error.splitlines()[0][:500])
            # sent with no stack: sentry-sdk attaches the calling stack to a message when
            # `attach_stacktrace` is on (its default from 3.0), after every event processor
            # ran and with each frame's locals whatever `include_local_variables` says; here
            # that stack is duetime's report path, whose frames hold the run and its arguments
            sentry_sdk.capture_event({
                "message": f"duetime: a run of {run.task} was dead-lettered", "level": "error",
                "threads": {"values": []}})
