"""Back-off and logging for a loop that cannot reach Redis.

A loop that retries a failed Redis call at once spins (a refused connection fails in
microseconds) and logs every try. `Outage` gives each loop a jittered exponential back-off and
logs an incident twice: when it starts, and when the loop is through ("available again after
N failures over T s"), with a reminder while it lasts. Right after a server comes back, a
client's pooled connections from before fail one by one ("Connection closed by server"):
failures within SETTLE_S of a recovery belong to the incident just closed and are not
announced again unless they go on for SETTLE_S.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

BASE_S = 0.1
CAP_S = 2.0  # a failed reconnect to a local port costs microseconds; recover within 2 s
# The back-off of a call that met a failover or a slot move (common.connection.topology_error)
# stops doubling at a second, so the work resumes within about a second of a replica's
# promotion; other refusals (OOM, a damaged key), which a quick retry does not cure, at 5 s.
TOPOLOGY_CAP_S = 1.0
REFUSED_CAP_S = 5.0
REMIND_S = 60.0
SETTLE_S = 5.0


def jittered(failures: int, cap_s: float, base_s: float = BASE_S,
             rand: Callable[[], float] = random.random) -> float:
    """The wait after the `failures`-th failure in a row: doubling from `base_s` up to
    `cap_s`, drawn from its upper half (processes that failed together come back apart)."""
    full: float = min(cap_s, base_s * 2 ** min(max(failures, 1) - 1, 30))
    return full * (0.5 + rand() / 2)


def retry_in(exc: BaseException, failures: int) -> float:
    """How long a loop waits after `exc`, its `failures`-th failure in a row: short for a
    failover or an unreachable node, longer for a refusal (see TOPOLOGY_CAP_S)."""
    from duetime.common.connection import topology_error

    return jittered(failures, TOPOLOGY_CAP_S if topology_error(exc) else REFUSED_CAP_S)


def bounded(exc: BaseException, limit: int = 200) -> str:
    """An error's first line, at most `limit` characters: enough to tell, short enough to log."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Outage:
    """One loop's view of Redis being unavailable.

    `failed(exc)` returns how long to wait before the next try (doubling from `base_s` up to
    `cap_s`, each wait drawn from its upper half, so processes that lost Redis together do not
    come back in step) and logs the first failure of an incident; `ok()` ends an incident,
    logging how long it lasted. Several failures in a row are one incident.
    """

    def __init__(self, what: str, log: Any, base_s: float = BASE_S, cap_s: float = CAP_S,
                 remind_s: float = REMIND_S, settle_s: float = SETTLE_S,
                 clock: Callable[[], float] = time.monotonic,
                 rand: Callable[[], float] = random.random, **fields: Any) -> None:
        self.what, self.log, self.fields = what, log, fields
        self.base_s, self.cap_s, self.remind_s, self.settle_s = base_s, cap_s, remind_s, settle_s
        self._clock, self._rand = clock, rand
        self.failures = 0
        self._since = 0.0
        self._reminded = 0.0
        self._closed_at: float | None = None  # when the last incident ended
        self._quiet = False  # this incident has not been announced (an aftershock so far)

    @property
    def active(self) -> bool:
        return self.failures > 0

    def failed(self, exc: BaseException) -> float:
        now = self._clock()
        self.failures += 1
        if self.failures == 1:
            self._since = self._reminded = now
            self._quiet = self._closed_at is not None and now - self._closed_at < self.settle_s
            if not self._quiet:
                self.log.warning("redis unavailable; backing off", loop=self.what,
                                 error=bounded(exc), **self.fields)
        elif self._quiet and now - self._since >= self.settle_s:
            self._quiet = False  # not a stale connection after all: a new incident
            self._reminded = now
            self.log.warning("redis unavailable; backing off", loop=self.what, error=bounded(exc),
                             failures=self.failures, **self.fields)
        elif not self._quiet and now - self._reminded >= self.remind_s:
            self._reminded = now
            self.log.warning("redis still unavailable", loop=self.what, error=bounded(exc),
                             failures=self.failures, for_s=round(now - self._since, 1),
                             **self.fields)
        return self.delay()

    def delay(self) -> float:
        """The wait after the current failure count (0 when there is no incident)."""
        if not self.failures:
            return 0.0
        full: float = min(self.cap_s, self.base_s * 2 ** min(self.failures - 1, 30))
        return full * (0.5 + self._rand() / 2)

    def ok(self) -> None:
        """A call went through: close the incident, if there was one (cheap when not)."""
        if self.failures:
            now = self._clock()
            if not self._quiet:
                self.log.info("redis available again", loop=self.what, failures=self.failures,
                              outage_s=round(now - self._since, 2), **self.fields)
            self.failures = 0
            self._closed_at = now
