"""The application object: task registry plus the client-side API (enqueue, inspect)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from common.codec import DEFAULT_MAX_PAYLOAD
from common.connection import DEFAULT_URL
from common.keys import Keyspace
from common.models import Run
from common.runs import EnqueueRequest, RunStore
from common.tasks import Registry, TaskSpec

F = TypeVar("F", bound=Callable[..., Any])
TaskRef = str | Callable[..., Any] | TaskSpec


class App:
    """`app = App(redis_url=...)`; decorate tasks with `@app.task(...)`; enqueue and inspect."""

    def __init__(
        self,
        redis_url: str | None = None,
        namespace: str | None = None,
        partitions: int = 16,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        retention: timedelta = timedelta(days=1),
    ) -> None:
        self.redis_url = redis_url or os.environ.get("DUETIME_REDIS_URL") or DEFAULT_URL
        self.keys = Keyspace(namespace or os.environ.get("DUETIME_NAMESPACE") or "duetime",
                             partitions)
        self.max_payload = max_payload
        self.retention_ms = int(retention.total_seconds() * 1000)
        self.registry = Registry()
        self._store: RunStore | None = None

    @property
    def store(self) -> RunStore:
        if self._store is None:
            self._store = RunStore(self.redis_url, self.keys, self.max_payload, self.retention_ms)
        return self._store

    def configure(self, redis_url: str | None = None, namespace: str | None = None) -> None:
        """Point an already-imported app at another server or namespace (CLI overrides)."""
        if redis_url:
            self.redis_url = redis_url
        if namespace:
            self.keys = Keyspace(namespace, self.keys.partitions)
        if self._store is not None:
            self._store.close()
            self._store = None

    def task(
        self,
        fn: F | None = None,
        *,
        name: str | None = None,
        queue: str = "default",
        retries: int = 3,
        backoff: tuple[float, float] = (1.0, 300.0),
        timeout: float | None = None,
        idempotent: bool = True,
        owner: str | None = None,
    ) -> Any:
        def register(f: F) -> F:
            spec = TaskSpec(
                name=f"{f.__module__}.{f.__qualname__}" if name is None else name, fn=f, queue=queue,
                retries=retries, backoff=backoff, timeout=timeout, idempotent=idempotent,
                owner=owner,
            )
            self.registry.add(spec)
            f.duetime_task = spec  # type: ignore[attr-defined]
            return f

        return register(fn) if fn is not None else register

    def enqueue(
        self,
        task: TaskRef,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        at: datetime | None = None,
        delay: timedelta | float | None = None,
        key: str | None = None,
        queue: str | None = None,
    ) -> str:
        """Create one run; returns its id. A repeated `key` returns the first run's id."""
        req = EnqueueRequest(self.registry.resolve(task), args, kwargs or {}, at, delay, key, queue)
        return self.store.enqueue(req)

    def enqueue_many(self, items: Iterable[dict[str, Any] | tuple]) -> list[str]:
        """Bulk enqueue, pipelined. Items are dicts of `enqueue`'s arguments or
        `(task, args)` / `(task, args, kwargs)` tuples."""
        reqs = []
        for it in items:
            if isinstance(it, dict):
                d = dict(it)
                d["spec"] = self.registry.resolve(d.pop("task"))
                d.setdefault("kwargs", {})
                reqs.append(EnqueueRequest(**d))
            else:
                task, *rest = it
                reqs.append(EnqueueRequest(self.registry.resolve(task), *rest))
        return self.store.enqueue_many(reqs)

    def get_run(self, run_id: str) -> Run:
        return self.store.get_run(run_id)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
