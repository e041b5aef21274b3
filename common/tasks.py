"""Task specifications, the typed task object `@app.task` returns, and the registry that
resolves task names to code.

Workers execute only what their own registry knows: a name read from Redis is looked up
here, never imported.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, ParamSpec, Protocol, TypeAlias, TypeVar, overload

from duetime.common.errors import InvalidInput, UnknownTask
from duetime.common.middleware import Chain
from duetime.common.names import check_name, check_owner
from duetime.common.time.parse import Span
from duetime.common.values import count, flag

BACKOFF = Span(timedelta(0), timedelta(days=30))
TIMEOUT = Span(timedelta(milliseconds=1), timedelta(days=7))
# retries a task may declare: far beyond any sane retry policy (at a 1 s back-off base doubling
# up to its cap, 1000 attempts take days), small enough that a typo such as 10**9 is refused
MAX_RETRIES = 1000
ISOLATIONS = ("thread", "process")  # where an attempt executes (TaskSpec.isolation)


@dataclass(frozen=True)
class TaskSpec:
    """A task's name and options. `fn` is None for a task this process knows by name only
    (a producer that enqueues work its workers run)."""

    name: str
    fn: Callable[..., Any] | None = None
    queue: str = "default"
    retries: int = 3
    backoff: tuple[float, float] = (1.0, 300.0)
    timeout: float | None = None
    idempotent: bool = True
    owner: str | None = None
    store_result: bool = True
    tenant: str | None = None  # runs' default tenant (limits and fair share, docs/fairness.md)
    # "thread": in the worker (sync tasks in its thread pool, async ones on its loop);
    # "process": each attempt in a child process the worker can kill (worker/isolation.py)
    isolation: str = "thread"
    # how long its finished runs are kept: a duration (every state) or {state: duration |
    # "never"}, kept as {state: ms}; None: the queue's, namespace's or built-in retention
    retention: Any = None

    def __post_init__(self) -> None:
        check_name("task name", self.name)
        check_name("queue", self.queue)
        if self.tenant is not None:
            check_name("tenant", self.tenant)
        if self.retention is not None:
            from duetime.common.retention import parse_retention

            object.__setattr__(self, "retention",
                               parse_retention(self.retention, f"task {self.name!r}: retention"))
        what = f"task {self.name!r}:"
        if self.fn is not None and not callable(self.fn):
            raise InvalidInput(f"{what} the task must be a function, got {self.fn!r}")
        count(self.retries, f"{what} retries", 0, MAX_RETRIES)
        flag(self.idempotent, f"{what} idempotent")
        flag(self.store_result, f"{what} store_result")
        if self.isolation not in ISOLATIONS:
            raise InvalidInput(f"{what} isolation must be one of {', '.join(ISOLATIONS)}, got "
                               f"{self.isolation!r}")
        try:
            check_owner(self.owner)
        except InvalidInput as exc:
            raise InvalidInput(f"{what} {exc}") from None
        # durations in any accepted form (seconds, timedelta, "5m"), bounded, kept as seconds
        pair = tuple(self.backoff) if isinstance(self.backoff, tuple | list) else ()
        if len(pair) != 2:
            raise InvalidInput(f"task {self.name!r}: backoff must be (base, max), got "
                               f"{self.backoff!r}")
        base, cap = (BACKOFF.parse(x, f"task {self.name!r}: backoff") for x in pair)
        if cap < base:
            raise InvalidInput(f"task {self.name!r}: backoff must be (base, max) with 0 <= base <= max")
        object.__setattr__(self, "backoff", (base.total_seconds(), cap.total_seconds()))
        if self.timeout is not None:
            if (isinstance(self.timeout, int | float) and not isinstance(self.timeout, bool)
                    and self.timeout <= 0):
                raise InvalidInput(f"task {self.name!r}: timeout must be positive")
            timeout = TIMEOUT.parse(self.timeout, f"task {self.name!r}: timeout")
            object.__setattr__(self, "timeout", timeout.total_seconds())

    @functools.cached_property
    def is_async(self) -> bool:  # cached: a worker asks it per run, and fn never changes
        return inspect.iscoroutinefunction(self.fn)

    @property
    def max_attempts(self) -> int:
        return self.retries + 1

    @functools.cached_property
    def signature(self) -> inspect.Signature | None:
        try:
            return inspect.signature(self.fn) if self.fn is not None else None
        except (TypeError, ValueError):  # a callable without one: nothing to check against
            return None

    def check_args(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """Arguments that cannot bind to the function are refused at the call site, not after
        three retries and a dead letter. Whether they bind depends only on how many positional
        arguments and which keywords there are, so each shape is checked once."""
        shape = (len(args), *kwargs) if kwargs else len(args)
        verdict = self._shapes.get(shape)
        if verdict is None:
            verdict = self._shapes[shape] = self._bind_error(args, kwargs)
        if verdict:
            raise InvalidInput(verdict)

    def _bind_error(self, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
        sig = self.signature
        if sig is None:
            return ""
        try:
            sig.bind(*args, **kwargs)
        except TypeError as exc:
            return f"task {self.name!r} cannot take these arguments: {exc} (it is {self.name}{sig})"
        return ""

    @functools.cached_property
    def _shapes(self) -> dict[Any, str]:
        return {}

    def options_json(self) -> str:
        """The options a producer needs to enqueue this task by name (see Registry.catalogue)."""
        o = {"queue": self.queue, "retries": self.retries,
             "backoff": list(self.backoff), "timeout": self.timeout,
             "idempotent": self.idempotent, "owner": self.owner,
             "store_result": self.store_result, "tenant": self.tenant}
        if self.retention is not None:  # {state: ms}: what the reapers apply to its runs
            o["retention"] = self.retention
        return json.dumps(o, sort_keys=True)

    @classmethod
    def by_name(cls, name: str, options_json: str | bytes | None) -> TaskSpec:
        """A task known by name only, with the options a worker published (or the defaults).

        What a worker published is read back through the same checks as `@app.task`'s own
        arguments: a record written by an older or damaged worker, or by hand (`"retries":
        Infinity`), is refused with InvalidInput naming the task and the bad option, never
        used half-read nor a raw OverflowError. Options this version does not know (published
        by a newer worker) are ignored."""
        if not options_json:
            return cls(name=name)
        where = f"task {name!r}: the options a worker published for it are unusable"
        try:
            o = json.loads(options_json)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"{where}: not JSON ({exc})") from None
        if not isinstance(o, dict):
            raise InvalidInput(f"{where}: expected a JSON object, got {str(o)[:60]!r}")
        backoff = o.get("backoff", (1.0, 300.0))
        try:
            return cls(name=name, fn=None, queue=o.get("queue", "default"),
                       retries=o.get("retries", 3),
                       backoff=tuple(backoff) if isinstance(backoff, list) else backoff,
                       timeout=o.get("timeout"), idempotent=o.get("idempotent", True),
                       owner=o.get("owner"), store_result=o.get("store_result", True),
                       tenant=o.get("tenant") or None,
                       retention=_published_retention(o.get("retention")))
        except InvalidInput as exc:
            raise InvalidInput(f"{where} ({exc}); restart a worker that registers it to "
                               "publish them again") from None


def _published_retention(raw: Any) -> dict[str, Any] | None:
    """A published `retention` ({state: ms}) as `retention=` takes it back."""
    if not isinstance(raw, dict):
        return None
    return {k: ("never" if v == 0 else timedelta(milliseconds=v)) for k, v in raw.items()
            if isinstance(v, int) and not isinstance(v, bool)}


P = ParamSpec("P")
R = TypeVar("R")

# What the enqueue options take, as their annotations say it (common/time/parse.py reads them):
# a duration is a timedelta, seconds (int or float) or a string ("30s", "1h30m", "PT1H30M");
# an instant is an aware datetime or an ISO-8601 string with a UTC offset.
Duration: TypeAlias = timedelta | float | str
Instant: TypeAlias = datetime | str


class Enqueuer(Protocol):
    """What a task object enqueues through (the `App`)."""

    def enqueue(self, task: TaskSpec, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
                at: Instant | None = None, delay: Duration | None = None,
                key: str | None = None, queue: str | None = None, *,
                debounce: Duration | None = None, max_wait: Duration | None = None,
                throttle: Duration | None = None, depends_on: Sequence[str] = (),
                allow_failed_dependencies: bool = False) -> str: ...

    def aenqueue(self, task: TaskSpec, args: Sequence[Any] = (),
                 kwargs: dict[str, Any] | None = None, at: Instant | None = None,
                 delay: Duration | None = None, key: str | None = None,
                 queue: str | None = None, *, debounce: Duration | None = None,
                 max_wait: Duration | None = None, throttle: Duration | None = None,
                 depends_on: Sequence[str] = (),
                 allow_failed_dependencies: bool = False) -> Awaitable[str]: ...


class Task(Generic[P, R]):
    """What `@app.task` returns: the decorated function, still callable exactly like it, plus
    its spec and `enqueue` / `aenqueue`.

    Two forms, both checked at run time against the function's signature before anything is
    written (InvalidInput); what a type checker can check differs, because ParamSpec (PEP 612)
    cannot add keyword parameters to a function's own:

    - `task.enqueue(*args, **kwargs)`: the function's arguments only, type-checked against it
      (a wrong type, a missing argument, an unknown keyword are errors for mypy);
    - `task.options(key=..., at=..., delay=..., queue=...).enqueue(*args, **kwargs)`: the
      options bound first, then the function's arguments, type-checked against it; the form to
      write where options are given, and the only one for a task whose own parameters are named
      `key`, `at`, `delay` or `queue`.

    For compatibility `task.enqueue(*args, key=..., at=..., delay=..., queue=..., **kwargs)`
    still works: given any of those four keywords (or `debounce`, `max_wait`, `throttle`, which
    go with `key`), `enqueue` takes it as the option (never as the function's argument of that
    name). A type checker then checks the options' types but
    not the function's arguments (the overload that accepts it takes them as `Any`); the run
    time check still refuses arguments that do not fit.
    """

    def __init__(self, spec: TaskSpec, fn: Callable[P, R], enqueuer: Enqueuer) -> None:
        self.spec = spec
        self.fn = fn
        self._enqueuer = enqueuer
        functools.update_wrapper(self, fn)  # __name__, __doc__, __module__, __wrapped__

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function here and now (no run is created)."""
        return self.fn(*args, **kwargs)

    # The overloads with an option come first, as at run time an option's keyword is always
    # the option. Each requires one option, so a call with none falls to the last overload,
    # checked against the function (`enqueue(44, dely="30s")` matches no overload).
    @overload
    def enqueue(self, *args: Any, key: str | None, at: Instant | None = None,
                delay: Duration | None = None, queue: str | None = None,
                debounce: Duration | None = None, max_wait: Duration | None = None,
                throttle: Duration | None = None, **kwargs: Any) -> str: ...

    @overload
    def enqueue(self, *args: Any, at: Instant | None, delay: Duration | None = None,
                queue: str | None = None, **kwargs: Any) -> str: ...

    @overload
    def enqueue(self, *args: Any, delay: Duration | None, queue: str | None = None,
                **kwargs: Any) -> str: ...

    @overload
    def enqueue(self, *args: Any, queue: str | None, **kwargs: Any) -> str: ...

    @overload
    def enqueue(self, *args: Any, depends_on: Sequence[str],
                allow_failed_dependencies: bool = False, **kwargs: Any) -> str: ...

    @overload
    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> str: ...

    def enqueue(self, *args: Any, **kwargs: Any) -> str:
        """Create one run of this task with these arguments; → its id. A repeated `key`
        returns the first run's id; `at` (an aware datetime or ISO-8601 string) or `delay`
        (a timedelta, seconds or a string like "30s") schedule it; `queue` overrides the
        task's. Prefer `task.options(...).enqueue(...)` where options are given: there a type
        checker checks the arguments too (see the class docstring)."""
        return self._split(kwargs).enqueue(*args, **kwargs)

    @overload
    async def aenqueue(self, *args: Any, key: str | None, at: Instant | None = None,
                       delay: Duration | None = None, queue: str | None = None,
                       debounce: Duration | None = None, max_wait: Duration | None = None,
                       throttle: Duration | None = None, **kwargs: Any) -> str: ...

    @overload
    async def aenqueue(self, *args: Any, at: Instant | None, delay: Duration | None = None,
                       queue: str | None = None, **kwargs: Any) -> str: ...

    @overload
    async def aenqueue(self, *args: Any, delay: Duration | None, queue: str | None = None,
                       **kwargs: Any) -> str: ...

    @overload
    async def aenqueue(self, *args: Any, queue: str | None, **kwargs: Any) -> str: ...

    @overload
    async def aenqueue(self, *args: Any, depends_on: Sequence[str],
                       allow_failed_dependencies: bool = False, **kwargs: Any) -> str: ...

    @overload
    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> str: ...

    async def aenqueue(self, *args: Any, **kwargs: Any) -> str:
        """`enqueue` for asyncio code: never blocks the event loop."""
        return await self._split(kwargs).aenqueue(*args, **kwargs)

    def _split(self, kwargs: dict[str, Any]) -> TaskOptions[Any, Any]:
        """The enqueue options among `enqueue`'s keywords, taken out of `kwargs` (an option's
        keyword is always the option, whatever the function's parameters are named)."""
        return TaskOptions(self, kwargs.pop("at", None), kwargs.pop("delay", None),
                           kwargs.pop("key", None), kwargs.pop("queue", None),
                           kwargs.pop("debounce", None), kwargs.pop("max_wait", None),
                           kwargs.pop("throttle", None), kwargs.pop("depends_on", ()),
                           kwargs.pop("allow_failed_dependencies", False))

    def options(self, *, at: Instant | None = None, delay: Duration | None = None,
                key: str | None = None, queue: str | None = None,
                debounce: Duration | None = None, max_wait: Duration | None = None,
                throttle: Duration | None = None, depends_on: Sequence[str] = (),
                allow_failed_dependencies: bool = False) -> TaskOptions[P, R]:
        """Enqueue options for the next `.enqueue(...)`: `at` (an aware datetime or ISO-8601
        string) or `delay` (a timedelta, seconds or a string like "30s"), an idempotency `key`
        (a repeated key returns the first run's id), a `queue` other than the task's; with a
        key, `debounce` (and `max_wait`) or `throttle` (docs/debounce.md); `depends_on` run
        ids it waits for (docs/workloads.md)."""
        return TaskOptions(self, at, delay, key, queue, debounce, max_wait, throttle, depends_on,
                           allow_failed_dependencies)

    @property
    def duetime_task(self) -> TaskSpec:
        """The spec, under the attribute name `Registry.resolve` looks for."""
        return self.spec

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def queue(self) -> str:
        return self.spec.queue

    @property
    def retries(self) -> int:
        return self.spec.retries

    @property
    def backoff(self) -> tuple[float, float]:
        return self.spec.backoff

    @property
    def timeout(self) -> float | None:
        return self.spec.timeout

    @property
    def idempotent(self) -> bool:
        return self.spec.idempotent

    @property
    def owner(self) -> str | None:
        return self.spec.owner

    def __repr__(self) -> str:
        return f"<duetime.Task {self.spec.name!r} queue={self.spec.queue!r}>"


class TaskOptions(Generic[P, R]):
    """A task with enqueue options bound (`task.options(...)`); `enqueue` takes exactly the
    function's arguments. Cheap to build: make one per call or keep one."""

    __slots__ = ("task", "at", "delay", "key", "queue", "debounce", "max_wait", "throttle",
                 "depends_on", "allow_failed_dependencies")

    def __init__(self, task: Task[P, R], at: Instant | None = None,
                 delay: Duration | None = None, key: str | None = None,
                 queue: str | None = None, debounce: Duration | None = None,
                 max_wait: Duration | None = None, throttle: Duration | None = None,
                 depends_on: Sequence[str] = (), allow_failed_dependencies: bool = False) -> None:
        self.task, self.at, self.delay, self.key, self.queue = task, at, delay, key, queue
        self.debounce, self.max_wait, self.throttle = debounce, max_wait, throttle
        self.depends_on, self.allow_failed_dependencies = depends_on, allow_failed_dependencies

    def _coalesce(self) -> dict[str, Duration]:
        """The debounce/throttle options that are set (passed only then: an Enqueuer written
        before them still works for the other options)."""
        return {k: v for k in ("debounce", "max_wait", "throttle")
                if (v := getattr(self, k)) is not None}

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """Create one run with these arguments and the bound options; → its id (with
        debounce/throttle: the id of the run the call landed on)."""
        return self.task._enqueuer.enqueue(
            self.task.spec, args, dict(kwargs), at=self.at, delay=self.delay, key=self.key,
            queue=self.queue, depends_on=self.depends_on,
            allow_failed_dependencies=self.allow_failed_dependencies, **self._coalesce())

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """`enqueue` for asyncio code: never blocks the event loop."""
        return await self.task._enqueuer.aenqueue(
            self.task.spec, args, dict(kwargs), at=self.at, delay=self.delay, key=self.key,
            queue=self.queue, depends_on=self.depends_on,
            allow_failed_dependencies=self.allow_failed_dependencies, **self._coalesce())

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={getattr(self, k)!r}" for k in ("at", "delay", "key", "queue",
                                                                "debounce", "max_wait", "throttle")
                         if getattr(self, k) is not None)
        return f"<duetime.TaskOptions {self.task.spec.name!r} {opts}>"


Hook = Callable[["WorkerContext"], Any]  # sync or async


class WorkerContext(dict):  # type: ignore[type-arg]
    """What a worker's start hooks build for its tasks (HTTP clients, DB pools): a dict whose
    keys are also attributes (`ctx.http` is `ctx["http"]`). Tasks reach it through
    `duetime.worker_context()`; stop hooks get it back to close what was opened."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


class Registry:
    """Tasks by name, and the worker lifecycle hooks registered with them."""

    def __init__(self) -> None:
        self._tasks: dict[str, TaskSpec] = {}
        self.on_start: list[Hook] = []
        self.on_stop: list[Hook] = []
        self.middleware = Chain()  # app.middleware(...): common/middleware.py

    def add(self, spec: TaskSpec) -> None:
        old = self._tasks.get(spec.name)
        if old is not None and old.fn is not spec.fn:
            raise InvalidInput(f"task name {spec.name!r} is registered twice")
        self._tasks[spec.name] = spec

    def find(self, name: str) -> TaskSpec | None:
        return self._tasks.get(name)

    def get(self, name: str) -> TaskSpec:
        try:
            return self._tasks[name]
        except KeyError:
            known = ", ".join(sorted(self._tasks)) or "none"
            raise UnknownTask(f"unknown task {name!r} (registered: {known})") from None

    def resolve(self, task: str | Callable[..., Any] | TaskSpec | Task[Any, Any],
                by_name: Callable[[str], TaskSpec] | None = None) -> TaskSpec:
        """A name, a task object, a TaskSpec, or the raw function `@app.task` decorated. A name
        this registry does not know goes to `by_name` if given (a producer without the task's
        code), else is an UnknownTask."""
        if isinstance(task, TaskSpec):
            return task
        if isinstance(task, str):
            if by_name is not None and task not in self._tasks:
                return by_name(check_name("task name", task))
            return self.get(task)
        spec = getattr(task, "duetime_task", None)
        if isinstance(spec, TaskSpec):
            return spec
        raise UnknownTask(f"{task!r} is not a registered duetime task")

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def specs(self) -> list[TaskSpec]:
        return [self._tasks[n] for n in sorted(self._tasks)]

    def queues(self) -> list[str]:
        return sorted({s.queue for s in self._tasks.values()})
