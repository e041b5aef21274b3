"""Task specifications, the typed task object `@app.task` returns, and the registry that
resolves task names to code.

Workers execute only what their own registry knows: a name read from Redis is looked up
here, never imported.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

from duetime.common.errors import InvalidInput, UnknownTask
from duetime.common.names import check_name
from duetime.common.timeparse import Span

BACKOFF = Span(timedelta(0), timedelta(days=30))
TIMEOUT = Span(timedelta(milliseconds=1), timedelta(days=7))


@dataclass(frozen=True)
class TaskSpec:
    name: str
    fn: Callable[..., Any]
    queue: str = "default"
    retries: int = 3
    backoff: tuple[float, float] = (1.0, 300.0)
    timeout: float | None = None
    idempotent: bool = True
    owner: str | None = None

    def __post_init__(self) -> None:
        check_name("task name", self.name)
        check_name("queue", self.queue)
        if self.retries < 0:
            raise InvalidInput(f"task {self.name!r}: retries must be >= 0, got {self.retries}")
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
            if isinstance(self.timeout, int | float) and self.timeout <= 0:
                raise InvalidInput(f"task {self.name!r}: timeout must be positive")
            timeout = TIMEOUT.parse(self.timeout, f"task {self.name!r}: timeout")
            object.__setattr__(self, "timeout", timeout.total_seconds())

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    @property
    def max_attempts(self) -> int:
        return self.retries + 1


P = ParamSpec("P")
R = TypeVar("R")


class Enqueuer(Protocol):
    """What a task object enqueues through (the `App`); an async client adds `aenqueue`."""

    def enqueue(self, task: TaskSpec, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
                at: datetime | None = None, delay: timedelta | float | None = None,
                key: str | None = None, queue: str | None = None) -> str: ...


class Task(Generic[P, R]):
    """What `@app.task` returns: the decorated function, still callable exactly like it, plus
    its spec and an `enqueue` typed with the function's own parameters.

    `task.enqueue(*args, **kwargs)` takes the function's arguments and nothing else, so a task
    may have parameters named `key`, `at`, `delay` or `queue`; enqueue options go through
    `task.options(key=..., at=..., delay=..., queue=...).enqueue(*args, **kwargs)`.
    """

    def __init__(self, spec: TaskSpec, fn: Callable[P, R], enqueuer: Enqueuer) -> None:
        self.spec = spec
        self.fn = fn
        self._enqueuer = enqueuer
        functools.update_wrapper(self, fn)  # __name__, __doc__, __module__, __wrapped__

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function here and now (no run is created)."""
        return self.fn(*args, **kwargs)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """Create one run of this task with these arguments, due now; → its id."""
        return TaskOptions(self).enqueue(*args, **kwargs)

    def options(self, *, at: datetime | None = None, delay: timedelta | float | None = None,
                key: str | None = None, queue: str | None = None) -> TaskOptions[P, R]:
        """Enqueue options for the next `.enqueue(...)`: an aware `at` or a `delay` (seconds
        or timedelta), an idempotency `key` (a repeated key returns the first run's id), a
        `queue` other than the task's."""
        return TaskOptions(self, at, delay, key, queue)

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

    __slots__ = ("task", "at", "delay", "key", "queue")

    def __init__(self, task: Task[P, R], at: datetime | None = None,
                 delay: timedelta | float | None = None, key: str | None = None,
                 queue: str | None = None) -> None:
        self.task, self.at, self.delay, self.key, self.queue = task, at, delay, key, queue

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """Create one run with these arguments and the bound options; → its id."""
        return self.task._enqueuer.enqueue(self.task.spec, args, dict(kwargs), at=self.at,
                                           delay=self.delay, key=self.key, queue=self.queue)

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={getattr(self, k)!r}" for k in ("at", "delay", "key", "queue")
                         if getattr(self, k) is not None)
        return f"<duetime.TaskOptions {self.task.spec.name!r} {opts}>"


class Registry:
    def __init__(self) -> None:
        self._tasks: dict[str, TaskSpec] = {}

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

    def resolve(self, task: str | Callable[..., Any] | TaskSpec | Task[Any, Any]) -> TaskSpec:
        """A name, a task object, a TaskSpec, or the raw function `@app.task` decorated."""
        if isinstance(task, TaskSpec):
            return task
        if isinstance(task, str):
            return self.get(task)
        spec = getattr(task, "duetime_task", None)
        if isinstance(spec, TaskSpec):
            return spec
        raise UnknownTask(f"{task!r} is not a registered duetime task")

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def queues(self) -> list[str]:
        return sorted({s.queue for s in self._tasks.values()})
