"""The Redis error families the worker's loops catch, and how a task's exception is written:
in full (bounded) into the run record, as type plus a bounded line into the logs."""

from __future__ import annotations

import importlib.util
import os
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
    text = user_traceback(exc)
    return (head + "\n" + text[-MAX_RECORD_TEXT:]) if text else head


def _package_dirs() -> tuple[str, ...]:
    """The folders of duetime's own code (in a source checkout common/, worker/ and scheduler/
    are duetime.common, ... through package-dir: four roots, none of them the checkout)."""
    dirs: list[str] = []
    for name in ("duetime", "duetime.common", "duetime.worker", "duetime.scheduler"):
        spec = importlib.util.find_spec(name)  # imports no subpackage, only `duetime`
        for d in (spec.submodule_search_locations or []) if spec else []:
            dirs += [os.path.join(d, ""), os.path.join(os.path.realpath(d), "")]
    return tuple(dict.fromkeys(dirs))


PACKAGE_DIRS = _package_dirs()
_MACHINERY = ("/asyncio/", "/concurrent/futures/")  # the event loop's, before the task's code


def _without_own_frames(te: traceback.TracebackException, seen: set[int]) -> None:
    if id(te) in seen:
        return
    seen.add(id(te))
    frames = [f for f in te.stack if not f.filename.startswith(PACKAGE_DIRS)]
    while frames and any(part in frames[0].filename for part in _MACHINERY):
        frames.pop(0)
    te.stack = traceback.StackSummary.from_list(frames)
    for linked in (te.__cause__, te.__context__, *(te.exceptions or ())):
        if linked is not None:
            _without_own_frames(linked, seen)


def user_traceback(exc: BaseException) -> str:
    """The traceback as Python prints it (chained exceptions included), without duetime's own
    frames (the worker's calls into the task, and the event loop's before them): what the
    run record stores is the task's code only."""
    te = traceback.TracebackException.from_exception(exc)
    _without_own_frames(te, set())
    return "".join(te.format())


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
