"""The child process of a process-isolated task (`isolation="process"`, worker/isolation.py).

Started by the worker as `python -m duetime.worker.isolation_child --fd N --app module:attr
[--url U] [--namespace NS]`: it imports the app exactly as `duetime worker --app` does (the
operator's configuration, never a name read from Redis), then serves attempts one at a time
over the socket on fd N until the worker closes it. Each request names a task registered in
that app and carries its msgpack payload; the reply is msgpack too (the task's result, or the
exception as kind, type name, message and traceback text). Nothing is pickled either way.

Frames are a 4-byte big-endian length and a msgpack map (see `read_frame` / `write_frame`).
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
import traceback
from datetime import UTC, datetime
from typing import Any

import msgpack

MAX_FRAME = 1 << 30
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
    from duetime.common.errors import Fatal, Retry
    from duetime.worker.errors import user_traceback

    kind, delay_ms = "error", None
    if isinstance(exc, Retry):
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
            "frames": "".join(traceback.format_list(frames))[-2000:]}


def _serve(sock: socket.socket, app: Any) -> None:
    from duetime.common.codec import pack_result, unpack_payload
    from duetime.common.context import RunContext, set_current

    while True:
        req = read_frame(sock)
        if req is None:
            return
        c = req["ctx"]
        ctx = RunContext(run_id=c["run_id"], task=c["task"], queue=c["queue"],
                         attempt=c["attempt"], fence=c["fence"], worker_id=c["worker_id"],
                         idempotency_key=c["key"], schedule=c["schedule"],
                         scheduled_at=None if c["due_ms"] is None
                         else datetime.fromtimestamp(c["due_ms"] / 1000, UTC))
        set_current(ctx)
        try:
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
        write_frame(sock, reply)


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
