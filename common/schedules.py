"""Schedules: their definition and the pure planning of which occurrences become runs.

Planning is a pure function of (trigger, cursor, server now, policies), so the evaluator's
I/O stays thin and every catch-up rule is unit-testable without Redis.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from duetime.common.errors import InvalidInput
from duetime.common.names import check_name
from duetime.common.timespec import Cron, InvalidSchedule, Trigger, trigger_from_dict

CATCHUP = ("all", "latest", "skip")
OVERLAP = ("allow", "skip", "buffer_one", "cancel_other")
# An occurrence evaluated more than this after its instant counts as missed (downtime or a
# pause), and the catch-up policy decides its fate; a shorter hiccup is just a late start.
MISS_TOLERANCE_MS = 10_000
# Bound on the occurrences one evaluation walks; a longer backlog is finished next tick.
MAX_WALK = 100_000


def ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def at_ms(n: int) -> datetime:
    return datetime.fromtimestamp(n / 1000, tz=UTC)


def run_id_for(name: str, occurrence_ms: int) -> str:
    """The id of a schedule's run for one occurrence: the same whoever materialises it."""
    return f"{name}@{occurrence_ms}"


def jitter_for(name: str, occurrence_ms: int, jitter_ms: int) -> int:
    """A stable per-occurrence delay in [0, jitter): spreads a herd, same on every scheduler."""
    if jitter_ms <= 0:
        return 0
    h = hashlib.sha256(f"{name}@{occurrence_ms}".encode()).digest()
    return int.from_bytes(h[:8], "big") % jitter_ms


TRIGGER_PREFIX = "t."
# every key a trigger's dict form may have (Cron, Every, At), as stored hash fields
TRIGGER_FIELDS = tuple(TRIGGER_PREFIX + k for k in (
    "kind", "expr", "tz", "dst_gap", "dst_fold", "seed", "interval_us", "anchor", "instant"))


def trigger_fields(trigger: Trigger) -> dict[str, Any]:
    """A trigger as flat hash fields (`t.kind`, `t.expr`, ...): short values keep the schedule
    hash in Redis' compact listpack encoding (a JSON blob over 64 bytes would not)."""
    return {TRIGGER_PREFIX + k: v for k, v in trigger.to_dict().items()}


def trigger_from_fields(values: list[bytes | None] | dict[str, Any]) -> Trigger:
    """From `HMGET key *TRIGGER_FIELDS` values (or a decoded dict of the hash)."""
    if isinstance(values, dict):
        values = [values.get(f) for f in TRIGGER_FIELDS]
    d: dict[str, Any] = {}
    for f, v in zip(TRIGGER_FIELDS, values, strict=True):
        if v is not None:
            text = v.decode() if isinstance(v, bytes) else v
            key = f[len(TRIGGER_PREFIX):]
            d[key] = int(text) if key == "interval_us" else text
    return trigger_from_dict(d)


def seeded(trigger: Trigger, name: str) -> Trigger:
    """A cron's `H` fields hash the schedule name unless the trigger brought its own seed."""
    if isinstance(trigger, Cron) and not trigger.seed:
        d = trigger.to_dict()
        d["seed"] = name
        return trigger_from_dict(d)
    return trigger


def _millis(value: timedelta | float | None, what: str) -> int:
    if value is None:
        return 0
    secs = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if secs < 0:
        raise InvalidInput(f"{what} must not be negative, got {secs}s")
    return int(secs * 1000)


@dataclass(frozen=True)
class ScheduleDef:
    """What the user declares; stored in `T:sched:<name>` with the evaluation state."""

    name: str
    trigger: Trigger
    task: str
    queue: str
    payload: bytes
    catchup: str = "latest"
    max_catchup: int = 100
    lateness_ms: int = 0
    overlap: str = "allow"
    jitter_ms: int = 0
    owner: str = ""
    task_options: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name("schedule name", self.name)
        check_name("queue", self.queue)
        if self.catchup not in CATCHUP:
            raise InvalidSchedule(f"catchup must be one of {', '.join(CATCHUP)}; got {self.catchup!r}")
        if self.overlap not in OVERLAP:
            raise InvalidSchedule(f"overlap must be one of {', '.join(OVERLAP)}; got {self.overlap!r}")
        if self.max_catchup < 1:
            raise InvalidSchedule(f"max_catchup must be >= 1, got {self.max_catchup}")

    @staticmethod
    def durations(lateness: timedelta | float | None, jitter: timedelta | float | None) -> tuple[int, int]:
        return _millis(lateness, "lateness"), _millis(jitter, "jitter")

    def fields(self) -> dict[str, Any]:
        """The definition as hash fields (plain text, payload msgpack)."""
        f: dict[str, Any] = {
            "name": self.name, **trigger_fields(self.trigger), "task": self.task,
            "queue": self.queue,
            "payload": self.payload, "catchup": self.catchup, "max_catchup": self.max_catchup,
            "lateness_ms": self.lateness_ms, "overlap": self.overlap, "jitter_ms": self.jitter_ms,
            "owner": self.owner, **self.task_options,
        }
        return f

    def def_hash(self) -> str:
        f = self.fields()
        h = hashlib.sha256()
        for k in sorted(f):
            v = f[k]
            h.update(k.encode() + b"\0" + (v if isinstance(v, bytes) else str(v).encode()) + b"\0")
        return h.hexdigest()[:16]


@dataclass(frozen=True)
class PlannedRun:
    occurrence_ms: int
    due_ms: int
    coalesced: int = 1  # how many occurrences this run stands for (catch-up "latest")
    coalesced_from_ms: int = 0


@dataclass(frozen=True)
class Plan:
    runs: list[PlannedRun]
    skipped: int
    next_ms: int | None  # the new cursor: first occurrence not yet handled (None: no more)


def plan(trigger: Trigger, cursor_ms: int, now_ms: int, lead_ms: int, *, name: str,
         catchup: str, max_catchup: int, jitter_ms: int = 0,
         tolerance_ms: int = MISS_TOLERANCE_MS) -> Plan:
    """Which occurrences from `cursor_ms` (itself an occurrence) up to now + lead become runs.

    Occurrences older than now - tolerance were missed (downtime, pause) and follow the
    catch-up policy: `all` keeps the newest `max_catchup` (older ones are skipped), `latest`
    makes one run for the newest that stands for all of them, `skip` makes none.
    """
    horizon = now_ms + lead_ms
    missed: list[int] = []
    ontime: list[int] = []
    cur: int | None = cursor_ms
    walked = 0
    while cur is not None and cur <= horizon and walked < MAX_WALK:
        (missed if cur < now_ms - tolerance_ms else ontime).append(cur)
        nxt = trigger.next_after(at_ms(cur))
        cur = ms(nxt) if nxt is not None else None
        walked += 1

    def run(o: int, n: int = 1, first: int = 0) -> PlannedRun:
        return PlannedRun(o, o + jitter_for(name, o, jitter_ms), n, first or o)

    runs: list[PlannedRun] = []
    skipped = 0
    if missed:
        if catchup == "all":
            keep = missed[-max_catchup:]
            skipped = len(missed) - len(keep)
            runs += [run(o) for o in keep]
        elif catchup == "latest":
            runs.append(run(missed[-1], len(missed), missed[0]))
        else:
            skipped = len(missed)
    runs += [run(o) for o in ontime]
    return Plan(runs, skipped, cur)
