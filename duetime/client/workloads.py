"""Dependencies and batches, the producer side (docs/workloads.md).

One mechanism: a run created by hold.lua in state `waiting`, released (or cancelled) in the
same script call that ends the last run it waits for. `depends_on` gives a run its own
pending set; a batch gives its callbacks the batch's pending set. Every run of a batch -- its
members and its callbacks -- lives in the batch's partition (its id starts with the batch
id), so the batch is counted in one slot, atomically, on a single server and on Cluster
alike. A dependency in another partition is registered there by `link` (deps_link.lua) and
notifies through that partition's T:depnotes, applied by the relay (scheduler/relay.py, run by
the reaper) with deps_apply.lua.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from duetime.common import transitions as tr
from duetime.common.connection import refused, translated
from duetime.common.errors import (
    BatchWaitTimeout,
    InvalidInput,
    InvalidState,
    RunNotFound,
    UnknownDependency,
)
from duetime.common.keys import Keyspace
from duetime.common.names import check_name
from duetime.common.scripts import Scripts

HOLD_CHUNK = 200  # runs per hold.lua call
BATCH_ID = re.compile(r"^(b[0-9a-f]{20})\.")
CALLBACK_ROLES = ("on_complete", "on_success", "on_failure")
WAIT_POLL_S = 0.05


def batch_of(run_id: str) -> str | None:
    """The batch a run id belongs to: every member and callback id starts with it."""
    m = BATCH_ID.match(run_id)
    return m.group(1) if m else None


def new_batch_id() -> str:
    return "b" + os.urandom(10).hex()


@dataclass(frozen=True)
class Batch:
    """A batch as stored (app.get_batch). `failed` counts members that ended dead, cancelled,
    missed or skipped; `state` is 'open' until every member finished, then 'succeeded' or
    'failed' (and `cancelled` says whether cancel_batch was called). The callbacks' run ids
    are `on_complete_run`, `on_success_run`, `on_failure_run` (None: no such callback), also
    as the dict `callbacks`."""

    id: str
    state: str
    total: int
    succeeded: int
    failed: int
    created_ms: int
    finished_ms: int | None
    cancelled: bool
    on_complete_run: str | None
    on_success_run: str | None
    on_failure_run: str | None

    @property
    def pending(self) -> int:
        return self.total - self.succeeded - self.failed

    @property
    def finished(self) -> bool:
        return self.state in ("succeeded", "failed")

    @property
    def callbacks(self) -> dict[str, str]:
        return {role: rid for role, rid in zip(CALLBACK_ROLES, (
            self.on_complete_run, self.on_success_run, self.on_failure_run), strict=True)
            if rid is not None}

    @classmethod
    def decode(cls, batch_id: str, h: dict[bytes, bytes]) -> Batch:
        def s(name: str) -> str | None:
            v = h.get(name.encode())
            return v.decode() if v else None

        def n(name: str) -> int:
            try:
                return int(s(name) or 0)
            except ValueError:
                return 0

        return cls(batch_id, s("state") or "", n("total"), n("succeeded"), n("failed"),
                   n("created"), n("finished") or None, s("cancelled") is not None,
                   s("on_complete"), s("on_success"), s("on_failure"))


def _raise_refusal(url: str, exc: redis.ResponseError) -> None:
    msg = str(exc)
    if msg.startswith("UNKNOWN_DEPENDENCY"):
        raise UnknownDependency(msg.split(" ", 1)[1]) from None
    if msg.startswith("NO_BATCH"):
        raise RunNotFound(msg.split(" ", 1)[1]) from None
    if msg.startswith("BATCH_FINISHED"):
        raise InvalidState(msg.split(" ", 1)[1]) from None
    raise refused(url, exc) from None


class Workloads:
    """Waiting runs, chains and batches over one RunStore's connection."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.keys: Keyspace = store.keys
        self.scripts: Scripts = store.scripts

    # -- runs that wait ------------------------------------------------------------------
    def _held(self, pr: Any, role: str = "", mode: str | None = None) -> tr.Held:
        from duetime.client.runs import task_fields

        req_deps: tuple[str, ...] = pr.deps
        if mode is None:
            mode = ("finish" if pr.allow_failed else "succeed") if req_deps else ""
        entries = tuple(f"{self.keys.partition_of_run(d)}|{d}" for d in req_deps)
        return tr.Held(pr.run_id, role, mode, pr.due, pr.delay_ms, entries,
                       tuple(task_fields(pr.spec, pr.queue) + pr.fields))

    def _check_remote(self, held: list[tuple[int, tr.Held]]) -> None:
        """Dependencies in another partition than their dependent exist (read-only check;
        one in this partition is checked by hold.lua itself). Ids created by the same call
        count as existing."""
        ours = {h.run_id for _, h in held}
        remote = sorted({e.split("|", 1)[1] for p, h in held for e in h.deps
                         if int(e.split("|", 1)[0]) != p} - ours)
        if not remote:
            return
        pipe = self.store.client.pipeline(transaction=False)
        for d in remote:
            pipe.exists(self.keys.run(self.keys.partition_of_run(d), d))
        for d, found in zip(remote, pipe.execute(), strict=True):
            if not found:
                raise UnknownDependency(f"depends_on names {d!r}: no such run in namespace "
                                        f"{self.keys.namespace!r}; nothing was enqueued")

    def send(self, held: list[tuple[int, tr.Held]], batch_id: str = "", step: str = "",
             seal: bool = False) -> None:
        """hold.lua per partition, HOLD_CHUNK runs a call, in order; then the links of
        dependencies in other partitions."""
        client = self.store.ready()
        for d in (x for _, h in held for x in h.deps):
            check_name("dependency run id", d.split("|", 1)[1])
        with translated(self.store.url):
            self._check_remote(held)
            by_p: dict[int, list[tr.Held]] = {}
            for p, h in held:
                by_p.setdefault(p, []).append(h)
            for p, items in by_p.items():
                chunks = [items[i:i + HOLD_CHUNK] for i in range(0, len(items), HOLD_CHUNK)]
                for n, chunk in enumerate(chunks):
                    keys, args = tr.hold(self.keys, p, chunk, batch_id,
                                         step if n == 0 else ("add" if step else ""),
                                         seal and n == len(chunks) - 1)
                    try:
                        self.scripts.hold(keys=keys, args=args, client=client)
                    except redis.ResponseError as exc:
                        _raise_refusal(self.store.url, exc)
            for p, h in held:
                for e in h.deps:
                    dp_s, dep = e.split("|", 1)
                    if int(dp_s) != p:
                        self.link(p, h.run_id, int(dp_s), dep)

    def link(self, p: int, run_id: str, dp: int, dep: str) -> None:
        """Register waiting run `run_id` (partition p) with its dependency `dep` (partition
        dp); if that ended already, count it now. Then the link request is done."""
        client = self.store.client
        keys, args = tr.deps_link(self.keys, dp, dep, p, run_id)
        word, state = tr.status_detail(self.scripts.deps_link(keys=keys, args=args, client=client))
        if word in ("ended", "missing"):
            keys, args = tr.deps_apply(self.keys, p, [(run_id, dep, state or "missing")])
            self.scripts.deps_apply(keys=keys, args=args, client=client)
        client.lrem(self.keys.deplinks(p), 1, f"{dp}|{dep}|{run_id}")

    def enqueue_waiting(self, reqs: Iterable[Any]) -> list[str]:
        """Runs of which some have depends_on (EnqueueRequest), in order: their ids."""
        reqs = list(reqs)
        prepared = self.store._prepare_all(reqs)
        self.send([(pr.partition, self._held(_Dep(pr, r)))
                   for pr, r in zip(prepared, reqs, strict=True)])
        return [pr.run_id for pr in prepared]

    # -- batches ---------------------------------------------------------------------------
    def _members(self, batch_id: str, reqs: Sequence[Any]) -> list[tuple[int, tr.Held]]:
        p = self.keys.partition_of_run(batch_id)
        for r in reqs:
            if r.tenant is not None or r.spec.tenant is not None:
                raise InvalidInput("a batch's runs live in the batch's partition; a run for a "
                                   "tenant lives in its tenant's: a batch member cannot have "
                                   "a tenant")
        prepared = self.store._prepare_all(reqs)
        out = []
        for pr, r in zip(prepared, reqs, strict=True):
            rid = self.keys.pin_run_id(f"{batch_id}.{pr.run_id}", p)
            out.append((p, self._held(_Dep(pr._replace(run_id=rid, partition=p), r),
                                      role="member")))
        return out

    def batch(self, batch_id: str, members: Sequence[Any],
              callbacks: dict[str, Any]) -> str:
        """members: EnqueueRequests; callbacks: role -> EnqueueRequest."""
        p = self.keys.partition_of_run(batch_id)
        cbs = []
        for role, req in callbacks.items():
            [pr] = self.store._prepare_all([req])
            rid = self.keys.pin_run_id(f"{batch_id}.{role}", p)
            cbs.append((p, self._held(_Dep(pr._replace(run_id=rid, partition=p), req),
                                      role=role, mode="batch")))
        self.send(cbs + self._members(batch_id, members), batch_id, "open", seal=True)
        return batch_id

    def batch_add(self, batch_id: str, members: Sequence[Any]) -> list[str]:
        held = self._members(batch_id, members)
        self.send(held, batch_id, "add")
        return [h.run_id for _, h in held]

    def get_batch(self, batch_id: str) -> Batch:
        check_name("batch id", batch_id)
        p = self.keys.partition_of_run(batch_id)
        with translated(self.store.url):
            h = self.store.ready().hgetall(self.keys.batch(p, batch_id))
        if not h:
            raise RunNotFound(f"no batch {batch_id!r} in namespace {self.keys.namespace!r}")
        return Batch.decode(batch_id, h)

    def members(self, batch_id: str, limit: int = 1000) -> list[str]:
        p = self.keys.partition_of_run(batch_id)
        with translated(self.store.url):
            raw = self.store.ready().zrange(self.keys.bmembers(p, batch_id), 0, limit - 1)
        return [m.decode() for m in raw]

    def list_batches(self, limit: int = 100) -> list[Batch]:
        client = self.store.ready()
        with translated(self.store.url):
            pipe = client.pipeline(transaction=False)
            for p in range(self.keys.partitions):
                pipe.zrange(self.keys.batches(p), 0, limit - 1, desc=True)
            ids = [(p, b.decode()) for p, got in enumerate(pipe.execute()) for b in got]
            pipe = client.pipeline(transaction=False)
            for p, b in ids:
                pipe.hgetall(self.keys.batch(p, b))
            out = [Batch.decode(b, h) for (_, b), h in zip(ids, pipe.execute(), strict=True) if h]
        out.sort(key=lambda b: b.created_ms, reverse=True)
        return out[:limit]

    def wait_batch(self, batch_id: str, timeout: float | None = None) -> Batch:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            b = self.get_batch(batch_id)
            if b.finished or (deadline is not None and time.monotonic() >= deadline):
                if not b.finished:
                    raise _timeout(b, timeout)
                return b
            time.sleep(WAIT_POLL_S)

    async def await_batch(self, batch_id: str, timeout: float | None = None) -> Batch:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            b = await asyncio.to_thread(self.get_batch, batch_id)
            if b.finished:
                return b
            if deadline is not None and time.monotonic() >= deadline:
                raise _timeout(b, timeout)
            await asyncio.sleep(WAIT_POLL_S)

    def cancel_batch(self, batch_id: str, reason: str = "batch cancelled") -> tuple[int, int, int]:
        """→ (members cancelled, running members asked to stop, callbacks cancelled)."""
        check_name("batch id", batch_id)
        p = self.keys.partition_of_run(batch_id)
        keys, args = tr.batch_cancel(self.keys, p, batch_id, reason)
        with translated(self.store.url):
            try:
                a, b, c = tr.counts(self.scripts.batch_cancel(keys=keys, args=args,
                                                              client=self.store.ready()))
            except redis.ResponseError as exc:
                _raise_refusal(self.store.url, exc)
                raise
        return a, b, c


@dataclass(frozen=True)
class _Dep:
    """A prepared run with its request's dependency options."""

    pr: Any
    req: Any

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pr, name)

    @property
    def deps(self) -> tuple[str, ...]:
        return tuple(self.req.depends_on or ())

    @property
    def allow_failed(self) -> bool:
        return bool(self.req.allow_failed_dependencies)


def _timeout(b: Batch, timeout: float | None) -> BatchWaitTimeout:
    return BatchWaitTimeout(f"batch {b.id} still has {b.pending} of {b.total} members "
                            f"unfinished after {timeout} s", b)
