"""Read models of runs and attempts, decoded from the plain-text Redis records."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from duetime.common.codec import NotStored, unpack_payload, unpack_result
from duetime.common.errors import InvalidTime
from duetime.common.middleware import decode_headers
from duetime.common.time.parse import from_ms as exact_from_ms
from duetime.common.time.parse import to_ms

__all__ = ["STATES", "TERMINAL", "Attempt", "Progress", "Run", "from_ms", "to_ms"]

STATES = (
    "scheduled", "waiting", "running", "retrying", "succeeded", "dead", "uncertain",
    "cancelled", "skipped", "missed",
)
# The queue of a run whose record has no `queue` field: a namespace of format 3 leaves the
# default out (lua/_lib.lua RUN_DEFAULTS; docs/keys.md "The run record").
DEFAULT_QUEUE = "default"
DEFAULT_QUEUE_B = DEFAULT_QUEUE.encode()
DEFAULT_MAX_ATTEMPTS = 4  # absent max_attempts: the task default, 3 retries (format 3)
TERMINAL = frozenset({"succeeded", "dead", "cancelled", "skipped", "missed"})


def from_ms(ms: int | float | str | bytes | None) -> datetime | None:
    """A stored time in ms (through the one exact converter, `common.time.parse.from_ms`); None when
    absent or unreadable (a record damaged by hand must still be shown, and dead-lettered,
    rather than crash the tool reading it)."""
    if ms in (None, b"", ""):
        return None
    try:
        value = float(ms)  # a due time may carry a fraction of a ms (format 4)
        if not math.isfinite(value):
            return None
        return exact_from_ms(int(value) if value.is_integer() else value)
    except (ValueError, InvalidTime):
        return None


@dataclass(frozen=True)
class Attempt:
    number: int
    fence: int
    worker: str
    started: datetime | None
    ended: datetime | None
    outcome: str  # running | succeeded | failed | unknown | released
    error: str | None = None
    late: bool = False
    late_outcome: str | None = None
    report_fault: str | None = None  # a fault the worker's report met in transit (resent)

    @classmethod
    def decode(cls, raw: bytes | str) -> Attempt:
        a = json.loads(raw)
        return cls(
            number=int(a.get("n", 0)),
            fence=int(a.get("fence", 0)),
            worker=a.get("worker", ""),
            started=from_ms(a.get("start")),
            ended=from_ms(a.get("end")),
            outcome=a.get("outcome", ""),
            error=a.get("error") or a.get("late_error"),
            late=bool(a.get("late", False)),
            late_outcome=a.get("late_outcome"),
            report_fault=a.get("report_fault"),
        )


@dataclass(frozen=True)
class Progress:
    """What `current_run().progress(done, total, note)` last reported, and when the heartbeat
    wrote it (server time)."""

    done: float
    total: float | None
    note: str | None
    updated_at: datetime | None

    @classmethod
    def decode(cls, raw: str | None, at: str | None) -> Progress | None:
        """None when absent or unreadable (a record damaged by hand is still shown)."""
        if not raw:
            return None
        try:
            p = json.loads(raw)
            done, total, note = p["done"], p.get("total"), p.get("note")
        except (ValueError, TypeError, KeyError):
            return None
        if not _number(done) or not (total is None or _number(total)):
            return None
        return cls(done, total, note if isinstance(note, str) else None, from_ms(at))


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Run:
    id: str
    task: str
    queue: str
    state: str
    args: list[Any]
    kwargs: dict[str, Any]
    created: datetime | None
    due: datetime | None
    started: datetime | None
    finished: datetime | None
    attempt: int
    max_attempts: int
    fence: int
    worker: str | None
    error: str | None
    reason: str | None
    owner: str | None
    key: str | None
    schedule: str | None
    retry_at: datetime | None
    attempts: list[Attempt] = field(default_factory=list)
    # operator-facing links and marks (replay, cancel, an uncertain run's verdict)
    replay_of: str | None = None
    replayed_by: str | None = None
    cancel_requested: datetime | None = None
    resolved_as: str | None = None
    heartbeat: datetime | None = None
    lease_expires: datetime | None = None
    # the task's return value once it succeeded (None when it returned None, did not store
    # its result, or has not succeeded); result_error says why there is none although the
    # task returned one: not stored (not encodable, too large) or unreadable
    result: Any = None
    result_error: str | None = None
    # who the run is for, and the limit it last waited on (docs/fairness.md)
    tenant: str | None = None
    limited_by: str | None = None
    # a schedule's catch-up run standing for several missed occurrences (catchup="latest"):
    # how many (1 for every other run) and the first of them (None when it stands for itself)
    coalesced: int = 1
    coalesced_from: datetime | None = None
    # a schedule's run: the data interval it covers (from the previous occurrence of its
    # trigger, calendar applied, to its own occurrence); None for other runs
    interval_start: datetime | None = None
    interval_end: datetime | None = None
    # a long run (docs/states.md "Long runs"): its progress as of the last heartbeat that
    # carried one (None: never reported), its checkpoint (size in bytes, when and by which
    # fence written; the state itself stays in Redis) and how often it continued (Continue)
    progress: Progress | None = None
    checkpoint_size: int | None = None
    checkpoint_at: datetime | None = None
    checkpoint_fence: int | None = None
    continuations: int = 0
    # dependencies and batches (docs/workloads.md): the runs it waits for (state waiting),
    # the batch it is a member or callback of, and its role there
    depends_on: list[str] = field(default_factory=list)
    batch_id: str | None = None
    batch_role: str | None = None
    # what middleware's on_enqueue stored on the run (docs/integrations.md): a trace parent...
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def idempotency_key(self) -> str:
        return self.key or self.id

    @classmethod
    def decode(cls, run_id: str, h: dict[bytes, bytes], attempts: list[bytes],
               lease_expiry: float | None = None) -> Run:
        """Absent fields hold their defaults (attempt/fence 0); see lua/enqueue.lua. The lease
        expiry is the run's score in the leases zset, while it runs."""
        def s(name: str) -> str | None:
            v = h.get(name.encode(), b"")
            return v.decode(errors="replace") if v != b"" else None

        def n(name: str, default: int) -> int:
            """A number field; a record damaged by hand still reads (and is shown)."""
            try:
                return int(s(name) or default)
            except ValueError:
                return default

        try:
            args, kwargs = unpack_payload(h.get(b"payload"))
        except Exception as exc:  # noqa: BLE001 - damaged by hand: show it, do not crash
            args, kwargs = [f"<unreadable payload: {exc!r}>"], {}
        history = [Attempt.decode(a) for a in attempts]
        result: Any = None
        result_error = s("result_error")
        if h.get(b"result"):
            try:
                result = unpack_result(h[b"result"])
            except Exception as exc:  # noqa: BLE001 - damaged or too large: say so
                result_error = f"unreadable result: {exc!r}"
            if isinstance(result, NotStored):  # the worker could not store it: why
                result, result_error = None, f"result not stored: {result.reason}"
        fence = n("fence", 0)
        if s("state") == "succeeded" and fence > 0 and not any(a.fence == fence for a in history):
            # the attempt that succeeded is inline (namespace format 2, docs/keys.md): the run
            # hash's attempt, fence, worker, started and finished; a run finished by an older
            # version has its entry in the list, and nothing is added
            history.append(Attempt(number=n("attempt", 0), fence=n("fence", 0),
                                   worker=s("worker") or "", started=from_ms(s("started")),
                                   ended=from_ms(s("finished")), outcome="succeeded"))
        if s("state") == "running":
            # the attempt in progress is written to the history when it ends
            history.append(Attempt(number=n("attempt", 0), fence=n("fence", 0),
                                   worker=s("worker") or "", started=from_ms(s("started")),
                                   ended=None, outcome="running"))
        return cls(
            id=run_id,
            task=s("task") or "",
            queue=s("queue") or DEFAULT_QUEUE,  # absent: the default (format 3)
            state=s("state") or "",
            args=args,
            kwargs=kwargs,
            created=from_ms(s("created") or s("due")),  # absent: due at once (format 3)
            due=from_ms(s("due")),
            started=from_ms(s("started")),
            finished=from_ms(s("finished")),
            attempt=n("attempt", 0),
            max_attempts=n("max_attempts", DEFAULT_MAX_ATTEMPTS),
            fence=n("fence", 0),
            worker=s("worker"),
            error=s("error"),
            reason=s("reason"),
            owner=s("owner"),
            key=s("key"),
            schedule=s("schedule"),
            retry_at=from_ms(s("retry_at")),
            attempts=history,
            replay_of=s("replay_of"),
            replayed_by=s("replayed_by"),
            cancel_requested=from_ms(s("cancel_requested")),
            resolved_as=s("resolved_as"),
            heartbeat=from_ms(s("heartbeat")),
            lease_expires=from_ms(lease_expiry) if s("state") == "running" else None,
            result=result,
            result_error=result_error,
            tenant=s("tenant"),
            limited_by=s("limited_by"),
            coalesced=max(n("coalesced", 1), 1),
            coalesced_from=from_ms(s("coalesced_from")),
            interval_start=from_ms(s("interval_start")),
            interval_end=from_ms(s("interval_end")),
            progress=Progress.decode(s("progress"), s("progress_at")),
            checkpoint_size=n("checkpoint_size", 0) if s("checkpoint_size") else None,
            checkpoint_at=from_ms(s("checkpoint_at")),
            checkpoint_fence=n("checkpoint_fence", 0) if s("checkpoint_fence") else None,
            continuations=max(n("continuations", 0), 0),
            depends_on=[e.split("|", 1)[-1] for e in (s("depends_on") or "").split()],
            batch_id=s("batch"),
            batch_role=s("batch_role") or ("member" if s("batch") else None),
            headers=decode_headers(h.get(b"headers")),
        )
