"""How an attempt ended, in one vocabulary from the worker to the scripts' replies.

A worker asks a script to record an attempt (`Report`: complete, fail in one of the
`FailMode`s, or release); the script decides what happens to the run and says so in its
reply. `Outcome` names that decision, plus the two endings no script ever judged (the lease
was lost mid-run; the report never reached Redis). `duetime_runs_finished_total{outcome}`
counts Outcomes, so a Retry on the last attempt counts as `dead`, as fail.lua decided.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

Report = Literal["complete", "fail", "release", "handback", "rate_limited", "continue"]
# what a failed attempt asks of fail.lua: back off ('error'), retry after the task's own delay
# ('retry'), never retry ('fatal'), or cancel the run (stopped on a cancel request)
FailMode = Literal["error", "retry", "fatal", "cancel"]


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"  # complete.lua: 'succeeded', or 'late_succeeded' (a late success
    # of an attempt whose lease expired, nobody having claimed the run since)
    RETRYING = "retrying"  # fail.lua: another attempt will run
    DEAD = "dead"  # fail.lua: dead-lettered (fatal, or no attempts left)
    CANCELLED = "cancelled"  # fail.lua: stopped on a cancel request
    RELEASED = "released"  # release.lua: given back at shutdown, the attempt not counted
    UNCERTAIN = "uncertain"  # release.lua: a non-idempotent run interrupted at shutdown
    HANDED_BACK = "handed_back"  # handback.lua: a task this worker does not know, given back
    # unstarted for a worker that knows it, the attempt not counted
    RATE_LIMITED = "rate_limited"  # rate_limited.lua: RateLimited, given back, scope held,
    # the attempt not counted
    CONTINUED = "continued"  # continue_run.lua: the task raised Continue; the same run goes
    # back to its queue with its checkpoint, the attempt not counted
    STALE = "stale"  # refused: the attempt's fence is no longer the run's (a late result)
    MISSING = "missing"  # refused: the run record is gone
    # endings no script judged
    LEASE_LOST = "lease_lost"  # the lease was lost mid-run; nothing was reported
    UNRECORDED = "unrecorded"  # Redis refused the report until the worker stopped


_REPLIES = {
    b"succeeded": Outcome.SUCCEEDED, b"late_succeeded": Outcome.SUCCEEDED,
    b"retrying": Outcome.RETRYING,
    b"dead": Outcome.DEAD, b"cancelled": Outcome.CANCELLED, b"released": Outcome.RELEASED,
    b"handed_back": Outcome.HANDED_BACK, b"rate_limited": Outcome.RATE_LIMITED,
    b"continued": Outcome.CONTINUED,
    b"uncertain": Outcome.UNCERTAIN, b"stale": Outcome.STALE, b"missing": Outcome.MISSING,
}


# the metric label of each reply, as a plain str (hashing an Enum member is a Python call)
LABELS: dict[bytes, str] = {reply: outcome.value for reply, outcome in _REPLIES.items()}


def from_reply(reply: bytes | str) -> Outcome:
    """The Outcome a complete/fail/release script reply stands for (its state string)."""
    key = reply if isinstance(reply, bytes) else reply.encode()
    try:
        return _REPLIES[key]
    except KeyError:
        raise ValueError(f"unexpected script reply {reply!r}") from None
