"""Task specifications and the registry that resolves task names to code.

Workers execute only what their own registry knows: a name read from Redis is looked up
here, never imported.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

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

    def resolve(self, task: str | Callable[..., Any] | TaskSpec) -> TaskSpec:
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
