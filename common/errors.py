"""Every error duetime raises on purpose, so callers can catch one family."""

from __future__ import annotations


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


class PartitionMismatch(DuetimeError):
    """The namespace was created with another partition count; keys would be misrouted."""


class Retry(Exception):  # noqa: N818 - raised by tasks, read as a verb
    """Raised by a task: retry now, or after `delay` seconds, if attempts are left."""

    def __init__(self, delay: float | None = None, reason: str = "") -> None:
        super().__init__(reason or (f"retry requested (delay {delay}s)" if delay else "retry"))
        self.delay = delay


class Fatal(Exception):  # noqa: N818 - raised by tasks, read as a verb
    """Raised by a task: do not retry; the run goes to dead-letter."""


class InvalidState(DuetimeError):
    """The run's current state does not allow the operation (e.g. replaying a running run)."""
