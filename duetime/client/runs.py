"""Creating and reading runs (the synchronous client side of the lifecycle)."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import redis

from duetime.client.coalesce import coalesce
from duetime.common import transitions as tr
from duetime.common.codec import DEFAULT_MAX_PAYLOAD, pack_payload
from duetime.common.connection import (
    arefresh_topology,
    async_client,
    ensure_meta,
    is_cluster,
    refresh_topology,
    refused,
    sent_once,
    sync_client,
    topology_error,
    translated,
    unavailable,
)
from duetime.common.durability import Durability
from duetime.common.errors import (
    EnqueueIncomplete,
    InvalidInput,
    NotReplicated,
    RedisRefused,
    RedisUnavailable,
    ResultNotStored,
    RunFailed,
    RunNotFound,
    WaitTimeout,
)
from duetime.common.keys import Keyspace
from duetime.common.loops import cancelled
from duetime.common.models import TERMINAL, Run
from duetime.common.names import check_name
from duetime.common.outage import retry_in
from duetime.common.scripts import Scripts
from duetime.common.tasks import TaskSpec
from duetime.common.time.parse import DELAY, due_text, duration_ms, parse_instant

MAX_PRIORITY = 100
SCRIPT_CHUNK = 200  # runs per enqueue.lua call
ASYNC_SLICE = 100  # requests validated between two yields to the event loop
# a waiter re-reads the run at least this often; well under the clients' 5 s reply timeout
# (common/connection.py): a BLPOP blocking as long as the socket waits races its own timeout
WAIT_CHUNK_S = 2.0
WAIT_POLL_S = 0.25  # a waiter without script permission reads the run this often
PIPELINE_RUNS = 2000  # runs per round trip
ASYNC_PIPELINE_RUNS = 400  # from asyncio code: smaller round trips, each built between yields


def keyed_run_id(task: str, key: str) -> str:
    """An idempotency key maps to one run id per task, so a repeat finds the first run."""
    return "k" + hashlib.sha256(f"{task}\0{key}".encode()).hexdigest()[:24]


def read_run(client: redis.Redis, keys: Keyspace, run_id: str) -> Run:
    """One run with its attempt history: one round trip, reads only."""
    pipe = client.pipeline(transaction=False)
    queue_read_run(pipe, keys, run_id)
    return decode_read_run(keys, run_id, pipe.execute())


def queue_read_run(pipe: Any, keys: Keyspace, run_id: str) -> None:
    """The reads of `read_run`, queued on a pipeline (sync or asyncio)."""
    check_name("run id", run_id)
    p = keys.partition_of_run(run_id)
    pipe.hgetall(keys.run(p, run_id))
    pipe.lrange(keys.attempts(p, run_id), 0, -1)
    pipe.zscore(keys.leases(p), run_id)


def decode_read_run(keys: Keyspace, run_id: str, replies: list[Any]) -> Run:
    h, attempts, lease_expiry = replies
    if not h:
        raise RunNotFound(f"no run {run_id!r} in namespace {keys.namespace!r}")
    return Run.decode(run_id, h, attempts, lease_expiry)


def outcome(run: Run) -> Any:
    """What waiting on a run gives: its result once it succeeded (ResultNotStored when the
    task returned one that could not be stored); RunFailed (with the run)
    when it ended otherwise or is uncertain; None while it is still on its way."""
    if run.state == "succeeded":
        if run.result_error:  # never None in place of a result that was not stored
            raise ResultNotStored(run)
        return run.result
    if run.state in TERMINAL or run.state == "uncertain":
        raise RunFailed(run)
    return _PENDING


_PENDING = object()


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
    tenant: str | None = None  # None: the task's default
    priority: int = 0  # 1..100: claimed before the queue's other due runs (higher first)
    # debounce / throttle by key (duetime/client/coalesce.py): durations, None = not used
    debounce: timedelta | float | str | None = None
    max_wait: timedelta | float | str | None = None
    throttle: timedelta | float | str | None = None
    # run ids it waits for (state `waiting`, docs/workloads.md); with allow_failed_dependencies
    # it waits for them to finish whatever the outcome, else a failed one cancels it
    depends_on: Sequence[str] = ()
    allow_failed_dependencies: bool = False


def _check_arguments(spec: TaskSpec, req: EnqueueRequest) -> None:
    """The task's arguments as the API takes them: a list or tuple of positional arguments
    (a string would be split into characters, None is not "no arguments"), a dict of keyword
    arguments by name; the tenant a name. Refused here, before anything is written."""
    if not isinstance(req.args, list | tuple):
        raise InvalidInput(f"task {spec.name!r}: args must be a list or tuple of the task's "
                           f"positional arguments, got {type(req.args).__name__} "
                           f"{repr(req.args)[:60]} (one argument x: [x])")
    if not isinstance(req.kwargs, dict) or not all(isinstance(k, str) for k in req.kwargs):
        raise InvalidInput(f"task {spec.name!r}: kwargs must be a dict of keyword arguments by "
                           f"name, got {repr(req.kwargs)[:60]}")
    if req.tenant is not None:
        check_name("tenant", req.tenant)


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


def chosen_run_id(keys: Keyspace, req: EnqueueRequest) -> str:
    """The id `RunStore._prepare_all` gives the request (the same choice: its explicit id, the
    key's id, or a random one; placed in its tenant's partition), fixed before the write, so
    middleware's `on_enqueue` knows it. Only called when middleware is registered."""
    if req.run_id:
        return req.run_id
    spec = req.spec
    run_id = keyed_run_id(spec.name, req.key) if req.key else os.urandom(10).hex()
    tenant = req.tenant if req.tenant is not None else spec.tenant
    if tenant is not None:
        run_id = keys.pin_run_id(run_id, keys.partition_of_tenant(check_name("tenant", tenant)))
    return run_id


class Prepared(NamedTuple):
    run_id: str
    partition: int
    queue: str
    spec: TaskSpec
    due: str  # absolute ms, or '' for server time + delay_ms
    delay_ms: int
    fields: list[Any]
    coalesced: bool = False  # debounced or throttled: may land on the key's current run
    # its id was drawn at random by this call (no key, no explicit id, not coalesced): until
    # it is first sent it cannot exist, so enqueue.lua need not look it up (see `fresh`)
    random_id: bool = False


class _Stopped(Exception):
    """A pass of an enqueue stopped: `error` as the caller would see it, `raw` the error Redis
    gave (to judge whether a retry may cure it), `lost` the chunks whose reply was lost."""

    def __init__(self, error: BaseException, raw: BaseException, lost: list[list[str]]) -> None:
        super().__init__(str(error))
        self.error, self.raw, self.lost = error, raw, lost


class _Attempts:
    """An enqueue across its retries: what is acknowledged, what may exist (a reply was lost),
    and how long it may still retry."""

    def __init__(self, prepared: list[Prepared], retry_s: float) -> None:
        self.prepared = prepared
        self.ids = [pr.run_id for pr in prepared]
        self.created: set[str] = set()
        self.unknown: set[str] = set()  # a reply lost at some pass: maybe created
        self.started = time.monotonic()
        self.retry_s = retry_s
        self.failures = 0
        self.shorts: list[Any] = []  # replicated durability: nodes whose replicas fell short
        self.unreplicated: set[str] = set()
        # debounced/throttled runs: the run each landed on, when not itself (enqueue.lua says)
        self.coalesced = {pr.run_id for pr in prepared if pr.coalesced}
        self.landed: dict[str, str] = {}
        # every run put in a pipeline so far, reply or not: a run sent once may exist, so a
        # later pass sends it without the `fresh` mark (enqueue.lua then looks it up)
        self.sent: set[str] = set()

    def replicated(self, pipe: Any, chunks: list[list[str]]) -> None:
        """Note the chunks of a durable pipeline whose WAIT came back short."""
        shorts = getattr(pipe, "duetime_shorts", None)
        if shorts:
            self.shorts += shorts
            self.unreplicated.update(i for c in chunks for i in c)

    def acknowledged(self) -> list[str]:
        """The ids, once every run is created; NotReplicated if some are on the primary only."""
        if self.unreplicated:
            n = len(self.unreplicated)
            raise NotReplicated(
                f"enqueue: all {len(self.ids):,} run(s) were created on the primary, but "
                f"{self.shorts[0]}: {n:,} of them are not known to be replicated (they exist and "
                "will run; they are lost only if that primary fails before its replicas have "
                "them). Check the replicas (INFO replication on the primary) or raise "
                "wait_timeout_ms; enqueueing the same ids or keys again creates nothing twice",
                self.ids, [i for i in self.ids if i in self.unreplicated])
        if self.landed:
            return [self.landed.get(i, i) for i in self.ids]
        return self.ids

    def todo(self) -> list[Prepared]:
        return [pr for pr in self.prepared if pr.run_id not in self.created]

    def failed(self, stop: _Stopped) -> float | None:
        """How long to wait before the next pass; None: give up (not a failover, or the
        retry window is over)."""
        self.failures += 1
        self.unknown.update(i for c in stop.lost for i in c)
        wait = retry_in(stop.raw, self.failures)
        if not topology_error(stop.raw) or time.monotonic() - self.started + wait > self.retry_s:
            return None
        return wait

    def give_up(self, stop: _Stopped) -> BaseException:
        created = [i for i in self.ids if i in self.created]
        unknown = [i for i in self.ids if i in self.unknown and i not in self.created]
        not_created = [i for i in self.ids if i not in self.created and i not in self.unknown]
        cause: BaseException = stop.error
        if self.retry_s > 0 and topology_error(stop.raw):
            took = time.monotonic() - self.started
            cause = _with_advice(cause, (
                f"enqueue gave up after retrying for {took:.1f} s (a cluster failover takes "
                f"seconds; App(enqueue_retry_s=...) sets how long to retry, now {self.retry_s:g} s)"))
        if len(self.ids) == 1:
            if unknown:
                return _with_advice(cause, f"run {unknown[0]} may exist (the reply was lost): "
                                           "app.get_run tells (an enqueue with key= is safe to "
                                           "repeat: it creates the run once)")
            return cause  # one run: the plain error says it all
        return EnqueueIncomplete(
            f"enqueue stopped after {len(created):,} of {len(self.ids):,} runs were created: {cause} "
            f"-- {len(not_created):,} were not created (safe to enqueue again), "
            f"{len(unknown):,} unknown (the reply was lost; get_run tells)",
            self.ids, created, not_created, unknown)


def _maybe_sent(exc: BaseException, chunks: list[list[str]]) -> list[list[str]]:
    """The chunks that may have run: all of them, unless the connection was never made
    (redis-py says "Error N connecting to host:port"): then nothing was sent."""
    return [] if "connecting to" in str(exc) else chunks


def _with_advice(exc: BaseException, advice: str) -> BaseException:
    """The same kind of error (callers catch RedisUnavailable / RedisRefused), its message
    extended with what happened and what to do."""
    text = f"{exc} -- {advice}"
    if isinstance(exc, RedisRefused):
        return RedisRefused(text, exc.code)
    if isinstance(exc, RedisUnavailable):
        return RedisUnavailable(text)
    return exc


DEFAULT_RETRY_S = 10.0  # an enqueue rides out a cluster failover this long (a cluster URL)


class RunStore:
    def __init__(self, url: str, keys: Keyspace, max_payload: int = DEFAULT_MAX_PAYLOAD,
                 retry_s: float | None = None, durability: Durability | None = None) -> None:
        self.url, self.keys, self.max_payload = url, keys, max_payload
        # a cluster client follows a failover to the promoted replica; a single server's URL
        # points at one node, so by default only a cluster's enqueues wait for one
        self.retry_s = (DEFAULT_RETRY_S if is_cluster(url) else 0.0) if retry_s is None else retry_s
        self.durability = Durability.from_env() if durability is None else durability
        self.client = sync_client(url, durability=self.durability)
        self._aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary())
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
        tenants_ok: dict[str, int] = {}  # tenant -> its home partition
        partition_of_run, limit = self.keys.partition_of_run, self.max_payload
        out = []
        for i, req in enumerate(reqs):
            spec = req.spec
            _check_arguments(spec, req)
            queue = spec.queue if req.queue is None else req.queue
            if queue not in queues_ok:
                queues_ok.add(check_name("queue", queue))
            if req.key is not None:
                check_name("idempotency key", req.key)
            co = coalesce(req.key, req.debounce, req.max_wait, req.throttle, req.at, req.delay)
            spec.check_args(req.args, req.kwargs)
            payload = pack_payload(req.args, req.kwargs, limit)
            if req.run_id:
                run_id = req.run_id
            elif req.key and co is None:
                run_id = keyed_run_id(spec.name, req.key)
            elif req.key:  # a new id each time, in the key's partition (it may be created)
                run_id = self.keys.pin_run_id(entropy[20 * i : 20 * i + 20], partition_of_run(
                    keyed_run_id(spec.name, req.key)))
            else:
                run_id = entropy[20 * i : 20 * i + 20]
            random_id = not req.run_id and not req.key
            tenant = req.tenant if req.tenant is not None else spec.tenant
            if tenant is not None:
                if tenant not in tenants_ok:
                    tenants_ok[check_name("tenant", tenant)] = self.keys.partition_of_tenant(tenant)
                if not req.run_id:  # an explicit id (a replay) already chose its partition
                    run_id = self.keys.pin_run_id(run_id, tenants_ok[tenant])
            due, delay_ms = "", 0
            if req.at is not None:
                if req.delay is not None:
                    raise InvalidInput("give either at= or delay=, not both")
                due = due_text(parse_instant(req.at, what="at"))  # to the µs (format 4)
            elif req.delay is not None:
                # bounded, so server now + delay stays a sane due time (an unbounded one wrapped
                # to INT64_MIN in Lua, ran at once and broke the claim batch it landed in)
                delay_ms = duration_ms(DELAY.parse(req.delay, "delay"))
            fields: list[Any] = ["payload", payload]
            if co is not None:  # its mode first: enqueue.lua reads it there
                fields = co.fields + fields
                if co.delay_ms is not None:
                    delay_ms = co.delay_ms
            if req.key:
                fields += ["key", req.key]
            if tenant is not None:
                fields += ["tenant", tenant]
            if req.priority:
                if (isinstance(req.priority, bool) or not isinstance(req.priority, int)
                        or not 0 <= req.priority <= MAX_PRIORITY):
                    raise InvalidInput(f"priority must be an integer in 0..{MAX_PRIORITY}, "
                                       f"got {req.priority!r}")
                fields += ["priority", req.priority]
            for k, v in req.extra.items():
                fields += [k, v]
            out.append(Prepared(run_id, partition_of_run(run_id), queue, spec, due, delay_ms,
                                fields, co is not None, random_id))
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
        EnqueueIncomplete saying which runs exist, which do not, and which are unknown.

        A failover (a dead primary, CLUSTERDOWN until its replica is promoted) is retried for
        up to `retry_s`: the chunks not acknowledged are sent again with the same run ids, and
        enqueue.lua creates a run id once, so a chunk whose reply was lost is never doubled."""
        reqs = list(reqs)
        if any(r.depends_on for r in reqs):  # runs that wait: hold.lua (client/workloads.py)
            from duetime.client.workloads import Workloads

            return Workloads(self).enqueue_waiting(reqs)
        prepared = self._prepare_all(reqs)
        client = self.ready()
        state = _Attempts(prepared, self.retry_s)
        while True:
            try:
                self._send_once(client, state)
                return state.acknowledged()
            except _Stopped as stop:
                wait = state.failed(stop)
                if wait is None:
                    raise state.give_up(stop) from None
                refresh_topology(self.client)
                time.sleep(wait)

    def _send_once(self, client: redis.Redis, state: _Attempts) -> None:
        """One pass over the runs not acknowledged yet; raises _Stopped at the first failure."""
        with ThreadPoolExecutor(1, thread_name_prefix="duetime-enqueue") as sender:
            inflight = None
            for batch in itertools.chain(self._pipelines(client, state.todo(), sent=state.sent), [None]):
                if inflight is not None:  # the previous round trip, sent while this one was built
                    self._judge(inflight[1], inflight[0], state, inflight[2])
                if batch is None:
                    break
                pipe, chunks = batch
                inflight = (chunks, sender.submit(pipe.execute, raise_on_error=False), pipe)

    def _judge(self, future: Any, chunks: list[list[str]], state: _Attempts, pipe: Any) -> None:
        """Record a round trip's chunks as done, or raise _Stopped if Redis refused or was lost."""
        try:
            results = future.result()
        except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.RedisClusterException) as exc:
            raise _Stopped(unavailable(self.url, exc), exc, lost=_maybe_sent(exc, chunks)) from None
        self._judge_results(results, chunks, state, pipe)

    def _judge_results(self, results: list[Any], chunks: list[list[str]], state: _Attempts,
                       pipe: Any = None) -> None:
        state.replicated(pipe, chunks)  # before a refusal stops the pass: what WAIT said counts
        bad = [r for r in results if isinstance(r, Exception)]
        for c, r in zip(chunks, results, strict=True):
            if not isinstance(r, Exception):
                state.created.update(c)
                if isinstance(r, list):  # debounced/throttled runs: where each landed
                    co = [i for i in c if i in state.coalesced]
                    state.landed.update(zip(co, tr.enqueue_landed(r), strict=True))
        if bad:
            cause = bad[0]
            # a call whose connection broke may have run: its runs are unknown, not absent
            lost = [c for c, r in zip(chunks, results, strict=True)
                    if isinstance(r, redis.ConnectionError | redis.TimeoutError)]
            raise _Stopped(refused(self.url, cause)
                           if isinstance(cause, redis.ResponseError | redis.exceptions.ClusterError)
                           else unavailable(self.url, cause)
                           if isinstance(cause, redis.ConnectionError | redis.TimeoutError)
                           else cause, cause, lost=lost)

    def _pipelines(self, client: redis.Redis, prepared: list[Prepared],
                   per_trip: int = PIPELINE_RUNS, sent: set[str] | None = None,
                   ) -> Iterator[tuple[Any, list[list[str]]]]:
        """(pipeline, the run ids of each script call in it), `per_trip` runs at a time. A call
        whose runs all have random ids never sent before is marked `fresh`: enqueue.lua then
        creates them without an EXISTS each (80 random bits do not collide; only a resend of
        a call whose reply was lost can meet its own runs, and a resend is not fresh)."""
        sent = set() if sent is None else sent
        groups: dict[tuple[int, str, str], list[Prepared]] = {}
        for pr in prepared:
            groups.setdefault((pr.partition, pr.queue, pr.spec.name), []).append(pr)
        pipe, chunks, pending = sent_once(client.pipeline(transaction=False)), [], 0
        for (p, queue, _), items in groups.items():
            shared = task_fields(items[0].spec, queue)
            for i in range(0, len(items), min(SCRIPT_CHUNK, per_trip)):
                chunk = items[i : i + min(SCRIPT_CHUNK, per_trip)]
                fresh = all(x.random_id and x.run_id not in sent for x in chunk)
                sent.update(x.run_id for x in chunk)
                keys, args = tr.enqueue(self.keys, p, queue, shared,
                                        [(x.run_id, x.due, x.delay_ms, x.fields)
                                         for x in chunk], fresh=fresh)
                self.scripts.enqueue(keys=keys, args=args, client=pipe)
                chunks.append([x.run_id for x in chunk])
                pending += len(chunk)
                if pending >= per_trip:
                    yield pipe, chunks
                    pipe, chunks, pending = sent_once(client.pipeline(transaction=False)), [], 0
        if pending:
            yield pipe, chunks

    # -- asyncio: the same preparation, pipelines and judgement; only the sending differs ---
    async def aclient(self) -> Any:
        """This event loop's asyncio client (an asyncio client is bound to the loop that made
        it: an app used from several loops gets one per loop)."""
        loop = asyncio.get_running_loop()
        client = self._aclients.get(loop)
        if client is None:
            if not self._ready:  # the one-time namespace check runs off the loop
                await asyncio.to_thread(self.ready)
            client = self._aclients[loop] = async_client(self.url, durability=self.durability)
        return client

    async def aenqueue_many(self, reqs: Iterable[EnqueueRequest]) -> list[str]:
        """`enqueue_many` for asyncio code: requests are validated a slice at a time, yielding
        to the loop in between, so ten thousand runs never hold it for more than a slice.
        A failover is retried as in `enqueue_many`, sleeping on the loop."""
        reqs = list(reqs)
        if any(r.depends_on for r in reqs):  # runs that wait: hold.lua, off the loop
            from duetime.client.workloads import Workloads

            return await asyncio.to_thread(Workloads(self).enqueue_waiting, reqs)
        prepared: list[Prepared] = []
        for i in range(0, len(reqs), ASYNC_SLICE):
            prepared += self._prepare_all(reqs[i : i + ASYNC_SLICE])
            await asyncio.sleep(0)
        client = await self.aclient()
        state = _Attempts(prepared, self.retry_s)
        while True:
            try:
                for pipe, chunks in self._pipelines(client, state.todo(), ASYNC_PIPELINE_RUNS,
                                                     sent=state.sent):
                    try:
                        results = await pipe.execute(raise_on_error=False)
                    except (redis.ConnectionError, redis.TimeoutError,
                            redis.exceptions.RedisClusterException) as exc:
                        raise _Stopped(unavailable(self.url, exc), exc,
                                       lost=_maybe_sent(exc, chunks)) from None
                    self._judge_results(results, chunks, state, pipe)
                return state.acknowledged()
            except _Stopped as stop:
                wait = state.failed(stop)
                if wait is None:
                    raise state.give_up(stop) from None
                await arefresh_topology(client)
                await asyncio.sleep(wait)

    async def aget_run(self, run_id: str) -> Run:
        client = await self.aclient()
        pipe = client.pipeline(transaction=False)
        queue_read_run(pipe, self.keys, run_id)
        with translated(self.url):
            return decode_read_run(self.keys, run_id, await pipe.execute())

    # -- waiting for a run's end -----------------------------------------------------------
    def wait(self, run_id: str, timeout: float | None = None) -> Any:
        """Block until the run ends: its result, or RunFailed; WaitTimeout after `timeout`
        seconds (None: no limit). Blocks on the run's notify list (BLPOP), woken by the script
        that ends the run, re-reading the run at least every WAIT_CHUNK_S (a lost notice costs
        one chunk, never the wait). A user whose ACL allows no script (the read-only operator
        role) polls the run every WAIT_POLL_S instead."""
        client = self.ready()
        p = self.keys.partition_of_run(check_name("run id", run_id))
        keys, args = tr.wait(self.keys, p, run_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        with translated(self.url):
            try:
                self._wait_started(tr.status(self.scripts.wait(keys=keys, args=args)), run_id)
                notified = True
            except redis.exceptions.NoPermissionError:
                notified = False  # a read-only operator: poll the run instead
            while True:
                got = outcome(self.get_run(run_id))
                if got is not _PENDING:
                    return got
                left = WAIT_CHUNK_S if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise WaitTimeout(self.get_run(run_id), timeout)
                if notified:
                    client.blpop([keys[0]], timeout=min(left, WAIT_CHUNK_S))
                else:
                    time.sleep(min(left, WAIT_POLL_S))

    async def await_result(self, run_id: str, timeout: float | None = None) -> Any:
        """`wait` for asyncio code: the loop waits on the notify list, it is never blocked.
        Cancelled, it ends even when a Redis call swallowed the cancellation (Python 3.11's
        `asyncio.wait_for`, which redis-py sends through on a client with a socket timeout:
        common/loops.py): it looks after each call, instead of waiting on until the run
        ends."""
        client = await self.aclient()
        p = self.keys.partition_of_run(check_name("run id", run_id))
        keys, args = tr.wait(self.keys, p, run_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        with translated(self.url):
            try:
                self._wait_started(tr.status(await Scripts(client).wait(keys=keys, args=args)), run_id)
                notified = True
            except redis.exceptions.NoPermissionError:
                notified = False  # a read-only operator: poll the run instead
            while True:
                run = await self.aget_run(run_id)
                cancelled()  # a cancellation the read swallowed ends the wait here
                got = outcome(run)
                if got is not _PENDING:
                    return got
                left = WAIT_CHUNK_S if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise WaitTimeout(await self.aget_run(run_id), timeout)
                if notified:
                    await client.blpop([keys[0]], timeout=min(left, WAIT_CHUNK_S))
                    cancelled()
                else:
                    await asyncio.sleep(min(left, WAIT_POLL_S))

    def _wait_started(self, status: bytes, run_id: str) -> None:
        if status == b"missing":
            raise RunNotFound(f"no run {run_id!r} in namespace {self.keys.namespace!r}")

    # -- read -------------------------------------------------------------------------
    def get_run(self, run_id: str) -> Run:
        client = self.ready()
        with translated(self.url):
            return read_run(client, self.keys, run_id)

    def close(self) -> None:
        self.client.close()
        self._aclients.clear()  # asyncio clients close with their loops
