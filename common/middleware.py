"""Middleware: hooks around a run's enqueue and around each of its attempts (`app.middleware`,
docs/integrations.md).

A middleware is any object with some of the hooks below, each sync or async:

    on_enqueue(request)             before a run is written (EnqueueInfo: headers may be added)
    after_enqueue(request, error)   after the write (error: None, or what the enqueue raised)
    before_attempt(run)             before the task body of an attempt (RunInfo)
    after_attempt(run, outcome, error)   after the attempt's outcome was handed to the reporter
    on_dead(run)                    the worker's report dead-lettered the run
    on_uncertain(run)               the worker's report left the run uncertain

Hooks run in registration order. One that raises is logged with the run id and changes
nothing the scripts decide; only `before_attempt` counts: one that raises fails that attempt
with its error (the task body does not run, the failure is retried like any other).

This module holds what producer and worker share; the worker's call site is
worker/middleware.py, the producer's is `App` (duetime/app.py).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from duetime.common.errors import InvalidInput
from duetime.common.logs import get as get_logger

log = get_logger("duetime.middleware")

HOOKS = ("on_enqueue", "after_enqueue", "before_attempt", "after_attempt", "on_dead",
         "on_uncertain")
# what a run carries for middleware (`headers` on the run record): bounded, so a hook cannot
# bloat every run record (and every claim reply, which carries them to the worker)
MAX_HEADERS = 16
MAX_HEADERS_BYTES = 2048  # the JSON stored on the run
HEADER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
NO_HEADERS: Mapping[str, str] = {}

# after_attempt's outcome: how the attempt ended in this worker (what the scripts then decided,
# a retry or a dead letter, is told by on_dead / the run's state)
SUCCEEDED, FAILED, CANCELLED, RELEASED, LEASE_LOST, INTERRUPTED = (
    "succeeded", "failed", "cancelled", "released", "lease_lost", "interrupted")


@dataclass(slots=True)
class EnqueueInfo:
    """What `on_enqueue` / `after_enqueue` see of one run being enqueued. `headers` may be
    changed by `on_enqueue` (names: letters, digits, `_.-`, up to 64; values: strings; at most
    16 headers and 2 KiB as stored): they are stored on the run (`headers`) and given to every
    attempt's hooks (`RunInfo.headers`). `state` is for the middleware's own use between its
    two hooks (keyed by the middleware, e.g. its span)."""

    run_id: str
    task: str
    queue: str
    tenant: str | None
    owner: str | None
    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    key: str | None = None
    priority: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    attempt: int = 0  # not started: 0
    schedule: str | None = None  # runs of schedules are made by the scheduler: no hooks
    state: dict[Any, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RunInfo:
    """What the attempt hooks see of a run: its context as the worker claimed it. `args` and
    `kwargs` are the task's decoded arguments (empty in on_dead / on_uncertain for a run whose
    body never ran here: a damaged record, an unreadable payload, a task this worker lacks; its
    `tenant` and `headers` are then unknown too: None and empty); `error` in on_dead /
    on_uncertain is the last attempt's error text as reported (None when it has none). `state`
    is for the middleware's own use across its hooks of one attempt."""

    run_id: str
    task: str
    queue: str
    attempt: int
    schedule: str | None
    tenant: str | None
    owner: str | None
    headers: Mapping[str, str]
    idempotency_key: str
    scheduled_at: datetime | None
    worker_id: str
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    state: dict[Any, Any] = field(default_factory=dict)


class Middleware:
    """An optional base class: every hook does nothing. Override the ones you need (a hook not
    overridden is never called, so it costs nothing)."""

    def on_enqueue(self, request: EnqueueInfo) -> Any:
        return None

    def after_enqueue(self, request: EnqueueInfo, error: BaseException | None) -> Any:
        return None

    def before_attempt(self, run: RunInfo) -> Any:
        return None

    def after_attempt(self, run: RunInfo, outcome: str, error: BaseException | None) -> Any:
        return None

    def on_dead(self, run: RunInfo) -> Any:
        return None

    def on_uncertain(self, run: RunInfo) -> Any:
        return None


Hook = Callable[..., Any]


def _name(obj: Any) -> str:
    return getattr(type(obj), "__qualname__", repr(obj))


class Chain:
    """The middleware registered with an app, as lists of bound hooks per hook name (a hook
    a middleware lacks, or inherits unchanged from `Middleware`, is not listed)."""

    def __init__(self) -> None:
        self.middleware: list[Any] = []
        self.hooks: dict[str, list[tuple[str, Hook]]] = {h: [] for h in HOOKS}

    def add(self, obj: Any) -> None:
        found = False
        for hook in HOOKS:
            fn = getattr(obj, hook, None)
            if fn is None:
                continue
            if not callable(fn):
                raise InvalidInput(f"middleware {_name(obj)}: {hook} is not callable")
            found = True
            if getattr(type(obj), hook, None) is getattr(Middleware, hook):
                continue  # the base class's no-op
            self.hooks[hook].append((_name(obj), fn))
        if not found:
            raise InvalidInput(f"middleware {_name(obj)} has none of the hooks "
                               f"{', '.join(HOOKS)}")
        self.middleware.append(obj)

    def __bool__(self) -> bool:
        return bool(self.middleware)

    def has(self, *hooks: str) -> bool:
        return any(self.hooks[h] for h in hooks)

    @property
    def for_worker(self) -> bool:
        return self.has("before_attempt", "after_attempt", "on_dead", "on_uncertain")

    @property
    def for_producer(self) -> bool:
        return self.has("on_enqueue", "after_enqueue")

    # -- calling --------------------------------------------------------------------------
    async def acall(self, hook: str, run_id: str, task: str, *args: Any, reraise: bool = False) -> None:
        """Every `hook`, in order, awaited when async. One that raises is logged with the run
        id; with `reraise` (before_attempt) the error stops the chain and is raised."""
        for name, fn in self.hooks[hook]:
            try:
                result = fn(*args)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                failed(hook, name, run_id, task, exc)
                if reraise:
                    raise

    def call(self, hook: str, run_id: str, task: str, *args: Any) -> None:
        """`acall` from synchronous code (the producer's `enqueue`): an async hook is run to
        its end on a loop of its own (asyncio.run); in a thread whose loop is running it cannot
        be, and is logged as failed."""
        for name, fn in self.hooks[hook]:
            try:
                result = fn(*args)
                if inspect.isawaitable(result):
                    try:
                        asyncio.get_running_loop()
                    except RuntimeError:
                        asyncio.run(_awaited(result))
                    else:
                        close = getattr(result, "close", None)
                        if close is not None:
                            close()
                        raise RuntimeError("an async hook cannot run in a synchronous enqueue "
                                           "called from a running event loop: use aenqueue")
            except Exception as exc:
                failed(hook, name, run_id, task, exc)


async def _awaited(aw: Any) -> None:
    await aw


def failed(hook: str, name: str, run_id: str, task: str, exc: BaseException) -> None:
    """A hook raised: said with the run id (its text bounded; a hook's error may quote data)."""
    log.error("middleware hook failed", hook=hook, middleware=name, run_id=run_id, task=task,
              error=f"{type(exc).__name__}: {str(exc)[:300]}")


def check_headers(headers: Any) -> str:
    """The headers as stored on the run (compact JSON; '' for none); InvalidInput if a hook
    left them out of bounds."""
    if not isinstance(headers, dict):
        raise InvalidInput(f"headers must be a dict of str to str, got {type(headers).__name__}")
    if not headers:
        return ""
    if len(headers) > MAX_HEADERS:
        raise InvalidInput(f"at most {MAX_HEADERS} headers, got {len(headers)}")
    for k, v in headers.items():
        if not isinstance(k, str) or not HEADER_NAME.fullmatch(k):
            raise InvalidInput(f"header name {k!r}: letters, digits and _.- (up to 64), first a "
                               "letter or digit")
        if not isinstance(v, str):
            raise InvalidInput(f"header {k!r}: the value must be a str, got {type(v).__name__}")
    text = json.dumps(headers, separators=(",", ":"), ensure_ascii=False)
    if len(text.encode()) > MAX_HEADERS_BYTES:
        raise InvalidInput(f"headers take {len(text.encode())} bytes as stored, more than "
                           f"{MAX_HEADERS_BYTES}")
    return text


def decode_headers(raw: bytes | str | None) -> Mapping[str, str]:
    """The run's headers as stored; a field damaged by hand reads as none (never fails)."""
    if not raw:
        return NO_HEADERS
    try:
        got = json.loads(raw)
    except ValueError:
        return NO_HEADERS
    if not isinstance(got, dict):
        return NO_HEADERS
    return {str(k): str(v) for k, v in got.items()}
