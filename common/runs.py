"""Creating and reading runs (the synchronous client side of the lifecycle)."""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import redis
from duetime.common import transitions as tr
from duetime.common.codec import DEFAULT_MAX_PAYLOAD, pack_payload
from duetime.common.connection import ensure_meta, refused, sync_client, translated, unavailable
from duetime.common.errors import EnqueueIncomplete, InvalidInput, RunNotFound
from duetime.common.keys import Keyspace
from duetime.common.models import Run
from duetime.common.names import check_name
from duetime.common.scripts import Scripts
from duetime.common.tasks import TaskSpec
from duetime.common.timeparse import DELAY, duration_ms, parse_instant, to_ms

SCRIPT_CHUNK = 200  # runs per enqueue.lua call
PIPELINE_RUNS = 2000  # runs per round trip


def new_run_id() -> str:
    return os.urandom(10).hex()


def keyed_run_id(task: str, key: str) -> str:
    """An idempotency key maps to one run id per task, so a repeat finds the first run."""
    return "k" + hashlib.sha256(f"{task}\0{key}".encode()).hexdigest()[:24]


def read_run(client: redis.Redis, keys: Keyspace, run_id: str) -> Run:
    """One run with its attempt history: one round trip, reads only."""
    check_name("run id", run_id)
    p = keys.partition_of_run(run_id)
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.run(p, run_id))
    pipe.lrange(keys.attempts(p, run_id), 0, -1)
    pipe.zscore(keys.leases(p), run_id)
    h, attempts, lease_expiry = pipe.execute()
    if not h:
        raise RunNotFound(f"no run {run_id!r} in namespace {keys.namespace!r}")
    return Run.decode(run_id, h, attempts, lease_expiry)


@dataclass(slots=True)
class EnqueueRequest:
    spec: TaskSpec
    args: Sequence[Any] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    at: datetime | str | None = None
    delay: timedelta | float | str | None = None
    key: str | None = None
    queue: str | None = None
    run_id: str | None = None
    extra: dict[str, str | int] = field(default_factory=dict)


def task_fields(spec: TaskSpec, queue: str) -> list[Any]:
    """The run-record fields a task's options give (copied into each run: the reaper and the
    worker decide retries and timeouts from the record, whatever code is deployed later)."""
    f: list[Any] = [
        "task", spec.name, "queue", queue, "max_attempts", spec.max_attempts,
        "backoff_base", int(spec.backoff[0] * 1000), "backoff_max", int(spec.backoff[1] * 1000),
    ]
    if spec.timeout:
        f += ["timeout", int(spec.timeout * 1000)]
    if not spec.idempotent:
        f += ["idempotent", 0]
    if spec.owner:
        f += ["owner", spec.owner]
    return f


class Prepared(NamedTuple):
    run_id: str
    partition: int
    queue: str
    spec: TaskSpec
    due: str  # absolute ms, or '' for server time + delay_ms
    delay_ms: int
    fields: list[Any]


class RunStore:
    def __init__(self, url: str, keys: Keyspace, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self.url, self.keys, self.max_payload = url, keys, max_payload
        self.client = sync_client(url)
        self._ready = False
        self.scripts = Scripts(self.client)

    def ready(self) -> redis.Redis:
        if not self._ready:
            ensure_meta(self.client, self.keys, self.url)
            self._ready = True
        return self.client

    # -- enqueue ------------------------------------------------------------------
    def _prepare_all(self, reqs: Iterable[EnqueueRequest]) -> list[Prepared]:
        """Validate and encode every request; raises before anything is written. Names are
        checked once per distinct value and random ids are drawn in one go (a bulk call
        spends microseconds per run here)."""
        reqs = list(reqs)
        entropy = os.urandom(10 * len(reqs)).hex()
        queues_ok: set[str] = set()
        partition_of_run, limit = self.keys.partition_of_run, self.max_payload
        out = []
        for i, req in enumerate(reqs):
            spec = req.spec
            queue = spec.queue if req.queue is None else req.queue
            if queue not in queues_ok:
                queues_ok.add(check_name("queue", queue))
            if req.key is not None:
                check_name("idempotency key", req.key)
            payload = pack_payload(req.args, req.kwargs, limit)
            if req.run_id:
                run_id = req.run_id
            elif req.key:
                run_id = keyed_run_id(spec.name, req.key)
            else:
                run_id = entropy[20 * i : 20 * i + 20]
            due, delay_ms = "", 0
            if req.at is not None:
                if req.delay is not None:
                    raise InvalidInput("give either at= or delay=, not both")
                due = str(to_ms(parse_instant(req.at, what="at"), ceil=True))
            elif req.delay is not None:
                # bounded, so server now + delay stays a sane due time (an unbounded one wrapped
                # to INT64_MIN in Lua, ran at once and broke the claim batch it landed in)
                delay_ms = duration_ms(DELAY.parse(req.delay, "delay"))
            fields: list[Any] = ["payload", payload]
            if req.key:
                fields += ["key", req.key]
            for k, v in req.extra.items():
                fields += [k, v]
            out.append(Prepared(run_id, partition_of_run(run_id), queue, spec, due, delay_ms,
                                fields))
        return out

    def enqueue(self, req: EnqueueRequest) -> str:
        return self.enqueue_many([req])[0]

    def enqueue_many(self, reqs: Iterable[EnqueueRequest]) -> list[str]:
        """Validates everything first (nothing is written if one request is bad), then sends
        one enqueue.lua call per (partition, queue) chunk, pipelined PIPELINE_RUNS runs per
        round trip. With several round trips, one thread sends while this one builds the
        next pipeline, so Redis's time and ours overlap (the GIL is free while it waits).

        Every id is fixed before the first write and each script call creates all its runs or
        none (refused as a whole at maxmemory), so a batch stopped by Redis raises
        EnqueueIncomplete saying which runs exist, which do not, and which are unknown."""
        prepared = self._prepare_all(reqs)
        ids = [pr.run_id for pr in prepared]
        client = self.ready()
        done: list[list[str]] = []  # the ids of each acknowledged chunk
        with ThreadPoolExecutor(1, thread_name_prefix="duetime-enqueue") as sender:
            inflight = None
            for batch in itertools.chain(self._pipelines(client, prepared), [None]):
                if inflight is not None:  # the previous round trip, sent while this one was built
                    self._judge(inflight[1], inflight[0], ids, done)
                if batch is None:
                    break
                pipe, chunks = batch
                inflight = (chunks, sender.submit(pipe.execute, raise_on_error=False))
        return ids

    def _judge(self, future: Any, chunks: list[list[str]], ids: list[str],
               done: list[list[str]]) -> None:
        """Record a round trip's chunks as done, or raise if Redis refused or was lost."""
        try:
            results = future.result()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._incomplete(ids, done, chunks, unavailable(self.url, exc))
        bad = [r for r in results if isinstance(r, Exception)]
        done += [c for c, r in zip(chunks, results, strict=True) if not isinstance(r, Exception)]
        if bad:
            cause = bad[0]
            self._incomplete(ids, done, [], refused(self.url, cause)
                             if isinstance(cause, redis.ResponseError) else cause)

    def _incomplete(self, ids: list[str], done: list[list[str]], lost: list[list[str]],
                    cause: BaseException) -> None:
        created = [i for c in done for i in c]
        unknown = [i for c in lost for i in c]
        settled = set(created) | set(unknown)
        not_created = [i for i in ids if i not in settled]
        if len(ids) == 1:
            raise cause  # one run: the plain error says it all
        raise EnqueueIncomplete(
            f"enqueue stopped after {len(created):,} of {len(ids):,} runs were created: {cause} "
            f"-- {len(not_created):,} were not created (safe to enqueue again), "
            f"{len(unknown):,} unknown (the reply was lost; get_run tells)",
            ids, created, not_created, unknown) from None

    def _pipelines(self, client: redis.Redis, prepared: list[Prepared]
                   ) -> Iterator[tuple[Any, list[list[str]]]]:
        """(pipeline, the run ids of each script call in it), PIPELINE_RUNS runs at a time."""
        groups: dict[tuple[int, str, str], list[Prepared]] = {}
        for pr in prepared:
            groups.setdefault((pr.partition, pr.queue, pr.spec.name), []).append(pr)
        pipe, chunks, pending = client.pipeline(transaction=False), [], 0
        for (p, queue, _), items in groups.items():
            shared = task_fields(items[0].spec, queue)
            for i in range(0, len(items), SCRIPT_CHUNK):
                chunk = items[i : i + SCRIPT_CHUNK]
                keys, args = tr.enqueue(self.keys, p, queue, shared,
                                        [(x.run_id, x.due, x.delay_ms, x.fields)
                                         for x in chunk])
                self.scripts.enqueue(keys=keys, args=args, client=pipe)
                chunks.append([x.run_id for x in chunk])
                pending += len(chunk)
                if pending >= PIPELINE_RUNS:
                    yield pipe, chunks
                    pipe, chunks, pending = client.pipeline(transaction=False), [], 0
        if pending:
            yield pipe, chunks

    # -- read -------------------------------------------------------------------------
    def get_run(self, run_id: str) -> Run:
        client = self.ready()
        with translated(self.url):
            return read_run(client, self.keys, run_id)

    def close(self) -> None:
        self.client.close()
