"""The application object: task registry plus the client-side API (enqueue, inspect)."""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import date, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypedDict, TypeVar, Unpack, cast, overload

from duetime.client.limits import Limit, Limits, make_limit
from duetime.client.runs import ASYNC_SLICE, EnqueueRequest, RunStore, chosen_run_id, keyed_run_id
from duetime.client.schedules import ScheduleInfo, ScheduleStore
from duetime.client.workloads import Batch, Workloads, new_batch_id
from duetime.common.codec import DEFAULT_MAX_PAYLOAD, pack_payload
from duetime.common.connection import DEFAULT_URL, translated
from duetime.common.durability import Durability
from duetime.common.errors import InvalidInput, UnknownTask
from duetime.common.keys import Keyspace
from duetime.common.logs import get as get_logger
from duetime.common.middleware import EnqueueInfo, check_headers
from duetime.common.models import Run
from duetime.common.names import check_name, check_owner
from duetime.common.schedules import ScheduleDef, bound_ms, parse_stagger, seeded
from duetime.common.tasks import Duration, Hook, Instant, Registry, Task, TaskSpec
from duetime.common.time.spec import Trigger

if TYPE_CHECKING:  # operator tools are imported where used: a worker process never loads them
    from duetime.client.calendars import CalendarInfo, CalendarStore
    from duetime.ops.admin import RunAdmin

P = ParamSpec("P")
R = TypeVar("R")
# what an enqueue_many dict item may hold: enqueue's own arguments, nothing internal
ENQUEUE_FIELDS = frozenset({"task", "args", "kwargs", "at", "delay", "key", "queue", "tenant",
                            "priority", "debounce", "max_wait", "throttle", "depends_on",
                            "allow_failed_dependencies"})
TaskRef = str | Callable[..., Any] | TaskSpec | Task[Any, Any]
M = TypeVar("M")


class ScheduleOptions(TypedDict, total=False):
    """The options of `App.schedule` and `App.schedule_def`, by keyword, each optional.

    `queue` (default: the task's). `catchup` ('latest', the default; 'all', 'skip') and
    `max_catchup` (default 100): what happens to occurrences missed while no scheduler ran.
    `overlap` ('allow', the default; 'skip', 'buffer_one', 'cancel_other'). Durations
    (`lateness`, `jitter`, `miss_tolerance`) take a timedelta, seconds, or a string like "90s",
    "1h30m", "PT1H30M". `lateness`: a run not started that long after its due time is missed.
    `miss_tolerance` (default 60 s): an occurrence evaluated later than this after its instant
    counts as missed and follows `catchup`; one whose successor is already due is missed in
    any case. `owner` (default: the task's). `tenant` (default: the task's) is given to every
    run the schedule creates.

    `stagger` shifts every run of the schedule by a stable offset in [0, stagger) derived from
    its name, so schedules written alike do not all fire in the same second. Not given (or
    "default"/"auto"): the namespace's policy (`duetime schedule policy set --stagger 30s`,
    none unless set); 0: exactly on its instants whatever the policy.

    Guardrails (none by default): `pause_after_failures=N` pauses the schedule after N
    consecutive occurrences that ended dead (cancels, skips, misses and replays do not count;
    a success or a resume starts the count again). `start` / `end` (aware datetimes or
    ISO-8601 strings with an offset; naive refused) bound its occurrences. `max_runs=N` ends
    it after the evaluator made N runs.
    """

    queue: str | None
    catchup: str
    max_catchup: int
    lateness: Duration | None
    overlap: str
    jitter: Duration | None
    owner: str | None
    miss_tolerance: Duration | None
    stagger: Duration | None
    tenant: str | None
    # a business calendar (`app.calendar`) by name, and what an occurrence on an excluded day
    # does: 'skip' (the default; recorded as a skipped run), or roll to the same local time on
    # the 'next' or 'previous' business day (docs/time.md)
    calendar: str | None
    on_excluded: str
    pause_after_failures: int | None
    start: datetime | str | None
    end: datetime | str | None
    max_runs: int | None
CATALOGUE_TTL_S = 60.0  # how long a producer trusts the task options it read by name
# a task a worker said it had the code of within this long can be enqueued by name (workers
# may all be down for a while: runs queue up meanwhile)
RECENT_S = 7 * 24 * 3600.0
log = get_logger("duetime.app")



def _async_twin(sync: Callable[P, str]) -> Callable[[Callable[..., Awaitable[str]]],
                                                     Callable[P, Awaitable[str]]]:
    """Give an asyncio twin the parameters of its sync method (`aenqueue` of `enqueue`): one
    parameter list, seen by type checkers (ParamSpec) and by `help()` (`__signature__`)."""

    def wrap(f: Callable[..., Awaitable[str]]) -> Callable[P, Awaitable[str]]:
        f.__signature__ = inspect.signature(sync)  # type: ignore[attr-defined]
        return f

    return wrap


_signature = cache(inspect.signature)  # read once per function, not per call


def _bound(f: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """The arguments of a call to `f`, by name, defaults filled in (a wrong name or a
    missing argument raises TypeError as the call itself would)."""
    bound = _signature(f).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def _enqueue_request(
    spec: TaskSpec,
    *,
    args: Sequence[Any],
    kwargs: dict[str, Any] | None,
    at: Instant | None,
    delay: Duration | None,
    key: str | None,
    queue: str | None,
    tenant: str | None,
    priority: int,
    debounce: Duration | None,
    max_wait: Duration | None,
    throttle: Duration | None,
    depends_on: Sequence[str],
    allow_failed_dependencies: bool,
) -> EnqueueRequest:
    """The request `enqueue` / `aenqueue` make of their options: each by name, so a type
    checker matches them against `enqueue`'s parameters and EnqueueRequest's fields."""
    return EnqueueRequest(spec, args, kwargs or {}, at=at, delay=delay, key=key, queue=queue,
                          tenant=tenant, priority=priority, debounce=debounce,
                          max_wait=max_wait, throttle=throttle, depends_on=tuple(depends_on),
                          allow_failed_dependencies=allow_failed_dependencies)


_NOT_OPTIONS = ("self", "task", "allow_unknown")  # enqueue's parameters that are no request's

class App:
    """`app = App(redis_url=...)`; decorate tasks with `@app.task(...)`; enqueue and inspect."""

    def __init__(
        self,
        redis_url: str | None = None,
        namespace: str | None = None,
        partitions: int = 16,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        enqueue_retry_s: float | None = None,
        wait_replicas: int | None = None,
        wait_timeout_ms: int | None = None,
    ) -> None:
        """`enqueue_retry_s`: how long an enqueue keeps retrying while Redis fails over (a dead
        primary, its replica not promoted yet); None: 10 s on a `redis+cluster://` URL, 0 on a
        single server. Safe: a run's id is fixed before the first write and created once.

        `wait_replicas`: replicated durability (default DUETIME_WAIT_REPLICAS, else 0): every
        state change this app makes (enqueue, schedule upsert, cancel, ...) is acknowledged
        only once that many replicas have it (`WAIT`), within `wait_timeout_ms` (default
        1000); an enqueue they did not confirm in time raises NotReplicated (the runs exist
        on the primary). Workers and schedulers started with `--app` on this app follow it."""
        if enqueue_retry_s is not None and (
                isinstance(enqueue_retry_s, bool) or not isinstance(enqueue_retry_s, int | float)
                or not 0 <= enqueue_retry_s <= 3600):
            raise InvalidInput(f"enqueue_retry_s must be in 0..3600 seconds, got {enqueue_retry_s!r}")
        self.enqueue_retry_s = enqueue_retry_s
        env = Durability.from_env()
        self.durability = Durability(env.replicas if wait_replicas is None else wait_replicas,
                                     env.timeout_ms if wait_timeout_ms is None else wait_timeout_ms)
        self.redis_url = redis_url or os.environ.get("DUETIME_REDIS_URL") or DEFAULT_URL
        if namespace is not None and not namespace:
            raise InvalidInput("namespace must not be empty (None: the default, 'duetime')")
        self.keys = Keyspace(namespace or os.environ.get("DUETIME_NAMESPACE") or "duetime",
                             partitions)
        self.max_payload = max_payload
        self.registry = Registry()
        self._store: RunStore | None = None
        self._schedules: ScheduleStore | None = None
        self._queues_seen: set[str] = set()
        self._catalogue: dict[str, tuple[float, TaskSpec]] = {}
        self._warned: set[str] = set()
        self._published: set[str] = set()

    @property
    def store(self) -> RunStore:
        if self._store is None:
            self._store = RunStore(self.redis_url, self.keys, self.max_payload,
                                   retry_s=self.enqueue_retry_s, durability=self.durability)
        return self._store

    async def _astore(self) -> RunStore:
        """The store, made off the event loop the first time (making it assembles and hashes
        the scripts)."""
        if self._store is None:
            await asyncio.to_thread(lambda: self.store)
        return self.store

    def _admin(self) -> RunAdmin:
        from duetime.ops.admin import RunAdmin

        return RunAdmin(self.store.client, self.keys, self.redis_url)

    @property
    def schedules(self) -> ScheduleStore:
        if self._schedules is None:
            self._schedules = ScheduleStore(self.store.ready(), self.keys, self.redis_url)
        return self._schedules

    def configure(self, redis_url: str | None = None, namespace: str | None = None) -> None:
        """Point an already-imported app at another server or namespace (CLI overrides)."""
        if redis_url:
            self.redis_url = redis_url
        if namespace:
            self.keys = Keyspace(namespace, self.keys.partitions)
        self.close()

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        retries: int = 3,
        backoff: tuple[float | str | timedelta, float | str | timedelta] = (1.0, 300.0),
        timeout: float | str | timedelta | None = None,
        idempotent: bool = True,
        owner: str | None = None,
        store_result: bool = True,
        tenant: str | None = None,
        isolation: Literal["thread", "process"] = "thread",
        retention: float | str | timedelta | dict[str, float | str | timedelta | None] | None = None,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(
        self,
        fn: Callable[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        retries: int = 3,
        backoff: tuple[float | str | timedelta, float | str | timedelta] = (1.0, 300.0),
        timeout: float | str | timedelta | None = None,
        idempotent: bool = True,
        owner: str | None = None,
        store_result: bool = True,
        tenant: str | None = None,
        isolation: Literal["thread", "process"] = "thread",
        retention: float | str | timedelta | dict[str, float | str | timedelta | None] | None = None,
    ) -> Task[P, R] | Callable[[Callable[P, R]], Task[P, R]]:
        """Register a function as a task: `@app.task` or `@app.task(name=..., retries=...)`.

        Returns a `Task`: called, it runs the function as before; `.enqueue(*args, **kwargs)`
        or `.options(key=..., at=..., delay=..., queue=...).enqueue(*args, **kwargs)` creates a
        run (arguments checked against the function's signature, by a type checker too; see
        `Task`), `.aenqueue(...)` from asyncio code. The name defaults to
        `module.qualname`; name it explicitly if the code may move (runs store the name).
        The return value is stored on the run (msgpack, capped like payloads, kept for the
        retention period) for `app.wait`; `store_result=False` skips that. `tenant` is the
        default tenant of its runs (limits and fair share, docs/fairness.md).
        `isolation="process"` runs each attempt in a child process the worker kills past
        `timeout` or `--max-task-memory` (docs/operations.md, "Hard timeouts"). `retention`: how
        long its finished runs are kept -- a duration, or {state: duration or "never"} for
        succeeded, cancelled, skipped, missed, dead, uncertain (docs/operations.md)."""

        def register(f: Callable[P, R]) -> Task[P, R]:
            spec = TaskSpec(
                name=f"{f.__module__}.{f.__qualname__}" if name is None else name, fn=f, queue=queue,
                # TaskSpec.__post_init__ turns any accepted duration into seconds
                retries=retries, backoff=cast("tuple[float, float]", backoff),
                timeout=cast("float | None", timeout), idempotent=idempotent,
                owner=owner, store_result=store_result, tenant=tenant, isolation=isolation,
                retention=retention,
            )
            self.registry.add(spec)
            # the raw function stays resolvable too (`app.task(fn)` without keeping the result)
            f.duetime_task = spec  # type: ignore[attr-defined]
            return Task(spec, f, self)

        return register(fn) if fn is not None else register

    # -- worker lifecycle ------------------------------------------------------------------
    def on_worker_start(self, fn: Hook) -> Hook:
        """`@app.on_worker_start`: called (sync or async) with the worker's context before it
        claims anything; store shared resources on it (`ctx.http = ...`) for tasks to reach
        with `duetime.worker_context()`. A hook that raises stops the worker with an error."""
        self.registry.on_start.append(fn)
        return fn

    def on_worker_stop(self, fn: Hook) -> Hook:
        """`@app.on_worker_stop`: called with the same context after the last run ended, to
        close what the start hooks opened (errors are logged; every stop hook runs)."""
        self.registry.on_stop.append(fn)
        return fn

    def middleware(self, obj: M) -> M:
        """Register middleware: an object with some of the hooks `on_enqueue(request)`,
        `after_enqueue(request, error)`, `before_attempt(run)`, `after_attempt(run, outcome,
        error)`, `on_dead(run)`, `on_uncertain(run)`, each sync or async (see
        `duetime.Middleware` and docs/integrations.md). Hooks run in registration order; one
        that raises is logged with the run id and changes nothing, except `before_attempt`:
        it fails that attempt with its error. Also a class decorator (`@app.middleware` on a
        class taking no arguments registers an instance of it). Returns `obj`."""
        self.registry.middleware.add(obj() if isinstance(obj, type) else obj)
        return obj

    def enqueue(
        self,
        task: TaskRef,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        at: Instant | None = None,
        delay: Duration | None = None,
        key: str | None = None,
        queue: str | None = None,
        tenant: str | None = None,
        priority: int = 0,
        allow_unknown: bool = False,
        debounce: Duration | None = None,
        max_wait: Duration | None = None,
        throttle: Duration | None = None,
        depends_on: Sequence[str] = (),
        allow_failed_dependencies: bool = False,
    ) -> str:
        """Create one run; returns its id. A repeated `key` returns the first run's id.

        `task` is a task object, or a name: a service that only enqueues need not import the
        task's code (`app.enqueue("send-invoice", [42], queue="billing")`); the options come
        from what a worker published for that name (see `publish_tasks`). A name no live or
        recent worker has published (a typo: its run would be dead-lettered later) raises
        UnknownTask, unless `allow_unknown=True` (then enqueued with the default options).
        Where the task is registered here, the arguments are checked against its signature.
        `at`: an aware datetime or ISO-8601 string (1970..9999); `delay`: a timedelta, seconds
        or a string like "1h30m" (at most 100 years). Out of range: InvalidInput.
        `tenant` (default: the task's) names who the run is for: tenant limits and fair share
        apply to it, and it lives in its tenant's partition (docs/fairness.md). `priority`
        (1..100) puts it ahead of the queue's other due runs, higher first (its first attempt).
        With `key`: `debounce` (a duration) coalesces the enqueues of the key while its run
        still waits (the last arguments win, due `debounce` after the last enqueue, never
        later than `max_wait` after the first); `throttle` creates one run per window of that
        length. The id returned is the run the call landed on (docs/debounce.md).
        `depends_on`: run ids it waits for, in state `waiting`, until all succeeded; one that
        ends dead, cancelled, missed or skipped cancels it (the reason names it), unless
        `allow_failed_dependencies` (then it waits for all to finish, whatever the outcome).
        An unknown id raises UnknownDependency (docs/workloads.md)."""
        req = _enqueue_request(
            self._resolve(task, allow_unknown=allow_unknown), args=args, kwargs=kwargs, at=at,
            delay=delay, key=key, queue=queue, tenant=tenant, priority=priority,
            debounce=debounce, max_wait=max_wait, throttle=throttle, depends_on=depends_on,
            allow_failed_dependencies=allow_failed_dependencies)
        if self.registry.middleware.for_producer:
            [run_id] = self._hooked([req], lambda: [self.store.enqueue(req)])
        else:
            run_id = self.store.enqueue(req)
        self._remember_queues({req.spec.queue if req.queue is None else req.queue})
        return run_id

    @_async_twin(enqueue)
    async def aenqueue(self, task: TaskRef, *args: Any, **options: Any) -> str:
        """`enqueue` for asyncio code, with the same arguments: never blocks the event loop."""
        o = _bound(App.enqueue, self, task, *args, **options)
        spec = await self._aresolve(task, o["allow_unknown"])
        req = _enqueue_request(spec, **{k: v for k, v in o.items() if k not in _NOT_OPTIONS})
        store = await self._astore()
        if self.registry.middleware.for_producer:
            [run_id] = await self._ahooked([req], lambda: store.aenqueue_many([req]))
        else:
            [run_id] = await store.aenqueue_many([req])
        await self._aremember_queues({req.spec.queue if req.queue is None else req.queue})
        return run_id

    def enqueue_many(self, items: Iterable[dict[str, Any] | tuple[Any, ...]]) -> list[str]:
        """Bulk enqueue, pipelined. Items are dicts of `enqueue`'s arguments or
        `(task, args)` / `(task, args, kwargs)` tuples. Nothing is written if an item is bad;
        if Redis stops the batch part way, EnqueueIncomplete says which runs were created."""
        reqs = self._requests(items, self._resolve)
        if self.registry.middleware.for_producer:
            ids = self._hooked(reqs, lambda: self.store.enqueue_many(reqs))
        else:
            ids = self.store.enqueue_many(reqs)
        self._remember_queues({r.spec.queue if r.queue is None else r.queue for r in reqs})
        return ids

    async def aenqueue_many(self, items: Iterable[dict[str, Any] | tuple[Any, ...]]) -> list[str]:
        """`enqueue_many` for asyncio code: the loop is never held for more than a slice of
        the batch (see RunStore.aenqueue_many)."""
        items = list(items)
        known: dict[str, TaskSpec] = {}

        def resolve(t: Any) -> TaskSpec:
            return known[t] if isinstance(t, str) and t in known else self._resolve(t)

        reqs: list[EnqueueRequest] = []
        for i in range(0, len(items), ASYNC_SLICE):  # a slice at a time, yielding between
            part = items[i : i + ASYNC_SLICE]
            for it in part:  # names this process has no code for: looked up off the loop
                t = it["task"] if isinstance(it, dict) else it[0]
                if isinstance(t, str) and t not in known and self.registry.find(t) is None:
                    known[t] = await self._aresolve(t)
            reqs += self._requests(part, resolve)
            await asyncio.sleep(0)
        store = await self._astore()
        if self.registry.middleware.for_producer:
            ids = await self._ahooked(reqs, lambda: store.aenqueue_many(reqs))
        else:
            ids = await store.aenqueue_many(reqs)
        await self._aremember_queues({r.spec.queue if r.queue is None else r.queue for r in reqs})
        return ids

    # -- middleware around the producer's enqueue (common/middleware.py) --------------------
    def _enqueue_infos(self, reqs: list[EnqueueRequest]) -> list[EnqueueInfo]:
        """Each request's run id fixed now (the id the store would choose), and what its
        hooks see of it."""
        infos = []
        for req in reqs:
            req.run_id = chosen_run_id(self.keys, req)
            spec = req.spec
            infos.append(EnqueueInfo(
                run_id=req.run_id, task=spec.name,
                queue=spec.queue if req.queue is None else req.queue,
                tenant=req.tenant if req.tenant is not None else spec.tenant, owner=spec.owner,
                args=req.args, kwargs=req.kwargs, key=req.key, priority=req.priority))
        return infos

    @staticmethod
    def _carry_headers(reqs: list[EnqueueRequest], infos: list[EnqueueInfo]) -> None:
        """The headers the hooks left, stored on each run; headers out of bounds are dropped
        (and said: a hook's fault must not refuse the enqueue)."""
        for req, info in zip(reqs, infos, strict=True):
            try:
                text = check_headers(info.headers)
            except InvalidInput as exc:
                log.error("middleware left headers that cannot be stored; the run is enqueued "
                          "without them", run_id=info.run_id, task=info.task, error=str(exc))
                info.headers = {}
                continue
            if text:
                req.extra = {**req.extra, "headers": text}

    def _hooked(self, reqs: list[EnqueueRequest], send: Callable[[], list[str]]) -> list[str]:
        chain = self.registry.middleware
        infos = self._enqueue_infos(reqs)
        for info in infos:
            chain.call("on_enqueue", info.run_id, info.task, info)
        self._carry_headers(reqs, infos)
        try:
            ids = send()
        except BaseException as exc:
            for info in infos:
                chain.call("after_enqueue", info.run_id, info.task, info, exc)
            raise
        for info in infos:
            chain.call("after_enqueue", info.run_id, info.task, info, None)
        return ids

    async def _ahooked(self, reqs: list[EnqueueRequest],
                       send: Callable[[], Awaitable[list[str]]]) -> list[str]:
        chain = self.registry.middleware
        infos = self._enqueue_infos(reqs)
        for info in infos:
            await chain.acall("on_enqueue", info.run_id, info.task, info)
        self._carry_headers(reqs, infos)
        try:
            ids = await send()
        except BaseException as exc:
            for info in infos:
                await chain.acall("after_enqueue", info.run_id, info.task, info, exc)
            raise
        for info in infos:
            await chain.acall("after_enqueue", info.run_id, info.task, info, None)
        return ids

    @staticmethod
    def _requests(items: Iterable[dict[str, Any] | tuple[Any, ...]],
                  resolve: Callable[[Any], TaskSpec]) -> list[EnqueueRequest]:
        reqs = []
        # task object -> (task, spec): resolved once per call; holding the task keeps its id
        # from being reused by another object while the call runs
        specs: dict[int, tuple[Any, Any]] = {}
        for it in items:
            if isinstance(it, dict):
                unknown = it.keys() - ENQUEUE_FIELDS
                if unknown or "task" not in it:
                    raise InvalidInput(f"enqueue_many item: unknown field(s) {sorted(unknown)}"
                                       if unknown else "enqueue_many item: no 'task'")
                d = dict(it)
                d["spec"] = resolve(d.pop("task"))
                d.setdefault("kwargs", {})
                reqs.append(EnqueueRequest(**d))
            else:
                task = it[0]
                known = specs.get(id(task))
                if known is None:
                    known = specs[id(task)] = (task, resolve(task))
                reqs.append(EnqueueRequest(known[1], *it[1:]))
        return reqs

    # -- tasks known by name only ---------------------------------------------------------
    def publish_tasks(self) -> None:
        """Publish this app's task options (`<ns>:tasks`), so producers that enqueue by name
        give runs the right retries, timeout, idempotency and owner. Workers do it at start."""
        specs = self.registry.specs()
        if specs:
            now = int(time.time() * 1000)
            with translated(self.redis_url):
                pipe = self.store.ready().pipeline(transaction=False)
                pipe.hset(self.keys.tasks, mapping={s.name: s.options_json() for s in specs})
                pipe.hset(self.keys.task_seen, mapping={s.name: now for s in specs})
                pipe.execute()

    def _resolve(self, task: TaskRef, published: bool = False,
                 allow_unknown: bool = False) -> TaskSpec:
        """A task object, or a name. A name this app has no code for is taken with the options
        a worker published for it. A name no live or recent worker has published (see
        `_by_name`) is refused (UnknownTask: a misspelt name), unless `allow_unknown` (then it
        takes the default options); `published` refuses it in any case (a schedule fires for
        ever)."""
        if isinstance(task, str) and self.registry.find(task) is None:
            check_name("task name", task)
            spec = self._by_name(task)
            if task not in self._published and (published or not allow_unknown):
                known = ", ".join(self.registry.names()) or "none"
                hint = "" if published else "; allow_unknown=True enqueues it all the same"
                raise UnknownTask(f"unknown task {task!r}: not registered in this app "
                                  f"(registered: {known}) and no live or recent worker has "
                                  f"published it{hint}")
            if task not in self._published and task not in self._warned:
                self._warned.add(task)
                log.warning("task not registered here and not published by any live or recent "
                            "worker; enqueued with the default options", task=task)
            return spec
        return self.registry.resolve(task)

    async def _aresolve(self, task: TaskRef, allow_unknown: bool = False) -> TaskSpec:
        if isinstance(task, str) and self.registry.find(task) is None:
            return await asyncio.to_thread(self._resolve, task, False, allow_unknown)
        return self._resolve(task)

    def _by_name(self, name: str) -> TaskSpec:
        """A task this process has no code for: its published options, cached a minute."""
        hit = self._catalogue.get(name)
        if hit is None or time.monotonic() - hit[0] > CATALOGUE_TTL_S:
            with translated(self.redis_url):
                pipe = self.store.ready().pipeline(transaction=False)
                pipe.hget(self.keys.tasks, name)
                pipe.hget(self.keys.task_seen, name)
                raw, seen = pipe.execute()
            # published: its options are there, and a worker said it had the code within
            # RECENT_S (no time at all: published by a worker that kept none, taken as recent)
            try:
                recent = seen is None or time.time() * 1000 - int(seen) <= RECENT_S * 1000
            except ValueError:
                recent = False
            if raw is not None and recent:
                self._published.add(name)
            else:
                self._published.discard(name)
            hit = self._catalogue[name] = (time.monotonic(), TaskSpec.by_name(name, raw))
        return hit[1]

    def _remember_queues(self, queues: set[str]) -> None:
        """Record queue names in `<ns>:queues`, which `top` and the gauges read: one SADD per
        new name per process, after the runs were written (a refused name is never recorded)."""
        new = queues - self._queues_seen
        if new:
            with translated(self.redis_url):
                self.store.client.sadd(self.keys.queues, *new)
            self._queues_seen |= new

    async def _aremember_queues(self, queues: set[str]) -> None:
        new = queues - self._queues_seen
        if new:
            client = await (await self._astore()).aclient()
            with translated(self.redis_url):
                await client.sadd(self.keys.queues, *new)
            self._queues_seen |= new

    def get_run(self, run_id: str) -> Run:
        return self.store.get_run(run_id)

    # -- dependencies and batches (docs/workloads.md) ------------------------------------------
    def _workloads(self) -> Workloads:
        return Workloads(self.store)

    def chain(self, steps: Iterable[tuple[Any, ...] | dict[str, Any]]) -> list[str]:
        """Enqueue a sequence, each run depending on the one before: `(task, args)`,
        `(task, args, kwargs)` or dicts of `enqueue`'s arguments (their own `depends_on` is
        added to). → the run ids, in order. The first one that fails cancels the rest.
        The links live in the first one's partition (a run for a tenant: in its tenant's), so
        each hand-over is made in the script call that ends the previous link."""
        reqs = self._requests(steps, self._resolve)
        prev: str | None = None
        home: int | None = None
        for i, r in enumerate(reqs):
            if r.run_id is None:  # fixed now, as enqueue would: the next one names it
                r.run_id = keyed_run_id(r.spec.name, r.key) if r.key else os.urandom(10).hex()
                tenant = r.tenant if r.tenant is not None else r.spec.tenant
                p = (self.keys.partition_of_tenant(check_name("tenant", tenant))
                     if tenant is not None else home)
                if p is not None:
                    r.run_id = self.keys.pin_run_id(r.run_id, p)
                if home is None:
                    home = self.keys.partition_of_run(r.run_id)
            if prev is not None:
                r.depends_on = (*r.depends_on, prev)
            prev = r.run_id
            reqs[i] = r
        ids = self._workloads().enqueue_waiting(reqs)
        self._remember_queues({r.spec.queue if r.queue is None else r.queue for r in reqs})
        return ids

    def _callback(self, cb: Any) -> EnqueueRequest:
        if isinstance(cb, dict):
            [req] = self._requests([cb], self._resolve)
            return req
        if isinstance(cb, tuple):
            [req] = self._requests([cb], self._resolve)
            return req
        return EnqueueRequest(self._resolve(cb))

    def batch(self, runs: Iterable[dict[str, Any] | tuple[Any, ...]], on_complete: Any = None,
              on_success: Any = None, on_failure: Any = None) -> str:
        """Enqueue `runs` (the items `enqueue_many` takes) as one batch → its id. Callbacks, a
        task or `(task, args)`: `on_complete` runs once every member finished, whatever the
        outcome; `on_success` once if all succeeded; `on_failure` once when the first member
        fails for good (dead, cancelled, missed). Each is created once, up front, waiting;
        inside it `current_run().batch_id` names the batch. All of a batch's runs live in the
        batch's partition (on Cluster: one shard; docs/workloads.md)."""
        cbs = {role: self._callback(cb) for role, cb in (
            ("on_complete", on_complete), ("on_success", on_success), ("on_failure", on_failure))
            if cb is not None}
        reqs = self._requests(runs, self._resolve)
        batch_id = self._workloads().batch(new_batch_id(), reqs, cbs)
        self._remember_queues({r.spec.queue if r.queue is None else r.queue
                               for r in [*reqs, *cbs.values()]})
        return batch_id

    def batch_add(self, batch_id: str, runs: Iterable[dict[str, Any] | tuple[Any, ...]]
                  ) -> list[str]:
        """More members for an open batch (from inside a member: counted in the same call that
        creates them, so the batch cannot finish in between) → their ids. A finished batch
        raises InvalidState."""
        reqs = self._requests(runs, self._resolve)
        ids = self._workloads().batch_add(batch_id, reqs)
        self._remember_queues({r.spec.queue if r.queue is None else r.queue for r in reqs})
        return ids

    def get_batch(self, batch_id: str) -> Batch:
        """The batch's counts, state and callbacks' run ids (RunNotFound if there is none)."""
        return self._workloads().get_batch(batch_id)

    def list_batches(self, limit: int = 100) -> list[Batch]:
        return self._workloads().list_batches(limit)

    def batch_members(self, batch_id: str, limit: int = 1000) -> list[str]:
        return self._workloads().members(batch_id, limit)

    def wait_batch(self, batch_id: str, timeout: float | None = None) -> Batch:
        """Block until every member finished → the batch; BatchWaitTimeout (a TimeoutError)
        after `timeout` s. The callbacks may still be running: wait on their run ids."""
        return self._workloads().wait_batch(batch_id, timeout)

    async def await_batch(self, batch_id: str, timeout: float | None = None) -> Batch:
        """`wait_batch` for asyncio code."""
        return await self._workloads().await_batch(batch_id, timeout)

    def cancel_batch(self, batch_id: str, reason: str = "batch cancelled") -> tuple[int, int, int]:
        """Cancel the batch's callbacks still waiting and its members not finished (running
        ones are asked to stop) → (members cancelled, asked to stop, callbacks cancelled)."""
        return self._workloads().cancel_batch(batch_id, reason)

    async def aget_run(self, run_id: str) -> Run:
        return await (await self._astore()).aget_run(run_id)

    def wait(self, run_id: str, timeout: float | None = None) -> Any:
        """Block until the run ends → the task's return value (None if it stored none).
        A run that ended otherwise (dead, cancelled, missed, skipped) or is uncertain raises
        RunFailed carrying the run, its state and error; WaitTimeout after `timeout` s."""
        return self.store.wait(run_id, timeout)

    async def await_result(self, run_id: str, timeout: float | None = None) -> Any:
        """`wait` for asyncio code: blocks on the run's notify list, never on the loop."""
        return await (await self._astore()).await_result(run_id, timeout)

    def cancel(self, run_id: str, reason: str = "cancelled by the application") -> str:
        """Cancel a run → 'cancelled' (it had not started) or 'requested' (it is running; its
        worker stops it at the next heartbeat). Finished runs raise InvalidState."""
        return self._admin().cancel(run_id, reason)[0]

    def replay(self, run_id: str, force: bool = False) -> str:
        """A new run doing a finished run's work again, linked to it → its id. A succeeded run
        needs `force`; a run replayed before gives that replay's id."""
        return self._admin().replay(run_id, force)[0]

    # -- limits ---------------------------------------------------------------------------
    def set_limit(self, kind: str, name: str, concurrency: int | None = None,
                  rate: float | None = None, per: timedelta | float | str = 1.0,
                  burst: float | None = None, weight: int | None = None) -> None:
        """Limit the runs of a tenant, queue or task (`kind`): at most `concurrency` running
        at once, at most `rate` starts per `per` (bursts up to `burst`, default `rate`).
        A tenant's `weight` (1..1000, default 1) is its share of claims against the other
        tenants of its partition. Replaces the previous limit of that name; none given clears
        it. Every worker obeys it from its next claim (docs/fairness.md)."""
        Limits(self.store.ready(), self.keys, self.redis_url).set(
            make_limit(kind, name, concurrency, rate, per, burst, weight))

    def limits(self) -> list[Limit]:
        """The limits set in this namespace."""
        return Limits(self.store.ready(), self.keys, self.redis_url).list()

    # -- queue pause ----------------------------------------------------------------------
    def pause_queue(self, queue: str, note: str = "") -> None:
        """Stop every worker claiming from `queue` (fleet-wide, kept in Redis across restarts);
        enqueues are still accepted and wait. Runs already running finish."""
        from duetime.client.pause import QueuePauses

        QueuePauses(self.store.ready(), self.keys, self.redis_url).pause(queue, note)

    def resume_queue(self, queue: str) -> None:
        """Let workers claim from a paused `queue` again, at once."""
        from duetime.client.pause import QueuePauses

        QueuePauses(self.store.ready(), self.keys, self.redis_url).resume(queue)

    # -- schedules ------------------------------------------------------------------------
    def schedule(self, name: str, trigger: Trigger, task: TaskRef, args: Sequence[Any] = (),
                 kwargs: dict[str, Any] | None = None, *, paused: bool = False,
                 **options: Unpack[ScheduleOptions]) -> str:
        """Create or update a schedule; → 'created', 'updated' or 'unchanged'.

        Registering the same definition again changes nothing (safe at every deploy); a
        changed one takes effect from the next occurrence that has no run yet. `paused`
        applies only when the schedule is created, so a redeploy never undoes an operator's
        pause. The options (`queue`, `catchup`, `lateness`, ...) are those of
        `ScheduleOptions`, passed by keyword."""
        d = self.schedule_def(name, trigger, task, args, kwargs, **options)
        status = self.schedules.upsert(d, paused)[0]
        self._remember_queues({d.queue})
        return status

    def schedule_many(self, defs: Iterable[ScheduleDef], paused: bool = False) -> list[str]:
        """Bulk `schedule` (pipelined) for definitions made with `schedule_def`."""
        return [status for status, _ in self.schedules.upsert_many(list(defs), paused)]

    def schedule_def(self, name: str, trigger: Trigger, task: TaskRef, args: Sequence[Any] = (),
                     kwargs: dict[str, Any] | None = None,
                     **options: Unpack[ScheduleOptions]) -> ScheduleDef:
        """A validated schedule definition (the arguments: `schedule`, `ScheduleOptions`)."""
        unknown = sorted(set(options) - ScheduleOptions.__optional_keys__)
        if unknown:
            raise TypeError(f"unexpected schedule option(s) {', '.join(unknown)}; the options: "
                            f"{', '.join(sorted(ScheduleOptions.__optional_keys__))}")
        spec = self._resolve(task, published=True)
        o: dict[str, Any] = dict(options)
        tenant, queue, owner = o.get("tenant"), o.get("queue"), o.get("owner")
        if tenant is not None:
            check_name("tenant", tenant)
        owner = check_owner(owner)
        lateness_ms, jitter_ms, tolerance_ms = ScheduleDef.durations(
            o.get("lateness"), o.get("jitter"), o.get("miss_tolerance"))
        # catchup, max_catchup, overlap: given, or ScheduleDef's defaults
        policy = {k: o[k] for k in ("catchup", "max_catchup", "overlap") if k in o}
        return ScheduleDef(
            name=name, trigger=seeded(trigger, name), task=spec.name,
            queue=spec.queue if queue is None else queue,
            payload=pack_payload(args, kwargs or {}, self.max_payload), **policy,
            lateness_ms=lateness_ms, jitter_ms=jitter_ms, owner=owner or spec.owner or "",
            miss_tolerance_ms=tolerance_ms, stagger_ms=parse_stagger(o.get("stagger")),
            tenant=tenant or spec.tenant or "",
            calendar=o.get("calendar") or "", on_excluded=o.get("on_excluded") or "skip",
            pause_after_failures=o.get("pause_after_failures") or 0,
            start_ms=bound_ms(o.get("start"), "start"), end_ms=bound_ms(o.get("end"), "end"),
            max_runs=o.get("max_runs") or 0,
            task_options={
                "max_attempts": spec.max_attempts, "backoff_base": int(spec.backoff[0] * 1000),
                "backoff_max": int(spec.backoff[1] * 1000), "timeout": int((spec.timeout or 0) * 1000),
                "idempotent": int(spec.idempotent),
            },
        )

    def get_schedule(self, name: str) -> ScheduleInfo:
        return self.schedules.get(name)

    def list_schedules(self) -> list[ScheduleInfo]:
        return self.schedules.list()

    def pause(self, name: str, note: str = "") -> None:
        self.schedules.set_paused(name, True, note)

    def resume(self, name: str) -> None:
        self.schedules.set_paused(name, False)

    def delete_schedule(self, name: str) -> None:
        self.schedules.delete(name)

    # -- business calendars (duetime/client/calendars.py) ---------------------------------
    @property
    def calendars(self) -> CalendarStore:
        from duetime.client.calendars import CalendarStore

        return CalendarStore(self.store.ready(), self.keys, self.redis_url)

    def calendar(self, name: str, country: str | None = None, subdiv: str | None = None,
                 dates: Iterable[date | str] = (), ics: str | bytes | Path | None = None,
                 weekdays: Iterable[int | str] | str | None = None) -> str:
        """Create or change business calendar `name`; → 'created', 'updated' or 'unchanged'.

        Its excluded days: the public holidays of `country` (and `subdiv`) from the `holidays`
        package, the explicit `dates`, and the all-day events of the iCalendar file `ics` (a
        path or its text); its weekly business days `weekdays` (default Monday to Friday:
        names, numbers 0 = Monday, or "mon-fri"). Resolved to dates over last year to five
        years ahead when stored; a change bumps its version (`vN`), and the schedules using
        it (`calendar=NAME`) apply it from their next occurrence without a run yet."""
        return self.calendars.put(name, country, subdiv, dates, ics, weekdays)[0]

    def get_calendar(self, name: str) -> CalendarInfo:
        return self.calendars.get(name)

    def list_calendars(self) -> list[CalendarInfo]:
        return self.calendars.list()

    def delete_calendar(self, name: str) -> None:
        self.calendars.delete(name)

    def trigger(self, name: str) -> str:
        """Run a schedule now, outside its trigger; → the run id."""
        return self.schedules.trigger(name)

    def backfill(self, name: str, start: datetime | str, end: datetime | str) -> tuple[int, int]:
        """Runs for every occurrence in [start, end]; → (occurrences, runs created)."""
        return self.schedules.backfill(name, start, end)

    def close(self) -> None:
        self._schedules = None
        self._queues_seen = set()
        if self._store is not None:
            self._store.close()
            self._store = None
