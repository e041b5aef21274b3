"""Process isolation: attempts of tasks declared `@app.task(isolation="process")` run in a
child process the worker can kill, so a hard timeout and a memory cap are real.

- **The pool.** Up to `--concurrency` children per worker process, started when first needed
  and reused across attempts (one child runs one attempt at a time); a child killed or dead is
  dropped and the next attempt starts a new one. Children are started with `subprocess`
  (fork + exec of a fresh interpreter, `python -m duetime.worker.isolation_child`), never a
  bare `fork()` of the worker: the worker has threads (the sync-task pool, the enqueue
  helper, redis-py's), and a forked copy of a threaded process may inherit a lock some other
  thread held. A fresh interpreter is what multiprocessing's "spawn" context makes, without its
  pickle-based protocol: the child imports the app the way `duetime worker --app` does (the
  worker's `app_ref`, never a name read from Redis) and runs only tasks that app registered.
- **The protocol.** A socket pair: length-prefixed msgpack frames (worker/isolation_child.py).
  The worker sends the task name, the run's msgpack payload and what `current_run()` shows;
  the child answers with the result packed as the run stores it, or the exception as its
  kind (retry, fatal, error), type name, message and traceback text. `Retry` (with its delay)
  and `Fatal` raised in the child are raised again in the worker as subclasses of `Retry` and
  `Fatal` carrying the child's type name, so they behave as in a thread. Task output on stdout
  and stderr goes where the worker's goes.
- **Timeout and memory.** The worker keeps the lease and heartbeats as for any attempt (the
  event loop only awaits the child's reply). Past the task's timeout the child gets SIGTERM,
  then SIGKILL after `kill_grace_s` (`--kill-grace`, default 5 s); the attempt fails with
  "timed out after <timeout>" once the child is gone, and the run retries by its policy.
  While it waits the worker reads the child's resident set size from /proc/<pid>/statm every
  `POLL_S`; past `--max-task-memory` it is killed the same way and the attempt fails with
  "exceeded memory limit". A child that dies on its own fails the attempt with its exit code.
  A lost lease, a cancel request or the end of the shutdown grace kill the child too.
- **Long runs and back-pressure across the boundary.** The request carries the run's
  checkpoint (`checkpoint_state` in the child). While the attempt runs, the child may send
  `{"op": "checkpoint"}` and `{"op": "progress"}` frames before its reply: a checkpoint is
  written here, by this worker, with the attempt's fence (the same `Checkpoints.write` a
  thread's checkpoint reaches, so a stale attempt is refused by checkpoint.lua and sees
  `lease_lost`), and answered; progress is kept on the attempt's RunContext for the next
  heartbeat. A write in flight does not stop the timeout and memory checks (it runs as its
  own task). `Continue` (delay, packed state), `RateLimited` (retry_after, scope), `Retry`
  and `Fatal` come back as their kind and are raised here as those classes, so the worker
  continues, holds, retries or dead-letters the run exactly as for a thread. The child never
  writes the run's state to Redis: it has the fence number (in `current_run()`) but no
  connection that uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
from duetime.common.codec import CHECKPOINT_MAX_BYTES, pack_checkpoint, pack_payload
from duetime.common.context import RunContext
from duetime.common.errors import RATE_SCOPES, Continue, Fatal, InvalidInput, RateLimited, Retry
from duetime.common.isolation import (
    HardTimeout,
    MemoryLimitExceeded,
    TaskProcessCrashed,
    TaskProcessStartFailed,
)
from duetime.common.logs import get as get_logger
from duetime.common.tasks import Registry

log = get_logger("duetime.worker")

POLL_S = 0.05  # how often a busy child's memory is read
START_TIMEOUT_S = 120.0  # a child that has not imported the app by then failed to start
_HEAD_SIZE = 4
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "ki": 1024,
          "m": 1000**2, "mb": 1000**2, "mib": 1024**2, "mi": 1024**2,
          "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "gi": 1024**3,
          "t": 1000**4, "tb": 1000**4, "tib": 1024**4, "ti": 1024**4}
MIN_MEMORY = 16 * 1024**2


def parse_size(text: str, what: str = "--max-task-memory") -> int:
    """'512MiB', '1.5GiB', '800MB', '1000000' (bytes) → bytes; at least 16 MiB."""
    m = _SIZE.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise InvalidInput(f"{what} must be a size such as 512MiB, 2GiB or 800MB, got {text!r}")
    n = int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
    if n < MIN_MEMORY:
        raise InvalidInput(f"{what} must be at least 16MiB, got {text!r}")
    return n


def format_size(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.4g}{unit}"
    return f"{n}B"


def rss_bytes(pid: int) -> int | None:
    """The resident set size of `pid` (Linux /proc), None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


_REMOTE: dict[tuple[str, str], type[Exception]] = {}


def remote_error(reply: dict[str, Any]) -> Exception:
    """The child's exception, raised again in the worker: a subclass of Retry, Fatal,
    Continue, RateLimited or Exception named as the child's type (only its name is taken from
    the child), carrying the child's traceback text for the run record (worker/errors.py reads
    `remote_traceback`) and what the worker reads of its kind (a Retry's delay, a Continue's
    delay and packed state, a RateLimited's retry_after and scope). A Continue or RateLimited
    whose fields are not what the child's classes make is a plain failure."""
    kind, name = str(reply.get("kind")), str(reply.get("type") or "Exception")[:100]
    if not name.isidentifier():
        name = "Exception"
    base: type[Exception] = {"retry": Retry, "fatal": Fatal, "continue": Continue,
                             "rate_limited": RateLimited}.get(kind, Exception)
    fields: dict[str, Any] = {}
    if base is Continue:
        ms, state = _ms(reply.get("delay_ms")), reply.get("state")
        if ms is None or not (state is None or isinstance(state, bytes)
                               and len(state) <= CHECKPOINT_MAX_BYTES):
            base, kind = Exception, "error"
        else:
            fields = {"delay_ms": ms, "delay": ms / 1000 if ms else None, "state": None,
                      "state_bytes": state}
    elif base is RateLimited:
        ms, scope = _ms(reply.get("retry_after_ms")), reply.get("scope")
        if ms is None or ms < 1 or scope not in RATE_SCOPES:
            base, kind = Exception, "error"
        else:
            fields = {"retry_after_ms": ms, "retry_after": ms / 1000, "scope": scope}
    elif base is Retry:
        ms = _ms(reply.get("delay_ms"))
        fields = {"delay_ms": ms, "delay": None if ms is None else ms / 1000}
    cls = _REMOTE.get((kind, name))
    if cls is None:
        if len(_REMOTE) > 1000:
            _REMOTE.clear()
        cls = _REMOTE[(kind, name)] = type(name, (base,), {"__module__": "duetime.child"})
    exc = cls.__new__(cls)
    exc.args = (str(reply.get("msg", "")),)
    for attr, value in fields.items():
        setattr(exc, attr, value)
    exc.remote_traceback = str(reply.get("tb", ""))  # type: ignore[attr-defined]
    exc.remote_frames = str(reply.get("frames", ""))  # type: ignore[attr-defined]
    return exc


def _ms(x: Any) -> int | None:
    """A whole number of milliseconds >= 0 from the child, or None."""
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else None


@dataclass(eq=False)
class Child:
    proc: subprocess.Popen[bytes]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    attempts: int = 0
    started: float = field(default_factory=time.monotonic)
    ended: bool = False  # being killed, or gone: no longer counted in the pool

    @property
    def pid(self) -> int:
        return self.proc.pid


class ProcessPool:
    """The worker's child processes for process-isolated tasks (see the module docstring)."""

    def __init__(self, app_ref: str, url: str | None, namespace: str | None, size: int,
                 kill_grace_s: float = 5.0, max_memory: int | None = None,
                 max_payload: int = 512 * 1024, max_result: int = 512 * 1024) -> None:
        self.app_ref, self.url, self.namespace, self.size = app_ref, url, namespace, size
        self.kill_grace_s, self.max_memory = kill_grace_s, max_memory
        self.max_payload, self.max_result = max_payload, max_result
        self._idle: list[Child] = []
        self._count = 0  # children alive or starting
        self._freed = asyncio.Condition()
        self.started = 0  # children started, over the pool's life
        self.ended = 0  # children killed or dead (timeout, memory, crash, lease lost, cancel)
        self.busy: dict[int, Child] = {}  # pid -> child running an attempt

    @classmethod
    def for_worker(cls, registry: Registry, cfg: Any, url: str, namespace: str
                   ) -> ProcessPool | None:
        """The pool a worker needs: None when no task it registers is process-isolated."""
        isolated = [n for n in registry.names() if registry.get(n).isolation == "process"]
        if not isolated:
            return None
        if not cfg.app_ref:
            raise InvalidInput(f"task {isolated[0]!r} runs in a child process (isolation="
                               "'process'): the worker needs app_ref, the 'module:attribute' "
                               "of the App (what `duetime worker --app` names)")
        if cfg.max_task_memory is not None and rss_bytes(os.getpid()) is None:
            raise InvalidInput("--max-task-memory needs /proc/<pid>/statm (Linux)")
        return cls(cfg.app_ref, url, namespace, cfg.concurrency, cfg.kill_grace_s,
                   cfg.max_task_memory, max_result=cfg.max_result)

    # -- children -------------------------------------------------------------------------
    async def _spawn(self) -> Child:
        ours, theirs = socket.socketpair()
        argv = [sys.executable, "-m", "duetime.worker.isolation_child", "--fd",
                str(theirs.fileno()), "--app", self.app_ref]
        if self.url:
            argv += ["--url", self.url]
        if self.namespace:
            argv += ["--namespace", self.namespace]
        env = dict(os.environ)
        # the worker's import path (it may have put the working directory on it, as --app does)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [os.getcwd(), *sys.path] if p)
        try:
            proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), env=env,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            theirs.close()
        ours.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=ours, limit=2**20)
        child = Child(proc, reader, writer)
        try:
            hello = await asyncio.wait_for(_read(reader), START_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError, OSError, ValueError) as exc:
            await self._kill(child)
            raise TaskProcessStartFailed(f"the child process did not start: {_why(exc, proc)}") from None
        except BaseException:
            await asyncio.shield(self._kill(child))
            raise
        if not hello.get("ready"):
            await self._kill(child)
            raise TaskProcessStartFailed(f"the child process could not load {self.app_ref!r}: "
                                   f"{hello.get('error', '?')}")
        self.started += 1
        log.info("task process started", pid=proc.pid, app=self.app_ref)
        return child

    async def _acquire(self) -> Child:
        async with self._freed:
            while True:
                while not self._idle and self._count >= self.size:
                    await self._freed.wait()
                if not self._idle:
                    break
                child = self._idle.pop()
                if child.proc.poll() is None:
                    return child
                # it died while idle (the OOM killer, an operator's kill): replaced
                log.warning("idle task process found dead; replacing it", pid=child.pid,
                            exit_code=child.proc.returncode)
                child.ended = True
                child.writer.close()
                self._count -= 1
            self._count += 1
        try:
            return await self._spawn()
        except BaseException:
            await self._gone()
            raise

    async def _release(self, child: Child) -> None:
        async with self._freed:
            self._idle.append(child)
            self._freed.notify()

    async def _gone(self) -> None:
        async with self._freed:
            self._count -= 1
            self._freed.notify()

    async def _kill(self, child: Child) -> int | None:
        """SIGTERM, SIGKILL after the grace (at once with a grace of 0), to the child's process
        group (it leads its own session: processes the task started go too); → its exit code
        once it is gone."""
        proc = child.proc
        if self.kill_grace_s > 0 and proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + self.kill_grace_s
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        _signal_group(proc, signal.SIGKILL)  # the leader, if still there, and any stragglers
        while proc.poll() is None:
            await asyncio.sleep(0.01)
        child.writer.close()
        return proc.returncode

    async def _end(self, child: Child, why: str) -> int | None:
        if child.ended:  # already on its way out (a cancel arrived during its kill)
            return await self._kill(child)
        child.ended = True
        self.ended += 1
        try:
            code = await self._kill(child)
        finally:
            await self._gone()
        log.warning("task process killed", pid=child.pid, why=why, exit_code=code)
        return code

    # -- attempts -------------------------------------------------------------------------
    async def call(self, ctx: RunContext, task: str, args: list[Any], kwargs: dict[str, Any],
                   timeout: float | None, store: bool) -> tuple[bytes | None, str | None]:
        """Run one attempt in a child; → (the return value packed as the run stores it, or
        None; why it could not be packed, or None), or raise what it raised (`remote_error`),
        HardTimeout, MemoryLimitExceeded, TaskProcessCrashed or TaskProcessStartFailed. Returns only once
        the child is idle again or gone."""
        payload = pack_payload(args, kwargs, self.max_payload)
        state = None if ctx.checkpoint_state is None else pack_checkpoint(ctx.checkpoint_state)
        child = await self._acquire()
        req = {"task": task, "payload": payload, "limit": self.max_payload, "store": store,
               "max_result": self.max_result,
               "ctx": {"run_id": ctx.run_id, "task": ctx.task, "queue": ctx.queue,
                       "attempt": ctx.attempt, "fence": ctx.fence, "worker_id": ctx.worker_id,
                       "key": ctx.idempotency_key, "schedule": ctx.schedule,
                       "due_ms": _to_ms(ctx.scheduled_at),
                       "interval_start_ms": _to_ms(ctx.interval_start),
                       "interval_end_ms": _to_ms(ctx.interval_end), "checkpoint": state}}
        self.busy[child.pid] = child
        child.attempts += 1
        try:
            reply = await self._exchange(child, req, timeout, ctx)
        finally:
            self.busy.pop(child.pid, None)
        if reply.get("lost_seen"):  # the task saw lease_lost (a refused checkpoint) in the child
            ctx.mark_lost()
            _ = ctx.lease_lost  # noted as seen here too: its return proves nothing
        if reply.get("ok"):
            result, why = reply.get("result"), reply.get("not_stored")
            return (result if isinstance(result, bytes) else None,
                    None if why is None else str(why))
        raise remote_error(reply)

    async def _exchange(self, child: Child, req: dict[str, Any], timeout: float | None,
                        ctx: RunContext) -> dict[str, Any]:
        data: bytes = msgpack.packb(req, use_bin_type=True)
        started = time.monotonic()
        reading: asyncio.Task[dict[str, Any]] | None = None
        writes: set[asyncio.Task[None]] = set()  # checkpoints the child asked for, in flight
        try:
            child.writer.write(len(data).to_bytes(_HEAD_SIZE, "big") + data)
            await child.writer.drain()
            reading = asyncio.ensure_future(_read(child.reader))
            while True:
                left = None if timeout is None else timeout - (time.monotonic() - started)
                if left is not None and left <= 0:
                    await self._end(child, "timeout")
                    raise HardTimeout(f"timed out after {timeout:g}s (task process killed)")
                wait = POLL_S if self.max_memory else left
                if wait is not None and left is not None:
                    wait = min(wait, left)
                done, _ = await asyncio.wait({reading}, timeout=wait)
                if done:
                    msg = reading.result()
                    if "op" not in msg:
                        break  # the attempt's reply
                    self._request(ctx, child, msg, writes)
                    reading = asyncio.ensure_future(_read(child.reader))
                    continue
                if self.max_memory:
                    rss = rss_bytes(child.pid)
                    if rss is not None and rss > self.max_memory:
                        await self._end(child, "memory")
                        raise MemoryLimitExceeded(
                            f"exceeded memory limit of {format_size(self.max_memory)} "
                            f"(resident {format_size(rss)}; task process killed)")
            reply = reading.result()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            code = await self._end(child, "died")
            raise TaskProcessCrashed(f"the task process exited during the attempt ({_code(code)}; "
                               f"{type(exc).__name__})") from None
        except asyncio.CancelledError:
            # lease lost, cancel requested, shutdown: the body must stop, so the child goes
            await asyncio.shield(self._end(child, "stopped"))
            raise
        finally:
            for w in writes:  # a child that replied waited for its checkpoint: none is left
                w.cancel()
            if reading is not None:
                if not reading.done():
                    reading.cancel()
                elif not reading.cancelled():
                    reading.exception()  # retrieved: the child's end was handled above
        await self._release(child)
        return reply

    def _request(self, ctx: RunContext, child: Child, msg: dict[str, Any],
                 writes: set[asyncio.Task[None]]) -> None:
        """A frame the child sent before its reply: progress (kept for the next heartbeat)
        or a checkpoint (written, then answered, as a task of its own)."""
        op = msg.get("op")
        if op == "progress":
            if (msg.get("run_id"), msg.get("fence")) != (ctx.run_id, ctx.fence):
                return  # not this attempt's (the child sends none after a reply: a safeguard)
            try:
                body = json.loads(msg.get("body") or "{}")
                ctx.progress(body.get("done"), body.get("total"), body.get("note"))
            except (ValueError, TypeError, AttributeError, InvalidInput) as exc:
                log.warning("task process sent unreadable progress; ignored", run_id=ctx.run_id,
                            pid=child.pid, error=f"{type(exc).__name__}: {str(exc)[:200]}")
        elif op == "checkpoint":
            w = asyncio.ensure_future(self._checkpoint(ctx, child, msg.get("data")))
            writes.add(w)
            w.add_done_callback(writes.discard)
        else:
            log.warning("task process sent an unknown request; ignored", run_id=ctx.run_id,
                        pid=child.pid, op=str(op)[:40])

    async def _checkpoint(self, ctx: RunContext, child: Child, data: Any) -> None:
        answer: dict[str, Any]
        if not isinstance(data, bytes):
            answer = {"error": "checkpoint data is not bytes", "kind": "error"}
        else:
            try:
                answer = {"stored": await ctx.store_checkpoint(data)}
            except RuntimeError as exc:  # no writer bound: not run by a Worker
                answer = {"error": str(exc), "kind": "unbound"}
            except TimeoutError as exc:
                answer = {"error": f"{type(exc).__name__}: {exc}", "kind": "timeout"}
            except Exception as exc:  # noqa: BLE001 - said to the task, which decides
                answer = {"error": f"{type(exc).__name__}: {exc}"[:500], "kind": "error"}
        frame: bytes = msgpack.packb(answer, use_bin_type=True)
        try:
            child.writer.write(len(frame).to_bytes(_HEAD_SIZE, "big") + frame)
            await child.writer.drain()
        except (ConnectionError, OSError):
            pass  # the child is gone: its end is handled by the attempt

    def close(self) -> None:
        """At worker shutdown: idle children end when their socket closes; busy ones (the
        grace period ran out) are killed."""
        for child in self._idle:
            child.writer.close()
            child.ended = True
        self._count -= len(self._idle)
        self._idle.clear()
        for child in list(self.busy.values()):
            _signal_group(child.proc, signal.SIGKILL)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """`sig` to the child's process group (its pid: it leads its own session); to the child
    alone if the group is gone."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            if proc.poll() is None:
                proc.send_signal(sig)


async def _read(reader: asyncio.StreamReader) -> dict[str, Any]:
    head = await reader.readexactly(_HEAD_SIZE)
    size = int.from_bytes(head, "big")
    if size > 1 << 30:
        raise ValueError(f"frame of {size} bytes")
    msg = msgpack.unpackb(await reader.readexactly(size), raw=False, strict_map_key=False)
    if not isinstance(msg, dict):
        raise ValueError("frame is not a map")
    return msg


def _to_ms(t: Any) -> int | None:
    return None if t is None else int(t.timestamp() * 1000)


def _code(code: int | None) -> str:
    if code is None:
        return "exit code unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _why(exc: BaseException, proc: subprocess.Popen[bytes]) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {START_TIMEOUT_S:g}s"
    return f"it exited ({_code(proc.poll())})"
