"""Back-off and logging for a loop that cannot reach Redis.

A loop that retries a failed Redis call at once spins (a refused connection fails in
microseconds) and logs every try. `Outage` gives each loop a jittered exponential back-off and
logs an incident twice: when it starts, and when the loop is through ("available again after
N failures over T s"), with a reminder while it lasts. Right after a server comes back, a
client's pooled connections from before fail one by one ("Connection closed by server"):
failures within SETTLE_S of a recovery belong to the incident just closed and are not
announced again unless they go on for SETTLE_S.

Every loop that calls Redis over and over uses it: the worker's claim loop, heartbeat, reporter
and wake listener, and the scheduler's evaluator and reaper (scheduler/notices.py `backed_off`
adds what a scheduler loop also does: say it is not ready, re-read a cluster's topology). The
line an incident is announced with says which of three kinds it is (`kind`): unreachable,
a cluster failing over or moving slots, or a refusal (OOM, a damaged key) with advice.
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


# kind -> (level, first line of an incident, its reminder)
ANNOUNCE = {
    "unavailable": ("warning", "redis unavailable; backing off", "redis still unavailable"),
    "moving": ("warning", "redis cluster is failing over or moving slots; backing off",
               "redis cluster still failing over or moving slots"),
    "refused": ("error", "redis refused a call; backing off", "redis still refuses calls"),
}


def kind(exc: BaseException) -> str:
    """'unavailable' (no answer: refused connection, timeout), 'moving' (a failover or a slot
    move: CLUSTERDOWN, MOVED, READONLY, ...) or 'refused' (an answer a quick retry will not
    change: OOM at maxmemory, WRONGTYPE on a damaged key)."""
    import redis
    from duetime.common.connection import client_glitch, topology_error

    if isinstance(exc, redis.ConnectionError | redis.TimeoutError | OSError) or client_glitch(exc):
        return "unavailable"
    return "moving" if topology_error(exc) else "refused"


def not_ready_reason(url: str, exc: BaseException) -> str:
    """What a loop's readiness probe says while `exc` holds it back (one line, no secrets)."""
    from duetime.common.connection import unavailable

    if kind(exc) == "unavailable":
        return str(unavailable(url, exc))
    return f"redis refused a call: {bounded(exc)}"


def _advice(exc: BaseException) -> dict[str, str]:
    from duetime.common.connection import ADVICE

    code = str(exc).split(" ", 1)[0] if str(exc) else ""
    return {"advice": ADVICE[code]} if code in ADVICE else {}


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
    logging how long it lasted. Several failures in a row are one incident. `cap_s` None: the
    cap follows the error, as `retry_in` (a second for a failover, 5 s for a refusal).
    """

    def __init__(self, what: str, log: Any, base_s: float = BASE_S, cap_s: float | None = CAP_S,
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
        self._cap_now = cap_s if cap_s is not None else TOPOLOGY_CAP_S

    @property
    def active(self) -> bool:
        return self.failures > 0

    def failed(self, exc: BaseException) -> float:
        now = self._clock()
        self.failures += 1
        k = kind(exc)
        if self.cap_s is None:
            self._cap_now = REFUSED_CAP_S if k == "refused" else TOPOLOGY_CAP_S
        level, first, again = ANNOUNCE[k]
        say = getattr(self.log, level)
        extra = _advice(exc) if k == "refused" else {}
        if self.failures == 1:
            self._since = self._reminded = now
            self._quiet = self._closed_at is not None and now - self._closed_at < self.settle_s
            if not self._quiet:
                say(first, loop=self.what, error=bounded(exc), **extra, **self.fields)
        elif self._quiet and now - self._since >= self.settle_s:
            self._quiet = False  # not a stale connection after all: a new incident
            self._reminded = now
            say(first, loop=self.what, error=bounded(exc), failures=self.failures, **extra,
                **self.fields)
        elif not self._quiet and now - self._reminded >= self.remind_s:
            self._reminded = now
            say(again, loop=self.what, error=bounded(exc), failures=self.failures,
                for_s=round(now - self._since, 1), **extra, **self.fields)
        return self.delay()

    def delay(self) -> float:
        """The wait after the current failure count (0 when there is no incident)."""
        if not self.failures:
            return 0.0
        return jittered(self.failures, self._cap_now, self.base_s, self._rand)

    def ok(self) -> None:
        """A call went through: close the incident, if there was one (cheap when not)."""
        if self.failures:
            now = self._clock()
            if not self._quiet:
                self.log.info("redis available again", loop=self.what, failures=self.failures,
                              outage_s=round(now - self._since, 2), **self.fields)
            self.failures = 0
            self._closed_at = now
