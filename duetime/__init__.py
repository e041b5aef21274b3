"""duetime: a Redis-backed distributed job scheduler.

Application code imports only this package: every name a user meets (the app, task objects,
triggers, read models and every exception a public method raises) is importable from here.
"""

from importlib.metadata import PackageNotFoundError, version

from duetime.app import App
from duetime.client.calendars import CalendarInfo, CalendarNotFound
from duetime.client.schedules import ScheduleInfo, ScheduleNotFound
from duetime.client.workloads import Batch
from duetime.common.context import RunContext, current_run, worker_context
from duetime.common.errors import (
    BatchWaitTimeout,
    CheckpointRefused,
    CheckpointTooLarge,
    Continue,
    DamagedState,
    DuetimeError,
    EnqueueIncomplete,
    Fatal,
    FormatTooNew,
    InvalidInput,
    InvalidState,
    InvalidTime,
    NotReplicated,
    PartitionMismatch,
    PayloadTooLarge,
    RateLimited,
    RedisRefused,
    RedisUnavailable,
    ResultNotStored,
    Retry,
    RunFailed,
    RunNotFound,
    ServerBinaryNotFound,
    UnknownDependency,
    UnknownTask,
    WaitTimeout,
    WorkerStartFailed,
)
from duetime.common.isolation import (
    HardTimeout,
    MemoryLimitExceeded,
    TaskProcessCrashed,
    TaskProcessStartFailed,
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
    "Run", "Attempt", "Batch",
    # raised by tasks
    "Retry", "RateLimited", "Fatal", "Continue",
    # raised by duetime
    "DuetimeError", "InvalidInput", "PayloadTooLarge", "InvalidSchedule", "InvalidTime", "UnknownTask",
    "RunNotFound", "ScheduleNotFound", "InvalidState", "RedisUnavailable", "RedisRefused",
    "CalendarNotFound", "CalendarInfo",
    "EnqueueIncomplete", "FormatTooNew", "NotReplicated", "PartitionMismatch", "RunFailed", "ResultNotStored",
    "WaitTimeout", "DamagedState", "CheckpointRefused", "CheckpointTooLarge",
    "UnknownDependency", "BatchWaitTimeout",
    "WorkerStartFailed", "WorkerContext", "worker_context",
    "ServerBinaryNotFound",
    # an attempt's task process ended by the worker (isolation="process")
    "HardTimeout", "MemoryLimitExceeded", "TaskProcessCrashed", "TaskProcessStartFailed",
    "__version__",
]
