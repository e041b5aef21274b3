"""duetime: a Redis-backed distributed job scheduler.

Application code imports only this package: every name a user meets (the app, task objects,
triggers, read models and every exception a public method raises) is importable from here.
"""

from importlib.metadata import PackageNotFoundError, version

from duetime.app import App
from duetime.client.schedules import ScheduleInfo, ScheduleNotFound
from duetime.common.context import RunContext, current_run, worker_context
from duetime.common.errors import (
    DamagedState,
    DuetimeError,
    EnqueueIncomplete,
    Fatal,
    InvalidInput,
    InvalidState,
    InvalidTime,
    NotReplicated,
    PartitionMismatch,
    PayloadTooLarge,
    RedisRefused,
    RedisUnavailable,
    ResultNotStored,
    Retry,
    RunFailed,
    RunNotFound,
    ServerBinaryNotFound,
    UnknownTask,
    WaitTimeout,
    WorkerStartFailed,
)
from duetime.common.middleware import EnqueueInfo, Middleware, RunInfo
from duetime.common.models import Attempt, Run
from duetime.common.schedules import ScheduleDef
from duetime.common.tasks import Task, TaskOptions, TaskSpec, WorkerContext
from duetime.common.time.spec import At, Cron, Every, InvalidSchedule, Trigger

try:
    __version__ = version("duetime")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    # the application and its tasks
    "App", "Task", "TaskOptions", "TaskSpec", "RunContext", "current_run",
    # schedules
    "Trigger", "Cron", "Every", "At", "ScheduleDef", "ScheduleInfo",
    # middleware (app.middleware)
    "Middleware", "EnqueueInfo", "RunInfo",
    # read models
    "Run", "Attempt",
    # raised by tasks
    "Retry", "Fatal",
    # raised by duetime
    "DuetimeError", "InvalidInput", "PayloadTooLarge", "InvalidSchedule", "InvalidTime", "UnknownTask",
    "RunNotFound", "ScheduleNotFound", "InvalidState", "RedisUnavailable", "RedisRefused",
    "EnqueueIncomplete", "NotReplicated", "PartitionMismatch", "RunFailed", "ResultNotStored",
    "WaitTimeout", "DamagedState",
    "WorkerStartFailed", "WorkerContext", "worker_context",
    "ServerBinaryNotFound",
    "__version__",
]
