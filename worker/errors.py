"""The Redis error families the worker's loops catch, and how a task's exception is written:
in full (bounded) into the run record, as type plus a bounded line into the logs."""

from __future__ import annotations

import traceback
from pathlib import Path

import redis

REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)  # Redis unreachable
# Any error a Redis call can end with, unreachable or refused (OOM at maxmemory, READONLY after
# a failover, WRONGTYPE on a damaged key, BUSY): the worker's loops log it and go on.
ANY_REDIS_ERROR = (redis.RedisError, OSError)

MAX_RECORD_TEXT = 4000  # traceback kept in the run record (what `duetime runs show` prints)
MAX_LOG_TEXT = 200


def record_text(exc: BaseException) -> str:
    """'Type: message' and the traceback's tail, for the run record."""
    head = f"{type(exc).__name__}: {exc}"
    remote = getattr(exc, "remote_traceback", None)  # raised in a task process (isolation.py)
    if isinstance(remote, str):
        return (head + "\n" + remote[-MAX_RECORD_TEXT:]) if remote else head
    text = "".join(traceback.format_exception(exc))
    return (head + "\n" + text[-MAX_RECORD_TEXT:]) if text else head


MAX_LOG_FRAMES = 2000


_OWN = (str(Path(__file__).parent), "/asyncio/", "/concurrent/futures/")


def frames_text(exc: BaseException) -> str:
    """Where it failed: the traceback's frames (files, lines, source lines) from the task's
    own code on -- not duetime's or the event loop's frames before it, nor the message, which
    may quote arguments; the last MAX_LOG_FRAMES characters."""
    remote = getattr(exc, "remote_frames", None)  # raised in a task process (isolation.py)
    if isinstance(remote, str):
        return remote[-MAX_LOG_FRAMES:]
    frames = traceback.extract_tb(exc.__traceback__)
    while frames and any(part in frames[0].filename for part in _OWN):
        frames.pop(0)
    return "".join(traceback.format_list(frames))[-MAX_LOG_FRAMES:]


def log_message(text: str, with_text: bool) -> str | None:
    """The first line of an error message, at most MAX_LOG_TEXT characters; None when error
    text is kept out of the logs (a task's exception message may quote its arguments)."""
    if not with_text or not text:
        return None
    line = text.splitlines()[0]
    return line if len(line) <= MAX_LOG_TEXT else line[: MAX_LOG_TEXT - 3] + "..."
