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
from duetime.common.connection import ensure_meta, sync_client, translated
from duetime.common.errors import InvalidInput, RunNotFound
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
    h, attempts = pipe.execute()
    if not h:
        raise RunNotFound(f"no run {run_id!r} in namespace {keys.namespace!r}")
    return Run.decode(run_id, h, attempts)


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
    may_exist: bool  # an id from an idempotency key (or given): look before creating
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
            out.append(Prepared(run_id, partition_of_run(run_id), queue, spec,
                                bool(req.key or req.run_id), due, delay_ms, fields))
        return out

    def enqueue(self, req: EnqueueRequest) -> str:
        return self.enqueue_many([req])[0]

    def enqueue_many(self, reqs: Iterable[EnqueueRequest]) -> list[str]:
        """Validates everything first (nothing is written if one request is bad), then sends
        one enqueue.lua call per (partition, queue) chunk, pipelined PIPELINE_RUNS runs per
        round trip. With several round trips, one thread sends while this one builds the
        next pipeline, so Redis's time and ours overlap (the GIL is free while it waits)."""
        prepared = self._prepare_all(reqs)
        client = self.ready()
        with translated(self.url):
            pipes = self._pipelines(client, prepared)
            first = next(pipes, None)
            second = next(pipes, None)
            if second is None:
                if first is not None:
                    first.execute()
                return [pr.run_id for pr in prepared]
            with ThreadPoolExecutor(1, thread_name_prefix="duetime-enqueue") as sender:
                sent = sender.submit(first.execute)
                for pipe in itertools.chain([second], pipes):
                    sent.result()
                    sent = sender.submit(pipe.execute)
                sent.result()
        return [pr.run_id for pr in prepared]

    def _pipelines(self, client: redis.Redis, prepared: list[Prepared]) -> Iterator[Any]:
        groups: dict[tuple[int, str, str], list[Prepared]] = {}
        for pr in prepared:
            groups.setdefault((pr.partition, pr.queue, pr.spec.name), []).append(pr)
        pipe, pending = client.pipeline(transaction=False), 0
        for (p, queue, _), items in groups.items():
            shared = task_fields(items[0].spec, queue)
            for i in range(0, len(items), SCRIPT_CHUNK):
                chunk = items[i : i + SCRIPT_CHUNK]
                keys, args = tr.enqueue(self.keys, p, queue, shared,
                                        [(x.run_id, x.due, x.delay_ms, x.may_exist, x.fields)
                                         for x in chunk])
                self.scripts.enqueue(keys=keys, args=args, client=pipe)
                pending += len(chunk)
                if pending >= PIPELINE_RUNS:
                    yield pipe
                    pipe, pending = client.pipeline(transaction=False), 0
        if pending:
            yield pipe

    # -- read -------------------------------------------------------------------------
    def get_run(self, run_id: str) -> Run:
        client = self.ready()
        with translated(self.url):
            return read_run(client, self.keys, run_id)

    def close(self) -> None:
        self.client.close()
