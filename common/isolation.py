"""How an attempt of a process-isolated task (`@app.task(isolation="process")`) ended when the
worker had to end its task process (worker/isolation.py): the exception types named in the run
record ("HardTimeout: timed out after 30s ..."), exported from `duetime`."""

from __future__ import annotations

from duetime.common.errors import DuetimeError


class HardTimeout(DuetimeError, TimeoutError):
    """The attempt ran past its task's timeout; its child process was killed."""

    remote_traceback = ""  # the record gets the message only: no worker frames


class MemoryLimitExceeded(DuetimeError, MemoryError):
    """The attempt's child process grew past --max-task-memory and was killed."""

    remote_traceback = ""  # the record gets the message only: no worker frames


class TaskProcessCrashed(DuetimeError, RuntimeError):
    """The child process running the attempt died (os._exit, a signal, a crash in C)."""

    remote_traceback = ""  # the record gets the message only: no worker frames


class TaskProcessStartFailed(DuetimeError, RuntimeError):
    """No child process could be started to run the attempt (the app failed to import)."""

    remote_traceback = ""  # the record gets the message only: no worker frames
