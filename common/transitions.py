"""KEYS/ARGV of every script of `lua/`, built here and nowhere else.

The worker (asyncio), the scheduler, the reaper and the tools all call the same scripts;
building their arguments in one module keeps them in step with the headers of `lua/*.lua`.
The convention of every script: KEYS are the partition's index keys the caller can name
(due/retry set of a queue, leases, done, dead, ...); ARGV[1] is the partition prefix, from
which a script builds the keys it only learns while it runs (a run's hash and attempts, a
schedule's hash, the sets of a queue read from a record). All carry the partition's hash tag.

Replies come in four shapes, each read here by one decoder (see REPLY, and the `Returns
(<shape>)` line of every script's header):
- status: a status word, alone ('released') or first of {word, value} (the value: a state, an
  id, a time, a count): `status` reads the word as sent, `status_detail` both as text;
- counts: integers in the order the header names them, or one integer: `counts`;
- each: one answer per item of a batch call, in the call's order (complete: a status word,
  heartbeat: an integer), read by the caller item by item;
- claim: `parse_claim`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from duetime.common.keys import Keyspace

Call = tuple[list[str], list[Any]]

# The claim reply, defined once: a header, then these fields per run, in this order. claim.lua
# documents the same order and lua/claim/lease.lua writes it (one `-- name` per line);
# tests/unit/test_script_assembly.py checks the two agree. `extra` is b'' for a run that has
# none of the optional fields (most runs: 5 reply values per run, not 13), else the list of
# CLAIM_EXTRA_FIELDS.
CLAIM_REPLY_HEADER = ("next_due_ms", "missed", "skipped", "held_concurrency", "held_rate")
CLAIM_RUN_FIELDS = ("head", "task", "payload", "due_ms", "extra")
# `head` is one value: these, joined by single spaces, the run id last (it may hold anything
# but a space is never split out of it: split at most len - 1 times)
CLAIM_HEAD_FIELDS = ("fence", "attempt", "ready_ms", "run_id")
CLAIM_EXTRA_FIELDS = ("timeout_ms", "idempotent", "key", "schedule", "limited_by",
                      "interval_start", "interval_end", "tenant", "headers", "bare")
CLAIM_HEADER, CLAIM_FIELDS = len(CLAIM_REPLY_HEADER), len(CLAIM_RUN_FIELDS)


def _at(fields: tuple[str, ...], *names: str) -> tuple[int, ...]:
    """The positions of `names` in `fields` (a name missing fails at import)."""
    return tuple(fields.index(n) for n in names)


# positions read by name once, at import: parsing a reply does no name lookup per run
_NEXT, _MISSED, _SKIPPED, _HELD_C, _HELD_R = _at(
    CLAIM_REPLY_HEADER, "next_due_ms", "missed", "skipped", "held_concurrency", "held_rate")


@dataclass(slots=True, eq=False)
class Claimed:
    """One run handed to a worker by claim.lua (read-only by convention: not frozen, since a
    frozen dataclass sets each of its fields through object.__setattr__, and a claim reply
    makes one per run on the worker's hot path)."""

    run_id: str
    fence: int
    attempt: int
    task: str
    payload: bytes
    due_ms: float  # the run's due time: whole ms, or to the microsecond (format 4)
    timeout_ms: int
    idempotent: bool
    key: str | None
    schedule: str | None
    ready_ms: float  # when it became claimable: its due time (to the µs), or its retry time
    damaged: str = ""  # why the run record cannot be read (the worker dead-letters the run)
    limited_by: str = ""  # the limit it waited on before this claim, if any
    interval_start: int = 0  # a schedule's run: its data interval (0: none)
    interval_end: int = 0
    tenant: str = ""  # who the run is for ('' if none): for middleware's run context
    headers: bytes = b""  # what middleware stored on the run at enqueue (JSON; b'' if none)
    # no schedule, no batch, no limit slot taken (claim.lua): its success report says so, and
    # complete.lua then looks none of them up
    bare: bool = False


@dataclass(frozen=True)
class ClaimReply:
    next_due_ms: int | None  # earliest due/retry time left in the set
    runs: list[Claimed]
    missed: int  # runs this claim found past their starting deadline
    skipped: int  # runs this claim skipped by their schedule's overlap policy
    held_concurrency: int = 0  # runs a concurrency limit held back (first time per limit)
    held_rate: int = 0  # runs a rate limit held back (first time per limit)


def _s(b: bytes | None) -> str:
    return b.decode() if b else ""


def claim(k: Keyspace, p: int, queue: str, worker_id: str, limit: int, lease_ms: int,
          ahead_ms: int = 0) -> Call:
    return ([k.due(p, queue), k.retry(p, queue), k.leases(p), k.done(p), k.deadlines(p),
             k.events(p), k.dead(p), k.limits(p), k.prio(p, queue), k.lanes(p, queue),
             k.laned(p, queue), k.paused(p), k.holds(p)],
            [k.prefix(p), worker_id, limit, lease_ms, ahead_ms, k.sched_wake, p, queue])


# parse_claim unpacks each run's fields by position, in this order (checked at import)
assert CLAIM_RUN_FIELDS == ("head", "task", "payload", "due_ms", "extra")
assert CLAIM_HEAD_FIELDS == ("fence", "attempt", "ready_ms", "run_id")
assert CLAIM_EXTRA_FIELDS == ("timeout_ms", "idempotent", "key", "schedule", "limited_by",
                              "interval_start", "interval_end", "tenant", "headers", "bare")


# the byte of a decimal point: `_DOT in text` is a plain byte scan (`b"." in text` goes through
# the buffer protocol: ten times slower, on every run a worker claims)
_DOT = ord(".")


def parse_claim(res: list[Any]) -> ClaimReply:
    nxt = int(res[_NEXT])
    runs = []
    # the runs' fields, CLAIM_FIELDS at a time, unpacked without a slice or an index per field
    fields = iter(res[CLAIM_HEADER:])
    for (head, task, payload, due, extra) in zip(*[fields] * CLAIM_FIELDS, strict=True):
        # the head (fence, attempt, the score, the id) comes from the script; the rest is the
        # run record, which an operator's HSET may have damaged: one bad run must not sink
        # its batch
        fence, attempt, ready, run_id = head.split(b" ", 3)
        run_id, fence, attempt = run_id.decode(), int(fence), int(attempt)
        # a due time is whole ms, or kept to the microsecond (namespace format 4): the score
        # (ready) and the record's due then carry a fraction
        ready = int(ready) if _DOT not in ready else float(ready)
        try:
            due_ms = int(due or 0) if _DOT not in due else float(due)
            if not extra:  # none of the optional fields: a plain run
                runs.append(Claimed(run_id, fence, attempt, task.decode() if task else "",
                                    payload or b"", due_ms, 0, True, None, None, ready,
                                    bare=True))
                continue
            (timeout, idempotent, key, schedule, limited_by, iv_start, iv_end, tenant,
             headers, bare) = extra
            runs.append(Claimed(
                run_id, fence, attempt, task.decode() if task else "", payload or b"",
                due_ms, int(timeout or 0), idempotent != b"0",
                key.decode() if key else None, schedule.decode() if schedule else None,
                ready, "", limited_by.decode() if limited_by else "",
                int(iv_start or 0), int(iv_end or 0),
                tenant.decode() if tenant else "", headers or b"", bare == b"1",
            ))
        except (ValueError, TypeError, UnicodeDecodeError) as exc:
            runs.append(Claimed(
                run_id=run_id, fence=fence, attempt=attempt,
                task=(task or b"").decode(errors="replace"), payload=b"",
                due_ms=ready, timeout_ms=0, idempotent=True, key=None, schedule=None,
                ready_ms=ready, damaged=f"run record unreadable: {exc}",
            ))
    return ClaimReply(None if nxt < 0 else nxt, runs, int(res[_MISSED]), int(res[_SKIPPED]),
                      int(res[_HELD_C]), int(res[_HELD_R]))


def complete(k: Keyspace, p: int, done: Sequence[tuple[Any, ...]], forms: bool = True) -> Call:
    """done: (run id, fence), (run id, fence, result as msgpack), (..., the fault an earlier
    send of this report met, recorded on the attempt), (..., bare: the claim of this fence
    said the run is bare, `Claimed.bare`) or (..., bare, the attempt number that claim gave,
    `Claimed.attempt`) of one partition, acknowledged in one call. A bare first attempt is
    marked '1' (complete.lua then reads neither its bare fields nor its attempt), another
    bare one 'b'. A call whose runs are all bare first attempts with no result and no fault
    is sent in the plain form (two values per run, complete.lua's ARGV[4]); `forms=False`
    sends the arguments of a complete.lua from before the forms (a benchmark's old copy)."""
    keys = [k.leases(p), k.done(p), k.uncertain(p), k.events(p)]
    full: list[Any] = []
    plain = forms
    for item in done:
        n = len(item)
        mark = ""
        if n > 4 and item[4]:
            mark = "1" if n > 5 and item[5] == 1 else "b"
        result, fault = item[2] if n > 2 else b"", item[3] if n > 3 else ""
        plain = plain and mark == "1" and not result and not fault
        full += [item[0], item[1], result, fault, mark]
    args: list[Any] = [k.prefix(p), k.wake_channel, p]
    if not forms:
        return keys, args + full
    if plain:
        args.append("1")
        for j in range(0, len(full), 5):
            args += [full[j], full[j + 1]]
        return keys, args
    args.append("")
    return keys, args + full


def enqueue(k: Keyspace, p: int, queue: str, shared: list[Any],
            runs: list[tuple[str, str, int, list[Any]]], fresh: bool = False,
            forms: bool = True) -> Call:
    """shared: field/value pairs common to every run of the call; runs: (run id, due ms or '',
    delay ms, the run's own field/value pairs) of one partition and queue. fresh: every id is
    random and sent for the first time, so none can exist (enqueue.lua skips its EXISTS).
    A call whose runs all have one delay, no due time and no own field but `payload` is sent
    in the plain form (two values per run, enqueue.lua's header); `forms=False` sends the
    arguments of an enqueue.lua from before the forms (a benchmark's or a test's old copy)."""
    args: list[Any] = [k.prefix(p), k.wake_channel, p, queue, "1" if fresh else "", len(shared),
                       *shared]
    delay = runs[0][2] if runs else 0
    if forms and runs and all(due == "" and d == delay and len(f) == 2 and f[0] == "payload"
                              for _, due, d, f in runs):
        args.append(delay)
        for run_id, _, _, fields in runs:
            args += [run_id, fields[1]]
    else:
        if forms:
            args.append("")
        for run_id, due, delay_ms, fields in runs:
            args += [run_id, due, delay_ms, len(fields), *fields]
    return [k.due(p, queue), k.prio(p, queue), k.laned(p, queue), k.lanes(p, queue)], args


def rate_limited(k: Keyspace, p: int, queue: str, run_id: str, fence: int, retry_after_ms: int,
                 kind: str, name: str, worker_id: str) -> Call:
    """A run given back by RateLimited, its scope held (rate_limited.lua); run id '' only
    raises the hold `kind`:`name` in partition p (the fan-out to the other partitions)."""
    return ([k.leases(p), k.due(p, queue), k.events(p), k.holds(p)],
            [k.prefix(p), run_id, fence, k.wake_channel, p, queue, retry_after_ms, kind, name,
             worker_id])


def fail(k: Keyspace, p: int, queue: str, run_id: str, fence: int, error: str, mode: str,
         delay_ms: int, jitter: float) -> Call:
    """mode: 'error' (backoff), 'retry' (explicit delay_ms), 'fatal' (dead-letter) or
    'cancel' (stopped on a cancel request)."""
    return ([k.leases(p), k.retry(p, queue), k.dead(p), k.done(p), k.events(p)],
            [k.prefix(p), run_id, fence, error, mode, delay_ms, jitter, k.wake_channel, p, queue])


def release(k: Keyspace, p: int, queue: str, run_id: str, fence: int) -> Call:
    return ([k.leases(p), k.due(p, queue), k.uncertain(p), k.events(p)],
            [k.prefix(p), run_id, fence, k.wake_channel, p, queue])


def handback(k: Keyspace, p: int, queue: str, run_id: str, fence: int, worker_id: str,
             first_ms: int, longest_ms: int) -> Call:
    """A run of a task this worker does not know, given back unstarted (handback.lua)."""
    return ([k.leases(p), k.due(p, queue), k.events(p)],
            [k.prefix(p), run_id, fence, k.wake_channel, p, queue, first_ms, longest_ms,
             worker_id])


def checkpoint(k: Keyspace, p: int, run_id: str, worker_id: str, fence: int, state: bytes,
               cap: int) -> Call:
    """A running attempt's checkpoint (checkpoint.lua), written only by the fence holder."""
    return ([k.leases(p), k.events(p)],
            [k.prefix(p), run_id, f"{worker_id}:{fence}", fence, state, cap])


def continue_run(k: Keyspace, p: int, queue: str, run_id: str, fence: int, delay_ms: int,
                 state: bytes | None, cap: int) -> Call:
    """A task raised Continue (continue_run.lua): state None keeps the run's checkpoint."""
    return ([k.leases(p), k.due(p, queue)],
            [k.prefix(p), run_id, fence, delay_ms, "0" if state is None else "1",
             b"" if state is None else state, cap, k.wake_channel, p, queue])


def heartbeat(k: Keyspace, p: int, lease_ms: int,
              held: list[tuple[str, str]] | list[tuple[str, str, str]]) -> Call:
    """held: (run id, owner token 'worker:fence') pairs of one partition, or (run id, token,
    progress JSON or '' for unchanged) triples."""
    args: list[Any] = [k.prefix(p), lease_ms]
    for item in held:
        args += [item[0], item[1], item[2] if len(item) > 2 else ""]
    return [k.leases(p)], args


def reap(k: Keyspace, p: int, limit: int, seed: float, retention_ms: int,
         dead_ms: int = 30 * 24 * 3600 * 1000, uncertain_ms: int = 0) -> Call:
    """retention_ms: of succeeded/cancelled/skipped/missed runs (0: no sweep this call);
    dead_ms, uncertain_ms: the built-in defaults of those states (common/retention.py)."""
    return ([k.leases(p), k.dead(p), k.uncertain(p), k.done(p), k.deadlines(p), k.events(p)],
            [k.prefix(p), limit, seed, k.wake_channel, p, retention_ms, dead_ms, uncertain_ms])


# -- operator transitions (cancel, replay, resolve, purge) --------------------------------
def cancel(k: Keyspace, p: int, queue: str, run_id: str, reason: str) -> Call:
    return ([k.due(p, queue), k.retry(p, queue), k.done(p), k.deadlines(p), k.events(p)],
            [k.prefix(p), run_id, queue, reason])


def replay(k: Keyspace, p: int, queue: str, old_id: str, new_id: str, force: bool,
           note: str = "") -> Call:
    """old and new run ids must live in partition p (see common.admin.replay_id)."""
    return ([k.due(p, queue), k.dead(p), k.uncertain(p), k.done(p), k.events(p)],
            [k.prefix(p), old_id, new_id, int(force), queue, k.wake_channel, p, note])


def resolve(k: Keyspace, p: int, run_id: str, verdict: str, note: str = "") -> Call:
    """verdict: 'succeeded' or 'failed' (the 'replay' verdict is `replay`)."""
    return ([k.uncertain(p), k.dead(p), k.done(p), k.events(p)],
            [k.prefix(p), run_id, verdict, note])


def purge(k: Keyspace, p: int, limit: int, before_ms: int | None = None,
          run_ids: Sequence[str] = ()) -> Call:
    """The oldest `limit` dead letters (at or before `before_ms`), or exactly `run_ids` (all of
    partition p), still dead."""
    return [k.dead(p), k.events(p)], [k.prefix(p), limit, "" if before_ms is None else before_ms,
                                      *run_ids]


def wait(k: Keyspace, p: int, run_id: str) -> Call:
    return [k.notify(p, run_id)], [k.prefix(p), run_id]


# -- dependencies and batches (docs/workloads.md) ----------------------------------------------
@dataclass(frozen=True)
class Held:
    """One run for hold.lua: role '' or 'member' or a callback's ('on_complete', ...); mode
    '' (due at once), 'succeed'/'finish' (depends_on) or 'batch' (a callback); deps as
    '<partition>|<run id>'; fields as enqueue.lua stores them (the task's among them)."""

    run_id: str
    role: str
    mode: str
    due: str
    delay_ms: int
    deps: tuple[str, ...]
    fields: tuple[Any, ...]


def hold(k: Keyspace, p: int, runs: list[Held], batch_id: str = "", step: str = "",
         seal: bool = False) -> Call:
    """step: '' | 'open' (create the batch) | 'add'; seal: the batch's creation is complete."""
    args: list[Any] = [k.prefix(p), batch_id, step, int(seal)]
    for r in runs:
        args += [r.run_id, r.role, r.mode, r.due, r.delay_ms, len(r.deps), *r.deps,
                 len(r.fields), *r.fields]
    return [k.events(p), k.batches(p), k.waiting(p)], args


def deps_link(k: Keyspace, p: int, dependency: str, dependent_p: int, dependent: str) -> Call:
    return [k.events(p)], [k.prefix(p), dependency, f"{dependent_p}|{dependent}"]


def deps_apply(k: Keyspace, p: int, notices: list[tuple[str, str, str]]) -> Call:
    """notices: (dependent, dependency, its final state or 'missing') of partition p."""
    return [k.events(p)], [k.prefix(p), *(x for n in notices for x in n)]


def deps_done(k: Keyspace, p: int, notes: list[bytes], links: list[bytes]) -> Call:
    """Notices and link requests of partition p the relay applied, each as it read it."""
    return [k.depnotes(p), k.deplinks(p)], [len(notes), *notes, *links]


def batch_cancel(k: Keyspace, p: int, batch_id: str, reason: str) -> Call:
    return [k.events(p), k.done(p), k.deadlines(p)], [k.prefix(p), batch_id, reason]


# -- schedules and scheduler ownership --------------------------------------------------------
def materialize(k: Keyspace, p: int, name: str, queue: str, runs: list[Any],
                expected: tuple[bytes | str, bytes | str, int | str] | None = None,
                skipped: int = 0, intervals: list[int] | None = None, calendar: str = "",
                excluded: list[Any] | None = None) -> Call:
    """runs: flat (run id, occurrence ms, due ms, coalesced count, first ms) values.
    expected: (version, cursor ms, new cursor ms or '') for the evaluator's compare-and-set;
    None for backfill and trigger-now (runs only, no cursor move, no starting deadline).
    intervals: each run's data interval start ms (0: its trigger had none before; None: runs
    without an interval, trigger-now); calendar: 'NAME vN' applied, and
    excluded: flat (run id, occurrence ms) of occurrences it excluded (skipped runs)."""
    version, cursor, new_cursor = expected if expected is not None else ("", "", "")
    n = len(runs) // 5
    starts: list[Any] = ([""] * n if intervals is None
                         else [*intervals, *[""] * (n - len(intervals))])
    return ([k.sched_due(p), k.due(p, queue), k.deadlines(p), k.events(p), k.done(p)],
            [k.prefix(p), name, version, cursor, new_cursor, skipped, k.wake_channel, p, queue,
             k.sched_wake, n, *runs, *starts[:n], calendar, *(excluded or [])])


def schedule_upsert(k: Keyspace, p: int, name: str, packed: bytes, version: int | str,
                    cursor_ms: int | None, paused: bool, keep: bool = False) -> Call:
    """`packed`: the definition (common/schedules.py pack_definition); `keep`: it is the
    stored one (a record of the old layout converted: version kept)."""
    return ([k.sched_due(p), k.schedules(p), k.quarantine(p)],
            [k.prefix(p), name, packed, version, "" if cursor_ms is None else cursor_ms,
             int(paused), k.sched_wake, p, int(keep)])


def schedule_pause(k: Keyspace, p: int, name: str, paused: bool, note: str = "") -> Call:
    return [k.sched_due(p)], [k.prefix(p), name, int(paused), note, k.sched_wake, p]


def schedule_delete(k: Keyspace, p: int, name: str) -> Call:
    return [k.sched_due(p), k.schedules(p), k.quarantine(p)], [k.prefix(p), name]


def schedule_quarantine(k: Keyspace, p: int, name: str, version: bytes | str, reason: str) -> Call:
    return [k.sched_due(p), k.quarantine(p), k.events(p)], [k.prefix(p), name, version, reason]


def partition_owners(k: Keyspace, scheduler_id: str, ttl_ms: int, mode: str = "hold",
                     partitions: list[int] | None = None, foreign: Iterable[int] = ()) -> Call:
    """mode: 'hold' (say alive, renew, rebalance, take free partitions) or 'release'.
    `partitions` None: the namespace's table `<ns>:owners`, over every partition (a plain
    server); else the table of one cluster node's partitions, `T:node_owners` of the first, leaving
    `foreign` (held by an older scheduler in `<ns>:owners`) alone."""
    if partitions is None:
        return [k.owners], [scheduler_id, ttl_ms, k.partitions, mode]
    return ([k.node_owners(min(partitions))],
            [scheduler_id, ttl_ms, k.partitions, mode, len(partitions), *partitions, *foreign])


# -- replies --------------------------------------------------------------------------------
REPLY = {
    "enqueue": "counts", "claim": "claim", "heartbeat": "each", "complete": "each",
    "fail": "status", "release": "status", "reap": "counts", "materialize": "status",
    "schedule_upsert": "status", "schedule_pause": "status", "schedule_delete": "counts",
    "partition_owners": "counts", "cancel": "status", "replay": "status", "resolve": "status",
    "purge": "counts", "schedule_quarantine": "status", "wait": "status", "handback": "status",
    "rate_limited": "status",
    "checkpoint": "status", "continue_run": "status",
    "hold": "counts", "deps_link": "status", "deps_apply": "counts", "batch_cancel": "counts",
    "deps_done": "counts",
}


def status(res: Any) -> bytes:
    """The status word of a status reply, as Redis sent it: the reply itself, or the first
    element of {word, value}."""
    if isinstance(res, bytes):
        return res
    word: bytes = res[0]
    return word


def status_detail(res: Any) -> tuple[str, str]:
    """A status reply as text: (word, value), the value '' when the word came alone."""
    if isinstance(res, bytes):
        return res.decode(), ""
    word, value = res[0], res[1]  # values after these two: read by the caller (fail.lua)
    return _s(word) if isinstance(word, bytes) else str(word), (
        value.decode() if isinstance(value, bytes) else str(value))


def enqueue_landed(res: Any) -> list[str]:
    """enqueue.lua's reply to a call with debounced or throttled runs ({created, id, ...}): the
    id of the run each of them landed on, in call order (a plain call's reply is its count)."""
    return [] if isinstance(res, int) else [x.decode() if isinstance(x, bytes) else str(x)
                                            for x in res[1:]]


def counts(res: Any) -> list[int]:
    """A counts reply: its integers, in the order the script's header names them."""
    return [int(res)] if isinstance(res, int) else [int(x) for x in res]

