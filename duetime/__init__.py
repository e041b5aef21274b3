"""duetime: a Redis-backed distributed job scheduler.

Application code imports only this package.
"""

from duetime.app import App
from duetime.common.context import RunContext, current_run
from duetime.common.errors import (
    DuetimeError,
    EnqueueIncomplete,
    Fatal,
    InvalidInput,
    PayloadTooLarge,
    RedisRefused,
    RedisUnavailable,
    Retry,
    RunNotFound,
    UnknownTask,
)
from duetime.common.models import Attempt, Run
from duetime.common.schedule_store import ScheduleInfo, ScheduleNotFound
from duetime.common.timespec import At, Cron, Every, InvalidSchedule, Trigger

__all__ = [
    "App", "At", "Attempt", "Cron", "Every", "InvalidSchedule", "ScheduleInfo", "ScheduleNotFound",
    "Trigger", "DuetimeError", "Fatal", "InvalidInput", "PayloadTooLarge",
    "RedisUnavailable", "RedisRefused", "EnqueueIncomplete", "Retry", "Run", "RunContext",
    "RunNotFound", "UnknownTask",
    "current_run",
]
