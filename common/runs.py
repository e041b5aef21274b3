"""Creating and reading runs (the synchronous client side of the lifecycle)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import redis

from common.codec import DEFAULT_MAX_PAYLOAD, pack_payload
from common.connection import ensure_meta, sync_client, unavailable
from common.errors import InvalidInput, RunNotFound
from common.keys import Keyspace
from common.models import Run, to_ms
from common.names import check_name
from common.scripts import Scripts
from common.tasks import TaskSpec

PIPELINE_CHUNK = 1000


def new_run_id() -> str:
    return os.urandom(10).hex()


def keyed_run_id(task: str, key: str) -> str:
    """An idempotency key maps to one run id per task, so a repeat finds the first run."""
    return "k" + hashlib.sha256(f"{task}\0{key}".encode()).hexdigest()[:24]


@dataclass
class EnqueueRequest:
    spec: TaskSpec
    args: Sequence[Any] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    at: datetime | None = None
    delay: timedelta | float | None = None
    key: str | None = None
    queue: str | None = None
    run_id: str | None = None
    extra: dict[str, str | int] = field(default_factory=dict)


class RunStore:
    def __init__(
        self,
        url: str,
        keys: Keyspace,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        retention_ms: int = 24 * 3600 * 1000,
    ) -> None:
        self.url, self.keys, self.max_payload = url, keys, max_payload
        self.retention_ms = retention_ms
        self.client = sync_client(url)
        self._ready = False
        self.scripts = Scripts(self.client)

    def ready(self) -> redis.Redis:
        if not self._ready:
            ensure_meta(self.client, self.keys, self.url)
            self._ready = True
        return self.client

    # -- enqueue ------------------------------------------------------------------
    def _prepare(self, req: EnqueueRequest) -> tuple[str, list[str], list[Any]]:
        spec = req.spec
        queue = check_name("queue", spec.queue if req.queue is None else req.queue)
        if req.key is not None:
            check_name("idempotency key", req.key)
        if req.at is not None and req.delay is not None:
            raise InvalidInput("give either at= or delay=, not both")
        payload = pack_payload(req.args, req.kwargs, self.max_payload)
        run_id = req.run_id or (keyed_run_id(spec.name, req.key) if req.key else new_run_id())
        p = self.keys.partition_of_run(run_id)
        if req.at is not None:
            due, delay_ms = str(to_ms(req.at)), 0
        else:
            d = req.delay or 0
            delay_ms = int((d.total_seconds() if isinstance(d, timedelta) else float(d)) * 1000)
            if delay_ms < 0:
                raise InvalidInput(f"delay must not be negative, got {delay_ms} ms")
            due = ""
        fields: list[Any] = [
            "task", spec.name, "queue", queue, "payload", payload,
            "max_attempts", spec.max_attempts,
            "backoff_base", int(spec.backoff[0] * 1000), "backoff_max", int(spec.backoff[1] * 1000),
            "timeout", int((spec.timeout or 0) * 1000), "idempotent", int(spec.idempotent),
        ]
        if spec.owner:
            fields += ["owner", spec.owner]
        if req.key:
            fields += ["key", req.key]
        for k, v in req.extra.items():
            fields += [k, v]
        keys = [self.keys.run(p, run_id), self.keys.due(p, queue), self.keys.events(p)]
        args = [run_id, due, delay_ms, self.keys.wake_channel, f"{p}|{queue}", *fields]
        return run_id, keys, args

    def enqueue(self, req: EnqueueRequest) -> str:
        run_id, keys, args = self._prepare(req)
        client = self.ready()
        try:
            self.scripts.enqueue(keys=keys, args=args, client=client)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise unavailable(self.url, exc) from None
        return run_id

    def enqueue_many(self, reqs: Iterable[EnqueueRequest]) -> list[str]:
        """Validates everything first (nothing is written if one request is bad), then
        sends pipelined chunks: one round trip per PIPELINE_CHUNK runs."""
        prepared = [self._prepare(r) for r in reqs]
        client = self.ready()
        try:
            for i in range(0, len(prepared), PIPELINE_CHUNK):
                pipe = client.pipeline(transaction=False)
                for _, keys, args in prepared[i : i + PIPELINE_CHUNK]:
                    self.scripts.enqueue(keys=keys, args=args, client=pipe)
                pipe.execute()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise unavailable(self.url, exc) from None
        return [run_id for run_id, _, _ in prepared]

    # -- read -------------------------------------------------------------------------
    def get_run(self, run_id: str) -> Run:
        check_name("run id", run_id)
        p = self.keys.partition_of_run(run_id)
        client = self.ready()
        try:
            pipe = client.pipeline(transaction=False)
            pipe.hgetall(self.keys.run(p, run_id))
            pipe.lrange(self.keys.attempts(p, run_id), 0, -1)
            h, attempts = pipe.execute()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise unavailable(self.url, exc) from None
        if not h:
            raise RunNotFound(f"no run {run_id!r} in namespace {self.keys.namespace!r}")
        return Run.decode(h, attempts)

    def close(self) -> None:
        self.client.close()
