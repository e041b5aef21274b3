"""Debounce and throttle by key: what an enqueue's `debounce=`, `max_wait=` and `throttle=`
become before enqueue.lua sees them (lua/enqueue/coalesce.lua does the rest, atomically).

- `key=K, debounce=D[, max_wait=W]`: while the key's run still waits (scheduled, not started),
  an enqueue replaces its arguments and moves it to now + D, never past its first enqueue + W;
  once it started, the next enqueue creates a new run.
- `key=K, throttle=T`: the first enqueue of each window of T creates the run; the others in
  that window land on it.

Each enqueue returns the id of the run it landed on. The key picks the partition (the
partition `key=` alone would give the task and key), unless the run has a tenant (then the
tenant's, as for every run). `key=` alone is unchanged: the first run of the key, for good.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from duetime.common.errors import InvalidInput
from duetime.common.time.parse import MAX_DURATION, Span, duration_ms

# at least a millisecond (the scripts count in ms), at most what a delay may be
COALESCE = Span(timedelta(milliseconds=1), MAX_DURATION)
MODE_FIELDS = ("debounce", "throttle")  # a coalesced run's first own field (enqueue.lua)


@dataclass(frozen=True, slots=True)
class Coalesce:
    """A validated debounce or throttle: the run's leading fields, and its delay from server
    now (debounce: the debounce; throttle: None, the request's own at/delay)."""

    fields: list[Any]
    delay_ms: int | None


def coalesce(key: str | None, debounce: Any, max_wait: Any, throttle: Any,
             at: Any, delay: Any) -> Coalesce | None:
    """None for a plain enqueue; InvalidInput for a combination that means nothing."""
    if debounce is None and throttle is None:
        if max_wait is not None:
            raise InvalidInput("max_wait= bounds a debounce: give debounce= with it")
        return None
    which = "debounce" if debounce is not None else "throttle"
    if not key:
        raise InvalidInput(f"{which}= needs key=: the key names what is debounced or throttled "
                           f"(e.g. key=f'reindex:{{user_id}}')")
    if debounce is not None and throttle is not None:
        raise InvalidInput("give debounce= or throttle=, not both (debounce delays the run until "
                           "the enqueues stop; throttle runs the first one of each window)")
    if throttle is not None:
        if max_wait is not None:
            raise InvalidInput("max_wait= bounds a debounce, not a throttle")
        return Coalesce(["throttle", duration_ms(COALESCE.parse(throttle, "throttle"))], None)
    if at is not None or delay is not None:
        raise InvalidInput("debounce= sets the run's due time (now + debounce): give it without "
                           "at= or delay=")
    d = COALESCE.parse(debounce, "debounce")
    w = 0
    if max_wait is not None:
        mw = COALESCE.parse(max_wait, "max_wait")
        if mw < d:
            raise InvalidInput(f"max_wait ({max_wait!r}) must be at least the debounce "
                               f"({debounce!r}): the run is due no later than the first enqueue "
                               "+ max_wait")
        w = duration_ms(mw)
    return Coalesce(["debounce", duration_ms(d), "max_wait", w], duration_ms(d))
