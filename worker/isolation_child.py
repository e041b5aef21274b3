"""The child process of a process-isolated task (`isolation="process"`, worker/isolation.py).

Started by the worker as `python -m duetime.worker.isolation_child --fd N --app module:attr
[--url U] [--namespace NS]`: it imports the app exactly as `duetime worker --app` does (the
operator's configuration, never a name read from Redis), then serves attempts one at a time
over the socket on fd N until the worker closes it. Each request names a task registered in
that app and carries its msgpack payload; the reply is msgpack too (the task's result, or the
exception as kind, type name, message and traceback text). Nothing is pickled either way.

Frames are a 4-byte big-endian length and a msgpack map (see `read_frame` / `write_frame`).

`current_run()` in the child is a `ChildRun`: what a thread's RunContext offers, with its
long-run calls carried to the worker over the same socket, so the child never writes run
state to Redis itself (the worker keeps the lease, the fence and the only connection that
writes the run; the child's app is configured with the worker's URL only for what a task does
with it, such as enqueueing or `batch_add`):

- `checkpoint(state)` / `await acheckpoint(state)`: packed (and size-checked) here, sent as
  `{"op": "checkpoint", "data": ...}`; the worker writes it with the attempt's fence
  (worker/checkpoints.py, checkpoint.lua) and answers `{"stored": true|false}` (or the error
  its write met); a refusal raises CheckpointRefused here and sets `lease_lost`, as in a
  thread. One checkpoint at a time (a lock), so a reply always meets the call that asked.
- `progress(done, total, note)`: kept here and sent as `{"op": "progress", "body": JSON}` by a
  flusher thread at most every PROGRESS_EVERY_S, and before any checkpoint and the attempt's
  reply, so the last one always arrives; the worker's next heartbeat carries it as for a
  thread (no frame per call: a task may report in a tight loop).
- The attempt starts from the run's checkpoint (`checkpoint_state`), sent in the request.
- `Continue`, `RateLimited`, `Retry` and `Fatal` are reported as their kind with what the
  worker needs (delay, state, scope), and raised again there (worker/isolation.py
  `remote_error`): the run is continued, held or retried exactly as from a thread.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import importlib
import inspect
import os
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgpack
from duetime.common.codec import pack_checkpoint, unpack_checkpoint
from duetime.common.context import RunContext

MAX_FRAME = 1 << 30
PROGRESS_EVERY_S = 0.05  # progress is sent to the worker at most this often (the last always)
_HEAD = struct.Struct(">I")


def write_frame(sock: socket.socket, msg: dict[str, Any]) -> None:
    data: bytes = msgpack.packb(msg, use_bin_type=True)
    sock.sendall(_HEAD.pack(len(data)) + data)


def read_frame(sock: socket.socket) -> dict[str, Any] | None:
    """The next frame; None when the worker closed its end."""
    head = _recv_exactly(sock, _HEAD.size)
    if head is None:
        return None
    (size,) = _HEAD.unpack(head)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    body = _recv_exactly(sock, size)
    if body is None:
        return None
    msg = msgpack.unpackb(body, raw=False, strict_map_key=False)
    if not isinstance(msg, dict):
        raise ValueError("frame is not a map")
    return msg


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


class Link:
    """The child's end of the socket while attempts run: frames sent whole (a lock: a task's
    own threads may checkpoint or report progress), one checkpoint exchange at a time, and
    progress sent by a flusher thread at most every PROGRESS_EVERY_S, so a task that reports
    once and then works for an hour still has that report shown."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send = threading.Lock()
        self._exchange = threading.Lock()
        self._wake = threading.Event()
        self._current: ChildRun | None = None  # the attempt running, whose progress is sent
        self._sent_at = 0.0
        threading.Thread(target=self._flusher, name="duetime-progress", daemon=True).start()

    def begin(self, ctx: ChildRun) -> None:
        with self._send:
            self._current = ctx

    def end(self, ctx: ChildRun, reply: dict[str, Any]) -> None:
        """The attempt's last progress, then its reply; no frame of it is sent after these."""
        with self._send:
            self._current = None
            self._flush(ctx)
            write_frame(self.sock, reply)

    def checkpoint(self, ctx: ChildRun, data: bytes) -> bool:
        """Ask the worker to store `data` under the attempt's fence → stored or refused; the
        error its write met is raised here (TimeoutError, ConnectionError, RuntimeError)."""
        with self._exchange:
            with self._send:
                self._flush(ctx)
                write_frame(self.sock, {"op": "checkpoint", "data": data})
            answer = read_frame(self.sock)
        if answer is None:
            raise ConnectionError("the worker closed the task process's socket")
        stored = answer.get("stored")
        if isinstance(stored, bool):
            return stored
        err = str(answer.get("error", "no answer"))
        kind = answer.get("kind")
        if kind == "timeout":
            raise TimeoutError(f"checkpoint not stored: {err}")
        if kind == "unbound":
            raise RuntimeError(err)
        raise ConnectionError(f"checkpoint not stored: {err}")

    def kick(self) -> None:
        self._wake.set()

    def _flusher(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            time.sleep(max(0.0, self._sent_at + PROGRESS_EVERY_S - time.monotonic()))
            with self._send:
                if self._current is not None:
                    try:
                        self._flush(self._current)
                    except OSError:
                        return  # the worker is gone: so is this process, soon

    def _flush(self, ctx: ChildRun) -> None:
        """Under the send lock: the attempt's progress not sent yet, if any."""
        p = ctx.pending_progress()
        if p is not None:
            self._sent_at = time.monotonic()
            write_frame(self.sock, {"op": "progress", "body": p[1], "run_id": ctx.run_id,
                                    "fence": ctx.fence})
            ctx.progress_delivered(p[0])


@dataclass
class ChildRun(RunContext):
    """`current_run()` in a task process: checkpoints and progress go to the worker over the
    socket (the module docstring); everything else is the thread's RunContext."""

    link: Link | None = field(default=None, repr=False)

    def checkpoint(self, state: Any) -> None:
        data = pack_checkpoint(state)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:  # as in the worker: a sync call would block the task's own loop
            raise RuntimeError("checkpoint() would block the event loop this async task runs "
                               "on: use `await current_run().acheckpoint(state)`")
        self._checkpointed(self._link().checkpoint(self, data), data)

    async def acheckpoint(self, state: Any) -> None:
        data = pack_checkpoint(state)
        stored = await asyncio.to_thread(self._link().checkpoint, self, data)
        self._checkpointed(stored, data)

    def progress(self, done: float, total: float | None = None, note: str | None = None) -> None:
        super().progress(done, total, note)
        if self.link is not None:
            self.link.kick()

    def _link(self) -> Link:
        if self.link is None:
            raise RuntimeError("checkpoints are only available inside a task run by a duetime "
                               "worker")
        return self.link


def _die_with_parent() -> None:
    """Linux: the kernel SIGKILLs this child when the worker dies (even by SIGKILL), so a task
    stuck in a loop never outlives its worker. Elsewhere the closed socket ends an idle child."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _load(ref: str, url: str | None, namespace: str | None) -> Any:
    from duetime.app import App

    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ValueError(f"expected module:attribute, got {ref!r}")
    sys.path.insert(0, os.getcwd())
    app = getattr(importlib.import_module(module_name), attr, None)
    if not isinstance(app, App):
        raise ValueError(f"{ref!r} is not a duetime App")
    app.configure(redis_url=url, namespace=namespace)
    return app


def _failure(exc: BaseException) -> dict[str, Any]:
    from duetime.common.errors import Continue, Fatal, RateLimited, Retry
    from duetime.worker.errors import user_traceback

    kind, delay_ms = "error", None
    extra: dict[str, Any] = {}
    if isinstance(exc, RateLimited):
        kind = "rate_limited"
        extra = {"retry_after_ms": getattr(exc, "retry_after_ms", None),
                 "scope": getattr(exc, "scope", None)}
    elif isinstance(exc, Continue):
        kind = "continue"
        ms = getattr(exc, "delay_ms", 0)
        delay_ms = ms if isinstance(ms, int) and not isinstance(ms, bool) else 0
        state = getattr(exc, "state_bytes", None)
        extra = {"state": state if isinstance(state, bytes) else None}
    elif isinstance(exc, Retry):
        kind = "retry"
        ms = getattr(exc, "delay_ms", None)
        delay_ms = ms if isinstance(ms, int) and not isinstance(ms, bool) else None
    elif isinstance(exc, Fatal):
        kind = "fatal"
    frames = traceback.extract_tb(exc.__traceback__)[1:]  # from the task's own frame on
    try:
        msg = str(exc)
    except Exception:  # noqa: BLE001 - a failing __str__ must not lose the failure
        msg = f"<{type(exc).__name__}.__str__ failed>"
    return {"ok": False, "kind": kind, "type": type(exc).__name__, "msg": msg,
            "delay_ms": delay_ms, "tb": user_traceback(exc)[-8000:],
            "frames": "".join(traceback.format_list(frames))[-2000:], **extra}


def _serve(sock: socket.socket, app: Any) -> None:
    from duetime.common.codec import pack_result, unpack_payload
    from duetime.common.context import set_current

    link = Link(sock)
    while True:
        req = read_frame(sock)
        if req is None:
            return
        c = req["ctx"]
        ctx = ChildRun(run_id=c["run_id"], task=c["task"], queue=c["queue"],
                       attempt=c["attempt"], fence=c["fence"], worker_id=c["worker_id"],
                       idempotency_key=c["key"], schedule=c["schedule"],
                       scheduled_at=_when(c.get("due_ms")),
                       interval_start=_when(c.get("interval_start_ms")),
                       interval_end=_when(c.get("interval_end_ms")), link=link)
        set_current(ctx)
        link.begin(ctx)
        try:
            if c.get("checkpoint") is not None:
                ctx.checkpoint_state = unpack_checkpoint(c["checkpoint"])
            spec = app.registry.get(req["task"])  # a name this app registered, or UnknownTask
            args, kwargs = unpack_payload(req["payload"], req["limit"])
            value = spec.fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = asyncio.run(_awaited(value))
        except BaseException as exc:  # noqa: BLE001 - every ending (sys.exit too) is reported
            reply = _failure(exc)
        else:
            reply = {"ok": True, "result": None, "not_stored": None}
            if value is not None and req["store"]:
                try:
                    reply["result"] = pack_result(value, req["max_result"])
                except Exception as exc:  # noqa: BLE001 - stored as the reason, as in a thread
                    reply["not_stored"] = f"{type(exc).__name__}: {exc}"[:500]
        finally:
            set_current(None)
        # the task read lease_lost as True (a refused checkpoint): its return proves nothing
        reply["lost_seen"] = ctx.lost_seen
        link.end(ctx, reply)


def _when(ms: Any) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


async def _awaited(aw: Any) -> Any:
    return await aw


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="duetime.worker.isolation_child")
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--app", required=True)
    p.add_argument("--url", default=None)
    p.add_argument("--namespace", default=None)
    a = p.parse_args(argv)
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides when its children stop
    sock = socket.socket(fileno=a.fd)
    try:
        app = _load(a.app, a.url, a.namespace)
    except BaseException as exc:  # noqa: BLE001 - said to the worker, which fails the attempt
        write_frame(sock, {"ready": False, "error": f"{type(exc).__name__}: {exc}"[:1000]})
        return 1
    write_frame(sock, {"ready": True, "pid": os.getpid()})
    _serve(sock, app)
    return 0


if __name__ == "__main__":
    sys.exit(main())
